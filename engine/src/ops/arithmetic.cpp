// add, sub, mul, div (tensor-tensor with broadcasting, and tensor-scalar) and neg.
// GPU: the elementwise kernels of engine/ops/kernels (same op names).
#include "../../ops/registry.h"

namespace kiln {

namespace {

const std::vector<DType> kNumeric{DType::f32, DType::f64, DType::f16, DType::bf16,
                                  DType::i32, DType::i64, DType::u8};
const std::vector<DType> kFloating{DType::f32, DType::f64, DType::f16, DType::bf16};

// The kernel's scalar: exact integers for integer scalars.
kernels::Scalar kernel_scalar(const Scalar& s) {
  return s.is_floating() ? kernels::Scalar(s.to_double()) : kernels::Scalar(s.to_int());
}

// The scalar in compute type C, as the kernels' from_scalar converts it.
template <class C>
C scalar_as(const Scalar& s) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(s.to_int());
  else return static_cast<C>(s.to_double());
}

// out = f(a, b) with broadcasting; the GPU kernel has the op's name.
template <class F>
OpDef binary(std::string name, std::vector<DType> dtypes, DTypeRule rule, F f, Vjp vjp, SavePolicy save,
             TestHints test = {}) {
  OpDef d;
  d.name = name;
  d.num_inputs = 2;
  d.dtypes = std::move(dtypes);
  d.dtype_rule = std::move(rule);
  d.cpu = [f](const OpArgs& a, std::span<Tensor> out) {
    cpu::visit(out[0].dtype(), [&]<class T>() { cpu::map_binary<T, T, T>(a.inputs[0], a.inputs[1], out[0], f); });
  };
  d.gpu = [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) {
    const Shape& s = out[0].shape();
    kernels::launch_binary(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0], s),
                           gpu::operand(a.inputs[1], s), gpu::operand(out[0]), s, stream_of(a.device));
  };
  d.vjp = std::move(vjp);
  d.save = std::move(save);
  d.test = std::move(test);
  return d;
}

// out = f(a, s) for the scalar in attrs "scalar"; f(s, a) when `scalar_first` (rsub, rdiv).
template <class F>
OpDef binary_scalar(std::string name, std::string kernel, bool scalar_first, std::vector<DType> dtypes,
                    DTypeRule rule, F f, Vjp vjp, SavePolicy save, double low = -2.0) {
  OpDef d;
  d.name = std::move(name);
  d.dtypes = std::move(dtypes);
  d.dtype_rule = std::move(rule);
  d.shape_rule = rules::same_shape_as_input;
  d.cpu = [f, scalar_first](const OpArgs& a, std::span<Tensor> out) {
    const Scalar& s = a.attrs.get<Scalar>("scalar");
    cpu::visit(out[0].dtype(), [&]<class T>() {
      using C = cpu::compute_t<T>;
      const C sc = scalar_as<C>(s);
      if (scalar_first) cpu::map_unary<T, T>(a.inputs[0], out[0], [&](C x) { return f(sc, x); });
      else cpu::map_unary<T, T>(a.inputs[0], out[0], [&](C x) { return f(x, sc); });
    });
  };
  d.gpu = [k = gpu::LazyKernel(kernel), scalar_first](const OpArgs& a, std::span<Tensor> out) {
    kernels::launch_binary_scalar(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0]),
                                  kernel_scalar(a.attrs.get<Scalar>("scalar")), scalar_first, gpu::operand(out[0]),
                                  out[0].shape(), stream_of(a.device));
  };
  d.vjp = std::move(vjp);
  d.save = std::move(save);
  d.test.attrs = {Attrs{{"scalar", Scalar(2)}}, Attrs{{"scalar", Scalar(-1.5)}}};
  d.test.low = low;
  return d;
}

using G = std::span<const Tensor>;
using V = std::vector<Tensor>;
Scalar scalar_of(const VjpContext& c) { return c.attrs().get<Scalar>("scalar"); }

const OpDef& kAdd = register_op(binary(
    "add", kNumeric, rules::promote, [](auto a, auto b) { return a + b; },
    [](const VjpContext& c, G g) -> V { return {sum_to(g[0], c.input(0).shape), sum_to(g[0], c.input(1).shape)}; },
    {}));

const OpDef& kSub = register_op(binary(
    "sub", kNumeric, rules::promote, [](auto a, auto b) { return a - b; },
    [](const VjpContext& c, G g) -> V {
      return {sum_to(g[0], c.input(0).shape), c.needs_grad(1) ? sum_to(neg(g[0]), c.input(1).shape) : Tensor()};
    },
    {}));

