// conv2d on NCHW and its two backward ops (conv2d_grad_input, conv2d_grad_weight).
// GPU: kernels generated per shape (backend/cuda/generated/conv) for bf16, f16, TF32 and
// exact f32; otherwise im2col (kernel_templates/im2col.cu) + a cuBLAS GEMM per group, the
// backward ops GEMMs + col2im. CPU: im2col + OpenBLAS (conv_cpu.h) for f32 and f64; the
// reference (.cpu_reference, and f16/bf16) is direct nested loops, independent of all three.
#include "kiln/conv.h"

#include <atomic>
#include <memory>
#include <optional>

#include "backend/cuda/gemm.h"
#include "backend/cuda/generated/conv/conv_run.h"
#include "backend/cuda/grad_stream.h"
#include "backend/cuda/split_sums.h"
#include "bn_pool_sums.h"
#include "conv_common.h"
#include "conv_cpu.h"
#include "conv_totals.h"
#include "core/cpu/gemm_cpu.h"
#include "core/dtype_sets.h"
#include "core/registry.h"
#include "core/step/step_state.h"
#include "core/tensor/copy.h"
#include "core/tensor/tensor_impl.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "kiln/shape_ops.h"

namespace kiln {

namespace {

using namespace conv_detail;

using kernels::ConvGeometry;

Shape out_shape(const ConvGeometry& g) { return {g.n, g.o, g.oh, g.ow}; }

ConvGeometry geometry(const Shape& x, const Shape& w, const Attrs& attrs, const std::string& op) {
  if (x.size() != 4) throw ShapeError("[" + op + "] input must be 4-D (N, C, H, W), got shape " + paren(x));
  if (w.size() != 4) throw ShapeError("[" + op + "] weight must be 4-D (O, C/groups, kh, kw), got shape " + paren(w));
  const auto st = pair_attr(attrs, "stride", 1, 1, op);
  const auto pad = pair_attr(attrs, "padding", 0, 0, op);
  const auto dil = pair_attr(attrs, "dilation", 1, 1, op);
  const std::int64_t groups = attrs.get_or<std::int64_t>("groups", 1);
  if (groups < 1) throw ValueError("[" + op + "] groups must be >= 1, got " + std::to_string(groups));
  ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0, st[0], st[1], pad[0], pad[1], dil[0], dil[1], groups};
  if (g.c % groups != 0)
    throw ShapeError("[" + op + "] input channels " + std::to_string(g.c) + " of input " + paren(x) +
                     " are not divisible by groups = " + std::to_string(groups));
  if (g.o % groups != 0)
    throw ShapeError("[" + op + "] output channels " + std::to_string(g.o) + " of weight " + paren(w) +
                     " are not divisible by groups = " + std::to_string(groups));
  if (w[1] != g.cg())
    throw ShapeError("[" + op + "] weight " + paren(w) + " needs C/groups = " + std::to_string(g.cg()) +
                     " in dim 1 for input " + paren(x) + " with groups = " + std::to_string(groups));
  const std::int64_t ekh = g.dh * (g.kh - 1) + 1, ekw = g.dw * (g.kw - 1) + 1;
  if (g.kh < 1 || g.kw < 1 || ekh > g.h + 2 * g.ph || ekw > g.w + 2 * g.pw)
    throw ShapeError("[" + op + "] kernel " + paren({g.kh, g.kw}) + " with dilation " + paren({g.dh, g.dw}) +
                     " spans " + paren({ekh, ekw}) + ", larger than the padded input " +
                     paren({g.h + 2 * g.ph, g.w + 2 * g.pw}));
  g.oh = (g.h + 2 * g.ph - ekh) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - ekw) / g.sw + 1;
  return g;
}

Shape shape_attr(const Attrs& a, const char* name) { return a.get<std::vector<std::int64_t>>(name); }

