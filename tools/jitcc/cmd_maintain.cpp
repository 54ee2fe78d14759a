// jitcc verify / gc / clear: check, bound and empty the cache directory.
#include <algorithm>
#include <memory>
#include <system_error>

#include "cli.h"

namespace jitcc {

namespace rt = kiln::rt;
namespace fs = std::filesystem;

namespace {

// Exit 1 while bad entries remain, so a script can gate on `jitcc verify`.
int run_verify(bool fix, const Common& common) {
  auto cache = open_cache(common);
  const auto entries = list_entries(cache, common, "verify: reading");
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
    if (fix) {
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

int run_gc(const std::string& max_size, const Common& common) {
  const std::uint64_t max_bytes = parse_size(max_size);
  auto cache = open_cache(common);
  const std::size_t before = list_entries(cache, common, "gc: reading").size();
  const std::uint64_t removed_bytes =
      cache.gc(max_bytes, progress_line(common, "gc: collecting", "entries", 0).as_callback());
  const std::size_t after = list_entries(cache, common, "gc: counting").size();
  const std::uint64_t total = cache.total_bytes();
  const std::size_t removed = before > after ? before - after : 0;
  emit(common,
       Json{{"max_bytes", max_bytes},
            {"removed_entries", removed},
            {"removed_bytes", removed_bytes},
            {"entries", after},
            {"total_bytes", total},
            {"cache_dir", cache.dir().string()}},
       "removed " + std::to_string(removed) + " entries (" + human_bytes(removed_bytes) + "); " +
           std::to_string(after) + " entries, " + human_bytes(total) + " left (bound " + human_bytes(max_bytes) +
           ")\n");
  return total <= max_bytes ? 0 : kFailureExit;
}

int run_clear(const Common& common) {
  auto cache = open_cache(common);
  const std::size_t entries = cache.list().size();
  const std::uint64_t bytes = cache.total_bytes();
  cache.clear();
  const std::size_t left = cache.list().size();
  emit(common,
       Json{{"removed_entries", entries - std::min(entries, left)},
            {"removed_bytes", bytes},
            {"entries", left},
            {"cache_dir", cache.dir().string()}},
       "removed " + std::to_string(entries) + " entries (" + human_bytes(bytes) + ") from " + cache.dir().string() +
           "\n");
  return left == 0 ? 0 : kFailureExit;
}

}  // namespace

void add_verify(CLI::App& app, Context& ctx) {
  auto fix = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand("verify", "Check every entry's header and checksum; exit 1 if any is bad");
  sub->add_flag("--fix", *fix, "Remove bad entries");
  add_common_options(*sub, ctx.common);
  sub->callback([fix, &ctx] { ctx.run = [fix, &ctx] { return run_verify(*fix, ctx.common); }; });
}

void add_gc(CLI::App& app, Context& ctx) {
  auto max_size = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("gc", "Evict least-recently-used entries down to a size bound");
  sub->add_option("--max-size", *max_size, "Bound: bytes, or with a K/M/G suffix (e.g. 500M)")
      ->required()
      ->check(not_a_flag());
  add_common_options(*sub, ctx.common);
  sub->callback([max_size, &ctx] { ctx.run = [max_size, &ctx] { return run_gc(*max_size, ctx.common); }; });
}

void add_clear(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("clear", "Remove every cache entry");
  add_common_options(*sub, ctx.common);
  sub->callback([&ctx] { ctx.run = [&ctx] { return run_clear(ctx.common); }; });
}

}  // namespace jitcc