const OpDef& kMul = register_op(binary(
    "mul", kNumeric, rules::promote, [](auto a, auto b) { return a * b; },
    [](const VjpContext& c, G g) -> V {
      V r(2);
      if (c.needs_grad(0)) r[0] = sum_to(mul(g[0], c.saved_input(1)), c.input(0).shape);
      if (c.needs_grad(1)) r[1] = sum_to(mul(g[0], c.saved_input(0)), c.input(1).shape);
      return r;
    },
    {.inputs = {0, 1}}));

// d(a/b) = g/b, -g*a/b^2 = -g * (out / b): out / b is 0 where a is, while g/b may
// overflow a subnormal b and turn (g/b) * out into inf * 0 = NaN (PyTorch's order too).
const OpDef& kDiv = register_op(binary(
    "div", kFloating, rules::promote_float, [](auto a, auto b) { return a / b; },
    [](const VjpContext& c, G g) -> V {
      V r(2);
      if (c.needs_grad(0)) r[0] = sum_to(div(g[0], c.saved_input(1)), c.input(0).shape);
      if (c.needs_grad(1)) r[1] = sum_to(neg(mul(g[0], div(c.saved_output(0), c.saved_input(1)))), c.input(1).shape);
      return r;
    },
    {.inputs = {1}, .outputs = {0}}, {.low = 0.5, .high = 2.0}));  // away from the pole at b = 0

const OpDef& kAddScalar = register_op(binary_scalar(
    "add_scalar", "add", false, kNumeric, rules::promote, [](auto a, auto b) { return a + b; },
    [](const VjpContext&, G g) -> V { return {g[0]}; }, {}));

const OpDef& kSubScalar = register_op(binary_scalar(
    "sub_scalar", "sub", false, kNumeric, rules::promote, [](auto a, auto b) { return a - b; },
    [](const VjpContext&, G g) -> V { return {g[0]}; }, {}));

const OpDef& kRsubScalar = register_op(binary_scalar(
    "rsub_scalar", "sub", true, kNumeric, rules::promote, [](auto a, auto b) { return a - b; },
    [](const VjpContext&, G g) -> V { return {neg(g[0])}; }, {}));

const OpDef& kMulScalar = register_op(binary_scalar(
    "mul_scalar", "mul", false, kNumeric, rules::promote, [](auto a, auto b) { return a * b; },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], scalar_of(c))}; }, {}));

const OpDef& kDivScalar = register_op(binary_scalar(
    "div_scalar", "div", false, kFloating, rules::promote_float, [](auto a, auto b) { return a / b; },
    [](const VjpContext& c, G g) -> V { return {div(g[0], scalar_of(c))}; }, {}));

// d(s/a) = -g*s/a^2 = -g*out/a.
const OpDef& kRdivScalar = register_op(binary_scalar(
    "rdiv_scalar", "div", true, kFloating, rules::promote_float, [](auto a, auto b) { return a / b; },
    [](const VjpContext& c, G g) -> V { return {neg(div(mul(g[0], c.saved_output(0)), c.saved_input(0)))}; },
    {.inputs = {0}, .outputs = {0}}, 0.5));

const OpDef& kNeg = register_op({
    .name = "neg",
    .dtypes = kNumeric,
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          cpu::visit(out[0].dtype(), [&]<class T>() { cpu::map_unary<T, T>(a.inputs[0], out[0], [](auto x) { return -x; }); });
        },
    .gpu =
        [k = gpu::LazyKernel("neg")](const OpArgs& a, std::span<Tensor> out) {
          kernels::launch_unary(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0]),
                                gpu::operand(out[0]), out[0].shape(), 0, 0, stream_of(a.device));
        },
    .vjp = [](const VjpContext&, G g) -> V { return {neg(g[0])}; },
});

Attrs scalar_attrs(const Scalar& s) { return Attrs{{"scalar", s}}; }

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return call(kAdd, {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return call(kSub, {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return call(kMul, {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return call(kDiv, {a, b}); }
Tensor add(const Tensor& a, const Scalar& b) { return call(kAddScalar, {a}, scalar_attrs(b)); }
Tensor sub(const Tensor& a, const Scalar& b) { return call(kSubScalar, {a}, scalar_attrs(b)); }
Tensor sub(const Scalar& a, const Tensor& b) { return call(kRsubScalar, {b}, scalar_attrs(a)); }
Tensor mul(const Tensor& a, const Scalar& b) { return call(kMulScalar, {a}, scalar_attrs(b)); }
Tensor div(const Tensor& a, const Scalar& b) { return call(kDivScalar, {a}, scalar_attrs(b)); }
Tensor div(const Scalar& a, const Tensor& b) { return call(kRdivScalar, {b}, scalar_attrs(a)); }
Tensor neg(const Tensor& a) { return call(kNeg, {a}); }

}  // namespace kiln
