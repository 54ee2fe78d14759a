#include "dataset_files.h"

#include <spawn.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "md5.h"

extern char** environ;

namespace mnist {

namespace {

namespace fs = std::filesystem;

struct Download {
  const char* name;
  const char* md5;
};
constexpr std::array<Download, 4> kFiles = {{
    {"train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"},
    {"train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"},
    {"t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"},
    {"t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"},
}};
constexpr std::array<const char*, 2> kMirrors = {"https://ossci-datasets.s3.amazonaws.com/mnist/",
                                                 "https://storage.googleapis.com/cvdf-datasets/mnist/"};

// Runs argv without a shell; true when it exits 0.
bool run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return false;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool fetch(const std::string& url, const std::string& to) {
  return run({"curl", "-fsSL", "--retry", "2", "--max-time", "120", "-o", to, url}) ||
         run({"wget", "-q", "--tries=2", "--timeout=60", "-O", to, url});
}

// Downloads the missing files into dir; the first problem, or empty on success.
std::string download(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return "cannot create " + dir.string() + ": " + ec.message();
  for (const Download& f : kFiles) {
    const fs::path target = dir / f.name;
    if (fs::exists(target) && md5_file(target.string()) == f.md5) continue;
    const fs::path part = target.string() + ".part";
    bool ok = false;
    for (const char* mirror : kMirrors) {
      std::printf("downloading %s%s\n", mirror, f.name);
      if (!fetch(std::string(mirror) + f.name, part.string())) continue;
      if (md5_file(part.string()) != f.md5) {
        std::printf("  MD5 mismatch, trying the next mirror\n");
        continue;
      }
      fs::rename(part, target, ec);
      ok = !ec;
      break;
    }
    fs::remove(part, ec);
    if (!ok) return "could not download " + std::string(f.name) + " with a matching MD5 sum (" + f.md5 + ")";
  }
  return "";
}

// The MNIST names in dir that exist but are not files (a directory, a fifo, ...): a download
// cannot replace them and the loader skips them, so they are named instead.
std::string unusable_entries(const fs::path& dir) {
  std::string found;
  for (const std::string& name : kiln::data::mnist_file_names()) {
    std::error_code ec;
    const fs::file_status st = fs::status(dir / name, ec);
    if (ec || !fs::exists(st) || fs::is_regular_file(st)) continue;
    const char* what = fs::is_directory(st) ? "a directory" : "not a regular file";
    found += "  " + (dir / name).string() + " is " + what + "\n";
  }
  return found;
}

}  // namespace

std::string locate_dataset(const std::string& data_flag) {
  std::string target = "data/mnist";
  if (!data_flag.empty())
    target = data_flag;
  else if (const char* env = std::getenv("KILN_MNIST_DIR"); env && *env)
    target = env;
  if (kiln::data::has_mnist(target)) return target;
  std::error_code ec;
  const fs::path absolute = fs::absolute(target, ec);
  if (!ec) target = absolute.lexically_normal().string();

  if (const std::string bad = unusable_entries(target); !bad.empty())
    throw MissingDataset("MNIST in " + target + " cannot be read, and nothing was downloaded over it:\n" + bad +
                         "Remove or replace these with the MNIST files (or point --data or KILN_MNIST_DIR at a "
                         "directory that holds them).\n");
  std::string problem = "downloads are off: KILN_MNIST_NO_DOWNLOAD is set";
  if (const char* off = std::getenv("KILN_MNIST_NO_DOWNLOAD"); !off || !*off) {
    std::printf("MNIST not found in %s; fetching it\n", target.c_str());
    problem = download(target);
  }
  if (problem.empty() && kiln::data::has_mnist(target)) return target;
  std::string names;
  for (const Download& f : kFiles) names += std::string("  ") + f.name + " (md5 " + f.md5 + ")\n";
  throw MissingDataset("MNIST is not in " + target + " and fetching it failed (" + problem +
                       ").\nPut these four files, from any MNIST mirror, into " + target +
                       " (or point --data or KILN_MNIST_DIR at a directory that holds them):\n" + names);
}

}  // namespace mnist
