#include "kiln/runtime/kernel_registry.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "kiln/error.h"

namespace kiln::rt {

namespace {

// Specs register from static initialisers of several libraries, so the registry is
// a function-local static (constructed on first use) guarded by a mutex.
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<KernelSpec>> owned;  // unique_ptr: addresses stay stable
  std::vector<const KernelSpec*> specs;            // registration order == id order
  std::map<std::string, const KernelSpec*, std::less<>> by_op;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Appends rather than "lit" + string&&, which trips GCC 12's -Wrestrict false positive.
std::string tuple_text(const DTypes& d) {
  std::string s = "(";
  s += d.str();
  s += ')';
  return s;
}

}  // namespace

const KernelSpec& register_kernel(KernelSpec spec) {
  const std::string who = "[kernel_registry] ";
  if (spec.op.empty()) throw ValueError(who + "a kernel spec needs an op name");
  const std::string op = "[" + spec.op + "] ";
  if (spec.template_name.empty()) throw ValueError(op + "kernel spec has no template name");
  if (spec.entry.empty()) throw ValueError(op + "kernel spec has no entry point");
  if (spec.dtypes.empty()) throw ValueError(op + "kernel spec lists no dtype tuples");
  if (spec.variants.empty()) throw ValueError(op + "kernel spec lists no variants");
  if (!spec.bind) throw ValueError(op + "kernel spec has no bind function");

  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (r.by_op.count(spec.op)) throw ValueError(op + "a kernel named '" + spec.op + "' is already registered");
  if (r.specs.size() > std::numeric_limits<std::uint16_t>::max())
    throw ValueError(op + "too many kernel specs (ids are 16-bit)");
  spec.id = static_cast<std::uint16_t>(r.specs.size());
  auto& stored = r.owned.emplace_back(std::make_unique<KernelSpec>(std::move(spec)));
  r.specs.push_back(stored.get());
  r.by_op.emplace(stored->op, stored.get());
  return *stored;
}

const std::vector<const KernelSpec*>& registered_kernels() { return registry().specs; }

std::vector<std::string> template_entries(std::string_view template_name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> entries;
  for (const KernelSpec* spec : r.specs)
    if (spec->template_name == template_name && std::find(entries.begin(), entries.end(), spec->entry) == entries.end())
      entries.push_back(spec->entry);
  return entries;
}

const KernelSpec* find_kernel(std::string_view op) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_op.find(op);
  return it == r.by_op.end() ? nullptr : it->second;
}

std::string kernel_source_name(const KernelSpec& spec) {
  return generated_template_label(spec.template_name) ? spec.template_name : spec.op;
}

std::string instantiate_kernel(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant) {
  if (std::find(spec.dtypes.begin(), spec.dtypes.end(), dtypes) == spec.dtypes.end()) {
    std::string supported;
    for (const auto& d : spec.dtypes) (supported += ' ') += tuple_text(d);
    throw DTypeError("[" + spec.op + "] dtypes " + tuple_text(dtypes) + " not supported; supported:" + supported);
  }
  if (std::find(spec.variants.begin(), spec.variants.end(), variant) == spec.variants.end()) {
    std::string supported;
    for (auto v : spec.variants) (supported += ' ') += std::to_string(v);
    throw ValueError("[" + spec.op + "] variant " + std::to_string(variant) + " not supported; supported:" + supported);
  }
  return instantiate_kernel_with(spec, dtypes, variant, spec.bind(dtypes, variant));
}

std::string instantiate_kernel_with(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant,
                                    const Bindings& bindings) {
  // The header line makes every (op, dtypes, variant) source distinct, so two ops whose
  // templates expand alike still get separate disk-cache entries.
  std::string source =
      "// kiln kernel " + kernel_source_name(spec) + " " + tuple_text(dtypes) + " variant " + std::to_string(variant) + "\n";
  const std::string text = template_source(spec.template_name);
  // A template of several kernels guards each with #ifdef KILN_ENTRY_<name>: a module then
  // holds only the entry its op launches, which cuts NVRTC's time to a fraction.
  if (text.find("KILN_ENTRY_") != std::string::npos) source += "#define KILN_ENTRY_" + spec.entry + " 1\n";
  source += instantiate(spec.template_name, text, bindings);
  return source;
}

}  // namespace kiln::rt
