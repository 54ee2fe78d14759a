#pragma once
// The files of a disk cache directory: which are kiln's, reading them, scanning the shards.
// Layout: DIR/CACHEDIR.TAG (kiln's marker), DIR/ab/<digest>.kiln (entries, in the shard named
// by the digest's first two characters), DIR/ab/.tmp-<digest>-... (a store in progress) and
// DIR/quarantine/<digest>.kiln.<time>-<pid>.bad (bad entries moved aside).
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::rt {

inline constexpr const char* kQuarantineDir = "quarantine";
inline constexpr const char* kTempPrefix = ".tmp-";
inline constexpr const char* kMarkerName = "CACHEDIR.TAG";

std::string errno_text(int err);
std::int64_t unix_now();
bool is_hex_name(std::string_view s, std::size_t n);

// Names kiln gives its files; nothing else in a cache directory is ever removed.
bool is_entry_name(const std::filesystem::path& p);  // <64 hex>.kiln in the shard of its first two
bool is_temp_name(std::string_view name);            // .tmp-<64 hex>-...
bool is_quarantine_name(std::string_view name);      // <64 hex>.kiln.<...>.bad

struct FileBytes {
  bool missing = false;
  std::string error;  // why it could not be read
  std::string bytes;
  std::uint64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// Reads up to `limit` bytes of a regular file.
FileBytes read_file(const std::filesystem::path& p, std::uint64_t limit = UINT64_MAX);

// What a file with an entry's name holds, from its header alone (no checksum).
enum class EntryVerdict {
  foreign,  // unreadable, or without the entry magic: not shown to be kiln's, so never removed
  bad,      // kiln's, but its header or sizes are broken
  good,
};
EntryVerdict judge_entry(const std::filesystem::path& p);

enum class FileKind { entry, other, temp };

struct CacheFile {
  std::filesystem::path path;
  FileKind kind;
  std::uint64_t bytes;
  std::int64_t mtime_s;
  std::int64_t mtime_ns;  // orders evictions of entries used within one second
};

// Regular files of `dir`; a directory that exists but cannot be read adds
// "cannot read directory DIR: why" to `problems` (when given). A missing one is empty.
std::vector<CacheFile> scan_files(const std::filesystem::path& dir, std::vector<std::string>* problems = nullptr);
// The two-hex-character names in `dir` (shards, or files where shards should be), sorted.
std::vector<std::filesystem::path> shard_dirs(const std::filesystem::path& dir,
                                              std::vector<std::string>* problems = nullptr);
std::vector<CacheFile> scan_shards(const std::filesystem::path& dir, std::vector<std::string>* problems = nullptr);

// A temp file no writer holds (flock) and older than `grace_s`: its writer was killed.
bool remove_if_abandoned(const CacheFile& f, std::int64_t now, std::int64_t grace_s);

// The marker: a CACHEDIR.TAG (https://bford.info/cachedir/, so backup tools skip the cache)
// that names kiln. Written once, never rewritten; false when it cannot be written.
bool marker_present(const std::filesystem::path& dir);
bool write_marker_file(const std::filesystem::path& dir);

}  // namespace kiln::rt
