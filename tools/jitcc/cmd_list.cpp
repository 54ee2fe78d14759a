// jitcc list: one row per cache entry, valid or not.
#include <algorithm>
#include <memory>
#include <tuple>

#include "cli.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

Json time_json(std::int64_t t) { return t > 0 ? Json(iso_time(t)) : Json(); }
std::string time_text(std::int64_t t) { return t > 0 ? iso_time(t) : "-"; }

int run_list(const Common& common) {
  auto cache = open_cache(common);
  auto entries = cache.list();
  std::sort(entries.begin(), entries.end(), [](const rt::EntryInfo& a, const rt::EntryInfo& b) {
    return std::tie(a.key.op, a.key.dtypes, a.key.variant, a.key.arch, a.path) <
           std::tie(b.key.op, b.key.dtypes, b.key.variant, b.key.arch, b.path);
  });

  Json list = Json::array();
  std::vector<std::vector<std::string>> rows{
      {"op", "dtypes", "variant", "arch", "kind", "size", "created", "last used"}};
  std::uint64_t total = 0;
  int bad = 0;
  std::string bad_text;  // below the table: a bad entry has no key to fill its columns
  for (const auto& e : entries) {
    total += e.bytes;
    Json j = Json::object()
                 .set("op", e.key.op)
                 .set("dtypes", e.key.dtypes)
                 .set("variant", e.key.variant)
                 .set("arch", e.key.arch ? Json(arch_name(e.key.arch)) : Json())
                 .set("kind", e.key.kind)
                 .set("bytes", e.bytes)
                 .set("created", time_json(e.created))
                 .set("last_used", time_json(e.last_used))
                 .set("digest", e.key.digest)
                 .set("path", e.path.string())
                 .set("ok", e.ok);
    if (!e.ok) {
      ++bad;
      j.set("problem", e.problem);
      bad_text += "bad: " + e.path.string() + ": " + e.problem + "\n";
    } else {
      rows.push_back({e.key.op, e.key.dtypes, std::to_string(e.key.variant), arch_name(e.key.arch), e.key.kind,
                      human_bytes(e.bytes), time_text(e.created), time_text(e.last_used)});
    }
    list.push(std::move(j));
  }
  std::string text = rows.size() > 1 ? table(rows) : "";
  text += bad_text;
  text += std::to_string(entries.size()) + " entries, " + human_bytes(total) + " in " + cache.dir().string();
  text += bad ? " (" + std::to_string(bad) + " bad: run 'jitcc verify')\n" : "\n";
  emit(common,
       Json::object()
           .set("entries", std::move(list))
           .set("total_bytes", total)
           .set("bad", bad)
           .set("cache_dir", cache.dir().string()),
       text);
  return 0;
}

}  // namespace

void add_list(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("list", "List cache entries: op, dtypes, arch, kind, size, created, last used");
  add_common_options(*sub, ctx.common);
  sub->callback([&ctx] { ctx.run = [&ctx] { return run_list(ctx.common); }; });
}

}  // namespace jitcc
