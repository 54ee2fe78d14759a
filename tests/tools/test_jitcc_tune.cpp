// jitcc tune: refuses bad sizes and precisions with a usage error, says plainly that it needs a
// GPU, and on a GPU stores its measured choices in the cache as "tune" entries that a second
// run finds there (nothing new to measure).
#include <doctest/doctest.h>

#include "jitcc_test_util.h"
#include "kiln/runtime/device.h"

using namespace jitcc_test;

namespace {
constexpr int kUsageExit = 2, kFailureExit = 1;  // jitcc's exits for bad arguments and for failures
}  // namespace

TEST_CASE("jitcc tune refuses bad sizes, precisions and an empty request with usage errors") {
  ScratchDir dir;
  const std::string d = dir.path().string();
  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Bad& b : {Bad{{"--conv", "8,1,28"}, "needs 8 values"}, Bad{{"--conv", "8,1,28,28,32,5,1,x"}, "not an integer"},
                       Bad{{"--conv", "8,1,28,28,32,0,1,2"}, "positive"}, Bad{{"--conv", "8,1,4,4,2,9,1,0"}, "larger"},
                       Bad{{"--linear", "4,5"}, "needs 3 values"}, Bad{{"--linear", "4,5,6", "--precision", "fp8"}, "fp8"},
                       Bad{{}, "at least one --conv or --linear"}}) {
    std::vector<std::string> args{"tune", "--cache-dir", d};
    args.insert(args.end(), b.args.begin(), b.args.end());
    const ProcessResult r = jitcc(args);
    CAPTURE(b.says);
    CHECK(r.exit_code == kUsageExit);
    CHECK(r.err.find(b.says) != std::string::npos);
  }
}

TEST_CASE("jitcc tune stores its choices in the cache; a second run measures nothing new") {
  ScratchDir dir;
  const std::string d = dir.path().string();
  const std::vector<std::string> args{"tune", "--conv", "8,16,12,12,32,3,1,1", "--linear", "16,64,32",
                                      "--precision", "default,bf16", "--cache-dir", d};
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    const ProcessResult r = jitcc(args);
    CHECK(r.exit_code == kFailureExit);
    CHECK(r.err.find("GPU") != std::string::npos);
    return;
  }
  const nlohmann::json first = jitcc_json(args);
  CHECK(first.at("new_choices").get<int>() > 0);
  CHECK(first.at("choices").get<int>() == first.at("new_choices").get<int>());
  const nlohmann::json second = jitcc_json(args);
  CHECK(second.at("new_choices").get<int>() == 0);
  CHECK(second.at("choices") == first.at("choices"));
  // They are listed with the kernels, as entries of kind "tune".
  const nlohmann::json list = jitcc_json({"list", "--cache-dir", d});
  CHECK(list.dump().find("\"tune\"") != std::string::npos);
}
