#pragma once
// The readers under test take a path: each input is written to one scratch file per process.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln_fuzz {

struct ScratchFile {
  std::string path;
  ~ScratchFile() { std::remove(path.c_str()); }
};

inline const std::string& write_input(const std::uint8_t* data, std::size_t size, const char* name) {
  static const ScratchFile scratch{"/tmp/kiln-fuzz-" + std::to_string(::getpid()) + "-" + name};
  const std::string& path = scratch.path;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();  // the harness itself failed; no input can be judged
  }
  return path;
}

}  // namespace kiln_fuzz
