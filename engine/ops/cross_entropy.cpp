// softmax_cross_entropy: cross_entropy for logits (N, C) as one registry op, so a GPU step
// pays one kernel forward and one backward (kernel_templates/softmax.cu) instead of the
// log_softmax + nll_loss + reduction composite. The CPU references below accumulate in
// double, separately from the kernels. Against the composite the result differs by rounding
// only (the fused op keeps f32, f64 for f64, until one final store, where the composite
// rounds every intermediate): tests allow 1e-13 relative in f64, 1e-6 in f32, 1e-3 in f16
// and 8e-3 in bf16 against the composite computed in f64.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/softmax_kernels.h"
#include "core/dtype_sets.h"
#include "core/step/step_state.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "linear_grads.h"
#include "loss_common.h"

namespace kiln {

namespace {

using namespace loss_detail;

// The kernels' accumulator, and the dtype of the saved stats: f64 for f64, else f32.
DType acc_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// Attrs: reduction ("none", "sum", "mean"; the kernels' 0, 1, 2), label_smoothing (double,
// default 0), ignore_index (optional) and f32_loss (bool, default false: f16 and bf16 logits
// give an f32 loss and take an f32 gradient of it, as if they had been cast to f32 first, with
// the same bits and no casts; f32 and f64 logits keep their dtype).
struct Params {
  int reduction = 2;
  double eps = 0;
  Ignore ignore;
  bool f32_loss = false;
  bool unit_grad = false;  // the forward also writes dlogits for a loss gradient of 1
};
// Where the gradient for a loss gradient of 1 is known in the forward: reduction sum, or mean
// over all rows (with ignore_index the mean's divisor is only known once every row is seen).
bool unit_grad_allowed(int reduction, bool has_ignore) { return reduction == 1 || (reduction == 2 && !has_ignore); }

Params params_of(const OpArgs& a) {
  Params p;
  const std::string r = a.attrs.get<std::string>("reduction");
  if (r == "none") p.reduction = 0;
  else if (r == "sum") p.reduction = 1;
  else if (r != "mean")
    throw ValueError("[" + a.op.name + "] reduction must be none, sum or mean; got " + r);
  p.eps = a.attrs.get_or<double>("label_smoothing", 0.0);
  if (!(p.eps >= 0.0 && p.eps < 1.0))
    throw ValueError("[" + a.op.name + "] label_smoothing must be in [0, 1); got " + std::to_string(p.eps));
  p.ignore = ignore_of(a.attrs);
  p.f32_loss = a.attrs.get_or<bool>("f32_loss", false);
  p.unit_grad = a.attrs.get_or<bool>("unit_grad", false);
  if (p.unit_grad && !unit_grad_allowed(p.reduction, p.ignore.on))
    throw ValueError("[" + a.op.name + "] unit_grad needs reduction sum, or mean with no ignore_index");
  return p;
}

// The loss's dtype for logits of dtype t.
DType loss_dtype(const Params& p, DType t) {
  return p.f32_loss && (t == DType::f16 || t == DType::bf16) ? DType::f32 : t;
}

// The CPU references for logits of storage type T, the loss (and its gradient) as L.
template <class F>
void visit_loss(DType logits, const Params& p, F&& f) {
  cpu::visit(logits, [&]<class T>() {
    if constexpr (std::is_floating_point_v<cpu::compute_t<T>>) {
      if (loss_dtype(p, logits) == DType::f32)
        f.template operator()<T, float>();
      else
        f.template operator()<T, T>();
    }
  });
}

// logits (N, C) and labels (N); returns C.
std::int64_t check_rows(const OpArgs& a, const Tensor& logits, const Tensor& labels) {
  if (logits.dim() != 2 || labels.shape() != Shape{logits.shape()[0]})
    throw ShapeError("[" + a.op.name + "] needs logits (N, C) and labels (N); got " + shape_str(logits.shape()) +
                     " and " + shape_str(labels.shape()));
  return logits.shape()[1];
}

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// One row's statistics in double: the max (NaN wins, as the kernels), log sum exp(x - m) and
// the sum of x.
struct RowStats {
  double m, log_s, sum;
};
template <class T>
RowStats row_stats(const T* x, std::int64_t stride, std::int64_t classes) {
  RowStats st{-std::numeric_limits<double>::infinity(), 0, 0};
  for (std::int64_t c = 0; c < classes; ++c) {
    const double v = cpu::load(x[c * stride]);
    if (std::isnan(v) || v > st.m) st.m = v;
  }
  double s = 0;
  for (std::int64_t c = 0; c < classes; ++c) {
    const double v = cpu::load(x[c * stride]);
    s += std::exp(v - st.m);
    st.sum += v;
  }
  st.log_s = std::log(s);
  return st;
}

// out[0]: the loss ((N) or ()); out[1]: stats (N + 1), each row's lse, then the count of
// rows not ignored; out[2]: with unit_grad, dlogits for a loss gradient of 1.
template <class T, class L>
void forward_cpu(const OpArgs& a, const Params& p, std::span<Tensor> out) {
  using A = acc_t<T>;
  const Tensor &x = a.inputs[0], &labels = a.inputs[1];
  const std::int64_t n = x.shape()[0], classes = x.shape()[1];
  const std::int64_t rs = x.strides()[0], cs = x.strides()[1], ls = labels.strides()[0];
  const T* px = cpu::ptr<const T>(x);
  const std::int64_t* pl = cpu::ptr<const std::int64_t>(labels);
  L* loss = cpu::ptr<L>(out[0]);
  A* stats = cpu::ptr<A>(out[1]);
  double total = 0, count = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    const T* row = px + r * rs;
    const RowStats st = row_stats(row, cs, classes);
    stats[r] = static_cast<A>(st.m + st.log_s);
    const std::int64_t y = pl[r * ls];
    double l = 0;
    if (!p.ignore.skips(y)) {
      if (y < 0 || y >= classes)
        throw ValueError("[" + a.op.name + "] label " + std::to_string(y) + " is out of range for " +
                         std::to_string(classes) + " classes");
      l = (st.m - cpu::load(row[y * cs])) + st.log_s;
      if (p.eps != 0) l = (1 - p.eps) * l + p.eps * ((st.m - st.sum / static_cast<double>(classes)) + st.log_s);
      count += 1;
    }
    if (p.reduction == 0) loss[r] = cpu::store<L>(l);
    total += l;
  }
  if (p.reduction == 1) loss[0] = cpu::store<L>(total);
  if (p.reduction == 2) loss[0] = cpu::store<L>(total / count);
  stats[n] = static_cast<A>(count);
  if (p.unit_grad)
    write_dx<T, A>(
        p, x, labels, out[1], [](std::int64_t) { return 1.0; }, cpu::ptr<T>(out[2]));
}

// dlogits (N, C) into dx from logits x, labels, stats (lse, then the count) and the loss's
// gradient of row r, g(r).
template <class T, class A, class G>
void write_dx(const Params& p, const Tensor& x, const Tensor& labels, const Tensor& stats, G&& g, T* dx) {
  const std::int64_t n = x.shape()[0], classes = x.shape()[1];
  const T* px = cpu::ptr<const T>(x);
  const std::int64_t* pl = cpu::ptr<const std::int64_t>(labels);
  const A* lse = cpu::ptr<const A>(stats);
  const double count = lse[n * stats.strides()[0]];
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t y = pl[r * labels.strides()[0]];
    const bool dead = p.ignore.skips(y) || y < 0 || y >= classes;
    const double gr = g(r);
    const double s = p.reduction == 2 ? gr / count : gr;
    const double l = lse[r * stats.strides()[0]];
    for (std::int64_t c = 0; c < classes; ++c) {
      const double target = p.eps / static_cast<double>(classes) + (c == y ? 1 - p.eps : 0.0);
      const double v = cpu::load(px[r * x.strides()[0] + c * x.strides()[1]]);
      dx[r * classes + c] = cpu::store<T>(dead ? 0.0 : s * (std::exp(v - l) - target));
    }
  }
}

