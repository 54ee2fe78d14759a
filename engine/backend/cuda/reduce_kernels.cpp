// Kernel specs of the reductions: each op instantiates kernel_templates/reduce.cu with the
// op structs of reduce_ops.cu, its own struct, the storage types of its (input, output)
// tuple and the accumulator: f32 for f32/f16/bf16 (f64 for var and std), f64 for f64, i64 for
// integers and bool.
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"
#include "launchers.h"

namespace kiln::kernels {

namespace {

using rt::Bindings;
using rt::KernelSpec;

// Which (input, output) tuples an op is instantiated for.
enum class Domain {
  widening,  // (t, t) for floats, (t, i64) for integers and bool
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

}  // namespace kiln::kernels
