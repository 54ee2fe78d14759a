// The store of measured choices: a map in memory in front of "tune" entries of the disk cache.
#include "kiln/runtime/tuning.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "compile_lock.h"
#include "kiln/runtime/log.h"

namespace kiln::rt {

namespace {

std::atomic<TuneMode> g_mode{[] {
  const char* v = std::getenv("KILN_TUNE");
  if (!v || !*v) return TuneMode::auto_;
  if (auto m = parse_tune_mode(v)) return *m;
  log().warn("[tune] KILN_TUNE='{}' is not one of on, auto, cached, off: it stays auto", v);
  return TuneMode::auto_;
}()};

using MemKey = std::tuple<std::string, std::string, std::string, int, std::string>;

struct Memory {
  std::mutex mu;
  // nullopt: the disk cache had none when asked; ops ask on every call, so it is read once.
  std::map<MemKey, std::optional<TuneChoice>> choices;
};

Memory& memory() {
  static auto* m = new Memory;  // never destroyed: ops may tune during static destruction
  return *m;
}

MemKey mem_key(const TuneKey& k) { return {k.site, k.problem, k.dtypes, k.arch, k.library}; }

// The whole question: the digest covers the source, not the op or dtypes fields.
std::string question(const TuneKey& k) {
  return "site " + k.site + "\nproblem " + k.problem + "\ndtypes " + k.dtypes + "\narch " + std::to_string(k.arch) +
         "\nlibrary " + k.library + "\n";
}

}  // namespace

std::optional<TuneMode> parse_tune_mode(const std::string& text) {
  if (text == "on") return TuneMode::on;
  if (text == "cached") return TuneMode::cached;
  if (text == "auto") return TuneMode::auto_;
  if (text == "off") return TuneMode::off;
  return std::nullopt;
}

TuneMode tune_mode() { return g_mode.load(std::memory_order_relaxed); }
void set_tune_mode(TuneMode mode) { g_mode.store(mode, std::memory_order_relaxed); }

EntryKey tune_entry_key(const TuneKey& key) {
  EntryKey k;
  k.op = "tune/" + key.site;
  k.dtypes = key.dtypes;
  k.arch = key.arch;
  k.kind = kTuneKind;
  k.options = key.library;
  k.label = key.site + " " + key.problem;
  k.digest = entry_digest(k, question(key));
  return k;
}

Entry tune_entry(const TuneKey& key, const TuneChoice& choice) {
  Entry e;
  e.key = tune_entry_key(key);
  e.source = question(key);
  e.ptx = choice.variant + "\n" + choice.detail;
  return e;
}

std::optional<TuneChoice> tune_entry_choice(const Entry& e) {
  if (e.key.kind != kTuneKind) return std::nullopt;
  const auto nl = e.ptx.find('\n');
  TuneChoice c{e.ptx.substr(0, nl), nl == std::string::npos ? "" : e.ptx.substr(nl + 1)};
  if (c.variant.empty()) return std::nullopt;
  return c;
}

namespace {

std::optional<TuneChoice> disk_choice(const TuneKey& key) {
  std::optional<Entry> e = DiskCache::global().load(tune_entry_key(key));
  return e ? tune_entry_choice(*e) : std::nullopt;
}

}  // namespace

std::optional<TuneChoice> find_choice(const TuneKey& key) {
  if (tune_mode() == TuneMode::off) return std::nullopt;
  Memory& m = memory();
  {
    std::lock_guard lock(m.mu);
    if (auto it = m.choices.find(mem_key(key)); it != m.choices.end()) return it->second;
  }
  std::optional<TuneChoice> c = disk_choice(key);
  std::lock_guard lock(m.mu);
  return m.choices.emplace(mem_key(key), c).first->second;  // a store since the read wins
}

std::optional<TuneChoice> find_stored_choice(const TuneKey& key) {
  if (tune_mode() == TuneMode::off) return std::nullopt;
  std::optional<TuneChoice> c = disk_choice(key);
  if (c) {
    Memory& m = memory();
    std::lock_guard lock(m.mu);
    m.choices.insert_or_assign(mem_key(key), c);
  }
  return c;
}

struct TuneMeasureLock::Held {
  CompileLock lock;
};

TuneMeasureLock::TuneMeasureLock(const TuneKey& key) {
  if (std::optional<CompileLock> l = CompileLock::acquire(DiskCache::global(), tune_entry_key(key).digest))
    held_ = std::make_unique<Held>(Held{std::move(*l)});
}

TuneMeasureLock::~TuneMeasureLock() = default;

void store_choice(const TuneKey& key, const TuneChoice& choice) {
  {
    Memory& m = memory();
    std::lock_guard lock(m.mu);
    m.choices.insert_or_assign(mem_key(key), choice);
  }
  DiskCache& cache = DiskCache::global();
  if (cache.mode() == CacheMode::read_write) cache.store(tune_entry(key, choice));
}

void forget_choices_in_memory() {
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  m.choices.clear();
}

namespace {
std::atomic<std::uint64_t> g_measured{0}, g_measured_us{0}, g_measured_ahead{0}, g_ahead_us{0};
}  // namespace

void count_measured_choice(double ms, bool ahead) {
  g_measured.fetch_add(1, std::memory_order_relaxed);
  g_measured_us.fetch_add(static_cast<std::uint64_t>(ms * 1000), std::memory_order_relaxed);
  if (!ahead) return;
  g_measured_ahead.fetch_add(1, std::memory_order_relaxed);
  g_ahead_us.fetch_add(static_cast<std::uint64_t>(ms * 1000), std::memory_order_relaxed);
}

TuneCounters tune_counters() {
  return {g_measured.load(std::memory_order_relaxed),
          static_cast<double>(g_measured_us.load(std::memory_order_relaxed)) / 1000.0,
          g_measured_ahead.load(std::memory_order_relaxed),
          static_cast<double>(g_ahead_us.load(std::memory_order_relaxed)) / 1000.0};
}

}  // namespace kiln::rt
