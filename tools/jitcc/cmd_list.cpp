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
  auto entries = list_entries(cache, common, "list");
  std::sort(entries.begin(), entries.end(), [](const rt::EntryInfo& a, const rt::EntryInfo& b) {
    const std::string an = entry_name(a.key), bn = entry_name(b.key);
    return std::tie(an, a.key.dtypes, a.key.variant, a.key.arch, a.path) <
           std::tie(bn, b.key.dtypes, b.key.variant, b.key.arch, b.path);
  });

  Json list = Json::array();
  std::vector<std::vector<std::string>> rows{
      {"op", "dtypes", "variant", "arch", "kind", "size", "created", "last used"}};
  std::uint64_t total = 0;
  int bad = 0;
  std::string bad_text;  // below the table: a bad entry has no key to fill its columns
  for (const auto& e : entries) {
    total += e.bytes;
    Json j = Json{{"name", entry_name(e.key)},
                  {"op", e.key.op},
                  {"label", e.key.label},
                  {"dtypes", e.key.dtypes},
                  {"variant", e.key.variant},
                  {"arch", e.key.arch ? Json(arch_name(e.key.arch)) : Json()},
                  {"kind", e.key.kind},
                  {"bytes", e.bytes},
                  {"created", time_json(e.created)},
                  {"last_used", time_json(e.last_used)},
                  {"digest", e.key.digest},
                  {"bundle", e.key.bundle},
                  {"path", e.path.string()},
                  {"ok", e.ok}};
    if (!e.ok) {
      ++bad;
      j["problem"] = e.problem;
      bad_text += "bad: " + e.path.string() + ": " + e.problem + "\n";
    } else {
      // A generated kernel's label holds its dtype; its recorded dtypes and variant are placeholders.
      const bool generated = !e.key.label.empty();
      rows.push_back({entry_name(e.key), generated ? "-" : e.key.dtypes, generated ? "-" : std::to_string(e.key.variant),
                      arch_name(e.key.arch), e.key.kind, human_bytes(e.bytes), time_text(e.created),
                      time_text(e.last_used)});
    }
    list.push_back(std::move(j));
  }
  std::string text = rows.size() > 1 ? table(rows) : "";
  text += bad_text;
  text += std::to_string(entries.size()) + " entries, " + human_bytes(total) + " in " + cache.dir().string();
  text += bad ? " (" + std::to_string(bad) + " bad: run 'jitcc verify')\n" : "\n";
  emit(common,
       Json{{"entries", std::move(list)}, {"total_bytes", total}, {"bad", bad}, {"cache_dir", cache.dir().string()}},
       text);
  return 0;
}

}  // namespace

void add_list(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("list", "List cache entries: op (a generated kernel's label), dtypes, arch, kind, size, created, last used");
  add_common_options(*sub, ctx.common);
  sub->callback([&ctx] { ctx.run = [&ctx] { return run_list(ctx.common); }; });
}

}  // namespace jitcc
