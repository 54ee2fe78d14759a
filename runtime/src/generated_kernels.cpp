#include "kiln/runtime/generated_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "kiln/error.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::rt {

namespace {

std::atomic<std::uint64_t> g_builds{0};

// One slot per key; call_once makes concurrent first calls of one key build once while
// other keys build in parallel (as the module cache does for loads).
struct Module {
  std::string kind;
  std::vector<std::uint64_t> words;
  std::once_flag once;
  std::atomic<bool> ready{false};
  std::vector<const KernelSpec*> specs;
};

class Modules {
 public:
  Module& slot(const GeneratedKey& key) {
    const std::uint64_t h = key.hash();
    {
      std::shared_lock lock(mu_);
      if (Module* m = find(h, key)) return *m;
    }
    std::unique_lock lock(mu_);
    if (Module* m = find(h, key)) return *m;
    auto& m = by_hash_[h].emplace_back(std::make_unique<Module>());
    m->kind = key.kind();
    m->words.assign(key.words().begin(), key.words().end());
    return *m;
  }

  // Serialises the choice of names, so two colliding modules built at once take different ones.
  std::mutex naming;
  // The specs of each module built, by its base name (under `naming`).
  std::unordered_map<std::string, std::vector<const KernelSpec*>> by_name;

 private:
  Module* find(std::uint64_t h, const GeneratedKey& key) {
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) return nullptr;
    for (const auto& m : it->second)
      if (m->kind == key.kind() && std::ranges::equal(m->words, key.words())) return m.get();
    return nullptr;
  }

  std::shared_mutex mu_;
  std::unordered_map<std::uint64_t, std::vector<std::unique_ptr<Module>>> by_hash_;
};

Modules& modules() {
  static auto* m = new Modules;  // leaked: specs handed out live for the process
  return *m;
}

std::string entry_name(const std::string& base, std::size_t i) {
  return i == 0 ? base : base + "_" + std::to_string(i);
}

// Neither the template `base` nor any entry's spec name is taken.
bool name_free(const std::string& base, std::size_t entries) {
  if (generated_template_label(base).has_value()) return false;
  for (std::size_t i = 0; i < entries; ++i)
    if (find_kernel(entry_name(base, i)) != nullptr) return false;
  return true;
}

bool same_entries(const std::vector<const KernelSpec*>& specs, const std::vector<std::string>& entries) {
  return std::ranges::equal(specs, entries, [](const KernelSpec* s, const std::string& e) { return s->entry == e; });
}

// The specs of a built module, named by its source: keys whose modules have the same source
// (sizes the kernel takes at run time, such as a direct conv's batch) share one compile.
std::vector<const KernelSpec*> build_specs(const GeneratedKey& key, GeneratedModule m) {
  const std::string who = "[generated_kernels] " + std::string(key.kind()) + ": ";
  if (m.entries.empty()) throw ValueError(who + "the built module names no entry points");
  if (m.source.empty()) throw ValueError(who + "the built module has no source");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(m.source)));
  const std::string hashed = std::string(key.kind()) + "_" + hex;

  Modules& all = modules();
  std::lock_guard lock(all.naming);
  for (int k = 0;; ++k) {
    const std::string base = k == 0 ? hashed : hashed + "_" + std::to_string(k);
    if (auto it = all.by_name.find(base); it != all.by_name.end()) {
      if (template_source(base) == m.source && same_entries(it->second, m.entries)) return it->second;
      continue;
    }
    if (!name_free(base, m.entries.size())) continue;
    add_generated_template(base, std::move(m.source), std::move(m.label));
    std::vector<const KernelSpec*> specs;
    for (std::size_t i = 0; i < m.entries.size(); ++i) {
      KernelSpec spec;
      spec.op = entry_name(base, i);
      spec.template_name = base;
      spec.entry = std::move(m.entries[i]);
      spec.dtypes = {generated_dtypes()};
      spec.bind = [](const DTypes&, std::uint32_t) { return Bindings{}; };
      specs.push_back(&register_kernel(std::move(spec)));
    }
    return all.by_name[base] = specs;
  }
}

}  // namespace

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void GeneratedKey::push(std::uint64_t w) {
  if (size_ < kInline) {
    inline_[size_++] = w;
    return;
  }
  if (spill_.empty()) spill_.assign(inline_.begin(), inline_.end());
  spill_.push_back(w);
  ++size_;
}

std::uint64_t GeneratedKey::hash() const {
  std::uint64_t h = fnv1a64(kind_);
  h = fnv1a64(std::string_view("\0", 1), h);
  for (std::uint64_t w : words()) {
    char le[8];
    for (int b = 0; b < 8; ++b) le[b] = static_cast<char>(w >> (8 * b));
    h = fnv1a64(std::string_view(le, 8), h);
  }
  return h;
}

std::span<const KernelSpec* const> generated_kernels(const GeneratedKey& key, FunctionRef<GeneratedModule()> build) {
  Module& m = modules().slot(key);
  if (!m.ready.load(std::memory_order_acquire)) {
    // A throw leaves the once_flag unset, so a later call builds again.
    std::call_once(m.once, [&] {
      g_builds.fetch_add(1, std::memory_order_relaxed);
      m.specs = build_specs(key, build());
      m.ready.store(true, std::memory_order_release);
    });
  }
  return m.specs;
}

const DTypes& generated_dtypes() {
  static const DTypes d{DType::u8};
  return d;
}

Function generated_function(std::span<const KernelSpec* const> module, std::string_view entry, int device) {
  for (const KernelSpec* spec : module)
    if (spec->entry == entry) return get_function(*spec, generated_dtypes(), 0, device);
  std::string have;
  for (const KernelSpec* spec : module) (have += have.empty() ? "" : ", ") += spec->entry;
  throw ValueError("[generated_kernels] no entry point '" + std::string(entry) + "' in module " +
                   (module.empty() ? std::string("(empty)") : module[0]->template_name) + " (it has: " + have + ")");
}

std::uint64_t generated_builds() { return g_builds.load(std::memory_order_relaxed); }

}  // namespace kiln::rt
