#pragma once
// One compile of a kernel at a time among the processes that share a disk cache (the ranks of a
// node under kiln-run, a jitcc warm beside a run): the compiler of a digest holds an exclusive
// flock on <cache>/locks/<digest> while it compiles and stores; the others wait for it, then
// find the entry it stored.
#include <filesystem>
#include <optional>
#include <string>

#include "kiln/runtime/disk_cache.h"

namespace kiln::rt {

class CompileLock {
 public:
  // Waits until this process holds `digest`'s lock. Nullopt where the cache cannot lock (not
  // read-write, unwritable, no flock there) or after `wait_s` seconds of another holder (one
  // stopped mid-compile must not stall every other process): the caller compiles unlocked.
  static std::optional<CompileLock> acquire(const DiskCache& cache, const std::string& digest, double wait_s = 60);

  CompileLock(CompileLock&& other) noexcept;
  CompileLock& operator=(CompileLock&& other) noexcept;  // releases this one first
  CompileLock(const CompileLock&) = delete;
  ~CompileLock() { release(); }

 private:
  void release();  // removes the file, then releases the lock
  CompileLock(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::filesystem::path path_;
};

}  // namespace kiln::rt
