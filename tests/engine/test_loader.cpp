// DataLoader on the CPU: batch counts and sizes, drop_last, stored order without shuffle,
// every sample exactly once per epoch, the documented Philox Fisher-Yates permutation,
// uniformity over permutations, determinism, normalisation values and argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <ranges>
#include <vector>

#include "error_message.h"
#include "kiln/data/loader.h"
#include "kiln/kiln.h"

using namespace kiln;
using data::Batch;
using data::DataLoader;
using data::LoaderOptions;

namespace {

// n samples of shape (2, 3): every pixel of sample i is i % 256, its label is i.
struct Dataset {
  Tensor inputs, labels;
};
Dataset dataset(std::int64_t n) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(n * 6));
  for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>((k / 6) % 256);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  std::iota(labels.begin(), labels.end(), std::int64_t{0});
  return {from_vector<std::uint8_t>(px, {n, 2, 3}), from_vector<std::int64_t>(labels, {n})};
}

// The labels of every batch of `epoch`, concatenated.
std::vector<std::int64_t> epoch_labels(DataLoader& dl, std::int64_t epoch) {
  dl.set_epoch(epoch);
  std::vector<std::int64_t> out;
  for (std::int64_t b = 0; b < dl.batches(); ++b) {
    const auto l = dl.batch(b).labels.to_vector<std::int64_t>();
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

// The scheme loader.cpp documents, written out again: key = seed, counter = (block, epoch),
// two 64-bit draws per block, j = draw * (i + 1) >> 64.
std::vector<std::int64_t> expected_permutation(std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  std::vector<std::uint64_t> draws;
  for (std::uint64_t block = 0; draws.size() < static_cast<std::size_t>(n); ++block) {
    const auto w = philox4x32_10({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                                  static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)},
                                 {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
    draws.push_back((std::uint64_t{w[0]} << 32) | w[1]);
    draws.push_back((std::uint64_t{w[2]} << 32) | w[3]);
  }
  std::size_t k = 0;
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(
        (static_cast<unsigned __int128>(draws[k++]) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(p[static_cast<std::size_t>(i)], p[j]);
  }
  return p;
}

}  // namespace

TEST_CASE("data.DataLoader batch counts, last batch size and drop_last") {
  const Dataset d = dataset(10);
  DataLoader keep(d.inputs, d.labels, {.batch_size = 3});
  CHECK(keep.size() == 10);
  CHECK(keep.batches() == 4);
  CHECK(keep.batch(3).inputs.shape() == Shape{1, 2, 3});
  CHECK(keep.batch(0).inputs.shape() == Shape{3, 2, 3});
  CHECK(keep.on_device());  // a CPU loader's data lives on the CPU
  DataLoader drop(d.inputs, d.labels, {.batch_size = 3, .drop_last = true});
  CHECK(drop.batches() == 3);
  CHECK_THROWS_AS(drop.batch(3), ValueError);
  DataLoader exact(d.inputs, d.labels, {.batch_size = 5, .drop_last = true});
  CHECK(exact.batches() == 2);
  DataLoader big(d.inputs, d.labels, {.batch_size = 64, .drop_last = true});
  CHECK(big.batches() == 0);
  const Dataset none = dataset(0);
  DataLoader empty_set(none.inputs, none.labels, {.batch_size = 4});
  CHECK(empty_set.batches() == 0);
  CHECK_THROWS_AS(empty_set.batch(0), ValueError);
}

TEST_CASE("data.DataLoader shuffle=false keeps the stored order") {
  const Dataset d = dataset(7);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 3, .shuffle = false, .scale = 1.0});
  for (std::int64_t epoch : {0, 5}) {
    CHECK(epoch_labels(dl, epoch) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});
    const Batch b = dl.batch(2);
    CHECK(b.inputs.to_vector<float>() == std::vector<float>(6, 6.0f));
  }
}

TEST_CASE("data.DataLoader every sample exactly once per epoch, inputs matching labels") {
  const Dataset d = dataset(1000);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 64, .seed = 11, .scale = 1.0});
  for (std::int64_t epoch : {0, 1, 2}) {
    dl.set_epoch(epoch);
    std::vector<std::int64_t> seen;
    for (std::int64_t b = 0; b < dl.batches(); ++b) {
      const Batch batch = dl.batch(b);
      CHECK(batch.labels.dtype() == DType::i64);
      CHECK(batch.inputs.dtype() == DType::f32);
      const auto l = batch.labels.to_vector<std::int64_t>();
      const auto x = batch.inputs.to_vector<float>();
      for (std::size_t i = 0; i < l.size(); ++i) CHECK(x[6 * i + 5] == static_cast<float>(l[i] % 256));
      seen.insert(seen.end(), l.begin(), l.end());
    }
    std::vector<std::int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> all(1000);
    std::iota(all.begin(), all.end(), std::int64_t{0});
    CHECK(sorted == all);
    CHECK(seen != all);  // shuffled
  }
}

