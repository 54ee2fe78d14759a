// jitcc show --tune: the choices by measurement a cache remembers, each with its candidates'
// times fastest first, the rejected ones last, filtered by problem; usage errors beside it.
#include "jitcc_test_util.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/tuning.h"

using namespace jitcc_test;
namespace rt = kiln::rt;

namespace {

// Two products' choices and a conv's, as the tuner stores them.
void store_choices(const fs::path& dir) {
  rt::DiskCache cache(dir, rt::CacheMode::read_write, 1 << 30);
  cache.store(
      rt::tune_entry({"cublaslt", "m512 n128 k784", "f32", 90, "cublasLt 130100 ffma"},
                     {"ffma 32x64 s4 k4",
                      "algo55 tile11: 6.9 us\nffma 32x64 s4 k4: 5.25 us\n"
                      "algo20 tile15: rejected, its output disagrees with the reference\nffma 64x64 s4: 8 us\n"}));
  cache.store(rt::tune_entry({"cublaslt", "m10 n128 k512", "bf16", 90, "cublasLt 130100 ffma"},
                             {"algo23 tile11", "algo23 tile11: 2.24 us\nffma 32x64 s4: 2.5 us\n"}));
  cache.store(rt::tune_entry({"conv2d", "n128 c32 h14", "f32", 90, "kiln conv 1"}, {"igemm 128x64", ""}));
}

}  // namespace

TEST_CASE("jitcc show --tune lists each remembered choice's candidates, fastest first, the one that runs marked") {
  ScratchDir dir;
  store_choices(dir.path());
  const ProcessResult all = jitcc({"show", "--tune", "--cache-dir", dir.path().string()});
  INFO(all.out << all.err);
  REQUIRE(all.exit_code == 0);
  CHECK(all.out.find("3 choices in") != std::string::npos);
  CHECK(all.out.find("cublaslt m512 n128 k784 (f32, sm_90, cublasLt 130100 ffma)") != std::string::npos);
  CHECK(all.out.find("5.25 us  ffma 32x64 s4 k4  <- runs") != std::string::npos);
  // Fastest first; a candidate whose output disagreed comes last, with the tuner's words.
  const std::size_t fast = all.out.find("5.25 us"), slow = all.out.find("6.90 us"), slower = all.out.find("8.00 us"),
                    rejected = all.out.find("rejected, its output disagrees");
  CHECK((fast < slow && slow < slower && slower < rejected && rejected != std::string::npos));
  CHECK(all.out.find("igemm 128x64  <- runs (no times recorded)") != std::string::npos);

  const ProcessResult narrow = jitcc({"show", "--tune", "k512", "--cache-dir", dir.path().string()});
  REQUIRE(narrow.exit_code == 0);
  CHECK(narrow.out.find("1 choices matching 'k512'") != std::string::npos);
  CHECK(narrow.out.find("m512 n128 k784") == std::string::npos);

  const nlohmann::json j = jitcc_json({"show", "--tune", "k784", "--cache-dir", dir.path().string()});
  REQUIRE(j.at("choices").size() == 1);
  const nlohmann::json& c = j.at("choices")[0];
  CHECK(c.at("chosen") == "ffma 32x64 s4 k4");
  CHECK(c.at("dtypes") == "f32");
  REQUIRE(c.at("candidates").size() == 4);
  CHECK(c.at("candidates")[0].at("us") == 5.25);
  CHECK(c.at("candidates")[0].at("chosen") == true);
  CHECK(c.at("candidates")[3].at("us").is_null());
  CHECK(c.at("candidates")[3].at("note") == "rejected, its output disagrees with the reference");
}

TEST_CASE("jitcc show --tune: an empty cache has no choices; --plan, --dtypes or --ptx beside it are usage errors") {
  ScratchDir dir;
  const ProcessResult empty = jitcc({"show", "--tune", "--cache-dir", (dir.path() / "none").string()});
  CHECK(empty.exit_code == 0);
  CHECK(empty.out.find("0 choices in") != std::string::npos);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--plan", "run.plan"}, {"--dtypes", "f32"}, {"--ptx"}}) {
    std::vector<std::string> args{"show", "--tune", "--cache-dir", dir.path().string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult r = jitcc(args);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("show --tune prints the cache's choices") != std::string::npos);
  }
}
