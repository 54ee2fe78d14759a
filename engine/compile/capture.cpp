// The hooks ops, optimizers and generators call while a compiled step is captured.
#include <string>

#include "capture_context.h"
#include "kiln/error.h"
#include "kiln/random.h"
#include "kiln/runtime/graph.h"
#include "core/registry.h"
#include "core/tensor/tensor_impl.h"

namespace kiln::compile_detail {

thread_local CaptureContext* t_capture = nullptr;

void set_capture(CaptureContext* c) {
  if (c && !t_capture) step::g_captures.fetch_add(1);
  if (!c && t_capture) step::g_captures.fetch_sub(1);
  t_capture = c;
  step::t_capturing = c != nullptr;
}

Device capture_device() { return t_capture ? t_capture->device : Device::cpu(); }

void keep_alive(const Tensor& t) {
  if (!t_capture || !t.defined()) return;
  const std::shared_ptr<Storage>& s = t.impl()->storage;
  if (!s || s->device().is_cpu() || s->is_private()) return;
  t_capture->kept.try_emplace(s.get(), s);
}

// A store the input copy can take: dst on the capture's device and not in its private pool
// (whose blocks earlier nodes of the graph may still use), and a free slot.
bool joins_input_copy(const Tensor& dst) {
  const CaptureContext& c = *t_capture;
  const std::shared_ptr<Storage>& s = dst.impl()->storage;
  return c.input_copy && dst.device() == c.device && s && !s->is_private() &&
         c.input_copy->store_count < kernels::InputCopies::kMaxStores;
}

void store_words(const Tensor& dst_tensor, const Words& words, int count, std::function<Words()> refresh) {
  const rt::DevicePtr dst = device_address(dst_tensor);
  if (t_capture && joins_input_copy(dst_tensor)) {
    const std::shared_ptr<kernels::InputCopies> copy = t_capture->input_copy;
    const int slot = copy->store_count++;
    copy->stores[slot] = {dst, count, words};
    t_capture->actions.push_back(
        [copy, slot, refresh = std::move(refresh)](rt::Graph&) { copy->stores[slot].words = refresh(); });
    keep_alive(dst_tensor);
    return;
  }
  const rt::Stream& s = stream_of(dst_tensor.device());
  kernels::launch_store_words(dst, words, count, s);
  if (!t_capture) return;
  void* node = rt::last_captured_node(s);
  t_capture->actions.push_back([node, dst, count, refresh = std::move(refresh)](rt::Graph& g) {
    kernels::set_store_args(g, node, dst, refresh(), count);
  });
}

void on_replay(std::function<void()> action) {
  if (!t_capture) return;
  t_capture->actions.push_back([action = std::move(action)](rt::Graph&) { action(); });
}

RngState rng_state(Generator& gen, Device device) {
  CaptureContext& c = *t_capture;
  for (const CapturedRng& r : c.rngs)
    if (r.gen == &gen && r.device == device.index()) return {device_address(r.state), r.base};
  CapturedRng r;
  r.gen = &gen;
  r.device = device.index();
  r.seed = gen.seed();
  r.base = gen.offset();
  r.state = empty({2}, {.dtype = DType::i64, .device = device});
  const std::shared_ptr<std::uint64_t> blocks = r.blocks;
  Generator* g = &gen;
  // Each replay draws the blocks the captured step drew, from wherever the generator is now.
  store_words(r.state, Words{r.seed, r.base}, 2, [g, blocks] {
    const std::uint64_t seed = g->seed();
    return Words{seed, g->reserve(*blocks)};
  });
  c.rngs.push_back(r);
  return {device_address(r.state), r.base};
}

}  // namespace kiln::compile_detail