// The README's loop: `for (auto [x, y] : loader)` walks the current epoch's batches.
static_assert(std::input_iterator<DataLoader::Iterator>);
static_assert(std::ranges::input_range<const DataLoader>);

TEST_CASE("data.DataLoader range-for yields the current epoch's batches, destructured into inputs and labels") {
  const Dataset d = dataset(10);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 4, .seed = 5, .scale = 1.0});
  for (std::int64_t epoch : {0, 3}) {
    CAPTURE(epoch);
    const std::vector<std::int64_t> want = epoch_labels(dl, epoch);  // through batch(i), and sets the epoch
    std::vector<std::int64_t> got;
    std::vector<std::int64_t> sizes;
    for (auto [x, y] : dl) {
      CHECK(x.dtype() == DType::f32);
      const auto l = y.to_vector<std::int64_t>();
      const auto px = x.to_vector<float>();
      REQUIRE(px.size() == 6 * l.size());
      for (std::size_t i = 0; i < l.size(); ++i) CHECK(px[6 * i] == static_cast<float>(l[i]));
      got.insert(got.end(), l.begin(), l.end());
      sizes.push_back(static_cast<std::int64_t>(l.size()));
    }
    CHECK(got == want);
    CHECK(sizes == std::vector<std::int64_t>{4, 4, 2});
  }
  CHECK(std::distance(dl.begin(), dl.end()) == dl.batches());
  const auto [x0, y0] = *dl.begin();
  CHECK(y0.to_vector<std::int64_t>() == dl.batch(0).labels.to_vector<std::int64_t>());
  CHECK(x0.shape() == Shape{4, 2, 3});

  // drop_last and an empty dataset: only whole batches, or none at all.
  DataLoader drop(d.inputs, d.labels, {.batch_size = 4, .drop_last = true});
  int n = 0;
  for (const auto& [x, y] : drop) n += static_cast<int>(y.numel() == 4);
  CHECK(n == 2);
  const Dataset none = dataset(0);
  DataLoader empty_set(none.inputs, none.labels, {.batch_size = 4});
  CHECK(empty_set.begin() == empty_set.end());
}

TEST_CASE("data.DataLoader the permutation is Fisher-Yates over Philox(seed, epoch)") {
  const Dataset d = dataset(333);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 50, .seed = 0x123456789abcULL});
  CHECK(epoch_labels(dl, 0) == expected_permutation(333, 0x123456789abcULL, 0));
  CHECK(epoch_labels(dl, 7) == expected_permutation(333, 0x123456789abcULL, 7));
}

TEST_CASE("data.DataLoader same seed and epoch give the same batches; others differ") {
  const Dataset d = dataset(200);
  DataLoader a(d.inputs, d.labels, {.batch_size = 32, .seed = 5});
  DataLoader b(d.inputs, d.labels, {.batch_size = 32, .seed = 5});
  DataLoader c(d.inputs, d.labels, {.batch_size = 32, .seed = 6});
  const auto a0 = epoch_labels(a, 0), a1 = epoch_labels(a, 1);
  CHECK(a0 == epoch_labels(b, 0));
  CHECK(a1 == epoch_labels(b, 1));
  CHECK(a0 != a1);
  CHECK(a0 != epoch_labels(c, 0));
  CHECK(epoch_labels(a, 0) == a0);  // going back to an epoch replays it
  a.set_epoch(1);
  b.set_epoch(1);
  CHECK(a.batch(3).inputs.to_vector<float>() == b.batch(3).inputs.to_vector<float>());
}

TEST_CASE("data.DataLoader every permutation of 4 samples is about equally likely") {
  const Dataset d = dataset(4);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 4, .seed = 99});
  std::map<std::vector<std::int64_t>, int> counts;
  const int epochs = 2400;
  for (int e = 0; e < epochs; ++e) ++counts[epoch_labels(dl, e)];
  CHECK(counts.size() == 24);
  for (const auto& item : counts) {
    const int n = item.second;  // named, not bound: clang 14 cannot capture bindings
    CAPTURE(n);
    CHECK(n > 50);  // expected 100 each; 50 is over 5 standard deviations away
    CHECK(n < 150);
  }
}

TEST_CASE("data.DataLoader normalises to (x * scale - mean) / std in f32") {
  const Tensor x = from_vector<std::uint8_t>({0, 128, 255, 51}, {4, 1});
  const Tensor y = from_vector<std::int32_t>({0, 1, 2, 3});
  DataLoader dl(x, y, {.batch_size = 4, .shuffle = false, .mean = 0.1307, .std = 0.3081});
  const Batch b = dl.batch(0);
  CHECK(b.labels.dtype() == DType::i64);
  CHECK(b.labels.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3});
  const auto v = b.inputs.to_vector<float>();
  for (std::size_t i = 0; i < 4; ++i) {
    const double raw = std::array<double, 4>{0, 128, 255, 51}[i];
    CHECK(v[i] == doctest::Approx((raw / 255.0 - 0.1307) / 0.3081).epsilon(1e-6));
  }
  CHECK(v[0] == doctest::Approx(-0.424213).epsilon(1e-5));
  CHECK(v[2] == doctest::Approx(2.821505).epsilon(1e-5));
}

