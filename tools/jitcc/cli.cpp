#include "cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <limits>
#include <thread>

#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/device.h"

namespace jitcc {

namespace rt = kiln::rt;

const CLI::Validator& not_a_flag() {
  static const CLI::Validator v(
      [](const std::string& value) {
        return value.size() > 1 && value[0] == '-'
                   ? "'" + value + "' is an option, not a value (for a path, write ./" + value + ")"
                   : std::string();
      },
      "");
  return v;
}

void add_common_options(CLI::App& sub, Common& common) {
  sub.add_option("--cache-dir", common.cache_dir,
                 "Cache directory (default: $KILN_CACHE_DIR, else "
                 "$XDG_CACHE_HOME/kiln, else ~/.cache/kiln)")
      ->check(not_a_flag());
  sub.add_flag("--json", common.json, "Print one JSON object on stdout (logs go to stderr)");
}

void apply_cache_dir(const Common& common) {
  // DiskCache::global() reads the environment once, on first use.
  if (!common.cache_dir.empty()) ::setenv("KILN_CACHE_DIR", std::filesystem::absolute(common.cache_dir).c_str(), 1);
}

std::filesystem::path cache_dir(const Common& common) {
  // Absolute, so that every message names the directory in full (KILN_CACHE_DIR may be relative).
  return std::filesystem::absolute(common.cache_dir.empty() ? rt::DiskCache::default_dir()
                                                            : std::filesystem::path(common.cache_dir));
}

std::string cache_dir_problem(const std::filesystem::path& dir, bool writing) {
  // The nearest existing ancestor decides whether the rest of the path can be created.
  for (std::filesystem::path p = dir;; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if ((errno == ENOENT || errno == ENOTDIR) && p != p.parent_path() && !p.parent_path().empty()) continue;
      return "cannot inspect " + dir.string() + (p == dir ? "" : " (at " + p.string() + ")") + ": " +
             std::strerror(errno);
    }
    if (!S_ISDIR(st.st_mode))
      return p == dir ? dir.string() + " is not a directory"
                      : dir.string() + " cannot be created: " + p.string() + " is not a directory";
    if (writing && ::access(p.c_str(), W_OK | X_OK) != 0)
      return (p == dir ? dir.string() : dir.string() + " cannot be created: " + p.string()) + " is not writable (" +
             std::strerror(errno) + ")";
    return "";
  }
}

rt::DiskCache unchecked_cache(const Common& common) {
  return rt::DiskCache(cache_dir(common), rt::CacheMode::read_write, std::numeric_limits<std::uint64_t>::max());
}

rt::DiskCache open_cache(const Common& common) {
  if (std::string problem = cache_dir_problem(cache_dir(common), false); !problem.empty())
    throw std::runtime_error("cache directory " + problem);
  return unchecked_cache(common);
}

kiln::cli::ProgressLine progress_line(const Common& common, std::string what, std::string unit, std::size_t total,
                                      std::vector<std::string> counters) {
  return kiln::cli::ProgressLine(std::cout, kiln::cli::progress_wanted(common.json), total,
                                 {.what = std::move(what),
                                  .unit = std::move(unit),
                                  .counters = std::move(counters),
                                  .columns = kiln::cli::terminal_columns()});
}

std::vector<rt::EntryInfo> list_entries(const rt::DiskCache& cache, const Common& common, const std::string& what) {
  auto progress = progress_line(common, what, "entries", 0);
  std::vector<std::string> problems;
  std::vector<rt::EntryInfo> entries = cache.list(progress.as_callback(), &problems);
  progress.finish();
  if (!problems.empty()) throw std::runtime_error("cache " + cache.dir().string() + ": " + join_problems(problems));
  return entries;
}

void require_kiln_cache(const rt::DiskCache& cache, bool force, const std::string& command) {
  if (force) return;
  if (std::string why = cache.foreign_reason(); !why.empty())
    throw std::runtime_error(cache.dir().string() + " does not look like a kiln cache (" + why + "); " + command +
                             " removed nothing. If it is one, run 'jitcc " + command +
                             " --force': it removes kiln's entries and temp files only, never other files");
  cache.write_marker();  // a cache made before the marker: recognised by its entries, marked now
}

