// The optimizer base: parameter checks, the step loop, lazily created state slots and
// checkpoints of that state.
#include "kiln/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "kiln/autograd.h"
#include "core/step/step_state.h"
#include "kiln/creation.h"
#include "kiln/error.h"
#include "core/registry.h"
#include "core/tensor/tensor_impl.h"
#include "optim_common.h"

namespace kiln::optim {

namespace detail {

std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void check_params(std::string_view who, const std::vector<Tensor>& params) {
  const std::string tag = std::string("[").append(who).append("] ");
  if (params.empty()) throw ValueError(tag + "the parameter list is empty");
  std::map<const void*, std::size_t> seen;  // by handle, and by first element for views
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const std::string which = tag + "parameter " + std::to_string(i);
    if (!p.defined()) throw ValueError(which + " is undefined");
    if (!is_floating(p.dtype()))
      throw ValueError(which + " has dtype " + std::string(dtype_name(p.dtype())) + "; parameters are floating");
    if (!p.is_leaf()) throw ValueError(which + " is not a leaf (an op computed it); pass the tensors that are trained");
    if (!p.requires_grad()) throw ValueError(which + " does not require grad");
    if (!p.is_contiguous()) throw ValueError(which + " is not contiguous");
    const void* data = p.numel() > 0 ? p.data_ptr() : nullptr;
    for (const void* key : {static_cast<const void*>(p.impl()), data}) {
      if (!key) continue;
      auto [it, fresh] = seen.emplace(key, i);
      if (!fresh && it->second != i)
        throw ValueError(which + " is parameter " + std::to_string(it->second) + " again (or shares its storage)");
    }
  }
}

void check_range(std::string_view who, std::string_view what, double v, double lo, bool lo_open, double hi,
                 bool hi_open) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (ok) return;
  std::string rule = std::isinf(hi) ? "finite and " + std::string(lo_open ? "> " : ">= ") + num_str(lo)
                                    : "in " + std::string(lo_open ? "(" : "[") + num_str(lo) + ", " + num_str(hi) +
                                          (hi_open ? ")" : "]");
  throw ValueError("[" + std::string(who) + "] " + std::string(what) + " must be " + rule + ", got " + num_str(v));
}

DType state_dtype(DType param) {
  return param == DType::f16 || param == DType::bf16 ? DType::f32 : param;
}

LowPrecisionCopy* low_precision_target(const Tensor& p, kernels::OptimTensors& ts, int k) {
  LowPrecisionCopy* lp = p.impl()->low_precision.get();
  if (!lp || !lp->current_for(*p.impl())) return nullptr;
  ts.lp[k] = device_address(lp->copy);
  ts.lp_kind[k] = lp->copy.dtype() == DType::bf16 ? 2 : 1;
  return lp;
}

void low_precision_written(const Tensor& p, LowPrecisionCopy* lp) {
  if (lp) lp->written_from(*p.impl());
}

void narrow_to_span(kernels::OptimTensors& ts, int k, const Tensor& p, const ParamSpan& s) {
  const auto at = [&](rt::DevicePtr base, std::size_t element) {
    return base ? base + static_cast<rt::DevicePtr>(s.begin) * element : base;
  };
  const std::size_t param = dtype_size(p.dtype()), state = dtype_size(state_dtype(p.dtype()));
  ts.p[k] = at(ts.p[k], param);
  ts.g[k] = at(ts.g[k], param);
  ts.s0[k] = at(ts.s0[k], state);
  ts.s1[k] = at(ts.s1[k], state);
  ts.lp[k] = at(ts.lp[k], 2);  // f16 or bf16
  ts.n[k] = s.count;
}

void set_split_sums(kernels::OptimTensors& ts, const std::vector<const kernels::SplitSums*>& sums) {
  for (std::size_t k = 0; k < sums.size(); ++k)
    if (sums[k]) kernels::set_split_sums(ts, static_cast<int>(k), *sums[k]);
}

}  // namespace detail

