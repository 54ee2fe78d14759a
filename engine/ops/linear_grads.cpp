// linear's backward. On the GPU a ReLU layer's gradient is masked and its bias gradient summed
// in one kernel (relu_backward_bias_grad), then the weight gradient is a plain product; a layer
// without ReLU sums its bias gradient in the weight product's cuBLASLt epilogue. Where a layer's
// input is a ReLU's output that it alone reads, its input gradient comes masked from its product
// (relu_masked_input_grad), and the ReLU layer below takes it as a plain layer's. Gradients of
// 16-bit copies of f32 parameters (autocast) are f32, written into .grad() when the step
// offers it (grad sinks). The CPU references are plain loops.
#include "linear_grads.h"

#include <memory>
#include <optional>

#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/grad_stream.h"
#include "backend/cuda/norm_kernels.h"
#include "core/cpu/gemm_cpu.h"
#include "core/cpu/loops.h"
#include "core/dtype_sets.h"
#include "core/tensor/copy.h"
#include "core/tensor/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/elementwise.h"
#include "kiln/linalg.h"
#include "kiln/ops.h"
#include "kiln/runtime/log.h"
#include "kiln/shape_ops.h"

namespace kiln {

namespace linear_detail {

LtOperand lt_operand(const Tensor& t) {
  const std::int64_t rows = t.shape()[0], cols = t.shape()[1], rs = t.strides()[0], cs = t.strides()[1];
  if ((cs == 1 || cols == 1) && rs >= std::max<std::int64_t>(cols, 1)) return {true, false, rs};
  if ((rs == 1 || rows == 1) && cs >= std::max<std::int64_t>(rows, 1)) return {true, true, cs};
  return {};
}

Tensor lt_ready(const Tensor& t) { return lt_operand(t).ok ? t : gpu::contiguous(t); }

bool row_input_grad_serves(DType t) {
  return t == DType::bf16 || t == DType::f16 || (t == DType::f32 && !allow_tf32());
}

bool relu_made_input(const Tensor& out, int i) {
  const std::shared_ptr<Node> n = out.grad_fn();
  if (!n || i < 0 || static_cast<std::size_t>(i) >= n->next_edges().size()) return false;
  const Node::Edge& e = n->next_edges()[static_cast<std::size_t>(i)];
  const Node* p = e.node.get();
  return p && e.output_nr == 0 && p->outputs().size() == 1 && p->op().relu_masked_gradient &&
         p->op().relu_masked_gradient(p->attrs());
}

}  // namespace linear_detail

namespace {

using linear_detail::lt_operand;
using linear_detail::lt_ready;
using linear_detail::LtOperand;

bool is_16bit(DType t) { return t == DType::f16 || t == DType::bf16; }

// Inputs promoted; with attr `f32_grads` (a bool), f16/bf16 inputs give f32 results for the
// outputs from `first` on (the parameters' gradients).
DTypePlan f32_grads_from(const OpArgs& a, std::size_t first) {
  DTypePlan p = rules::promote(a);
  if (a.attrs.get_or("f32_grads", false) && is_16bit(p.key))
    for (std::size_t i = first; i < p.outputs.size(); ++i) p.outputs[i] = DType::f32;
  return p;
}

Attrs f32_grads_attrs(bool f32) { return f32 ? Attrs{{"f32_grads", true}} : Attrs{}; }

// dW (n, k) = gp^T @ x from gp (m, n) and x (m, k), in dW's dtype (gp's, or f32 for 16-bit gp).
void weight_grad_cpu(const Tensor& gp_in, const Tensor& x_in, const Tensor& dw) {
  // 16-bit values widen exactly, so the f32 loops are the reference for f32 results.
  const Tensor gp = convert(gp_in, dw.dtype()), x = convert(x_in, dw.dtype());
  const std::int64_t m = gp.shape()[0], n = gp.shape()[1], k = x.shape()[1];
  cpu::gemm(dw.dtype(), {1, n, k, m}, 1.0, {gp.data_ptr(), 0, gp.strides()[1], gp.strides()[0]},
            {x.data_ptr(), 0, x.strides()[0], x.strides()[1]}, 0.0, {dw.data_ptr(), 0, k, 1});
}

// A weight gradient's stream: beside the backward's chain (grad_stream), unless it is an exact-f32
// product large enough to fill the SMs alone, which beside the chain only shares them with it
// (the f32 mlp at batch 1024 took 0.1680 ms a step with its products beside, 0.1612 without).
const rt::Stream& weight_product_stream(const Tensor& gp, const Tensor& x, std::initializer_list<Tensor> keep,
                                        const rt::Stream& main) {
  constexpr double kFillingF32Macs = 1 << 27;
  const double macs =
      static_cast<double>(gp.shape()[0]) * static_cast<double>(gp.shape()[1]) * static_cast<double>(x.shape()[1]);
  if (gp.dtype() == DType::f32 && !allow_tf32() && macs >= kFillingF32Macs) return main;
  return grad_stream::fork(main, keep);
}

void weight_grad_gpu(const Tensor& gp_in, const Tensor& x_in, const Tensor& dw, const rt::Stream& main) {
  const Tensor gp = gpu::contiguous(gp_in), x = lt_ready(x_in);
  const rt::Stream& s = weight_product_stream(gp, x, {gp, x, dw}, main);
  const std::int64_t m = gp.shape()[0], n = gp.shape()[1], k = x.shape()[1];
  if (m == 0) {
    rt::memset_device(device_address(dw), 0, static_cast<std::size_t>(dw.numel()) * dw.element_size(), s);
    return;
  }
  bool ok = false;
  if (dw.dtype() == gp.dtype()) {
    ok = kernels::gemm(dw.dtype(), {1, n, k, m}, 1.0, {device_address(gp), 0, 1, n},
                       {device_address(x), 0, x.strides()[0], x.strides()[1]}, 0.0, {device_address(dw), 0, k, 1}, s);
  } else {  // f32 gradients of 16-bit inputs: column-major dW^T (k x n) = x^T (k x m) @ gp (m x n)
    const LtOperand lx = lt_operand(x);
    ok = kernels::lt_matmul({.dtype = gp.dtype(),
                             .out = dw.dtype(),
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
                             .d = device_address(dw)},
                            s);
  }
  if (!ok) throw Error("[linear_grad_w] cuBLAS refused the layout of the inputs");
}

// Whether unmasked column sums of (rows, cols) may leave the backward's chain: in one split (one
// block a column where the rows allow), since a merge's counter is the module's, which another
// launch of it on the device's stream could meet.
bool bias_sums_beside(std::int64_t rows, std::int64_t cols, Device device) {
  return kernels::bias_grad_split(rows, cols, device.index(), true).splits == 1;
}

// db (n) = the column sums of g (m, n); with y, g masked as relu_backward does and written to gp.
// Unmasked and `beside`, beside the backward's chain where bias_sums_beside allows.
void bias_grad_gpu(const Tensor& g_in, const Tensor& y_in, const Tensor& gp, const Tensor& db, Device device,
                   bool beside = true) {
  const Tensor g = gpu::contiguous(g_in), y = y_in.defined() ? gpu::contiguous(y_in) : Tensor();
  const std::int64_t m = g.shape()[0], n = g.shape()[1];
  beside = beside && !y.defined() && bias_sums_beside(m, n, device);
  const kernels::NormSplit split = kernels::bias_grad_split(m, n, device.index(), beside);
  const Tensor parts =
      empty({split.scratch}, {.dtype = g.dtype() == DType::f64 ? DType::f64 : DType::f32, .device = device});
  const rt::Stream& s = beside ? grad_stream::fork(stream_of(device), {g, db, parts}) : stream_of(device);
  kernels::launch_bias_grad({.t = g.dtype(),
                             .p = db.dtype(),
                             .g = device_address(g),
                             .y = y.defined() ? device_address(y) : 0,
                             .gp = gp.defined() ? device_address(gp) : 0,
                             .db = device_address(db),
                             .parts = device_address(parts)},
                            m, n, split, s);
}

std::vector<Shape> grad_shapes(const char* op, const OpArgs& a) {
  const Shape &g = a.inputs[0].shape(), &x = a.inputs[1].shape();
  if (g.size() != 2 || x.size() != 2 || g[0] != x[0])
    throw ShapeError(std::string("[") + op + "] needs gradients (m, n) and inputs (m, k); got " + shape_str(g) +
                     " and " + shape_str(x));
  return {{g[1], x[1]}, {g[1]}};
}

// out (n) = the column sums of g (m, n), in out's dtype.
void column_sums_cpu(const Tensor& g_in, const Tensor& out) {
  const Tensor g = convert(g_in, out.dtype());
  const std::int64_t m = g.shape()[0], n = g.shape()[1];
  cpu::visit(g.dtype(), [&]<class T>() {
    const T* pg = cpu::ptr<T>(g);
    T* po = cpu::ptr<T>(out);
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < m; ++i)
        s += static_cast<double>(cpu::load(pg[i * g.strides()[0] + j * g.strides()[1]]));
      po[j] = cpu::store<T>(static_cast<cpu::compute_t<T>>(s));
    }
  });
}

