#pragma once
// Batches of a labelled dataset for training. The whole dataset is copied to the device
// once when it fits (under a quarter of the device's free memory), so a batch is a gather
// on the device, not a host copy; otherwise batches are gathered on the host and copied.
// Shuffling is a seeded permutation per epoch: same seed and epoch -> same batches.
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "kiln/device.h"
#include "kiln/tensor.h"

namespace kiln::data {

struct LoaderOptions {
  std::int64_t batch_size = 128;  // > 0; past the dataset's size it is one batch (none with drop_last)
  bool shuffle = true;
  bool drop_last = false;  // else the last batch may be smaller
  std::uint64_t seed = 0;
  Device device = Device::cpu();
  // Inputs become f32 ((x * scale) - mean) / std, e.g. scale 1/255 for u8 pixels.
  double scale = 1.0 / 255.0;
  double mean = 0.0;
  double std = 1.0;
  // Keep the dataset on the host and copy each batch, as when it does not fit on the device.
  bool keep_on_host = false;
};

// Two members exactly, so `auto [x, y] = loader.batch(i)` destructures it.
struct Batch {
  Tensor inputs;  // f32 (B, ...) on the loader's device
  Tensor labels;  // i64 (B) on the loader's device
};

class DataLoader {
 public:
  // inputs (N, ...) of any real dtype, labels (N) integer; ShapeError/DTypeError otherwise.
  DataLoader(const Tensor& inputs, const Tensor& labels, LoaderOptions options);

  std::int64_t size() const { return n_; }  // samples
  std::int64_t batches() const;              // per epoch
  bool on_device() const { return resident_; }  // the dataset lives on options.device
  // Fixes the order of the coming epoch (epoch 0, 1, ...); ValueError for a negative epoch.
  void set_epoch(std::int64_t epoch);
  // Batch i of the current epoch, 0 <= i < batches(); ValueError otherwise.
  Batch batch(std::int64_t i) const;
  // The dataset rows batch i takes (i64 (len), where the data lives), for a step that gathers
  // its batch itself, e.g. inside a compiled step from a dataset already normalised on the device.
  Tensor indices(std::int64_t i) const;

  // An input iterator over the current epoch's batches: `for (auto [x, y] : loader)`. Each
  // dereference is batch(i), made then; set_epoch() during a loop changes the batches to come.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using reference = Batch;  // a new batch per dereference, not a reference into the loader

    Iterator() = default;
    Batch operator*() const { return loader_->batch(i_); }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator before = *this;
      ++i_;
      return before;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_ && loader_ == o.loader_; }

   private:
    friend class DataLoader;
    Iterator(const DataLoader* loader, std::int64_t i) : loader_(loader), i_(i) {}
    const DataLoader* loader_ = nullptr;
    std::int64_t i_ = 0;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, batches()}; }

 private:
  void check_batch(std::int64_t i) const;  // ValueError unless 0 <= i < batches()
  Tensor inputs_, labels_;  // resident: on options.device; else CPU
  Tensor order_;            // i64 permutation of the epoch, where the data lives
  LoaderOptions o_;
  std::int64_t n_ = 0;
  bool resident_ = false;
};

}  // namespace kiln::data
