// GradScaler: the loss scale and its schedule on the loss's device. On a GPU the unscale and
// the schedule are kernels (kernel_templates/optim.cu) so a compiled step replays them; on the
// CPU they are the loops below, which the CPU tests check the schedule with.
#include "kiln/optim/grad_scaler.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "core/cpu/loops.h"
#include "kiln/autograd.h"
#include "core/step/step_state.h"
#include "kiln/creation.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "core/registry.h"
#include "optim_common.h"

namespace kiln::optim {

namespace {

constexpr const char* kWho = "optim.GradScaler";
using detail::kInf;

GradScalerOptions checked(const GradScalerOptions& o) {
  detail::check_range(kWho, "init_scale", o.init_scale, 0, true, kInf, false);
  detail::check_range(kWho, "growth_factor", o.growth_factor, 1, true, kInf, false);
  detail::check_range(kWho, "backoff_factor", o.backoff_factor, 0, true, 1, true);
  if (o.growth_interval < 1)
    throw ValueError(std::string("[") + kWho + "] growth_interval must be >= 1, got " +
                     std::to_string(o.growth_interval));
  return o;
}

// g /= scale in place (g: contiguous, on the CPU); true when an element was inf or NaN before.
bool unscale_cpu(const Tensor& g, float scale) {
  bool bad = false;
  detail::visit_floating(g.dtype(), [&]<class T>() {
    using S = cpu::compute_t<T>;
    const S inv = static_cast<S>(1.0 / static_cast<double>(scale));
    T* v = static_cast<T*>(g.data_ptr());
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const S x = cpu::load(v[i]);
      bad |= !std::isfinite(x);
      v[i] = cpu::store<T>(x * inv);
    }
  });
  bump_version(g);
  return bad;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : o_(checked(options)) {
  scale_ = scalar_tensor(o_.init_scale, {.dtype = DType::f32});
  growth_tracker_ = scalar_tensor(std::int64_t{0}, {.dtype = DType::i64});
}

void GradScaler::place_on(Device d) {
  if (scale_.device() == d) return;
  // The state starts on the CPU and follows the first loss; later it stays where it is.
  if (!flags_.empty() || !scale_.device().is_cpu())
    throw DeviceError(std::string("[") + kWho + "] the scale lives on " + scale_.device().str() + ", not " + d.str() +
                      "; use one scaler per device");
  scale_ = scale_.to(d);
  growth_tracker_ = growth_tracker_.to(d);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!o_.enabled) return loss;
  if (!loss.defined() || !is_floating(loss.dtype()))
    throw DTypeError(std::string("[") + kWho + "] scale() takes a floating loss");
  place_on(loss.device());
  return mul(loss, scale_);
}

void GradScaler::unscale(Optimizer& opt) {
  if (!o_.enabled) return;
  if (stages_.count(&opt))
    throw ValueError(std::string("[") + kWho +
                     "] unscale() was called for this optimizer already since the last update()");
  std::optional<Device> dev;
  for (const Tensor& p : opt.params())
    if (p.grad().defined()) {
      dev = p.grad().device();
      break;
    }
  if (dev) place_on(*dev);
  NoGradGuard no_grad;
  Tensor& flag = flags_[&opt];
  if (!flag.defined())
    flag = zeros({}, {.device = scale_.device()});
  else
    flag.zero_();
  stages_[&opt] = Stage::unscaled;
  // Gradients in place, so contiguous ones; a strided one is replaced by a contiguous copy.
  std::vector<Tensor> grads;
  for (const Tensor& p : opt.params()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.device() != scale_.device())
      throw DeviceError(std::string("[") + kWho + "] a gradient lives on " + g.device().str() + ", the scale on " +
                        scale_.device().str());
    if (!g.is_contiguous()) {
      g = g.contiguous();
      Tensor(p).set_grad(g);
    }
    grads.push_back(g);
  }
  if (scale_.device().is_cpu()) {
    const float s = scale_.item<float>();
    bool bad = false;
    for (const Tensor& g : grads) bad |= unscale_cpu(g, s);
    if (bad) flag.fill_(1.0);
    return;
  }
  // One launch per dtype and 32 gradients.
  std::set<DType> dtypes;
  for (const Tensor& g : grads) dtypes.insert(g.dtype());
  for (DType t : dtypes) {
    kernels::OptimTensors ts;
    auto flush = [&] {
      if (ts.count == 0) return;
      kernels::launch_unscale_grads(t, ts, device_address(scale_), device_address(flag), stream_of(scale_.device()));
      ts = kernels::OptimTensors();
    };
    for (const Tensor& g : grads) {
      if (g.dtype() != t) continue;
      ts.g[ts.count] = device_address(g);
      ts.n[ts.count] = g.numel();
      if (++ts.count == kernels::OptimTensors::kMax) flush();
      bump_version(g);
    }
    flush();
  }
}

