// Pointwise fusion inside compiled calls: ops are held back at dispatch, and a pending group
// becomes one generated kernel that splices each op's device expression (its OpDef) in order.
// Any dtypes mix in a group (autocast's casts join their neighbours); tensor-scalar ops join
// with their scalar as a literal.
#include "fusion.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/registry.h"
#include "core/tensor/tensor_impl.h"
#include "fusion_group.h"
#include "kiln/runtime/log.h"
#include "step_groups.h"

namespace kiln::compile_detail {

struct Fusion {
  Device device;
  std::vector<Pending> ops;
  std::vector<const void*> storages;  // of every pending input and output
  int running_alone = 0;              // ops declined and not yet run: an op run inside another is not a group
  std::optional<step::HeldProduct> held{};
  std::vector<step::HeldProduct> sums{};  // split sums held for the step's update (hold_sums)
};

thread_local Fusion* t_fusion = nullptr;

namespace {

const void* storage_of(const Tensor& t) { return t.impl()->storage.get(); }

// The expression op runs: its own, or for a tensor-scalar op its binary op's (found by name).
const PointwiseExpr* expression_of(const OpDef& op) {
  if (const PointwiseExpr* pw = pointwise_expr(op)) return pw;
  if (!op.scalar_form) return nullptr;
  const OpDef* binary = find_op(op.scalar_form->binary);
  return binary ? pointwise_expr(*binary) : nullptr;
}

bool eligible(const Fusion& f, const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) {
  if (outputs.size() != 1 || args.device != f.device) return false;
  const std::size_t n = args.inputs.size();
  if (op.scalar_form ? n != 1 : (n != 1 && n != 2)) return false;
  if (outputs[0].numel() == 0 || outputs[0].dim() > kernels::kMaxDims) return false;
  for (const Tensor& in : args.inputs)
    if (in.dtype() != args.inputs[0].dtype() || in.device() != f.device) return false;
  return true;
}

// Why op cannot join the pending group (the same shape, room for its operands, and no input
// that views a pending output in another layout), or nullptr when it can.
const char* cut_before(const Fusion& f, std::span<const Tensor> inputs, const Tensor& out) {
  if (f.ops.empty()) return nullptr;
  if (out.shape() != f.ops.front().output.shape()) return "the next pointwise op has another shape";
  for (const Tensor& in : inputs)
    if (producer(f.ops, in) < 0 && std::find(f.storages.begin(), f.storages.end(), storage_of(in)) != f.storages.end())
      for (const Pending& p : f.ops)
        if (storage_of(p.output) == storage_of(in)) return "the next pointwise op reads a view of a pending result";
  // Operands with op: the group's outside inputs, those of op's inputs that are new, and
  // every output (op's included).
  std::vector<Tensor> ext = outside_inputs(f.ops);
  for (const Tensor& in : inputs)
    if (producer(f.ops, in) < 0 &&
        std::none_of(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); }))
      ext.push_back(in);
  if (static_cast<int>(ext.size() + f.ops.size() + 1) > kernels::kMaxFusedOperands)
    return "the next pointwise op would pass the fused kernel's operand limit";
  return nullptr;
}

// The group's ops as "mul, add, relu", for the debug log of fusion decisions.
std::string op_names(const std::vector<Pending>& ops) {
  std::string names;
  for (const Pending& p : ops) names.append(names.empty() ? "" : ", ").append(p.op->name);
  return names;
}

