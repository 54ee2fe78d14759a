// Gradients made ahead of the vjp that uses them (linear_grads.h): an output layer's masked input
// gradient, made by the fused product and loss, and the bias gradient of the layer below, summed
// by the output layer's narrow weight-gradient kernel. Held per thread, one of each at a time.
#include <atomic>
#include <memory>
#include <optional>

#include "core/tensor/tensor_impl.h"
#include "linear_grads.h"

namespace kiln::linear_detail {

namespace {

struct AheadInputGrad {
  std::weak_ptr<Storage> dlogits;  // a vjp hands on an alias of the forward's output: its storage
  std::uint64_t data = 0, w = 0, y = 0;
  Shape shape;
  Tensor dx;
};
thread_local std::optional<AheadInputGrad> t_ahead;

struct AheadBiasGrad {
  std::weak_ptr<Storage> below;  // the gradient it sums, held weakly: it goes with it
  std::uint64_t data = 0, version = 0;
  Shape shape;
  Tensor db;
};
thread_local std::optional<AheadBiasGrad> t_ahead_bias;
std::atomic<std::int64_t> g_bias_taken{0};

// The ahead input gradient, where it is for g (the same storage, address and shape) and the
// operands w and y; null otherwise (an offer whose dlogits is gone is dropped).
AheadInputGrad* ahead_for(const Tensor& g, const Tensor& w, const Tensor& y) {
  if (!t_ahead) return nullptr;
  const std::shared_ptr<Storage> held = t_ahead->dlogits.lock();
  if (!held) {
    t_ahead.reset();
    return nullptr;
  }
  const bool same = g.device().is_cuda() && g.impl()->storage == held && device_address(g) == t_ahead->data &&
                    g.shape() == t_ahead->shape && g.is_contiguous() && device_address(w) == t_ahead->w &&
                    device_address(y) == t_ahead->y && t_ahead->dx.shape() == y.shape() &&
                    t_ahead->dx.dtype() == y.dtype();
  return same ? &*t_ahead : nullptr;
}

}  // namespace

void offer_ahead_input_grad(const Tensor& dlogits, std::uint64_t w, std::uint64_t y, Tensor dx) {
  t_ahead = AheadInputGrad{dlogits.impl()->storage, device_address(dlogits), w, y, dlogits.shape(), std::move(dx)};
}

Tensor peek_ahead_input_grad(const Tensor& g, const Tensor& w, const Tensor& y) {
  const AheadInputGrad* a = ahead_for(g, w, y);
  return a ? a->dx : Tensor();
}

Tensor take_ahead_input_grad(const Tensor& g, const Tensor& w, const Tensor& y) {
  if (!ahead_for(g, w, y)) return {};
  Tensor dx = std::move(t_ahead->dx);
  t_ahead.reset();
  return dx;
}

void offer_ahead_bias_grad(const Tensor& below, Tensor db) {
  t_ahead_bias =
      AheadBiasGrad{below.impl()->storage, device_address(below), below.version(), below.shape(), std::move(db)};
}

Tensor take_ahead_bias_grad(const Tensor& gp) {
  if (!t_ahead_bias) return {};
  const std::shared_ptr<Storage> held = t_ahead_bias->below.lock();
  const bool same = held && gp.impl()->storage == held && device_address(gp) == t_ahead_bias->data &&
                    gp.version() == t_ahead_bias->version && gp.shape() == t_ahead_bias->shape;
  if (!same) {
    if (!held) t_ahead_bias.reset();
    return {};
  }
  Tensor db = std::move(t_ahead_bias->db);
  t_ahead_bias.reset();
  g_bias_taken.fetch_add(1, std::memory_order_relaxed);
  return db;
}

std::int64_t ahead_bias_grads_taken() { return g_bias_taken.load(std::memory_order_relaxed); }

}  // namespace kiln::linear_detail
