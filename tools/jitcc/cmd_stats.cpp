// jitcc stats: where the cache is, how it is configured, what it holds, and what
// this build could put in it.
#include <algorithm>
#include <cstdio>
#include <map>

#include "cli.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/device.h"
#include "kiln/version.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

const char* mode_name(rt::CacheMode m) {
  switch (m) {
    case rt::CacheMode::read_write:
      return "rw";
    case rt::CacheMode::read_only:
      return "ro";
    case rt::CacheMode::off:
      return "off";
  }
  return "?";
}

int run_stats(const Common& common) {
  apply_cache_dir(common);
  // Described even when unusable: stats is where one looks to find out why.
  auto cache = unchecked_cache(common);
  const std::string not_dir = cache_dir_problem(cache.dir(), false);
  const std::string no_writes = not_dir.empty() ? cache_dir_problem(cache.dir(), true) : not_dir;
  std::vector<std::string> unreadable;
  const auto entries = cache.list({}, &unreadable);
  if (!not_dir.empty()) unreadable.clear();  // said once, below, as "is not a directory"
  std::map<std::string, int> per_arch, per_kind, per_op;
  int bad = 0;
  std::uint64_t total = 0;
  std::int64_t oldest = 0, last_used = 0;
  for (const auto& e : entries) {
    total += e.bytes;
    if (!e.ok) {
      ++bad;
      continue;
    }
    ++per_arch[arch_name(e.key.arch)];
    ++per_kind[e.key.kind];
    ++per_op[entry_name(e.key)];
    if (e.created > 0 && (oldest == 0 || e.created < oldest)) oldest = e.created;
    last_used = std::max(last_used, e.last_used);
  }
  std::size_t instantiations = 0;
  for (const auto* s : rt::registered_kernels()) instantiations += s->dtypes.size() * s->variants.size();

  // The process-wide configuration (KILN_CACHE, and whether the directory takes writes).
  const auto& global = rt::DiskCache::global();
  const bool writable = global.writable() && no_writes.empty();
  std::string why;
  const bool gpu = rt::gpu_available(&why);
  const std::string gpu_text =
      gpu ? rt::device_info(0).name + " (" + arch_name(rt::device_info(0).arch()) + ")" : "none (" + why + ")";

  auto counts = [](const std::map<std::string, int>& m) {
    Json o = Json::object();
    for (const auto& [k, v] : m) o[k] = v;
    return o;
  };
  auto counts_text = [](const std::map<std::string, int>& m) {
    std::string s;
    for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k + ": " + std::to_string(v);
    return s.empty() ? std::string("-") : s;
  };
  std::vector<std::vector<std::string>> rows{
      {"directory", cache.dir().string()},
      {"mode", std::string(mode_name(global.mode())) +
                   (writable ? "" : " (not writable" + (no_writes.empty() ? "" : ": " + no_writes) + "; memory only)")},
      {"entries", std::to_string(entries.size()) + (bad ? " (" + std::to_string(bad) + " bad)" : "") +
                      (unreadable.empty() ? "" : " in the directories that could be read")},
      {"quarantined", std::to_string(cache.quarantine_count()) + " bad files moved aside"},
      {"total size", human_bytes(total)},
      {"per arch", counts_text(per_arch)},
      {"per kind", counts_text(per_kind)},
      {"oldest entry", oldest ? iso_time(oldest) : "-"},
      {"last used", last_used ? iso_time(last_used) : "-"},
      {"registered", std::to_string(rt::registered_kernels().size()) + " kernels, " + std::to_string(instantiations) +
                         " instantiations"},
      {"NVRTC", rt::nvrtc_version()},
      {"kiln", kiln::version()},
      {"GPU", gpu_text},
  };
  emit(common,
       Json{{"cache_dir", cache.dir().string()},
            {"mode", mode_name(global.mode())},
            {"writable", writable},
            {"problem", no_writes.empty() ? Json() : Json(no_writes)},
            {"unreadable", unreadable},
            {"entries", entries.size()},
            {"bad", bad},
            {"quarantined", cache.quarantine_count()},
            {"total_bytes", total},
            {"per_arch", counts(per_arch)},
            {"per_kind", counts(per_kind)},
            {"per_op", counts(per_op)},
            {"oldest", oldest ? Json(iso_time(oldest)) : Json()},
            {"last_used", last_used ? Json(iso_time(last_used)) : Json()},
            {"format_version", rt::DiskCache::kFormatVersion},
            {"registered_kernels", rt::registered_kernels().size()},
            {"registered_instantiations", instantiations},
            {"nvrtc_version", rt::nvrtc_version()},
            {"kiln_version", kiln::version()},
            {"gpu", gpu ? Json(gpu_text) : Json()}},
       table(rows));
  if (!not_dir.empty()) std::fprintf(stderr, "jitcc: error: cache directory %s\n", not_dir.c_str());
  // Counted from what could be read: the figures above are a floor, and the exit says so.
  for (const std::string& p : unreadable) std::fprintf(stderr, "jitcc: error: %s\n", p.c_str());
  return not_dir.empty() && unreadable.empty() ? 0 : kFailureExit;
}

}  // namespace

void add_stats(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("stats", "Cache directory, mode, entries, sizes, NVRTC version, registered kernels");
  add_common_options(*sub, ctx.common);
  sub->callback([&ctx] { ctx.run = [&ctx] { return run_stats(ctx.common); }; });
}

}  // namespace jitcc
