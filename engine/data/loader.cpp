// DataLoader: the dataset stays in its stored dtype (u8 for MNIST) where it lives, a batch
// is a gather through the epoch's permutation, and only the batch is cast and normalised.
#include "kiln/data/loader.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "kiln/random.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/memory.h"
#include "kiln/shape_ops.h"

namespace kiln::data {

namespace {

constexpr const char* kWho = "[data.DataLoader] ";

std::uint32_t lo32(std::uint64_t v) { return static_cast<std::uint32_t>(v); }
std::uint32_t hi32(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }

// Fisher-Yates over Philox 4x32-10 with key = seed and counter = (block, epoch): each block
// gives two 64-bit draws, and j = draw * (i + 1) >> 64 (bias below 2^-40 for any real dataset).
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  const std::array<std::uint32_t, 2> key{lo32(seed), hi32(seed)};
  std::array<std::uint32_t, 4> words{};
  std::uint64_t block = 0;
  int used = 2;
  for (std::int64_t i = n - 1; i > 0; --i) {
    if (used == 2) {
      words = philox4x32_10({lo32(block), hi32(block), lo32(epoch), hi32(epoch)}, key);
      ++block;
      used = 0;
    }
    const std::uint64_t draw = (std::uint64_t{words[2 * used]} << 32) | words[2 * used + 1];
    ++used;
    const auto j =
        static_cast<std::int64_t>((static_cast<unsigned __int128>(draw) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

std::size_t bytes_of(const Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

// Under a quarter of what the device can still give: the driver's free memory plus what
// kiln's pool holds unused or in its block cache (freed memory is kept, not returned).
bool fits_on(Device d, std::size_t bytes) {
  const rt::PoolUsage pool = rt::pool_usage(d.index());
  const std::size_t idle = pool.reserved - std::min(pool.used, pool.reserved) + std::min(pool.cached, pool.used);
  return bytes < (rt::free_memory(d.index()) + idle) / 4;
}

}  // namespace

DataLoader::DataLoader(const Tensor& inputs, const Tensor& labels, LoaderOptions options) : o_(std::move(options)) {
  if (!inputs.defined() || !labels.defined()) throw ValueError(std::string(kWho) + "inputs and labels must be defined");
  if (inputs.dim() < 1) throw ShapeError(std::string(kWho) + "inputs must be (N, ...), got a 0-d tensor");
  if (labels.dim() != 1 || labels.size(0) != inputs.size(0))
    throw ShapeError(std::string(kWho) + "labels must be (N) with N = " + std::to_string(inputs.size(0)) + " (inputs " +
                     shape_str(inputs.shape()) + "), got " + shape_str(labels.shape()));
  if (inputs.dtype() == DType::boolean)
    throw DTypeError(std::string(kWho) + "inputs must be of a real dtype, got bool");
  if (!is_integral(labels.dtype()))
    throw DTypeError(std::string(kWho) + "labels must be integers, got " + std::string(dtype_name(labels.dtype())));
  if (o_.batch_size <= 0)
    throw ValueError(std::string(kWho) + "batch_size must be > 0, got " + std::to_string(o_.batch_size));
  if (!std::isfinite(o_.scale) || !std::isfinite(o_.mean) || !std::isfinite(o_.std) || o_.std <= 0)
    throw ValueError(std::string(kWho) + "scale and mean must be finite and std finite and > 0, got scale " +
                     std::to_string(o_.scale) + ", mean " + std::to_string(o_.mean) + ", std " +
                     std::to_string(o_.std));

  NoGradGuard no_grad;
  n_ = inputs.size(0);
  const Tensor x = inputs.detach(), y = labels.detach();
  const std::size_t bytes = bytes_of(x) + static_cast<std::size_t>(n_) * sizeof(std::int64_t);
  resident_ = o_.device.is_cpu() || (!o_.keep_on_host && (x.device() == o_.device || fits_on(o_.device, bytes)));
  const Device home = resident_ ? o_.device : Device::cpu();
  inputs_ = x.to(home).contiguous();
  labels_ = y.to(DType::i64).to(home).contiguous();
  rt::log().info("[data] {} samples ({:.1f} MiB) {} {}", n_, static_cast<double>(bytes) / (1 << 20),
                 resident_ ? "resident on" : "gathered on the host for", o_.device.str());
  set_epoch(0);
}

std::int64_t DataLoader::batches() const {
  // Not (n + batch_size - 1) / batch_size: that overflows for a batch size near INT64_MAX.
  return n_ / o_.batch_size + (!o_.drop_last && n_ % o_.batch_size != 0);
}

void DataLoader::set_epoch(std::int64_t epoch) {
  if (epoch < 0) throw ValueError(std::string(kWho) + "epoch must be >= 0, got " + std::to_string(epoch));
  if (!o_.shuffle) return;  // batches are slices in stored order
  const std::vector<std::int64_t> p = permutation(n_, o_.seed, static_cast<std::uint64_t>(epoch));
  // The epoch's one host->device copy when the data is resident on a GPU.
  order_ = from_data(p.data(), {n_}, DType::i64, resident_ ? o_.device : Device::cpu());
}

void DataLoader::check_batch(std::int64_t i) const {
  if (i < 0 || i >= batches())
    throw ValueError(std::string(kWho) + "batch " + std::to_string(i) + " is out of range: an epoch has " +
                     std::to_string(batches()) + " batches");
}

Tensor DataLoader::indices(std::int64_t i) const {
  check_batch(i);
  const std::int64_t start = i * o_.batch_size, len = std::min(o_.batch_size, n_ - start);
  if (o_.shuffle) return narrow(order_, 0, start, len);
  return arange(start, start + len, 1, {.dtype = DType::i64, .device = inputs_.device()});
}

Batch DataLoader::batch(std::int64_t i) const {
  check_batch(i);
  NoGradGuard no_grad;
  const std::int64_t start = i * o_.batch_size, len = std::min(o_.batch_size, n_ - start);
  Tensor x, y;
  if (o_.shuffle) {
    const Tensor idx = narrow(order_, 0, start, len);
    x = index_select(inputs_, 0, idx);
    y = index_select(labels_, 0, idx);
  } else {
    x = narrow(inputs_, 0, start, len);
    y = narrow(labels_, 0, start, len);
  }
  if (!resident_) {
    x = x.to(o_.device);
    y = y.to(o_.device);
  }
  // (x * scale - mean) / std in f32; steps that are identities are skipped.
  Tensor f = x.dtype() == DType::f32 ? x : cast(x, DType::f32);
  if (o_.scale != 1.0) f = f * o_.scale;
  if (o_.mean != 0.0) f = f - o_.mean;
  if (o_.std != 1.0) f = f / o_.std;
  // A batch never aliases the dataset, so writing into it cannot corrupt later epochs.
  if (f.shares_storage(inputs_)) f = f.clone();
  if (y.shares_storage(labels_)) y = y.clone();
  return Batch{f, y};
}

}  // namespace kiln::data
