#include "kiln/runtime/disk_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <system_error>
#include <thread>

#include "disk_cache_files.h"
#include "disk_cache_format.h"
#include "fd_io.h"
#include "kiln/error.h"
#include "kiln/runtime/log.h"

namespace fs = std::filesystem;

namespace kiln::rt {
namespace {

// Unique in this directory across processes and threads; O_EXCL makes a clash an error, not a mix-up.
std::string temp_name(const std::string& digest) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   std::chrono::steady_clock::now().time_since_epoch().count());
  char tail[64];
  std::snprintf(tail, sizeof tail, "-%ld-%zx-%016llx", static_cast<long>(::getpid()),
                std::hash<std::thread::id>{}(std::this_thread::get_id()), static_cast<unsigned long long>(rng()));
  return kTempPrefix + digest + tail;
}

// Writes `bytes` to `final` so that readers see the old file or the whole new one, never a part.
// No fsync: an entry torn by a crash fails its checksum when read and is compiled again, so an
// fsync would only make each compile wait on the disk.
bool write_atomically(const fs::path& final, const std::string& digest, const std::string& bytes, std::string* reason) {
  std::error_code ec;
  const fs::path shard = final.parent_path();
  fs::create_directories(shard, ec);
  if (ec) {
    *reason = "cannot create " + shard.string() + ": " + ec.message();
    return false;
  }
  const fs::path tmp = shard / temp_name(digest);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *reason = "cannot create " + tmp.string() + ": " + errno_text(errno);
    return false;
  }
  // Held until the rename: an unlocked temp file belongs to a writer that is gone.
  ::flock(fd, LOCK_EX);
  const char* failed = nullptr;
  int err = 0;
  if (!write_all(fd, bytes))
    failed = "write", err = errno;
  else if (::rename(tmp.c_str(), final.c_str()) != 0)
    failed = "rename", err = errno;
  if (failed) {
    *reason = std::string("cannot ") + failed + " " + tmp.string() + ": " + errno_text(err);
    ::unlink(tmp.c_str());
  }
  ::close(fd);  // the rename is done: a close error loses nothing a reader could not detect
  return failed == nullptr;
}

std::string key_mismatch(const EntryKey& want, const EntryKey& got) {
  std::string diff;
  auto cmp = [&](const char* name, const std::string& w, const std::string& g) {
    if (w != g) diff += std::string(diff.empty() ? "" : ", ") + name + " '" + g + "' (requested '" + w + "')";
  };
  cmp("op", want.op, got.op);
  cmp("dtypes", want.dtypes, got.dtypes);
  cmp("variant", std::to_string(want.variant), std::to_string(got.variant));
  cmp("arch", std::to_string(want.arch), std::to_string(got.arch));
  cmp("kind", want.kind, got.kind);
  cmp("nvrtc", want.nvrtc_version, got.nvrtc_version);
  cmp("options", want.options, got.options);
  return diff.empty() ? "" : "foreign entry: stored for " + diff;
}

}  // namespace

DiskCache::DiskCache(fs::path dir, CacheMode mode, std::uint64_t max_bytes)
    : dir_(std::move(dir)), mode_(mode), max_bytes_(max_bytes) {}

fs::path DiskCache::default_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (std::string d = env("KILN_CACHE_DIR"); !d.empty()) {
    // A relative one is taken from the current directory, and named in full from then on.
    std::error_code ec;
    fs::path abs = fs::absolute(d, ec);
    return ec ? fs::path(d) : abs.lexically_normal();
  }
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return fs::path(d) / "kiln";
  if (std::string d = env("HOME"); !d.empty()) return fs::path(d) / ".cache" / "kiln";
  return fs::path("/tmp") / ("kiln-cache-" + std::to_string(::getuid()));
}

std::optional<std::uint64_t> DiskCache::parse_size(const std::string& text) {
  std::string_view s = text;
  int shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      default:
        break;
    }
  }
  if (shift) s.remove_suffix(1);
  std::uint64_t v = 0;
  if (!parse_int(s, &v) || v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

DiskCache& DiskCache::global() {
  static DiskCache cache(
      default_dir(),
      [] {
        const char* v = std::getenv("KILN_CACHE");
        std::string s = v ? v : "";
        if (s.empty() || s == "rw") return CacheMode::read_write;
        if (s == "ro") return CacheMode::read_only;
        if (s == "off") return CacheMode::off;
        log().warn("[cache] KILN_CACHE='{}' is not one of rw|ro|off; using rw", s);
        return CacheMode::read_write;
      }(),
      [] {
        constexpr std::uint64_t kDefault = std::uint64_t(2) << 30;
        const char* v = std::getenv("KILN_CACHE_MAX_SIZE");
        if (!v || !*v) return kDefault;
        if (auto n = parse_size(v)) return *n;
        log().warn("[cache] KILN_CACHE_MAX_SIZE='{}' is not a size (bytes, or with a K/M/G suffix); using 2G", v);
        return kDefault;
      }());
  return cache;
}

fs::path DiskCache::entry_path(const std::string& digest) const {
  return dir_ / digest.substr(0, 2) / (digest + ".kiln");
}

bool DiskCache::writable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mode_ == CacheMode::read_write && !write_failed_;
}

