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

#include "disk_cache_format.h"
#include "kiln/error.h"
#include "kiln/runtime/log.h"

namespace fs = std::filesystem;

namespace kiln::rt {
namespace {

constexpr const char* kQuarantineDir = "quarantine";
constexpr const char* kTempPrefix = ".tmp-";
// A writer holds an flock on its temp file from just after creating it; this grace covers
// the instant between the two calls.
constexpr std::int64_t kTempGraceSeconds = 5;
constexpr std::int64_t kStaleQuarantineSeconds = 24 * 3600;  // long enough to inspect

std::string errno_text(int err) { return std::generic_category().message(err); }

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_hex_name(std::string_view s, std::size_t n) {
  return s.size() == n &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

struct FileBytes {
  bool missing = false;
  std::string error;  // why it could not be read
  std::string bytes;
  std::uint64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// Reads up to `limit` bytes of a regular file.
FileBytes read_file(const fs::path& p, std::uint64_t limit = UINT64_MAX) {
  FileBytes f;
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    f.missing = errno == ENOENT || errno == ENOTDIR;  // ENOTDIR: the cache directory is not one
    f.error = "cannot open: " + errno_text(errno);
    return f;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    f.error = "cannot stat: " + errno_text(errno);
    ::close(fd);
    return f;
  }
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  if (!S_ISREG(st.st_mode)) {
    f.error = S_ISDIR(st.st_mode) ? "a directory, not a file" : "not a regular file";
    ::close(fd);
    return f;
  }
  f.size = static_cast<std::uint64_t>(st.st_size);
  f.bytes.resize(std::min(f.size, limit));
  std::size_t got = 0;
  while (got < f.bytes.size()) {
    ssize_t n = ::read(fd, f.bytes.data() + got, f.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      f.error = "cannot read: " + errno_text(errno);
      break;
    }
    if (n == 0) break;  // shrank while reading: judged on what is there
    got += static_cast<std::size_t>(n);
  }
  f.bytes.resize(got);
  if (limit == UINT64_MAX) f.size = got;
  ::close(fd);
  return f;
}

// Structural validity (no checksum): enough to order gc's evictions without reading payloads.
bool structurally_ok(const fs::path& p) {
  FileBytes f = read_file(p, 4096);
  EntryLayout l;
  if (!f.error.empty()) return false;
  std::string why = check_layout(f.bytes, f.size, &l);
  if (why == kNeedMoreBytes) {
    f = read_file(p, l.payload_at);
    why = f.error.empty() ? check_layout(f.bytes, f.size, &l) : f.error;
  }
  return why.empty() && check_consistency(l, p).empty();
}

bool write_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

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
  else if (::fsync(fd) != 0)
    failed = "fsync", err = errno;
  else if (::rename(tmp.c_str(), final.c_str()) != 0)
    failed = "rename", err = errno;
  if (failed) {
    *reason = std::string("cannot ") + failed + " " + tmp.string() + ": " + errno_text(err);
    ::unlink(tmp.c_str());
  }
  ::close(fd);  // after fsync a close error loses nothing
  return failed == nullptr;
}

enum class FileKind { entry, other, temp };

struct CacheFile {
  fs::path path;
  FileKind kind;
  std::uint64_t bytes;
  std::int64_t mtime_s;
  std::int64_t mtime_ns;  // orders evictions of entries used within one second
};

std::vector<CacheFile> scan_files(const fs::path& dir) {
  std::vector<CacheFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    FileKind kind = name.starts_with(kTempPrefix) ? FileKind::temp
                    : name.ends_with(".kiln")     ? FileKind::entry
                                                  : FileKind::other;
    out.push_back({it->path(), kind, static_cast<std::uint64_t>(st.st_size), st.st_mtim.tv_sec,
                   st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec});
  }
  return out;
}

std::vector<fs::path> shard_dirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (is_hex_name(it->path().filename().string(), 2) && it->is_directory(ec2)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A temp file no writer holds: its writer was killed. Removed under our lock, so a
// writer that takes the name meanwhile (O_EXCL) cannot lose its file.
bool remove_if_abandoned(const CacheFile& f, std::int64_t now) {
  if (now - f.mtime_s < kTempGraceSeconds) return false;
  int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool abandoned = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  const bool removed = abandoned && ::unlink(f.path.c_str()) == 0;
  ::close(fd);
  return removed;
}

std::vector<CacheFile> scan_shards(const fs::path& dir) {
  std::vector<CacheFile> out;
  for (const fs::path& shard : shard_dirs(dir)) {
    std::vector<CacheFile> files = scan_files(shard);
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
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
  if (std::string d = env("KILN_CACHE_DIR"); !d.empty()) return d;
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
  account_store(bytes.size());
}

void DiskCache::note_write_failure(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (write_failed_) return;
  write_failed_ = true;
  log().warn("[cache] directory {} is not writable ({}); continuing with the memory-only cache", dir_.string(), reason);
}

void DiskCache::account_store(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_bytes_ == 0) return;
  if (bytes_estimate_ < 0) {
    std::uint64_t total = 0;
    for (const CacheFile& f : scan_shards(dir_)) total += f.kind == FileKind::temp ? 0 : f.bytes;
    bytes_estimate_ = static_cast<std::int64_t>(total);  // includes the entry just stored
  } else {
    bytes_estimate_ += static_cast<std::int64_t>(bytes);
  }
  // Down to 80%, so that a full cache is not collected again at every store.
  if (static_cast<std::uint64_t>(bytes_estimate_) > max_bytes_) gc_locked(max_bytes_ - max_bytes_ / 5);
}

std::uint64_t DiskCache::gc(std::uint64_t max_bytes, const Progress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  return gc_locked(max_bytes, progress);
}

std::uint64_t DiskCache::gc_locked(std::uint64_t max_bytes, const Progress& progress) {
  const std::int64_t now = unix_now();
  std::uint64_t removed = 0, total = 0;
  auto remove = [&](const CacheFile& f) {
    bool ok = ::unlink(f.path.c_str()) == 0;
    if (ok) removed += f.bytes;
    return ok || errno == ENOENT;  // gone either way
  };
  for (const CacheFile& f : scan_files(dir_ / kQuarantineDir)) {
    if (now - f.mtime_s > kStaleQuarantineSeconds) remove(f);
  }
  struct Candidate {
    CacheFile file;
    bool bad;
  };
  std::vector<Candidate> candidates;
  std::vector<CacheFile> files = scan_shards(dir_);
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (progress) progress(i, files.size());
    CacheFile& f = files[i];
    if (f.kind == FileKind::temp) {
      if (remove_if_abandoned(f, now)) removed += f.bytes;
      continue;
    }
    total += f.bytes;
    bool bad = f.kind == FileKind::other || !structurally_ok(f.path);
    candidates.push_back({std::move(f), bad});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.bad != b.bad) return a.bad;
    if (a.file.mtime_ns != b.file.mtime_ns) return a.file.mtime_ns < b.file.mtime_ns;
    return a.file.path < b.file.path;
  });
  for (const Candidate& c : candidates) {
    if (total <= max_bytes) break;
    if (remove(c.file)) total -= c.file.bytes;
  }
  bytes_estimate_ = static_cast<std::int64_t>(total);
  return removed;
}

void DiskCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<fs::path> doomed = shard_dirs(dir_);
  doomed.push_back(dir_ / kQuarantineDir);
  for (const fs::path& d : doomed) {
    std::error_code ec;
    fs::remove_all(d, ec);
    if (ec) throw Error("[cache] cannot remove " + d.string() + ": " + ec.message());
  }
  bytes_estimate_ = 0;
}

std::uint64_t DiskCache::remove_abandoned_temps() {
  const std::int64_t now = unix_now();
  std::uint64_t removed = 0;
  for (const CacheFile& f : scan_shards(dir_))
    if (f.kind == FileKind::temp && remove_if_abandoned(f, now)) removed += f.bytes;
  return removed;
}

bool DiskCache::contains(const std::string& digest) const {
  struct stat st {};
  return is_hex_name(digest, 64) && ::stat(entry_path(digest).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::uint64_t DiskCache::total_bytes() const {
  std::uint64_t total = 0;
  for (const CacheFile& f : scan_shards(dir_)) total += f.kind == FileKind::temp ? 0 : f.bytes;
  return total;
}

std::size_t DiskCache::quarantine_count() const { return scan_files(dir_ / kQuarantineDir).size(); }

std::vector<EntryInfo> DiskCache::list(const Progress& progress) const {
  std::vector<EntryInfo> out;
  const std::vector<CacheFile> files = scan_shards(dir_);
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (progress) progress(i, files.size());
    const CacheFile& f = files[i];
    if (f.kind == FileKind::temp) continue;
    EntryInfo info;
    info.path = f.path;
    info.bytes = f.bytes;
    info.last_used = f.mtime_s;
    if (f.kind == FileKind::other) {
      info.ok = false;
      info.problem = "not a kiln cache entry";
    } else {
      FileBytes bytes = read_file(f.path);
      Entry e;
      EntryLayout l;
      info.problem = bytes.error.empty() ? decode_entry(bytes.bytes, f.path, &e, &l) : bytes.error;
      info.ok = info.problem.empty();
      if (l.header_ok) {
        info.key = l.header.key;
        info.created = l.header.created;
      }
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const EntryInfo& a, const EntryInfo& b) { return a.path < b.path; });
  return out;
}

}  // namespace kiln::rt
