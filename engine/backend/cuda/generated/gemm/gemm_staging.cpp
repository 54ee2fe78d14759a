// Kernel specs of the tile engine's staging kernels (kernel_templates/gemm_staging.cu): shape-
// generic, so each compiles once per dtype and slicing and `jitcc warm` covers them, while a
// per-shape GEMM module holds only its tile kernel.
#include <array>
#include <string>
#include <vector>

#include "backend/cuda/launch_common.h"
#include "gemm_internal.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

struct StagingEntry {
  const char* op;
  const char* entry;
  std::vector<std::uint32_t> slices;  // f32 math's slicings; the 16-bit inputs' copies take none
};

// Indexed by GemmStaging.
const std::array<StagingEntry, 4> kStagingEntries{{{"gemm_weights_rsc", "kiln_conv_weights_rsc", {2, 3}},
                                                   {"gemm_nchw_to_nhwc", "kiln_nchw_to_nhwc", {2, 3}},
                                                   {"gemm_shift_rows", "kiln_conv_shift_rows", {2}},
                                                   {"gemm_sum_splits", "kiln_gemm_sum_splits", {}}}};

// One spec of entry `kind`: copies as stored (every input dtype, variant 1) or, `sliced`,
// writes f32 as TF32 slices (variant: their count); null where the kind has no slicing.
const rt::KernelSpec* register_staging(std::size_t kind, bool sliced) {
  const StagingEntry& e = kStagingEntries[kind];
  if (sliced && e.slices.empty()) return nullptr;
  rt::KernelSpec s;
  s.op = std::string(e.op) + (sliced ? "_sliced" : "");
  s.template_name = "gemm_staging";
  s.entry = e.entry;
  s.dtypes = sliced ? std::vector<DTypes>{DTypes{DType::f32}}
                    : std::vector<DTypes>{DTypes{DType::f32}, DTypes{DType::bf16}, DTypes{DType::f16}};
  s.variants = sliced ? e.slices : std::vector<std::uint32_t>{1};
  s.bind = [kind](const DTypes& d, std::uint32_t slices) -> rt::Bindings {
    return {{"PRELUDE", rt::device_prelude(d)},
            {"IN", std::string(cuda_storage_type(d[0]))},
            {"TF32_SPLIT", rt::template_source("tf32_split")},
            {"SLICES", std::to_string(slices)},
            {"KIND", std::to_string(kind)}};
  };
  return &rt::register_kernel(std::move(s));
}

struct StagingSpecs {
  std::array<const rt::KernelSpec*, 4> plain{}, sliced{};
  StagingSpecs() {
    for (std::size_t k = 0; k < kStagingEntries.size(); ++k) {
      plain[k] = register_staging(k, false);
      sliced[k] = register_staging(k, true);
    }
  }
};

const StagingSpecs& staging_specs() {
  static const StagingSpecs s;
  return s;
}

const bool staging_registered = (staging_specs(), true);

}  // namespace

rt::Function staging_function(GemmStaging kind, DType in, int slices, int device) {
  const auto k = static_cast<std::size_t>(kind);
  const rt::KernelSpec* spec = slices > 1 ? staging_specs().sliced[k] : staging_specs().plain[k];
  if (!spec || (slices > 1 && in != DType::f32))
    throw ValueError("[gemm] " + std::string(kStagingEntries[k].entry) + " writes no " + std::to_string(slices) +
                     " slices of " + std::string(dtype_name(in)));
  return rt::get_function(*spec, DTypes{in}, slices > 1 ? static_cast<std::uint32_t>(slices) : 1u, device);
}

}  // namespace kiln::kernels