// dW = gp^T @ x (n, k) and db = the column sums of gp (n), from gp = dL/d(pre-activation) (m, n)
// and x (m, k).
void grad_wb_cpu(const OpArgs& a, std::span<Tensor> out) {
  weight_grad_cpu(a.inputs[0], a.inputs[1], out[0]);
  column_sums_cpu(a.inputs[0], out[1]);
}

// attr `no_input_grad`: the layer has no input gradient to compute, so its product and sums are
// the backward's last work on this path and one of them runs on the backward's own stream.
bool no_input_grad(const OpArgs& a) { return a.attrs.get_or("no_input_grad", false); }

// The product and the column sums apart. (cuBLASLt's bias-gradient epilogue runs bf16 products
// of fewer than 16 columns at a fifth of that pace, 1024x512 -> 10: 44 us against 9 on an H200;
// those layers run narrow_grad_wb_gpu.)
// Without an input gradient, the weight product (the longer kernel) runs on the backward's
// stream, which has nothing else to run, and the sums beside it where one block a column sums
// them: on the second stream the product queued behind the other layers' products (H200, f32 mlp
// at batch 128: 0.0547 -> 0.0506 ms a step; bf16 0.0336 -> 0.0326; the sums on a third stream or on
// the chain, before or after the product, lost).
void grad_wb_split_gpu(const OpArgs& a, std::span<Tensor> out) {
  const rt::Stream& s = stream_of(a.device);
  const bool last = no_input_grad(a);
  if (last && bias_sums_beside(a.inputs[0].shape()[0], a.inputs[0].shape()[1], a.device)) {
    bias_grad_gpu(a.inputs[0], Tensor(), Tensor(), out[1], a.device, true);
    const grad_stream::Allow on_chain(false);
    return weight_grad_gpu(a.inputs[0], a.inputs[1], out[0], s);
  }
  weight_grad_gpu(a.inputs[0], a.inputs[1], out[0], s);
  bias_grad_gpu(a.inputs[0], Tensor(), Tensor(), out[1], a.device, !last);
}

