// The disk cache's maintenance: listing, size bound, clearing, and telling a kiln cache from
// another directory. Only files kiln named and wrote are ever removed, so a mistyped
// directory (a git repository's objects, say) loses nothing.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "disk_cache_files.h"
#include "disk_cache_format.h"
#include "kiln/runtime/disk_cache.h"

namespace fs = std::filesystem;

namespace kiln::rt {

namespace {

// A writer holds an flock on its temp file from just after creating it; this grace covers
// the instant between the two calls.
constexpr std::int64_t kTempGraceSeconds = 5;
constexpr std::int64_t kStaleQuarantineSeconds = 24 * 3600;  // long enough to inspect

// Unlinks `f`, counting it in `r`; a failure other than "already gone" is a problem.
bool remove_file(const CacheFile& f, Removal& r) {
  if (::unlink(f.path.c_str()) == 0) {
    r.bytes += f.bytes;
    return true;
  }
  if (errno == ENOENT) return true;
  r.problems.push_back("cannot remove " + f.path.string() + ": " + errno_text(errno));
  return false;
}

}  // namespace

void DiskCache::account_store(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_bytes_ == 0) return;
  if (bytes_estimate_ < 0) {
    bytes_estimate_ = 0;  // includes the entry just stored
    for (const CacheFile& f : scan_shards(dir_))
      if (f.kind == FileKind::entry) bytes_estimate_ += static_cast<std::int64_t>(f.bytes);
  } else {
    bytes_estimate_ += static_cast<std::int64_t>(bytes);
  }
  // Down to 80%, so that a full cache is not collected again at every store.
  if (static_cast<std::uint64_t>(bytes_estimate_) > max_bytes_) gc_locked(max_bytes_ - max_bytes_ / 5);
}

Removal DiskCache::gc(std::uint64_t max_bytes, const Progress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  return gc_locked(max_bytes, progress);
}

Removal DiskCache::gc_locked(std::uint64_t max_bytes, const Progress& progress) {
  const std::int64_t now = unix_now();
  Removal r;
  for (const CacheFile& f : scan_files(dir_ / kQuarantineDir, &r.problems))
    if (is_quarantine_name(f.path.filename().string()) && now - f.mtime_s > kStaleQuarantineSeconds) remove_file(f, r);
  struct Candidate {
    CacheFile file;
    bool bad;
  };
  std::vector<Candidate> candidates;
  std::vector<CacheFile> files = scan_shards(dir_, &r.problems);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (progress) progress(i, files.size());
    CacheFile& f = files[i];
    if (f.kind == FileKind::temp) {
      if (remove_if_abandoned(f, now, kTempGraceSeconds)) r.bytes += f.bytes;
      continue;
    }
    const EntryVerdict v = is_entry_name(f.path) ? judge_entry(f.path) : EntryVerdict::foreign;
    if (v == EntryVerdict::foreign) {
      r.kept.push_back(f.path);
      continue;
    }
    total += f.bytes;
    candidates.push_back({std::move(f), v == EntryVerdict::bad});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.bad != b.bad) return a.bad;
    if (a.file.mtime_ns != b.file.mtime_ns) return a.file.mtime_ns < b.file.mtime_ns;
    return a.file.path < b.file.path;
  });
  for (const Candidate& c : candidates) {
    if (total <= max_bytes) break;
    if (remove_file(c.file, r)) total -= c.file.bytes, ++r.entries;
  }
  r.left_bytes = total;
  bytes_estimate_ = static_cast<std::int64_t>(total);
  return r;
}

Removal DiskCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::int64_t now = unix_now();
  Removal r;
  for (const fs::path& shard : shard_dirs(dir_, &r.problems)) {
    for (const CacheFile& f : scan_files(shard, &r.problems)) {
      if (f.kind == FileKind::temp && is_temp_name(f.path.filename().string())) {
        // A temp file a writer still holds stays: removing it would fail that store.
        if (remove_if_abandoned(f, now, 0)) r.bytes += f.bytes;
      } else if (is_entry_name(f.path) && judge_entry(f.path) != EntryVerdict::foreign) {
        r.entries += remove_file(f, r);
      } else {
        r.kept.push_back(f.path);
      }
    }
    ::rmdir(shard.c_str());  // fails, as it should, while anything is left in it
  }
  for (const CacheFile& f : scan_files(dir_ / kQuarantineDir, &r.problems)) {
    if (is_quarantine_name(f.path.filename().string()))
      remove_file(f, r);
    else
      r.kept.push_back(f.path);
  }
  ::rmdir((dir_ / kQuarantineDir).c_str());
  bytes_estimate_ = -1;
  return r;
}

std::uint64_t DiskCache::remove_abandoned_temps() {
  const std::int64_t now = unix_now();
  std::uint64_t removed = 0;
  for (const CacheFile& f : scan_shards(dir_))
    if (f.kind == FileKind::temp && remove_if_abandoned(f, now, kTempGraceSeconds)) removed += f.bytes;
  return removed;
}

bool DiskCache::contains(const std::string& digest) const {
  struct stat st {};
  return is_hex_name(digest, 64) && ::stat(entry_path(digest).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::uint64_t DiskCache::total_bytes() const {
  std::uint64_t total = 0;
  for (const CacheFile& f : scan_shards(dir_)) total += f.kind == FileKind::entry ? f.bytes : 0;
  return total;
}

std::size_t DiskCache::quarantine_count() const { return scan_files(dir_ / kQuarantineDir).size(); }

std::vector<EntryInfo> DiskCache::list(const Progress& progress, std::vector<std::string>* problems) const {
  std::vector<EntryInfo> out;
  const std::vector<CacheFile> files = scan_shards(dir_, problems);
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
      info.ours = bytes.error.empty() && has_entry_magic(bytes.bytes) && is_entry_name(f.path);
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

std::string DiskCache::foreign_reason() const {
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0)
    return errno == ENOENT ? "" : "cannot inspect " + dir_.string() + ": " + errno_text(errno);
  if (!S_ISDIR(st.st_mode)) return dir_.string() + " is not a directory";
  if (marker_present(dir_)) return "";
  // Caches made before the marker: one file that kiln named and wrote is enough.
  std::vector<std::string> problems;
  for (const CacheFile& f : scan_shards(dir_, &problems)) {
    if (f.kind == FileKind::temp ? is_temp_name(f.path.filename().string())
                                 : is_entry_name(f.path) && judge_entry(f.path) != EntryVerdict::foreign)
      return "";
  }
  for (const CacheFile& f : scan_files(dir_ / kQuarantineDir))
    if (is_quarantine_name(f.path.filename().string())) return "";
  std::error_code ec;
  if (fs::is_empty(dir_, ec) && !ec) return "";
  if (!problems.empty()) return problems.front();  // not seen whole, so not judged
  return "it holds no " + std::string(kMarkerName) + " written by kiln and no file that verifies as a kiln cache entry";
}

bool DiskCache::write_marker() const { return write_marker_file(dir_); }

}  // namespace kiln::rt
