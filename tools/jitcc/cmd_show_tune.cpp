// jitcc show --tune [FILTER]: the choices kiln made by measurement (KILN_TUNE, jitcc tune) that
// the cache remembers, each with its candidates' times, fastest first: which kernel or cuBLASLt
// algorithm runs a product or a convolution, and by how much it won.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "cli.h"
#include "kiln/runtime/tuning.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

// One line of a choice's detail: "NAME: 3.1 us", or "NAME: rejected, ..." (its output disagreed).
struct Candidate {
  std::string name;
  double us = std::numeric_limits<double>::infinity();  // infinity: rejected or not timed
  std::string note;                                     // why not timed, as the tuner wrote it
};

std::vector<Candidate> candidates_of(const std::string& detail) {
  std::vector<Candidate> out;
  std::size_t at = 0;
  while (at < detail.size()) {
    std::size_t end = detail.find('\n', at);
    if (end == std::string::npos) end = detail.size();
    const std::string line = detail.substr(at, end - at);
    at = end + 1;
    const std::size_t colon = line.rfind(": ");
    if (line.empty() || colon == std::string::npos) continue;
    Candidate c;
    c.name = line.substr(0, colon);
    const std::string value = line.substr(colon + 2);
    char* rest = nullptr;
    const double us = std::strtod(value.c_str(), &rest);
    if (rest != value.c_str() && std::string(rest) == " us")
      c.us = us;
    else
      c.note = value;
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.us < b.us; });
  return out;
}

std::string us_text(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f us", us);
  return buf;
}

}  // namespace

int show_tune_choices(const std::string& filter, const Common& common) {
  if (!cache_dir_problem(cache_dir(common), false).empty())
    throw UsageError("show --tune reads the cache " + cache_dir(common).string() + ", which cannot be read");
  auto cache = unchecked_cache(common);
  Json choices = Json::array();
  std::string text;
  std::size_t shown = 0;
  std::vector<rt::EntryInfo> entries = list_entries(cache, common, "show --tune");
  std::sort(entries.begin(), entries.end(),
            [](const rt::EntryInfo& a, const rt::EntryInfo& b) { return a.key.label < b.key.label; });
  for (const rt::EntryInfo& info : entries) {
    if (!info.ok || info.key.kind != rt::kTuneKind || info.key.label.find(filter) == std::string::npos) continue;
    const std::optional<rt::Entry> e = cache.read(info.path);
    const std::optional<rt::TuneChoice> c = e ? rt::tune_entry_choice(*e) : std::nullopt;
    if (!c) continue;
    const rt::EntryKey& k = e->key;
    const std::string arch = k.arch ? arch_name(k.arch) : "-";
    Json list = Json::array();
    text += k.label + " (" + k.dtypes + ", " + arch + ", " + k.options + ")\n";
    for (const Candidate& cand : candidates_of(c->detail)) {
      const bool timed = cand.us != std::numeric_limits<double>::infinity();
      Json j{{"name", cand.name}, {"us", timed ? Json(cand.us) : Json()}, {"chosen", cand.name == c->variant}};
      if (!timed) j["note"] = cand.note;
      list.push_back(std::move(j));
      text += "  " + (timed ? us_text(cand.us) : cand.note) + "  " + cand.name +
              (cand.name == c->variant ? "  <- runs" : "") + "\n";
    }
    if (list.empty()) text += "  " + c->variant + "  <- runs (no times recorded)\n";
    choices.push_back(Json{{"label", k.label},
                           {"dtypes", k.dtypes},
                           {"arch", arch},
                           {"library", k.options},
                           {"chosen", c->variant},
                           {"candidates", std::move(list)}});
    ++shown;
  }
  text += std::to_string(shown) + " choices" + (filter.empty() ? "" : " matching '" + filter + "'") + " in " +
          cache.dir().string() + "\n";
  emit(common, Json{{"choices", std::move(choices)}, {"cache_dir", cache.dir().string()}}, text);
  return 0;
}

}  // namespace jitcc
