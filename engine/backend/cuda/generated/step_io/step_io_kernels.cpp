// Kernel specs and launchers of kernel_templates/step_io.cu.
#include "step_io_kernels.h"

#include <algorithm>

#include "kiln/runtime/device.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

// The kernels take no dtype: they take the runtime's tuple for sources without placeholders,
// which keeps them in the registry `jitcc warm` walks.
const rt::KernelSpec& register_step_entry(const char* op, const char* entry) {
  rt::KernelSpec s;
  s.op = op;
  s.template_name = "step_io";
  s.entry = entry;
  s.dtypes = {rt::generated_dtypes()};
  s.bind = [](const DTypes&, std::uint32_t) { return rt::Bindings{{"PRELUDE", rt::device_prelude(DTypes{})}}; };
  return rt::register_kernel(std::move(s));
}

const rt::KernelSpec& kStore = register_step_entry("store_words", "kiln_store_words");
const rt::KernelSpec& kCopy = register_step_entry("copy_inputs", "kiln_copy_inputs");

rt::Function step_function(const rt::KernelSpec& spec, int device) {
  return rt::get_function(spec, rt::generated_dtypes(), 0, device);
}

// Both kernels take their arguments by value in structs laid out as in step_io.cu.
struct WordsArg {
  std::uint64_t w[8];
};
struct CopiesArg {
  std::uint64_t dst[8], src[8], bytes[8];
  std::uint64_t index[8], rows[8], index_count[8];
  int convert[8];
  int count, stores;
  std::uint64_t store_dst[4];
  int store_count[4];
  WordsArg store_words[4];
};
static_assert(InputCopies::kMax == 8 && InputCopies::kMaxStores == 4, "step_io.cu's InputCopies");

WordsArg words_arg(const StepWords& words) {
  WordsArg a{};
  std::copy(words.begin(), words.end(), a.w);
  return a;
}

CopiesArg copies_arg(const InputCopies& c) {
  CopiesArg a{};
  std::copy(c.dst, c.dst + 8, a.dst);
  std::copy(c.src, c.src + 8, a.src);
  std::copy(c.bytes, c.bytes + 8, a.bytes);
  std::copy(c.index, c.index + 8, a.index);
  std::copy(c.rows, c.rows + 8, a.rows);
  std::copy(c.index_count, c.index_count + 8, a.index_count);
  for (int i = 0; i < 8; ++i) a.convert[i] = static_cast<int>(c.convert[i]);
  a.count = c.count;
  a.stores = c.store_count;
  for (int i = 0; i < c.store_count; ++i) {
    a.store_dst[i] = c.stores[i].dst;
    a.store_count[i] = c.stores[i].count;
    a.store_words[i] = words_arg(c.stores[i].words);
  }
  return a;
}

}  // namespace

void load_step_kernels(int device) {
  step_function(kStore, device);
  step_function(kCopy, device);
}

void launch_store_words(rt::DevicePtr dst, const StepWords& words, int count, const rt::Stream& s) {
  const WordsArg a = words_arg(words);
  rt::LaunchConfig cfg;
  cfg.block.x = 32;
  rt::launch(step_function(kStore, s.device()), cfg, s, dst, a, count);
}

void launch_copy_inputs(const InputCopies& copies, const rt::Stream& s) {
  if (copies.count == 0) return;
  std::uint64_t most = 0;  // bytes written
  for (int i = 0; i < copies.count; ++i)
    most = std::max(most, copies.index[i] ? copies.bytes[i] * copies.index_count[i] : copies.bytes[i]);
  const CopiesArg a = copies_arg(copies);
  rt::LaunchConfig cfg = rt::linear_config(std::max<std::uint64_t>(most / 16, 1), 256, 1024);
  cfg.grid.y = static_cast<unsigned>(copies.count);
  rt::launch(step_function(kCopy, s.device()), cfg, s, a);
}

void set_store_args(rt::Graph& g, void* node, rt::DevicePtr dst, const StepWords& words, int count) {
  WordsArg a = words_arg(words);
  void* args[] = {&dst, &a, &count};
  g.set_kernel_args(node, args);
}

void set_copy_args(rt::Graph& g, void* node, const InputCopies& copies) {
  CopiesArg a = copies_arg(copies);
  void* args[] = {&a};
  g.set_kernel_args(node, args);
}

}  // namespace kiln::kernels
