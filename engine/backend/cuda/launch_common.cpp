// What the launchers of every kernel family share: the floating-dtype spec shape, spec
// lookup, host scalars and launch geometries (launch_common.h).
#include "launch_common.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kiln/error.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

// Grid-stride grids of a few waves: enough blocks to fill every SM, few enough that
// each thread loops (blocks of 256 at 2048 threads per SM is 8 per SM per wave).
constexpr unsigned kBlocksPerSm = 32;

}  // namespace

const rt::KernelSpec& register_float_spec(const char* op, const char* template_name, const char* entry,
                                          const char* compute_placeholder, bool both_half_headers,
                                          std::vector<std::pair<const char*, const char*>> pasted) {
  rt::KernelSpec s;
  s.op = op;
  s.template_name = template_name;
  s.entry = entry;
  s.dtypes = {DTypes{DType::f32}, DTypes{DType::f64}, DTypes{DType::f16}, DTypes{DType::bf16}};
  s.bind = [compute_placeholder, both_half_headers, pasted](const DTypes& d, std::uint32_t) -> rt::Bindings {
    rt::Bindings b{{"PRELUDE", rt::device_prelude(both_half_headers ? DTypes{d[0], DType::f16, DType::bf16} : d)},
                   {"T", std::string(cuda_storage_type(d[0]))},
                   {compute_placeholder, d[0] == DType::f64 ? "double" : "float"}};
    for (const auto& [placeholder, name] : pasted) b.push_back({placeholder, rt::template_source(name)});
    return b;
  };
  return rt::register_kernel(std::move(s));
}

const rt::KernelSpec& kernel(std::string_view op) {
  if (const rt::KernelSpec* k = rt::find_kernel(op)) return *k;
  throw ValueError("[kernels] no kernel is registered for op '" + std::string(op) + "'");
}

Scalar::Scalar(double v) : f(v) {
  // -2^63 <= v < 2^63 keeps the conversion defined.
  i = (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? static_cast<std::int64_t>(v) : 0;
}

RowLaunch row_launch(std::int64_t rows, std::int64_t cols, int device) {
  RowLaunch l;
  l.width = cols <= 1024 ? 32 : static_cast<std::int32_t>(kRowBlock);
  const std::int64_t sms = std::max(1, rt::device_info(device).sm_count);
  l.config.grid.x = static_cast<unsigned>(std::clamp<std::int64_t>(ceil_div(rows, kRowBlock / l.width), 1, 32 * sms));
  l.config.block.x = kRowBlock;
  return l;
}

rt::LaunchConfig grid_stride_config(std::uint64_t items, int device) {
  const unsigned sms = static_cast<unsigned>(std::max(1, rt::device_info(device).sm_count));
  return rt::linear_config(items, 256, sms * kBlocksPerSm);
}

}  // namespace kiln::kernels
