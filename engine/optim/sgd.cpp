// SGD with momentum, Nesterov and L2 weight decay: the fused kernel on the GPU, a plain
// loop on the CPU (the reference the GPU tests compare with).
#include <limits>

#include "core/cpu/loops.h"
#include "kiln/optim/optimizer.h"
#include "core/registry.h"
#include "optim_common.h"

namespace kiln::optim {

namespace {

using detail::kInf;

std::vector<Tensor> checked(std::vector<Tensor> params, const SgdOptions& o) {
  const char* who = "optim.SGD";
  detail::check_range(who, "lr", o.lr, 0, false, kInf, false);
  detail::check_range(who, "momentum", o.momentum, 0, false, kInf, false);
  detail::check_range(who, "dampening", o.dampening, 0, false, 1, false);
  detail::check_range(who, "weight_decay", o.weight_decay, 0, false, kInf, false);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw ValueError("[optim.SGD] nesterov needs momentum > 0 and dampening 0, got momentum " +
                     detail::num_str(o.momentum) + " and dampening " + detail::num_str(o.dampening));
  detail::check_params(who, params);
  return params;
}

// p, g: [n] of T; buf: [n] in the compute type S (f32 for f16/bf16) or null.
template <class T>
void sgd_cpu(T* p, const T* g, cpu::compute_t<T>* buf, std::int64_t n, const SgdOptions& o, double lr, bool first) {
  using S = cpu::compute_t<T>;
  const S lr_s = static_cast<S>(lr), momentum = static_cast<S>(o.momentum);
  const S keep = static_cast<S>(1.0 - o.dampening), wd = static_cast<S>(o.weight_decay);
  for (std::int64_t i = 0; i < n; ++i) {
    const S param = cpu::load(p[i]);
    S d = cpu::load(g[i]);
    if (o.weight_decay != 0) d = d + wd * param;
    if (buf) {
      buf[i] = first ? d : momentum * buf[i] + keep * d;
      if (o.nesterov) d = d + momentum * buf[i];
      else d = buf[i];
    }
    p[i] = cpu::store<T>(param - lr_s * d);
  }
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SgdOptions options)
    : Optimizer(checked(std::move(params), options), options.lr), o_(options) {}

std::vector<std::string> SGD::slot_names() const { return {"momentum_buffer"}; }

void SGD::check_resettable() const {
  if (o_.momentum != 0 && o_.dampening != 0)
    throw ValueError("[optim.SGD] reset_state: with momentum and dampening " + std::to_string(o_.dampening) +
                     " the first step copies the gradient into the buffer, which a zeroed buffer cannot repeat; "
                     "build a new optimizer instead");
}

void SGD::begin_step() { made_this_step_.assign(params().size(), false); }

// PyTorch starts the buffer as a copy of the first gradient, not from zeros.
bool SGD::first_use(std::size_t param) {
  if (o_.momentum == 0) return false;
  if (!has_slot(param, 0)) made_this_step_[param] = true;
  return made_this_step_[param];
}

void SGD::update(const ParamSpan& span, const Tensor& grad) {
  const Tensor& p = params()[span.index];
  const bool momentum = o_.momentum != 0;
  const bool first = first_use(span.index);
  const Tensor buf = momentum ? slot(span.index, 0) : Tensor();
  const std::int64_t b = span.begin;
  detail::visit_floating(p.dtype(), [&]<class T>() {
    sgd_cpu<T>(static_cast<T*>(p.data_ptr()) + b, static_cast<const T*>(grad.data_ptr()) + b,
               buf.defined() ? static_cast<cpu::compute_t<T>*>(buf.data_ptr()) + b : nullptr, span.count, o_, lr(),
               first);
  });
  bump_version(p);
  if (buf.defined()) bump_version(buf);
}

void SGD::update_gpu(const std::vector<ParamSpan>& spans, const std::vector<Tensor>& grads,
                     const std::vector<const kernels::SplitSums*>& sums) {
  const bool momentum = o_.momentum != 0;
  kernels::OptimTensors ts;
  for (std::size_t k = 0; k < spans.size(); ++k) {
    const Tensor& p = this->params()[spans[k].index];
    const bool first = first_use(spans[k].index);
    const Tensor buf = momentum ? slot(spans[k].index, 0) : Tensor();
    ts.p[k] = device_address(p);
    ts.g[k] = device_address(grads[k]);
    ts.s0[k] = buf.defined() ? device_address(buf) : 0;
    ts.n[k] = p.numel();
    ts.flags[k] = first ? 1 : 0;
    LowPrecisionCopy* lp = detail::low_precision_target(p, ts, static_cast<int>(k));
    detail::narrow_to_span(ts, static_cast<int>(k), p, spans[k]);
    bump_version(p);
    detail::low_precision_written(p, lp);
    if (buf.defined()) bump_version(buf);
  }
  ts.count = static_cast<int>(spans.size());
  detail::set_split_sums(ts, sums);
  const Tensor& p0 = this->params()[spans.front().index];
  kernels::launch_sgd_step(p0.dtype(), ts, step_values_on(p0.device()), skip_flag(), o_.momentum, o_.dampening,
                           o_.weight_decay, o_.nesterov, detail::update_stream(p0.device()));
}

}  // namespace kiln::optim
