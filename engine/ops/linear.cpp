// linear = x @ w^T + b, optionally followed by ReLU, as one op: on the GPU one cuBLASLt product
// whose epilogue adds the bias (and applies the ReLU), and in the backward pass one product
// for the weight gradient whose epilogue also sums the bias gradient. The CPU side is the
// blocked GEMM followed by plain loops, the reference the GPU is tested against.
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "core/cpu/gemm_cpu.h"
#include "core/cpu/loops.h"
#include "core/dtype_sets.h"
#include "core/registry.h"
#include "core/step/step_state.h"
#include "core/tensor/copy.h"
#include "kiln/amp.h"
#include "kiln/elementwise.h"
#include "kiln/linalg.h"
#include "kiln/ops.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/shape_ops.h"
#include "linear_grads.h"

namespace kiln {

Tensor matmul_transposed_b(const Tensor& x, const Tensor& w);  // matmul.cpp: x @ w^T, no copy of w

namespace {

using linear_detail::linear_vjp;
using linear_detail::lt_operand;
using linear_detail::lt_ready;
using linear_detail::LtOperand;

bool relu_of(const Attrs& a) { return a.get_or("activation", std::int64_t{0}) == 1; }

void linear_cpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor &x = a.inputs[0], &w = a.inputs[1], &b = a.inputs[2];
  Tensor& y = out[0];
  const std::int64_t m = x.shape()[0], k = x.shape()[1], n = w.shape()[0];
  cpu::gemm(y.dtype(), {1, m, n, k}, 1.0, {x.data_ptr(), 0, x.strides()[0], x.strides()[1]},
            {w.data_ptr(), 0, w.strides()[1], w.strides()[0]}, 0.0, {y.data_ptr(), 0, n, 1});
  const bool relu = relu_of(a.attrs);
  const Tensor bias = b.contiguous();
  cpu::visit(y.dtype(), [&]<class T>() {
    T* py = cpu::ptr<T>(y);
    const T* pb = cpu::ptr<T>(bias);
    // Per row, with the ReLU as a select rather than a branch (random signs defeat one), so the
    // loop vectorizes. NaN stays NaN, as relu keeps it.
    auto rows = [&]<bool kRelu>() {
      for (std::int64_t i = 0; i < m; ++i) {
        T* __restrict row = py + i * n;
        for (std::int64_t j = 0; j < n; ++j) {
          const auto v = cpu::load(row[j]) + cpu::load(pb[j]);
          row[j] = cpu::store<T>(kRelu && v <= decltype(v)(0) ? decltype(v)(0) : v);
        }
      }
    };
    if (relu)
      rows.template operator()<true>();
    else
      rows.template operator()<false>();
  });
}

void relu_in_place(const Tensor& y, const rt::Stream& s) {
  static const gpu::LazyKernel relu("relu");
  kernels::launch_unary(relu.get(), y.dtype(), y.dtype(), gpu::operand(y), gpu::operand(y), y.shape(), 0, 0, s);
}

// Without an algorithm for the epilogue (f64): the bias copied into y, a GEMM adding onto it,
// then an in-place ReLU.
void linear_gpu_fallback(const OpArgs& a, const Tensor& x, const Tensor& w, const Tensor& y) {
  const Tensor& b = a.inputs[2];
  const std::int64_t m = x.shape()[0], k = x.shape()[1], n = w.shape()[0];
  gpu::copy(make_view(b, {m, n}, {0, b.strides()[0]}, b.offset()), y);
  const rt::Stream& s = stream_of(a.device);
  const bool ok =
      kernels::gemm(y.dtype(), {1, m, n, k}, 1.0, {device_address(x), 0, x.strides()[0], x.strides()[1]},
                    {device_address(w), 0, w.strides()[1], w.strides()[0]}, 1.0, {device_address(y), 0, n, 1}, s);
  if (!ok) throw Error("[linear] cuBLAS refused the layout of x and w after making them contiguous");
  if (relu_of(a.attrs)) relu_in_place(y, s);
}

// Inside a compiled call, a product settled on the row kind (an output layer's logits, a warp a
// row) is held for the next op: a cross-entropy over its rows computes them in its own kernel
// (cross_entropy.cpp). Else it runs now, and where its choice is the row kind only since this
// call measured it (or a shape-only pass plans it), the next op loads that kernel for the
// capture. False: the product is the caller's to run.
bool ran_for_next_op(const kernels::LtMatmul& g, const Tensor& y, const rt::Stream& s) {
  if (g.epilogue != kernels::LtEpilogue::bias || !step::fusing()) return false;
  const bool planning = rt::shape_only();
  if (!planning)
    if (const std::optional<kernels::RowProduct> row = kernels::lt_row_product(g, s))
      if (step::hold_product({y, [g, &s] { (void)kernels::lt_matmul(g, s); }, *row})) return true;
  if (!kernels::lt_matmul(g, s)) return false;
  if (const std::optional<kernels::RowProduct> row = kernels::lt_row_product(g, s))
    (void)step::hold_product({y, [] {}, *row, true});
  return true;
}

void linear_gpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor x = lt_ready(a.inputs[0]), w = lt_ready(a.inputs[1]), b = gpu::contiguous(a.inputs[2]);
  const Tensor& y = out[0];
  const LtOperand lx = lt_operand(x), lw = lt_operand(w);
  // cuBLASLt's f16 ReLU epilogue turns NaN into 0 (its f32 and bf16 ones keep it, as relu
  // does): f16 adds the bias in the epilogue and runs relu as its own kernel.
  const bool relu = relu_of(a.attrs), epilogue_relu = relu && y.dtype() != DType::f16;
  // Column-major: y^T (n x m) = w (n x k) @ x^T (k x m); w's storage read as (k x n) is w^T.
  kernels::LtMatmul g{.dtype = y.dtype(),
                      .m = w.shape()[0],
                      .n = x.shape()[0],
                      .k = x.shape()[1],
                      .trans_a = !lw.trans,
                      .trans_b = lx.trans,
                      .lda = lw.ld,
                      .ldb = lx.ld,
                      .ldd = w.shape()[0],
                      .epilogue = epilogue_relu ? kernels::LtEpilogue::relu_bias : kernels::LtEpilogue::bias,
                      .a = device_address(w),
                      .b = device_address(x),
                      .d = device_address(y),
                      .bias = device_address(b)};
  const rt::Stream& s = stream_of(a.device);
  if (!relu && ran_for_next_op(g, y, s)) return;  // an f16 ReLU runs after its product, below
  if (!kernels::lt_matmul(g, s)) return linear_gpu_fallback(a, x, w, y);
  if (relu && !epilogue_relu) relu_in_place(y, s);
}

