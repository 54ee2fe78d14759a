// The per-stream block cache behind DeviceBuffer: reuse on the same stream, never across
// streams, release on demand and when a stream is destroyed, and data kept in stream order.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln::rt;

TEST_CASE("a freed DeviceBuffer's block serves the next request of the same rounded size") {
  Stream s = Stream::create(0);
  DevicePtr first = 0;
  {
    DeviceBuffer a(1000, s);
    first = a.ptr();
  }
  CHECK(pool_usage(0).cached >= 1024);
  DeviceBuffer b(1024, s);  // 1000 and 1024 both round to 1024
  CHECK(b.ptr() == first);
  DeviceBuffer c(4096, s);  // another size: a fresh block
  CHECK(c.ptr() != first);
}

TEST_CASE("a block cached for one stream is not handed to another") {
  Stream s = Stream::create(0), t = Stream::create(0);
  DevicePtr first = 0;
  {
    DeviceBuffer a(3000, s);
    first = a.ptr();
  }
  DeviceBuffer on_t(3000, t);
  CHECK(on_t.ptr() != first);
  DeviceBuffer on_s(3000, s);
  CHECK(on_s.ptr() == first);
}

TEST_CASE("release_cached_blocks and stream destruction return blocks to the pool") {
  Stream& d = default_stream(0);
  { DeviceBuffer a(std::size_t{8} << 20, d); }
  CHECK(pool_usage(0).cached >= (std::size_t{8} << 20));
  release_cached_blocks(0);
  CHECK(pool_usage(0).cached == 0);

  const std::size_t before = pool_usage(0).cached;
  {
    Stream s = Stream::create(0);
    { DeviceBuffer a(std::size_t{4} << 20, s); }
    CHECK(pool_usage(0).cached == before + (std::size_t{4} << 20));
  }
  CHECK(pool_usage(0).cached == before);
}

TEST_CASE("blocks over 64 MiB bypass the cache") {
  Stream s = Stream::create(0);
  const std::size_t before = pool_usage(0).cached;
  { DeviceBuffer big(std::size_t{65} << 20, s); }
  CHECK(pool_usage(0).cached == before);
}

TEST_CASE("a reused block holds what its new owner wrote, in stream order") {
  Stream s = Stream::create(0);
  const std::size_t n = 1 << 20;
  DevicePtr first = 0;
  {
    DeviceBuffer a(n, s);
    first = a.ptr();
    memset_device(a.ptr(), 0x11, n, s);
  }
  DeviceBuffer b(n, s);
  REQUIRE(b.ptr() == first);
  memset_device(b.ptr(), 0x22, n, s);
  std::vector<std::uint8_t> back(n);
  copy_to_host(back.data(), b.ptr(), n, s);
  CHECK(back.front() == 0x22);
  CHECK(back.back() == 0x22);
}