// inputs: g (the loss's shape), logits, labels, stats (lse, count); out[0]: dlogits (N, C).
template <class T, class L>
void backward_cpu(const OpArgs& a, const Params& p, std::span<Tensor> out) {
  const Tensor& g = a.inputs[0];
  const L* pg = cpu::ptr<const L>(g);
  write_dx<T, acc_t<T>>(
      p, a.inputs[1], a.inputs[2], a.inputs[3],
      [&](std::int64_t r) { return cpu::load(pg[p.reduction == 0 ? r * g.strides()[0] : 0]); }, cpu::ptr<T>(out[0]));
}

// Attr sets for the registry-driven tests: every reduction, smoothing, ignore_index, f32_loss.
std::vector<Attrs> test_attrs() {
  std::vector<Attrs> sets;
  for (const char* r : {"none", "sum", "mean"}) {
    sets.push_back(Attrs{{"reduction", std::string(r)}});
    sets.push_back(Attrs{{"reduction", std::string(r)}, {"label_smoothing", 0.1}, {"ignore_index", std::int64_t{1}}});
    sets.push_back(Attrs{{"reduction", std::string(r)}, {"f32_loss", true}});
  }
  return sets;
}

std::vector<Attrs> forward_test_attrs() {
  std::vector<Attrs> sets = test_attrs();
  sets.push_back(Attrs{{"reduction", std::string("mean")}, {"unit_grad", true}});
  sets.push_back(Attrs{{"reduction", std::string("mean")}, {"label_smoothing", 0.1}, {"unit_grad", true}});
  sets.push_back(Attrs{{"reduction", std::string("sum")},
                       {"label_smoothing", 0.1},
                       {"ignore_index", std::int64_t{1}},
                       {"f32_loss", true},
                       {"unit_grad", true}});
  return sets;
}

