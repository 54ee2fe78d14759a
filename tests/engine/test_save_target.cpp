// Where save functions may write: a new name or a regular file in an existing writable
// directory. They write a temporary file beside the target and rename it, so a symlink,
// fifo or device node at the target would be replaced instead of written through: refused.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "error_message.h"
#include "kiln/kiln.h"
#include "temp_dir.h"

using namespace kiln;
namespace fs = std::filesystem;
using kiln_test::TempDir;

namespace {

nn::NamedTensors one_tensor() { return {{"w", from_vector<float>({1, 2, 3})}}; }

// The IoError `f` throws: it names `path`; returns its message.
template <class F>
std::string io_error(const std::string& path, F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    CHECK(e.file() == path);
    return e.what();
  }
  FAIL("no IoError for " << path);
  return {};
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Only `keep` in dir: no temporary file was left behind.
void check_only(const TempDir& dir, std::initializer_list<std::string> keep) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    CAPTURE(e.path().string());
    CHECK(std::find(keep.begin(), keep.end(), e.path().filename().string()) != keep.end());
    ++n;
  }
  CHECK(n == keep.size());
}

}  // namespace

TEST_CASE("save_safetensors writes through no symlink: the link and what it points to stay as they were") {
  TempDir dir;
  const std::string real = dir.file("real.txt"), link = dir.file("link.safetensors");
  std::ofstream(real) << "keep me";
  fs::create_symlink(real, link);
  const std::string msg = io_error(link, [&] { io::save_safetensors(link, one_tensor()); });
  CHECK(msg.find("symbolic link") != std::string::npos);
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(slurp(real) == "keep me");
  check_only(dir, {"real.txt", "link.safetensors"});

  // A dangling link too: saving would put a regular file where the link was.
  const std::string dangling = dir.file("dangling.safetensors");
  fs::create_symlink(dir.file("nowhere"), dangling);
  io_error(dangling, [&] { io::save_safetensors(dangling, one_tensor()); });
  CHECK(fs::is_symlink(fs::symlink_status(dangling)));
}

TEST_CASE("save_safetensors and save_checkpoint refuse a fifo and a directory, and leave no temporary file") {
  TempDir dir;
  const std::string fifo = dir.file("pipe.safetensors"), sub = dir.file("sub");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directory(sub);
  CHECK(io_error(fifo, [&] { io::save_safetensors(fifo, one_tensor()); }).find("fifo") != std::string::npos);
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  CHECK(io_error(sub, [&] { io::save_safetensors(sub, one_tensor()); }).find("directory") != std::string::npos);
  CHECK(fs::is_directory(sub));
  nn::Linear net(2, 2);
  io_error(fifo, [&] { io::save_checkpoint(fifo, net); });
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  check_only(dir, {"pipe.safetensors", "sub"});
}

TEST_CASE("save_safetensors names the missing directory and replaces an existing regular file") {
  TempDir dir;
  const std::string missing = dir.file("no/such/dir/x.safetensors");
  CHECK(io_error(missing, [&] { io::save_safetensors(missing, one_tensor()); }).find(dir.file("no/such/dir")) !=
        std::string::npos);

  const std::string path = dir.file("x.safetensors");
  std::ofstream(path) << "old";
  io::save_safetensors(path, one_tensor());
  CHECK(io::load_safetensors(path)[0].second.to_vector<float>() == std::vector<float>{1, 2, 3});
  check_only(dir, {"x.safetensors"});
}

TEST_CASE("check_output_path and check_replaceable_file: what each accepts") {
  TempDir dir;
  const std::string fifo = dir.file("pipe"), file = dir.file("f"), fresh = dir.file("new");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(file) << "x";
  for (const std::string& p : {file, fresh, std::string("relative-name-in-cwd")}) {
    CAPTURE(p);
    CHECK_NOTHROW(io::check_output_path(p));
    CHECK_NOTHROW(io::check_replaceable_file(p));
  }
  // A stream may write into a fifo or a device; a rename would replace them.
  CHECK_NOTHROW(io::check_output_path(fifo));
  CHECK_NOTHROW(io::check_output_path("/dev/null"));
  io_error(fifo, [&] { io::check_replaceable_file(fifo); });
  io_error("/dev/null", [&] { io::check_replaceable_file("/dev/null"); });
  for (const std::string& bad :
       {dir.path().string(), dir.file("f/under-a-file"), dir.file("missing/x"), std::string()}) {
    CAPTURE(bad);
    io_error(bad, [&] { io::check_output_path(bad); });
    io_error(bad, [&] { io::check_replaceable_file(bad); });
  }
  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(dir.path(), fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(io_error(fresh, [&] { io::check_output_path(fresh); }).find("writable") != std::string::npos);
    fs::permissions(dir.path(), fs::perms::owner_all);
  }
}

TEST_CASE("write_file_atomically writes or replaces a regular file, refuses what a rename would replace") {
  TempDir dir;
  const std::string path = dir.file("chart.svg");
  io::write_file_atomically(path, "first");
  CHECK(slurp(path) == "first");
  io::write_file_atomically(path, std::string("sec\0ond", 7));  // replaced whole, any bytes
  CHECK(slurp(path) == std::string("sec\0ond", 7));
  const std::string real = dir.file("real.txt"), link = dir.file("link.svg"), fifo = dir.file("pipe.svg");
  std::ofstream(real) << "keep me";
  fs::create_symlink(real, link);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(io_error(link, [&] { io::write_file_atomically(link, "x"); }).find("symbolic link") != std::string::npos);
  CHECK(io_error(fifo, [&] { io::write_file_atomically(fifo, "x"); }).find("fifo") != std::string::npos);
  CHECK(slurp(real) == "keep me");
  check_only(dir, {"chart.svg", "real.txt", "link.svg", "pipe.svg"});
  io_error("/dev/full", [&] { io::write_file_atomically("/dev/full", "x"); });  // a device node
}
