// jitcc show: the instantiated source of one (op, dtypes, variant), or its PTX compiled
// on the spot (--plan: a plan's compiled steps, cmd_show_steps.cpp; --tune: the remembered
// choices by measurement, cmd_show_tune.cpp). Registered ops never touch the cache; a kernel
// made at run time (fused, user defined) is read from it, by op or label, and the cache is never written.
#include <algorithm>
#include <memory>

#include "cli.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

struct ShowArgs {
  std::string op;
  std::optional<std::string> dtypes;
  std::optional<std::uint32_t> variant;
  bool ptx = false;
  std::string arch = "auto";
  std::optional<std::string> plan;  // --plan FILE: its steps' groups instead of a kernel
  bool tune = false;                // --tune: the cache's choices by measurement (op: a filter)
};

kiln::DTypes parse_dtypes(const std::string& text) {
  try {
    return kiln::DTypes::parse(text);
  } catch (const kiln::Error& e) {
    throw UsageError(e.what());
  }
}

// Prints the source (or PTX compiled on the spot) and the key fields of one kernel.
int print_kernel(Json j, const std::string& name, const std::string& dtypes, const std::string& source,
                 const ShowArgs& a, const Common& common) {
  if (!a.ptx) {
    j["source"] = source;
    emit(common, j, source);
    return 0;
  }
  const int arch = resolve_arch(a.arch);
  rt::CompiledModule m = rt::compile({name, dtypes, source, arch});
  j["arch"] = arch_name(arch);
  j["ms"] = m.ms;
  j["cubin_bytes"] = m.cubin.size();
  j["ptx"] = m.ptx;
  emit(common, j, m.ptx);
  return 0;
}

// A kernel jitcc has no spec for (a fused kernel, a user-defined op) is shown from the cache,
// found by its op or label. nullopt when no entry matches; UsageError when several sources do.
std::optional<rt::Entry> cached_kernel(const ShowArgs& a, const Common& common) {
  if (!cache_dir_problem(cache_dir(common), false).empty()) return std::nullopt;
  auto cache = unchecked_cache(common);
  const std::optional<std::string> dtypes = a.dtypes ? std::optional(parse_dtypes(*a.dtypes).str()) : std::nullopt;
  std::vector<rt::Entry> found;
  for (const rt::EntryInfo& info : cache.list()) {
    const rt::EntryKey& k = info.key;
    if (!info.ok || (k.op != a.op && k.label != a.op) || (dtypes && k.dtypes != *dtypes) ||
        (a.variant && k.variant != *a.variant))
      continue;
    std::optional<rt::Entry> e = cache.read(info.path);
    if (e && std::none_of(found.begin(), found.end(), [&](const rt::Entry& f) { return f.source == e->source; }))
      found.push_back(std::move(*e));
  }
  if (found.size() > 1) {
    // Generated kernels share a label and dtypes: each is told apart by its op, so that is listed
    // too; a few are enough to show the form.
    constexpr std::size_t kListed = 8;
    std::string which;
    for (std::size_t i = 0; i < std::min(found.size(), kListed); ++i) {
      const rt::EntryKey& k = found[i].key;
      which += " " + k.op + " (" + k.dtypes + ") variant " + std::to_string(k.variant) + ";";
    }
    if (found.size() > kListed) which += " and " + std::to_string(found.size() - kListed) + " more;";
    throw UsageError("'" + a.op + "' names " + std::to_string(found.size()) + " kernels in the cache:" + which +
                     " pick one by its op, or with --dtypes and --variant");
  }
  if (found.empty()) return std::nullopt;
  return std::move(found.front());
}

int show_cached(const rt::Entry& e, const ShowArgs& a, const Common& common) {
  const rt::EntryKey& k = e.key;
  Json j = Json{{"op", k.op}, {"name", entry_name(k)}, {"label", k.label}, {"dtypes", k.dtypes}, {"variant", k.variant}};
  return print_kernel(std::move(j), entry_name(k), k.dtypes, e.source, a, common);
}

