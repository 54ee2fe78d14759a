#include "kiln/runtime/graph.h"

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_bundle.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "quick_tier_registry.h"

namespace kiln::rt {

namespace {

thread_local CUstream capturing_stream = nullptr;

CUstream checked_stream(const Stream& s, const char* op) {
  if (!s) {
    driver();  // without a GPU, say why rather than "empty"
    throw DeviceError(std::string("[graph] ") + op + " needs a stream; this one is empty");
  }
  return static_cast<CUstream>(s.handle());
}

// The kernel nodes' function names (entry names), "?" where a node has none.
std::string kernel_node_name(CUgraphNode node) {
  CUDA_KERNEL_NODE_PARAMS p{};
  const char* name = nullptr;
  KILN_CU(cuGraphKernelNodeGetParams(node, &p));
  if (p.func) KILN_CU(cuFuncGetName(&name, p.func));
  return name ? std::string(entry_name_of(name)) : "?";
}

// The kernels of one path from a root to a leaf with the most kernels, in order (Kahn's
// topological order, each node remembering the longest path's last kernel before it).
std::vector<std::string> longest_kernel_chain(const std::vector<CUgraphNode>& nodes,
                                              const std::vector<CUgraphNode>& from,
                                              const std::vector<CUgraphNode>& to) {
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::unordered_map<CUgraphNode, std::size_t> index;
  for (std::size_t i = 0; i < nodes.size(); ++i) index.emplace(nodes[i], i);
  std::vector<std::vector<std::size_t>> next(nodes.size());
  std::vector<std::size_t> waiting(nodes.size(), 0), chain(nodes.size(), 0), ready;
  // The last kernel on the longest path into node i (i itself once it is a kernel), and the
  // kernel before each kernel on its path.
  std::vector<std::size_t> tail(nodes.size(), kNone), before(nodes.size(), kNone);
  for (std::size_t e = 0; e < from.size(); ++e) {
    next[index.at(from[e])].push_back(index.at(to[e]));
    ++waiting[index.at(to[e])];
  }
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (waiting[i] == 0) ready.push_back(i);
  std::size_t longest = 0, end = kNone;
  while (!ready.empty()) {
    const std::size_t i = ready.back();
    ready.pop_back();
    CUgraphNodeType type{};
    KILN_CU(cuGraphNodeGetType(nodes[i], &type));
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
      ++chain[i];
      before[i] = tail[i];
      tail[i] = i;
    }
    if (chain[i] > longest) longest = chain[i], end = tail[i];
    for (std::size_t j : next[i]) {
      if (chain[i] > chain[j] || tail[j] == kNone) chain[j] = chain[i], tail[j] = tail[i];
      if (--waiting[j] == 0) ready.push_back(j);
    }
  }
  std::vector<std::string> names;
  for (std::size_t k = end; k != kNone; k = before[k]) names.push_back(kernel_node_name(nodes[k]));
  std::reverse(names.begin(), names.end());
  return names;
}

// `p` runs `full`, with the shared memory opt-in a launch of it would have made.
void take_full_build(CUDA_KERNEL_NODE_PARAMS& p, const Function& full) {
  p.func = static_cast<CUfunction>(full.handle);
  if (p.sharedMemBytes > 48 * 1024)
    KILN_CU(cuFuncSetAttribute(p.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               static_cast<int>(p.sharedMemBytes)));
}

}  // namespace

bool thread_capturing() { return capturing_stream != nullptr; }

void begin_capture(const Stream& s) {
  CUstream stream = checked_stream(s, "begin_capture");
  if (capturing_stream) throw ValueError("[graph] this thread is already capturing a graph; captures do not nest");
  if (shape_only()) throw ValueError("[graph] a shape-only pass runs nothing, so it cannot capture a graph");
  make_current(s.device());
  KILN_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  capturing_stream = stream;
}

namespace {

std::vector<void*> frontier_of(const Stream& s, const char* op) {
  CUstream stream = checked_stream(s, op);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUgraphNode* deps = nullptr;
  std::size_t count = 0;
  KILN_CU(cuStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, nullptr, &count));
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return {};
  return {deps, deps + count};
}

}  // namespace

std::vector<void*> capture_frontier(const Stream& s) { return frontier_of(s, "capture_frontier"); }

void* last_captured_node(const Stream& s) {
  const std::vector<void*> frontier = frontier_of(s, "last_captured_node");
  if (frontier.size() != 1)
    throw ValueError("[graph] last_captured_node: the stream is not capturing a single chain of work");
  return frontier[0];
}

void abort_capture(const Stream& s) noexcept {
  CUstream stream = static_cast<CUstream>(s.handle());
  if (capturing_stream == stream) capturing_stream = nullptr;
  const Driver* d = try_driver(nullptr);
  if (!d || !stream) return;
  CUgraph g = nullptr;
  d->cuStreamEndCapture(stream, &g);  // fails when the capture was invalidated: nothing to keep either way
  if (g) d->cuGraphDestroy(g);
}

struct Graph::Impl {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  int device = -1;
  GraphCounts counts;
  // Captured parameters of the nodes whose arguments are replaced, by node (their function
  // as swapped since).
  std::unordered_map<CUgraphNode, CUDA_KERNEL_NODE_PARAMS> kernel_params;
  // Kernel nodes captured with a quick build whose full build has not replaced it yet, and the
  // tier generation they were last looked at in.
  std::vector<CUgraphNode> quick_nodes;
  std::uint64_t seen_generation = 0;