bool narrow_layer(const Tensor& gp) {
  return gp.dtype() == DType::bf16 && gp.shape()[1] < kernels::kNarrowLinearOutputs;
}

// A narrow bf16 layer's (a classifier's 10 outputs) dW and db in one kernel (norm.cu's
// kiln_narrow_linear_grad), where cuBLAS's product and the column sums ran apart: beside the
// backward's chain, or on it where the layer has no input gradient (nothing else runs there).
// With a third input (linear_grad_wb_below), also its column sums into out[2].
void narrow_grad_wb_gpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor gp = gpu::contiguous(a.inputs[0]), x = gpu::contiguous(a.inputs[1]);
  const bool below = a.inputs.size() > 2;
  const Tensor b = below ? gpu::contiguous(a.inputs[2]) : Tensor(), db_below = below ? out[2] : Tensor();
  const rt::Stream& main = stream_of(a.device);
  const rt::Stream& s = no_input_grad(a) ? main : grad_stream::fork(main, {gp, x, b, out[0], out[1], db_below});
  kernels::launch_narrow_linear_grad({.t = gp.dtype(),
                                      .p = out[0].dtype(),
                                      .g = device_address(gp),
                                      .x = device_address(x),
                                      .dw = device_address(out[0]),
                                      .db = device_address(out[1]),
                                      .below = below ? device_address(b) : 0,
                                      .db_below = below ? device_address(db_below) : 0},
                                     gp.shape()[0], gp.shape()[1], x.shape()[1], s);
}