const OpRef kCrossEntropyBackward = register_op({
    .name = "softmax_cross_entropy_backward",
    .num_inputs = 4,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          DTypePlan p = float_and_labels(a, 1, 2);
          p.inputs[0] = loss_dtype(params_of(a), p.key);
          p.inputs[3] = acc_of(p.key);
          return p;
        },
    .shape_rule =
        [](const OpArgs& a) {
          const Params p = params_of(a);
          check_rows(a, a.inputs[1], a.inputs[2]);
          const Shape rows{a.inputs[1].shape()[0]};
          const Shape g = p.reduction == 0 ? rows : Shape{};
          if (a.inputs[0].shape() != g || a.inputs[3].shape() != Shape{rows[0] + 1})
            throw ShapeError("[" + a.op.name + "] gradient " + shape_str(a.inputs[0].shape()) + " and stats " +
                             shape_str(a.inputs[3].shape()) + " do not fit logits " + shape_str(a.inputs[1].shape()));
          return std::vector<Shape>{a.inputs[1].shape()};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Params p = params_of(a);
          visit_loss(out[0].dtype(), p, [&]<class T, class L>() { backward_cpu<T, L>(a, p, out); });
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Params p = params_of(a);
          Tensor in[4];
          for (int i = 0; i < 4; ++i) in[i] = gpu::contiguous(a.inputs[static_cast<std::size_t>(i)]);
          kernels::launch_cross_entropy_backward(out[0].dtype(), in[0].dtype(), device_address(in[0]),
                                                 device_address(in[1]), device_address(in[2]), device_address(in[3]),
                                                 device_address(out[0]), in[1].shape()[0], in[1].shape()[1],
                                                 p.reduction, p.eps, p.ignore.index, p.ignore.on, stream_of(a.device));
        },
    // Labels, and stats of whole numbers in [1, 5) (the count at the end is one): no NaN/Inf
    // in the divisor, where CPU and GPU could round p - target to 0 differently.
    .test = {.attrs = test_attrs(),
             .gradcheck = false,
             .inputs = {{}, {}, {.dtype = DType::i64, .low = 0, .high = 5}, {.dtype = DType::i64, .low = 1, .high = 5}},
             .shapes = {{{4}, {4, 5}, {4}, {5}},
                        {{}, {4, 5}, {4}, {5}},
                        {{3}, {3, 1100}, {3}, {4}},
                        {{}, {3, 1100}, {3}, {4}}}},
});

// The logits' held product and this cross-entropy as one kernel, where the product runs the row
// kind over exactly these logits (the same bits as the two kernels). A product that ran already
// has its fused kernel loaded for the capture; one that does not fit runs now, alone; a capture
// whose eager call did not load the fused kernel runs them apart. False: the caller's kernel runs.
// With the gradient for a backward() of 1 (unit_dx) and a product over a ReLU's output of short
// rows, the kernel also writes that layer's masked input gradient, offered to its vjp
// (linear_detail::offer_ahead_input_grad): one kernel fewer on the backward's chain.
bool with_product(step::HeldProduct& held, const Tensor& x, kernels::RowCrossEntropy ce, const Tensor& unit_dx) {
  const auto* row = std::any_cast<kernels::RowProduct>(&held.fused);
  const bool fits = row && kernels::rowdot_cross_entropy_fits(row->launch) && row->launch.g.m == x.shape()[0] &&
                    row->launch.g.n == x.shape()[1] && row->operands.d == device_address(x);
  const int device = x.device().index();
  if (fits && held.ran) kernels::load_rowdot_cross_entropy(row->launch, ce.loss, device);
  if (!fits || held.ran || (step::capturing() && !kernels::rowdot_cross_entropy_loaded(row->launch, ce.loss, device))) {
    held.run();
    return false;
  }
  rt::log().debug("[fuse] linear's row product and softmax_cross_entropy over {} run as one kernel",
                  shape_str(x.shape()));
  Tensor masked_dx;
  if (unit_dx.defined() && kernels::rowdot_masked_dx_in_one_slice(row->launch) &&
      linear_detail::row_input_grad_serves(x.dtype()) && linear_detail::relu_made_input(x, 0)) {
    masked_dx = empty({row->launch.g.m, row->launch.g.k}, {.dtype = x.dtype(), .device = x.device()});
    ce.masked_dx = device_address(masked_dx);
  }
  kernels::launch_rowdot_cross_entropy(row->launch, row->operands, ce);
  if (masked_dx.defined())
    linear_detail::offer_ahead_input_grad(unit_dx, row->operands.b, row->operands.a, std::move(masked_dx));
  return true;
}

