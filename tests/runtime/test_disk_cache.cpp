// Disk cache: round trips, keys, modes, unwritable directories, eviction and configuration.
#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>

#include "disk_cache_test_util.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

using namespace kiln::rt;
using namespace kiln_test;

TEST_CASE("disk cache: store then load round-trips every field") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  Entry e = make_entry();
  const std::int64_t before = unix_now();
  cache.store(e);
  const fs::path file = entry_file(cache.dir(), e.key.digest);
  REQUIRE(fs::is_regular_file(file));

  std::optional<Entry> got = cache.load(e.key);
  REQUIRE(got.has_value());
  CHECK(got->key.op == e.key.op);
  CHECK(got->key.dtypes == e.key.dtypes);
  CHECK(got->key.variant == e.key.variant);
  CHECK(got->key.arch == e.key.arch);
  CHECK(got->key.kind == e.key.kind);
  CHECK(got->key.nvrtc_version == e.key.nvrtc_version);
  CHECK(got->key.options == e.key.options);
  CHECK(got->key.digest == e.key.digest);
  CHECK(got->source == e.source);
  CHECK(got->ptx == e.ptx);
  CHECK(got->cubin == e.cubin);

  std::string problem = "unset";
  CHECK(cache.read(file, &problem).has_value());
  CHECK(problem.empty());
  std::vector<EntryInfo> infos = cache.list();
  REQUIRE(infos.size() == 1);
  CHECK(infos[0].ok);
  CHECK(infos[0].path == file);
  CHECK(infos[0].key.op == "add");
  CHECK(infos[0].key.digest == e.key.digest);
  CHECK(infos[0].bytes == fs::file_size(file));
  CHECK(infos[0].created >= before);
  CHECK(infos[0].created <= unix_now());
  CHECK(cache.total_bytes() == infos[0].bytes);
  CHECK(cache.quarantine_count() == 0);

  SUBCASE("a PTX-only entry with an empty CUBIN, stored without a digest, round-trips") {
    Entry p = make_entry("__global__ void k() { /* ptx */ }\n");
    p.key.kind = "ptx";
    p.cubin.clear();
    p.key.digest.clear();
    cache.store(p);
    p.key.digest = entry_digest(p.key, p.source);
    std::optional<Entry> q = cache.load(p.key);
    REQUIRE(q.has_value());
    CHECK(q->cubin.empty());
    CHECK(q->ptx == p.ptx);
    CHECK(q->key.kind == "ptx");
  }
  SUBCASE("a digest with no file is a silent miss") {
    LogCapture logs;
    EntryKey other = make_entry("__global__ void other() {}\n").key;
    CHECK_FALSE(cache.load(other).has_value());
    EntryKey empty = e.key;
    empty.digest.clear();
    CHECK_FALSE(cache.load(empty).has_value());
    EntryKey hostile = e.key;
    hostile.digest = "../../etc/passwd";
    CHECK_FALSE(cache.load(hostile).has_value());
    CHECK(logs.lines().empty());
    CHECK(cache.quarantine_count() == 0);
  }
  SUBCASE("a request with other options is served nothing, and the entry is treated as foreign") {
    LogCapture logs;
    EntryKey k = e.key;
    k.options += " -lineinfo";
    CHECK_FALSE(cache.load(k).has_value());
    CHECK_FALSE(fs::exists(file));
    CHECK(cache.quarantine_count() == 1);
    REQUIRE(logs.count(file.string()) == 1);
    CHECK(logs.count("foreign entry") == 1);
    CHECK(logs.count("options") == 1);
    cache.store(e);
    CHECK(cache.load(e.key).has_value());
  }
  SUBCASE("a store whose digest does not match its key and source is a programming error") {
    Entry bad = e;
    bad.key.digest = std::string(64, 'a');
    CHECK_THROWS_AS(cache.store(bad), kiln::ValueError);
  }
}

