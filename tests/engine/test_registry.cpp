// The op registry: what it exposes to tests and tools, and the dispatcher's checks.
#include <doctest/doctest.h>

#include <set>

#include "core/registry.h"
#include "ops/sum_to.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"

using namespace kiln;

TEST_CASE("the registry lists every core op with its dtypes") {
  std::set<std::string> names;
  for (const OpDef* op : registered_ops()) {
    names.insert(op->name);
    CHECK_MESSAGE(op->cpu, op->name);
    CHECK_MESSAGE(!op->test.attrs.empty(), op->name);
  }
  for (const char* n : {"add", "sub", "mul", "div", "neg", "add_scalar", "sub_scalar", "rsub_scalar", "mul_scalar",
                        "div_scalar", "rdiv_scalar", "sum", "reshape", "view", "broadcast_to", "cast", "clone",
                        "to_device", "full", "arange", "linspace", "eye", "rand", "randn", "randint", "bernoulli",
                        "bernoulli_tensor"})
    CHECK_MESSAGE(names.count(n), n);
  CHECK(get_op("div").dtypes == std::vector<DType>{DType::f32, DType::f64, DType::f16, DType::bf16});
  CHECK(get_op("mul").save.inputs == std::vector<int>{0, 1});
  CHECK(find_op("no_such_op") == nullptr);
  CHECK_THROWS_AS(get_op("no_such_op"), ValueError);
}

TEST_CASE("register_op refuses duplicates and ops without a CPU implementation") {
  CHECK_THROWS_AS(register_op(OpDef{.name = "add", .cpu = [](const OpArgs&, std::span<Tensor>) {}}), ValueError);
  CHECK_THROWS_AS(register_op(OpDef{.name = "test_no_cpu"}), ValueError);
}

TEST_CASE("a new op needs only its OpDef") {
  // cube(x) = x^3 with the default rules: promoted dtype, broadcast shape.
  static const OpDef& cube = register_op({
      .name = "test_cube",
      .dtypes = {DType::f32, DType::f64},
      .cpu =
          [](const OpArgs& a, std::span<Tensor> out) {
            cpu::visit(out[0].dtype(), [&]<class T>() {
              cpu::map_unary<T, T>(a.inputs[0], out[0], [](auto x) { return x * x * x; });
            });
          },
      .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
        Tensor x = c.saved_input(0);
        return {g[0] * x * x * 3.0};
      },
      .save = {.inputs = {0}},
  });
  Tensor x = from_vector(std::vector<double>{1, 2}, {2}, {.requires_grad = true});
  Tensor y = call(cube, {x});
  CHECK(y.to_vector<double>() == std::vector<double>{1, 8});
  sum(y).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 12});
  CHECK_THROWS_AS(call(cube, {ones({2}, {.dtype = DType::i32})}), DTypeError);
  if (!rt::gpu_available()) CHECK_THROWS_AS(call(cube, {x, x}), ValueError);  // wrong input count
}

TEST_CASE("sum_to reduces broadcast gradients to an input's shape") {
  Tensor g = ones({2, 3, 4});
  CHECK(sum_to(g, {3, 4}).shape() == Shape{3, 4});
  CHECK(sum_to(g, {3, 4}).to_vector<float>()[0] == 2);
  CHECK(sum_to(g, {3, 1}).shape() == Shape{3, 1});
  CHECK(sum_to(g, {3, 1}).to_vector<float>()[0] == 8);
  CHECK(sum_to(g, {}).item<float>() == 24);
  CHECK(sum_to(g, {2, 3, 4}).is_same(g));
  CHECK_THROWS_AS(sum_to(g, {5}), ShapeError);
}

TEST_CASE("ops record nodes only when needed") {
  Tensor a = ones({2});
  CHECK((a + a).grad_fn() == nullptr);
  Tensor b = ones({2}, {.requires_grad = true});
  CHECK((a + b).grad_fn() != nullptr);
  CHECK((a + b).grad_fn()->attrs().items().empty());
  Tensor s = sum(b, {0}, true);
  CHECK(s.grad_fn()->attrs().str() == "axes=[0], keepdim=true");
  CHECK((b.to(DType::i32)).grad_fn() == nullptr);  // integer outputs carry no gradient
}
