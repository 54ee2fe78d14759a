// The store of measured choices (kiln/runtime/tuning.h): entries of kind "tune" in the disk
// cache, read back after the memory is forgotten; what makes two questions different; the
// KILN_TUNE spellings. No GPU: the store is plain files.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/tuning.h"

using namespace kiln::rt;

namespace {

TuneKey key_for(const std::string& problem) { return {"test", problem, "bf16", 90, "lib 1"}; }

// Whether the disk cache stores choices and locks problems here; a message when not.
bool stores_here() {
  const bool rw = DiskCache::global().mode() == CacheMode::read_write;
  if (!rw) MESSAGE("the disk cache is not read-write here: nothing is stored or locked");
  return rw;
}

// A problem no other test or process asks about.
TuneKey unique_key(const std::string& what) {
  return key_for(what + " pid " + std::to_string(::getpid()) + " " +
                 std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
}

}  // namespace

TEST_CASE("a tune entry carries its question and answer, and its digest names every part of the key") {
  const TuneKey k = key_for("m128 n512 k784");
  const Entry e = tune_entry(k, {"algo 6 tile 20", "algo 6 tile 20: 3.1 us\nalgo 1: 4.0 us\n"});
  CHECK(e.key.kind == kTuneKind);
  CHECK(e.key.op == "tune/test");
  CHECK(e.key.dtypes == "bf16");
  CHECK(e.key.digest == entry_digest(e.key, e.source));
  const auto back = tune_entry_choice(e);
  REQUIRE(back);
  CHECK(back->variant == "algo 6 tile 20");
  CHECK(back->detail == "algo 6 tile 20: 3.1 us\nalgo 1: 4.0 us\n");
  for (TuneKey other : {key_for("m128 n512 k785"), TuneKey{"test", k.problem, "f16", 90, "lib 1"},
                        TuneKey{"test", k.problem, "bf16", 80, "lib 1"}, TuneKey{"test", k.problem, "bf16", 90, "lib 2"},
                        TuneKey{"other", k.problem, "bf16", 90, "lib 1"}})
    CHECK(tune_entry_key(other).digest != e.key.digest);
  Entry kernel = e;
  kernel.key.kind = "cubin";
  CHECK_FALSE(tune_entry_choice(kernel));  // a kernel entry is not a choice
}

TEST_CASE("a stored choice is found again from the disk cache once the memory forgets it") {
  const TuneKey k = unique_key("store");
  const TuneMode was = tune_mode();
  set_tune_mode(TuneMode::on);
  CHECK_FALSE(find_choice(k));
  store_choice(k, {"tiles 64x32", "tiles 64x32: 10 us\n"});
  forget_choices_in_memory();
  if (DiskCache::global().mode() == CacheMode::read_write) {
    CHECK(DiskCache::global().contains(tune_entry_key(k).digest));
    const auto c = find_choice(k);
    REQUIRE(c);
    CHECK(c->variant == "tiles 64x32");
  }
  set_tune_mode(TuneMode::off);
  CHECK_FALSE(find_choice(k));  // off: every site takes its heuristic
  set_tune_mode(was);
}

TEST_CASE("a choice another process stored after this one's lookup missed is found under the measuring lock") {
  if (!stores_here()) return;
  const TuneKey k = unique_key("ranks");
  const TuneMode was = tune_mode();
  set_tune_mode(TuneMode::on);
  CHECK_FALSE(find_choice(k));                                             // a miss, remembered
  DiskCache::global().store(tune_entry(k, {"algo 3", "algo 3: 2 us\n"}));  // the other rank measured first
  CHECK_FALSE(find_choice(k));
  const auto stored = find_stored_choice(k);
  REQUIRE(stored);
  CHECK(stored->variant == "algo 3");
  const auto remembered = find_choice(k);
  REQUIRE(remembered);
  CHECK(remembered->variant == "algo 3");
  CHECK_FALSE(find_stored_choice(unique_key("never stored")));
  set_tune_mode(was);
}

TEST_CASE("while one process measures a problem, another waits for it; other problems do not") {
  if (!stores_here()) return;
  const TuneKey k = unique_key("lock");
  auto first = std::make_unique<TuneMeasureLock>(k);
  REQUIRE(first->held());
  {
    const TuneMeasureLock other_problem(unique_key("lock, another problem"));
    CHECK(other_problem.held());
  }
  // Threads stand in for processes: the lock is a flock, which excludes each open of its file.
  std::chrono::steady_clock::time_point got;
  bool held = false;
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    const TuneMeasureLock second(k);
    got = std::chrono::steady_clock::now();
    held = second.held();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  first.reset();
  waiter.join();
  CHECK(held);
  CHECK(got - start >= std::chrono::milliseconds(150));
}

TEST_CASE("KILN_TUNE spellings") {
  CHECK(parse_tune_mode("on") == TuneMode::on);
  CHECK(parse_tune_mode("cached") == TuneMode::cached);
  CHECK(parse_tune_mode("auto") == TuneMode::auto_);
  CHECK(parse_tune_mode("off") == TuneMode::off);
  for (const char* bad : {"", "ON", "1", "yes", "cache"}) CHECK_FALSE(parse_tune_mode(bad));
}
