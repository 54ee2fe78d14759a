// jitcc dump: writes each entry's instantiated source, PTX (and CUBIN) and key, so a
// kernel can be read, diffed or fed to other tools.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>
#include <set>

#include "cli.h"

namespace jitcc {

namespace rt = kiln::rt;
namespace fs = std::filesystem;

namespace {

struct DumpArgs {
  std::string out;
  std::optional<std::string> ops;  // unset: every entry
};

// <op>_<dtypes>_v<variant>_sm<arch>_<digest8>, dtypes joined by '-'; a generated kernel's
// <label>_sm<arch>_<digest8> ("fused_mul_add_f32_sm90_..."); nothing a shell must quote.
std::string file_stem(const rt::EntryKey& k) {
  std::string dtypes = k.dtypes;
  std::replace(dtypes.begin(), dtypes.end(), ',', '-');
  const std::string name = k.label.empty() ? k.op + "_" + dtypes + "_v" + std::to_string(k.variant) : k.label;
  std::string stem;
  for (char c : name + "_sm" + std::to_string(k.arch) + "_" + k.digest.substr(0, 8)) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') c = '_';
    // A label's punctuation runs ("fused(a,b) f32") become one '_'; op names keep theirs.
    if (c == '_' && !k.label.empty() && !stem.empty() && stem.back() == '_') continue;
    stem += c;
  }
  return stem;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw std::runtime_error("[dump] cannot write " + p.string());
}

Json key_json(const rt::EntryInfo& info) {
  const rt::EntryKey& k = info.key;
  return Json{{"name", entry_name(k)},
              {"op", k.op},
              {"label", k.label},
              {"dtypes", k.dtypes},
              {"variant", k.variant},
              {"arch", arch_name(k.arch)},
              {"kind", k.kind},
              {"nvrtc_version", k.nvrtc_version},
              {"options", k.options},
              {"digest", k.digest},
              {"function", k.function},  // its entry point in a bundle's binaries; "" when compiled alone
              {"bundle", k.bundle},
              {"format_version", rt::DiskCache::kFormatVersion},
              {"bytes", info.bytes},
              {"created", iso_time(info.created)},
              {"last_used", iso_time(info.last_used)},
              {"entry", info.path.string()}};
}

int run_dump(const DumpArgs& a, const Common& common) {
  auto cache = open_cache(common);
  auto entries = cache.list();
  std::set<std::string> ops;
  const std::vector<std::string> names = split_list(a.ops.value_or(""));
  if (a.ops && names.empty()) throw UsageError("--ops names no op");
  for (const std::string& name : names) {
    bool cached = std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.key.op == name; });
    if (!rt::find_kernel(name) && !cached)
      throw UsageError("unknown op '" + name + "' (not registered, not in the cache)");
    ops.insert(name);
  }
  const fs::path out = fs::absolute(a.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw std::runtime_error("[dump] cannot create " + out.string() + ": " + ec.message());

  Json files = Json::array(), skipped = Json::array();
  int dumped = 0, bad = 0;
  for (const auto& info : entries) {
    if (info.ok && !ops.empty() && !ops.count(info.key.op)) continue;
    std::string problem = info.problem;
    std::optional<rt::Entry> e;
    if (info.ok) e = cache.read(info.path, &problem);
    if (!e) {
      if (!ops.empty() && info.key.op.empty()) continue;  // unreadable: cannot tell whether it was asked for
      warn("skipping bad entry " + info.path.string() + ": " + problem);
      skipped.push_back(Json{{"path", info.path.string()}, {"problem", problem}});
      ++bad;
      continue;
    }
    const fs::path stem = out / file_stem(info.key);
    auto emit_file = [&](const std::string& ext, const std::string& bytes) {
      fs::path p = stem;
      p += ext;
      write_file(p, bytes);
      files.push_back(p.string());
    };
    emit_file(".cu", e->source);
    emit_file(".ptx", e->ptx);
    if (!e->cubin.empty()) emit_file(".cubin", e->cubin);
    emit_file(".json", dump_json(key_json(info)) + "\n");
    ++dumped;
  }
  const std::string text = "dumped " + std::to_string(dumped) + " entries to " + out.string() + "\n";
  emit(common,
       Json{{"out", out.string()}, {"dumped", dumped}, {"files", std::move(files)}, {"skipped", std::move(skipped)}},
       text);
  return bad ? kFailureExit : 0;
}

}  // namespace

void add_dump(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DumpArgs>();
  auto* sub = app.add_subcommand("dump", "Write each entry's .cu, .ptx (.cubin) and .json key to a directory");
  sub->add_option("--out,-o", args->out, "Output directory (created if missing)")->required()->check(not_a_flag());
  sub->add_option("--ops", args->ops, "Comma-separated op names (default: every entry)")->check(not_a_flag());
  add_common_options(*sub, ctx.common);
  sub->callback([args, &ctx] { ctx.run = [args, &ctx] { return run_dump(*args, ctx.common); }; });
}

}  // namespace jitcc
