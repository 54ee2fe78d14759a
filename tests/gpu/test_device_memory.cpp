// Devices, streams, events, pool allocation, staged copies and cuBLAS handles on a real GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/error.h"
#include "kiln/runtime/cublas.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using namespace kiln::rt;

namespace {

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

// Index of the first differing byte, or -1.
long long first_mismatch(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long long>(i);
  return -1;
}

}  // namespace

// First in this file on purpose: default_stream before any make_current once deadlocked
// (creating the stream retains the context, both lazily filled).
TEST_CASE("default_stream can be the first request of a thread") {
  std::thread t([] { CHECK(static_cast<bool>(default_stream(0))); });
  t.join();
}

TEST_CASE("device_info describes a real GPU") {
  REQUIRE(device_count() > 0);
  const DeviceInfo& d = device_info(0);
  MESSAGE("cuda:0 is " << d.name << " sm_" << d.arch() << ", " << d.sm_count << " SMs");
  CHECK(d.ordinal == 0);
  CHECK(d.arch() >= 70);
  CHECK(d.sm_count > 0);
  CHECK_FALSE(d.name.empty());
  CHECK(d.total_memory > (std::size_t{1} << 30));
  CHECK(d.l2_bytes > 0);
  CHECK(d.max_shared_optin >= 48 * 1024);
  CHECK(&device_info(0) == &d);
  CHECK_THROWS_AS(device_info(device_count()), DeviceError);
}

TEST_CASE("make_current works from any thread and default_stream is one per device") {
  Stream* from_thread = nullptr;
  std::thread t([&] {
    make_current(0);
    from_thread = &default_stream(0);
  });
  t.join();
  CHECK(from_thread == &default_stream(0));
  CHECK(default_stream(0).device() == 0);
  CHECK(static_cast<bool>(default_stream(0)));
}

TEST_CASE("host -> device -> host round trips") {
  Stream s = Stream::create(0);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{50} << 20}) {
    CAPTURE(n);
    auto src = random_bytes(n, static_cast<std::uint32_t>(n) + 1);
    auto original = src;
    DeviceBuffer buf(n, s);
    CHECK(buf.bytes() == n);
    CHECK((n == 0) == (buf.ptr() == 0));
    copy_to_device(buf.ptr(), src.data(), n, s);
    // The data is staged already, so the caller may overwrite src at once.
    std::fill(src.begin(), src.end(), std::uint8_t{0xAB});
    std::vector<std::uint8_t> back(n, 0);
    copy_to_host(back.data(), buf.ptr(), n, s);
    CHECK(first_mismatch(back, original) == -1);
  }
}

TEST_CASE("copy_device and memset_device") {
  Stream& s = default_stream(0);
  const std::size_t n = (std::size_t{9} << 20) + 123;  // crosses a staging chunk boundary
  auto data = random_bytes(n, 7);
  DeviceBuffer a(n, s), b(n, s);
  copy_to_device(a.ptr(), data.data(), n, s);
  copy_device(b.ptr(), a.ptr(), n, s);
  std::vector<std::uint8_t> back(n);
  copy_to_host(back.data(), b.ptr(), n, s);
  CHECK(first_mismatch(back, data) == -1);

  memset_device(b.ptr() + 10, 0x5A, 1000, s);
  copy_to_host(back.data(), b.ptr(), n, s);
  for (std::size_t i = 10; i < 1010; ++i) data[i] = 0x5A;
  CHECK(first_mismatch(back, data) == -1);
}

TEST_CASE("concurrent staged copies on separate streams") {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &ok] {
      Stream s = Stream::create(0);
      auto data = random_bytes((std::size_t{20} << 20) + t, 100 + t);
      DeviceBuffer buf(data.size(), s);
      copy_to_device(buf.ptr(), data.data(), data.size(), s);
      std::vector<std::uint8_t> back(data.size());
      copy_to_host(back.data(), buf.ptr(), back.size(), s);
      ok[t] = first_mismatch(back, data) == -1;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(ok[t] == 1);
}

TEST_CASE("stream wait orders work across streams") {
  Stream a = Stream::create(0), b = Stream::create(0);
  const std::size_t n = std::size_t{64} << 20;
  DeviceBuffer buf(n, a);
  memset_device(buf.ptr(), 0x11, n, a);
  Event e = Event::create(0);
  e.record(a);
  b.wait(e);
  std::vector<std::uint8_t> back(n);
  copy_to_host(back.data(), buf.ptr(), n, b);
  CHECK(back.front() == 0x11);
  CHECK(back.back() == 0x11);
  CHECK(e.done());
}

TEST_CASE("pool usage tracks live allocations") {
  Stream& s = default_stream(0);
  s.synchronize();
  PoolUsage before = pool_usage(0);
  const std::size_t n = std::size_t{96} << 20;
  {
    DeviceBuffer buf(n, s);
    PoolUsage during = pool_usage(0);
    CHECK(during.used >= before.used + n);
    CHECK(during.reserved >= during.used);
  }
  s.synchronize();
  CHECK(pool_usage(0).used < before.used + n);
}

TEST_CASE("an impossible allocation throws CudaError with the bytes and pool usage") {
  Stream& s = default_stream(0);
  const std::size_t n = std::size_t{1} << 50;
  std::string msg;
  try {
    DevicePtr p = device_alloc(n, s);
    device_free(p, s);
  } catch (const CudaError& e) {
    msg = e.what();
  }
  MESSAGE(msg);
  CHECK(msg.find(std::to_string(n)) != std::string::npos);
  CHECK(msg.find("cuMemAllocFromPoolAsync") != std::string::npos);
  CHECK(msg.find("reserved") != std::string::npos);
  // The failure is not sticky: the pool still serves ordinary requests.
  DeviceBuffer ok(1024, s);
  CHECK(ok.ptr() != 0);
}

TEST_CASE("timing events measure elapsed time") {
  Stream s = Stream::create(0);
  Event start = Event::create(0, true), stop = Event::create(0, true);
  DeviceBuffer buf(std::size_t{256} << 20, s);
  start.record(s);
  memset_device(buf.ptr(), 1, buf.bytes(), s);
  stop.record(s);
  stop.synchronize();
  CHECK(stop.done());
  CHECK(stop.elapsed_ms_since(start) >= 0.0f);

  Event plain = Event::create(0);
  plain.record(s);
  plain.synchronize();
  CHECK_THROWS_AS(plain.elapsed_ms_since(start), CudaError);  // created without timing
}

TEST_CASE("cublas_handle is one per stream") {
  Stream a = Stream::create(0), b = Stream::create(0);
  void* ha = cublas_handle(a);
  CHECK(ha != nullptr);
  CHECK(cublas_handle(a) == ha);
  CHECK(cublas_handle(b) != ha);
  CHECK(cublas_handle(default_stream(0)) == cublas_handle(default_stream(0)));
}
