#include "atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "kiln/error.h"
#include "kiln/io/output_path.h"

namespace kiln::io {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  static std::atomic<unsigned> counter{0};
  check_replaceable_file(path_);
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  f_ = std::fopen(tmp_.c_str(), "wbx");  // x: never through something already at the temporary name
  if (!f_) throw IoError(path_, 0, std::string("expected a writable file (") + std::strerror(errno) + ")");
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* p, std::size_t n) {
  if (n && std::fwrite(p, 1, n, f_) != n)
    throw IoError(path_, written_,
                  "expected room to write " + std::to_string(n) + " bytes (" + std::strerror(errno) + ")");
  written_ += n;
}

void AtomicFile::commit() {
  const bool flushed = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(std::exchange(f_, nullptr)) == 0;
  if (!flushed || !closed)
    throw IoError(path_, written_,
                  std::string("expected a successful flush and close (") + std::strerror(flushed ? errno : err) + ")");
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw IoError(path_, 0, "expected to rename " + tmp_ + " onto it (" + std::strerror(errno) + ")");
  committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

}  // namespace kiln::io