namespace {

using detail::kInf;

// Why a loaded state slot (f32 or f64) is unusable: its first element that is not finite, or
// negative when `nonnegative`; empty when every element is fine.
std::string invalid_values(const Tensor& t, bool nonnegative) {
  const Tensor host = t.to(Device::cpu()).contiguous();
  std::string why;
  auto scan = [&]<class T>() {
    const T* v = static_cast<const T*>(host.data_ptr());
    for (std::int64_t i = 0; i < host.numel(); ++i)
      if (!std::isfinite(v[i]) || (nonnegative && v[i] < 0)) {
        why = "holds " + detail::num_str(v[i]) + " at index " + std::to_string(i) + ", expected finite values" +
              (nonnegative ? " >= 0" : "");
        return;
      }
  };
  if (host.dtype() == DType::f64) scan.operator()<double>();
  else scan.operator()<float>();
  return why;
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  detail::check_params("optim", params_);
  detail::check_range("optim", "lr", lr, 0, false, kInf, false);
  slots_.resize(params_.size());
}

void Optimizer::set_lr(double lr) {
  detail::check_range(name(), "lr", lr, 0, false, kInf, false);
  lr_ = lr;
}

void Optimizer::step() { step_in_parts({}, {}); }

void Optimizer::step_in_parts(const std::vector<std::vector<std::size_t>>& parts,
                              const std::function<void(std::size_t)>& before) {
  std::vector<std::vector<ParamSpan>> spans;
  for (const std::vector<std::size_t>& part : parts) {
    std::vector<ParamSpan>& out = spans.emplace_back();
    for (std::size_t i : part) out.push_back({.index = i});
  }
  run_parts(resolved(spans, "step_in_parts"), before);
}

void Optimizer::step_in_spans(const std::vector<std::vector<ParamSpan>>& parts,
                              const std::function<void(std::size_t)>& before) {
  run_parts(resolved(parts, "step_in_spans"), before);
}

std::vector<std::vector<ParamSpan>> Optimizer::resolved(const std::vector<std::vector<ParamSpan>>& parts,
                                                        const std::string& who) const {
  auto tag = [&](std::size_t i) {
    return std::string("[").append(name()).append("] ").append(who).append(": parameter ") + std::to_string(i);
  };
  auto range = [](std::int64_t b, std::int64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + ")"; };
  struct Placed {
    std::int64_t begin, end;
    std::size_t part;
  };
  std::vector<std::vector<Placed>> placed(params_.size());
  std::vector<std::vector<ParamSpan>> out(parts.size() + 1);
  for (std::size_t k = 0; k < parts.size(); ++k)
    for (ParamSpan s : parts[k]) {
      if (s.index >= params_.size())
        throw ValueError(tag(s.index) + " is out of range (" + std::to_string(params_.size()) + " parameters)");
      const std::int64_t n = params_[s.index].numel();
      if (s.count == -1) s.count = n - s.begin;
      if (s.begin < 0 || s.count < 0 || s.begin > n || s.count > n - s.begin || (s.count == 0 && n > 0))
        throw ValueError(tag(s.index) + ": elements " + range(s.begin, s.begin + s.count) + " are not a span of its " +
                         std::to_string(n) + " elements");
      placed[s.index].push_back({s.begin, s.begin + s.count, k});
      out[k].push_back(s);
    }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    std::vector<Placed>& ps = placed[i];
    const std::int64_t n = params_[i].numel();
    if (ps.empty()) {
      out.back().push_back({.index = i, .begin = 0, .count = n});
      continue;
    }
    std::sort(ps.begin(), ps.end(), [](const Placed& a, const Placed& b) { return a.begin < b.begin; });
    std::int64_t covered = 0;
    for (std::size_t j = 0; j < ps.size(); ++j) {
      if (j > 0 && ps[j].begin < ps[j - 1].end) {
        const bool whole = ps[j].begin == 0 && ps[j - 1].end == n && ps[j].end == n;
        throw ValueError(
            tag(i) + (whole ? " is" : ": elements " + range(ps[j].begin, std::min(ps[j].end, ps[j - 1].end)) + " are") +
            " in parts " + std::to_string(ps[j - 1].part) + " and " + std::to_string(ps[j].part));
      }
      if (ps[j].begin > covered)
        throw ValueError(tag(i) + ": elements " + range(covered, ps[j].begin) +
                         " are in no part; a parameter in a part is covered whole");
      covered = ps[j].end;
    }
    if (covered < n)
      throw ValueError(tag(i) + ": elements " + range(covered, n) +
                       " are in no part; a parameter in a part is covered whole");
  }
  return out;
}

void Optimizer::run_parts(const std::vector<std::vector<ParamSpan>>& parts,
                          const std::function<void(std::size_t)>& before) {
  NoGradGuard no_grad;
  // Every gradient is checked before any parameter changes, so a bad one leaves all untouched.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    auto which = [&] { return "[" + name() + "] parameter " + std::to_string(i) + " "; };
    if (g.dtype() != p.dtype())
      throw DTypeError(which() + "has a gradient of dtype " + std::string(dtype_name(g.dtype())) + " but is " +
                       std::string(dtype_name(p.dtype())));
    if (g.shape() != p.shape())
      throw ShapeError(which() + "has a gradient of shape " + shape_str(g.shape()) + " but is " + shape_str(p.shape()));
    if (g.device() != p.device())
      throw DeviceError(which() + "has a gradient on " + g.device().str() + " but lives on " + p.device().str());
  }
  // Only for a step in one part: a part's `before` may read gradients the update has not summed
  // yet (held, they are summed when it does).
  if (parts.size() == 1) take_held_sums(parts[0]);
  struct SumsLeft {
    Optimizer& o;
    ~SumsLeft() { o.run_held_sums(); }
  } sums_left{*this};
  advance();
  // A replay of a captured step redoes the host's part of the step before the graph runs.
  step::on_replay([this] { advance(); });
  write_step_values();
  begin_step();
  if (parts.size() == 1 && skip_flag_ == 0 && update_early(parts[0])) return;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (k + 1 < parts.size() && before) before(k);
    update_all(parts[k]);
  }
}

