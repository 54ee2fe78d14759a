// Kernel specs of the elementwise ops: one per op, its CUDA expression bound into the
// unary/binary template's ${OP}. Expressions see x (unary) or a, b (binary) in the
// input's compute type C (float for f16/bf16), and p0, p1 (double) for unary ops.
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"
#include "launchers.h"

namespace kiln::kernels {

namespace {

using rt::Bindings;
using rt::KernelSpec;

// Which (input, output) tuples an op is instantiated for.
enum class Domain {
  numeric,           // (t, t), t in f32 f64 f16 bf16 i32 i64 u8
  floating,          // (t, t), t in f32 f64 f16 bf16
  any_to_bool,       // (t, bool), every dtype
  floating_to_bool,  // (t, bool), t floating
};

struct ElementwiseDef {
  const char* op;
  Domain domain;
  const char* expr;
};

constexpr ElementwiseDef kUnary[] = {
    {"neg", Domain::numeric, "-x"},
    {"abs", Domain::numeric, "kiln::m::abs(x)"},
    {"sign", Domain::numeric, "kiln::m::sign(x)"},
    {"square", Domain::numeric, "x * x"},
    {"relu", Domain::numeric, "kiln::m::relu(x)"},
    {"clamp", Domain::numeric, "kiln::m::clamp(x, p0, p1)"},
    {"exp", Domain::floating, "kiln::m::exp(x)"},
    {"log", Domain::floating, "kiln::m::log(x)"},
    {"log1p", Domain::floating, "kiln::m::log1p(x)"},
    {"expm1", Domain::floating, "kiln::m::expm1(x)"},
    {"sqrt", Domain::floating, "kiln::m::sqrt(x)"},
    {"rsqrt", Domain::floating, "kiln::m::rsqrt(x)"},
    {"sin", Domain::floating, "kiln::m::sin(x)"},
    {"cos", Domain::floating, "kiln::m::cos(x)"},
    {"tanh", Domain::floating, "kiln::m::tanh(x)"},
    {"sigmoid", Domain::floating, "kiln::m::sigmoid(x)"},
    {"leaky_relu", Domain::floating, "(x > C(0) ? x : x * C(p0))"},
    {"gelu", Domain::floating, "kiln::m::gelu(x)"},
    {"silu", Domain::floating, "kiln::m::silu(x)"},
    {"softplus", Domain::floating, "kiln::m::softplus(x)"},
    {"floor", Domain::floating, "kiln::m::floor(x)"},
    {"ceil", Domain::floating, "kiln::m::ceil(x)"},
    {"round", Domain::floating, "kiln::m::rint(x)"},  // half to even
    {"logical_not", Domain::any_to_bool, "x == C(0)"},
    {"isnan", Domain::floating_to_bool, "x != x"},
};

// Integer division is not here: the engine promotes integer div to float.
constexpr ElementwiseDef kBinary[] = {
    {"add", Domain::numeric, "a + b"},
    {"sub", Domain::numeric, "a - b"},
    {"mul", Domain::numeric, "a * b"},
    {"maximum", Domain::numeric, "kiln::m::maximum(a, b)"},
    {"minimum", Domain::numeric, "kiln::m::minimum(a, b)"},
    {"div", Domain::floating, "a / b"},
    {"pow", Domain::floating, "kiln::m::pow(a, b)"},
    {"eq", Domain::any_to_bool, "a == b"},
    {"ne", Domain::any_to_bool, "a != b"},
    {"lt", Domain::any_to_bool, "a < b"},
    {"le", Domain::any_to_bool, "a <= b"},
    {"gt", Domain::any_to_bool, "a > b"},
    {"ge", Domain::any_to_bool, "a >= b"},
    {"logical_and", Domain::any_to_bool, "(a != C(0)) && (b != C(0))"},
    {"logical_or", Domain::any_to_bool, "(a != C(0)) || (b != C(0))"},
};

std::vector<DTypes> tuples(Domain d) {
  std::vector<DTypes> out;
  for (DType t : kAllDTypes) {
    switch (d) {
      case Domain::numeric:
        if (t != DType::boolean) out.push_back({t, t});
        break;
      case Domain::floating:
        if (is_floating(t)) out.push_back({t, t});
        break;
      case Domain::any_to_bool:
        out.push_back({t, DType::boolean});
        break;
      case Domain::floating_to_bool:
        if (is_floating(t)) out.push_back({t, DType::boolean});
        break;
    }
  }
  return out;
}

// Bindings shared by the unary and binary templates for an (input, output) tuple.
Bindings pair_bindings(const DTypes& d, std::uint32_t variant, std::string expr) {
  return {{"PRELUDE", rt::template_source("elementwise_common")},
          {"VARIANT", std::to_string(variant)},
          {"TIN", std::string(cuda_storage_type(d[0]))},
          {"TOUT", std::string(cuda_storage_type(d[1]))},
          {"COMPUTE", std::string(cuda_compute_type(d[0]))},
          {"OP", std::move(expr)}};
}

Bindings value_bindings(const DTypes& d, std::uint32_t variant) {
  return {{"PRELUDE", rt::template_source("elementwise_common")},
          {"VARIANT", std::to_string(variant)},
          {"T", std::string(cuda_storage_type(d[0]))}};
}

void register_pair_op(const std::string& op, const char* tmpl, const char* entry, std::vector<DTypes> dtypes,
                      std::vector<std::uint32_t> variants, const char* expr) {
  KernelSpec s;
  s.op = op;
  s.template_name = tmpl;
  s.entry = entry;
  s.dtypes = std::move(dtypes);
  s.variants = std::move(variants);
  s.bind = [expr = std::string(expr)](const DTypes& d, std::uint32_t v) { return pair_bindings(d, v, expr); };
  rt::register_kernel(std::move(s));
}

void register_value_op(const std::string& op, const char* tmpl, const char* entry) {
  KernelSpec s;
  s.op = op;
  s.template_name = tmpl;
  s.entry = entry;
  for (DType t : kAllDTypes) s.dtypes.push_back({t});
  s.variants = {0, 1};
  s.bind = value_bindings;
  rt::register_kernel(std::move(s));
}

// Variants: 0 contiguous, 1 strided, 2 binary with a host scalar (see launchers.h).
const bool registered = [] {
  for (const auto& u : kUnary) register_pair_op(u.op, "elementwise_unary", "kiln_unary", tuples(u.domain), {0, 1}, u.expr);
  for (const auto& b : kBinary)
    register_pair_op(b.op, "elementwise_binary", "kiln_binary", tuples(b.domain), {0, 1, 2}, b.expr);
  std::vector<DTypes> all_pairs;
  for (DType in : kAllDTypes)
    for (DType out : kAllDTypes) all_pairs.push_back({in, out});
  register_pair_op("cast", "elementwise_unary", "kiln_unary", std::move(all_pairs), {0, 1}, "x");
  register_value_op("fill", "fill", "kiln_fill");
  register_value_op("where", "where", "kiln_where");
  return true;
}();

}  // namespace

const rt::KernelSpec& kernel(std::string_view op) {
  if (const rt::KernelSpec* k = rt::find_kernel(op)) return *k;
  throw ValueError("[kernels] no kernel is registered for op '" + std::string(op) + "'");
}

}  // namespace kiln::kernels