TEST_CASE("disk cache: entry_digest covers source, options, NVRTC version, arch and kind only") {
  const Entry e = make_entry();
  const std::string base = entry_digest(e.key, e.source);
  CHECK(base.size() == 64);
  CHECK(base.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(base == e.key.digest);

  EntryKey k = e.key;
  CHECK(entry_digest(k, e.source + " ") != base);
  k.options += " -G";
  CHECK(entry_digest(k, e.source) != base);
  k = e.key;
  k.nvrtc_version = "12.8";
  CHECK(entry_digest(k, e.source) != base);
  k = e.key;
  k.arch = 80;
  CHECK(entry_digest(k, e.source) != base);
  k = e.key;
  k.kind = "ptx";
  CHECK(entry_digest(k, e.source) != base);

  k = e.key;
  k.op = "mul";
  k.dtypes = "f16,f16";
  k.variant = 1;
  k.digest = "ignored";
  CHECK(entry_digest(k, e.source) == base);

  // Length prefixes: moving text from one field to the next changes the digest.
  EntryKey a = e.key, b = e.key;
  a.options = "-a -b";
  a.nvrtc_version = "13.0";
  b.options = "-a";
  b.nvrtc_version = " -b13.0";
  CHECK(entry_digest(a, e.source) != entry_digest(b, e.source));
}

TEST_CASE("disk cache: an unwritable directory degrades to memory-only with one warning") {
  TempDir tmp;
  Entry e = make_entry();
  SUBCASE("a cache path under a regular file (fails even for root)") {
    write_bytes(tmp.path() / "a_regular_file", "not a directory\n");
    DiskCache cache(tmp.path() / "a_regular_file" / "cache", CacheMode::read_write, 1 << 20);
    LogCapture logs;
    CHECK(cache.writable());
    CHECK_NOTHROW(cache.store(e));
    CHECK_FALSE(cache.writable());
    CHECK_NOTHROW(cache.store(make_entry("__global__ void second() {}\n")));
    CHECK(logs.count("is not writable") == 1);
    CHECK(logs.count("continuing with the memory-only cache") == 1);
    CHECK(logs.count((tmp.path() / "a_regular_file" / "cache").string()) == 1);
    CHECK_FALSE(cache.load(e.key).has_value());
    CHECK(logs.lines().size() == 1);  // the miss is silent
    CHECK(cache.list().empty());
    CHECK(cache.total_bytes() == 0);
  }
  SUBCASE("a read-only directory (permission bits bind only non-root users)") {
    const fs::path dir = tmp.path() / "cache";
    fs::create_directories(dir);
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec);
    DiskCache cache(dir, CacheMode::read_write, 0);
    LogCapture logs;
    CHECK_NOTHROW(cache.store(e));
    CHECK_NOTHROW(cache.store(make_entry("__global__ void second() {}\n")));
    if (::geteuid() != 0) {
      CHECK_FALSE(cache.writable());
      CHECK(logs.count("is not writable") == 1);
      CHECK_FALSE(cache.load(e.key).has_value());
      CHECK(fs::is_empty(dir));
    }
    // Either way the cache is coherent: what was stored loads exactly when writes work.
    CHECK(cache.load(e.key).has_value() == cache.writable());
  }
}

TEST_CASE("disk cache: read-only mode reads without writing; off mode does neither") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "cache";
  Entry e = make_entry();
  Entry e2 = make_entry("__global__ void second() {}\n");
  DiskCache rw(dir, CacheMode::read_write, 0);
  rw.store(e);
  const fs::path file = entry_file(dir, e.key.digest);
  set_mtime(file, unix_now() - 3600);
  const std::int64_t old_mtime = mtime_ns(file);

  SUBCASE("ro") {
    DiskCache ro(dir, CacheMode::read_only, 1);
    CHECK_FALSE(ro.writable());
    ro.store(e2);
    CHECK_FALSE(fs::exists(entry_file(dir, e2.key.digest)));
    std::optional<Entry> got = ro.load(e.key);
    REQUIRE(got.has_value());
    CHECK(got->cubin == e.cubin);
    CHECK(mtime_ns(file) == old_mtime);
    CHECK(ro.list().size() == 1);

    // A bad entry is reported and skipped, but left where it is.
    write_bytes(file, "garbage that is long enough to have a magic\n");
    LogCapture logs;
    CHECK_FALSE(ro.load(e.key).has_value());
    CHECK(fs::exists(file));
    CHECK(ro.quarantine_count() == 0);
    CHECK(logs.count("bad magic") == 1);
  }
  SUBCASE("rw records the use in the mtime") {
    REQUIRE(rw.load(e.key).has_value());
    CHECK(mtime_ns(file) > old_mtime);
    CHECK(rw.list()[0].last_used >= unix_now() - 5);
  }
  SUBCASE("off") {
    DiskCache off(dir, CacheMode::off, 0);
    CHECK_FALSE(off.writable());
    CHECK_FALSE(off.load(e.key).has_value());
    off.store(e2);
    CHECK_FALSE(fs::exists(entry_file(dir, e2.key.digest)));
    CHECK(mtime_ns(file) == old_mtime);
  }
}

