// What jitcc and mnist-train show a person at a terminal: jitcc's progress line (drawn only
// when stdout is a terminal and --json is not given) and `--version`.
#include <regex>

#include "jitcc_test_util.h"
#include "terminal_process.h"

using namespace jitcc_test;

namespace {

// jitcc warm's summary, exactly as it was before the progress line existed.
std::regex warm_summary(std::size_t kernels, const fs::path& cache) {
  return std::regex(std::to_string(kernels) + " kernels for sm_90 in [0-9]+\\.[0-9]{2} s: " + std::to_string(kernels) +
                    " compiled, 0 already cached, 0 failed \\(1 threads\\)\ncache: " + cache.string() + "\n");
}

// "kiln 0.1.0 (commit abc1234-dirty)", the NVRTC line and the driver line, nothing else.
void check_version_text(const std::string& out) {
  const std::regex want(std::string("kiln ") + kiln::version() +
                        " \\(commit ([0-9a-f]{7,}(-dirty)?|unknown)\\)\n"
                        "NVRTC [0-9]+\\.[0-9]+\n"
                        "CUDA driver( [0-9]+\\.[0-9]+|: not found)\n");
  CHECK_MESSAGE(std::regex_match(out, want), out);
}

}  // namespace

TEST_CASE("jitcc warm: piped output is only the summary; on a terminal a progress line comes first, then is erased") {
  const std::size_t n = selection().instances.size();
  ScratchDir piped_cache, tty_cache;
  std::vector<std::string> args = warm_args(piped_cache.path());
  args.insert(args.end(), {"--jobs", "1"});
  ProcessResult piped = jitcc(args);
  CHECK(piped.exit_code == 0);
  CHECK(piped.out.find('\r') == std::string::npos);
  CHECK_MESSAGE(std::regex_match(piped.out, warm_summary(n, piped_cache.path())), piped.out);

  args = warm_args(tty_cache.path());
  args.insert(args.end(), {"--jobs", "1"});
  const ProcessResult tty = jitcc_on_terminal(args);
  CHECK(tty.out.starts_with("\rwarm 1/" + std::to_string(n) + " kernels ("));
  CHECK(tty.out.find(" compiled, 0 cached, 0 failed; ") != std::string::npos);
  CHECK(tty.out.find(" left") != std::string::npos);
  CHECK_MESSAGE(std::regex_match(after_progress(tty.out), warm_summary(n, tty_cache.path())), tty.out);
  // Erased with spaces just before the summary.
  const std::string before = tty.out.substr(0, tty.out.rfind('\r'));
  CHECK(before.substr(before.rfind('\r') + 1).find_first_not_of(' ') == std::string::npos);

  args.push_back("--json");
  const ProcessResult json = jitcc_on_terminal(args);
  CHECK(json.out.find('\r') == std::string::npos);
  CHECK(nlohmann::json::parse(json.out).at("cached") == static_cast<std::int64_t>(n));
}

TEST_CASE("jitcc verify, list and gc: the same output on a terminal once the progress line is gone") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const std::string cache = dir.path().string();
  const std::string n = std::to_string(selection().instances.size());
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> phases;  // how each phase's line starts
  };
  const std::string of_n = " 0/" + n + " entries (0%)";
  for (const Case& c :
       {Case{{"verify", "--cache-dir", cache}, {"\rverify: reading" + of_n, "\rverify: checking 1/" + n}},
        Case{{"list", "--cache-dir", cache}, {"\rlist" + of_n}},
        Case{{"gc", "--max-size", "1G", "--cache-dir", cache},
             {"\rgc: reading" + of_n, "\rgc: collecting" + of_n, "\rgc: counting" + of_n}}}) {
    CAPTURE(c.args.front());
    const ProcessResult piped = jitcc(c.args);
    CHECK(piped.exit_code == 0);
    CHECK(piped.out.find('\r') == std::string::npos);
    const ProcessResult tty = jitcc_on_terminal(c.args);
    CHECK_MESSAGE(tty.out.starts_with(c.phases.front()), tty.out);
    for (const std::string& phase : c.phases) CHECK_MESSAGE(tty.out.find(phase) != std::string::npos, phase);
    CHECK(after_progress(tty.out) == piped.out);

    std::vector<std::string> json_args = c.args;
    json_args.push_back("--json");
    CHECK(jitcc_on_terminal(json_args).out.find('\r') == std::string::npos);
  }
}

TEST_CASE("jitcc --version and mnist-train --version: kiln's version and commit, NVRTC's and the driver's") {
  const ProcessResult j = jitcc({"--version"});
  CHECK(j.exit_code == 0);
  check_version_text(j.out);

  REQUIRE_MESSAGE(std::string(KILN_MNIST_TRAIN_PATH) != "", "mnist-train was not built (KILN_BUILD_EXAMPLES=OFF)");
  const ProcessResult m = kiln_test::run_process({KILN_MNIST_TRAIN_PATH, "--version"}, child_env());
  CHECK(m.exit_code == 0);
  check_version_text(m.out);
  CHECK(m.out == j.out);  // one text, one commit: both binaries came from this build
}
