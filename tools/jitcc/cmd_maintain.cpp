// jitcc verify / gc / clear: check, bound and empty the cache directory. What they remove is
// kiln's alone (entries that verify as kiln's, its temp and quarantined files), and only in a
// directory that looks like a kiln cache, unless --force.
#include <algorithm>
#include <memory>
#include <system_error>

#include "cli.h"

namespace jitcc {

namespace rt = kiln::rt;
namespace fs = std::filesystem;

namespace {

// Exit 1 while bad entries remain, so a script can gate on `jitcc verify`.
int run_verify(bool fix, bool force, const Common& common) {
  auto cache = open_cache(common);
  const auto entries = list_entries(cache, common, "verify: reading");
  if (fix) require_kiln_cache(cache, force, "verify --fix");
  auto progress = progress_line(common, "verify: checking", "entries", entries.size(), {"ok", "bad"});
  Json bad = Json::array();
  int bad_count = 0, removed = 0;
  std::string text;
  for (const auto& info : entries) {
    std::string problem = info.problem;
    // list() may judge by the header alone; read() also checks the payload checksum.
    bool ok = info.ok && cache.read(info.path, &problem).has_value();
    progress.tick(ok ? 0 : 1);
    if (ok) continue;
    if (problem.empty()) problem = "unreadable entry";
    ++bad_count;
    bool gone = false;
    if (fix && !info.ours) {
      problem += " (not removed: not kiln's file)";
    } else if (fix) {
      std::error_code ec;
      fs::remove(info.path, ec);
      gone = !ec && !fs::exists(info.path, ec);
      if (!gone) warn("cannot remove " + info.path.string() + (ec ? ": " + ec.message() : ""));
      removed += gone;
    }
    bad.push_back(Json{{"path", info.path.string()}, {"problem", problem}, {"removed", gone}});
    text += "bad: " + info.path.string() + ": " + problem + (gone ? " (removed)" : "") + "\n";
  }
  progress.finish();
  const int remaining = bad_count - removed;
  text += std::to_string(entries.size()) + " entries checked, " + std::to_string(bad_count) + " bad";
  if (fix)
    text += ", " + std::to_string(removed) + " removed";
  else if (bad_count)
    text += " (run 'jitcc verify --fix' to remove them)";
  text += "\n";
  emit(common,
       Json{{"entries", entries.size()},
            {"ok", entries.size() - static_cast<std::size_t>(bad_count)},
            {"bad", std::move(bad)},
            {"removed", removed},
            {"clean", remaining == 0},
            {"cache_dir", cache.dir().string()}},
       text);
  return remaining ? kFailureExit : 0;
}

// Files left because they are not kiln's: named, so that the user can see what they are.
std::string kept_text(const std::vector<fs::path>& kept) {
  if (kept.empty()) return "";
  std::string text =
      "left " + std::to_string(kept.size()) + " file" + (kept.size() == 1 ? "" : "s") + " that kiln did not write:";
  for (std::size_t i = 0; i < kept.size() && i < 5; ++i) text += " " + kept[i].string();
  return text + (kept.size() > 5 ? " ...\n" : "\n");
}

// Entries of kiln's in the cache now (other files in it are not entries).
std::size_t count_ours(const rt::DiskCache& cache, const Common& common, const std::string& what) {
  const auto entries = list_entries(cache, common, what);
  return static_cast<std::size_t>(std::count_if(entries.begin(), entries.end(), [](const auto& e) { return e.ours; }));
}

Json paths_json(const std::vector<fs::path>& paths) {
  Json out = Json::array();
  for (const fs::path& p : paths) out.push_back(p.string());
  return out;
}

int run_gc(const std::string& max_size, bool force, const Common& common) {
  const std::uint64_t max_bytes = parse_size(max_size);
  auto cache = open_cache(common);
  list_entries(cache, common, "gc: reading");  // an unreadable cache fails here, before anything goes
  require_kiln_cache(cache, force, "gc");
  const rt::Removal r = cache.gc(max_bytes, progress_line(common, "gc: collecting", "entries", 0).as_callback());
  // A file it could not remove (a read-only cache) is why the bound may not be met: say so.
  if (!r.problems.empty())
    throw std::runtime_error("gc could not finish (it removed " + std::to_string(r.entries) +
                             " entries): " + join_problems(r.problems));
  const std::size_t after = count_ours(cache, common, "gc: counting");
  emit(common,
       Json{{"max_bytes", max_bytes},
            {"removed_entries", r.entries},
            {"removed_bytes", r.bytes},
            {"entries", after},
            {"total_bytes", r.left_bytes},
            {"kept", paths_json(r.kept)},
            {"cache_dir", cache.dir().string()}},
       "removed " + std::to_string(r.entries) + " entries (" + human_bytes(r.bytes) + "); " + std::to_string(after) +
           " entries, " + human_bytes(r.left_bytes) + " left (bound " + human_bytes(max_bytes) + ")\n" +
           kept_text(r.kept));
  return r.left_bytes <= max_bytes ? 0 : kFailureExit;
}

int run_clear(bool force, const Common& common) {
  auto cache = open_cache(common);
  list_entries(cache, common, "clear: reading");
  require_kiln_cache(cache, force, "clear");
  const rt::Removal r = cache.clear();
  if (!r.problems.empty())
    throw std::runtime_error("clear could not finish (it removed " + std::to_string(r.entries) +
                             " entries): " + join_problems(r.problems));
  const std::size_t left = count_ours(cache, common, "clear: counting");
  emit(common,
       Json{{"removed_entries", r.entries},
            {"removed_bytes", r.bytes},
            {"entries", left},
            {"kept", paths_json(r.kept)},
            {"cache_dir", cache.dir().string()}},
       "removed " + std::to_string(r.entries) + " entries (" + human_bytes(r.bytes) + ") from " + cache.dir().string() +
           "\n" + kept_text(r.kept));
  return left == 0 ? 0 : kFailureExit;
}

// --force: the directory need not look like a kiln cache; still only kiln's files are removed.
std::shared_ptr<bool> add_force(CLI::App& sub) {
  auto force = std::make_shared<bool>(false);
  sub.add_flag("--force", *force,
               "Also in a directory that does not look like a kiln cache (no CACHEDIR.TAG by kiln, no kiln "
               "entry); only kiln's entries and temp files are removed, never other files");
  return force;
}

}  // namespace

void add_verify(CLI::App& app, Context& ctx) {
  auto fix = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand("verify", "Check every entry's header and checksum; exit 1 if any is bad");
  sub->add_flag("--fix", *fix, "Remove bad entries (kiln's files only)");
  auto force = add_force(*sub);
  add_common_options(*sub, ctx.common);
  sub->callback([fix, force, &ctx] { ctx.run = [fix, force, &ctx] { return run_verify(*fix, *force, ctx.common); }; });
}

void add_gc(CLI::App& app, Context& ctx) {
  auto max_size = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("gc", "Evict least-recently-used entries down to a size bound");
  sub->add_option("--max-size", *max_size, "Bound: bytes, or with a K/M/G suffix (e.g. 500M)")
      ->required()
      ->check(not_a_flag());
  auto force = add_force(*sub);
  add_common_options(*sub, ctx.common);
  sub->callback(
      [max_size, force, &ctx] { ctx.run = [max_size, force, &ctx] { return run_gc(*max_size, *force, ctx.common); }; });
}

void add_clear(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("clear", "Remove every cache entry (files kiln did not write stay)");
  auto force = add_force(*sub);
  add_common_options(*sub, ctx.common);
  sub->callback([force, &ctx] { ctx.run = [force, &ctx] { return run_clear(*force, ctx.common); }; });
}

}  // namespace jitcc