TEST_CASE("disk cache: gc evicts least recently used first, broken entries before all, other files never") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  std::vector<Entry> entries;
  const std::int64_t base = unix_now() - 10000;
  const int use_order[] = {2, 0, 3, 1};  // entries[2] used longest ago
  for (int i = 0; i < 5; ++i) {
    entries.push_back(make_entry("__global__ void k" + std::to_string(i) + "() {}\n"));
    cache.store(entries.back());
  }
  for (int rank = 0; rank < 4; ++rank) {
    set_mtime(entry_file(cache.dir(), entries[use_order[rank]].key.digest), base + 100 * rank);
  }
  // entries[4] is kiln's (its magic is there) but truncated: newest of all, yet evicted first.
  const fs::path broken = entry_file(cache.dir(), entries[4].key.digest);
  write_bytes(broken, read_bytes(broken).substr(0, 100));
  const std::uint64_t broken_bytes = fs::file_size(broken);
  const fs::path junk = entry_file(cache.dir(), entries[0].key.digest).parent_path() / "notes.txt";
  write_bytes(junk, "someone else's file\n");
  const std::uint64_t entry_bytes = fs::file_size(entry_file(cache.dir(), entries[0].key.digest));
  std::uint64_t total = 4 * entry_bytes + broken_bytes;
  CHECK(cache.total_bytes() == total);  // entries only

  CHECK(cache.gc(total).bytes == 0);
  Removal r = cache.gc(total - 1);
  CHECK(r.bytes == broken_bytes);
  CHECK(r.entries == 1);
  CHECK(r.kept == std::vector<fs::path>{junk});
  CHECK(r.problems.empty());
  CHECK_FALSE(fs::exists(broken));
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    total = cache.total_bytes();
    r = cache.gc(total - 1);
    CHECK(r.bytes == entry_bytes);
    CHECK(r.left_bytes == total - entry_bytes);
    CHECK_FALSE(fs::exists(entry_file(cache.dir(), entries[use_order[rank]].key.digest)));
    for (int later = rank + 1; later < 4; ++later) {
      CHECK(fs::exists(entry_file(cache.dir(), entries[use_order[later]].key.digest)));
    }
  }
  CHECK(cache.total_bytes() == 0);
  CHECK(cache.gc(0).left_bytes == 0);
  CHECK(fs::exists(junk));  // not kiln's: gc never takes it, whatever the bound
}

TEST_CASE("disk cache: gc removes stale temp files but not fresh ones") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  Entry e = make_entry();
  cache.store(e);
  const fs::path shard = entry_file(cache.dir(), e.key.digest).parent_path();
  write_bytes(shard / (".tmp-" + e.key.digest + "-1-2-3"), "half-written");
  write_bytes(shard / (".tmp-" + e.key.digest + "-4-5-6"), "in progress");
  set_mtime(shard / (".tmp-" + e.key.digest + "-1-2-3"), unix_now() - 7200);
  CHECK(cache.list().size() == 1);  // temp files are not entries
  CHECK(cache.gc(UINT64_MAX).bytes == std::string("half-written").size());
  CHECK_FALSE(fs::exists(shard / (".tmp-" + e.key.digest + "-1-2-3")));
  CHECK(fs::exists(shard / (".tmp-" + e.key.digest + "-4-5-6")));
  CHECK(cache.load(e.key).has_value());
}

