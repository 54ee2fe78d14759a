// linear = x @ w^T + b, optionally followed by ReLU, as one op: on the GPU one cuBLASLt product
// whose epilogue adds the bias (and applies the ReLU), and in the backward pass one product
// for the weight gradient whose epilogue also sums the bias gradient. The CPU side is the
// blocked GEMM followed by plain loops, the reference the GPU is tested against.
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/reduce_kernels.h"
#include "core/cpu/gemm_cpu.h"
#include "core/cpu/loops.h"
#include "core/dtype_sets.h"
#include "core/registry.h"
#include "core/tensor/copy.h"
#include "kiln/amp.h"
#include "kiln/elementwise.h"
#include "kiln/linalg.h"
#include "kiln/ops.h"
#include "kiln/shape_ops.h"

namespace kiln {

Tensor matmul_transposed_b(const Tensor& x, const Tensor& w);  // matmul.cpp: x @ w^T, no copy of w

namespace {

bool relu_of(const Attrs& a) { return a.get_or("activation", std::int64_t{0}) == 1; }

// A (rows, cols) operand as cuBLASLt reads it: column-major storage with a leading dimension,
// transposed or not. Unit stride along the columns of the row-major view, or along its rows.
struct LtOperand {
  bool ok = false, trans = false;
  std::int64_t ld = 0;
};

LtOperand lt_operand(const Tensor& t) {
  const std::int64_t rows = t.shape()[0], cols = t.shape()[1], rs = t.strides()[0], cs = t.strides()[1];
  if ((cs == 1 || cols == 1) && rs >= std::max<std::int64_t>(cols, 1)) return {true, false, rs};
  if ((rs == 1 || rows == 1) && cs >= std::max<std::int64_t>(rows, 1)) return {true, true, cs};
  return {};
}

Tensor lt_ready(const Tensor& t) { return lt_operand(t).ok ? t : gpu::contiguous(t); }

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
  if (!kernels::lt_matmul(g, s)) return linear_gpu_fallback(a, x, w, y);
  if (relu && !epilogue_relu) relu_in_place(y, s);
}

// Weight and bias gradients of linear from gp = dL/d(pre-activation) (m, n) and x (m, k):
// dW = gp^T @ x (n, k) and db = the column sums of gp (n). With `f32_grads`, f16/bf16 inputs
// give f32 gradients: the products' f32 sums, not rounded to the inputs' dtype.
void grad_wb_cpu(const OpArgs& a, std::span<Tensor> out) {
  // 16-bit values widen exactly, so the f32 loops are the reference for f32 results.
  const Tensor gp = convert(a.inputs[0], out[0].dtype()), x = convert(a.inputs[1], out[0].dtype());
  const std::int64_t m = gp.shape()[0], n = gp.shape()[1], k = x.shape()[1];
  cpu::gemm(out[0].dtype(), {1, n, k, m}, 1.0, {gp.data_ptr(), 0, gp.strides()[1], gp.strides()[0]},
            {x.data_ptr(), 0, x.strides()[0], x.strides()[1]}, 0.0, {out[0].data_ptr(), 0, k, 1});
  cpu::visit(gp.dtype(), [&]<class T>() {
    const T* pg = cpu::ptr<T>(gp);
    T* pdb = cpu::ptr<T>(out[1]);
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < m; ++i)
        s += static_cast<double>(cpu::load(pg[i * gp.strides()[0] + j * gp.strides()[1]]));
      pdb[j] = cpu::store<T>(static_cast<cpu::compute_t<T>>(s));
    }
  });
}

// dW through a plain product and db as column sums of gp, two kernels: cuBLASLt's bias-gradient
// epilogue runs bf16 products of fewer than 16 columns at a fifth of that pace (1024x512 -> 10:
// 44 us against 9 on an H200).
void grad_wb_split_gpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor gp = gpu::contiguous(a.inputs[0]), x = lt_ready(a.inputs[1]);
  const std::int64_t m = gp.shape()[0], n = gp.shape()[1], k = x.shape()[1];
  const rt::Stream& s = stream_of(a.device);
  bool ok = false;
  if (out[0].dtype() == gp.dtype()) {
    ok = kernels::gemm(out[0].dtype(), {1, n, k, m}, 1.0, {device_address(gp), 0, 1, n},
                       {device_address(x), 0, x.strides()[0], x.strides()[1]}, 0.0, {device_address(out[0]), 0, k, 1},
                       s);
  } else {  // f32 gradients of 16-bit inputs: column-major dW^T (k x n) = x^T (k x m) @ gp (m x n)
    const LtOperand lx = lt_operand(x);
    ok = kernels::lt_matmul({.dtype = gp.dtype(),
                             .out = out[0].dtype(),
                             .m = k,
                             .n = n,
                             .k = m,
                             .trans_a = lx.trans,
                             .trans_b = true,
                             .lda = lx.ld,
                             .ldb = n,
                             .ldd = k,
                             .a = device_address(x),
                             .b = device_address(gp),
                             .d = device_address(out[0])},
                            s);
  }
  if (!ok) throw Error("[linear_grad_wb] cuBLAS refused the layout of the inputs");
  static const gpu::LazyKernel sum_kernel("sum");
  kernels::launch_reduce(sum_kernel.get(), gp.dtype(), out[1].dtype(), device_address(gp), device_address(out[1]), 1, m,
                         n, s);
}