// Calls f(out_index, x_index, w_index) for every product term of the convolution, with
// contiguous NCHW / OIHW indices; the three CPU references are this one loop nest.
template <class F>
void for_each_term(const ConvGeometry& g, F&& f) {
  const std::int64_t cg = g.cg(), og = g.og();
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t o = 0; o < g.o; ++o) {
      const std::int64_t c0 = (o / og) * cg;
      for (std::int64_t oy = 0; oy < g.oh; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const std::int64_t oi = ((n * g.o + o) * g.oh + oy) * g.ow + ox;
          for (std::int64_t c = 0; c < cg; ++c)
            for (std::int64_t ki = 0; ki < g.kh; ++ki) {
              const std::int64_t iy = oy * g.sh - g.ph + ki * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (std::int64_t kj = 0; kj < g.kw; ++kj) {
                const std::int64_t ix = ox * g.sw - g.pw + kj * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                f(oi, ((n * g.c + c0 + c) * g.h + iy) * g.w + ix, ((o * cg + c) * g.kh + ki) * g.kw + kj);
              }
            }
        }
    }
}

// which: 0 forward (x, w) -> y; 1 grad input (g, w) -> dx; 2 grad weight (x, g) -> dw.
void conv_cpu(const ConvGeometry& geo, int which, const Tensor& in0, const Tensor& in1, const Tensor& out) {
  cpu::visit(out.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<cpu::compute_t<T>>) {
      auto a = load_dense<T>(in0), b = load_dense<T>(in1);
      // Sums in f64: the weight gradient adds N*OH*OW terms, too many for an f32 reference.
      std::vector<double> r(static_cast<std::size_t>(out.numel()), 0);
      auto mul = [](auto u, auto v) { return static_cast<double>(u) * static_cast<double>(v); };
      if (which == 0) for_each_term(geo, [&](auto oi, auto xi, auto wi) { r[oi] += mul(a[xi], b[wi]); });
      if (which == 1) for_each_term(geo, [&](auto oi, auto xi, auto wi) { r[xi] += mul(a[oi], b[wi]); });
      if (which == 2) for_each_term(geo, [&](auto oi, auto xi, auto wi) { r[wi] += mul(b[oi], a[xi]); });
      T* po = cpu::ptr<T>(out);
      for (std::size_t i = 0; i < r.size(); ++i) po[i] = cpu::store<T>(r[i]);
    }
  });
}

// ---- GPU: cols is (C*kh*kw, nb*L), L = oh*ow, for a chunk of nb samples.

struct ConvParams {
  long long n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};

ConvParams params(const ConvGeometry& g, std::int64_t nb) {
  return {nb, g.c, g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw};
}

std::int64_t chunk_samples(const ConvGeometry& g) {
  constexpr std::int64_t kWorkspace = std::int64_t{1} << 26;  // elements of cols per chunk
  const std::int64_t per = std::max<std::int64_t>(g.c * g.kh * g.kw * g.oh * g.ow, 1);
  return std::clamp<std::int64_t>(kWorkspace / per, 1, std::max<std::int64_t>(g.n, 1));
}

void launch(const gpu::LazyKernel& k, DType t, std::int64_t items, rt::DevicePtr in, rt::DevicePtr out,
            const ConvParams& p, const rt::Stream& s) {
  if (items == 0) return;
  const rt::Function f = rt::get_function(k.get(), DTypes{t}, 0, s.device());
  rt::launch(f, kernels::grid_stride_config(static_cast<std::uint64_t>(items), s.device()), s, in, out, p);
}

void gemm(DType t, const kernels::GemmShape& sh, const kernels::GemmOperand& a, const kernels::GemmOperand& b,
          double beta, const kernels::GemmOperand& c, const rt::Stream& s) {
  if (!kernels::gemm(t, sh, 1.0, a, b, beta, c, s)) throw Error("[conv2d] cuBLAS refused a GEMM layout");
}

const gpu::LazyKernel kIm2col("im2col"), kCol2im("col2im");

rt::DevicePtr at(const Tensor& t, std::int64_t elements) {
  return device_address(t) + static_cast<std::uint64_t>(elements) * t.element_size();
}

