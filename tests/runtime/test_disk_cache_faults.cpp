// Disk cache: every kind of damaged entry is detected, moved aside and recompiled,
// and concurrent writers (threads and processes) leave only valid entries.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <functional>
#include <set>
#include <thread>

#include "disk_cache_test_util.h"

using namespace kiln::rt;
using namespace kiln_test;

namespace {

struct Damage {
  const char* name;
  std::function<void(const fs::path& file, const DiskCache& cache)> apply;
  std::string problem;  // expected in read()'s and list()'s problem and in the warning
};

void replace_once(const fs::path& file, const std::string& from, const std::string& to) {
  std::string bytes = read_bytes(file);
  std::size_t at = bytes.find(from);
  REQUIRE(at != std::string::npos);
  bytes.replace(at, from.size(), to);
  write_bytes(file, bytes);
}

void set_byte(const fs::path& file, std::size_t at, char value) {
  std::string bytes = read_bytes(file);
  REQUIRE(at < bytes.size());
  bytes[at] = value;
  write_bytes(file, bytes);
}

std::vector<Damage> damages(const Entry& e) {
  const std::string payload = std::to_string(e.source.size() + e.ptx.size() + e.cubin.size());
  return {
      {"truncated", [](const fs::path& f, const DiskCache&) { fs::resize_file(f, fs::file_size(f) / 2); },
       " payload bytes present, header says " + payload},
      {"flipped payload byte",
       [](const fs::path& f, const DiskCache&) {
         std::string b = read_bytes(f);
         set_byte(f, b.size() - 100, static_cast<char>(b[b.size() - 100] ^ 0x01));
       },
       "payload checksum mismatch"},
      {"wrong magic", [](const fs::path& f, const DiskCache&) { set_byte(f, 0, 'X'); }, "bad magic"},
      {"wrong version", [](const fs::path& f, const DiskCache&) { set_byte(f, 8, 2); }, "format version 2, expected 1"},
      {"zero length", [](const fs::path& f, const DiskCache&) { fs::resize_file(f, 0); }, "empty file"},
      {"too short", [](const fs::path& f, const DiskCache&) { fs::resize_file(f, 11); },
       "too short for the fixed header"},
      {"unrelated file",
       [](const fs::path& f, const DiskCache&) { write_bytes(f, "# my notes\nnothing to do with kiln\n"); },
       "bad magic"},
      {"header unparsable", [](const fs::path& f, const DiskCache&) { replace_once(f, "\nkind=", "\nkind:"); },
       "header unparsable"},
      {"section sizes",
       [&](const fs::path& f, const DiskCache&) {
         std::string wrong = std::to_string(e.ptx.size());
         wrong.back() = wrong.back() == '9' ? '8' : static_cast<char>(wrong.back() + 1);  // same length
         replace_once(f, "\nptx_bytes=" + std::to_string(e.ptx.size()) + "\n", "\nptx_bytes=" + wrong + "\n");
       },
       "section sizes do not add up"},
      {"edited header", [](const fs::path& f, const DiskCache&) { replace_once(f, "-std=c++17", "-std=c++20"); },
       "edited or foreign entry"},
      {"foreign entry",
       [](const fs::path& f, const DiskCache& c) {
         Entry other = make_entry("__global__ void foreign() {}\n");
         DiskCache writer(c.dir(), CacheMode::read_write, 0);
         writer.store(other);
         fs::copy_file(entry_file(c.dir(), other.key.digest), f, fs::copy_options::overwrite_existing);
       },
       "differs from the file name"},
  };
}

}  // namespace