  // Nodes whose quick builds have a full one by now run it from this launch on: their function
  // is swapped in the instantiated graph, their arguments and launch shape as captured. A node
  // whose arguments set_kernel_args replaces takes its full build there, with its arguments.
  void swap_full_builds() {
    const std::uint64_t generation = tier_generation();
    if (generation == seen_generation) return;
    seen_generation = generation;
    std::erase_if(quick_nodes, [this](CUgraphNode node) {
      if (kernel_params.count(node)) return false;
      CUDA_KERNEL_NODE_PARAMS p{};
      KILN_CU(cuGraphKernelNodeGetParams(node, &p));
      const std::optional<Function> full = full_build_of(p.func);
      if (!full) return false;
      take_full_build(p, *full);
      KILN_CU(cuGraphExecKernelNodeSetParams(exec, node, &p));
      return true;
    });
  }

  ~Impl() {
    const Driver* d = try_driver(nullptr);
    if (!d) return;
    if (exec && d->cuGraphExecDestroy(exec) != CUDA_SUCCESS) log().error("[graph] cuGraphExecDestroy failed");
    if (graph) d->cuGraphDestroy(graph);
  }
};

Graph::Graph() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&& o) noexcept = default;
Graph& Graph::operator=(Graph&& o) noexcept = default;
Graph::operator bool() const { return impl_ && impl_->exec; }

Graph Graph::end_capture(const Stream& s) {
  CUstream stream = checked_stream(s, "end_capture");
  if (capturing_stream != stream) throw ValueError("[graph] end_capture: this thread is not capturing that stream");
  capturing_stream = nullptr;
  Graph out;
  out.impl_ = std::make_unique<Impl>();
  Impl& g = *out.impl_;
  g.device = s.device();
  make_current(g.device);
  KILN_CU(cuStreamEndCapture(stream, &g.graph));
  std::size_t n = 0;
  KILN_CU(cuGraphGetNodes(g.graph, nullptr, &n));
  std::vector<CUgraphNode> nodes(n);
  if (n) KILN_CU(cuGraphGetNodes(g.graph, nodes.data(), &n));
  g.counts.nodes = n;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type{};
    KILN_CU(cuGraphNodeGetType(node, &type));
    if (type != CU_GRAPH_NODE_TYPE_KERNEL) continue;
    ++g.counts.kernels;
    ++g.counts.kernel_names[kernel_node_name(node)];
    CUDA_KERNEL_NODE_PARAMS p{};
    KILN_CU(cuGraphKernelNodeGetParams(node, &p));
    if (p.func && is_quick_handle(p.func)) g.quick_nodes.push_back(node);
  }
  std::size_t edges = 0;
  KILN_CU(cuGraphGetEdges(g.graph, nullptr, nullptr, nullptr, &edges));
  std::vector<CUgraphNode> from(edges), to(edges);
  std::vector<CUgraphEdgeData> data(edges);
  if (edges) KILN_CU(cuGraphGetEdges(g.graph, from.data(), to.data(), data.data(), &edges));
  for (std::size_t i = 0; i < edges; ++i)
    g.counts.programmatic_edges += data[i].type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  g.counts.longest_chain_kernels = longest_kernel_chain(nodes, from, to);
  g.counts.longest_kernel_chain = g.counts.longest_chain_kernels.size();
  // Nodes keep the priority of the stream they were captured on (a high-priority stream's
  // all-reduces), instead of all taking the launching stream's.
  KILN_CU(cuGraphInstantiateWithFlags(&g.exec, g.graph, CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
  KILN_CU(cuGraphUpload(g.exec, stream));
  return out;
}

void Graph::launch(const Stream& s) const {
  if (!*this) throw ValueError("[graph] launch of an empty graph");
  CUstream stream = checked_stream(s, "launch");
  if (s.device() != impl_->device)
    throw DeviceError("[graph] a graph of cuda:" + std::to_string(impl_->device) + " cannot run on a stream of cuda:" +
                      std::to_string(s.device()));
  make_current(impl_->device);
  if (!impl_->quick_nodes.empty()) impl_->swap_full_builds();
  KILN_CU(cuGraphLaunch(impl_->exec, stream));
}

void Graph::set_kernel_args(void* node, void** args) {
  if (!*this) throw ValueError("[graph] set_kernel_args on an empty graph");
  auto key = static_cast<CUgraphNode>(node);
  auto it = impl_->kernel_params.find(key);
  if (it == impl_->kernel_params.end()) {
    CUDA_KERNEL_NODE_PARAMS p{};
    KILN_CU(cuGraphKernelNodeGetParams(key, &p));
    it = impl_->kernel_params.emplace(key, p).first;
  }
  // Only a node captured with a quick build looks for its full one (none where the tier is off).
  if (const auto quick = std::find(impl_->quick_nodes.begin(), impl_->quick_nodes.end(), key);
      quick != impl_->quick_nodes.end())
    if (std::optional<Function> full = full_build_of(it->second.func)) {
      take_full_build(it->second, *full);
      impl_->quick_nodes.erase(quick);
    }
  CUDA_KERNEL_NODE_PARAMS p = it->second;
  p.kernelParams = args;
  p.extra = nullptr;
  KILN_CU(cuGraphExecKernelNodeSetParams(impl_->exec, key, &p));
}

GraphCounts Graph::counts() const { return impl_ ? impl_->counts : GraphCounts{}; }

std::size_t Graph::quick_builds() const { return impl_ ? impl_->quick_nodes.size() : 0; }

}  // namespace kiln::rt