// The pass's operands on out's stream; a and b contiguous. An f32 `out` of 16-bit operands: a
// weight gradient summed into f32.
kernels::ConvOperands operands(const Tensor& a, const Tensor& b, const Tensor& out) {
  return {device_address(a), device_address(b),        device_address(out),
          a.dtype(),         &stream_of(out.device()), out.dtype() != a.dtype()};
}

// The three passes' geometry from an op's arguments; which as in conv_cpu.
ConvGeometry pass_geometry(const OpArgs& a, const Tensor& out, int which) {
  if (which == 0) return geometry(a.inputs[0].shape(), a.inputs[1].shape(), a.attrs, a.name());
  if (which == 1) return geometry(out.shape(), a.inputs[1].shape(), a.attrs, a.name());
  return geometry(a.inputs[0].shape(), out.shape(), a.attrs, a.name());
}

// A pass's .cpu (the fast path where run_conv_cpu takes the dtype) or .cpu_reference. An f32
// weight gradient of 16-bit operands reads them widened (exactly) to f32.
Impl cpu_impl(int which, bool reference) {
  return [which, reference](const OpArgs& a, std::span<Tensor> out) {
    const ConvGeometry g = pass_geometry(a, out[0], which);
    const bool widen = a.inputs[0].dtype() != out[0].dtype();
    const Tensor x = widen ? convert(a.inputs[0], out[0].dtype()) : a.inputs[0];
    const Tensor y = widen ? convert(a.inputs[1], out[0].dtype()) : a.inputs[1];
    if (reference || !run_conv_cpu(static_cast<ConvPass>(which), g, x, y, out[0])) conv_cpu(g, which, x, y, out[0]);
  };
}

// The scopes under which the tile engine keeps a forward's NHWC copy of x for the weight
// gradient and its flipped reorder of w for the input gradient, which take them (a staging
// kernel fewer in each backward pass).
void for_backward(std::optional<kernels::ConvForBackward>& scope, kernels::ConvStaged what, const Tensor& t) {
  scope.emplace(what, reinterpret_cast<rt::DevicePtr>(t.data_ptr()), std::weak_ptr<const void>(t.impl()->storage),
                t.version());
}

void conv_forward_gpu(const ConvGeometry& g, const Tensor& x_in, const Tensor& w_in, const Tensor& y) {
  const Tensor x = gpu::contiguous(x_in), w = gpu::contiguous(w_in);
  // Only where the backward will read them: x for w's gradient, w for x's.
  std::optional<kernels::ConvForBackward> keep_x, keep_w;
  if (grad_enabled() && w_in.requires_grad()) for_backward(keep_x, kernels::ConvStaged::images, x);
  if (grad_enabled() && x_in.requires_grad()) for_backward(keep_w, kernels::ConvStaged::weights, w);
  // Under a ConvStatsForBatchNorm, y's channel sums for the batch norm that reads it next: f64
  // totals, or the blocks' f32 partials (2 * o, rows) for it to add up.
  kernels::ConvOperands ops = operands(x, w, y);
  Tensor totals, parts;
  std::int64_t rows = 0;
  if (conv_totals::wanted())
    if (const std::int64_t floats = kernels::generated_conv_stats_floats(g, ops, allow_conv_tf32()); floats > 0) {
      totals = empty({2, g.o}, {.dtype = DType::f64, .device = y.device()});
      parts = empty({floats}, {.dtype = DType::f32, .device = y.device()});
      ops.totals = device_address(totals), ops.stats = device_address(parts), ops.stats_rows = &rows;
    }
  const kernels::ConvRan ran = kernels::run_generated_conv(ConvPass::forward, g, ops, allow_conv_tf32());
  if (ran == kernels::ConvRan::with_totals)
    conv_totals::keep(y, rows > 0 ? narrow(parts, 0, 0, 2 * g.o * rows).view({2 * g.o, rows}) : std::move(totals));
  if (ran != kernels::ConvRan::no) return;
  const DType t = y.dtype();
  const rt::Stream& s = stream_of(y.device());
  const std::int64_t L = g.oh * g.ow, gk = g.cg() * g.kh * g.kw, nb = chunk_samples(g);
  Tensor cols = empty({g.c * g.kh * g.kw, nb * L}, {.dtype = t, .device = y.device()});
  for (std::int64_t n0 = 0; n0 < g.n; n0 += nb) {
    const std::int64_t b = std::min(nb, g.n - n0);
    launch(kIm2col, t, g.c * g.kh * g.kw * b * L, at(x, n0 * g.c * g.h * g.w), device_address(cols), params(g, b), s);
    // y[n, group] (og, L) = w_group (og, gk) @ cols_group[:, n] (gk, L), batched over n.
    for (std::int64_t grp = 0; grp < g.groups; ++grp)
      gemm(t, {b, g.og(), L, gk}, {at(w, grp * g.og() * gk), 0, gk, 1}, {at(cols, grp * gk * b * L), L, b * L, 1}, 0,
           {at(y, (n0 * g.o + grp * g.og()) * L), g.o * L, L, 1}, s);
  }
}

