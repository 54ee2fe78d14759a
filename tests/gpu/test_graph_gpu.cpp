// The runtime's pieces of compiled steps on a real GPU: private pools, binding a pool to a
// stream, and a captured graph of copies replayed.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using namespace kiln::rt;

TEST_CASE("private pool: freed blocks serve the same pool only; its bytes are counted until it goes") {
  Stream s = Stream::create(0);
  const std::size_t before = pool_usage(0).private_bytes;
  {
    auto pool = std::make_shared<PrivatePool>(0, s.handle());
    const DevicePtr a = pool->take(1000), b = pool->take(1000);
    CHECK(a != b);
    CHECK(pool->bytes_held() >= 2000);
    CHECK(pool_usage(0).private_bytes == before + pool->bytes_held());
    pool->give_back(a, 1000);
    CHECK(pool->take(700) == a);   // same rounded size (1024): reused
    CHECK(pool->take(1000) != a);  // a is taken again
    const DevicePtr big = pool->take(std::size_t{64} << 20);  // beyond a chunk: a chunk of its own
    CHECK(big != 0);
    CHECK(pool->peak_in_use() == 3 * 1024 + (std::size_t{64} << 20));  // three 1024-byte blocks live, and big
    pool->give_back(big, std::size_t{64} << 20);
    CHECK(pool->take(std::size_t{40} << 20) == big);  // a freed block serves a smaller request of another size
  }
  CHECK(pool_usage(0).private_bytes == before);
}

TEST_CASE("private pool: its blocks lie in one range, whose free end joins the next growth") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  Stream s = Stream::create(0);
  auto pool = std::make_shared<PrivatePool>(0, s.handle());
  const DevicePtr a = pool->take(kMiB);
  CHECK(pool->bytes_held() == 2 * kMiB);  // one 2 MiB page
  const DevicePtr b = pool->take(3 * kMiB);
  CHECK(b == a + kMiB);                   // the free megabyte and a page mapped after it
  CHECK(pool->bytes_held() == 4 * kMiB);  // chunks of their own would hold 2 + 4
  pool->give_back(a, kMiB);
  pool->give_back(b, 3 * kMiB);
  CHECK(pool->take(4 * kMiB) == a);  // all of it merged back
  CHECK(pool->bytes_held() == 4 * kMiB);
  CHECK(pool->peak_in_use() == 4 * kMiB);
}

TEST_CASE("binding a pool: buffers on the stream come from it, freed driver-pool blocks wait for the unbind") {
  Stream s = Stream::create(0);
  auto pool = std::make_shared<PrivatePool>(0, s.handle());
  auto eager = std::make_unique<DeviceBuffer>(4096, s);
  CHECK_FALSE(eager->is_private());
  bind_private_pool(s, pool);
  CHECK_THROWS_AS(bind_private_pool(s, pool), ValueError);  // captures do not nest
  {
    DeviceBuffer p(4096, s);
    CHECK(p.is_private());
    DeviceBuffer other(4096, default_stream(0));  // another stream: unaffected
    CHECK_FALSE(other.is_private());
  }
  const std::size_t cached = pool_usage(0).cached;
  eager.reset();  // parked, not cached: a capture must not free or reuse it
  CHECK(pool_usage(0).cached == cached);
  unbind_private_pool(s);
  CHECK(pool_usage(0).cached == cached + 4096);
  DeviceBuffer after(4096, s);
  CHECK_FALSE(after.is_private());
}

TEST_CASE("a pool bound to a second stream that holds frees: its blocks serve nothing until the unbind") {
  Stream main = Stream::create(0), side = Stream::create(0);
  auto pool = std::make_shared<PrivatePool>(0, main.handle());
  bind_private_pool(main, pool);
  bind_private_pool(side, pool, true);
  CHECK(bound_private_pool(side) == pool);
  DevicePtr freed = 0;
  {
    DeviceBuffer on_side(4096, side);
    CHECK(on_side.is_private());
    freed = on_side.ptr();
  }
  // Still the side work's until the first stream has waited for it: not handed out again.
  DeviceBuffer next(4096, main);
  CHECK(next.ptr() != freed);
  unbind_private_pool(side);
  CHECK(bound_private_pool(side) == nullptr);
  DeviceBuffer after(4096, main);
  CHECK(after.ptr() == freed);  // back in the pool once unbound
  unbind_private_pool(main);
}

TEST_CASE("a captured graph of copies replays on new data; capture refuses host copies and nesting") {
  Stream s = Stream::create(0);
  const std::size_t n = 1 << 16;
  DeviceBuffer src(n, s), dst(n, s);
  std::vector<std::uint8_t> host(n), back(n);
  begin_capture(s);
  CHECK(thread_capturing());
  CHECK_THROWS_AS(begin_capture(s), ValueError);
  CHECK_THROWS_AS(copy_to_device(src.ptr(), host.data(), n, s), DeviceError);  // needs the host: refused
  abort_capture(s);
  CHECK_FALSE(thread_capturing());

  begin_capture(s);
  copy_device(dst.ptr(), src.ptr(), n, s);
  memset_device(src.ptr(), 0, n, s);
  Graph g = Graph::end_capture(s);
  REQUIRE(static_cast<bool>(g));
  CHECK(g.counts().nodes == 2);
  CHECK(g.counts().kernels == 0);
  for (int round = 1; round <= 3; ++round) {
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<std::uint8_t>(i * round + 7);
    copy_to_device(src.ptr(), host.data(), n, s);
    g.launch(s);
    copy_to_host(back.data(), dst.ptr(), n, s);
    CHECK(back == host);
    copy_to_host(back.data(), src.ptr(), n, s);
    CHECK(back == std::vector<std::uint8_t>(n, 0));
  }
}

TEST_CASE("a high-priority stream has the device's greatest priority, and its captured graph replays") {
  Stream normal = Stream::create(0), high = Stream::create(0, /*high_priority=*/true);
  CHECK(normal.priority() == 0);
  CHECK(high.priority() < 0);  // every GPU kiln supports has priorities below the default
  const std::size_t n = 4096;
  DeviceBuffer src(n, high), dst(n, high);
  std::vector<std::uint8_t> host(n, 5), back(n);
  begin_capture(high);
  copy_device(dst.ptr(), src.ptr(), n, high);
  Graph g = Graph::end_capture(high);
  copy_to_device(src.ptr(), host.data(), n, high);
  g.launch(high);
  copy_to_host(back.data(), dst.ptr(), n, high);
  CHECK(back == host);
}
