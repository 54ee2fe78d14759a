// engine/compile's side of core's step hook: the capture and fusion entries below core call,
// installed once while the library loads.
#include "capture.h"
#include "core/step/step_state.h"
#include "fusion.h"
#include "input_work.h"

namespace kiln::compile_detail {
namespace {

class CaptureAndFusion final : public step::StepCompiler {
 public:
  Device capture_device() override { return compile_detail::capture_device(); }
  void keep_alive(const Tensor& t) override { compile_detail::keep_alive(t); }
  void store_words(const Tensor& dst, const Words& words, int count, std::function<Words()> refresh) override {
    compile_detail::store_words(dst, words, count, std::move(refresh));
  }
  void on_replay(std::function<void()> action) override { compile_detail::on_replay(std::move(action)); }
  RngState rng_state(Generator& gen, Device device) override { return compile_detail::rng_state(gen, device); }
  bool defer_pointwise(const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) override {
    return compile_detail::defer_pointwise(op, args, outputs);
  }
  void ran_alone(const OpDef& op, std::span<const Tensor> outputs, bool finished) noexcept override {
    compile_detail::ran_alone(op, outputs, finished);
  }
  void before_use(const Tensor& t) override { compile_detail::before_use(t); }
  void before_ready(const Tensor& t, std::function<void()> after_run) override {
    compile_detail::before_ready(t, std::move(after_run));
  }
  bool holds(const Tensor& t) override { return compile_detail::holds(t); }
  bool hold_product(step::HeldProduct p) override { return compile_detail::hold_product(std::move(p)); }
  std::optional<step::HeldProduct> take_held(const Tensor& t) override { return compile_detail::take_held(t); }
  bool hold_sums(step::HeldProduct p) override { return compile_detail::hold_sums(std::move(p)); }
  std::optional<step::HeldProduct> take_sums(const Tensor& t) override { return compile_detail::take_sums(t); }
  std::optional<Tensor> input_cast(const Tensor& t, DType to) override { return compile_detail::input_cast(t, to); }
  std::optional<Tensor> input_gather(const Tensor& source, const Tensor& index) override {
    return compile_detail::input_gather(source, index);
  }
};

CaptureAndFusion g_step_compiler;
const bool g_installed = (step::install(g_step_compiler), true);

}  // namespace
}  // namespace kiln::compile_detail
