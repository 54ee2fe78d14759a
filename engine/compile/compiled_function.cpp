// kiln::compile: per input signature an eager call, then a captured CUDA graph that later
// calls replay (see kiln/compile.h for the rules a compiled function follows).
#include <algorithm>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "backend/cuda/grad_stream.h"
#include "capture_context.h"
#include "core/registry.h"
#include "fusion.h"
#include "input_work.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "kiln/compile.h"
#include "kiln/creation.h"
#include "kiln/error.h"
#include "kiln/random.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/memory.h"
#include "step_groups.h"

namespace kiln {

using compile_detail::CaptureContext;
using compile_detail::CompiledCall;
using compile_detail::InputWork;
using compile_detail::InputWorkScope;
using compile_detail::ReplayAction;
using kernels::InputCopies;

namespace {

// One signature: eager once, then captured.
struct Entry {
  std::string signature;
  int eager_calls = 0;
  bool captured = false;
  Device device;
  std::shared_ptr<rt::PrivatePool> pool;
  std::vector<Tensor> static_inputs, outputs;
  InputWork input_work;           // noted by the eager calls; the capture's input copy does it
  std::vector<void*> copy_nodes;  // one per InputCopies::kMax inputs
  std::shared_ptr<kernels::InputCopies> word_stores;  // the first copy's, refreshed by actions
  std::vector<ReplayAction> actions;
  std::vector<std::shared_ptr<const void>> kept;
  std::vector<Tensor> rng_states;
  rt::Graph graph;

  ~Entry() {
    // A replay may still be running: it must finish before its memory goes.
    if (graph) {
      try {
        stream_of(device).synchronize();
      } catch (const std::exception&) {  // the context is gone or broken: nothing left to wait for
      }
    }
    graph = rt::Graph();
  }
};

// A captured step's kernels and its longest chain's, in order, at debug level: where the step's
// time goes before any profiler runs.
void log_captured(const rt::GraphCounts& c) {
  if (!rt::log().should_log(spdlog::level::debug)) return;
  std::string chain;
  for (const std::string& k : c.longest_chain_kernels) chain += (chain.empty() ? "" : " -> ") + k;
  rt::log().debug("[compile] captured a step of {} kernels ({} launched early); its longest chain, {}: {}", c.kernels,
                  c.programmatic_edges, c.longest_kernel_chain, chain);
}

std::vector<Tensor> detached(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(t.defined() ? t.detach() : t);
  return out;
}

// The input copies of one replay: static buffer <- the caller's (contiguous) input, then the
// work done on the inputs (casts, gathers) into its made tensors.
std::vector<InputCopies> input_copies(const std::vector<Tensor>& statics, const InputWork& work,
                                      const std::vector<Tensor>& inputs) {
  std::vector<InputCopies> out;
  std::size_t n = 0;
  for (std::size_t i = 0; i < statics.size(); ++i) {
    if (n++ % InputCopies::kMax == 0) out.emplace_back();
    InputCopies& c = out.back();
    c.dst[c.count] = device_address(statics[i]);
    c.src[c.count] = device_address(inputs[i]);
    c.bytes[c.count] = static_cast<std::uint64_t>(inputs[i].numel()) * inputs[i].element_size();
    ++c.count;
  }
  compile_detail::add_copies(work, inputs, out, n);
  return out;
}

// The input copies' arguments for this call's inputs, the first with the step's word stores.
void set_copy_args(Entry& e, const std::vector<Tensor>& inputs) {
  std::vector<InputCopies> copies = input_copies(e.static_inputs, e.input_work, inputs);
  if (e.word_stores && !copies.empty()) {
    std::copy(std::begin(e.word_stores->stores), std::end(e.word_stores->stores), std::begin(copies[0].stores));
    copies[0].store_count = e.word_stores->store_count;
  }
  for (std::size_t i = 0; i < copies.size(); ++i) kernels::set_copy_args(e.graph, e.copy_nodes[i], copies[i]);
}

}  // namespace

struct CompiledFunction::Impl {
  StepFunction fn;
  CompileOptions options;
  std::list<Entry> entries;  // most recently used first
  CompileStats counts;