TEST_CASE("data.DataLoader batches never alias the dataset") {
  const Tensor x = from_vector<float>({1, 2, 3, 4}, {4, 1});
  const Tensor y = from_vector<std::int64_t>({0, 1, 2, 3});
  DataLoader dl(x, y, {.batch_size = 2, .shuffle = false, .scale = 1.0});
  Batch b = dl.batch(0);
  b.inputs.fill_(100);
  b.labels.fill_(7);
  CHECK(dl.batch(0).inputs.to_vector<float>() == std::vector<float>{1, 2});
  CHECK(dl.batch(0).labels.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1});
}

TEST_CASE("data.DataLoader rejects bad arguments with typed errors") {
  const Dataset d = dataset(8);
  CHECK(kiln_test::message_of<ShapeError>([&] {
          DataLoader(d.inputs, zeros({7}, {.dtype = DType::i64}), {});
        }).find("[data.DataLoader]") == 0);
  CHECK_THROWS_AS(DataLoader(d.inputs, zeros({8, 1}, {.dtype = DType::i64}), {}), ShapeError);
  CHECK_THROWS_AS(DataLoader(scalar_tensor(1.0), zeros({1}, {.dtype = DType::i64}), {}), ShapeError);
  CHECK_THROWS_AS(DataLoader(d.inputs, zeros({8}), {}), DTypeError);
  CHECK_THROWS_AS(DataLoader(zeros({8, 2}, {.dtype = DType::boolean}), d.labels, {}), DTypeError);
  CHECK_THROWS_AS(DataLoader(d.inputs, d.labels, {.batch_size = 0}), ValueError);
  CHECK_THROWS_AS(DataLoader(d.inputs, d.labels, {.std = 0.0}), ValueError);
  CHECK_THROWS_AS(DataLoader(d.inputs, d.labels, {.mean = NAN}), ValueError);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 4});
  CHECK(kiln_test::message_of<ValueError>([&] { dl.batch(-1); }).find("out of range") != std::string::npos);
  CHECK_THROWS_AS(dl.batch(2), ValueError);
  CHECK_THROWS_AS(dl.set_epoch(-1), ValueError);
  if (cuda_device_count() == 0)
    CHECK_THROWS_AS(DataLoader(d.inputs, d.labels, {.device = Device::cuda(0)}), DeviceError);
}

TEST_CASE("data.DataLoader a batch size past the dataset, up to INT64_MAX, is one batch") {
  // (n + batch_size - 1) / batch_size overflowed: batches() went negative and an epoch ran no batch.
  const Dataset d = dataset(5);
  for (std::int64_t bs :
       {std::int64_t{6}, std::numeric_limits<std::int64_t>::max() - 1, std::numeric_limits<std::int64_t>::max()}) {
    CAPTURE(bs);
    DataLoader dl(d.inputs, d.labels, {.batch_size = bs});
    REQUIRE(dl.batches() == 1);
    CHECK(dl.batch(0).labels.numel() == 5);
    CHECK_THROWS_AS(dl.batch(1), ValueError);
    DataLoader drop(d.inputs, d.labels, {.batch_size = bs, .drop_last = true});
    CHECK(drop.batches() == 0);
    CHECK_THROWS_AS(drop.batch(0), ValueError);
  }
  CHECK_THROWS_AS(DataLoader(d.inputs, d.labels, {.batch_size = std::numeric_limits<std::int64_t>::min()}), ValueError);
}

TEST_CASE("data.DataLoader indices(i) are the rows batch(i) takes, as i64 where the data lives") {
  const Dataset d = dataset(10);
  DataLoader dl(d.inputs, d.labels, {.batch_size = 4, .seed = 3, .scale = 1.0});
  for (std::int64_t b = 0; b < dl.batches(); ++b) {
    CAPTURE(b);
    const Tensor idx = dl.indices(b);
    CHECK(idx.dtype() == DType::i64);
    CHECK(idx.device() == Device::cpu());
    CHECK(idx.size(0) == (b == 2 ? 2 : 4));
    CHECK(idx.to_vector<std::int64_t>() == dl.batch(b).labels.to_vector<std::int64_t>());  // label k is row k
  }
  CHECK_THROWS_AS(dl.indices(3), ValueError);
  CHECK_THROWS_AS(dl.indices(-1), ValueError);
  DataLoader ordered(d.inputs, d.labels, {.batch_size = 4, .shuffle = false});
  CHECK(ordered.indices(1).to_vector<std::int64_t>() == std::vector<std::int64_t>{4, 5, 6, 7});
  CHECK(ordered.indices(2).to_vector<std::int64_t>() == std::vector<std::int64_t>{8, 9});
}
