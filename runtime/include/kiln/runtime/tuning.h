#pragma once
// Choices among variants of one piece of work (a cuBLASLt algorithm, a convolution's kernel and
// tiles), measured once per (site, problem, dtypes, arch, library) and remembered in memory and
// in the disk cache as an entry of kind "tune", so no later process measures them again.
// KILN_TUNE: on measures what is not remembered; auto (default) measures only where candidates
// cost no compile (cuBLASLt algorithms), so a cold process does not compile every conv tile
// alternative; cached uses remembered choices and each site's heuristic otherwise; off always
// takes the heuristic.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kiln/runtime/disk_cache.h"

namespace kiln::rt {

struct TuneKey {
  std::string site;     // "cublaslt", "conv2d"
  std::string problem;  // shape and layout as canonical text
  std::string dtypes;   // "f32", "bf16"
  int arch = 0;         // 90 for sm_90
  std::string library;  // what else the candidates depend on: "cublasLt 130100", "kiln conv 1"
};

struct TuneChoice {
  std::string variant;  // the chosen candidate's name
  std::string detail;   // each candidate's time, one per line, for a reader
};

enum class TuneMode { off, cached, auto_, on };
TuneMode tune_mode();
void set_tune_mode(TuneMode mode);  // process-wide; jitcc tune and tests
// "off", "cached", "auto", "on"; nullopt for anything else.
std::optional<TuneMode> parse_tune_mode(const std::string& text);

// The remembered choice for `key` (memory, then the disk cache, read once per key: a miss is
// remembered too); nullopt when none, or when tuning is off.
std::optional<TuneChoice> find_choice(const TuneKey& key);
// Remembers `choice` in memory and, when the disk cache is writable, on disk.
void store_choice(const TuneKey& key, const TuneChoice& choice);
// Forgets the in-memory choices (tests: the next lookup reads the disk cache).
void forget_choices_in_memory();
// The choice the disk cache holds for `key` now, read past a miss find_choice remembered (another
// process may have stored one since), and remembered in memory; nullopt when none or tuning is off.
std::optional<TuneChoice> find_stored_choice(const TuneKey& key);

// Held while a process measures `key`, so the processes sharing its disk cache (the ranks of a
// node under kiln-run) measure a problem once: the others wait, then run the stored choice
// (find_stored_choice). Ranks that measured apart could pick different kernels, and a later
// process, reading the one stored, would not compute what one of them did. Holds nothing where
// the cache is not writable, nor after 60 s of another holder.
class TuneMeasureLock {
 public:
  explicit TuneMeasureLock(const TuneKey& key);
  ~TuneMeasureLock();
  TuneMeasureLock(const TuneMeasureLock&) = delete;
  TuneMeasureLock& operator=(const TuneMeasureLock&) = delete;
  bool held() const { return held_ != nullptr; }

 private:
  struct Held;
  std::unique_ptr<Held> held_;
};

// The choices this process measured and the milliseconds their measuring took (a cold run's
// cost that a warm one, reading the stored choices, does not pay).
struct TuneCounters {
  std::uint64_t measured = 0;
  double ms = 0;
  std::uint64_t measured_ahead = 0;  // of those, measured ahead of the run, off its path
  double ahead_ms = 0;
};
void count_measured_choice(double ms, bool ahead = false);
TuneCounters tune_counters();

// The disk cache entry of a choice (kind "tune": its source is the question, its ptx field the
// answer); tune_entry_choice reads a choice back, nullopt when the entry is not one.
Entry tune_entry(const TuneKey& key, const TuneChoice& choice);
EntryKey tune_entry_key(const TuneKey& key);
std::optional<TuneChoice> tune_entry_choice(const Entry& e);
inline constexpr const char* kTuneKind = "tune";

}  // namespace kiln::rt
