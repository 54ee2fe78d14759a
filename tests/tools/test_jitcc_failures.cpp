// jitcc exit codes when kernels are compiled but not stored, and when the cache
// directory or an argument cannot be used.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>

#include "jitcc_test_util.h"

using namespace jitcc_test;

namespace {

std::int64_t instance_count() { return static_cast<std::int64_t>(selection().instances.size()); }

nlohmann::json warm_json(const fs::path& cache, int expect_exit, const kiln_test::EnvOverrides& env = {},
                         std::vector<std::string> extra = {}) {
  std::vector<std::string> args = warm_args(cache);
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("--json");
  ProcessResult r = jitcc(args, env);
  INFO("warm stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == expect_exit);
  return nlohmann::json::parse(r.out);
}

void set_age(const fs::path& p, std::int64_t seconds) {
  const auto t = std::chrono::system_clock::now() - std::chrono::seconds(seconds);
  const std::int64_t s = std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
  const struct timespec times[2] = {{s, 0}, {s, 0}};
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

}  // namespace

TEST_CASE("jitcc warm exits 1 when nothing is stored, unless --allow-unstored") {
  ScratchDir dir;
  SUBCASE("the cache directory is under a regular file") {
    std::ofstream(dir.path() / "file") << "x";
    const fs::path cache = dir.path() / "file" / "cache";
    nlohmann::json j = warm_json(cache, 1);
    CHECK(j.at("compiled") == instance_count());
    CHECK(j.at("failed") == 0);
    CHECK(j.at("stored").get<bool>() == false);
    CHECK(j.at("stored_kernels") == 0);
    CHECK(warm_json(cache, 0, {}, {"--allow-unstored"}).at("stored_kernels") == 0);
  }
  SUBCASE("KILN_CACHE_MAX_SIZE=1 evicts every entry as it is stored") {
    ProcessResult r = jitcc(warm_args(dir.path()), {{"KILN_CACHE_MAX_SIZE", "1"}});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("stored 0 of " + std::to_string(instance_count())) != std::string::npos);
    CHECK(r.err.find("KILN_CACHE_MAX_SIZE") != std::string::npos);
    CHECK(entry_files(dir.path()).empty());
    CHECK(jitcc(warm_args(dir.path()), {{"KILN_CACHE_MAX_SIZE", "1"}}).exit_code == 1);  // not stored: not cached
  }
  SUBCASE("KILN_CACHE_MAX_SIZE=0 means no bound") {
    nlohmann::json j = warm_json(dir.path(), 0, {{"KILN_CACHE_MAX_SIZE", "0"}});
    CHECK(j.at("stored").get<bool>());
    CHECK(j.at("stored_kernels") == instance_count());
    CHECK(static_cast<std::int64_t>(entry_files(dir.path()).size()) == instance_count());
  }
}

TEST_CASE("jitcc warm reports the true counts when writes start failing part way") {
  // Find each instance's shard in a warmed cache, then block the last instance's shard with a
  // regular file: writes before it succeed, it fails, and the cache goes memory-only after.
  ScratchDir seed;
  copy_warmed_cache(seed.path());
  std::vector<std::string> shards;
  nlohmann::json list = jitcc_json({"list", "--cache-dir", seed.path().string()});
  for (const Instance& i : selection().instances)
    for (const nlohmann::json& e : list.at("entries"))
      if (e.at("op") == i.op && e.at("dtypes") == i.dtypes && e.at("variant") == i.variant)
        shards.push_back(e.at("digest").get<std::string>().substr(0, 2));
  REQUIRE(shards.size() == selection().instances.size());
  const std::string blocked = shards.back();
  const std::int64_t stored = std::find(shards.begin(), shards.end(), blocked) - shards.begin();

  ScratchDir dir;
  std::ofstream(dir.path() / blocked) << "not a shard";
  ProcessResult r = jitcc([&] {
    auto a = warm_args(dir.path());
    a.insert(a.end(), {"--jobs", "1"});
    return a;
  }());
  CHECK(r.exit_code == 1);
  const std::string counts = "stored " + std::to_string(stored) + " of " + std::to_string(instance_count());
  CHECK(r.err.find(counts) != std::string::npos);
  CHECK(r.err.find("nothing was stored") == std::string::npos);
  CHECK(static_cast<std::int64_t>(entry_files(dir.path()).size()) == stored);
}

TEST_CASE("jitcc treats a cache path that is a regular file as an error") {
  ScratchDir dir;
  const fs::path file = dir.path() / "file";
  std::ofstream(file) << "x";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"verify"}, {"list"}, {"gc", "--max-size", "1M"}, {"clear"}, {"stats"}}) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--cache-dir", file.string()});
    ProcessResult r = jitcc(a);
    INFO("jitcc " << args.front() << ": " << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("not a directory") != std::string::npos);
  }
  nlohmann::json stats = jitcc_json({"stats", "--cache-dir", file.string()}, 1);
  CHECK(stats.at("writable").get<bool>() == false);
  CHECK(fs::is_regular_file(file));
}