std::string join_problems(const std::vector<std::string>& problems) {
  std::string out;
  for (std::size_t i = 0; i < problems.size() && i < 5; ++i) out += (i ? "; " : "") + problems[i];
  if (problems.size() > 5) out += "; and " + std::to_string(problems.size() - 5) + " more";
  return out;
}

void emit(const Common& common, const Json& json, const std::string& text) {
  const std::string out = common.json ? dump_json(json) + "\n" : text;
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

void warn(const std::string& message) { std::fprintf(stderr, "jitcc: warning: %s\n", message.c_str()); }

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string part = text.substr(start, comma - start);
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty()) out.push_back(part);
    start = comma + 1;
  }
  return out;
}

std::vector<const rt::KernelSpec*> select_kernels(const std::string& ops) {
  const auto& all = rt::registered_kernels();
  if (ops == "all") return all;
  std::vector<const rt::KernelSpec*> out;
  for (const std::string& name : split_list(ops)) {
    const rt::KernelSpec* spec = rt::find_kernel(name);
    if (!spec) {
      std::string known;
      for (const auto* s : all) known += (known.empty() ? "" : " ") + s->op;
      throw UsageError("unknown op '" + name + "' (registered: " + known + ")");
    }
    if (std::find(out.begin(), out.end(), spec) == out.end()) out.push_back(spec);
  }
  if (out.empty()) throw UsageError("--ops names no op");
  return out;
}

std::optional<std::vector<kiln::DType>> parse_dtype_filter(const std::string& dtypes) {
  if (dtypes == "all") return std::nullopt;
  std::vector<kiln::DType> out;
  for (const std::string& name : split_list(dtypes)) {
    auto t = kiln::parse_dtype(name);
    if (!t) {
      std::string known;
      for (kiln::DType k : kiln::kAllDTypes) known += (known.empty() ? "" : " ") + std::string(kiln::dtype_name(k));
      throw UsageError("unknown dtype '" + name + "' (known: " + known + ")");
    }
    out.push_back(*t);
  }
  if (out.empty()) throw UsageError("--dtypes names no dtype");
  return out;
}

std::uint64_t parse_size(const std::string& text) {
  // The grammar KILN_CACHE_MAX_SIZE uses, so one size means the same everywhere.
  if (auto n = rt::DiskCache::parse_size(text)) return *n;
  throw UsageError("invalid size '" + text + "': expected bytes, or a number with a K, M or G suffix (e.g. 500M)");
}

std::vector<int> nvrtc_supported_archs() {
  std::vector<int> out;
  for (int a = 10; a < 1000; ++a)
    if (rt::nvrtc_can_emit_cubin(a)) out.push_back(a);
  return out;
}

int resolve_arch(const std::string& text) {
  if (text == "auto") {
    std::string why;
    if (!rt::gpu_available(&why))
      throw UsageError("--arch auto needs a GPU (" + why + "); pass --arch sm_XX to compile without one");
    return rt::device_info(0).arch();
  }
  // compute_XX would name a PTX-only target; warm stores CUBIN and PTX for sm_XX, never PTX alone.
  if (text.rfind("compute_", 0) == 0)
    throw UsageError("bad --arch '" + text + "': PTX-only compute_XX targets are not supported; pass sm_" +
                     text.substr(8) + " (its entries hold the PTX too)");
  int arch = 0;
  try {
    arch = rt::parse_arch(text);
  } catch (const kiln::Error& e) {
    throw UsageError("bad --arch '" + text + "': " + e.what());
  }
  auto supported = nvrtc_supported_archs();
  if (!supported.empty() && arch > supported.back()) {
    warn(arch_name(arch) + " is newer than NVRTC " + rt::nvrtc_version() + " knows: kernels are stored as PTX for " +
         arch_name(supported.back()) + ", which the driver compiles when loading");
    return arch;
  }
  if (std::find(supported.begin(), supported.end(), arch) == supported.end()) {
    std::string list;
    for (int a : supported) list += (list.empty() ? "" : " ") + arch_name(a);
    throw UsageError("bad --arch '" + text + "': " + arch_name(arch) + " is not an arch NVRTC " + rt::nvrtc_version() +
                     " supports (supported: " + list + ")");
  }
  return arch;
}

std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }

std::string iso_time(std::int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (!gmtime_r(&t, &tm)) return "?";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line.append(width[c] - r[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace jitcc