// The pooled batch norm whose whole gradient dx is (bn_pool_sums::ForGradient), as the kernels
// read it: contiguous, its statistics in f32; none otherwise.
std::optional<kernels::ConvPoolSums> pool_sums_for(const Tensor& dx) {
  const bn_pool_sums::Consumer* c = bn_pool_sums::wanted(dx);
  if (!c) return std::nullopt;
  const Tensor& p = c->weight.defined() ? c->weight : c->bias;
  const bool readable = c->x.is_contiguous() && c->mean.dtype() == DType::f32 && c->invstd.dtype() == DType::f32 &&
                        c->mean.is_contiguous() && c->invstd.is_contiguous() &&
                        (!c->weight.defined() || c->weight.is_contiguous()) &&
                        (!c->bias.defined() || (c->bias.is_contiguous() && c->bias.dtype() == p.dtype()));
  if (!readable) return std::nullopt;
  return kernels::ConvPoolSums{.x = device_address(c->x),
                               .weight = c->weight.defined() ? device_address(c->weight) : 0,
                               .bias = c->bias.defined() ? device_address(c->bias) : 0,
                               .mean = device_address(c->mean),
                               .invstd = device_address(c->invstd),
                               .p = p.defined() ? p.dtype() : DType::f32,
                               .h = c->x.shape()[2],
                               .w = c->x.shape()[3],
                               .relu = c->relu};
}

void conv_grad_input_gpu(const ConvGeometry& g, const Tensor& gy_in, const Tensor& w_in, const Tensor& dx) {
  const Tensor gy = gpu::contiguous(gy_in), w = gpu::contiguous(w_in);
  std::optional<kernels::ConvForBackward> forward_copy;
  for_backward(forward_copy, kernels::ConvStaged::weights, w);
  // Where dx is a pooled batch norm's whole gradient, its backward's sums parked beside it.
  kernels::ConvOperands ops = operands(gy, w, dx);
  std::optional<kernels::ConvPoolSums> pool = pool_sums_for(dx);
  Tensor parts;
  std::int64_t splits = 0;
  if (pool) {
    ops.pool_sums = &*pool;
    if (const std::int64_t floats = kernels::generated_conv_pool_sums_floats(g, ops, allow_conv_tf32()); floats > 0) {
      parts = empty({floats}, {.dtype = DType::f32, .device = dx.device()});
      pool->parts = device_address(parts), pool->splits = &splits;
    }
  }
  const kernels::ConvRan ran = kernels::run_generated_conv(ConvPass::grad_input, g, ops, allow_conv_tf32());
  if (ran == kernels::ConvRan::with_pool_sums)
    bn_pool_sums::keep(dx, narrow(parts, 0, 0, 2 * g.c * splits).view({2 * g.c, splits}));
  if (ran != kernels::ConvRan::no) return;
  const DType t = dx.dtype();
  const rt::Stream& s = stream_of(dx.device());
  const std::int64_t L = g.oh * g.ow, gk = g.cg() * g.kh * g.kw, nb = chunk_samples(g);
  Tensor cols = empty({g.c * g.kh * g.kw, nb * L}, {.dtype = t, .device = dx.device()});
  for (std::int64_t n0 = 0; n0 < g.n; n0 += nb) {
    const std::int64_t b = std::min(nb, g.n - n0);
    // cols_group[:, n] (gk, L) = w_group^T (gk, og) @ gy[n, group] (og, L); w^T is a strided view.
    for (std::int64_t grp = 0; grp < g.groups; ++grp)
      gemm(t, {b, gk, L, g.og()}, {at(w, grp * g.og() * gk), 0, 1, gk},
           {at(gy, (n0 * g.o + grp * g.og()) * L), g.o * L, L, 1}, 0, {at(cols, grp * gk * b * L), L, b * L, 1}, s);
    launch(kCol2im, t, b * g.c * g.h * g.w, device_address(cols), at(dx, n0 * g.c * g.h * g.w), params(g, b), s);
  }
}

