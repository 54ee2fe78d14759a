// The compile lock shared by the processes of one disk cache (compile_lock.h): exclusive while
// held, waited for with a bound, its file removed on release, and none where the cache is not
// writable. Threads stand in for processes: flock excludes each open of the file. No GPU.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "compile_lock.h"
#include "disk_cache_test_util.h"

using namespace kiln::rt;
namespace fs = std::filesystem;

namespace {
const std::string kDigest(64, 'a');
}

TEST_CASE("a compile lock excludes a second holder until released, then its file is gone") {
  kiln_test::TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  const fs::path file = tmp.path() / "cache" / "locks" / kDigest;
  std::optional<CompileLock> first = CompileLock::acquire(cache, kDigest);
  REQUIRE(first);
  CHECK(fs::exists(file));

  // Held: another holder gives up after its bound, without the lock.
  const auto start = std::chrono::steady_clock::now();
  std::optional<CompileLock> blocked;
  std::thread([&] { blocked = CompileLock::acquire(cache, kDigest, 0.2); }).join();
  CHECK_FALSE(blocked);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(200));

  // A waiter gets it once the holder releases, from the path's new file.
  std::optional<CompileLock> second;
  std::thread waiter([&] { second = CompileLock::acquire(cache, kDigest, 30); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  first.reset();
  waiter.join();
  REQUIRE(second);
  CHECK(fs::exists(file));
  second.reset();
  CHECK_FALSE(fs::exists(file));

  // Different digests do not wait for each other.
  std::optional<CompileLock> a = CompileLock::acquire(cache, kDigest, 0.1);
  std::optional<CompileLock> b = CompileLock::acquire(cache, std::string(64, 'b'), 0.1);
  CHECK(a);
  CHECK(b);
}

TEST_CASE("no compile lock where the cache is not read-write") {
  kiln_test::TempDir tmp;
  for (CacheMode mode : {CacheMode::read_only, CacheMode::off}) {
    DiskCache cache(tmp.path() / "cache", mode, 0);
    CHECK_FALSE(CompileLock::acquire(cache, kDigest));
    CHECK_FALSE(fs::exists(tmp.path() / "cache" / "locks"));
  }
}