TEST_CASE("disk cache: the size bound is enforced on store, down to 80%") {
  TempDir tmp;
  const std::uint64_t entry_bytes = [&] {
    DiskCache probe(tmp.path() / "probe", CacheMode::read_write, 0);
    probe.store(make_entry("__global__ void k00() {}\n"));
    return probe.total_bytes();
  }();
  const std::uint64_t max = entry_bytes * 7 / 2;  // room for 3.5 entries; gc keeps 2
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, max);
  const std::int64_t base = unix_now() - 10000;
  std::vector<Entry> stored;
  for (int i = 0; i < 10; ++i) {
    CAPTURE(i);
    stored.push_back(make_entry("__global__ void k" + std::string(i < 10 ? "0" : "") + std::to_string(i) + "() {}\n"));
    cache.store(stored.back());
    const std::uint64_t total = cache.total_bytes();
    CHECK(total <= max);
    CHECK(total == cache.list().size() * entry_bytes);
    CHECK(cache.load(stored.back().key).has_value());  // the newest always survives
    set_mtime(entry_file(cache.dir(), stored.back().key.digest), base + i);
    if (i == 3) CHECK(total == 2 * entry_bytes);  // the 4th store went past 3.5 entries
  }
  CHECK(cache.load(stored[9].key).has_value());
  CHECK_FALSE(cache.load(stored[0].key).has_value());
}

TEST_CASE("disk cache: clear removes kiln's files only; total_bytes counts entries") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  for (int i = 0; i < 5; ++i) cache.store(make_entry("__global__ void k" + std::to_string(i) + "() {}\n"));
  Entry e = make_entry();
  cache.store(e);
  const fs::path file = entry_file(cache.dir(), e.key.digest);
  const fs::path stray = file.parent_path() / "stray.bin";
  write_bytes(stray, "stray");
  write_bytes(file.parent_path() / (".tmp-" + e.key.digest + "-1-2-3"), "partial");
  write_bytes(cache.dir() / "README", "kept: not the cache's file");
  std::vector<EntryInfo> infos = cache.list();
  REQUIRE(infos.size() == 7);
  std::uint64_t sum = 0;
  for (const EntryInfo& i : infos) sum += i.ours ? i.bytes : 0;
  CHECK(cache.total_bytes() == sum);
  CHECK(std::count_if(infos.begin(), infos.end(), [](const EntryInfo& i) { return i.ours; }) == 6);
  CHECK(std::count_if(infos.begin(), infos.end(),
                      [](const EntryInfo& i) { return !i.ok && i.problem == "not a kiln cache entry"; }) == 1);

  write_bytes(file, "garbage garbage garbage garbage\n");
  {
    LogCapture logs;
    CHECK_FALSE(cache.load(e.key).has_value());
    CHECK(logs.count("bad magic") == 1);
  }
  CHECK(cache.quarantine_count() == 1);

  const Removal r = cache.clear();
  CHECK(r.entries == 5);
  CHECK(r.problems.empty());
  CHECK(r.kept == std::vector<fs::path>{stray});
  CHECK(fs::is_directory(cache.dir()));
  CHECK(cache.total_bytes() == 0);
  CHECK(cache.quarantine_count() == 0);
  infos = cache.list();
  REQUIRE(infos.size() == 1);  // the stray file, still there
  CHECK(infos[0].path == stray);
  std::vector<fs::path> left;
  for (const auto& d : fs::directory_iterator(cache.dir())) left.push_back(d.path().filename());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<fs::path>{"CACHEDIR.TAG", "README", stray.parent_path().filename()});
  cache.store(e);
  CHECK(cache.load(e.key).has_value());
}