// The updates of `spans` (in order): CUDA parameters in groups of one device and dtype, up to
// 32 per launch; .grad() is read here, after the part's `before` may have replaced it.
void Optimizer::update_all(const std::vector<ParamSpan>& spans) {
  std::vector<std::vector<ParamSpan>> groups;
  for (const ParamSpan& s : spans) {
    const Tensor& p = params_[s.index];
    if (!p.grad().defined() || s.count == 0) continue;
    if (!p.device().is_cuda()) {
      update(s, p.grad().contiguous());
      continue;
    }
    auto same = [&](const std::vector<ParamSpan>& g) {
      const Tensor& q = params_[g.front().index];
      return q.device() == p.device() && q.dtype() == p.dtype() && g.size() < 32;
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end())
      groups.emplace_back(std::vector<ParamSpan>{s});
    else
      it->push_back(s);
  }
  for (const std::vector<ParamSpan>& g : groups) {
    std::vector<Tensor> grads;
    std::vector<const kernels::SplitSums*> sums;
    for (const ParamSpan& s : g) {
      grads.push_back(params_[s.index].grad().contiguous());
      sums.push_back(take_sums_of(s.index));
    }
    update_gpu(g, grads, sums);
  }
}

void Optimizer::step_unless(const Tensor& found_inf) {
  const std::string tag = std::string("[").append(name()).append("] step_unless: ");
  if (!found_inf.defined() || found_inf.dtype() != DType::f32 || found_inf.numel() != 1)
    throw DTypeError(tag + "the flag must be one f32 element");
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && params_[i].device() != found_inf.device())
      throw DeviceError(tag + "parameter " + std::to_string(i) + " lives on " + params_[i].device().str() +
                        ", the flag on " + found_inf.device().str());
  if (found_inf.device().is_cpu()) {
    if (found_inf.item<float>() == 0.f) step();
    return;
  }
  skip_flag_ = device_address(found_inf);
  struct Reset {
    std::uint64_t& flag;
    ~Reset() { flag = 0; }
  } reset{skip_flag_};
  step();
}

void Optimizer::advance() {
  if (steps_ >= kMaxSteps)
    throw ValueError("[" + name() + "] the step count is at its limit 2^53 (" + std::to_string(kMaxSteps) +
                     "); start a new optimizer or load a smaller 'step'");
  ++steps_;
}

void Optimizer::write_step_values() {
  for (const Tensor& p : params_) {
    if (!p.device().is_cuda() || !p.grad().defined()) continue;
    const auto dev = static_cast<std::size_t>(p.device().index());
    if (dev < step_buffers_.size() && step_buffers_[dev].defined()) continue;  // written for this step already
    if (step_buffers_.size() <= dev) step_buffers_.resize(dev + 1);
    step_buffers_[dev] = empty({8}, {.dtype = DType::f64, .device = p.device()});
  }
  auto words = [this] {
    const std::vector<double> v = step_values();
    step::Words w{};
    for (std::size_t i = 0; i < v.size() && i < w.size(); ++i) std::memcpy(&w[i], &v[i], sizeof(double));
    return w;
  };
  for (const Tensor& buf : step_buffers_) {
    if (!buf.defined()) continue;
    const int count = static_cast<int>(std::min<std::size_t>(step_values().size(), 8));
    step::store_words(buf, words(), count, words);
  }
}