void grad_wb_gpu(const OpArgs& a, std::span<Tensor> out) {
  if (narrow_layer(a.inputs[0])) return narrow_grad_wb_gpu(a, out);
  if (a.inputs[0].shape()[0] == 0 || no_input_grad(a)) return grad_wb_split_gpu(a, out);
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
  // The tile engine may win such a product by far more than the sums cost apart (a few us).
  if (kernels::lt_times_tile_engine(g, a.device.index())) return grad_wb_split_gpu(a, out);
  if (kernels::lt_matmul(g, weight_product_stream(gp, x, {gp, x, out[0], out[1]}, stream_of(a.device)))) return;
  // No bias-gradient epilogue writing f32 from these inputs: the product and the sum apart.
  if (out[0].dtype() != gp.dtype()) return grad_wb_split_gpu(a, out);
  throw DTypeError("[linear_grad_wb] cuBLASLt has no bias-gradient epilogue for " +
                   std::string(dtype_name(gp.dtype())) + " inputs and " + std::string(dtype_name(out[0].dtype())) +
                   " gradients");
}

const OpRef kLinearGradWb = register_op({
    .name = "linear_grad_wb",
    .num_inputs = 2,
    .num_outputs = 2,
    .dtypes = {DType::f32, DType::f16, DType::bf16},
    .dtype_rule = [](const OpArgs& a) { return f32_grads_from(a, 0); },
    .shape_rule = [](const OpArgs& a) { return grad_shapes("linear_grad_wb", a); },
    .cpu = grad_wb_cpu,
    .gpu = grad_wb_gpu,
    .test = {.attrs = {Attrs{}, Attrs{{"f32_grads", true}}, Attrs{{"no_input_grad", true}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {6, 3}}, {{1, 4}, {1, 7}}, {{40, 20}, {40, 24}}}},
});

// linear_grad_wb's dW and db, and db_below (k) = the column sums of `below` (m, k), the gradient
// of x's maker's output: that layer's bias gradient (linear_grads.h's ahead bias gradient). On the
// GPU in one kernel for a narrow bf16 layer, else as linear_grad_wb with the sums apart.
void grad_wb_below_cpu(const OpArgs& a, std::span<Tensor> out) {
  grad_wb_cpu(a, out);
  column_sums_cpu(a.inputs[2], out[2]);
}

void grad_wb_below_gpu(const OpArgs& a, std::span<Tensor> out) {
  if (narrow_layer(a.inputs[0])) return narrow_grad_wb_gpu(a, out);
  const OpArgs two{a.op, a.inputs.first(2), a.attrs, a.device};
  grad_wb_gpu(two, out.first(2));
  bias_grad_gpu(a.inputs[2], Tensor(), Tensor(), out[2], a.device, false);
}

const OpRef kLinearGradWbBelow = register_op({
    .name = "linear_grad_wb_below",
    .num_inputs = 3,
    .num_outputs = 3,
    .dtypes = {DType::f32, DType::f16, DType::bf16},
    .dtype_rule = [](const OpArgs& a) { return f32_grads_from(a, 0); },
    .shape_rule =
        [](const OpArgs& a) {
          std::vector<Shape> s = grad_shapes("linear_grad_wb_below", a);
          if (a.inputs[2].shape() != a.inputs[1].shape())
            throw ShapeError("[linear_grad_wb_below] needs the layer below's gradient in the inputs' shape " +
                             shape_str(a.inputs[1].shape()) + "; got " + shape_str(a.inputs[2].shape()));
          s.push_back({a.inputs[1].shape()[1]});
          return s;
        },
    .cpu = grad_wb_below_cpu,
    .gpu = grad_wb_below_gpu,
    .test = {.attrs = {Attrs{}, Attrs{{"f32_grads", true}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {6, 3}, {6, 3}}, {{40, 10}, {40, 24}, {40, 24}}, {{0, 4}, {0, 7}, {0, 7}}}},
});

