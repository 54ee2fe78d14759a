// Pointwise ops: the device expression on each OpDef is the one source of its kernel, is
// self-contained (a later fusion pass splices it), and has an independent host reference
// for the GPU kernel tests (tests/support/elementwise_reference.h). No GPU needed.
#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <string>

#include "core/registry.h"
#include "ops/user_pointwise.h"
#include "elementwise_reference.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"

using namespace kiln;

namespace {

std::vector<const OpDef*> pointwise_ops() {
  std::vector<const OpDef*> out;
  for (const OpDef* op : registered_ops())
    if (pointwise_expr(*op)) out.push_back(op);
  return out;
}

std::string binding(const rt::Bindings& b, const std::string& key) {
  for (const auto& [k, v] : b)
    if (k == key) return v;
  return "<unbound>";
}

}  // namespace

TEST_CASE("every pointwise op has a host reference of its arity for the GPU kernel tests") {
  std::set<std::string> unary, binary;
  for (const OpDef* op : pointwise_ops()) {
    if (is_user_pointwise(*op)) continue;  // kiln::pointwise ops: their evaluator is the reference
    INFO(op->name, " has a device expression but no reference in tests/support/elementwise_reference.h");
    if (op->num_inputs == 1)
      CHECK(elt::unary_refs().count(op->name) == 1);
    else
      CHECK(elt::binary_refs().count(op->name) == 1);
    (op->num_inputs == 1 ? unary : binary).insert(op->name);
  }
  // A reference for no pointwise op would test nothing.
  // Pairs, not bindings: clang 14 cannot capture a structured binding in CHECK_MESSAGE.
  for (const auto& ref : elt::unary_refs()) CHECK_MESSAGE(unary.count(ref.first), ref.first);
  for (const auto& ref : elt::binary_refs()) CHECK_MESSAGE(binary.count(ref.first), ref.first);
  CHECK(unary.count("relu"));
  CHECK(binary.count("add"));
}

TEST_CASE("a pointwise op's kernel spec is generated from its OpDef") {
  for (const OpDef* op : pointwise_ops()) {
    CAPTURE(op->name);
    const PointwiseExpr& pw = *pointwise_expr(*op);
    const rt::KernelSpec* spec = rt::find_kernel(op->name);
    REQUIRE(spec != nullptr);
    CHECK(spec->template_name == (op->num_inputs == 1 ? "elementwise_unary" : "elementwise_binary"));
    CHECK(spec->dtypes == kernels::pointwise_tuples(pw.domain));
    CHECK(binding(spec->bind(spec->dtypes.front(), 0), "OP") == pw.expr);
  }
  CHECK(pointwise_expr(get_op("sum")) == nullptr);
  CHECK(pointwise_expr(get_op("add_scalar")) == nullptr);  // runs add's kernel with a host scalar
  CHECK(pointwise_params(get_op("leaky_relu"), Attrs{{"negative_slope", 0.25}}) == std::pair{0.25, 0.0});
  CHECK(pointwise_params(get_op("clamp"), Attrs{{"min", Scalar(-1)}, {"max", Scalar(2)}}) == std::pair{-1.0, 2.0});
  CHECK(pointwise_params(get_op("relu"), Attrs{}) == std::pair{0.0, 0.0});
}

TEST_CASE("pointwise expressions name only their inputs, C, p0, p1 and the prelude's kiln::math") {
  const std::string prelude = rt::template_source("prelude");
  const std::regex name(R"([A-Za-z_][A-Za-z_0-9]*(::[A-Za-z_][A-Za-z_0-9]*)*)");
  for (const OpDef* op : pointwise_ops()) {
    const std::string& expr = pointwise_expr(*op)->expr;
    const std::set<std::string> allowed =
        op->num_inputs == 1 ? std::set<std::string>{"x", "C", "p0", "p1"}
                            : std::set<std::string>{"a", "b", "C", "p0", "p1"};
    for (std::sregex_iterator it(expr.begin(), expr.end(), name), end; it != end; ++it) {
      const std::string id = it->str();
      INFO(op->name, ": '", expr, "' names ", id);
      const std::string prefix = "kiln::math::";
      const std::string fn = id.rfind(prefix, 0) == 0 ? id.substr(prefix.size()) : "";
      // Declared as `name(` or through the prelude's KILN_MATH1(name).
      if (!fn.empty())
        CHECK((prelude.find(" " + fn + "(") != std::string::npos ||
               prelude.find("KILN_MATH1(" + fn + ")") != std::string::npos));
      else
        CHECK(allowed.count(id));
    }
  }
}

TEST_CASE("a binary pointwise kernel takes params p0, p1 like a unary one") {
  // A spec without an op, so the reference coverage above is not disturbed.
  const rt::KernelSpec* spec = &kernels::register_pointwise_kernel("test_pw_binary_params", 2, "a * C(p0) + b * C(p1)",
                                                                   kernels::PointwiseDomain::floating);
  for (std::uint32_t v : spec->variants) {
    const std::string src = rt::instantiate_kernel(*spec, spec->dtypes.front(), v);
    CHECK(src.find("double p0, p1;") != std::string::npos);
    CHECK(src.find("double p0,") != std::string::npos);  // the entry point's parameters
  }
}

TEST_CASE("register_op refuses a pointwise op it cannot generate a kernel for, and registers nothing") {
  auto noop = [](const OpArgs&, std::span<Tensor>) {};
  CHECK_THROWS_AS(
      register_op({.name = "test_pw_ternary", .num_inputs = 3, .cpu = noop, .pointwise = PointwiseExpr{.expr = "a"}}),
      ValueError);
  CHECK(find_op("test_pw_ternary") == nullptr);
  CHECK(rt::find_kernel("test_pw_ternary") == nullptr);
  // "fill" is a kernel spec but no op: the clash is refused before the op exists.
  REQUIRE(find_op("fill") == nullptr);
  CHECK_THROWS_AS(register_op({.name = "fill", .cpu = noop, .pointwise = PointwiseExpr{.expr = "x"}}), ValueError);
  CHECK(find_op("fill") == nullptr);
}