const OpRef kCrossEntropy = register_op({
    .name = "softmax_cross_entropy",
    .num_inputs = 2,
    .num_outputs = 3,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          DTypePlan p = float_and_labels(a, 0, 1);
          p.outputs = {loss_dtype(params_of(a), p.key), acc_of(p.key), p.key};
          return p;
        },
    // Outputs: the loss, stats (each row's lse, then the count) and, with unit_grad, dlogits
    // for a loss gradient of 1 (else empty), which the backward of loss.backward() hands on.
    .shape_rule =
        [](const OpArgs& a) {
          const Params p = params_of(a);
          check_rows(a, a.inputs[0], a.inputs[1]);
          const Shape rows{a.inputs[0].shape()[0]};
          return std::vector<Shape>{p.reduction == 0 ? rows : Shape{}, Shape{rows[0] + 1},
                                    p.unit_grad ? a.inputs[0].shape() : Shape{0}};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Params p = params_of(a);
          visit_loss(a.inputs[0].dtype(), p, [&]<class T, class L>() { forward_cpu<T, L>(a, p, out); });
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Params p = params_of(a);
          // First, before any address is taken: the logits' product, where it was held for this op.
          std::optional<step::HeldProduct> held = step::take_held(a.inputs[0]);
          const Tensor x = gpu::contiguous(a.inputs[0]), labels = gpu::contiguous(a.inputs[1]);
          const std::int64_t n = x.shape()[0];
          // Row losses wait here for the last block's ordered sum; none writes them to out[0].
          const Tensor rows = p.reduction == 0 ? Tensor() : empty({n}, {.dtype = out[1].dtype(), .device = a.device});
          const kernels::RowCrossEntropy ce{out[0].dtype(),
                                            device_address(labels),
                                            device_address(out[0]),
                                            rows.defined() ? device_address(rows) : 0,
                                            device_address(out[1]),
                                            p.unit_grad ? device_address(out[2]) : 0,
                                            p.reduction,
                                            p.eps,
                                            p.ignore.index,
                                            p.ignore.on};
          // x, not a contiguous copy: the masked input gradient asks what made it.
          if (held && with_product(*held, a.inputs[0], ce, p.unit_grad ? out[2] : Tensor())) return;
          kernels::launch_cross_entropy(x.dtype(), ce.loss, device_address(x), ce.labels, ce.out, ce.rows, ce.stats,
                                        ce.unit_dx, n, x.shape()[1], p.reduction, p.eps, p.ignore.index, p.ignore.on,
                                        stream_of(a.device));
        },
    // Only the loss carries a gradient: stats is state saved for the backward. A gradient of 1
    // from backward() itself takes the forward's dlogits: no kernel.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      if (c.unit_gradient(0) && c.attrs().get_or<bool>("unit_grad", false)) return {c.saved_output(2), Tensor()};
      return {call(kCrossEntropyBackward, {g[0], c.saved_input(0), c.saved_input(1), c.saved_output(1)}, c.attrs()),
              Tensor()};
    },
    .differentiable_outputs = 1,
    .save = {.inputs = {0, 1}, .outputs = {1, 2}},
    // gradcheck_op feeds f64 labels, which the dtype rule refuses: tests/engine/
    // test_nn_functional.cpp checks the gradients by hand.
    .test = {.attrs = forward_test_attrs(),
             .low = -4,
             .high = 4,
             .gradcheck = false,
             .inputs = {{}, {.dtype = DType::i64, .low = 0, .high = 5}},
             .shapes = {{{4, 5}, {4}}, {{1, 10}, {1}}, {{3, 1100}, {3}}}},
});

}  // namespace

namespace loss_detail {

Tensor fused_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction, double label_smoothing,
                           std::optional<std::int64_t> ignore_index, bool f32_loss) {
  Attrs attrs{{"reduction", std::string(reduction == Reduction::none  ? "none"
                                        : reduction == Reduction::sum ? "sum"
                                                                      : "mean")},
              {"label_smoothing", label_smoothing}};
  if (ignore_index) attrs.set("ignore_index", *ignore_index);
  if (f32_loss) attrs.set("f32_loss", true);
  // Training: the forward writes the gradient for loss.backward()'s implicit 1 as well, so that
  // backward needs no kernel (another gradient takes the backward kernel as before).
  const int r = reduction == Reduction::none ? 0 : reduction == Reduction::sum ? 1 : 2;
  if (grad_enabled() && logits.requires_grad() && unit_grad_allowed(r, ignore_index.has_value()))
    attrs.set("unit_grad", true);
  const Tensor inputs[] = {logits, labels};
  return dispatch(kCrossEntropy, inputs, attrs)[0];
}

}  // namespace loss_detail

}  // namespace kiln