// dW alone (a ReLU layer's, whose bias gradient relu_backward_bias_grad summed).
const OpRef kLinearGradW = register_op({
    .name = "linear_grad_w",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule = [](const OpArgs& a) { return f32_grads_from(a, 0); },
    .shape_rule = [](const OpArgs& a) { return std::vector<Shape>{grad_shapes("linear_grad_w", a)[0]}; },
    .cpu = [](const OpArgs& a, std::span<Tensor> out) { weight_grad_cpu(a.inputs[0], a.inputs[1], out[0]); },
    .gpu = [](const OpArgs& a,
              std::span<Tensor> out) { weight_grad_gpu(a.inputs[0], a.inputs[1], out[0], stream_of(a.device)); },
    .test = {.attrs = {Attrs{}, Attrs{{"f32_grads", true}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {6, 3}}, {{1, 4}, {1, 7}}, {{40, 20}, {40, 24}}}},
});

// gp = relu_backward(g, y) (g where y > 0, else 0) and db = the column sums of gp, from g and
// y (m, n): a ReLU layer's masked gradient and its bias gradient. With `f32_grads`, db is f32
// for 16-bit g.
void relu_bias_grad_cpu(const OpArgs& a, std::span<Tensor> out) {
  const std::int64_t m = a.inputs[0].shape()[0], n = a.inputs[0].shape()[1];
  const std::vector<double> g = a.inputs[0].to_vector<double>(), y = a.inputs[1].to_vector<double>();
  std::vector<double> gp(g.size()), db(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i) gp[i] = y[i] > 0 ? g[i] : 0.0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) db[static_cast<std::size_t>(j)] += gp[static_cast<std::size_t>(i * n + j)];
  copy_into(from_vector(gp, a.inputs[0].shape()), out[0]);
  copy_into(from_vector(db, {n}), out[1]);
}

const OpRef kReluBackwardBiasGrad = register_op({
    .name = "relu_backward_bias_grad",
    .num_inputs = 2,
    .num_outputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule = [](const OpArgs& a) { return f32_grads_from(a, 1); },
    .shape_rule =
        [](const OpArgs& a) {
          const Shape &g = a.inputs[0].shape(), &y = a.inputs[1].shape();
          if (g.size() != 2 || g != y)
            throw ShapeError(
                "[relu_backward_bias_grad] needs a gradient and the ReLU's output of one shape (m, n); got " +
                shape_str(g) + " and " + shape_str(y));
          return std::vector<Shape>{g, {g[1]}};
        },
    .cpu = relu_bias_grad_cpu,
    .gpu = [](const OpArgs& a,
              std::span<Tensor> out) { bias_grad_gpu(a.inputs[0], a.inputs[1], out[0], out[1], a.device); },
    .test = {.attrs = {Attrs{}, Attrs{{"f32_grads", true}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {6, 5}}, {{1, 4}, {1, 4}}, {{300, 40}, {300, 40}}, {{0, 3}, {0, 3}}}},
});

// dx (m, k) = gp (m, n) @ w (n, k), zeroed where y (m, k) is not > 0.
void masked_input_grad_cpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor &gp = a.inputs[0], &w = a.inputs[1], &y = a.inputs[2], &dx = out[0];
  const std::int64_t m = gp.shape()[0], n = gp.shape()[1], k = w.shape()[1];
  cpu::gemm(dx.dtype(), {1, m, k, n}, 1.0, {gp.data_ptr(), 0, gp.strides()[0], gp.strides()[1]},
            {w.data_ptr(), 0, w.strides()[0], w.strides()[1]}, 0.0, {dx.data_ptr(), 0, k, 1});
  const Tensor yc = y.is_contiguous() ? y : y.contiguous();
  cpu::visit(dx.dtype(), [&]<class T>() {
    const T* py = cpu::ptr<T>(yc);
    T* pd = cpu::ptr<T>(dx);
    for (std::int64_t i = 0; i < m * k; ++i)
      if (!(cpu::load(py[i]) > 0)) pd[i] = cpu::store<T>(cpu::compute_t<T>(0));
  });
}

