// The store of measured choices (kiln/runtime/tuning.h): entries of kind "tune" in the disk
// cache, read back after the memory is forgotten; what makes two questions different; the
// KILN_TUNE spellings. No GPU: the store is plain files.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <unistd.h>

#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/tuning.h"

using namespace kiln::rt;

namespace {

TuneKey key_for(const std::string& problem) { return {"test", problem, "bf16", 90, "lib 1"}; }

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
  const TuneKey k = key_for("store pid " + std::to_string(::getpid()) + " " +
                            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
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

TEST_CASE("KILN_TUNE spellings") {
  CHECK(parse_tune_mode("on") == TuneMode::on);
  CHECK(parse_tune_mode("cached") == TuneMode::cached);
  CHECK(parse_tune_mode("auto") == TuneMode::auto_);
  CHECK(parse_tune_mode("off") == TuneMode::off);
  for (const char* bad : {"", "ON", "1", "yes", "cache"}) CHECK_FALSE(parse_tune_mode(bad));
}
