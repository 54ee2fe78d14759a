#pragma once
// Shared pieces of jitcc's subcommands: options every subcommand takes, argument
// parsing that fails with a clean message, output in text or JSON.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/kernel_registry.h"
#include "progress_line.h"

namespace jitcc {

// --json output; objects keep their keys in insertion order.
using Json = nlohmann::ordered_json;
// One line; invalid UTF-8 (a path, an NVRTC log) becomes U+FFFD, so the output always parses.
inline std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Bad arguments: main prints the message and exits with kUsageExit.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kFailureExit = 1;
inline constexpr int kUsageExit = 2;

struct Common {
  std::string cache_dir;  // empty: DiskCache::default_dir()
  bool json = false;
};

// What main runs once CLI11 has parsed the command line.
struct Context {
  Common common;
  std::function<int()> run;
};

// Adds --cache-dir and --json to a subcommand.
void add_common_options(CLI::App& sub, Common& common);
// CLI11 gives an option the next argument even when it is a flag ("--cache-dir --json").
const CLI::Validator& not_a_flag();
// Points the process-wide cache at --cache-dir; must run before any cache use.
void apply_cache_dir(const Common& common);
std::filesystem::path cache_dir(const Common& common);
// Why `dir` cannot hold a cache ("" when it can, or can be created): the path or an ancestor
// is not a directory, or (with `writing`) the nearest existing directory takes no writes.
std::string cache_dir_problem(const std::filesystem::path& dir, bool writing);
// A DiskCache on the chosen directory for inspecting and editing it, whatever
// KILN_CACHE says (the user asked for exactly this directory).
kiln::rt::DiskCache unchecked_cache(const Common& common);
// The same, after checking that the path is a directory (or absent): std::runtime_error if not.
kiln::rt::DiskCache open_cache(const Common& common);

// A progress line on stdout, drawn only when stdout is a terminal and --json is not given.
kiln::cli::ProgressLine progress_line(const Common& common, std::string what, std::string unit, std::size_t total,
                                      std::vector<std::string> counters = {});
// cache.list(), with a progress line led by `what` while it reads every entry; std::runtime_error
// naming each directory that could not be read (an unreadable cache is not an empty one).
std::vector<kiln::rt::EntryInfo> list_entries(const kiln::rt::DiskCache& cache, const Common& common,
                                              const std::string& what);
// Before clear, gc or verify --fix remove anything: std::runtime_error when the directory does
// not look like a kiln cache, unless `force`. A cache made before kiln wrote its marker gets one.
void require_kiln_cache(const kiln::rt::DiskCache& cache, bool force, const std::string& command);
// Up to five problems of a pass over the cache, joined with "; ", then how many more.
std::string join_problems(const std::vector<std::string>& problems);

// Prints `json` (with --json) or `text` to stdout.
void emit(const Common& common, const Json& json, const std::string& text);
void warn(const std::string& message);  // "jitcc: warning: ..." on stderr

std::vector<std::string> split_list(const std::string& text);
// "all": every registered kernel; otherwise the named ones (unknown or none -> UsageError).
std::vector<const kiln::rt::KernelSpec*> select_kernels(const std::string& ops);
// "all": nullopt (no filter); otherwise the named dtypes (unknown or none -> UsageError).
std::optional<std::vector<kiln::DType>> parse_dtype_filter(const std::string& dtypes);
// Bytes, or a number with a K/M/G suffix (binary multiples); UsageError otherwise.
std::uint64_t parse_size(const std::string& text);
// "auto": device 0's arch (UsageError without a GPU); else an arch NVRTC supports.
int resolve_arch(const std::string& text);
std::vector<int> nvrtc_supported_archs();

// What people see for an entry: a generated kernel's label, else its op.
inline std::string entry_name(const kiln::rt::EntryKey& k) { return k.label.empty() ? k.op : k.label; }
std::string arch_name(int arch);                  // "sm_90"
std::string iso_time(std::int64_t unix_seconds);  // "2024-05-01T12:00:00Z"
std::string human_bytes(std::uint64_t bytes);     // "1.5 MiB"
// Left-aligned columns; the first row is the header.
std::string table(const std::vector<std::vector<std::string>>& rows);

void add_warm(CLI::App& app, Context& ctx);
void add_list(CLI::App& app, Context& ctx);
void add_dump(CLI::App& app, Context& ctx);
void add_show(CLI::App& app, Context& ctx);
// jitcc show --plan FILE: the plan's compiled steps, group by group (cmd_show_steps.cpp).
int show_plan_steps(const std::string& file, const Common& common);
// jitcc show --tune [FILTER] (cmd_show_tune.cpp): the cache's choices by measurement whose
// problem contains `filter`, each candidate's time.
int show_tune_choices(const std::string& filter, const Common& common);
void add_verify(CLI::App& app, Context& ctx);
void add_gc(CLI::App& app, Context& ctx);
void add_clear(CLI::App& app, Context& ctx);
void add_stats(CLI::App& app, Context& ctx);
void add_tune(CLI::App& app, Context& ctx);

}  // namespace jitcc