// The row kernel where it applies (an output layer's few columns: a warp a row, the bits of the
// fused loss's masked_dx), else cuBLASLt. Its layouts: everything dense, w and y 16-byte aligned.
std::optional<kernels::GemmLaunch> row_input_grad(const Tensor& gp, const Tensor& w, const Tensor& y) {
  if (!linear_detail::row_input_grad_serves(gp.dtype()) || !gp.is_contiguous() || !w.is_contiguous() ||
      !y.is_contiguous() || device_address(w) % 16 != 0 || device_address(y) % 16 != 0)
    return std::nullopt;
  return kernels::plan_rowdot_input_grad(gp.dtype(), gp.shape()[0], gp.shape()[1], w.shape()[1],
                                         kernels::gemm_target(gp.device().index()));
}

// Column-major, as cuBLASLt sees it: dx^T (k x m) = w^T (k x n) @ gp^T (n x m), masked by y^T.
void masked_input_grad_gpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor gp = lt_ready(a.inputs[0]), w = lt_ready(a.inputs[1]), y = gpu::contiguous(a.inputs[2]);
  const std::int64_t m = gp.shape()[0], n = gp.shape()[1], k = w.shape()[1];
  const rt::Stream& s = stream_of(a.device);
  if (m == 0 || k == 0) return;
  if (n > 0)
    if (const std::optional<kernels::GemmLaunch> row = row_input_grad(gp, w, y)) {
      kernels::launch_rowdot_input_grad(*row, device_address(gp), device_address(w), device_address(y),
                                        device_address(out[0]), s);
      return;
    }
  if (n == 0) {
    rt::memset_device(device_address(out[0]), 0, static_cast<std::size_t>(m * k) * out[0].element_size(), s);
    return;
  }
  const LtOperand lw = lt_operand(w), lg = lt_operand(gp);
  const bool ok = kernels::lt_matmul({.dtype = gp.dtype(),
                                      .m = k,
                                      .n = m,
                                      .k = n,
                                      .trans_a = lw.trans,
                                      .trans_b = lg.trans,
                                      .lda = lw.ld,
                                      .ldb = lg.ld,
                                      .ldd = k,
                                      .epilogue = kernels::LtEpilogue::relu_mask,
                                      .a = device_address(w),
                                      .b = device_address(gp),
                                      .d = device_address(out[0]),
                                      .bias = device_address(y)},
                                     s);
  if (!ok) throw Error("[relu_masked_input_grad] cuBLAS refused the layout of the inputs");
}

const OpRef kReluMaskedInputGrad = register_op({
    .name = "relu_masked_input_grad",
    .num_inputs = 3,
    .dtypes = {DType::f32, DType::f16, DType::bf16},
    .shape_rule =
        [](const OpArgs& a) {
          const Shape &g = a.inputs[0].shape(), &w = a.inputs[1].shape(), &y = a.inputs[2].shape();
          if (g.size() != 2 || w.size() != 2 || g[1] != w[0] || y != Shape{g[0], w[1]})
            throw ShapeError(
                "[relu_masked_input_grad] needs gradients (m, n), weights (n, k) and the ReLU's output "
                "(m, k); got " +
                shape_str(g) + ", " + shape_str(w) + " and " + shape_str(y));
          return std::vector<Shape>{y};
        },
    .cpu = masked_input_grad_cpu,
    .gpu = masked_input_grad_gpu,
    .test = {.gradcheck = false,
             .tolerance_scale = 4,
             .shapes = {{{6, 5}, {5, 3}, {6, 3}}, {{1, 4}, {4, 7}, {1, 7}}, {{40, 10}, {10, 24}, {40, 24}}}},
});

// Whether masking gp @ w (m, k) in its product pays. In exact f32 only where the FFMA kind, which
// masks in one launch, is timed beside cuBLASLt's split-K pair and its mask pass (on sm_90 its
// cluster split-K): the f32 mlp at batch 128 on an H200 took 0.0549 ms a step masked so, 0.0557
// not, and 0.0570 against 0.0559 masked on cuBLASLt's kernels alone.
bool mask_pays(const Tensor& gp, const Tensor& w, const Tensor& y) {
  if (gp.dtype() != DType::f32 || allow_tf32() || row_input_grad(gp, w, y)) return true;
  const kernels::LtMatmul g{.dtype = DType::f32,
                            .m = w.shape()[1],
                            .n = gp.shape()[0],
                            .k = gp.shape()[1],
                            .epilogue = kernels::LtEpilogue::relu_mask};
  return kernels::lt_times_ffma(g, gp.device().index());
}

