#pragma once
// cuBLAS and cuBLASLt, loaded on their first use instead of with the library: the two are
// over 500 MB, and mapping them cost every process about 0.1 s at start, GPU or not.
// Internal: runtime/src and the engine's GEMM sources call cuBLAS through cublas().
#include <cublasLt.h>
#include <cublas_v2.h>

namespace kiln::rt {

// X-macro lists. cublas_v2.h's macros give the exported names (cublasCreate is cublasCreate_v2);
// the members take the same names, so cublas().cublasCreate(...) reads as the plain call.
#define KILN_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate)                \
  X(cublasDestroy)               \
  X(cublasSetStream)             \
  X(cublasSetWorkspace)          \
  X(cublasGetStatusName)         \
  X(cublasGetStatusString)       \
  X(cublasGemmEx_64)             \
  X(cublasGemmStridedBatchedEx_64)

#define KILN_CUBLASLT_FUNCTIONS(X)          \
  X(cublasLtCreate)                         \
  X(cublasLtGetVersion)                     \
  X(cublasLtMatmul)                         \
  X(cublasLtMatmulDescCreate)               \
  X(cublasLtMatmulDescSetAttribute)         \
  X(cublasLtMatrixLayoutCreate)             \
  X(cublasLtMatmulPreferenceCreate)         \
  X(cublasLtMatmulPreferenceDestroy)        \
  X(cublasLtMatmulPreferenceSetAttribute)   \
  X(cublasLtMatmulAlgoGetHeuristic)         \
  X(cublasLtMatmulAlgoConfigGetAttribute)

struct CublasApi {
#define KILN_CUBLAS_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_CUBLAS_FUNCTIONS(KILN_CUBLAS_MEMBER)
  KILN_CUBLASLT_FUNCTIONS(KILN_CUBLAS_MEMBER)
#undef KILN_CUBLAS_MEMBER
};

// Loads libcublasLt and libcublas (the toolkit's that kiln was built against, else by their
// soname) on the first call; a DeviceError naming the library and dlerror()'s reason when one
// cannot be loaded or lacks a function (then, and on later calls).
const CublasApi& cublas();

// Whether this process has loaded cuBLAS (for tests: work without a GPU GEMM loads none).
bool cublas_loaded();

}  // namespace kiln::rt