TEST_CASE("disk cache: each kind of damage is detected, quarantined and recompiled") {
  const Entry e = make_entry();
  for (const Damage& d : damages(e)) {
    CAPTURE(d.name);
    TempDir tmp;
    DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
    cache.store(e);
    const fs::path file = entry_file(cache.dir(), e.key.digest);
    d.apply(file, cache);

    std::string problem;
    CHECK_FALSE(cache.read(file, &problem).has_value());
    CHECK(problem.find(d.problem) != std::string::npos);
    bool listed = false;
    for (const EntryInfo& info : cache.list()) {
      if (info.path != file) continue;
      listed = true;
      CHECK_FALSE(info.ok);
      CHECK(info.problem == problem);
      CHECK(info.bytes == fs::file_size(file));
    }
    CHECK(listed);

    {
      LogCapture logs;
      CHECK_FALSE(cache.load(e.key).has_value());
      CHECK(logs.lines().size() == 1);
      CHECK(logs.count(file.string()) == 1);
      CHECK(logs.count(d.problem) == 1);
    }
    CHECK_FALSE(fs::exists(file));
    CHECK(cache.quarantine_count() == 1);
    bool moved = false;
    for (const auto& q : fs::directory_iterator(cache.dir() / "quarantine")) {
      const std::string name = q.path().filename().string();
      moved |= name.starts_with(e.key.digest + ".kiln.") && name.ends_with(".bad");
    }
    CHECK(moved);

    cache.store(e);  // the caller recompiled
    std::optional<Entry> again = cache.load(e.key);
    REQUIRE(again.has_value());
    CHECK(again->cubin == e.cubin);
    for (const EntryInfo& info : cache.list()) CHECK(info.ok);
  }
}

TEST_CASE("disk cache: a truncated entry reports the bytes present and the size promised") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  const Entry e = make_entry();
  cache.store(e);
  const fs::path file = entry_file(cache.dir(), e.key.digest);
  const std::uint64_t payload = e.source.size() + e.ptx.size() + e.cubin.size();
  fs::resize_file(file, fs::file_size(file) - 10);
  std::string problem;
  CHECK_FALSE(cache.read(file, &problem));
  CHECK(problem == "truncated: " + std::to_string(payload - 10) + " payload bytes present, header says " +
                       std::to_string(payload));
}

namespace {

// Thread t's i-th entry; every fifth digest is shared by all writers.
Entry concurrent_entry(int t, int i) {
  const std::string name =
      i % 5 == 0 ? "shared" + std::to_string(i) : "t" + std::to_string(t) + "_" + std::to_string(i);
  Entry e = make_entry("extern \"C\" __global__ void " + name + "() {}\n" + std::string(100 * (i % 7), '/'));
  return e;
}

void check_all_valid(const DiskCache& cache, std::size_t expected_entries) {
  std::vector<EntryInfo> infos = cache.list();
  CHECK(infos.size() == expected_entries);
  for (const EntryInfo& info : infos) {
    CAPTURE(info.path);
    CHECK(info.ok);
    CHECK(info.problem.empty());
  }
  CHECK(cache.quarantine_count() == 0);
  for (const auto& d : fs::recursive_directory_iterator(cache.dir())) {
    CHECK_FALSE(d.path().filename().string().starts_with(".tmp-"));  // every temp file was renamed
  }
}

}  // namespace

TEST_CASE("disk cache: 8 threads storing 50 entries each leave only valid entries") {
  constexpr int kThreads = 8, kEntries = 50;
  TempDir tmp;
  DiskCache shared(tmp.path() / "cache", CacheMode::read_write, 0);
  std::set<std::string> digests;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEntries; ++i) digests.insert(concurrent_entry(t, i).key.digest);
  }
  std::atomic<int> misses{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one DiskCache, half have their own (as separate processes would).
      DiskCache own(shared.dir(), CacheMode::read_write, 0);
      DiskCache& cache = t % 2 ? own : shared;
      for (int i = 0; i < kEntries; ++i) {
        Entry e = concurrent_entry(t, i);
        cache.store(e);
        std::optional<Entry> got = cache.load(e.key);
        if (!got || got->source != e.source) ++misses;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(misses == 0);
  CHECK(digests.size() == kThreads * (kEntries - kEntries / 5) + kEntries / 5);
  check_all_valid(shared, digests.size());
}

TEST_CASE("disk cache: 4 processes storing at once leave only valid entries") {
  constexpr int kProcs = 4, kEntries = 40;
  TempDir tmp;
  const fs::path dir = tmp.path() / "cache";
  std::vector<pid_t> children;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int failures = 0;
      DiskCache cache(dir, CacheMode::read_write, 0);
      for (int i = 0; i < kEntries; ++i) {
        Entry e = concurrent_entry(p, i);
        cache.store(e);
        failures += cache.load(e.key).has_value() ? 0 : 1;
      }
      ::_exit(failures == 0 && cache.writable() ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  DiskCache cache(dir, CacheMode::read_only, 0);
  check_all_valid(cache, kProcs * (kEntries - kEntries / 5) + kEntries / 5);
}
