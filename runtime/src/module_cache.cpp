#include "kiln/runtime/module_cache.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "check.h"
#include "compile_lock.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/quick_tier.h"
#include "kiln/runtime/templates.h"
#include "module_cache_internal.h"
#include "quick_tier_registry.h"

namespace kiln::rt {

namespace {

thread_local bool t_waits_uncounted = false;

struct Counters {
  std::atomic<std::uint64_t> compiles{0}, memory_hits{0}, disk_hits{0}, quick_compiles{0}, upgrades{0};
  std::atomic<std::uint64_t> compile_us{0}, load_us{0}, wait_us{0};
  std::atomic<std::uint64_t> cubin_loads{0}, ptx_loads{0};
} counters;

// One slot per (kernel, dtypes, variant, device); call_once makes concurrent first
// calls of one key compile once while other keys proceed in parallel.
struct Slot {
  std::once_flag once;
  std::atomic<bool> ready{false};
  Function fn;                                 // as first loaded
  bool quick = false;                          // fn is a quick build (set before ready)
  std::atomic<const Function*> full{nullptr};  // the full build that replaced it
};

class MemoryCache {
 public:
  Slot& slot(std::uint64_t key) {
    {
      std::shared_lock lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) return *it->second;
    }
    std::unique_lock lock(mu_);
    auto& s = map_[key];
    if (!s) s = std::make_unique<Slot>();
    return *s;
  }