TEST_CASE("jitcc refuses option values that look like flags, empty selections and compute_XX") {
  ScratchDir dir;
  const std::string op = selection().instances.front().op;
  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<Case> cases{
      {{"stats", "--cache-dir", "--json"}, "--cache-dir"},
      {{"warm", "--ops", "", "--arch", "sm_90", "--cache-dir", dir.path().string()}, "--ops"},
      {{"warm", "--ops", ",,,", "--arch", "sm_90", "--cache-dir", dir.path().string()}, "--ops"},
      {{"warm", "--ops", op, "--dtypes", "", "--arch", "sm_90", "--cache-dir", dir.path().string()}, "--dtypes"},
      {{"dump", "--ops", ",", "--out", (dir.path() / "out").string(), "--cache-dir", dir.path().string()}, "--ops"},
      {{"warm", "--ops", op, "--arch", "compute_90", "--cache-dir", dir.path().string()}, "compute_90"},
  };
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());  // where a directory named "--json" would appear
  for (const Case& c : cases) {
    ProcessResult r = jitcc(c.args);
    INFO("jitcc " << c.args.front() << " " << c.args[1] << " '" << c.args[2] << "': " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.named) != std::string::npos);
  }
  fs::current_path(cwd);
  CHECK(!fs::exists(dir.path() / "--json"));
  CHECK(entry_files(dir.path()).empty());
}

TEST_CASE("jitcc warm and gc remove temp files of dead writers, not of live ones") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const fs::path shard = entry_files(dir.path()).front().parent_path();
  const fs::path dead = shard / (".tmp-" + std::string(64, 'a') + "-999999-1-2");
  const fs::path live = shard / (".tmp-" + std::string(64, 'b') + "-999999-3-4");
  std::ofstream(dead) << "half-written by a killed jitcc";
  std::ofstream(live) << "being written";
  set_age(dead, 30);
  set_age(live, 30);
  const int fd = ::open(live.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // what a writer holds while it writes

  SUBCASE("warm") { CHECK(jitcc(warm_args(dir.path())).exit_code == 0); }
  SUBCASE("gc") { CHECK(jitcc({"gc", "--max-size", "1G", "--cache-dir", dir.path().string()}).exit_code == 0); }
  CHECK(!fs::exists(dead));
  CHECK(fs::exists(live));
  ::close(fd);
  CHECK(jitcc({"gc", "--max-size", "1G", "--cache-dir", dir.path().string()}).exit_code == 0);
  CHECK(!fs::exists(live));
}

