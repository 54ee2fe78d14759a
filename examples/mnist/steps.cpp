#include "steps.h"

#include <cstdio>
#include <utility>

namespace mnist {

using namespace kiln;

namespace {

Tensor as_images(const Tensor& x) { return x.reshape({x.size(0), 1, 28, 28}); }

}  // namespace

Step::Step(StepFunction fn, bool compiled, CompileOptions options) {
  if (compiled)
    compiled_.emplace(compile(std::move(fn), std::move(options)));
  else
    fn_ = std::move(fn);
}

std::vector<Tensor> Step::operator()(const std::vector<Tensor>& inputs) {
  return compiled_ ? (*compiled_)(inputs) : fn_(inputs);
}

std::optional<CompileStats> Step::stats() const {
  if (!compiled_) return std::nullopt;
  return compiled_->stats();
}

Step train_step(nn::Module& model, optim::Optimizer& opt, optim::LrScheduler* schedule, bool compiled,
                std::optional<DType> autocast, optim::GradScaler* scaler, dist::GradReducer* reducer) {
  // zero_grad comes first so a compiled step starts from zeroed gradients at every replay.
  auto fn = [&model, &opt, schedule, autocast, scaler, reducer](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard amp(autocast);
      loss = cross_entropy(model(as_images(in[0])), in[1]);
    }
    if (scaler) {
      scaler->scale(loss).backward();
      if (reducer) reducer->finish();
      scaler->step(opt);
      scaler->update();
    } else {
      loss.backward();
      if (reducer)
        reducer->finish(opt);  // each bucket's parameters updated as soon as its all-reduce completes
      else
        opt.step();
    }
    if (schedule) schedule->step();
    return std::vector<Tensor>{loss.detach()};
  };
  return Step(fn, compiled);
}

Step eval_step(nn::Module& model, bool compiled, std::optional<DType> autocast) {
  auto fn = [&model, autocast](const std::vector<Tensor>& in) {
    NoGradGuard no_grad;
    AutocastGuard amp(autocast);
    Tensor logits = model(as_images(in[0]));
    return std::vector<Tensor>{cross_entropy(logits, in[1], Reduction::sum), sum(eq(argmax(logits, 1), in[1]))};
  };
  CompileOptions options;
  options.key = [&model] { return std::string(model.is_training() ? "train" : "eval"); };
  return Step(fn, compiled, std::move(options));
}

std::string describe(const CompileStats& s) {
  std::string kernels, chains;
  for (std::size_t i = 0; i < s.kernels_per_graph.size(); ++i) {
    if (!kernels.empty()) kernels += '/', chains += '/';
    kernels += std::to_string(s.kernels_per_graph[i]);
    chains += std::to_string(i < s.kernel_chain_per_graph.size() ? s.kernel_chain_per_graph[i] : 0);
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%llu captured, %llu replays, kernels per graph %s (longest chain %s), %.1f MiB held (%.1f MiB live at "
                "once at most)",
                static_cast<unsigned long long>(s.captures), static_cast<unsigned long long>(s.replays),
                kernels.empty() ? "none" : kernels.c_str(), kernels.empty() ? "none" : chains.c_str(),
                static_cast<double>(s.bytes_held) / (1 << 20), static_cast<double>(s.bytes_live_peak) / (1 << 20));
  return buf;
}

}  // namespace mnist
