#pragma once
// The kernels a compiled step launches itself (kernel_templates/step_io.cu): words stored on the
// device by each replay (step counts, generator offsets), and the call's inputs copied into the
// graph's static buffers, up to kMax per launch, with up to kMaxStores word stores riding along.
// Their arguments are refreshed in the graph between replays (rt::Graph::set_kernel_args).
#include <array>
#include <cstdint>

#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::rt {
class Graph;
}

namespace kiln::kernels {

using StepWords = std::array<std::uint64_t, 8>;

// words[0, count) to be stored at dst.
struct WordStore {
  rt::DevicePtr dst = 0;
  int count = 0;
  StepWords words{};
};

// What a copy writes: src's bytes, or its f32 values rounded to a half type (the cast kernels'
// bits), so a step's cast of an input costs no kernel of its own (a gather's rows are bytes).
enum class CopyConvert : int { none = 0, f32_to_f16 = 1, f32_to_bf16 = 2 };

struct InputCopies {
  static constexpr int kMax = 8, kMaxStores = 4;
  std::uint64_t dst[kMax] = {}, src[kMax] = {}, bytes[kMax] = {};  // bytes read from src (a gather: a row's)
  // A gather (index nonzero): dst's rows are src's (rows of them) that the i64 index names,
  // index_count of them; an index out of range gives a row of zeros.
  std::uint64_t index[kMax] = {}, rows[kMax] = {}, index_count[kMax] = {};
  CopyConvert convert[kMax] = {};
  int count = 0;
  WordStore stores[kMaxStores] = {};
  int store_count = 0;
};

// Loads both kernels before a capture, which cannot load modules.
void load_step_kernels(int device);
// Stores the first `count` words at dst.
void launch_store_words(rt::DevicePtr dst, const StepWords& words, int count, const rt::Stream& s);
void launch_copy_inputs(const InputCopies& copies, const rt::Stream& s);
// The same launches' arguments, set on their captured nodes.
void set_store_args(rt::Graph& g, void* node, rt::DevicePtr dst, const StepWords& words, int count);
void set_copy_args(rt::Graph& g, void* node, const InputCopies& copies);

}  // namespace kiln::kernels