TEST_CASE("disk cache: a directory is recognised as a cache by kiln's marker or by its entries") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  CHECK(cache.foreign_reason().empty());  // missing: nothing to lose
  fs::create_directories(cache.dir());
  CHECK(cache.foreign_reason().empty());  // empty
  Entry e = make_entry();
  cache.store(e);
  CHECK(read_bytes(cache.dir() / "CACHEDIR.TAG").rfind("Signature: 8a477f597d28d172789f06886806bc55\n", 0) == 0);
  CHECK(cache.foreign_reason().empty());

  // A cache from before the marker: its entries vouch for it, temp files and quarantine too.
  fs::remove(cache.dir() / "CACHEDIR.TAG");
  CHECK(cache.foreign_reason().empty());
  const fs::path file = entry_file(cache.dir(), e.key.digest);
  write_bytes(file.parent_path() / (".tmp-" + e.key.digest + "-1-2-3"), "partial");
  fs::remove(file);
  CHECK(cache.foreign_reason().empty());

  // Files that are not kiln's do not make a cache, nor another tool's CACHEDIR.TAG.
  DiskCache other(tmp.path() / "other", CacheMode::read_write, 0);
  fs::create_directories(other.dir() / "ab");
  write_bytes(other.dir() / "ab" / "cdef0123", "x");
  write_bytes(other.dir() / "CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n# ccache\n");
  CHECK(other.foreign_reason().find("CACHEDIR.TAG") != std::string::npos);
  // A file named as an entry, without the entry magic, is not kiln's either.
  const std::string digest = e.key.digest;
  fs::create_directories(other.dir() / digest.substr(0, 2));
  write_bytes(other.dir() / digest.substr(0, 2) / (digest + ".kiln"), "not an entry");
  CHECK_FALSE(other.foreign_reason().empty());
  CHECK(other.clear().entries == 0);
  CHECK(fs::exists(other.dir() / digest.substr(0, 2) / (digest + ".kiln")));
  CHECK(other.gc(0).kept.size() == 2);
  CHECK(fs::exists(other.dir() / "ab" / "cdef0123"));
}

TEST_CASE("disk cache: a directory that cannot be read is a problem, not an empty cache") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  for (int i = 0; i < 3; ++i) cache.store(make_entry("__global__ void k" + std::to_string(i) + "() {}\n"));
  std::vector<std::string> problems;
  CHECK(cache.list({}, &problems).size() == 3);
  CHECK(problems.empty());

  // A shard replaced by a file: fails for root too.
  const fs::path shard = cache.list().front().path.parent_path();
  fs::remove_all(shard);
  write_bytes(shard, "not a directory");
  cache.list({}, &problems);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "cannot read directory " + shard.string() + ": Not a directory");
  CHECK(cache.gc(0).problems == problems);
  CHECK(cache.clear().problems == problems);
  CHECK(fs::exists(shard));

  if (::geteuid() == 0) return;  // root reads a mode-000 directory
  fs::remove(shard);
  fs::permissions(cache.dir(), fs::perms::none);
  problems.clear();
  CHECK(cache.list({}, &problems).empty());
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "cannot read directory " + cache.dir().string() + ": Permission denied");
  fs::permissions(cache.dir(), fs::perms::owner_all);
}

TEST_CASE("disk cache: sizes and directories from the environment") {
  CHECK(DiskCache::parse_size("0") == 0u);
  CHECK(DiskCache::parse_size("1048576") == 1048576u);
  CHECK(DiskCache::parse_size("512K") == 512u << 10);
  CHECK(DiskCache::parse_size("64m") == 64u << 20);
  CHECK(DiskCache::parse_size("2G") == std::uint64_t(2) << 30);
  for (const char* bad : {"", "K", "12X", "-1", "1.5G", " 12", "12 ", "99999999999999999999", "17179869184G"}) {
    CAPTURE(bad);
    CHECK_FALSE(DiskCache::parse_size(bad).has_value());
  }

  struct SavedEnv {
    std::string name;
    std::optional<std::string> value;
    explicit SavedEnv(std::string n) : name(std::move(n)) {
      if (const char* v = std::getenv(name.c_str())) value = v;
    }
    ~SavedEnv() { value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str()); }
  };
  SavedEnv a("KILN_CACHE_DIR"), b("XDG_CACHE_HOME"), c("HOME");
  ::setenv("KILN_CACHE_DIR", "/somewhere/kc", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  ::setenv("HOME", "/home/u", 1);
  CHECK(DiskCache::default_dir() == fs::path("/somewhere/kc"));
  ::setenv("KILN_CACHE_DIR", "relative/kc", 1);  // from the current directory, named in full
  CHECK(DiskCache::default_dir() == fs::current_path() / "relative/kc");
  ::unsetenv("KILN_CACHE_DIR");
  CHECK(DiskCache::default_dir() == fs::path("/xdg/kiln"));
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(DiskCache::default_dir() == fs::path("/home/u/.cache/kiln"));
  ::unsetenv("HOME");
  CHECK(DiskCache::default_dir() == fs::path("/tmp/kiln-cache-" + std::to_string(::getuid())));
}