int run_show(const ShowArgs& a, const Common& common) {
  if (a.tune) {
    if (a.plan || a.dtypes || a.variant || a.ptx)
      throw UsageError(
          "show --tune prints the cache's choices by measurement; it takes a filter, not --plan, "
          "--dtypes, --variant or --ptx");
    return show_tune_choices(a.op, common);
  }
  if (a.plan) {
    if (!a.op.empty() || a.dtypes || a.variant || a.ptx)
      throw UsageError("show --plan prints a plan's compiled steps; it takes no op, --dtypes, --variant or --ptx");
    return show_plan_steps(*a.plan, common);
  }
  if (a.op.empty()) throw UsageError("show needs an op (or --plan FILE for a plan's compiled steps)");
  const rt::KernelSpec* spec = rt::find_kernel(a.op);
  if (!spec) {
    if (std::optional<rt::Entry> e = cached_kernel(a, common)) return show_cached(*e, a, common);
    // A label like "fused(mul,add,relu) f32" names a kernel made at run time: only a cache has it.
    // Exit 2, as for an unknown op.
    if (a.op.find('(') != std::string::npos)
      throw UsageError("'" + a.op + "' is not in the cache " + cache_dir(common).string() +
                       ": a kernel made at run time (fused, user-defined) gets there when a run that uses "
                       "it compiles it with this cache (KILN_CACHE_DIR), or by 'jitcc warm --from-cache DIR "
                       "--arch sm_XX' from a cache that recorded it; 'jitcc list' shows what is cached");
    if (split_list(a.op).size() != 1 || a.op == "all") throw UsageError("show takes one op (got '" + a.op + "')");
    try {
      spec = select_kernels(a.op).front();
    } catch (const UsageError& e) {
      throw UsageError(std::string(e.what()) + "; nor is it the op or label of an entry in the cache " +
                       cache_dir(common).string());
    }
  }
  if (!a.dtypes) throw UsageError("show " + spec->op + " needs --dtypes (e.g. --dtypes " + spec->dtypes.front().str() + ")");
  const kiln::DTypes dtypes = parse_dtypes(*a.dtypes);
  if (std::find(spec->dtypes.begin(), spec->dtypes.end(), dtypes) == spec->dtypes.end()) {
    std::string known;
    for (const auto& d : spec->dtypes) known += (known.empty() ? "" : " ") + d.str();
    throw UsageError("op '" + spec->op + "' has no dtypes (" + dtypes.str() + "); it supports: " + known);
  }
  const std::uint32_t variant = a.variant.value_or(spec->variants.front());
  if (std::find(spec->variants.begin(), spec->variants.end(), variant) == spec->variants.end()) {
    std::string known;
    for (auto v : spec->variants) known += (known.empty() ? "" : " ") + std::to_string(v);
    throw UsageError("op '" + spec->op + "' has no variant " + std::to_string(variant) + " (variants: " + known + ")");
  }

  const std::string source = rt::instantiate_kernel(*spec, dtypes, variant);
  Json j = Json{{"op", spec->op},
                {"dtypes", dtypes.str()},
                {"variant", variant},
                {"entry", spec->entry},
                {"template", spec->template_name}};
  return print_kernel(std::move(j), spec->op, dtypes.str(), source, a, common);
}

}  // namespace

void add_show(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<ShowArgs>();
  auto* sub = app.add_subcommand(
      "show",
      "Print one kernel's instantiated source (or PTX); a kernel made at run time comes from the cache. "
      "With --plan FILE: the compiled steps of a kernel plan, group by group. With --tune [FILTER]: the "
      "choices by measurement the cache remembers, each candidate's time");
  sub->add_option("op", args->op,
                  "Op name, or a cached kernel's op or label, e.g. \"fused(mul,add) f32\"; with --tune, text the "
                  "choices' problems must contain");
  sub->add_flag("--tune", args->tune,
                "Print the cache's choices by measurement (KILN_TUNE, jitcc tune): each product's or conv's "
                "candidates, fastest first, and the one that runs");
  sub->add_option("--plan", args->plan,
                  "A kernel plan (mnist-train --kernel-plan): print its compiled steps' fusion groups")
      ->check(not_a_flag());
  sub->add_option("--dtypes", args->dtypes, "Comma-separated dtype tuple, e.g. f32,f16 (required for registered ops)")
      ->check(not_a_flag());
  sub->add_option("--variant", args->variant, "Variant (default: the op's first)");
  sub->add_flag("--ptx", args->ptx, "Compile with NVRTC and print the PTX");
  sub->add_option("--arch", args->arch, "Target arch for --ptx (sm_90), or auto for GPU 0")
      ->capture_default_str()
      ->check(not_a_flag());
  add_common_options(*sub, ctx.common);
  sub->callback([args, &ctx] { ctx.run = [args, &ctx] { return run_show(*args, ctx.common); }; });
}

}  // namespace jitcc