void grad_wb_gpu(const OpArgs& a, std::span<Tensor> out) {
  if (a.inputs[0].shape()[0] == 0) {  // no rows: both gradients are zero
    for (const Tensor& t : out)
      rt::memset_device(device_address(t), 0, static_cast<std::size_t>(t.numel()) * t.element_size(),
                        stream_of(a.device));
    return;
  }
  if (a.inputs[0].dtype() == DType::bf16 && a.inputs[0].shape()[1] < 16) return grad_wb_split_gpu(a, out);
  const Tensor gp = lt_ready(a.inputs[0]), x = lt_ready(a.inputs[1]);
  const LtOperand lg = lt_operand(gp), lx = lt_operand(x);
  // Column-major: dW^T (k x n) = x^T (k x m) @ gp (m x n); gp's storage read as (n x m) is gp^T,
  // and BGRADB sums op(B) = gp over m, the product's k.
  kernels::LtMatmul g{.dtype = gp.dtype(),
                      .out = out[0].dtype(),
                      .m = x.shape()[1],
                      .n = gp.shape()[1],
                      .k = x.shape()[0],
                      .trans_a = lx.trans,
                      .trans_b = !lg.trans,
                      .lda = lx.ld,
                      .ldb = lg.ld,
                      .ldd = x.shape()[1],
                      .epilogue = kernels::LtEpilogue::bgrad_b,
                      .a = device_address(x),
                      .b = device_address(gp),
                      .d = device_address(out[0]),
                      .bias = device_address(out[1])};
  if (kernels::lt_matmul(g, stream_of(a.device))) return;
  // No bias-gradient epilogue writing f32 from these inputs: the product and the sum apart.
  if (out[0].dtype() != gp.dtype()) return grad_wb_split_gpu(a, out);
  throw DTypeError("[linear_grad_wb] cuBLASLt has no bias-gradient epilogue for " +
                   std::string(dtype_name(gp.dtype())) + " inputs and " + std::string(dtype_name(out[0].dtype())) +
                   " gradients");
}

// Inputs promoted; with attr `f32_grads` (a bool), f16/bf16 inputs give f32 gradients.
DTypePlan grad_wb_dtypes(const OpArgs& a) {
  DTypePlan p = rules::promote(a);
  if (a.attrs.get_or("f32_grads", false) && (p.key == DType::f16 || p.key == DType::bf16))
    p.outputs.assign(2, DType::f32);
  return p;
}

const OpRef kLinearGradWb = register_op({
    .name = "linear_grad_wb",
    .num_inputs = 2,
    .num_outputs = 2,
    .dtypes = {DType::f32, DType::f16, DType::bf16},
    .dtype_rule = grad_wb_dtypes,
    .shape_rule =
        [](const OpArgs& a) {
          const Shape &g = a.inputs[0].shape(), &x = a.inputs[1].shape();
          if (g.size() != 2 || x.size() != 2 || g[0] != x[0])
            throw ShapeError("[linear_grad_wb] needs gradients (m, n) and inputs (m, k); got " + shape_str(g) +
                             " and " + shape_str(x));
          return std::vector<Shape>{{g[1], x[1]}, {g[1]}};
        },
    .cpu = grad_wb_cpu,
    .gpu = grad_wb_gpu,
    .test = {.attrs = {Attrs{}, Attrs{{"f32_grads", true}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {6, 3}}, {{1, 4}, {1, 7}}, {{40, 20}, {40, 24}}}},
});

// gp, the gradient before the activation; dW and db together when a GPU epilogue can sum db,
// written into the parameters' .grad() buffers when the step offers them (grad sinks). The
// 16-bit copies of f32 parameters (autocast) take f32 gradients, summed as f32, with no cast.
std::vector<Tensor> weight_and_bias_grads(const VjpContext& c, const Tensor& gp, const Tensor& x) {
  const bool need_w = c.needs_grad(1), need_b = c.needs_grad(2);
  if (need_w && need_b && gp.device().is_cuda() && gp.dtype() != DType::f64) {
    const Tensor in[] = {gp, x}, into[] = {c.grad_sink(1), c.grad_sink(2)};
    const bool f32 = c.grad_dtype(1) == DType::f32 && c.grad_dtype(2) == DType::f32;
    return dispatch(kLinearGradWb, in, f32 ? Attrs{{"f32_grads", true}} : Attrs{}, into);
  }
  std::vector<Tensor> r(2);
  if (need_w) r[0] = matmul(transpose(gp, 0, 1), x);
  if (need_b) r[1] = sum(gp, {0}, false);
  return r;
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
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const Tensor gp = relu_of(c.attrs()) ? relu_backward(g[0], c.saved_output(0)) : g[0];
      std::vector<Tensor> r(3);
      if (c.needs_grad(0)) r[0] = matmul(gp, c.saved_input(1));
      auto wb = weight_and_bias_grads(c, gp, c.saved_input(0));
      r[1] = std::move(wb[0]);
      r[2] = std::move(wb[1]);
      return r;
    },
    .save = {.inputs = {0, 1}, .outputs = {0}},
    .test = {.attrs = {Attrs{}, Attrs{{"activation", std::int64_t{1}}}},
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {3, 5}, {3}}, {{1, 4}, {7, 4}, {7}}}},
});

}  // namespace

LinearGrads linear_grads(const Tensor& gp, const Tensor& x) {
  const NoGradGuard no_grad;
  if (gp.dtype() == DType::f64 || x.dtype() == DType::f64) {
    if (gp.dim() != 2 || x.dim() != 2 || gp.shape()[0] != x.shape()[0])
      throw ShapeError("[linear_grads] needs gradients (m, n) and inputs (m, k); got " + shape_str(gp.shape()) +
                       " and " + shape_str(x.shape()));
    return {matmul(transpose(gp, 0, 1), x), sum(gp, {0}, false)};
  }
  const Tensor in[] = {gp, x};
  std::vector<Tensor> r = dispatch(kLinearGradWb, in);
  return {std::move(r[0]), std::move(r[1])};
}

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
