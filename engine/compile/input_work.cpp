// Work on a compiled call's inputs, noted by its eager call and done by its capture's input copy
// (see input_work.h).
#include "input_work.h"

#include "core/tensor/dispatch.h"
#include "kiln/creation.h"
#include "kiln/runtime/log.h"
#include "kiln/shape_ops.h"

namespace kiln::compile_detail {

struct CallInputs {
  const std::vector<Tensor>* inputs = nullptr;
  std::vector<std::uint64_t> versions;  // at the call's start: work after an in-place write is not the copy's
  InputWork* work = nullptr;
  std::vector<bool> casts_handed, gathers_handed;  // capture: made went to the step already
  bool capture = false;
};

namespace {

thread_local CallInputs* t_call = nullptr;

// The input t is all of, unchanged since the call began; -1 for none.
int input_of(const CallInputs& c, const Tensor& t) {
  if (!t.is_contiguous()) return -1;
  for (std::size_t i = 0; i < c.inputs->size(); ++i) {
    const Tensor& in = (*c.inputs)[i];
    if (in.data_ptr() == t.data_ptr() && in.dtype() == t.dtype() && in.numel() == t.numel() &&
        in.version() == c.versions[i])
      return static_cast<int>(i);
  }
  return -1;
}

// One entry of the input copy: dst from src (converted, or gathered by `index`).
kernels::InputCopies one_copy(const Tensor& dst, const Tensor& src) {
  kernels::InputCopies c;
  c.dst[0] = device_address(dst);
  c.src[0] = device_address(src);
  c.count = 1;
  return c;
}

// A gather's entry fields: rows of `source` (row bytes, rows) by the index at `index`.
void set_gather(kernels::InputCopies& c, int k, const Tensor& source, std::uint64_t index, std::int64_t count) {
  const std::int64_t rows = source.shape()[0];
  c.bytes[k] = static_cast<std::uint64_t>(source.numel() / std::max<std::int64_t>(rows, 1)) * source.element_size();
  c.index[k] = index;
  c.rows[k] = static_cast<std::uint64_t>(rows);
  c.index_count[k] = static_cast<std::uint64_t>(count);
}

// Work made here with the input copy's kernel, so that the eager call's later ops (its fused
// groups) are the capture's, whose kernels must all be loaded by then.
void launch_here(const kernels::InputCopies& c, Device device) { kernels::launch_copy_inputs(c, stream_of(device)); }

}  // namespace

void InputWork::clear_made() {
  for (InputCast& c : casts) c.made = Tensor();
  for (InputGather& g : gathers) g.made = Tensor();
}

kernels::CopyConvert copy_conversion(DType from, DType to) {
  if (from != DType::f32) return kernels::CopyConvert::none;
  if (to == DType::f16) return kernels::CopyConvert::f32_to_f16;
  if (to == DType::bf16) return kernels::CopyConvert::f32_to_bf16;
  return kernels::CopyConvert::none;
}

void add_copies(const InputWork& work, const std::vector<Tensor>& inputs, std::vector<kernels::InputCopies>& copies,
                std::size_t& entries) {
  auto next = [&]() -> std::pair<kernels::InputCopies&, int> {
    if (entries++ % kernels::InputCopies::kMax == 0) copies.emplace_back();
    kernels::InputCopies& c = copies.back();
    return {c, c.count++};
  };
  for (const InputCast& w : work.casts) {
    if (!w.made.defined()) continue;
    auto [c, k] = next();
    const Tensor& in = inputs[w.input];
    c.dst[k] = device_address(w.made);
    c.src[k] = device_address(in);
    c.bytes[k] = static_cast<std::uint64_t>(in.numel()) * in.element_size();
    c.convert[k] = copy_conversion(in.dtype(), w.dtype);
  }
  for (const InputGather& w : work.gathers) {
    if (!w.made.defined()) continue;
    auto [c, k] = next();
    c.dst[k] = device_address(w.made);
    c.src[k] = device_address(w.source);
    set_gather(c, k, w.source, device_address(inputs[w.input]), inputs[w.input].numel());
  }
}

InputWorkScope::InputWorkScope(const std::vector<Tensor>& inputs, InputWork& work, bool capture) {
  call_ = std::make_unique<CallInputs>();
  call_->inputs = &inputs;
  for (const Tensor& t : inputs) call_->versions.push_back(t.version());
  call_->work = &work;
  call_->casts_handed.assign(work.casts.size(), false);
  call_->gathers_handed.assign(work.gathers.size(), false);
  call_->capture = capture;
  t_call = call_.get();
}

InputWorkScope::~InputWorkScope() { t_call = nullptr; }

void InputWorkScope::finish() {
  CallInputs& c = *call_;
  t_call = nullptr;  // the gathers below run as the step's own
  if (c.capture) return;
  std::vector<InputGather>& gathers = c.work->gathers;
  for (auto it = gathers.begin(); it != gathers.end();) {
    if (it->source.version() == it->version) {
      ++it;
      continue;
    }
    // The step wrote its source: the capture will run the gather itself, so its kernel is
    // loaded now (a capture cannot load modules).
    (void)index_select(it->source, 0, (*c.inputs)[it->input]);
    it = gathers.erase(it);
  }
}

std::optional<Tensor> input_cast(const Tensor& t, DType to) {
  if (!t_call || !t.defined() || t.requires_grad() || copy_conversion(t.dtype(), to) == kernels::CopyConvert::none)
    return std::nullopt;
  CallInputs& c = *t_call;
  const int input = input_of(c, t);
  if (input < 0) return std::nullopt;
  const auto i = static_cast<std::size_t>(input);
  std::vector<InputCast>& casts = c.work->casts;
  for (std::size_t k = 0; k < casts.size(); ++k) {
    if (casts[k].input != i || casts[k].dtype != to) continue;
    if (!c.capture || c.casts_handed[k] || !casts[k].made.defined()) return std::nullopt;  // noted, or the step's own
    c.casts_handed[k] = true;
    return casts[k].made.shape() == t.shape() ? casts[k].made : casts[k].made.reshape(t.shape());
  }
  if (c.capture) return std::nullopt;
  casts.push_back({.input = i, .dtype = to, .made = Tensor()});
  rt::log().debug("[compile] input {}'s cast to {}: the graph's input copy will write it", i, dtype_name(to));
  Tensor out = empty(t.shape(), {.dtype = to, .device = t.device()});
  kernels::InputCopies copy = one_copy(out, t);
  copy.bytes[0] = static_cast<std::uint64_t>(t.numel()) * t.element_size();
  copy.convert[0] = copy_conversion(t.dtype(), to);
  launch_here(copy, t.device());
  return out;
}

std::optional<Tensor> input_gather(const Tensor& source, const Tensor& index) {
  if (!t_call || !source.defined() || !index.defined() || source.requires_grad() || index.dtype() != DType::i64 ||
      index.dim() != 1 || source.dim() < 1 || !source.is_contiguous() || source.device() != index.device() ||
      !source.device().is_cuda())
    return std::nullopt;
  CallInputs& c = *t_call;
  const int input = input_of(c, index);
  if (input < 0) return std::nullopt;
  const auto i = static_cast<std::size_t>(input);
  std::vector<InputGather>& gathers = c.work->gathers;
  for (std::size_t k = 0; k < gathers.size(); ++k) {
    const InputGather& g = gathers[k];
    if (g.input != i || !g.source.is_same(source)) continue;
    if (!c.capture || c.gathers_handed[k] || !g.made.defined() || source.version() != g.version) return std::nullopt;
    c.gathers_handed[k] = true;
    return g.made;
  }
  if (c.capture) return std::nullopt;
  gathers.push_back({.input = i, .source = source, .version = source.version(), .made = Tensor()});
  rt::log().debug("[compile] index_select by input {}: the graph's input copy will gather the rows", i);
  Shape shape = source.shape();
  shape[0] = index.numel();
  Tensor out = empty(shape, {.dtype = source.dtype(), .device = source.device()});
  kernels::InputCopies copy = one_copy(out, source);
  set_gather(copy, 0, source, device_address(index), index.numel());
  launch_here(copy, source.device());
  return out;
}

}  // namespace kiln::compile_detail
