#pragma once
// Shared by the disk cache tests: a fresh directory per test, sample entries,
// explicit mtimes (log_capture.h: the kiln logger's warnings).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/runtime/disk_cache.h"
#include "log_capture.h"

namespace kiln_test {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("kiln-disk-test-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter++) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    // A test may have made a directory read-only; make it removable again first.
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    }
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A plausible entry: PTX text and a CUBIN holding every byte value, NULs included.
inline kiln::rt::Entry make_entry(const std::string& source = "extern \"C\" __global__ void add_f32() {}\n",
                                  const std::string& options = "--gpu-architecture=sm_90 -std=c++17 -default-device") {
  kiln::rt::Entry e;
  e.key.op = "add";
  e.key.dtypes = "f32,f32";
  e.key.variant = 4;
  e.key.arch = 90;
  e.key.kind = "cubin";
  e.key.nvrtc_version = "13.0";
  e.key.options = options;
  e.source = source;
  e.ptx = ".version 9.0\n.target sm_90\n// " + source;
  for (int i = 0; i < 512; ++i) e.cubin += static_cast<char>((i * 7) & 0xff);
  e.key.digest = kiln::rt::entry_digest(e.key, e.source);
  return e;
}

inline fs::path entry_file(const fs::path& dir, const std::string& digest) {
  return dir / digest.substr(0, 2) / (digest + ".kiln");
}

inline void set_mtime(const fs::path& p, std::int64_t unix_seconds) {
  const struct timespec times[2] = {{unix_seconds, 0}, {unix_seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

inline std::int64_t mtime_ns(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

}  // namespace kiln_test