TEST_CASE("jitcc warm --jobs: 0 is KILN_COMPILE_JOBS or the usable CPUs up to 16 (documented), below 0 a usage error") {
  ScratchDir dir;
  const ProcessResult help = jitcc({"warm", "--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("0 (the default): KILN_COMPILE_JOBS, else one per usable CPU up to 16") != std::string::npos);

  std::vector<std::string> args = warm_args(dir.path());
  args.insert(args.end(), {"--jobs", "-1"});
  const ProcessResult negative = jitcc(args);
  CHECK(negative.exit_code == 2);
  CHECK(negative.err.find("--jobs must be 0 (KILN_COMPILE_JOBS, else one per usable CPU up to 16) or more, got -1") !=
        std::string::npos);
  CHECK(entry_files(dir.path()).empty());

  args.back() = "0";
  args.push_back("--json");
  const ProcessResult bad_env = jitcc(args, {{"KILN_COMPILE_JOBS", "lots"}});
  CHECK(bad_env.exit_code == 2);
  CHECK(bad_env.out.find("KILN_COMPILE_JOBS must be a whole number from 1 to 4096, got 'lots'") != std::string::npos);
  CHECK(entry_files(dir.path()).empty());

  const ProcessResult zero = jitcc(args, {{"KILN_COMPILE_JOBS", "2"}});
  INFO(zero.err);
  CHECK(zero.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(zero.out);
  CHECK(j.at("compiled") == static_cast<std::int64_t>(selection().instances.size()));
  CHECK(j.at("threads") == std::min<std::int64_t>(2, static_cast<std::int64_t>(selection().instances.size())));
}

TEST_CASE("jitcc list, verify, gc, clear and stats fail naming a cache directory they cannot read") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const std::string cache = dir.path().string();
  // A shard replaced by a file: unreadable for root too (chmod 000 is not).
  const fs::path shard = entry_files(dir.path()).front().parent_path();
  fs::remove_all(shard);
  std::ofstream(shard) << "not a directory";
  const std::vector<std::vector<std::string>> commands{
      {"list"}, {"verify"}, {"gc", "--max-size", "1G"}, {"clear"}, {"stats"}};
  for (std::vector<std::string> args : commands) {
    args.insert(args.end(), {"--cache-dir", cache});
    ProcessResult r = jitcc(args);
    INFO("jitcc " << args.front() << ": " << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("cannot read directory " + shard.string() + ": Not a directory") != std::string::npos);
  }
  CHECK(!jitcc_json({"stats", "--cache-dir", cache}, 1).at("unreadable").empty());
  CHECK(fs::is_regular_file(shard));
  CHECK(!entry_files(dir.path()).empty());  // clear refused to go on half blind

  if (::geteuid() == 0) return;  // root reads a mode-000 directory
  ScratchDir locked;
  copy_warmed_cache(locked.path());
  fs::permissions(locked.path(), fs::perms::none);
  for (std::vector<std::string> args : commands) {
    args.insert(args.end(), {"--cache-dir", locked.path().string()});
    ProcessResult r = jitcc(args);
    INFO("jitcc " << args.front() << ": " << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(locked.path().string()) != std::string::npos);
    CHECK(r.err.find("Permission denied") != std::string::npos);
  }
  fs::permissions(locked.path(), fs::perms::owner_all);
}

TEST_CASE("jitcc gc on a read-only cache says which file it could not remove and why") {
  if (::geteuid() == 0) return;  // root removes files from a read-only directory
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  std::vector<fs::path> shards;
  for (const fs::path& f : entry_files(dir.path())) shards.push_back(f.parent_path());
  for (const fs::path& s : shards) fs::permissions(s, fs::perms::owner_read | fs::perms::owner_exec);
  ProcessResult r = jitcc({"gc", "--max-size", "1K", "--cache-dir", dir.path().string()});
  for (const fs::path& s : shards) fs::permissions(s, fs::perms::owner_all);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("cannot remove " + dir.path().string()) != std::string::npos);
  CHECK(r.err.find("Permission denied") != std::string::npos);
}

TEST_CASE("jitcc resolves a relative KILN_CACHE_DIR against the current directory and names it in full") {
  ScratchDir dir;
  std::ofstream(dir.path() / "afile") << "x";
  auto stats_in = [&](const std::string& cache_dir, bool json) {
    // The child starts in `dir`: a shell changes directory, then becomes jitcc.
    const std::string cmd =
        "cd '" + dir.path().string() + "' && exec " + KILN_JITCC_PATH + " stats" + (json ? " --json" : "");
    kiln_test::EnvOverrides env = child_env(cache_dir);
    ProcessResult r = kiln_test::run_process({"/bin/sh", "-c", cmd}, env);
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    return r;
  };
  ProcessResult ok = stats_in("relative-dir", true);
  CHECK(ok.exit_code == 0);
  CHECK(nlohmann::json::parse(ok.out).at("cache_dir") == (dir.path() / "relative-dir").string());
  CHECK(stats_in("relative-dir", false).out.find((dir.path() / "relative-dir").string()) != std::string::npos);

  ProcessResult bad = stats_in("afile/sub", false);
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find((dir.path() / "afile" / "sub").string()) != std::string::npos);
  CHECK(bad.err.find((dir.path() / "afile").string() + " is not a directory") != std::string::npos);
}

TEST_CASE("jitcc show of a generated kernel missing from the cache says how kernels get there") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  ProcessResult r = jitcc({"show", "fused(mul,add,relu) f32", "--cache-dir", dir.path().string()});
  INFO(r.err);
  CHECK(r.exit_code == 2);  // as for an unknown op
  CHECK(r.out.empty());
  CHECK(r.err.find("'fused(mul,add,relu) f32' is not in the cache " + dir.path().string()) != std::string::npos);
  CHECK(r.err.find("jitcc warm --from-cache") != std::string::npos);
  CHECK(r.err.find("show takes one op") == std::string::npos);
}
