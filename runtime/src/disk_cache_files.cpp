#include "disk_cache_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>

#include "disk_cache_format.h"

namespace fs = std::filesystem;

namespace kiln::rt {

namespace {

// The spec's signature line, then one naming kiln: another tool's tag does not make a kiln cache.
constexpr std::string_view kMarkerSignature = "Signature: 8a477f597d28d172789f06886806bc55";
constexpr std::string_view kMarkerText =
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by kiln: its kernel cache (jitcc).\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n";
constexpr std::string_view kMarkerKiln = "created by kiln";

}  // namespace

std::string errno_text(int err) { return std::generic_category().message(err); }

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_hex_name(std::string_view s, std::size_t n) {
  return s.size() == n &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_entry_name(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.size() == 69 && name.ends_with(".kiln") && is_hex_name(std::string_view(name).substr(0, 64), 64) &&
         p.parent_path().filename() == name.substr(0, 2);
}

bool is_temp_name(std::string_view name) {
  const std::size_t at = std::string_view(kTempPrefix).size();
  return name.starts_with(kTempPrefix) && name.size() > at + 65 && is_hex_name(name.substr(at, 64), 64) &&
         name[at + 64] == '-';
}

bool is_quarantine_name(std::string_view name) {
  return name.size() > 74 && is_hex_name(name.substr(0, 64), 64) && name.substr(64, 6) == ".kiln." &&
         name.ends_with(".bad");
}

FileBytes read_file(const fs::path& p, std::uint64_t limit) {
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

EntryVerdict judge_entry(const fs::path& p) {
  FileBytes f = read_file(p, 4096);
  if (!f.error.empty() || !has_entry_magic(f.bytes)) return EntryVerdict::foreign;
  EntryLayout l;
  std::string why = check_layout(f.bytes, f.size, &l);
  if (why == kNeedMoreBytes) {
    f = read_file(p, l.payload_at);
    why = f.error.empty() ? check_layout(f.bytes, f.size, &l) : f.error;
  }
  return why.empty() && check_consistency(l, p).empty() ? EntryVerdict::good : EntryVerdict::bad;
}

std::vector<CacheFile> scan_files(const fs::path& dir, std::vector<std::string>* problems) {
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
  // A cache (or quarantine) not made yet is empty; anything else unread must not pass as empty.
  if (ec && ec != std::errc::no_such_file_or_directory && problems)
    problems->push_back("cannot read directory " + dir.string() + ": " + ec.message());
  return out;
}

std::vector<fs::path> shard_dirs(const fs::path& dir, std::vector<std::string>* problems) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_hex_name(it->path().filename().string(), 2)) out.push_back(it->path());
  if (ec && ec != std::errc::no_such_file_or_directory && problems)
    problems->push_back("cannot read directory " + dir.string() + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<CacheFile> scan_shards(const fs::path& dir, std::vector<std::string>* problems) {
  std::vector<CacheFile> out;
  for (const fs::path& shard : shard_dirs(dir, problems)) {
    std::vector<CacheFile> files = scan_files(shard, problems);
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

// Removed under our lock, so a writer that takes the name meanwhile (O_EXCL) cannot lose its file.
bool remove_if_abandoned(const CacheFile& f, std::int64_t now, std::int64_t grace_s) {
  if (now - f.mtime_s < grace_s || !is_temp_name(f.path.filename().string())) return false;
  int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool abandoned = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  const bool removed = abandoned && ::unlink(f.path.c_str()) == 0;
  ::close(fd);
  return removed;
}

bool marker_present(const fs::path& dir) {
  FileBytes f = read_file(dir / kMarkerName, 4096);
  return f.error.empty() && f.bytes.starts_with(kMarkerSignature) && f.bytes.find(kMarkerKiln) != std::string::npos;
}

bool write_marker_file(const fs::path& dir) {
  // O_EXCL: one writer, and never over someone else's tag.
  int fd = ::open((dir / kMarkerName).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno == EEXIST;
  const bool ok = ::write(fd, kMarkerText.data(), kMarkerText.size()) == static_cast<ssize_t>(kMarkerText.size());
  return ::close(fd) == 0 && ok;
}

}  // namespace kiln::rt