void conv_grad_weight_gpu(const ConvGeometry& g, const Tensor& x_in, const Tensor& gy_in, const Tensor& dw) {
  const Tensor x = gpu::contiguous(x_in), gy = gpu::contiguous(gy_in);
  std::optional<kernels::ConvForBackward> forward_copy;
  for_backward(forward_copy, kernels::ConvStaged::images, x);
  // Into .grad() (grad_stream::Allow): beside the backward's chain; the fallback below stays on
  // the device's stream.
  kernels::ConvOperands ops = operands(x, gy, dw);
  const rt::Stream& main = *ops.stream;
  ops.stream = &grad_stream::fork(main, {x, gy, dw});
  // Inside a compiled step, a kind whose last kernel sums a split's rows leaves that kernel held
  // until the gradient is used: an optimizer step makes the sums in its update.
  std::optional<kernels::DeferredSums> sums;
  bool ran = false;
  {
    const kernels::DeferSplitSums defer(step::fusing() ? &sums : nullptr);
    ran = kernels::run_generated_conv(ConvPass::grad_weight, g, ops, allow_conv_tf32()) != kernels::ConvRan::no;
  }
  if (ran && sums) {
    // While the backward's side work is pending the reduce runs where the rows were written;
    // after its join, on the device's stream, which has waited for them (as has any stream that
    // forks from it later, so the workspace freed on the second stream is safe to reuse there).
    const rt::Stream* side = ops.stream;
    auto run = [reduce = std::move(sums->run), side, &main] {
      reduce(grad_stream::beside(side->handle(), main.handle()) ? *side : main);
    };
    if (!step::hold_sums({.output = dw, .run = run, .fused = sums->sums})) run();
  }
  if (ran) return;
  // No kernel sums these 16-bit operands into f32: widened to f32 (exactly, and exact in TF32
  // too), the f32 path sums the same products.
  if (dw.dtype() != x.dtype()) return conv_grad_weight_gpu(g, convert(x, dw.dtype()), convert(gy, dw.dtype()), dw);
  const DType t = dw.dtype();
  const rt::Stream& s = stream_of(dw.device());
  const std::int64_t L = g.oh * g.ow, gk = g.cg() * g.kh * g.kw, nb = chunk_samples(g);
  TensorOptions opts{.dtype = t, .device = dw.device()};
  Tensor cols = empty({g.c * g.kh * g.kw, nb * L}, opts);
  Tensor gt = empty({g.o, nb * L}, opts);
  if (g.n == 0) kernels::launch_fill(t, gpu::operand(dw), dw.shape(), kernels::Scalar(0), s);
  for (std::int64_t n0 = 0; n0 < g.n; n0 += nb) {
    const std::int64_t b = std::min(nb, g.n - n0);
    launch(kIm2col, t, g.c * g.kh * g.kw * b * L, at(x, n0 * g.c * g.h * g.w), device_address(cols), params(g, b), s);
    // gy[n0:n0+b] (b, O, L) -> gt (O, b*L), so one GEMM per group sums over samples and positions.
    gpu::copy(make_view(gy, {g.o, b, L}, {L, g.o * L, 1}, gy.offset() + n0 * g.o * L),
              make_view(gt, {g.o, b, L}, {b * L, L, 1}, gt.offset()));
    for (std::int64_t grp = 0; grp < g.groups; ++grp)
      gemm(t, {1, g.og(), gk, b * L}, {at(gt, grp * g.og() * b * L), 0, b * L, 1},
           {at(cols, grp * gk * b * L), 0, 1, b * L}, n0 == 0 ? 0.0 : 1.0, {at(dw, grp * g.og() * gk), 0, gk, 1}, s);
  }
}

