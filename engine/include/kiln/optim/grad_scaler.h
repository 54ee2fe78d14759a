#pragma once
// Dynamic loss scaling for f16 training (torch.cuda.amp.GradScaler): the loss is multiplied by
// a scale so small f16 gradients do not flush to zero; step() divides the gradients by it and
// skips the update when one is inf or NaN; update() halves the scale after such a step and
// doubles it after growth_interval clean ones.
//   optim::GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(opt);
//   scaler.update();
// The scale, the count of clean steps and the found-inf flag live on the loss's device and
// are changed there by kernels, so the same calls work inside a compiled step: there the
// optimizer's kernels read the flag and skip on the device. Outside one, step() reads the flag
// on the host (one synchronisation) and skips the optimizer's step() entirely.
#include <cstdint>
#include <map>

#include "kiln/nn/module.h"
#include "optimizer.h"
#include "kiln/tensor.h"

namespace kiln::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;           // > 1
  double backoff_factor = 0.5;          // in (0, 1)
  std::int64_t growth_interval = 2000;  // >= 1
  bool enabled = true;                  // false: scale() is the loss, step() is opt.step(), update() does nothing
};

class GradScaler {
 public:
  // ValueError for options outside the bounds above (init_scale finite and > 0).
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale; the state moves to loss's device on first use (DeviceError for another device later).
  Tensor scale(const Tensor& loss);
  // Divides opt's gradients by the scale in place and records whether one was inf or NaN. At
  // most once per optimizer between update()s (ValueError); step() calls it unless done.
  void unscale(Optimizer& opt);
  // opt's step unless a gradient unscaled since the last update() was inf or NaN.
  void step(Optimizer& opt);
  // The scale schedule; ValueError unless a gradient was unscaled since the last update().
  void update();

  bool enabled() const { return o_.enabled; }
  double scale_value() const;           // the current scale (reads the device)
  std::int64_t growth_tracker() const;  // clean steps since the scale last changed
  // An f32 scalar: nonzero when one of opt's gradients was inf or NaN at its last unscale
  // (undefined before its first). Each optimizer skips on its own flag; update() backs off
  // when any flag since the last update() is set, as in PyTorch.
  Tensor found_inf(const Optimizer& opt) const;

  // "scale" (f32 scalar) and "growth_tracker" (i64 scalar), for checkpoints beside the
  // optimizer's; load_state checks both (scale finite and > 0, tracker >= 0) or changes nothing.
  nn::NamedTensors state() const;
  void load_state(const nn::NamedTensors& state);

 private:
  enum class Stage { unscaled, stepped };
  void place_on(Device d);  // creates or moves the state tensors
  GradScalerOptions o_;
  Tensor scale_, growth_tracker_;             // f32 and i64 scalars on one device
  std::map<const Optimizer*, Tensor> flags_;  // f32 found-inf scalars, kept: a captured step holds their addresses
  std::map<const Optimizer*, Stage> stages_;  // since the last update()
};

}  // namespace kiln::optim