TEST_CASE("disk cache: a generated kernel's label is recorded and read back; entries without one still read") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "cache", CacheMode::read_write, 0);
  Entry e = make_entry("extern \"C\" __global__ void kiln_fused() {}\n");
  e.key.op = "fused_0123456789abcdef";
  e.key.label = "fused(mul,add,relu) f32";
  // The label names the kernel for people; identity stays with the digest.
  CHECK(entry_digest(e.key, e.source) == e.key.digest);
  cache.store(e);
  const fs::path file = entry_file(cache.dir(), e.key.digest);

  std::optional<Entry> got = cache.load(e.key);
  REQUIRE(got.has_value());
  CHECK(got->key.label == "fused(mul,add,relu) f32");
  CHECK(got->key.op == e.key.op);
  std::optional<Entry> read = cache.read(file);
  REQUIRE(read.has_value());
  CHECK(read->key.label == e.key.label);
  std::vector<EntryInfo> infos = cache.list();
  REQUIRE(infos.size() == 1);
  CHECK(infos[0].ok);
  CHECK(infos[0].key.label == e.key.label);

  SUBCASE("an entry stored without a label (as older builds wrote it) is a hit for a labelled request") {
    Entry old = e;
    old.key.label.clear();
    cache.store(old);
    CHECK(read_bytes(file).find("label=") == std::string::npos);  // a built-in's header is unchanged
    std::optional<Entry> hit = cache.load(e.key);
    REQUIRE(hit.has_value());
    CHECK(hit->key.label.empty());
    CHECK(cache.quarantine_count() == 0);
  }
  SUBCASE("a label with a newline and backslashes round-trips") {
    Entry odd = e;
    odd.key.label = "fused(a\\b,\nc) f64";
    cache.store(odd);
    std::optional<Entry> hit = cache.load(odd.key);
    REQUIRE(hit.has_value());
    CHECK(hit->key.label == odd.key.label);
  }
}

TEST_CASE("module cache: a generated template's kernel is stored under its label; warm_source rebuilds it for another arch") {
  DiskCache& global = DiskCache::global();
  if (global.mode() != CacheMode::read_write) {
    MESSAGE("skipped: KILN_CACHE is not rw");
    return;
  }
  const std::string name = "test_generated_label_kernel";
  add_generated_template(name, "extern \"C\" __global__ void kiln_test_generated(float* p) { p[threadIdx.x] *= -2.f; }\n",
                         "fused(neg,mul) f32");
  CHECK(generated_template_label(name) == "fused(neg,mul) f32");
  CHECK_FALSE(generated_template_label("elementwise_unary").has_value());
  add_generated_template("test_generated_unlabelled", "// nothing\n");
  CHECK(generated_template_label("test_generated_unlabelled") == "test_generated_unlabelled");

  KernelSpec s;
  s.op = name;
  s.template_name = name;
  s.entry = "kiln_test_generated";
  s.dtypes = {kiln::DTypes{kiln::DType::u8}};
  s.bind = [](const kiln::DTypes&, std::uint32_t) { return Bindings{}; };
  const KernelSpec* spec = &register_kernel(std::move(s));
  std::string digest;
  warm_kernel(*spec, kiln::DTypes{kiln::DType::u8}, 0, 80, &digest);  // compiled, or cached by an earlier run
  std::optional<Entry> e = global.read(entry_file(global.dir(), digest));
  REQUIRE(e.has_value());
  CHECK(e->key.label == "fused(neg,mul) f32");
  CHECK(e->key.op == name);
  CHECK(e->key.arch == 80);

  std::string other;
  warm_source(e->key, e->source, 86, &other);
  CHECK(other != digest);
  std::optional<Entry> rebuilt = global.read(entry_file(global.dir(), other));
  REQUIRE(rebuilt.has_value());
  CHECK(rebuilt->key.arch == 86);
  CHECK(rebuilt->key.label == e->key.label);
  CHECK(rebuilt->key.op == e->key.op);
  CHECK(rebuilt->key.dtypes == e->key.dtypes);
  CHECK(rebuilt->source == e->source);
  CHECK(warm_source(e->key, e->source, 86) == WarmOutcome::cached);
}