  Device device_of(const std::vector<Tensor>& inputs) const {
    std::optional<Device> dev = options.device;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].defined()) throw ValueError("[compile] input " + std::to_string(i) + " is an undefined tensor");
      if (i == 0) dev = inputs[i].device();
      else if (inputs[i].device() != *dev)
        throw DeviceError("[compile] inputs on " + dev->str() + " and " + inputs[i].device().str() +
                          "; a compiled function runs on one device");
    }
    return dev.value_or(Device::cpu());
  }

  std::string signature(const std::vector<Tensor>& inputs) const {
    std::string sig = (grad_enabled() ? "grad|" : "nograd|") + device_of(inputs).str();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      if (t.requires_grad())
        throw ValueError("[compile] input " + std::to_string(i) +
                         " requires grad: inputs are data copied into the graph; a step's parameters come from its closure");
      sig.append("|").append(dtype_name(t.dtype())).append(shape_str(t.shape()));
    }
    // Autocast changes the dtypes of the captured work, as grad mode changes what is recorded.
    if (const auto amp = autocast_dtype()) sig += "|autocast=" + std::string(dtype_name(*amp));
    if (options.key) sig += "|key=" + options.key();
    return sig;
  }

  std::list<Entry>::iterator find(const std::string& sig) {
    for (auto it = entries.begin(); it != entries.end(); ++it)
      if (it->signature == sig) return it;
    return entries.end();
  }

  // `work` (null: none noted) gets the work the step asks of its inputs (input_work.h).
  std::vector<Tensor> eager(const std::vector<Tensor>& inputs, Device device, InputWork* work) {
    CompiledCall call;
    ++counts.eager_calls;
    std::optional<InputWorkScope> noted;
    if (work) noted.emplace(inputs, *work, false);
    compile_detail::FusionScope fuse(options.fuse ? device : Device::cpu());
    std::vector<Tensor> out = fn(inputs);
    if (noted) noted->finish();
    fuse.finish();
    return detached(out);
  }

  std::vector<Tensor> capture(Entry& e, const std::vector<Tensor>& inputs);
  std::vector<Tensor> replay(Entry& e, const std::vector<Tensor>& inputs);
};

std::vector<Tensor> CompiledFunction::Impl::capture(Entry& e, const std::vector<Tensor>& inputs) {
  const rt::Stream& stream = stream_of(e.device);
  auto pool = std::make_shared<rt::PrivatePool>(e.device.index(), stream.handle());
  CaptureContext ctx{.device = e.device, .stream = &stream};
  std::vector<Tensor> statics, outs;
  kernels::load_step_kernels(e.device.index());
  rt::bind_private_pool(stream, pool);
  bool began = false;
  try {
    for (const Tensor& t : inputs) statics.push_back(empty(t.shape(), {.dtype = t.dtype(), .device = e.device}));
    for (compile_detail::InputCast& c : e.input_work.casts)
      c.made = empty(inputs[c.input].shape(), {.dtype = c.dtype, .device = e.device});
    for (compile_detail::InputGather& g : e.input_work.gathers) {
      Shape shape = g.source.shape();
      shape[0] = inputs[g.input].numel();
      g.made = empty(shape, {.dtype = g.source.dtype(), .device = e.device});
    }
    CompiledCall call;
    compile_detail::set_capture(&ctx);
    rt::begin_capture(stream);
    began = true;
    std::vector<void*> nodes;
    for (const InputCopies& c : input_copies(statics, e.input_work, inputs)) {
      kernels::launch_copy_inputs(c, stream);
      nodes.push_back(rt::last_captured_node(stream));
    }
    if (!nodes.empty()) ctx.input_copy = std::make_shared<InputCopies>();
    {
      InputWorkScope work(statics, e.input_work, true);
      compile_detail::FusionScope fuse(options.fuse ? e.device : Device::cpu());
      outs = fn(statics);
      work.finish();
      fuse.finish();
    }
    for (const Tensor& t : outs) compile_detail::keep_alive(t);
    for (compile_detail::CapturedRng& r : ctx.rngs) {
      if (r.gen->seed() != r.seed || r.gen->offset() < r.base)
        throw ValueError("[compile] the step reseeded or rewound a generator it draws from; seed it outside the compiled function");
      *r.blocks = r.gen->offset() - r.base;
      e.rng_states.push_back(r.state);
    }
    compile_detail::set_capture(nullptr);
    began = false;
    e.graph = rt::Graph::end_capture(stream);
    log_captured(e.graph.counts());
    e.copy_nodes = std::move(nodes);
    e.word_stores = std::move(ctx.input_copy);
  } catch (...) {
    compile_detail::set_capture(nullptr);
    if (began) rt::abort_capture(stream);
    e.rng_states.clear();
    e.input_work.clear_made();  // the pool's, which goes
    rt::unbind_private_pool(stream);
    throw;
  }
  rt::unbind_private_pool(stream);
  e.pool = std::move(pool);
  e.static_inputs = std::move(statics);
  e.outputs = detached(outs);
  e.actions = std::move(ctx.actions);
  for (auto& [key, storage] : ctx.kept) e.kept.push_back(std::move(storage));
  e.captured = true;
  ++counts.captures;
  set_copy_args(e, inputs);  // the word stores, with the words of this call
  e.graph.launch(stream);    // the capturing call's own step
  return e.outputs;
}

