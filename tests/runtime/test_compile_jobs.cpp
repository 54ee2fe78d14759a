// How many compiles run at once: KILN_COMPILE_JOBS, else the CPUs this process may use (its
// affinity mask) up to the cap, split among the node's ranks, one fewer beside a run. No GPU.
#include <doctest/doctest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "kiln/error.h"
#include "kiln/runtime/compile_jobs.h"

using namespace kiln;

namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(std::string name, std::optional<std::string> v) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    set(v);
  }
  ~EnvVar() { set(old_); }

 private:
  void set(const std::optional<std::string>& v) {
    if (v) {
      ::setenv(name_.c_str(), v->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("compile_jobs_for: the CPUs up to the cap, or KILN_COMPILE_JOBS as given") {
  CHECK(rt::compile_jobs_for(nullptr, 1) == 1);
  CHECK(rt::compile_jobs_for(nullptr, 0) == 1);
  CHECK(rt::compile_jobs_for(nullptr, 8) == 8);
  CHECK(rt::compile_jobs_for(nullptr, rt::kCompileJobsCap) == rt::kCompileJobsCap);
  CHECK(rt::compile_jobs_for(nullptr, 64) == rt::kCompileJobsCap);
  CHECK(rt::compile_jobs_for(nullptr, 64, 4) == rt::kCompileJobsCap / 4);  // a node's ranks share the cap
  CHECK(rt::compile_jobs_for(nullptr, 64, 64) == 1);
  CHECK(rt::compile_jobs_for(nullptr, 6, 4) == 1);
  CHECK(rt::compile_jobs_for("3", 64) == 3);
  CHECK(rt::compile_jobs_for("3", 64, 4) == 3);  // KILN_COMPILE_JOBS is per process
  CHECK(rt::compile_jobs_for("40", 2) == 40);  // asked for: oversubscribing is the user's call
  CHECK(rt::compile_jobs_for("4096", 2) == 4096);
  for (const char* bad : {"0", "-2", "abc", "3x", " 4", "", "4097", "99999999999"}) {
    CAPTURE(bad);
    try {
      (void)rt::compile_jobs_for(bad, 8);
      FAIL("no error for a bad KILN_COMPILE_JOBS");
    } catch (const ValueError& e) {
      const std::string what = e.what();
      CHECK(what.find("KILN_COMPILE_JOBS") != std::string::npos);
      CHECK(what.find("'" + std::string(bad) + "'") != std::string::npos);
    }
  }
}

TEST_CASE("usable_cpus counts the affinity mask, not the host") {
  const int all = rt::usable_cpus();
  CHECK(all >= 1);
  if (const unsigned hw = std::thread::hardware_concurrency(); hw > 0) CHECK(all <= static_cast<int>(hw));
  // This thread confined to one CPU it may use: one usable CPU, and jobs sized to it.
  cpu_set_t before, one;
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  const int confined = rt::usable_cpus();
  int jobs = 0, background = 0;
  {
    EnvVar unset("KILN_COMPILE_JOBS", std::nullopt);
    EnvVar alone("LOCAL_WORLD_SIZE", std::nullopt);
    jobs = rt::compile_jobs();
    background = rt::background_compile_jobs();
  }
  REQUIRE(sched_setaffinity(0, sizeof before, &before) == 0);
  CHECK(confined == 1);
  CHECK(jobs == 1);
  CHECK(background == 1);
  CHECK(rt::usable_cpus() == all);
}

TEST_CASE("compile_jobs and background_compile_jobs read KILN_COMPILE_JOBS and LOCAL_WORLD_SIZE; beside a run one CPU is left") {
  {
    EnvVar set("KILN_COMPILE_JOBS", std::string("5"));
    CHECK(rt::compile_jobs() == 5);
    CHECK(rt::background_compile_jobs() == 5);
  }
  {
    EnvVar bad("KILN_COMPILE_JOBS", std::string("many"));
    CHECK_THROWS_AS(rt::compile_jobs(), ValueError);
    CHECK_THROWS_AS(rt::background_compile_jobs(), ValueError);
  }
  EnvVar unset("KILN_COMPILE_JOBS", std::nullopt);
  const int cpus = rt::usable_cpus();
  {
    EnvVar alone("LOCAL_WORLD_SIZE", std::nullopt);
    CHECK(rt::ranks_on_node() == 1);
    CHECK(rt::compile_jobs() == std::min(cpus, rt::kCompileJobsCap));
    CHECK(rt::background_compile_jobs() == std::max(1, std::min(cpus - 1, rt::kCompileJobsCap)));
  }
  // Under a launcher the node's compiles are shared among its ranks.
  EnvVar four("LOCAL_WORLD_SIZE", std::string("4"));
  CHECK(rt::ranks_on_node() == 4);
  CHECK(rt::compile_jobs() == std::max(1, std::min(cpus, rt::kCompileJobsCap) / 4));
  CHECK(rt::background_compile_jobs() == std::max(1, std::clamp(cpus - 4, 1, rt::kCompileJobsCap) / 4));
  for (const char* odd : {"0", "x", "-3"}) {
    EnvVar bad("LOCAL_WORLD_SIZE", std::string(odd));
    CHECK(rt::ranks_on_node() == 1);
  }
}

TEST_CASE("prefetch_jobs_for: a server per kKernelsPerServer kernels of the plan, up to the background jobs") {
  const int per = rt::kKernelsPerServer;
  CHECK(rt::prefetch_jobs_for(nullptr, 15, 24) == std::min(15, (24 + per - 1) / per));  // a cold mlp run's plan
  CHECK(rt::prefetch_jobs_for(nullptr, 15, 5) == (5 + per - 1) / per);
  CHECK(rt::prefetch_jobs_for(nullptr, 15, 1) == 1);
  CHECK(rt::prefetch_jobs_for(nullptr, 15, 0) == 1);
  CHECK(rt::prefetch_jobs_for(nullptr, 15, static_cast<std::size_t>(per) * 15 + 1) == 15);
  CHECK(rt::prefetch_jobs_for(nullptr, 15, 100000) == 15);
  CHECK(rt::prefetch_jobs_for(nullptr, 0, 48) == 1);
  CHECK(rt::prefetch_jobs_for("12", 15, 6) == 12);  // KILN_COMPILE_JOBS as given, whatever the plan
  CHECK_THROWS_AS((void)rt::prefetch_jobs_for("0", 15, 6), ValueError);
  {
    EnvVar set("KILN_COMPILE_JOBS", std::string("3"));
    CHECK(rt::prefetch_jobs(1000) == 3);
    CHECK(rt::prefetch_jobs(1) == 3);
  }
  EnvVar unset("KILN_COMPILE_JOBS", std::nullopt);
  CHECK(rt::prefetch_jobs(100000) == rt::background_compile_jobs());
  CHECK(rt::prefetch_jobs(1) == 1);
}