void run(std::vector<Pending> ops, const char* why) {
  const bool logged = rt::log().should_log(spdlog::level::debug);
  const std::vector<Tensor> ext = outside_inputs(ops);
  // An output is written when something outside the group holds it (a later op, autograd,
  // the caller) or shares its storage.
  std::vector<int> stored;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const Tensor& out = ops[k].output;
    long internal = 1;  // this Pending's own handle
    for (const Pending& p : ops)
      for (const Tensor& in : p.inputs) internal += in.impl() == out.impl();
    if (out.impl_ptr().use_count() > internal || out.impl()->storage.use_count() > 1) stored.push_back(static_cast<int>(k));
  }
  if (logged || recording_groups()) {
    const std::string result = stored.empty()    ? "nothing outside reads the results, so none runs"
                               : ops.size() == 1 ? "alone, the op's own kernel"
                                                 : "one kernel writing " + std::to_string(stored.size()) + " of " +
                                                       std::to_string(ops.size()) + " results";
    const std::string shape = shape_str(ops.front().output.shape());
    rt::log().debug("[fuse] {} op{} ({}) over {}, ended as {}: {}", ops.size(), ops.size() == 1 ? "" : "s",
                    op_names(ops), shape, why, result);
    std::vector<std::string> names;
    for (const Pending& p : ops) names.push_back(p.op->name);
    record_group({std::move(names), shape, result, why});
  }
  if (stored.empty()) return;  // nothing can see the results
  if (ops.size() == 1) {
    // Alone, an op runs its own kernel: vectorized for contiguous operands, and no module to build.
    Pending& p = ops.front();
    p.op->gpu(OpArgs{*p.op, p.inputs, p.attrs, p.output.device()}, std::span<Tensor>(&p.output, 1));
    return;
  }
  const Shape shape = ops.front().output.shape();
  std::vector<kernels::Operand> operands;
  for (int k : stored) operands.push_back(gpu::operand(ops[static_cast<std::size_t>(k)].output));
  for (const Tensor& e : ext) operands.push_back(gpu::operand(e, shape));
  kernels::launch_fused(describe(ops, ext, stored), shape, operands, stream_of(ops.front().output.device()));
}

// Runs the pending group; `why` it ends goes to the debug log.
void flush_group(const char* why) {
  Fusion* f = t_fusion;
  if (!f || f->ops.empty()) return;
  std::vector<Pending> ops = std::move(f->ops);
  f->ops.clear();
  f->storages.clear();  // cleared first: the launch takes addresses, which must not flush again
  run(std::move(ops), why);
}

// Launches the held product alone (taken out first: its launch takes no addresses, but must not
// find itself held).
void run_held(Fusion& f) {
  if (!f.held) return;
  const std::function<void()> run = std::move(f.held->run);
  f.held.reset();
  run();
}

// Launches the held sums that `pick` selects (taken out of the list first: their launches take
// addresses, which must not find them held).
template <class Pick>
void run_sums(Fusion& f, Pick&& pick) {
  std::vector<step::HeldProduct> picked;
  for (auto it = f.sums.begin(); it != f.sums.end();) {
    if (!pick(*it)) {
      ++it;
      continue;
    }
    picked.push_back(std::move(*it));
    it = f.sums.erase(it);
  }
  for (step::HeldProduct& p : picked) {
    p.run();
    if (p.after_run) p.after_run();
  }
}

bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.impl()->storage.get() == b.impl()->storage.get() && a.offset() == b.offset() &&
         a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype();
}

}  // namespace

bool defer_pointwise(const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) {
  Fusion* f = t_fusion;
  if (!f) return false;
  const PointwiseExpr* expr = expression_of(op);
  if (!expr || !eligible(*f, op, args, outputs)) {
    if (!op.makes_outputs) ++f->running_alone;  // ran_alone follows, once the op has run
    return false;
  }
  if (const char* why = cut_before(*f, args.inputs, outputs[0])) flush_group(why);
  Pending p{&op, expr, pointwise_params(op, args.attrs), {args.inputs.begin(), args.inputs.end()}, outputs[0], args.attrs};
  if (op.scalar_form) {
    const Scalar s = args.attrs.get<Scalar>("scalar");
    p.scalar = s.is_floating() ? kernels::Scalar(s.to_double()) : kernels::Scalar(s.to_int());
    p.scalar_first = op.scalar_form->scalar_first;
  }
  for (const Tensor& in : p.inputs) f->storages.push_back(storage_of(in));
  f->storages.push_back(storage_of(p.output));
  f->ops.push_back(std::move(p));
  return true;
}

