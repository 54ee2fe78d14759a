#pragma once
// The on-disk level of the module cache. Directory: $KILN_CACHE_DIR, else
// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln. Mode: KILN_CACHE=rw|ro|off.
// Size bound: KILN_CACHE_MAX_SIZE (bytes, or with K/M/G suffix; 0: no bound), LRU eviction.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kiln::rt {

// Readable fields stored in every entry's header; `digest` (hex SHA-256 of the
// instantiated source, every NVRTC option, the NVRTC version, the arch, the output
// kind and the format version) names the file.
struct EntryKey {
  std::string op{}, dtypes{};
  std::uint32_t variant = 0;
  int arch = 0;
  std::string kind{};  // "cubin" (CUBIN + PTX) or "ptx"
  std::string nvrtc_version{};
  std::string options{};  // NVRTC options joined by spaces
  std::string digest{};
  // Readable name of a generated kernel ("fused(mul,add) f32"); empty for templates shipped
  // with kiln. An optional header line, outside the digest: entries without it still read.
  std::string label{};
  // A kernel compiled with others in one NVRTC program (a bundle, kernel_bundle.h): its entry
  // point's name in the binaries (empty: the spec's entry), and the bundle's digest, which
  // every entry of the bundle holds, so that they share one loaded module. Outside the digest.
  std::string function{}, bundle{};
};

struct Entry {
  EntryKey key;
  std::string source;  // instantiated .cu
  std::string ptx;
  std::string cubin;   // empty for kind "ptx"
};

struct EntryInfo {
  std::filesystem::path path;
  EntryKey key;  // op/dtypes/... empty when the header is unreadable
  std::uint64_t bytes = 0;
  std::int64_t created = 0;    // unix seconds, from the header
  std::int64_t last_used = 0;  // unix seconds, recorded by the cache on each hit
  bool ok = true;
  std::string problem;  // why the entry is bad, when !ok
  // Named and headed as kiln's (its digest's name in its shard, the entry magic): a file
  // `jitcc verify --fix` may remove even when bad. Any other file is listed, never removed.
  bool ours = false;
};

// What gc and clear did. Both remove kiln's own files only: entries (see EntryInfo::ours),
// temp files of writers that are gone, and quarantined entries; anything else stays.
struct Removal {
  std::size_t entries = 0;                  // entry files removed
  std::uint64_t bytes = 0;                  // bytes of every file removed
  std::uint64_t left_bytes = 0;             // bytes of kiln's entries still there
  std::vector<std::filesystem::path> kept;  // files in the shards that are not kiln's, left alone
  // "cannot read directory P: why", "cannot remove P: why": the pass did less than asked.
  std::vector<std::string> problems;
};

enum class CacheMode { read_write, read_only, off };

// Computes EntryKey::digest from its fields and the source.
std::string entry_digest(const EntryKey& k, const std::string& source);

class DiskCache {
 public:
  DiskCache(std::filesystem::path dir, CacheMode mode, std::uint64_t max_bytes);
  // The process-wide cache configured from the environment.
  static DiskCache& global();
  // Resolves the directory from the environment (for jitcc's default).
  static std::filesystem::path default_dir();
  static constexpr std::uint32_t kFormatVersion = 1;

  // A valid entry for `key` (digest and fields must match), recording its use.
  // A bad entry is moved aside with a warning and nullopt returned.
  std::optional<Entry> load(const EntryKey& key);
  // Atomic: unique temp file in the same directory, flushed, renamed. Degrades to
  // memory-only with one warning when the directory is not writable. Evicts LRU
  // entries past the size bound.
  void store(const Entry& e);

  // (files done, files in all) as a scan of the whole cache goes, for a progress display.
  using Progress = std::function<void(std::size_t done, std::size_t total)>;

  // Every file in the shards, valid or not. Directories that exist but cannot be read (no
  // permission, a file where a shard should be) are added to `problems`, when given.
  std::vector<EntryInfo> list(const Progress& progress = {}, std::vector<std::string>* problems = nullptr) const;
  std::optional<Entry> read(const std::filesystem::path& p, std::string* problem = nullptr) const;
  // Removes kiln's least-recently-used entries (broken ones first) until theirs total is
  // <= max_bytes, temp files of writers that are gone and day-old quarantined entries.
  Removal gc(std::uint64_t max_bytes, const Progress& progress = {});
  // Temp files whose writer is gone (killed mid-store); returns bytes removed.
  std::uint64_t remove_abandoned_temps();
  bool contains(const std::string& digest) const;  // an entry file exists for `digest`
  // Removes every entry of kiln's, temp file no writer holds and quarantined entry; other
  // files stay (Removal::kept), and shards left empty go.
  Removal clear();
  std::uint64_t total_bytes() const;     // files named as entries
  std::size_t quarantine_count() const;  // files moved aside as bad, not yet collected

  // Why dir() does not look like a kiln cache; "" when it does: it is missing or empty, holds
  // kiln's marker (CACHEDIR.TAG naming kiln, written with the first entry), or, made before
  // the marker, a file of kiln's (an entry with the magic, a temp or quarantined file).
  std::string foreign_reason() const;
  // Writes the marker unless there is one; false when it cannot.
  bool write_marker() const;
  // "1048576", "512K", "64M", "2G" (binary multiples); nullopt when malformed.
  static std::optional<std::uint64_t> parse_size(const std::string& text);

  const std::filesystem::path& dir() const { return dir_; }
  CacheMode mode() const { return mode_; }
  std::uint64_t max_bytes() const { return max_bytes_; }  // 0: no bound
  bool writable() const;

 private:
  std::filesystem::path entry_path(const std::string& digest) const;
  void quarantine(const std::filesystem::path& p, const std::string& why);
  void note_write_failure(const std::string& reason);
  void account_store(std::uint64_t bytes);
  Removal gc_locked(std::uint64_t max_bytes, const Progress& progress = {});

  std::filesystem::path dir_;
  CacheMode mode_;
  std::uint64_t max_bytes_;
  mutable std::mutex mu_;
  bool write_failed_ = false;  // after the one warning, memory-only
  bool marked_ = false;        // the marker is there (or cannot be written): not tried again
  std::int64_t bytes_estimate_ = -1;
};

}  // namespace kiln::rt
