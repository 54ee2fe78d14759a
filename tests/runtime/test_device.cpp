// Device, stream, memory and launch-config behaviour that holds with or without a GPU.
// On a machine without one every GPU request must throw DeviceError saying why.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <utility>

#include "error_message.h"
#include "kiln/error.h"
#include "kiln/runtime/cublas.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
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
    CHECK(contains(device_error_of([&] { open_device_async(n); }), "does not exist"));
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
  CHECK(contains(device_error_of([] { open_device_async(0); }), why));
  CHECK(contains(device_error_of([] { pool_usage(0); }), why));
  Stream none;
  CHECK(contains(device_error_of([&] { device_alloc(64, none); }), why));
  CHECK(contains(device_error_of([&] { DeviceBuffer b(64, none); }), why));
  CHECK(contains(device_error_of([&] { cublas_handle(none); }), why));
  char byte = 0;
  CHECK(contains(device_error_of([&] { copy_to_host(&byte, 0x1000, 1, none); }), why));
}

TEST_CASE("a shape-only pass allocates planned addresses on an unbacked stream and sees the device empty") {
  if (!gpu_available()) return;  // tests/tools/test_plan_without_context.cpp plans under a driver without contexts
  const Stream& real = default_stream(0);
  CHECK_FALSE(real.unbacked());
  {
    ShapeOnlyPass pass;
    const Stream& s = default_stream(0);
    CHECK(s.unbacked());
    CHECK(&s != &real);
    CHECK(s.device() == 0);
    const DevicePtr a = device_alloc(100, s), b = device_alloc(1, s);
    CHECK(is_planned(a));
    CHECK(is_planned(b));
    CHECK(a % 512 == 0);  // the pool's granule: ops see the alignment a real run gets
    CHECK(b % 512 == 0);
    CHECK((b >= a + 512 || a >= b + 512));  // distinct, not overlapping
    s.synchronize();                        // nothing queued: returns at once
    device_free(a, s);
    device_free(b, s);
    DeviceBuffer buffer(4096, s);
    CHECK(is_planned(buffer.ptr()));
    CHECK(pool_usage(0).used == 0);
    CHECK(free_memory(0) == device_info(0).total_memory);
  }
  CHECK(&default_stream(0) == &real);
  CHECK_FALSE(is_planned(DeviceBuffer(64, real).ptr()));
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

TEST_CASE("resident_blocks: the fallback in a shape-only pass, an empty function rejected otherwise") {
  LaunchConfig c = linear_config(1000);
  {
    ShapeOnlyPass pass;
    CHECK(resident_blocks(Function{}, c, 8) == 8);
    CHECK(resident_blocks(Function{}, c, 3) == 3);
  }
  CHECK_THROWS_AS(resident_blocks(Function{}, c, 8), ValueError);
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