// Whether this layer may return its input gradient masked on the GPU: y, the ReLU's output,
// saved in its own dtype (the dtype plan did not cast it), and gp and w of that dtype.
bool maskable(const VjpContext& c, const Tensor& gp) {
  if (!c.may_mask_input_gradient(0) || !gp.device().is_cuda() || gp.dtype() == DType::f64) return false;
  const DType y = c.saved_input(0).dtype();
  return y == c.input(0).dtype && y == gp.dtype() && c.saved_input(1).dtype() == gp.dtype();
}

// dx = gp @ w; masked where the layer's input is a ReLU's output only it reads (the ReLU's vjp
// then skips its mask), on the GPU in the product's epilogue or one pass after a library's, where
// that pays. The layer below then sums its bias gradient beside its weight product, off the chain.
// `masked` (if given) says whether dx came masked.
Tensor input_grad(const VjpContext& c, const Tensor& gp, bool* masked = nullptr) {
  const Tensor w = c.saved_input(1);
  if (masked) *masked = false;
  if (maskable(c, gp)) {
    const Tensor y = c.saved_input(0);
    if (Tensor ahead = linear_detail::take_ahead_input_grad(gp, w, y); ahead.defined()) {
      rt::log().debug("[fuse] linear's masked input gradient {} came with its loss's kernel", shape_str(y.shape()));
      c.masked_input_gradient(0);
      if (masked) *masked = true;
      return ahead;
    }
    if (mask_pays(gp, w, y)) {
      c.masked_input_gradient(0);
      if (masked) *masked = true;
      const Tensor in[] = {gp, w, y};
      return dispatch(kReluMaskedInputGrad, in)[0];
    }
  }
  return matmul(gp, w);
}

bool f32_grad_of(const VjpContext& c, int input, const Tensor& g) {
  return is_16bit(g.dtype()) && c.grad_dtype(input) == DType::f32;
}

// Where this is a narrow bf16 layer whose input gradient came masked (`below`: then the whole gp
// of the layer below, a linear layer with ReLU whose bias needs a gradient), the tensor for that
// layer's bias gradient in `grads`, which this layer's kernel then sums (linear_grad_wb_below): in
// a compiled step the grad sink that layer's vjp will find, else a new one. Eager and compiled
// steps make it alike, so they keep each other's bits. Undefined otherwise.
Tensor below_bias_grad(const VjpContext& c, const Tensor& gp, const Tensor& below, DType grads) {
  if (!below.defined() || !narrow_layer(gp)) return {};
  const Node* p = c.sole_producer(0);
  if (!p || p->op().name != "linear" || p->next_edges().size() < 3 || !p->next_edges()[2].requires_grad()) return {};
  const Shape shape{below.shape()[1]};
  Tensor db = c.producer_sink(0, 2);
  if (db.defined() && db.dtype() == grads && db.shape() == shape) return db;
  return empty(shape, {.dtype = grads, .device = gp.device()});
}

