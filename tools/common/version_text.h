#pragma once
// What `--version` prints on kiln's command-line tools.
#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>

namespace kiln::cli {

// "kiln 0.1.0 (commit abc1234-dirty)", "NVRTC 13.0", "CUDA driver 13.0" (or "CUDA driver: not
// found"), one per line, no trailing newline. Needs no GPU.
std::string version_text();
// --version: prints version_text() and exits 0 (through CLI11's CallForVersion).
void add_version_flag(CLI::App& app);
// Parses the command line: help and --version print and give their exit code, a malformed line
// gives on_error(CLI11's message) (the tool's usage error, exit 2); nullopt when the tool goes on.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                      const std::function<int(const std::string&)>& on_error);
// The git commit this binary was built from: short hash, "-dirty" when the tree had changes,
// "unknown" outside a git checkout.
const char* build_commit();

}  // namespace kiln::cli
