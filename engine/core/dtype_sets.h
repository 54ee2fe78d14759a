#pragma once
// The dtype sets ops declare support for (OpDef::dtypes), defined once.
#include <vector>

#include "kiln/dtype.h"

namespace kiln::dtype_sets {

inline const std::vector<DType> floating{DType::f32, DType::f64, DType::f16, DType::bf16};
// Floating and integer; no bool.
inline const std::vector<DType> numeric{DType::f32, DType::f64, DType::f16, DType::bf16,
                                        DType::i32, DType::i64, DType::u8};
inline const std::vector<DType> all{kAllDTypes.begin(), kAllDTypes.end()};

}  // namespace kiln::dtype_sets