void GradScaler::step(Optimizer& opt) {
  if (!o_.enabled) return opt.step();
  auto it = stages_.find(&opt);
  if (it != stages_.end() && it->second == Stage::stepped)
    throw ValueError(std::string("[") + kWho +
                     "] step() was called for this optimizer already since the last update()");
  if (it == stages_.end()) unscale(opt);
  stages_[&opt] = Stage::stepped;
  // A compiled step cannot read the flag: the optimizer's kernels do.
  const Tensor& flag = flags_.at(&opt);
  if (step::in_compiled_call())
    opt.step_unless(flag);
  else if (flag.item<float>() == 0.f)
    opt.step();
}

void GradScaler::update() {
  if (!o_.enabled) return;
  if (stages_.empty())
    throw ValueError(std::string("[") + kWho +
                     "] update() found no gradients unscaled since the last update(); "
                     "call step(opt) (or unscale(opt)) first");
  NoGradGuard no_grad;
  Tensor found;  // any optimizer's flag
  for (const auto& [opt, stage] : stages_) found = found.defined() ? add(found, flags_.at(opt)) : flags_.at(opt);
  stages_.clear();
  if (!scale_.device().is_cpu()) {
    kernels::launch_update_scale(device_address(scale_), device_address(growth_tracker_), device_address(found),
                                 o_.growth_factor, o_.backoff_factor, o_.growth_interval, stream_of(scale_.device()));
    bump_version(scale_);
    bump_version(growth_tracker_);
    return;
  }
  // The kernel's schedule, on the host.
  float s = scale_.item<float>();
  std::int64_t clean = growth_tracker_.item<std::int64_t>();
  if (found.item<float>() != 0.f) {
    s = static_cast<float>(s * o_.backoff_factor);
    clean = 0;
  } else if (++clean >= o_.growth_interval) {
    const float grown = static_cast<float>(s * o_.growth_factor);
    if (std::isfinite(grown)) s = grown;
    clean = 0;
  }
  scale_.fill_(s);
  growth_tracker_.fill_(clean);
}

Tensor GradScaler::found_inf(const Optimizer& opt) const {
  auto it = flags_.find(&opt);
  return it == flags_.end() ? Tensor() : it->second;
}

double GradScaler::scale_value() const { return scale_.item<float>(); }

std::int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<std::int64_t>(); }

nn::NamedTensors GradScaler::state() const {
  return {{"scale", scale_.to(Device::cpu()).clone()}, {"growth_tracker", growth_tracker_.to(Device::cpu()).clone()}};
}

void GradScaler::load_state(const nn::NamedTensors& state) {
  std::optional<float> scale;
  std::optional<std::int64_t> tracker;
  std::vector<std::string> problems;
  for (const auto& [key, t] : state) {
    const bool one = t.defined() && t.numel() == 1;
    if (key == "scale") {
      const float v = one && t.dtype() == DType::f32 ? t.to(Device::cpu()).item<float>() : -1.f;
      if (!(std::isfinite(v) && v > 0))
        problems.push_back("'scale' must be one finite f32 > 0");
      else
        scale = v;
    } else if (key == "growth_tracker") {
      const std::int64_t v = one && t.dtype() == DType::i64 ? t.to(Device::cpu()).item<std::int64_t>() : -1;
      if (v < 0)
        problems.push_back("'growth_tracker' must be one i64 >= 0");
      else
        tracker = v;
    } else {
      problems.push_back("unexpected entry '" + key + "'");
    }
  }
  if (problems.empty() && !scale) problems.push_back("'scale' is missing");
  if (problems.empty() && !tracker) problems.push_back("'growth_tracker' is missing");
  if (!problems.empty()) {
    std::string msg = std::string("[") + kWho + "] load_state: ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw ValueError(msg);
  }
  NoGradGuard no_grad;
  scale_.fill_(*scale);
  growth_tracker_.fill_(*tracker);
}

}  // namespace kiln::optim