void ran_alone(const OpDef& op, std::span<const Tensor> outputs, bool finished) noexcept {
  Fusion* f = t_fusion;
  if (!f || op.makes_outputs || --f->running_alone > 0 || !finished) return;
  // Listed once it has run: the groups its inputs flushed come first, as their kernels did.
  const char* result = expression_of(op) ? "alone: its operands' dtypes, devices or shape do not fit a fused kernel"
                                         : "its own kernel: not a pointwise op";
  try {
    rt::log().debug("[fuse] {} runs {}", op.name, result);
    if (recording_groups())
      record_group({{op.name},
                    outputs.empty() || !outputs[0].defined() ? std::string("()") : shape_str(outputs[0].shape()),
                    result,
                    ""});
  } catch (const std::exception& e) {
    rt::log().error("[fuse] recording {}: {}", op.name, e.what());
  }
}

void before_use(const Tensor& t) {
  Fusion* f = t_fusion;
  if (f && f->held) run_held(*f);
  if (f && !f->sums.empty() && t.defined())
    run_sums(*f, [&](const step::HeldProduct& p) { return storage_of(p.output) == storage_of(t); });
  if (!f || f->ops.empty() || !t.defined()) return;
  if (std::find(f->storages.begin(), f->storages.end(), storage_of(t)) != f->storages.end())
    flush_group("other work reads or writes a value it holds");
}

namespace {

step::HeldProduct* sums_for(Fusion* f, const Tensor& t) {
  if (!f) return nullptr;
  for (step::HeldProduct& p : f->sums)
    if (same_view(p.output, t)) return &p;
  return nullptr;
}

}  // namespace

bool holds(const Tensor& t) { return sums_for(t_fusion, t) != nullptr; }

void before_ready(const Tensor& t, std::function<void()> after_run) {
  Fusion* f = t_fusion;
  // A pending group with t in it runs now, and its launch the held sums before it.
  const bool in_group =
      f && !f->ops.empty() && std::find(f->storages.begin(), f->storages.end(), storage_of(t)) != f->storages.end();
  step::HeldProduct* p = sums_for(f, t);
  if (!p || in_group) {
    before_use(t);
    return;
  }
  p->after_run = std::move(after_run);
}

bool hold_product(step::HeldProduct p) {
  Fusion* f = t_fusion;
  if (!f || !p.output.defined() || p.output.device() != f->device) return false;
  run_held(*f);
  f->held = std::move(p);
  return true;
}

std::optional<step::HeldProduct> take_held(const Tensor& t) {
  Fusion* f = t_fusion;
  if (!f || !f->held) return std::nullopt;
  if (!same_view(f->held->output, t)) {
    run_held(*f);
    return std::nullopt;
  }
  std::optional<step::HeldProduct> p = std::move(f->held);
  f->held.reset();
  return p;
}

bool hold_sums(step::HeldProduct p) {
  Fusion* f = t_fusion;
  if (!f || !p.output.defined() || p.output.device() != f->device) return false;
  // Sums already held for the same storage run first: one gradient, one pending write.
  run_sums(*f, [&](const step::HeldProduct& q) { return storage_of(q.output) == storage_of(p.output); });
  f->sums.push_back(std::move(p));
  return true;
}

std::optional<step::HeldProduct> take_sums(const Tensor& t) {
  Fusion* f = t_fusion;
  step::HeldProduct* p = sums_for(f, t);
  if (!p) return std::nullopt;
  step::HeldProduct taken = std::move(*p);
  f->sums.erase(f->sums.begin() + (p - f->sums.data()));
  return taken;
}

FusionScope::FusionScope(Device device) {
  if (t_fusion || !device.is_cuda()) return;
  own_ = new Fusion{device, {}, {}};
  t_fusion = own_;
  step::g_fusions.fetch_add(1);
}

FusionScope::~FusionScope() {
  if (!own_) return;
  t_fusion = nullptr;
  step::g_fusions.fetch_sub(1);
  delete own_;
}

void FusionScope::finish() {
  if (!own_) return;
  run_held(*own_);
  run_sums(*own_, [](const step::HeldProduct&) { return true; });
  flush_group("the compiled call ended");
}

}  // namespace kiln::compile_detail