Attrs with_shape(const Attrs& attrs, const char* name, const Shape& shape) {
  Attrs a = attrs;
  a.set(name, std::vector<std::int64_t>(shape.begin(), shape.end()));
  return a;
}

const OpRef kGradInput = register_op({
    .name = "conv2d_grad_input",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .shape_rule =
        [](const OpArgs& a) {
          const Shape xs = shape_attr(a.attrs, "input_shape");
          const ConvGeometry g = geometry(xs, a.inputs[1].shape(), a.attrs, a.name());
          if (a.inputs[0].shape() != out_shape(g))
            throw ShapeError("[" + a.name() + "] gradient of shape " + paren(a.inputs[0].shape()) + " does not match " +
                             "the output " + paren(out_shape(g)) + " of input " + paren(xs));
          return std::vector<Shape>{xs};
        },
    .cpu = cpu_impl(1, false),
    .cpu_reference = cpu_impl(1, true),
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          conv_grad_input_gpu(geometry(out[0].shape(), a.inputs[1].shape(), a.attrs, a.name()), a.inputs[0],
                              a.inputs[1], out[0]);
        },
    .test = {.attrs = {Attrs{{"input_shape", std::vector<std::int64_t>{2, 2, 4, 4}}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .tf32 = true,
             .specials_input = 0,
             .shapes = {{{2, 3, 3, 3}, {3, 2, 2, 2}}}},
});

// Inputs promoted; with attr `f32_grad` (a bool), f16/bf16 inputs give an f32 gradient: the
// products' f32 sums, not rounded to the inputs' dtype (autocast's parameters).
DTypePlan grad_weight_dtypes(const OpArgs& a) {
  DTypePlan p = rules::promote(a);
  if (a.attrs.get_or("f32_grad", false) && (p.key == DType::f16 || p.key == DType::bf16)) p.outputs = {DType::f32};
  return p;
}

const OpRef kGradWeight = register_op({
    .name = "conv2d_grad_weight",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule = grad_weight_dtypes,
    .shape_rule =
        [](const OpArgs& a) {
          const Shape ws = shape_attr(a.attrs, "weight_shape");
          const ConvGeometry g = geometry(a.inputs[0].shape(), ws, a.attrs, a.name());
          if (a.inputs[1].shape() != out_shape(g))
            throw ShapeError("[" + a.name() + "] gradient of shape " + paren(a.inputs[1].shape()) + " does not match " +
                             "the output " + paren(out_shape(g)) + " of weight " + paren(ws));
          return std::vector<Shape>{ws};
        },
    .cpu = cpu_impl(2, false),
    .cpu_reference = cpu_impl(2, true),
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          conv_grad_weight_gpu(geometry(a.inputs[0].shape(), out[0].shape(), a.attrs, a.name()), a.inputs[0],
                               a.inputs[1], out[0]);
        },
    .test = {.attrs = {Attrs{{"weight_shape", std::vector<std::int64_t>{3, 2, 2, 2}}},
                       Attrs{{"weight_shape", std::vector<std::int64_t>{3, 2, 2, 2}}, {"f32_grad", true}}},
             .gradcheck = false,
             .tolerance_scale = 4,
             .tf32 = true,
             .specials_input = 0,
             .shapes = {{{2, 2, 4, 4}, {2, 3, 3, 3}}}},
});

