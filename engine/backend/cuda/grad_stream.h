#pragma once
// Inside a compiled step's backward on a GPU, a product that only writes a parameter's .grad()
// buffer (a weight gradient into its grad sink) runs on a second stream of the device, beside
// the chain of input gradients the backward waits on, so the two overlap in the captured
// graph. The device's stream waits for that work where the backward ends, before a leaf's
// gradient is touched there or its ready hooks run. The kernels and their operands are the
// same on either stream, so the results are the same bits.
#include <initializer_list>
#include <memory>

#include "kiln/runtime/device.h"
#include "kiln/tensor.h"

namespace kiln::grad_stream {

// Open for one backward pass inside a compiled call (`in_compiled_call`; otherwise it does
// nothing): side work may start, and all of it is waited for when the scope closes.
class BackwardScope {
 public:
  explicit BackwardScope(bool in_compiled_call);
  ~BackwardScope();
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;

 private:
  bool open_ = false;
};

// Set by a vjp around the dispatch of a product whose only output is its grad sink.
class Allow {
 public:
  explicit Allow(bool allow);
  ~Allow();
  Allow(const Allow&) = delete;
  Allow& operator=(const Allow&) = delete;

 private:
  bool before_;
};

// The stream for that product: the device's second stream, forked from `main` now (it waits
// for everything queued there), with `keep` (the product's operands and outputs) held until the
// join; or `main` itself where side work does not apply.
const rt::Stream& fork(const rt::Stream& main, std::initializer_list<Tensor> keep);

// The device's stream waits for the side work so far; the tensors it held are let go.
void join();

// Whether `stream` is a second stream with work forked from `main` pending (CUstreams).
bool beside(const void* stream, const void* main);
// Holds `object` (a buffer the side work reads that its maker would free sooner) until the join.
void keep(std::shared_ptr<const void> object);

// ---- Updates before the backward ends ----
// Inside a compiled call's backward, autograd marks each leaf as its gradient becomes final
// (before its ready hooks): a ready point records the device's stream and the second stream as
// they were then. An optimizer step right after that backward may update the leaves that were
// ready before the last point on a third stream that waits only for their point, beside the
// backward's last kernels.
void mark_ready(const void* leaf, const void* storage, int device);
// A vjp reads `storage` (a saved tensor's): a leaf of that storage marked ready before then is
// updated after the backward instead.
void read_after(const void* storage);
// The point at which `leaf` became ready in this call's last backward on `main`'s device
// (kAfterBackward when a vjp read its storage later), or -1:
// also while not capturing, or when anything was queued on `main` since that backward ended (a
// clipping or an unscaling that reads every gradient first).
int ready_point(const void* leaf, const rt::Stream& main);
inline constexpr int kAfterBackward = 1 << 30;
// Makes the third stream of `device` outside a capture, so that a capture finds it.
void prepare_third(int device);
// The third stream of main's device, its later work waiting for ready point `point`; null when
// prepare_third did not make it.
const rt::Stream* after_point(int point, const rt::Stream& main);
// `main` waits for the work queued on after_point's stream.
void join_third(const rt::Stream& main);

// On by default; KILN_GRAD_STREAM=off (or set_enabled(false)) keeps every product on the
// device's stream, and every update after the backward.
bool enabled();
void set_enabled(bool on);

}  // namespace kiln::grad_stream