std::optional<Entry> DiskCache::read(const fs::path& p, std::string* problem) const {
  FileBytes f = read_file(p);
  Entry e;
  EntryLayout l;
  std::string why = f.error.empty() ? decode_entry(f.bytes, p, &e, &l) : f.error;
  if (problem) *problem = why;
  if (!why.empty()) return std::nullopt;
  return e;
}

std::optional<Entry> DiskCache::load(const EntryKey& key) {
  if (mode_ == CacheMode::off || !is_hex_name(key.digest, 64)) return std::nullopt;
  fs::path p = entry_path(key.digest);
  FileBytes f = read_file(p);
  if (f.missing) return std::nullopt;
  Entry e;
  EntryLayout l;
  std::string why = f.error.empty() ? decode_entry(f.bytes, p, &e, &l) : f.error;
  if (why.empty()) why = key_mismatch(key, e.key);
  if (why.empty()) {
    // The cache's own LRU record: atime is unreliable (noatime, relatime).
    const struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    if (mode_ == CacheMode::read_write) ::utimensat(AT_FDCWD, p.c_str(), times, 0);
    return e;
  }
  struct stat st {};
  bool same_file = ::stat(p.c_str(), &st) == 0 && st.st_dev == f.dev && st.st_ino == f.ino;
  if (mode_ == CacheMode::read_write && same_file) {
    quarantine(p, why);  // not when another process has replaced it since we read it
  } else {
    log().warn("[cache] ignoring bad entry {}: {}; will recompile", p.string(), why);
  }
  return std::nullopt;
}

void DiskCache::quarantine(const fs::path& p, const std::string& why) {
  fs::path qdir = dir_ / kQuarantineDir;
  fs::path target =
      qdir / (p.filename().string() + "." + std::to_string(unix_now()) + "-" + std::to_string(::getpid()) + ".bad");
  std::error_code ec;
  fs::create_directories(qdir, ec);
  if (!ec && ::rename(p.c_str(), target.c_str()) == 0) {
    log().warn("[cache] bad entry {}: {}; moved to {}, will recompile", p.string(), why, target.string());
    return;
  }
  const int err = ec ? ec.value() : errno;
  std::string move_error = ec ? ec.message() : errno_text(err);
  if (!ec && err == ENOENT) {
    log().warn("[cache] bad entry {}: {}; already moved by another process, will recompile", p.string(), why);
  } else if (::unlink(p.c_str()) == 0) {
    log().warn("[cache] bad entry {}: {}; removed (could not move it: {}), will recompile", p.string(), why,
               move_error);
  } else {
    log().warn("[cache] bad entry {}: {}; could not move or remove it ({}), will recompile", p.string(), why,
               move_error);
  }
}

void DiskCache::store(const Entry& e) {
  if (mode_ != CacheMode::read_write) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (write_failed_) return;
  }
  const std::string digest = entry_digest(e.key, e.source);
  if (!e.key.digest.empty() && e.key.digest != digest) {
    throw ValueError("[cache] entry for " + e.key.op + " (" + e.key.dtypes + ") has digest " + e.key.digest +
                     ", but its key and source hash to " + digest);
  }
  const std::string bytes = encode_entry(e, digest, unix_now());
  std::string reason;
  if (!write_atomically(entry_path(digest), digest, bytes, &reason)) {
    note_write_failure(reason);
    return;
  }
  {
    // Tells jitcc clear/gc that this directory is a cache (an entry is there already, so a
    // reader that sees the marker half-written still recognises the cache by it).
    std::lock_guard<std::mutex> lock(mu_);
    if (!marked_) marked_ = true, write_marker_file(dir_);
  }
  account_store(bytes.size());
}

void DiskCache::note_write_failure(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (write_failed_) return;
  write_failed_ = true;
  log().warn("[cache] directory {} is not writable ({}); continuing with the memory-only cache", dir_.string(), reason);
}

}  // namespace kiln::rt