const OpRef kLinear = register_op({
    .name = "linear",
    .num_inputs = 3,
    .dtypes = dtype_sets::floating,
    .dtype_rule = rules::promote,
    .shape_rule =
        [](const OpArgs& a) {
          const Shape &x = a.inputs[0].shape(), &w = a.inputs[1].shape(), &b = a.inputs[2].shape();
          if (x.size() != 2 || w.size() != 2 || x[1] != w[1] || b != Shape{w[0]})
            throw ShapeError("[linear] needs x (m, k), w (n, k) and bias (n); got " + shape_str(x) + ", " +
                             shape_str(w) + " and " + shape_str(b));
          return std::vector<Shape>{{x[0], w[0]}};
        },
    .cpu = linear_cpu,
    .gpu = linear_gpu,
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) { return linear_vjp(c, g[0], relu_of(c.attrs())); },
    .relu_masked_gradient = relu_of,
    .save = {.inputs = {0, 1}, .outputs = {0}},
    .test = {.attrs = {Attrs{}, Attrs{{"activation", std::int64_t{1}}}},
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {3, 5}, {3}}, {{1, 4}, {7, 4}, {7}}}},
});

}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in, Activation activation) {
  const Tensor x = autocast_lower(x_in), w = autocast_lower(w_in), bias = autocast_lower(bias_in);
  if (w.dim() != 2)
    throw ShapeError("[linear] weight must be 2-D (out_features, in_features), got shape " + shape_str(w.shape()));
  if (x.dim() < 1 || x.shape().back() != w.shape()[1])
    throw ShapeError("[linear] input of shape " + shape_str(x.shape()) + " does not end in in_features = " +
                     std::to_string(w.shape()[1]) + " of weight " + shape_str(w.shape()));
  if (bias.defined() && bias.shape() != Shape{w.shape()[0]})
    throw ShapeError("[linear] bias must have shape (" + std::to_string(w.shape()[0]) + ") to match weight " +
                     shape_str(w.shape()) + ", got " + shape_str(bias.shape()));
  if (!bias.defined()) {
    Tensor y = matmul_transposed_b(x, w);
    return activation == Activation::relu ? relu(y) : y;
  }
  // The op takes x as (m, k): leading dims fold into m and come back on the result.
  Shape out = x.shape();
  out.back() = w.shape()[0];
  const Tensor x2 = x.dim() == 2 ? x : reshape(x, {-1, x.shape().back()});
  const Attrs attrs{{"activation", std::int64_t{activation == Activation::relu ? 1 : 0}}};
  Tensor y = call(kLinear, {x2, w, bias}, attrs);
  return x.dim() == 2 ? y : reshape(y, out);
}

}  // namespace kiln
