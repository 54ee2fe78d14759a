// jitcc verify, gc, clear and stats, and clean failures on bad arguments.
#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>

#include "jitcc_test_util.h"
#include "kiln/runtime/device.h"

using namespace jitcc_test;

namespace {

// Flips one byte near the end of the file, i.e. inside the payload.
void flip_last_byte(const fs::path& p) {
  std::string bytes = read_text(p);
  REQUIRE(bytes.size() > 16);
  bytes[bytes.size() - 2] = static_cast<char>(bytes[bytes.size() - 2] ^ 0x5a);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// The cache records an entry's last use as its mtime.
void set_last_used(const fs::path& p, std::int64_t unix_seconds) {
  const struct timespec times[2] = {{unix_seconds, 0}, {unix_seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

std::int64_t now_s() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("jitcc verify reports a corrupted entry, exits 1, and --fix removes it") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const std::string cache = dir.path().string();
  const auto n = static_cast<std::int64_t>(selection().instances.size());

  nlohmann::json clean = jitcc_json({"verify", "--cache-dir", cache});
  CHECK(clean.at("entries") == n);
  CHECK(clean.at("bad").size() == 0);

  const fs::path victim = entry_files(dir.path()).front();
  flip_last_byte(victim);
  nlohmann::json bad = jitcc_json({"verify", "--cache-dir", cache}, 1);
  REQUIRE(bad.at("bad").size() == 1);
  CHECK(bad.at("bad").at(0).at("path") == victim.string());
  CHECK(!bad.at("bad").at(0).at("problem").get<std::string>().empty());
  CHECK(fs::exists(victim));  // without --fix nothing is removed

  nlohmann::json fixed = jitcc_json({"verify", "--fix", "--cache-dir", cache});
  CHECK(fixed.at("removed") == 1);
  CHECK(!fs::exists(victim));

  nlohmann::json after = jitcc_json({"verify", "--cache-dir", cache});
  CHECK(after.at("entries") == n - 1);
  CHECK(after.at("bad").size() == 0);
}

TEST_CASE("jitcc gc keeps the most recently used entries within the bound; 0 empties the cache") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const std::string cache = dir.path().string();
  std::vector<fs::path> files = entry_files(dir.path());
  REQUIRE(files.size() >= 2);

  // The last file is the most recently used; the bound fits it alone.
  for (std::size_t i = 0; i < files.size(); ++i)
    set_last_used(files[i], now_s() - 1000 + static_cast<std::int64_t>(i) * 10);
  const auto keep_bytes = fs::file_size(files.back());
  nlohmann::json gc = jitcc_json({"gc", "--max-size", std::to_string(keep_bytes), "--cache-dir", cache});
  CHECK(gc.at("entries") == 1);
  CHECK(gc.at("removed_entries") == static_cast<std::int64_t>(files.size() - 1));
  CHECK(gc.at("total_bytes").get<std::int64_t>() <= static_cast<std::int64_t>(keep_bytes));
  CHECK(entry_files(dir.path()) == std::vector<fs::path>{files.back()});

  nlohmann::json empty = jitcc_json({"gc", "--max-size", "0", "--cache-dir", cache});
  CHECK(empty.at("entries") == 0);
  CHECK(entry_files(dir.path()).empty());

  // Suffixed sizes are accepted.
  CHECK(jitcc_json({"gc", "--max-size", "64M", "--cache-dir", cache}).at("max_bytes") == 64 << 20);
}

TEST_CASE("jitcc clear removes every entry") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  nlohmann::json j = jitcc_json({"clear", "--cache-dir", dir.path().string()});
  CHECK(j.at("removed_entries") == static_cast<std::int64_t>(selection().instances.size()));
  CHECK(entry_files(dir.path()).empty());
  CHECK(jitcc_json({"list", "--cache-dir", dir.path().string()}).at("entries").size() == 0);
}

TEST_CASE("jitcc clear, gc and verify --fix leave a git repository's objects alone, even with --force") {
  ScratchDir dir;
  const fs::path repo = dir.path() / "r", objects = repo / ".git" / "objects";
  const std::string git = "git -C '" + repo.string() + "' -c user.name=t -c user.email=t@example.com ";
  REQUIRE(std::system(("git init -q '" + repo.string() + "' && " + git + "commit -q --allow-empty -m x").c_str()) == 0);
  auto snapshot = [&] {
    std::vector<std::pair<fs::path, std::string>> files;
    for (const auto& f : fs::recursive_directory_iterator(objects))
      if (f.is_regular_file()) files.emplace_back(f.path(), read_text(f.path()));
    std::sort(files.begin(), files.end());
    return files;
  };
  const auto before = snapshot();
  std::size_t in_shards = 0;  // git's loose objects sit in two-hex-character folders, as kiln's entries do
  for (const auto& [p, bytes] : before) in_shards += p.parent_path().filename().string().size() == 2;
  REQUIRE(in_shards >= 2);

  const std::vector<std::vector<std::string>> commands{{"clear"}, {"gc", "--max-size", "0"}, {"verify", "--fix"}};
  for (std::vector<std::string> args : commands) {
    args.insert(args.end(), {"--cache-dir", objects.string()});
    ProcessResult r = jitcc(args);
    INFO("jitcc " << args.front() << ": " << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find(objects.string() + " does not look like a kiln cache") != std::string::npos);
    CHECK(r.err.find("--force") != std::string::npos);
  }
  CHECK(snapshot() == before);
  CHECK(!fs::exists(objects / "CACHEDIR.TAG"));  // refused directories are not marked

  // --force passes the folder check, but git's files are still not kiln's.
  nlohmann::json cleared = jitcc_json({"clear", "--force", "--cache-dir", objects.string()});
  CHECK(cleared.at("removed_entries") == 0);
  CHECK(cleared.at("kept").size() == in_shards);
  CHECK(jitcc_json({"gc", "--force", "--max-size", "0", "--cache-dir", objects.string()}).at("removed_entries") == 0);
  nlohmann::json verified = jitcc_json({"verify", "--fix", "--force", "--cache-dir", objects.string()}, 1);
  CHECK(verified.at("removed") == 0);
  CHECK(snapshot() == before);
  CHECK(std::system((git + "log >/dev/null && " + git + "fsck --no-progress 2>/dev/null").c_str()) == 0);
}

TEST_CASE("jitcc clear and gc empty a real cache and leave stray files in it; old caches without a marker too") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const auto n = static_cast<std::int64_t>(selection().instances.size());
  const std::string cache = dir.path().string();
  CHECK(fs::exists(dir.path() / "CACHEDIR.TAG"));  // written with the first entry
  const fs::path stray = entry_files(dir.path()).front().parent_path() / "notes.txt";
  std::ofstream(stray) << "mine, not the cache's";
  std::ofstream(dir.path() / "README") << "mine too";

  SUBCASE("clear") {
    nlohmann::json j = jitcc_json({"clear", "--cache-dir", cache});
    CHECK(j.at("removed_entries") == n);
    CHECK(j.at("entries") == 0);
    CHECK(j.at("kept") == nlohmann::json::array({stray.string()}));
    ProcessResult text = jitcc({"clear", "--cache-dir", cache});
    CHECK(text.exit_code == 0);  // again: the marker still says it is a cache
    CHECK(text.out.find(stray.string()) != std::string::npos);
  }
  SUBCASE("gc") {
    nlohmann::json j = jitcc_json({"gc", "--max-size", "0", "--cache-dir", cache});
    CHECK(j.at("removed_entries") == n);
    CHECK(j.at("total_bytes") == 0);
  }
  SUBCASE("a cache made before the marker") {
    fs::remove(dir.path() / "CACHEDIR.TAG");
    CHECK(jitcc_json({"clear", "--cache-dir", cache}).at("removed_entries") == n);
    CHECK(fs::exists(dir.path() / "CACHEDIR.TAG"));  // recognised by its entries, then marked
  }
  CHECK(entry_files(dir.path()).empty());
  CHECK(read_text(stray) == "mine, not the cache's");
  CHECK(read_text(dir.path() / "README") == "mine too");
}

TEST_CASE("jitcc stats describes the directory, its entries and the build") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());
  const auto n = static_cast<std::int64_t>(selection().instances.size());
  nlohmann::json j = jitcc_json({"stats", "--cache-dir", dir.path().string()});
  CHECK(j.at("cache_dir") == dir.path().string());
  CHECK(j.at("mode") == "rw");
  CHECK(j.at("entries") == n);
  CHECK(j.at("bad") == 0);
  CHECK(j.at("total_bytes").get<std::int64_t>() > 0);
  CHECK(j.at("per_arch").at("sm_90") == n);
  CHECK(!j.at("nvrtc_version").get<std::string>().empty());
  CHECK(j.at("registered_kernels").get<std::int64_t>() >= 1);
  CHECK(j.at("registered_instantiations").get<std::int64_t>() >= j.at("registered_kernels").get<std::int64_t>());

  ProcessResult text = jitcc({"stats", "--cache-dir", dir.path().string()});
  CHECK(text.exit_code == 0);
  CHECK(text.out.find(dir.path().string()) != std::string::npos);
}

