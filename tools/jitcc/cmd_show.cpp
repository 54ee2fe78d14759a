// jitcc show: the instantiated source of one (op, dtypes, variant), or its PTX compiled
// on the spot; the cache is neither read nor written.
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
  std::string dtypes;
  std::optional<std::uint32_t> variant;
  bool ptx = false;
  std::string arch = "auto";
};

int run_show(const ShowArgs& a, const Common& common) {
  if (split_list(a.op).size() != 1 || a.op == "all") throw UsageError("show takes one op (got '" + a.op + "')");
  const rt::KernelSpec* spec = select_kernels(a.op).front();
  kiln::DTypes dtypes;
  try {
    dtypes = kiln::DTypes::parse(a.dtypes);
  } catch (const kiln::Error& e) {
    throw UsageError(e.what());
  }
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
  if (!a.ptx) {
    j["source"] = source;
    emit(common, j, source);
    return 0;
  }
  const int arch = resolve_arch(a.arch);
  rt::CompiledModule m = rt::compile({spec->op, dtypes.str(), source, arch});
  j["arch"] = arch_name(arch);
  j["ms"] = m.ms;
  j["cubin_bytes"] = m.cubin.size();
  j["ptx"] = m.ptx;
  emit(common, j, m.ptx);
  return 0;
}

}  // namespace

void add_show(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<ShowArgs>();
  auto* sub = app.add_subcommand("show", "Print one kernel's instantiated source (or PTX) without using the cache");
  sub->add_option("op", args->op, "Op name")->required();
  sub->add_option("--dtypes", args->dtypes, "Comma-separated dtype tuple, e.g. f32,f16")
      ->required()
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
