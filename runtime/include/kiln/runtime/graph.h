#pragma once
// CUDA graphs made by stream capture: begin on a stream, run the work as usual, end to get
// an instantiated graph that replays it. Handles are opaque so engine headers stay plain C++.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::rt {

class Stream;

// True between begin_capture and end_capture/abort_capture on this thread. Work that needs
// the host (loading a module, a staged copy) checks it and throws instead of breaking the capture.
bool thread_capturing();

// Starts capturing `s` (thread-local mode: other threads' CUDA calls are unaffected).
// ValueError when this thread already captures.
void begin_capture(const Stream& s);
// The node the last operation on the capturing stream `s` added, e.g. a kernel launch whose
// arguments change per replay (see Graph::set_kernel_args).
void* last_captured_node(const Stream& s);
// The nodes the next operation on `s` would follow while it captures (empty when it does not):
// equal frontiers at two moments mean nothing was queued on `s` in between.
std::vector<void*> capture_frontier(const Stream& s);
// Ends a failed capture and discards what it recorded; the stream is usable again.
void abort_capture(const Stream& s) noexcept;

struct GraphCounts {
  std::size_t nodes = 0;
  std::size_t kernels = 0;
  std::map<std::string, std::size_t> kernel_names;  // kernel nodes by function name
  // Edges on which a kernel is launched before the one it follows has finished (launch_raw).
  std::size_t programmatic_edges = 0;
  // The most kernels one path through the graph runs in turn: `kernels` for a capture of one
  // stream, fewer where work forked onto another stream overlaps.
  std::size_t longest_kernel_chain = 0;
  // That path's kernels by function name, in the order they run (one such path where several tie).
  std::vector<std::string> longest_chain_kernels;
};

class Graph {
 public:
  Graph();
  // Ends the capture of `s`, instantiates the graph and uploads it to the device. Throws
  // CudaError (the capture is discarded) when capture was invalidated or instantiation failed.
  static Graph end_capture(const Stream& s);
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  explicit operator bool() const;
  void launch(const Stream& s) const;
  // New arguments (as cuLaunchKernel takes them) for a kernel node of this graph, from the
  // next launch on; the function and launch shape stay as captured.
  void set_kernel_args(void* node, void** args);
  GraphCounts counts() const;
  // Kernel nodes still running a quick build (quick_tier.h): captured so, and not yet swapped for
  // their full build, which a launch does once that is loaded (set_kernel_args for a node whose
  // arguments it replaces).
  std::size_t quick_builds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::rt
