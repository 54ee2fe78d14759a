#include "kiln/runtime/quick_tier.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "kiln/runtime/compiler.h"
#include "kiln/runtime/log.h"
#include "quick_tier_registry.h"

namespace kiln::rt {

namespace {

std::atomic<bool> g_quick{env_switch("KILN_QUICK_TIER", false, "cache")};
thread_local bool t_full_only = false;

struct Builds {
  std::mutex mu;
  // Every quick build loaded, with the full build that replaced it (handle null until then).
  std::unordered_map<void*, Function> full_of;
  std::atomic<std::uint64_t> generation{0};
};

Builds& builds() {
  static auto* b = new Builds;  // leaked like the module cache: graphs may launch at exit
  return *b;
}

}  // namespace

bool quick_tier() { return g_quick.load(std::memory_order_relaxed); }
void set_quick_tier(bool on) { g_quick.store(on, std::memory_order_relaxed); }

FullTierOnly::FullTierOnly() : ScopedFlag(t_full_only) {}
bool full_tier_only() { return t_full_only; }

bool is_quick_build(const Function& f) { return is_quick_handle(f.handle); }

void note_quick_build(void* handle) {
  std::lock_guard lock(builds().mu);
  builds().full_of.emplace(handle, Function{});
}

bool is_quick_handle(void* handle) {
  std::lock_guard lock(builds().mu);
  return builds().full_of.count(handle) > 0;
}

void note_full_build(void* quick, const Function& full) {
  Builds& b = builds();
  {
    std::lock_guard lock(b.mu);
    b.full_of[quick] = full;
  }
  b.generation.fetch_add(1, std::memory_order_acq_rel);
}

std::optional<Function> full_build_of(void* quick) {
  std::lock_guard lock(builds().mu);
  auto it = builds().full_of.find(quick);
  if (it == builds().full_of.end() || !it->second.handle) return std::nullopt;
  return it->second;
}

std::uint64_t tier_generation() { return builds().generation.load(std::memory_order_acquire); }

}  // namespace kiln::rt