// `inputs` are contiguous (the caller made them so).
std::vector<Tensor> CompiledFunction::Impl::replay(Entry& e, const std::vector<Tensor>& inputs) {
  for (ReplayAction& a : e.actions) a(e.graph);  // refreshes e.word_stores among others
  set_copy_args(e, inputs);
  e.graph.launch(stream_of(e.device));
  ++counts.replays;
  return e.outputs;
}

CompiledFunction::CompiledFunction(StepFunction fn, CompileOptions options) : impl_(std::make_unique<Impl>()) {
  if (!fn) throw ValueError("[compile] the function is empty");
  if (options.max_graphs == 0) throw ValueError("[compile] max_graphs must be at least 1");
  if (options.warmup_calls < 1) throw ValueError("[compile] warmup_calls must be at least 1");
  impl_->fn = std::move(fn);
  impl_->options = std::move(options);
}

CompiledFunction::~CompiledFunction() = default;
CompiledFunction::CompiledFunction(CompiledFunction&&) noexcept = default;
CompiledFunction& CompiledFunction::operator=(CompiledFunction&&) noexcept = default;

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& inputs) {
  if (!impl_) throw ValueError("[compile] the compiled function was moved from");
  Impl& m = *impl_;
  if (step::in_compiled_call()) throw ValueError("[compile] a compiled function cannot call a compiled function");
  const Device device = m.device_of(inputs);
  if (device.is_cpu()) return m.eager(inputs, device, nullptr);
  const std::string sig = m.signature(inputs);
  // The capture sees contiguous static buffers; the eager calls get contiguous inputs too, so
  // they load the same kernel variants (a strided input picks another one).
  std::vector<Tensor> dense;
  for (const Tensor& t : inputs) dense.push_back(t.is_contiguous() ? t : t.contiguous());
  if (rt::shape_only()) {
    // A kernel plan's pass: the first call, then one as the capture's call, which finds the
    // state the first left (gradients to zero, say), and the capture's own kernels.
    InputWork work;  // the same kernels as the real calls: the input copy's work
    m.eager(dense, device, &work);
    work = InputWork();
    const compile_detail::RecordStep record(sig);  // the capture's groups, for the plan
    std::vector<Tensor> out = m.eager(dense, device, &work);
    m.counts.eager_calls -= 2;
    kernels::load_step_kernels(device.index());
    return out;
  }
  auto it = m.find(sig);
  if (it == m.entries.end()) {
    InputWork work;
    std::vector<Tensor> out = m.eager(dense, device, &work);
    // Made only after the eager call succeeded, so a failing first call captures nothing later.
    if (m.entries.size() >= m.options.max_graphs) {
      m.entries.pop_back();
      ++m.counts.evictions;
    }
    m.entries.emplace_front();
    m.entries.front().signature = sig;
    m.entries.front().device = device;
    m.entries.front().eager_calls = 1;
    m.entries.front().input_work = std::move(work);
    return out;
  }
  m.entries.splice(m.entries.begin(), m.entries, it);  // most recently used first
  Entry& e = m.entries.front();
  if (!e.captured && e.eager_calls < m.options.warmup_calls) {
    e.input_work = InputWork();  // the latest call's
    std::vector<Tensor> out = m.eager(dense, device, &e.input_work);
    ++e.eager_calls;
    return out;
  }
  if (!e.captured) return m.capture(e, dense);
  return m.replay(e, dense);
}

CompileStats CompiledFunction::stats() const {
  if (!impl_) return {};
  CompileStats s = impl_->counts;
  for (const Entry& e : impl_->entries) {
    if (!e.captured) continue;
    ++s.graphs;
    const rt::GraphCounts c = e.graph.counts();
    s.kernels_per_graph.push_back(c.kernels);
    s.nodes_per_graph.push_back(c.nodes);
    s.kernel_names_per_graph.push_back(c.kernel_names);
    s.programmatic_edges_per_graph.push_back(c.programmatic_edges);
    s.kernel_chain_per_graph.push_back(c.longest_kernel_chain);
    s.chain_kernels_per_graph.push_back(c.longest_chain_kernels);
    s.bytes_held += e.pool ? e.pool->bytes_held() : 0;
    s.bytes_live_peak += e.pool ? e.pool->peak_in_use() : 0;
  }
  return s;
}

CompiledFunction compile(StepFunction fn, CompileOptions options) { return CompiledFunction(std::move(fn), std::move(options)); }

bool in_compiled_call() { return step::in_compiled_call(); }
bool capturing() { return step::capturing(); }

void set_weight_grad_stream(bool on) { grad_stream::set_enabled(on); }
bool weight_grad_stream() { return grad_stream::enabled(); }

}  // namespace kiln
