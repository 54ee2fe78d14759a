// The placement of a private pool's blocks (runtime/src/arena_space.h), checked against a plain
// byte-map model: no two live blocks overlap, freed space is reused whatever size asks next.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "arena_space.h"
#include "kiln/error.h"

using kiln::ValueError;
using kiln::rt::ArenaSpace;

TEST_CASE("arena space: a freed block serves a smaller request, and neighbours merge back") {
  ArenaSpace a;
  a.add_chunk(4096, 4096);
  const std::uint64_t x = a.take(1024).value(), y = a.take(1024).value(), z = a.take(2048).value();
  CHECK(x == 4096);
  CHECK(y == 5120);
  CHECK(z == 6144);
  CHECK_FALSE(a.take(512).has_value());  // full
  a.give_back(y, 1024);
  CHECK(a.take(512).value() == y);  // best fit: the freed range, split
  a.give_back(x, 1024);
  a.give_back(z, 2048);
  CHECK(a.free_ranges() == 2);  // [x, y) and [y + 512, end): y's first half is still taken
  a.give_back(y, 512);
  CHECK(a.free_ranges() == 1);
  CHECK(a.largest_free() == 4096);
  CHECK(a.bytes_in_use() == 0);
  CHECK(a.peak_in_use() == 4096);
}

TEST_CASE("arena space: the smallest range that holds the request is taken") {
  ArenaSpace a;
  a.add_chunk(0, 10000);
  const std::uint64_t big = a.take(3000).value();
  const std::uint64_t sep1 = a.take(100).value();
  const std::uint64_t small = a.take(1000).value();
  const std::uint64_t sep2 = a.take(100).value();
  a.give_back(big, 3000);
  a.give_back(small, 1000);
  CHECK(a.take(900).value() == small);  // not the 3000-byte range, nor the chunk's tail
  CHECK(a.take(2000).value() == big);
  CHECK(sep1 != sep2);
}

TEST_CASE("arena space: ranges of two chunks never merge, even when their addresses touch") {
  ArenaSpace a;
  a.add_chunk(0, 1024);
  a.add_chunk(1024, 1024);  // the driver may place a second allocation right after the first
  const std::uint64_t p = a.take(1024).value(), q = a.take(1024).value();
  a.give_back(p, 1024);
  a.give_back(q, 1024);
  CHECK(a.free_ranges() == 2);
  CHECK_FALSE(a.take(2048).has_value());
}

TEST_CASE("arena space: a chunk grown at its end joins its free tail, so a larger request fits") {
  ArenaSpace a;
  a.add_chunk(8192, 4096);
  const std::uint64_t p = a.take(3072).value();
  CHECK(a.free_at_end(8192) == 1024);
  CHECK_FALSE(a.take(2048).has_value());
  a.extend_chunk(8192, 2048);  // mapped right after the chunk
  CHECK(a.free_at_end(8192) == 3072);
  CHECK(a.free_ranges() == 1);
  CHECK(a.take(3072).value() == 8192 + 3072);  // across the old end
  CHECK(a.free_at_end(8192) == 0);
  a.extend_chunk(8192, 1024);  // nothing free at the end: a range of its own
  CHECK(a.free_at_end(8192) == 1024);
  a.give_back(p, 3072);
  a.give_back(8192 + 3072, 3072);
  CHECK(a.free_ranges() == 1);
  CHECK(a.largest_free() == 7168);
  CHECK_THROWS_AS(a.extend_chunk(0, 1024), ValueError);
  CHECK(a.free_at_end(0) == 0);
}

TEST_CASE("arena space: a block returned twice or outside its chunks is refused, the space unchanged") {
  ArenaSpace a;
  a.add_chunk(1 << 20, 4096);
  const std::uint64_t p = a.take(1024).value();
  a.give_back(p, 1024);
  CHECK_THROWS_WITH_AS(a.give_back(p, 1024), doctest::Contains("returned twice"), ValueError);
  CHECK_THROWS_WITH_AS(a.give_back(0, 512), doctest::Contains("not inside one of its pool's chunks"), ValueError);
  CHECK_THROWS_AS(a.give_back((1 << 20) + 4000, 512), ValueError);  // runs past the chunk's end
  CHECK(a.free_ranges() == 1);
  CHECK(a.largest_free() == 4096);
  CHECK_FALSE(a.take(0).has_value());
}

TEST_CASE("arena space: random takes and returns keep every live block apart and inside a chunk") {
  constexpr std::uint64_t kBase = 1 << 16, kBytes = 1 << 16, kUnit = 512;
  std::vector<int> owner(kBytes / kUnit, -1);  // the model: which live block holds each unit
  ArenaSpace a;
  a.add_chunk(kBase, kBytes);
  struct Live {
    std::uint64_t at, bytes;
  };
  std::vector<Live> live;
  std::mt19937 rng(7);
  std::uint64_t in_use = 0;
  int failed_takes = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::uint64_t bytes = kUnit * (1 + rng() % 24);
      const auto at = a.take(bytes);
      if (!at) {
        ++failed_takes;
        // Refused only when no free run of units is long enough.
        std::uint64_t run = 0, longest = 0;
        for (int o : owner) longest = std::max(longest, run = o < 0 ? run + kUnit : 0);
        CHECK(longest < bytes);
        continue;
      }
      REQUIRE(*at >= kBase);
      REQUIRE(*at + bytes <= kBase + kBytes);
      for (std::uint64_t u = (*at - kBase) / kUnit; u < (*at - kBase + bytes) / kUnit; ++u) {
        REQUIRE(owner[u] < 0);
        owner[u] = step;
      }
      live.push_back({*at, bytes});
      in_use += bytes;
    } else {
      const std::size_t i = rng() % live.size();
      a.give_back(live[i].at, live[i].bytes);
      for (std::uint64_t u = (live[i].at - kBase) / kUnit; u < (live[i].at - kBase + live[i].bytes) / kUnit; ++u)
        owner[u] = -1;
      in_use -= live[i].bytes;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    REQUIRE(a.bytes_in_use() == in_use);
  }
  CHECK(failed_takes > 0);  // the test reached a full arena
  for (const Live& l : live) a.give_back(l.at, l.bytes);
  CHECK(a.free_ranges() == 1);  // everything merged back into the one chunk
  CHECK(a.largest_free() == kBytes);
}