// dW and db together when a GPU epilogue can sum db, written into the parameters' .grad()
// buffers when the step offers them (grad sinks). `no_input_grad`: as grad_wb_split_gpu says.
// A bias gradient made ahead for gp (by the layer above, below_bias_grad) is taken: dW alone.
// `below`: this layer's masked input gradient, if it came so (below_bias_grad).
std::vector<Tensor> weight_and_bias_grads(const VjpContext& c, const Tensor& gp, const Tensor& x,
                                          bool no_input_grad = false, const Tensor& below = Tensor()) {
  const bool need_w = c.needs_grad(1), need_b = c.needs_grad(2);
  if (need_b && gp.device().is_cuda())
    if (Tensor db = linear_detail::take_ahead_bias_grad(gp); db.defined()) {
      rt::log().debug("[fuse] linear's bias gradient {} came with the layer above's weight gradients",
                      shape_str(db.shape()));
      std::vector<Tensor> r{Tensor(), std::move(db)};
      if (need_w) {
        const Tensor in[] = {gp, x}, into[] = {c.grad_sink(1)};
        const grad_stream::Allow beside(into[0].defined());
        r[0] = dispatch(kLinearGradW, in, f32_grads_attrs(f32_grad_of(c, 1, gp)), into)[0];
      }
      return r;
    }
  if (need_w && need_b && gp.device().is_cuda() && gp.dtype() != DType::f64) {
    const Tensor in[] = {gp, x}, into[] = {c.grad_sink(1), c.grad_sink(2)};
    const grad_stream::Allow beside(into[0].defined() && into[1].defined());
    const bool f32 = f32_grad_of(c, 1, gp) && f32_grad_of(c, 2, gp);
    Attrs attrs = f32_grads_attrs(f32);
    if (no_input_grad) attrs.set("no_input_grad", true);
    if (const Tensor db = below_bias_grad(c, gp, below, f32 ? DType::f32 : gp.dtype()); db.defined()) {
      const Tensor in3[] = {gp, x, below}, into3[] = {into[0], into[1], db};
      std::vector<Tensor> r = dispatch(kLinearGradWbBelow, in3, attrs, into3);
      rt::log().debug("[fuse] linear's weight gradients {} also sum the bias gradient of the layer below",
                      shape_str(r[0].shape()));
      linear_detail::offer_ahead_bias_grad(below, std::move(r[2]));
      r.resize(2);
      return r;
    }
    return dispatch(kLinearGradWb, in, attrs, into);
  }
  std::vector<Tensor> r(2);
  if (need_w) r[0] = matmul(transpose(gp, 0, 1), x);
  if (need_b) r[1] = sum(gp, {0}, false);
  return r;
}

}  // namespace

namespace linear_detail {

std::vector<Tensor> linear_vjp(const VjpContext& c, const Tensor& g, bool relu) {
  const Tensor x = c.saved_input(0);
  std::vector<Tensor> r(3);
  Tensor gp = g;
  // Masked by the layer reading y (input_grad): then a plain layer's, but for a first layer (no
  // input gradient) the bias gradient stays on the chain, as its mask's kernel summed it there.
  const bool masked = relu && c.gradient_masked(0);
  relu = relu && !masked;
  if (relu && c.needs_grad(2) && g.device().is_cuda()) {
    const Tensor in[] = {g, c.saved_output(0)}, into[] = {Tensor(), c.grad_sink(2)};
    std::vector<Tensor> masked = dispatch(kReluBackwardBiasGrad, in, f32_grads_attrs(f32_grad_of(c, 2, g)), into);
    gp = std::move(masked[0]);
    r[2] = std::move(masked[1]);
    // The weight gradient first: on a second stream (grad_stream) it then runs beside this
    // layer's input gradient, not after it.
    if (c.needs_grad(1)) {
      const Tensor w_in[] = {gp, x}, w_into[] = {c.grad_sink(1)};
      const grad_stream::Allow beside(w_into[0].defined());
      r[1] = dispatch(kLinearGradW, w_in, f32_grads_attrs(f32_grad_of(c, 1, gp)), w_into)[0];
    }
    if (c.needs_grad(0)) r[0] = input_grad(c, gp);
    return r;
  }
  if (relu) gp = relu_backward(g, c.saved_output(0));
  // A narrow layer's input gradient first: where it comes masked, the weight-gradient kernel also
  // sums it for the layer below's bias (below_bias_grad).
  bool dx_masked = false;
  if (c.needs_grad(0) && narrow_layer(gp)) r[0] = input_grad(c, gp, &dx_masked);
  std::vector<Tensor> wb = weight_and_bias_grads(c, gp, x, masked && !c.needs_grad(0), dx_masked ? r[0] : Tensor());
  r[1] = std::move(wb[0]);
  r[2] = std::move(wb[1]);
  if (c.needs_grad(0) && !r[0].defined()) r[0] = input_grad(c, gp);
  return r;
}

}  // namespace linear_detail

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

}  // namespace kiln
