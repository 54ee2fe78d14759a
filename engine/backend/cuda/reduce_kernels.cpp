// The reductions' specs and launchers (reduce_kernels.h). Each op instantiates
// kernel_templates/reduce.cu with the op structs of reduce_ops.cu, its own struct, the storage
// types of its (input, output) tuple and the accumulator: f32 for f32/f16/bf16 (f64 for var and
// std), f64 for f64, i64 for integers and bool.
#include <algorithm>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "launch_common.h"
#include "reduce_kernels.h"

namespace kiln::kernels {

namespace {

using rt::Bindings;
using rt::KernelSpec;

// Which (input, output) tuples an op is instantiated for.
enum class Domain {
  // (t, t) for floats, (t, i64) for integers and bool; (t, f32) too for f16 and bf16 (the bias
  // gradient of a 16-bit product summed into f32 under autocast)
  widening,
  floating,  // (t, t), t floating
  same,      // (t, t), every dtype
  index,     // (t, i64), every dtype but bool
};

struct ReduceDef {
  const char* op;
  const char* functor;  // op struct in reduce.cu
  Domain domain;
  // Welford's running mean in f32 rounds at the mean's scale, which swamps a small spread
  // (mean/std 1e3 loses four digits): var and std accumulate in f64 for every dtype.
  bool wide = false;
};

constexpr ReduceDef kReductions[] = {
    {"sum", "SumOp", Domain::widening},         {"prod", "ProdOp", Domain::widening},
    {"mean", "MeanOp", Domain::floating},       {"max", "MaxOp", Domain::same},
    {"min", "MinOp", Domain::same},             {"argmax", "ArgMaxOp", Domain::index},
    {"argmin", "ArgMinOp", Domain::index},      {"var", "VarOp", Domain::floating, true},
    {"std", "StdOp", Domain::floating, true},         {"logsumexp", "LogSumExpOp", Domain::floating},
};

std::vector<DTypes> tuples(Domain d) {
  std::vector<DTypes> out;
  for (DType t : kAllDTypes) {
    switch (d) {
      case Domain::widening:
        out.push_back({t, is_floating(t) ? t : DType::i64});
        if (t == DType::f16 || t == DType::bf16) out.push_back({t, DType::f32});
        break;
      case Domain::floating:
        if (is_floating(t)) out.push_back({t, t});
        break;
      case Domain::same:
        out.push_back({t, t});
        break;
      case Domain::index:
        if (t != DType::boolean) out.push_back({t, DType::i64});
        break;
    }
  }
  return out;
}

std::string accumulator(DType in, bool wide) {
  if (in == DType::f64 || (wide && is_floating(in))) return "double";
  return is_floating(in) ? "float" : "long long";
}

void register_reduction(const ReduceDef& def) {
  KernelSpec s;
  s.op = def.op;
  s.template_name = "reduce";
  s.entry = "kiln_reduce";
  s.dtypes = tuples(def.domain);
  s.variants = {0, 1};  // rows (inner == 1), columns: a module compiles only its own loops
  s.bind = [functor = std::string(def.functor), wide = def.wide](const DTypes& d, std::uint32_t v) -> Bindings {
    return {{"PRELUDE", rt::device_prelude(d)},
            {"VARIANT", std::to_string(v)},
            {"IN", std::string(cuda_storage_type(d[0]))},
            {"OUT", std::string(cuda_storage_type(d[1]))},
            {"ACC", accumulator(d[0], wide)},
            {"OPS", rt::template_source("reduce_ops")},
            {"OP", functor}};
  };
  rt::register_kernel(std::move(s));
}

struct Registrar {
  Registrar() {
    for (const auto& def : kReductions) register_reduction(def);
  }
};
const Registrar registrar;

}  // namespace


namespace {

constexpr std::int64_t kBlock64 = kReduceBlock;
constexpr std::int64_t kVecLoadsPerLane = 4;  // work below this per lane is not worth more lanes
constexpr std::int64_t kColumnStepsPerLane = 8;
constexpr std::int64_t kMaxGrid = 0x7fffffff;


std::int64_t next_pow2(std::int64_t x) {
  std::int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

std::string shape_text(std::int64_t outer, std::int64_t r, std::int64_t inner) {
  return "[outer, r, inner] = [" + std::to_string(outer) + ", " + std::to_string(r) + ", " + std::to_string(inner) + "]";
}

// Flag bits of the kernel's `flags` argument.
constexpr std::int32_t kFromState = 1, kToState = 2, kVecColumns = 4;

void run_pass(const rt::Function& f, const ReducePlan& p, const rt::Stream& s, rt::DevicePtr in, rt::DevicePtr out,
              std::int64_t outer, std::int64_t r, std::int64_t inner, std::int32_t flags, std::int64_t n, double param) {
  rt::LaunchConfig c;
  c.grid.x = p.blocks;
  c.block.x = kReduceBlock;
  if (p.col_vec > 1) flags |= kVecColumns;
  // Argument types mirror kiln_reduce's parameters exactly (pointers are 64-bit).
  const std::int32_t lanes = p.lanes, lanes_r = p.lanes_r;
  const long long outer_ll = outer, r_ll = r, inner_ll = inner, splits = p.splits, chunk = p.chunk, n_ll = n;
  rt::launch(f, c, s, in, out, outer_ll, r_ll, inner_ll, splits, chunk, lanes, lanes_r, flags, n_ll, param);
}

}  // namespace

ReducePlan plan_reduce(std::int64_t outer, std::int64_t r, std::int64_t inner, int vec, int sm_count,
                       bool allow_split) {
  // One wave of 256-thread blocks fills the GPU; fewer leaves bandwidth unused.
  const std::int64_t target_blocks = std::max<std::int64_t>(sm_count, 1) * (2048 / kBlock64);
  ReducePlan p;
  p.chunk = r;
  if (inner == 1) {
    const std::int64_t lanes_for_work = next_pow2(std::max<std::int64_t>(ceil_div(r, kVecLoadsPerLane * vec), 1));
    if (lanes_for_work <= 32 || outer >= target_blocks * (kBlock64 / 32)) {
      p.lanes = static_cast<int>(std::min<std::int64_t>(lanes_for_work, 32));
    } else {
      p.lanes = 0;  // a block per row; split few long rows across blocks
      const std::int64_t min_chunk = kBlock64 * vec * kVecLoadsPerLane;
      // Two waves' worth of chunks: one wave left a tail that held a full sum of 2^28 floats
      // to 0.91-0.96 of copy bandwidth on the H100, two reach it.
      if (allow_split && outer < 2 * target_blocks && r >= 2 * min_chunk)
        p.splits = std::min(ceil_div(2 * target_blocks, outer), r / min_chunk);
    }
  } else {
    // Lanes cover groups of col_vec adjacent columns, read with one load each.
    const int cv = std::min(vec, 4);
    if (cv > 1 && inner % cv == 0) p.col_vec = cv;
    const std::int64_t cols = inner / p.col_vec;
    p.lanes = static_cast<int>(std::min<std::int64_t>(next_pow2(cols), 32));
    const std::int64_t by =
        std::min(next_pow2(std::max<std::int64_t>(ceil_div(r, kColumnStepsPerLane), 1)), kBlock64 / p.lanes);
    p.lanes_r = static_cast<int>(by);
    const std::int64_t bz = kBlock64 / (p.lanes * by);
    const std::int64_t base = ceil_div(outer, bz) * ceil_div(cols, p.lanes);
    const std::int64_t min_chunk = by * kColumnStepsPerLane * 2;
    if (allow_split && base < target_blocks && r >= 2 * min_chunk)
      p.splits = std::min(ceil_div(target_blocks, base), r / min_chunk);
  }
  if (p.splits > 1) {
    // Chunks of whole 16-byte vectors keep every chunk as aligned as its row's start.
    p.chunk = ceil_div(ceil_div(r, p.splits), vec) * vec;
    p.splits = ceil_div(r, p.chunk);
  }
  std::int64_t blocks = outer * p.splits;  // rows, a block per (row, chunk)
  if (inner == 1 && p.lanes > 0) blocks = ceil_div(outer, kBlock64 / p.lanes);
  if (inner != 1)
    blocks = ceil_div(outer, kBlock64 / (p.lanes * p.lanes_r)) * ceil_div(inner / p.col_vec, p.lanes) * p.splits;
  p.blocks = static_cast<std::uint32_t>(std::clamp<std::int64_t>(blocks, 1, kMaxGrid));
  return p;
}

bool reduce_has_identity(std::string_view op) {
  return op != "max" && op != "min" && op != "argmax" && op != "argmin";
}

void launch_reduce(const rt::KernelSpec& spec, DType in, DType out, rt::DevicePtr in_ptr, rt::DevicePtr out_ptr,
                   std::int64_t outer, std::int64_t r, std::int64_t inner, const rt::Stream& s, double param) {
  // Messages are built only on failure: this runs once per reduction op.
  auto who = [&] { return "[" + spec.op + "] "; };
  if (spec.template_name != "reduce")
    throw ValueError(who() + "launch_reduce needs a reduction kernel spec, not one of template '" + spec.template_name +
                     "'");
  if (outer < 0 || r < 0 || inner < 0) throw ShapeError(who() + "negative extent in " + shape_text(outer, r, inner));
  if (r == 0 && !reduce_has_identity(spec.op)) throw ValueError(who() + "cannot reduce an empty dimension");
  const DTypes key{in, out};
  if (std::find(spec.dtypes.begin(), spec.dtypes.end(), key) == spec.dtypes.end())
    throw DTypeError(who() + "no kernel for input " + std::string(dtype_name(in)) + " and output " +
                     std::string(dtype_name(out)));
  if (outer == 0 || inner == 0) return;

  const rt::Function f = rt::get_function(spec, key, inner == 1 ? 0 : 1, s.device());  // rows or columns
  const int sms = rt::device_info(s.device()).sm_count;
  // Rows handle any alignment themselves; column loads of several elements need it.
  const int vec = inner == 1 || in_ptr % 16 == 0 ? static_cast<int>(16 / dtype_size(in)) : 1;
  const ReducePlan first = plan_reduce(outer, r, inner, vec, sms);
  if (first.splits == 1) {
    run_pass(f, first, s, in_ptr, out_ptr, outer, r, inner, 0, r, param);
    return;
  }
  // Partial states [outer, splits, inner], combined and finalized by a second pass.
  rt::DeviceBuffer partial(static_cast<std::size_t>(outer * first.splits * inner) * kReduceStateBytes, s);
  run_pass(f, first, s, in_ptr, partial.ptr(), outer, r, inner, kToState, r, param);
  const ReducePlan second = plan_reduce(outer, first.splits, inner, 1, sms, false);
  run_pass(f, second, s, partial.ptr(), out_ptr, outer, first.splits, inner, kFromState, r, param);
}

}  // namespace kiln::kernels
