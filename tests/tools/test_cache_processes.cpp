// The disk cache across processes: a second process compiles nothing, concurrent warms
// compile each kernel once (compile_lock.h) and leave a clean cache, and an unwritable
// directory degrades to memory only.
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
  nlohmann::json a = nlohmann::json::parse(first.out);
  CHECK(a.at("outcome") == "compiled");
  CHECK(a.at("compiles") == 1);
  CHECK(a.at("disk_hits") == 0);

  ProcessResult second = helper(args, dir.path());
  INFO("second: " << second.out << second.err);
  REQUIRE(second.exit_code == 0);
  nlohmann::json b = nlohmann::json::parse(second.out);
  CHECK(b.at("outcome") == "cached");
  CHECK(b.at("compiles") == 0);
  CHECK(b.at("disk_hits") == 1);
}

TEST_CASE("4 processes warming one empty cache at once compile each kernel once and leave every entry, verified clean") {
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
    nlohmann::json j = nlohmann::json::parse(r.out);
    CHECK(j.at("failed") == 0);
    CHECK(j.at("compiled").get<std::int64_t>() + j.at("cached").get<std::int64_t>() == n);
    compiled += j.at("compiled").get<std::int64_t>();
  }
  CHECK(compiled == n);  // each kernel compiled by one process: the others waited for its entry

  nlohmann::json v = jitcc_json({"verify", "--cache-dir", dir.path().string()});
  CHECK(v.at("entries") == n);
  CHECK(v.at("bad").size() == 0);

  std::set<std::tuple<std::string, std::string, std::int64_t>> want, got;
  for (const Instance& i : selection().instances) want.emplace(i.op, i.dtypes, i.variant);
  const nlohmann::json list = jitcc_json({"list", "--cache-dir", dir.path().string()});
  for (const nlohmann::json& e : list.at("entries"))
    got.emplace(e.at("op").get<std::string>(), e.at("dtypes").get<std::string>(), e.at("variant").get<std::int64_t>());
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
  nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.at("compiled") == static_cast<std::int64_t>(selection().instances.size()));
  CHECK(j.at("failed") == 0);
  CHECK(j.at("stored").get<bool>() == false);
  CHECK(r.err.find("not writable") != std::string::npos);
  CHECK(fs::is_regular_file(blocker));
}
