// The progress line of kiln's CLIs (tools/common/progress_line.h), driven with a fake clock,
// and the position reports of DiskCache's whole-cache scans that feed it.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "kiln/runtime/disk_cache.h"
#include "progress_line.h"
#include "temp_dir.h"

using kiln::cli::ProgressLine;
using namespace std::chrono_literals;

namespace {

struct FakeClock {
  ProgressLine::Clock::time_point t{};
  ProgressLine::Options options(std::vector<std::string> counters = {}) {
    return {.what = "warm", .unit = "kernels", .counters = std::move(counters), .now = [this] { return t; }};
  }
};

std::size_t count(const std::string& s, char c) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), c)); }

}  // namespace

TEST_CASE("progress line: counts, rate and time left") {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine p(out, true, 8, clock.options({"compiled", "cached", "failed"}));
  CHECK(p.text(clock.t) == "warm 0/8 kernels (0%): 0 compiled, 0 cached, 0 failed");
  p.tick(0), p.tick(0), p.tick(1), p.tick(0);
  clock.t += 2s;
  CHECK(p.text(clock.t) == "warm 4/8 kernels (50%): 3 compiled, 1 cached, 0 failed; 2.0 kernels/s, 2s left");
  clock.t += 398s;  // 4 in 400 s: 100 s each, 400 s to go
  CHECK(p.text(clock.t) == "warm 4/8 kernels (50%): 3 compiled, 1 cached, 0 failed; 0.0 kernels/s, 6m40s left");
}

TEST_CASE("progress line: durations") {
  CHECK(kiln::cli::format_duration(0) == "0s");
  CHECK(kiln::cli::format_duration(42.4) == "42s");
  CHECK(kiln::cli::format_duration(187) == "3m07s");
  CHECK(kiln::cli::format_duration(7500) == "2h05m");
}

TEST_CASE("progress line: nothing at all is written when stdout is not a terminal") {
  FakeClock clock;
  std::ostringstream out;
  {
    ProgressLine p(out, false, 100, clock.options({"compiled"}));
    for (int i = 0; i < 100; ++i) {
      clock.t += 1s;
      p.tick();
    }
    p.update(100, 100);
    p.finish();
  }
  CHECK(out.str().empty());
}

TEST_CASE("progress line: draws at once, then at most once per interval; finish erases it") {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine p(out, true, 100, clock.options());
  p.tick();  // the first item shows at once
  CHECK(out.str() == "\rwarm 1/100 kernels (1%)");
  for (int i = 0; i < 9; ++i) {
    clock.t += 10ms;
    p.tick();
  }
  CHECK(count(out.str(), '\r') == 1);  // 90 ms: still throttled
  clock.t += 10ms;
  p.tick();
  CHECK(count(out.str(), '\r') == 2);
  CHECK(out.str().ends_with("\rwarm 11/100 kernels (11%); 110.0 kernels/s, 1s left") == false);
  CHECK(out.str().find("\rwarm 11/100 kernels (11%); 110 kernels/s, 1s left") != std::string::npos);

  const std::size_t drawn = std::string("warm 11/100 kernels (11%); 110 kernels/s, 1s left").size();
  const std::string before = out.str();
  p.finish();
  CHECK(out.str() == before + "\r" + std::string(drawn, ' ') + "\r");
  clock.t += 1s;
  p.tick();
  p.finish();
  CHECK(out.str() == before + "\r" + std::string(drawn, ' ') + "\r");  // nothing after finish
}

TEST_CASE("progress line: nothing to erase when it never drew") {
  std::ostringstream out;
  FakeClock clock;
  ProgressLine(out, true, 5, clock.options()).finish();
  CHECK(out.str().empty());
}

TEST_CASE("progress line: a shorter line covers the longer one; lines fit the terminal") {
  FakeClock clock;
  std::ostringstream out;
  ProgressLine::Options o = clock.options();
  o.what = "list", o.unit = "entries";
  ProgressLine p(out, true, 0, o);
  p.update(500, 1000);  // total learnt from the scan
  const std::string first = "list 500/1000 entries (50%)";
  CHECK(out.str() == "\r" + first);
  clock.t += 1s;
  p.update(999, 1000);
  const std::string second = "list 999/1000 entries (99%); 999 entries/s, 0s left";
  CHECK(out.str() == "\r" + first + "\r" + second);
  clock.t += 1s;
  p.update(3, 4);
  const std::string third = "list 3/4 entries (75%); 1.5 entries/s, 1s left";
  REQUIRE(third.size() < second.size());
  CHECK(out.str().ends_with("\r" + third + std::string(second.size() - third.size(), ' ')));

  std::ostringstream narrow;
  o.columns = 12;
  ProgressLine q(narrow, true, 3, o);
  q.tick();
  CHECK(narrow.str() == "\rlist 1/3 en");  // columns - 1: the cursor never wraps
}

TEST_CASE("progress line: ticks from many threads are all counted") {
  std::ostringstream out;
  ProgressLine p(out, true, 4000, {.what = "warm", .unit = "kernels", .counters = {"compiled", "cached"}});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&p, t] {
      for (int i = 0; i < 1000; ++i) p.tick(static_cast<std::size_t>(t % 2));
    });
  for (auto& t : threads) t.join();
  CHECK(p.text(ProgressLine::Clock::now()).starts_with("warm 4000/4000 kernels (100%): 2000 compiled, 2000 cached"));
  p.finish();
  CHECK(out.str().ends_with("\r"));
}

TEST_CASE("DiskCache::list and gc report their position in the scan") {
  kiln_test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "ab");
  for (int i = 0; i < 3; ++i) std::ofstream(dir.path() / "ab" / ("junk" + std::to_string(i) + ".kiln")) << "x";
  kiln::rt::DiskCache cache(dir.path(), kiln::rt::CacheMode::read_write, 0);

  std::vector<std::pair<std::size_t, std::size_t>> seen;
  const auto record = [&](std::size_t done, std::size_t total) { seen.emplace_back(done, total); };
  CHECK(cache.list(record).size() == 3);
  CHECK(seen == std::vector<std::pair<std::size_t, std::size_t>>{{0, 3}, {1, 3}, {2, 3}});
  seen.clear();
  cache.gc(0, record);
  CHECK(seen == std::vector<std::pair<std::size_t, std::size_t>>{{0, 3}, {1, 3}, {2, 3}});
  CHECK(cache.list().size() == 3);  // "x" is not an entry of kiln's: gc never removes it
}