TEST_CASE("jitcc rejects bad arguments with a message naming the problem") {
  ScratchDir dir;
  const std::string cache = dir.path().string();
  const Instance& i = selection().instances.front();
  struct Case {
    std::vector<std::string> args;
    std::string named;  // what the message must mention
  };
  const std::vector<Case> cases{
      {{"warm", "--ops", "no_such_op", "--arch", "sm_90"}, "no_such_op"},
      {{"warm", "--ops", i.op, "--dtypes", "f33", "--arch", "sm_90"}, "f33"},
      {{"warm", "--ops", i.op, "--arch", "sm_1"}, "sm_1"},
      {{"warm", "--ops", i.op, "--arch", "banana"}, "banana"},
      {{"gc", "--max-size", "garbage"}, "garbage"},
      {{"gc", "--max-size", "12Q"}, "12Q"},
      {{"show", "no_such_op", "--dtypes", "f32"}, "no_such_op"},
      {{"show", i.op, "--dtypes", "f32,f32,f32,f32"}, i.op},
      {{"frobnicate"}, "frobnicate"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--cache-dir", cache});
    ProcessResult r = jitcc(args);
    INFO("jitcc " << args.front() << " ... " << c.named << ": " << r.err);
    CHECK(r.exit_code != 0);
    CHECK(r.err.find(c.named) != std::string::npos);
    CHECK(r.out.empty());

    // With --json the failure is still one object on stdout.
    args.push_back("--json");
    ProcessResult j = jitcc(args);
    CHECK(j.exit_code == r.exit_code);
    CHECK(nlohmann::json::parse(j.out).at("error").get<std::string>().find(c.named) != std::string::npos);
  }
  CHECK(!fs::exists(dir.path() / "quarantine"));
  CHECK(entry_files(dir.path()).empty());
}

TEST_CASE("jitcc warm --arch auto fails clearly without a GPU") {
  std::string why;
  if (kiln::rt::gpu_available(&why)) return;  // with a GPU, auto is valid
  ScratchDir dir;
  ProcessResult r =
      jitcc({"warm", "--ops", selection().instances.front().op, "--arch", "auto", "--cache-dir", dir.path().string()});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("GPU") != std::string::npos);
  CHECK(r.err.find("--arch sm_") != std::string::npos);
}
