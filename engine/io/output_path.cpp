// Output path checks: lstat, not stat, so a symlink is seen as the link that a rename replaces.
#include "kiln/io/output_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "kiln/error.h"

namespace kiln::io {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The target's lstat mode, or 0 when nothing is there yet.
mode_t checked_mode(const std::string& path) {
  if (path.empty()) throw IoError(path, 0, "expected a file name, got an empty path");
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw IoError(path, 0, "expected its directory " + dir + " to exist (" + std::strerror(errno) + ")");
  if (!S_ISDIR(st.st_mode)) throw IoError(path, 0, "expected " + dir + " to be a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw IoError(path, 0, "expected its directory " + dir + " to be writable (" + std::strerror(errno) + ")");
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    throw IoError(path, 0, std::string("expected a file that can be examined (") + std::strerror(errno) + ")");
  }
  if (S_ISDIR(st.st_mode)) throw IoError(path, 0, "expected a file name, found a directory");
  return st.st_mode;
}

}  // namespace

void check_output_path(const std::string& path) { checked_mode(path); }

void check_replaceable_file(const std::string& path) {
  const mode_t mode = checked_mode(path);
  if (mode != 0 && !S_ISREG(mode))
    throw IoError(path, 0,
                  std::string("expected a regular file or a new name, found ") + kind_of(mode) +
                      " (saving writes a new file and renames it over the target, which would replace it)");
}

}  // namespace kiln::io
