// The disk cache across processes: a second process compiles nothing, concurrent
// warms leave a clean cache, and an unwritable directory degrades to memory only.
#include <memory>
#include <set>
#include <tuple>

#include "jitcc_test_util.h"

using namespace jitcc_test;

namespace {

ProcessResult helper(const std::vector<std::string>& args, const fs::path& cache_dir) {
  std::vector<std::string> argv{KILN_TEST_HELPER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return kiln_test::run_process(argv, child_env(cache_dir));
}

}  // namespace

TEST_CASE("a kernel compiled by one process is a disk hit in the next, which compiles nothing") {
  ScratchDir dir;
  const Instance& i = selection().instances.front();
  const std::vector<std::string> args{"warm", i.op, i.dtypes, "sm_90", std::to_string(i.variant)};

  ProcessResult first = helper(args, dir.path());
  INFO("first: " << first.out << first.err);
  REQUIRE(first.exit_code == 0);
  JsonValue a = kiln_test::parse_json(first.out);
  CHECK(a["outcome"].str() == "compiled");
  CHECK(a["compiles"].integer() == 1);
  CHECK(a["disk_hits"].integer() == 0);

  ProcessResult second = helper(args, dir.path());
  INFO("second: " << second.out << second.err);
  REQUIRE(second.exit_code == 0);
  JsonValue b = kiln_test::parse_json(second.out);
  CHECK(b["outcome"].str() == "cached");
  CHECK(b["compiles"].integer() == 0);
  CHECK(b["disk_hits"].integer() == 1);
}

TEST_CASE("4 processes warming one empty cache at once leave every entry, verified clean") {
  ScratchDir dir;
  const auto n = static_cast<std::int64_t>(selection().instances.size());
  std::vector<std::string> args = warm_args(dir.path());
  args.insert(args.end(), {"--jobs", "2", "--json"});

  std::vector<std::unique_ptr<kiln_test::Process>> procs;
  for (int p = 0; p < 4; ++p) procs.push_back(std::make_unique<kiln_test::Process>(jitcc_argv(args), child_env()));
  std::int64_t compiled = 0;
  for (auto& p : procs) {
    ProcessResult r = p->wait();
    INFO("warm: " << r.out << r.err);
    CHECK(r.exit_code == 0);
    JsonValue j = kiln_test::parse_json(r.out);
    CHECK(j["failed"].integer() == 0);
    CHECK(j["compiled"].integer() + j["cached"].integer() == n);
    compiled += j["compiled"].integer();
  }
  CHECK(compiled >= n);  // each kernel compiled by at least one process

  JsonValue v = jitcc_json({"verify", "--cache-dir", dir.path().string()});
  CHECK(v["entries"].integer() == n);
  CHECK(v["bad"].size() == 0);

  std::set<std::tuple<std::string, std::string, std::int64_t>> want, got;
  for (const Instance& i : selection().instances) want.emplace(i.op, i.dtypes, i.variant);
  const JsonValue list = jitcc_json({"list", "--cache-dir", dir.path().string()});
  for (const JsonValue& e : list["entries"].array())
    got.emplace(e["op"].str(), e["dtypes"].str(), e["variant"].integer());
  CHECK(got == want);

  // No temp file was left behind by the racing writers.
  for (const auto& f : fs::recursive_directory_iterator(dir.path()))
    CHECK(f.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("an unwritable cache directory works memory-only, with a warning") {
  ScratchDir dir;
  // Under a regular file no directory can be created, even by root.
  const fs::path blocker = dir.path() / "not-a-directory";
  std::ofstream(blocker) << "x";
  const fs::path cache = blocker / "cache";

  std::vector<std::string> args = warm_args(cache);
  args.insert(args.end(), {"--allow-unstored", "--json"});
  ProcessResult r = jitcc(args);
  INFO("warm: " << r.out << r.err);
  CHECK(r.exit_code == 0);
  JsonValue j = kiln_test::parse_json(r.out);
  CHECK(j["compiled"].integer() == static_cast<std::int64_t>(selection().instances.size()));
  CHECK(j["failed"].integer() == 0);
  CHECK(j["stored"].boolean() == false);
  CHECK(r.err.find("not writable") != std::string::npos);
  CHECK(fs::is_regular_file(blocker));
}
