// Adam and AdamW: the fused kernel on the GPU, a plain loop on the CPU, threaded over chunks
// (the reference the GPU tests compare with). Bias corrections are computed here in double.
#include <cmath>
#include <limits>

#include "backend/cuda/split_sums.h"
#include "core/cpu/loops.h"
#include "core/cpu/parallel.h"
#include "core/registry.h"
#include "kiln/optim/optimizer.h"
#include "optim_common.h"

namespace kiln::optim {

namespace {

using detail::kInf;

std::vector<Tensor> checked(const char* who, std::vector<Tensor> params, const AdamOptions& o) {
  detail::check_range(who, "lr", o.lr, 0, false, kInf, false);
  detail::check_range(who, "beta1", o.beta1, 0, false, 1, true);
  detail::check_range(who, "beta2", o.beta2, 0, false, 1, true);
  detail::check_range(who, "eps", o.eps, 0, true, kInf, false);
  detail::check_range(who, "weight_decay", o.weight_decay, 0, false, kInf, false);
  detail::check_params(who, params);
  return params;
}

struct AdamScalars {
  double lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  bool decoupled;
};

// Adam's update of elements [0, n) in the compute type S; kDecay: 0 none, 1 added to the
// gradient (Adam), 2 decoupled (AdamW). Restrict pointers of their own, so the loop vectorizes.
template <int kDecay, class T, class S>
void adam_chunk(T* __restrict p, const T* __restrict g, S* __restrict m, S* __restrict v, std::int64_t n,
                const AdamScalars& a) {
  const S b1 = static_cast<S>(a.beta1), b2 = static_cast<S>(a.beta2);
  const S one_minus_b1 = static_cast<S>(1.0 - a.beta1), one_minus_b2 = static_cast<S>(1.0 - a.beta2);
  const S step_size = static_cast<S>(a.lr / a.bc1), bc2_sqrt = static_cast<S>(std::sqrt(a.bc2));
  const S eps = static_cast<S>(a.eps), wd = static_cast<S>(a.weight_decay);
  const S shrink = static_cast<S>(1.0 - a.lr * a.weight_decay);
  for (std::int64_t i = 0; i < n; ++i) {
    S param = cpu::load(p[i]);
    S d = cpu::load(g[i]);
    if constexpr (kDecay == 2) param = param * shrink;
    if constexpr (kDecay == 1) d = d + wd * param;
    const S mi = b1 * m[i] + one_minus_b1 * d, vi = b2 * v[i] + one_minus_b2 * (d * d);
    m[i] = mi;
    v[i] = vi;
    p[i] = cpu::store<T>(param - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps)));
  }
}

// p, g: [n] of T; m, v: [n] in the compute type S (f32 for f16/bf16). Elements are
// independent, so chunks run on the pool; every element's arithmetic is the plain loop's.
template <class T>
void adam_cpu(T* p, const T* g, cpu::compute_t<T>* m, cpu::compute_t<T>* v, std::int64_t n, const AdamScalars& a) {
  const int decay = a.decoupled ? 2 : a.weight_decay != 0 ? 1 : 0;
  cpu::parallel_for(n, std::int64_t{1} << 14, [&](std::int64_t b, std::int64_t e) {
    if (decay == 2) adam_chunk<2>(p + b, g + b, m + b, v + b, e - b, a);
    else if (decay == 1) adam_chunk<1>(p + b, g + b, m + b, v + b, e - b, a);
    else adam_chunk<0>(p + b, g + b, m + b, v + b, e - b, a);
  });
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Optimizer(checked("optim.Adam", std::move(params), options), options.lr), o_(options) {}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions options)
    : Adam(checked("optim.AdamW", std::move(params), options), options) {}

std::vector<std::string> Adam::slot_names() const { return {"exp_avg", "exp_avg_sq"}; }

std::vector<double> Adam::step_values() const {
  const double t = static_cast<double>(steps());
  return {lr(), 1.0 - std::pow(o_.beta1, t), 1.0 - std::pow(o_.beta2, t)};
}

void Adam::update(const ParamSpan& span, const Tensor& grad) {
  const Tensor& p = params()[span.index];
  const Tensor m = slot(span.index, 0), v = slot(span.index, 1);
  const std::int64_t b = span.begin;
  const std::vector<double> sv = step_values();
  const AdamScalars a{sv[0], o_.beta1, o_.beta2, o_.eps, o_.weight_decay, sv[1], sv[2], decoupled()};
  detail::visit_floating(p.dtype(), [&]<class T>() {
    using S = cpu::compute_t<T>;
    adam_cpu<T>(static_cast<T*>(p.data_ptr()) + b, static_cast<const T*>(grad.data_ptr()) + b,
                static_cast<S*>(m.data_ptr()) + b, static_cast<S*>(v.data_ptr()) + b, span.count, a);
  });
  bump_version(p);
  bump_version(m);
  bump_version(v);
}

namespace {

// The launch's list for `spans` (parameters, gradients, moments from `slot`); versions bumped.
template <class Slot>
kernels::OptimTensors adam_tensors(const std::vector<Tensor>& params, const std::vector<ParamSpan>& spans,
                                   const std::vector<Tensor>& grads, Slot&& slot) {
  kernels::OptimTensors ts;
  for (std::size_t k = 0; k < spans.size(); ++k) {
    const Tensor& p = params[spans[k].index];
    const Tensor m = slot(spans[k].index, 0), v = slot(spans[k].index, 1);
    ts.p[k] = device_address(p);
    ts.g[k] = device_address(grads[k]);
    ts.s0[k] = device_address(m);
    ts.s1[k] = device_address(v);
    ts.n[k] = p.numel();
    LowPrecisionCopy* lp = detail::low_precision_target(p, ts, static_cast<int>(k));
    detail::narrow_to_span(ts, static_cast<int>(k), p, spans[k]);
    bump_version(p);
    detail::low_precision_written(p, lp);
    bump_version(m);
    bump_version(v);
  }
  ts.count = static_cast<int>(spans.size());
  return ts;
}

}  // namespace

void Adam::update_gpu(const std::vector<ParamSpan>& spans, const std::vector<Tensor>& grads,
                      const std::vector<const kernels::SplitSums*>& sums) {
  kernels::OptimTensors ts =
      adam_tensors(params(), spans, grads, [this](std::size_t i, std::size_t k) { return slot(i, k); });
  detail::set_split_sums(ts, sums);
  const Tensor& p0 = this->params()[spans.front().index];
  kernels::launch_adam_step(p0.dtype(), ts, step_values_on(p0.device()), skip_flag(), o_.beta1, o_.beta2, o_.eps,
                            o_.weight_decay, decoupled(), detail::update_stream(p0.device()));
}

}  // namespace kiln::optim
