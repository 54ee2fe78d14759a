// Device, stream, memory and launch-config behaviour that holds with or without a GPU.
// On a machine without one every GPU request must throw DeviceError saying why.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <utility>

#include "kiln/error.h"
#include "kiln/runtime/cublas.h"
#include "error_message.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using namespace kiln::rt;

namespace {

// The DeviceError message thrown by `f`, or "" when it threw nothing (any other type fails the test).
std::string device_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "";
}

using kiln_test::contains;

}  // namespace

TEST_CASE("gpu_available and device_count agree") {
  std::string why;
  bool available = gpu_available(&why);
  if (!available) {
    CHECK_FALSE(why.empty());
    CHECK(device_count() == 0);
  } else {
    CHECK(device_count() > 0);
  }
  CHECK(gpu_available() == available);  // the reason pointer is optional
}

TEST_CASE("without a GPU, every device request throws DeviceError with the reason") {
  std::string why;
  if (gpu_available(&why)) {
    MESSAGE("a GPU is present; checking the GPU-side facts instead");
    int n = device_count();
    CHECK(device_info(0).arch() >= 50);
    CHECK(&device_info(0) == &device_info(0));  // cached
    std::string msg = device_error_of([&] { device_info(n); });
    CHECK(contains(msg, "[device] cuda:" + std::to_string(n) + " does not exist"));
    CHECK(contains(device_error_of([] { device_info(-1); }), "does not exist"));
    CHECK(&default_stream(0) == &default_stream(0));
    CHECK(contains(device_error_of([&] { Stream::create(n); }), "does not exist"));
    return;
  }
  REQUIRE_FALSE(why.empty());
  std::string msg = device_error_of([] { device_info(0); });
  CHECK(contains(msg, why));
  CHECK(contains(msg, "[device]"));
  CHECK(contains(device_error_of([] { default_stream(0); }), why));
  CHECK(contains(device_error_of([] { Stream::create(0); }), why));
  CHECK(contains(device_error_of([] { Event::create(0, true); }), why));
  CHECK(contains(device_error_of([] { make_current(0); }), why));
  CHECK(contains(device_error_of([] { pool_usage(0); }), why));
  Stream none;
  CHECK(contains(device_error_of([&] { device_alloc(64, none); }), why));
  CHECK(contains(device_error_of([&] { DeviceBuffer b(64, none); }), why));
  CHECK(contains(device_error_of([&] { cublas_handle(none); }), why));
  char byte = 0;
  CHECK(contains(device_error_of([&] { copy_to_host(&byte, 0x1000, 1, none); }), why));
}

TEST_CASE("an empty stream is rejected by name when CUDA is usable") {
  if (!gpu_available()) return;  // covered above: there the reason comes first
  Stream none;
  CHECK(contains(device_error_of([&] { device_alloc(64, none); }), "empty"));
  CHECK(contains(device_error_of([&] { none.synchronize(); }), "empty"));
}

TEST_CASE("empty handles, zero-byte requests and moves need no GPU") {
  Stream s;
  CHECK_FALSE(s);
  CHECK(s.handle() == nullptr);
  CHECK(s.device() == -1);
  Stream moved(std::move(s));
  CHECK_FALSE(moved);
  Event e;
  CHECK(e.handle() == nullptr);
  Event e2 = std::move(e);
  CHECK(e2.handle() == nullptr);

  CHECK(device_alloc(0, s) == 0);
  device_free(0, s);  // no-op, must not throw
  copy_to_device(0, nullptr, 0, s);
  copy_to_host(nullptr, 0, 0, s);
  copy_device(0, 0, 0, s);
  memset_device(0, 0, 0, s);

  DeviceBuffer b;
  CHECK(b.ptr() == 0);
  CHECK(b.bytes() == 0);
  DeviceBuffer zero(0, s);
  CHECK(zero.ptr() == 0);
  DeviceBuffer taken = std::move(zero);
  CHECK(taken.bytes() == 0);
}

TEST_CASE("launch_raw rejects an empty function before touching the driver") {
  LaunchConfig c = linear_config(10);
  CHECK_THROWS_AS(launch_raw(Function{}, c, Stream{}, nullptr), ValueError);
}

TEST_CASE("linear_config covers n items with capped blocks") {
  auto grid = [](std::uint64_t n, unsigned block = 256, unsigned cap = 65535u * 4) {
    return linear_config(n, block, cap).grid.x;
  };
  CHECK(grid(0) == 1);
  CHECK(grid(1) == 1);
  CHECK(grid(256) == 1);
  CHECK(grid(257) == 2);
  CHECK(grid(1000, 128) == 8);
  CHECK(grid(1024, 128) == 8);
  CHECK(grid(std::uint64_t{1} << 40) == 65535u * 4);
  CHECK(grid(~std::uint64_t{0}, 1) == 65535u * 4);  // no overflow in the ceiling division
  CHECK(grid(1u << 20, 256, 100) == 100);
  CHECK(grid(5, 256, 0) == 1);

  LaunchConfig c = linear_config(1000, 128);
  CHECK(c.block.x == 128);
  CHECK(c.block.y == 1);
  CHECK(c.block.z == 1);
  CHECK(c.grid.y == 1);
  CHECK(c.grid.z == 1);
  CHECK(c.shared_bytes == 0);
  CHECK_THROWS_AS(linear_config(10, 0), ValueError);
}