 private:
  std::shared_mutex mu_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Slot>> map_;
};

MemoryCache& memory_cache() {
  static MemoryCache* c = new MemoryCache;  // outlives static destructors that may still launch
  return *c;
}

std::uint64_t pack_key(const KernelSpec& spec, const DTypes& d, std::uint32_t variant, int device) {
  if (variant > 0xffff || device < 0 || device > 0xff)
    throw ValueError("[" + spec.op + "] variant " + std::to_string(variant) + " or device out of range");
  std::uint64_t dt = d.n;
  for (int i = 0; i < d.n; ++i) dt |= static_cast<std::uint64_t>(d.v[i]) << (3 + 4 * i);
  return std::uint64_t{spec.id} | dt << 16 | std::uint64_t{variant} << 35 | std::uint64_t(device) << 51;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Outside the cache a generated kernel is known by its label, not its hash name, and by no
// dtypes (its key holds the runtime's placeholder tuple).
std::string display_name(const EntryKey& key) { return key.label.empty() ? key.op : key.label; }
std::string display_dtypes(const EntryKey& key) { return key.label.empty() ? key.dtypes : ""; }

// `recheck`: look in the disk cache again once this process holds the digest's compile lock,
// where another process may have stored it meanwhile (`*stored_meanwhile` says so); not when
// the cached binaries were just rejected.
// Throws where KILN_NO_COMPILE forbids compiling `key`; says once that kernels compile.
void about_to_compile(const EntryKey& key) {
  if (const char* env = std::getenv("KILN_NO_COMPILE"); env && *env && std::string(env) != "0")
    throw Error("[cache] KILN_NO_COMPILE is set but " + display_name(key) +
                (display_dtypes(key).empty() ? "" : " (" + display_dtypes(key) + ")") + " for sm_" +
                std::to_string(key.arch) + " is not in the disk cache " + DiskCache::global().dir().string());
  static std::once_flag first;
  std::call_once(first, [] {
    log().info("compiling GPU kernels on first use; `jitcc warm` fills the kernel cache ahead of time");
  });
}

// One compile per digest at a time: the entries of a generated module share one, and a
// prefetch racing the run's own call for a kernel joins it.
struct InFlightCompiles {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_future<Entry>> by_digest;
};
InFlightCompiles& in_flight_compiles() {
  // Leaked: prefetch threads, joined by a static built before this, finish compiles at exit.
  static auto* c = new InFlightCompiles;
  return *c;
}

Entry compile_entry(const EntryKey& key, std::string source, bool recheck = true, bool* stored_meanwhile = nullptr) {
  about_to_compile(key);
  InFlightCompiles& in_flight = in_flight_compiles();
  std::promise<Entry> done;
  {
    std::unique_lock lock(in_flight.mu);
    if (auto it = in_flight.by_digest.find(key.digest); it != in_flight.by_digest.end()) {
      std::shared_future<Entry> other = it->second;
      lock.unlock();
      return other.get();
    }
    in_flight.by_digest.emplace(key.digest, done.get_future().share());
  }
  auto finish = [&] {
    std::lock_guard lock(in_flight.mu);
    in_flight.by_digest.erase(key.digest);
  };
  try {
    const std::optional<CompileLock> held = CompileLock::acquire(DiskCache::global(), key.digest);
    if (held && recheck)
      if (std::optional<Entry> e = DiskCache::global().load(key)) {
        counters.disk_hits++;
        if (stored_meanwhile) *stored_meanwhile = true;
        done.set_value(*e);
        finish();
        return std::move(*e);
      }
    CompiledModule m = compile({display_name(key), display_dtypes(key), source, key.arch});
    count_compile(m.ms);
    Entry e{key, std::move(source), std::move(m.ptx), std::move(m.cubin)};
    DiskCache::global().store(e);
    done.set_value(e);
    finish();
    return e;
  } catch (...) {
    done.set_exception(std::current_exception());
    finish();
    throw;
  }
}

// The quick tier's build of `key`: compiled in NVRTC's fast-compile mode, kept in memory only.
Entry compile_quick(const EntryKey& key, std::string source) {
  about_to_compile(key);
  CompiledModule m = compile({display_name(key), display_dtypes(key), source, key.arch, /*quick=*/true});
  count_compile(m.ms);
  counters.quick_compiles++;
  return Entry{key, std::move(source), std::move(m.ptx), std::move(m.cubin)};
}

// Errors after which the other binary form (or a fresh compile) may still load.
bool retryable(CUresult r) {
  return r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_INVALID_PTX ||
         r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_INVALID_SOURCE;
}

CUresult try_load(const Entry& e, CUmodule* module) {
  const Driver& d = driver();
  CUresult r = CUDA_ERROR_NO_BINARY_FOR_GPU;
  if (!e.cubin.empty()) {
    r = d.cuModuleLoadData(module, e.cubin.data());
    if (r == CUDA_SUCCESS) counters.cubin_loads++;
    if (r == CUDA_SUCCESS || !retryable(r)) return r;
    log().warn("{} ({}): driver rejected CUBIN for sm_{}; loading PTX", e.key.op, e.key.dtypes, e.key.arch);
  }
  r = d.cuModuleLoadData(module, e.ptx.c_str());
  if (r == CUDA_SUCCESS) counters.ptx_loads++;
  return r;
}

// Modules loaded from a bundle's binaries, by (bundle digest, device): the entries of the
// bundle's other kernels hold the same binaries, so they take the module already loaded.
CUresult load_module(const Entry& e, int device, CUmodule* module) {
  if (e.key.bundle.empty()) return try_load(e, module);
  struct Shared {
    std::mutex mu;
    std::map<std::pair<std::string, int>, CUmodule> modules;
  };
  static auto* shared = new Shared;  // leaked like the memory cache: its modules live for the process
  std::lock_guard lock(shared->mu);
  const auto key = std::pair{e.key.bundle, device};
  if (auto it = shared->modules.find(key); it != shared->modules.end()) {
    *module = it->second;
    return CUDA_SUCCESS;
  }
  const CUresult r = try_load(e, module);
  if (r == CUDA_SUCCESS) shared->modules.emplace(key, *module);
  return r;
}

// Defined by KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS (prelude.cu) in a module whose kernels all wait.
constexpr const char* kWaitsForPriorGridsSymbol = "kiln_kernels_wait_for_prior_grids";

Entry entry_for_key(const EntryKey& key, std::string source, WarmOutcome* outcome);

// `entry`'s function on `device`, or the driver's error for a module it would not load (a
// rejected cached binary is the caller's to compile again).
CUresult load_entry(const Entry& entry, const KernelSpec& spec, int device, Function* out) {
  make_current(device);
  auto start = std::chrono::steady_clock::now();
  CUmodule module = nullptr;
  const CUresult r = load_module(entry, device, &module);
  if (r != CUDA_SUCCESS) return r;
  CUfunction fn = nullptr;
  const std::string& name = entry.key.function.empty() ? spec.entry : entry.key.function;
  KILN_CU(cuModuleGetFunction(&fn, module, name.c_str()));
  CUdeviceptr flag = 0;
  std::size_t flag_bytes = 0;
  const bool waits = device_info(device).arch() >= 90 &&
                     driver().cuModuleGetGlobal(&flag, &flag_bytes, module, kWaitsForPriorGridsSymbol) == CUDA_SUCCESS;
  counters.load_us += static_cast<std::uint64_t>(ms_since(start) * 1000);
  *out = Function{fn, device, waits};
  return CUDA_SUCCESS;
}

// `entry`'s function on `device`; a cached binary the driver rejects (`cached`: the entry came
// from the disk cache) is compiled again, stored and loaded.
Function load_or_recompile(const Entry& entry, bool cached, const KernelSpec& spec, int device) {
  Function f;
  CUresult r = load_entry(entry, spec, device, &f);
  if (r != CUDA_SUCCESS && retryable(r) && cached) {
    log().warn("{} ({}): cached binaries for sm_{} rejected by the driver; recompiling", entry.key.op, entry.key.dtypes,
               entry.key.arch);
    r = load_entry(compile_entry(entry.key, entry.source, /*recheck=*/false), spec, device, &f);
  }
  if (r != CUDA_SUCCESS) detail::throw_cu(r, "cuModuleLoadData", __FILE__, __LINE__);
  return f;
}

// A disk hit, else (`*quick` set) a quick build where this call may take one, else a compile
// stored in the disk cache.
Function load_function(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device, bool* quick) {
  const int arch = device_info(device).arch();
  std::string source = instantiate_kernel(spec, dtypes, variant);
  EntryKey key = kernel_entry_key(spec, dtypes, variant, arch, source);
  std::optional<Entry> entry = DiskCache::global().load(key);
  const bool from_disk = entry.has_value();
  *quick = !from_disk && quick_tier() && !quick_tier_options().empty() && !full_tier_only();
  if (from_disk) counters.disk_hits++;
  else
    entry = *quick ? compile_quick(key, source) : compile_entry(key, source);

  const Function f = load_or_recompile(*entry, from_disk, spec, device);
  if (*quick) note_quick_build(f.handle);
  return f;
}

// The full build of a slot holding a quick one: from the disk cache or compiled into it, loaded,
// and published, so later calls and graphs take it. Leaked like the slots.
const Function& upgrade(Slot& s, const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device) {
  if (const Function* done = s.full.load(std::memory_order_acquire)) return *done;
  std::string source = instantiate_kernel(spec, dtypes, variant);
  const EntryKey key = kernel_entry_key(spec, dtypes, variant, device_info(device).arch(), source);
  WarmOutcome outcome{};
  const Entry entry = entry_for_key(key, std::move(source), &outcome);
  auto* f = new Function(load_or_recompile(entry, outcome == WarmOutcome::cached, spec, device));
  const Function* expected = nullptr;
  if (!s.full.compare_exchange_strong(expected, f, std::memory_order_acq_rel)) {
    delete f;  // another thread published first; its module serves
    return *expected;
  }
  note_full_build(s.fn.handle, *f);
  counters.upgrades++;
  log().debug("[cache] the full build of {} ({}) replaces its quick one", spec.op, dtypes.str());
  return *f;
}

// The slot's function as callers get it now: its full build once there is one.
Function current(Slot& s, const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device) {
  if (!s.quick) return s.fn;
  if (const Function* f = s.full.load(std::memory_order_acquire)) return *f;
  if (full_tier_only() && !thread_capturing()) return upgrade(s, spec, dtypes, variant, device);
  return s.fn;
}

// The full build of a kernel first loaded as a quick one, on the prefetch threads behind what is
// queued; a generated kernel's (a step's conv or GEMM tiles, which the quick build slows most)
// ahead of kiln's own. A failure leaves the quick build running, and says why.
void queue_upgrade(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device) {
  const bool generated = generated_template_label(spec.template_name).has_value();
  run_in_background(
      [&spec, dtypes, variant, device] {
        try {
          upgrade(memory_cache().slot(pack_key(spec, dtypes, variant, device)), spec, dtypes, variant, device);
        } catch (const std::exception& e) {
          log().warn("[cache] the full build of {} ({}) failed; its quick build stays: {}", spec.op, dtypes.str(),
                     e.what());
        }
      },
      generated);
}

Entry entry_for_key(const EntryKey& key, std::string source, WarmOutcome* outcome) {
  if (std::optional<Entry> e = DiskCache::global().load(key)) {
    counters.disk_hits++;
    if (outcome) *outcome = WarmOutcome::cached;
    return std::move(*e);
  }
  bool stored_meanwhile = false;
  Entry e = compile_entry(key, std::move(source), true, &stored_meanwhile);
  if (outcome) *outcome = stored_meanwhile ? WarmOutcome::cached : WarmOutcome::compiled;
  return e;
}

WarmOutcome warm_key(const EntryKey& key, std::string source, std::string* digest) {
  if (digest) *digest = key.digest;
  WarmOutcome outcome{};
  entry_for_key(key, std::move(source), &outcome);
  return outcome;
}

}  // namespace

EntryKey entry_key_for_arch(EntryKey named, int arch, const std::string& source) {
  EntryKey k = std::move(named);
  k.arch = arch;
  k.options.clear();
  k.kind = nvrtc_can_emit_cubin(arch) ? "cubin" : "ptx";
  k.nvrtc_version = nvrtc_version();
  for (const auto& o : nvrtc_options(arch, wants_arch_specific(source), wants_fast_compile(source)))
    k.options += (k.options.empty() ? "" : " ") + o;
  k.digest = entry_digest(k, source);
  return k;
}

EntryKey kernel_entry_key(const KernelSpec& spec, const DTypes& d, std::uint32_t variant, int arch,
                          const std::string& source) {
  EntryKey k;
  k.op = kernel_source_name(spec);
  k.dtypes = d.str();
  k.variant = variant;
  k.label = generated_template_label(spec.template_name).value_or("");
  return entry_key_for_arch(std::move(k), arch, source);
}

void count_compile(double ms) {
  counters.compiles++;
  counters.compile_us += static_cast<std::uint64_t>(ms * 1000);
}

void count_disk_hit() { counters.disk_hits++; }

Function get_function(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device) {
  if (shape_only()) {
    record_request(spec, dtypes, variant, device);
    return Function{nullptr, device};
  }
  Slot& s = memory_cache().slot(pack_key(spec, dtypes, variant, device));
  if (s.ready.load(std::memory_order_acquire)) {
    counters.memory_hits.fetch_add(1, std::memory_order_relaxed);
    return current(s, spec, dtypes, variant, device);
  }
  // Loading a module is not a stream operation: a graph being captured cannot wait for it
  // here, only for a prefetch thread's load of it.
  if (thread_capturing()) {
    const auto waiting = std::chrono::steady_clock::now();
    wait_for_prefetch_until([&s] { return s.ready.load(std::memory_order_acquire); });
    counters.wait_us += static_cast<std::uint64_t>(ms_since(waiting) * 1000);
    if (s.ready.load(std::memory_order_acquire)) return current(s, spec, dtypes, variant, device);
    throw ValueError("[compile] kernel '" + spec.op + "' (" + dtypes.str() + ", variant " + std::to_string(variant) +
                     ") was not loaded before the capture: the eager call of a compiled function must run the same ops");
  }
  // A throw leaves the once_flag unset, so a later call retries. The wait counts this
  // thread's own compile or load, or its wait for a prefetch of the same kernel.
  const auto start = std::chrono::steady_clock::now();
  std::call_once(s.once, [&] {
    bool quick = false;
    s.fn = load_function(spec, dtypes, variant, device, &quick);
    s.quick = quick;
    s.ready.store(true, std::memory_order_release);
    if (quick) queue_upgrade(spec, dtypes, variant, device);
  });
  if (!on_prefetch_thread() && !t_waits_uncounted) {
    const double waited = ms_since(start);
    counters.wait_us += static_cast<std::uint64_t>(waited * 1000);
    if (waited >= 1) log().debug("[cache] waited {:.1f} ms for {} ({})", waited, spec.op, dtypes.str());
  }
  return current(s, spec, dtypes, variant, device);
}

std::optional<Function> function_if_cached(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant,
                                           int device, bool look_on_disk) {
  Slot& s = memory_cache().slot(pack_key(spec, dtypes, variant, device));
  if (s.ready.load(std::memory_order_acquire)) {
    if (!s.quick) return s.fn;
    if (const Function* f = s.full.load(std::memory_order_acquire)) return *f;
  }
  if (!look_on_disk) return std::nullopt;
  const std::string source = instantiate_kernel(spec, dtypes, variant);
  if (!DiskCache::global().contains(kernel_entry_key(spec, dtypes, variant, device_info(device).arch(), source).digest))
    return std::nullopt;
  const FullTierOnly full;  // on disk: the full build, wherever a quick one was loaded first
  return get_function(spec, dtypes, variant, device);
}

WarmOutcome warm_kernel(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int arch,
                        std::string* digest) {
  std::string source = instantiate_kernel(spec, dtypes, variant);
  EntryKey key = kernel_entry_key(spec, dtypes, variant, arch, source);  // before the source moves
  return warm_key(key, std::move(source), digest);
}

WarmOutcome warm_source(const EntryKey& recorded, const std::string& source, int arch, std::string* digest) {
  return warm_key(entry_key_for_arch(recorded, arch, source), source, digest);
}

Entry cached_entry(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int arch,
                   WarmOutcome* outcome) {
  std::string source = instantiate_kernel(spec, dtypes, variant);
  EntryKey key = kernel_entry_key(spec, dtypes, variant, arch, source);  // before the source moves
  return entry_for_key(key, std::move(source), outcome);
}

CacheCounters cache_counters() {
  return {counters.compiles.load(),
          counters.memory_hits.load(),
          counters.disk_hits.load(),
          static_cast<double>(counters.compile_us.load()) / 1000.0,
          static_cast<double>(counters.load_us.load()) / 1000.0,
          counters.cubin_loads.load(),
          counters.ptx_loads.load(),
          static_cast<double>(counters.wait_us.load()) / 1000.0,
          counters.quick_compiles.load(),
          counters.upgrades.load()};
}

void reset_cache_counters() {
  counters.compiles = 0;
  counters.memory_hits = 0;
  counters.disk_hits = 0;
  counters.compile_us = 0;
  counters.load_us = 0;
  counters.wait_us = 0;
  counters.cubin_loads = 0;
  counters.ptx_loads = 0;
  counters.quick_compiles = 0;
  counters.upgrades = 0;
}

UncountedWaits::UncountedWaits() : ScopedFlag(t_waits_uncounted) {}

}  // namespace kiln::rt
