#pragma once
// A file written beside its target and renamed over it on commit, so a reader never sees
// half a file; shared by the safetensors writer and io::write_file_atomically.
#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln::io {

class AtomicFile {
 public:
  // IoError naming `path` when check_replaceable_file refuses it or the temporary file cannot be made.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // without commit(): the temporary file is removed, the target left as it was
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, std::size_t n);
  // Flushes, fsyncs and renames onto the target.
  void commit();

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  std::uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace kiln::io
