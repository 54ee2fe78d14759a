// DataLoader with the dataset resident on the GPU: batches equal the CPU loader's for the
// same seed and epoch (labels exactly, inputs to f32 rounding), with and without shuffling,
// from host or device inputs, and on the real MNIST files when they are present.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "gpu_match.h"

using namespace kiln;
using data::DataLoader;
using data::LoaderOptions;

namespace {

using kiln_test::kGpu;

// Every batch of every listed epoch: the GPU loader's against the CPU loader's.
void check_same_batches(DataLoader& cpu, DataLoader& gpu, std::vector<std::int64_t> epochs) {
  REQUIRE(cpu.batches() == gpu.batches());
  for (std::int64_t e : epochs) {
    cpu.set_epoch(e);
    gpu.set_epoch(e);
    for (std::int64_t b = 0; b < cpu.batches(); ++b) {
      CAPTURE(e);
      CAPTURE(b);
      const data::Batch c = cpu.batch(b), g = gpu.batch(b);
      REQUIRE(g.inputs.device() == kGpu);
      REQUIRE(g.labels.device() == kGpu);
      CHECK(g.inputs.dtype() == DType::f32);
      CHECK(g.labels.dtype() == DType::i64);
      REQUIRE(g.inputs.shape() == c.inputs.shape());
      CHECK(g.labels.to(Device::cpu()).to_vector<std::int64_t>() == c.labels.to_vector<std::int64_t>());
      const auto xc = c.inputs.to_vector<float>(), xg = g.inputs.to(Device::cpu()).to_vector<float>();
      int shown = 0;
      for (std::size_t i = 0; i < xc.size(); ++i)
        if (std::fabs(xc[i] - xg[i]) > 1e-6f * (1 + std::fabs(xc[i])) && shown++ < 5)
          FAIL_CHECK("input " << i << ": cpu " << xc[i] << ", gpu " << xg[i]);
      CHECK(shown == 0);
    }
  }
}

struct Data {
  Tensor images, labels;
};
Data mnist_like(std::int64_t n, std::uint64_t seed) {
  Generator g(seed);
  return {randint(0, 256, {n, 28, 28}, {.dtype = DType::i32}, &g).to(DType::u8),
          randint(0, 10, {n}, {.dtype = DType::i32}, &g)};
}

}  // namespace

TEST_CASE("rt::free_memory reports a plausible amount") {
  const std::size_t free = rt::free_memory(0);
  CHECK(free > 0);
  CHECK(free <= rt::device_info(0).total_memory);
}

TEST_CASE("data.DataLoader on the GPU is resident and matches the CPU loader, shuffled") {
  const Data d = mnist_like(1000, 1);
  LoaderOptions o{.batch_size = 64, .seed = 42, .mean = 0.1307, .std = 0.3081};
  DataLoader cpu(d.images, d.labels, o);
  o.device = kGpu;
  DataLoader gpu(d.images, d.labels, o);
  CHECK(gpu.on_device());
  CHECK(gpu.size() == 1000);
  check_same_batches(cpu, gpu, {0, 1, 9});
}

TEST_CASE("data.DataLoader kept on the host copies batches to the GPU that match the CPU loader") {
  const Data d = mnist_like(700, 3);
  LoaderOptions o{.batch_size = 100, .seed = 9, .mean = 0.1307, .std = 0.3081};
  DataLoader cpu(d.images, d.labels, o);
  o.device = kGpu;
  o.keep_on_host = true;
  DataLoader host(d.images, d.labels, o);
  CHECK_FALSE(host.on_device());
  CHECK(host.batch(0).inputs.device() == kGpu);
  CHECK(host.batch(0).labels.device() == kGpu);
  check_same_batches(cpu, host, {0, 3, 6});
}

TEST_CASE("data.DataLoader on the GPU: shuffle=false and drop_last match the CPU loader") {
  const Data d = mnist_like(300, 2);
  LoaderOptions o{.batch_size = 128, .shuffle = false, .drop_last = true};
  DataLoader cpu(d.images, d.labels, o);
  o.device = kGpu;
  DataLoader gpu(d.images, d.labels, o);
  CHECK(gpu.batches() == 2);
  check_same_batches(cpu, gpu, {0, 3});
  // Stored order: the second batch holds samples 128..255.
  CHECK(gpu.batch(1).labels.to(Device::cpu()).to_vector<std::int64_t>() ==
        narrow(d.labels, 0, 128, 128).to(DType::i64).to_vector<std::int64_t>());
}

TEST_CASE("data.DataLoader built from tensors already on the GPU keeps them there") {
  const Data d = mnist_like(200, 3);
  LoaderOptions o{.batch_size = 50, .seed = 7};
  DataLoader cpu(d.images, d.labels, o);
  o.device = kGpu;
  DataLoader gpu(d.images.to(kGpu), d.labels.to(kGpu), o);
  CHECK(gpu.on_device());
  check_same_batches(cpu, gpu, {0, 2});
  // Batches are new tensors: writing into one leaves the dataset as it was.
  gpu.batch(0).inputs.fill_(-5);
  check_same_batches(cpu, gpu, {0});
}

TEST_CASE("data.DataLoader real MNIST resident on the GPU equals the CPU batches") {
  const char* env = std::getenv("KILN_MNIST_DIR");
  const std::string dir = env && *env ? env : std::string(KILN_SOURCE_DIR) + "/../shared/data/mnist";
  if (!data::has_mnist(dir)) {
    MESSAGE("skipped: no MNIST files in " << dir << " (set KILN_MNIST_DIR)");
    return;
  }
  const data::Mnist m = data::load_mnist(dir);
  LoaderOptions o{.batch_size = 128, .seed = 1, .mean = 0.1307, .std = 0.3081};
  DataLoader cpu(m.train_images, m.train_labels, o);
  o.device = kGpu;
  DataLoader gpu(m.train_images, m.train_labels, o);
  CHECK(gpu.on_device());
  CHECK(gpu.batches() == 469);
  cpu.set_epoch(4);
  gpu.set_epoch(4);
  for (std::int64_t b : {std::int64_t{0}, std::int64_t{200}, std::int64_t{468}}) {
    CAPTURE(b);
    const data::Batch c = cpu.batch(b), g = gpu.batch(b);
    CHECK(g.labels.to(Device::cpu()).to_vector<std::int64_t>() == c.labels.to_vector<std::int64_t>());
    const float diff = max(abs(g.inputs.to(Device::cpu()) - c.inputs)).item<float>();
    CHECK(diff <= 1e-5f);
  }
  CHECK(gpu.batch(468).inputs.shape() == Shape{60000 - 468 * 128, 28, 28});
}