const OpRef kConv2d = register_op({
    .name = "conv2d",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .shape_rule =
        [](const OpArgs& a) {
          return std::vector<Shape>{out_shape(geometry(a.inputs[0].shape(), a.inputs[1].shape(), a.attrs, a.name()))};
        },
    .cpu = cpu_impl(0, false),
    .cpu_reference = cpu_impl(0, true),
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          conv_forward_gpu(geometry(a.inputs[0].shape(), a.inputs[1].shape(), a.attrs, a.name()), a.inputs[0],
                           a.inputs[1], out[0]);
        },
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      std::vector<Tensor> r(2);
      // Both passes read gy and write elsewhere: the input gradient's NHWC copy of gy serves the
      // weight gradient too.
      const kernels::ConvStagingReuse reuse;
      if (c.needs_grad(0)) {
        // Where x's gradient is all a pooled batch norm's backward reads, its sums too.
        std::optional<bn_pool_sums::ForGradient> pooled;
        if (bn_pool_sums::enabled())
          if (auto consumer = bn_pool_sums::consumer_of(c.sole_producer(0))) pooled.emplace(std::move(*consumer));
        r[0] = call(kGradInput, {g[0], c.saved_input(1)}, with_shape(c.attrs(), "input_shape", c.input(0).shape));
      }
      if (c.needs_grad(1)) {
        // A parameter's 16-bit copy (autocast) takes its gradient in f32, into .grad() when offered.
        Attrs a = with_shape(c.attrs(), "weight_shape", c.input(1).shape);
        const Tensor x = c.saved_input(0);
        // Only where a kernel sums them into f32: elsewhere widening the operands costs more
        // than the cast it spares.
        if (c.grad_dtype(1) == DType::f32 && x.dtype() != DType::f32 && x.device().is_cuda() &&
            kernels::generated_conv_sums_f32(geometry(x.shape(), c.input(1).shape, c.attrs(), c.name()), x.dtype(),
                                             x.device().index()))
          a.set("f32_grad", true);
        const Tensor in[] = {c.saved_input(0), g[0]}, into[] = {c.grad_sink(1)};
        const grad_stream::Allow beside(into[0].defined());
        r[1] = dispatch(kGradWeight, in, a, into)[0];
      }
      return r;
    },
    .save = {.inputs = {0, 1}},
    .test = {.attrs = {Attrs{},
                       Attrs{{"stride", std::vector<std::int64_t>{2}}, {"padding", std::vector<std::int64_t>{1}}},
                       Attrs{{"dilation", std::vector<std::int64_t>{2}}, {"padding", std::vector<std::int64_t>{1, 2}}},
                       Attrs{{"groups", std::int64_t{2}}}},
             .tolerance_scale = 4,
             .tf32 = true,
             .specials_input = 0},
});

}  // namespace

namespace {
std::atomic<bool> g_conv_tf32{true};
Attrs conv_attrs(const Conv2dOptions& o) {
  return Attrs{{"stride", o.stride}, {"padding", o.padding}, {"dilation", o.dilation}, {"groups", o.groups}};
}
}  // namespace

void set_allow_conv_tf32(bool allow) { g_conv_tf32 = allow; }
bool allow_conv_tf32() { return g_conv_tf32; }

Tensor conv2d_grad_input(const Tensor& gy, const Tensor& w, const Shape& input_shape, const Conv2dOptions& o) {
  return call(kGradInput, {gy, w}, with_shape(conv_attrs(o), "input_shape", input_shape));
}

Tensor conv2d_grad_weight(const Tensor& x, const Tensor& gy, const Shape& weight_shape, const Conv2dOptions& o) {
  return call(kGradWeight, {x, gy}, with_shape(conv_attrs(o), "weight_shape", weight_shape));
}

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in, const Conv2dOptions& o) {
  const Tensor x = autocast_lower(x_in), w = autocast_lower(w_in), bias = autocast_lower(bias_in);
  Tensor y = call(kConv2d, {x, w}, conv_attrs(o));
  if (!bias.defined()) return y;
  if (bias.shape() != Shape{w.shape()[0]})
    throw ShapeError("[conv2d] bias must have shape (" + std::to_string(w.shape()[0]) + ") for weight " +
                     paren(w.shape()) + ", got " + paren(bias.shape()));
  return add(y, reshape(bias, {1, w.shape()[0], 1, 1}));
}

}  // namespace kiln