std::uint64_t Optimizer::step_values_on(Device d) const {
  const auto dev = static_cast<std::size_t>(d.index());
  if (!d.is_cuda() || dev >= step_buffers_.size() || !step_buffers_[dev].defined())
    throw ValueError("[" + name() + "] no step values on " + d.str() + " (step() writes them before the updates)");
  return device_address(step_buffers_[dev]);
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

void Optimizer::reset_state() {
  if (step::capturing()) throw ValueError("[" + name() + "] reset_state inside a compiled step's capture");
  check_resettable();
  NoGradGuard no_grad;
  for (std::vector<Tensor>& row : slots_)
    for (Tensor& t : row)
      if (t.defined()) t.zero_();
  steps_ = 0;
}

bool Optimizer::has_slot(std::size_t param, std::size_t slot) const {
  return param < slots_.size() && slot < slots_[param].size() && slots_[param][slot].defined();
}

Tensor& Optimizer::slot(std::size_t param, std::size_t slot) {
  if (has_slot(param, slot)) return slots_[param][slot];  // the usual case: no slot_names() allocation
  const std::size_t count = slot_names().size();
  if (param >= params_.size() || slot >= count)
    throw ValueError("[" + name() + "] no state slot " + std::to_string(slot) + " for parameter " +
                     std::to_string(param));
  std::vector<Tensor>& row = slots_[param];
  if (row.size() < count) row.resize(count);
  if (!row[slot].defined()) {
    const Tensor& p = params_[param];
    row[slot] = zeros(p.shape(), {.dtype = detail::state_dtype(p.dtype()), .device = p.device()});
  }
  return row[slot];
}

nn::NamedTensors Optimizer::state() const {
  nn::NamedTensors out;
  out.emplace_back("step", scalar_tensor(steps_, {.dtype = DType::i64}));
  const std::vector<std::string> names = slot_names();
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t s = 0; s < names.size(); ++s)
      if (has_slot(i, s)) out.emplace_back(std::to_string(i) + "." + names[s], slots_[i][s]);
  return out;
}

void Optimizer::load_state(const nn::NamedTensors& state) {
  const std::vector<std::string> names = slot_names();
  std::vector<std::string> problems;
  std::optional<std::int64_t> step;
  std::vector<std::vector<Tensor>> incoming(params_.size(), std::vector<Tensor>(names.size()));
  std::set<std::string> seen;
  auto describe = [](const Tensor& t) {
    return std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape());
  };
  for (const auto& [key, t] : state) {
    const std::string q = "'" + key + "'";
    if (!seen.insert(key).second) {
      problems.push_back(q + " appears twice");
      continue;
    }
    if (!t.defined()) {
      problems.push_back(q + " is an undefined tensor");
      continue;
    }
    if (key == "step") {
      if (t.dtype() != DType::i64 || t.numel() != 1) {
        problems.push_back("'step' is " + describe(t) + ", expected one i64 element");
      } else {
        const std::int64_t v = t.to(Device::cpu()).item<std::int64_t>();
        if (v < 0 || v > kMaxSteps)
          problems.push_back("'step' is " + std::to_string(v) + ", expected 0 <= step <= 2^53");
        else
          step = v;
      }
      continue;
    }
    // "<param index>.<slot name>"
    const std::size_t dot = key.find('.');
    std::size_t index = params_.size(), slot = names.size();
    if (dot != std::string::npos && dot > 0 && dot <= 9 &&
        key.find_first_not_of("0123456789") == dot) {
      index = std::stoul(key.substr(0, dot));
      for (std::size_t s = 0; s < names.size(); ++s)
        if (key.compare(dot + 1, std::string::npos, names[s]) == 0) slot = s;
    }
    if (index >= params_.size() || slot >= names.size()) {
      problems.push_back("unexpected entry " + q);
      continue;
    }
    const Tensor& p = params_[index];
    const DType want = detail::state_dtype(p.dtype());
    if (t.dtype() != want || t.shape() != p.shape()) {
      problems.push_back(q + " is " + describe(t) + ", expected " + std::string(dtype_name(want)) + " " +
                         shape_str(p.shape()));
      continue;
    }
    // NaN or infinite moments (or a negative second moment under Adam's sqrt) would turn
    // every later update into NaN.
    if (const std::string why = invalid_values(t, slot_nonnegative(slot)); !why.empty()) {
      problems.push_back(q + " " + why);
      continue;
    }
    incoming[index][slot] = t;
  }
  if (!step && !seen.count("step")) problems.push_back("'step' is missing");
  if (!problems.empty()) {
    std::string msg = "[" + name() + "] load_state: " + std::to_string(problems.size()) + " mismatch" +
                      (problems.size() == 1 ? "" : "es") + ": ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw ValueError(msg);
  }
  NoGradGuard no_grad;
  // Copies, so that later updates never write into the caller's tensors.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    std::vector<Tensor> row(names.size());
    for (std::size_t s = 0; s < names.size(); ++s) {
      const Tensor& src = incoming[i][s];
      if (!src.defined()) continue;
      const Device dev = params_[i].device();
      row[s] = src.device() == dev ? src.clone() : src.to(dev).contiguous();
    }
    slots_[i] = std::move(row);
  }
  steps_ = *step;
}

}  // namespace kiln::optim
