#include "kiln/runtime/compiler.h"

#include <fcntl.h>
#include <nvrtc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>

#include "check.h"
#include "kiln/error.h"
#include "kiln/runtime/log.h"
#include "nvrtc_run.h"

namespace kiln::rt {

namespace {

// The compile paths' statics are leaked: prefetch threads still compile while static
// destructors run at exit (their pool, built before these, joins them then).
const std::vector<int>& supported_archs() {
  static const auto* archs = new std::vector<int>([] {
    int n = 0;
    KILN_NVRTC(nvrtcGetNumSupportedArchs(&n));
    std::vector<int> a(static_cast<std::size_t>(n));
    KILN_NVRTC(nvrtcGetSupportedArchs(a.data()));
    return a;
  }());
  return *archs;
}

std::string numbered(const std::string& source) {
  std::ostringstream out;
  std::istringstream in(source);
  std::string line;
  for (int i = 1; std::getline(in, line); ++i)
    out << (i < 10 ? "   " : i < 100 ? "  " : i < 1000 ? " " : "") << i << "  " << line << '\n';
  return out.str();
}

// Failed sources go to a folder of this user's ($TMPDIR or /tmp, kiln-compile-errors-<uid>,
// mode 0700), so the error names a file this user can open: a shared folder belongs to whoever
// made it first. Returns the file, or "" and *why.
std::string write_failed_source(const CompileRequest& req, std::string* why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  const fs::path dir = tmp / ("kiln-compile-errors-" + std::to_string(::geteuid()));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create " + dir.string() + ": " + std::strerror(errno);
    return "";
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    *why = dir.string() + " is not a directory of this user's";
    return "";
  }
  if ((st.st_mode & 077) != 0) ::chmod(dir.c_str(), 0700);
  std::string name = req.op + (req.dtypes.empty() ? "" : "_" + req.dtypes) + "_sm" + std::to_string(req.arch) + "_" +
                     std::to_string(std::hash<std::string>{}(req.source) & 0xffffffffu) + ".cu";
  std::replace(name.begin(), name.end(), ',', '-');
  std::replace(name.begin(), name.end(), '/', '_');
  const fs::path path = dir / name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  for (std::size_t done = 0; ok && done < req.source.size();) {
    const ssize_t n = ::write(fd, req.source.data() + done, req.source.size() - done);
    ok = n > 0 || (n < 0 && errno == EINTR);
    done += n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  const int err = errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) ok = false;
  if (!ok) {
    *why = "cannot write " + path.string() + ": " + std::strerror(err);
    return "";
  }
  return path.string();
}

}  // namespace

int parse_arch(const std::string& text) {
  std::string digits = text;
  for (const char* prefix : {"sm_", "compute_"})
    if (digits.rfind(prefix, 0) == 0) digits = digits.substr(std::string(prefix).size());
  bool ok = !digits.empty() && digits.size() <= 3 && std::all_of(digits.begin(), digits.end(), ::isdigit);
  int arch = ok ? std::stoi(digits) : 0;
  if (!ok || arch < 50) throw ValueError("[arch] '" + text + "' is not a GPU architecture like sm_90");
  return arch;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  KILN_NVRTC(nvrtcVersion(&major, &minor));
  return std::to_string(major) + "." + std::to_string(minor);
}

bool nvrtc_can_emit_cubin(int arch) {
  const auto& a = supported_archs();
  return std::find(a.begin(), a.end(), arch) != a.end();
}

std::vector<std::string> cuda_include_dirs() {
  const char* env = std::getenv("KILN_CUDA_INCLUDE");
  std::string joined = env && *env ? env : KILN_CUDA_INCLUDE_DEFAULT;
  std::vector<std::string> dirs;
  std::istringstream in(joined);
  for (std::string d; std::getline(in, d, ':');)
    if (!d.empty()) dirs.push_back(d);
  return dirs;
}

namespace {

bool has_line(std::string_view source, std::string_view line) {
  return source.starts_with(line) || source.find("\n" + std::string(line)) != std::string_view::npos;
}

bool fast_compile_allowed() {
  const char* v = std::getenv("KILN_FAST_COMPILE");
  if (!v || !*v || std::string_view(v) == "on") return true;
  if (std::string_view(v) == "off") return false;
  throw ValueError(std::string("[nvrtc] KILN_FAST_COMPILE='") + v + "' must be on or off");
}

}  // namespace

bool wants_arch_specific(std::string_view source) { return has_line(source, "#define KILN_ARCH_SPECIFIC 1\n"); }

bool wants_fast_compile(std::string_view source) {
  return has_line(source, "#define KILN_FAST_COMPILE 1\n") && fast_compile_allowed();
}

// NVRTC 12.4+ leaves out what kiln's kernels never use (texture and surface functions, the device
// runtime API, device-side launch, the runtime's and driver's types): the same CUBIN, 2-13% less
// compile time on the 2-core box.
bool nvrtc_has_minimal() {
  int major = 0, minor = 0;
  KILN_NVRTC(nvrtcVersion(&major, &minor));
  return major > 12 || (major == 12 && minor >= 4);
}

std::vector<std::string> quick_tier_options() {
  static const auto* options = new std::vector<std::string>([] {
    int major = 0, minor = 0;
    KILN_NVRTC(nvrtcVersion(&major, &minor));
    return major > 12 || (major == 12 && minor >= 8) ? std::vector<std::string>{"-Ofc=mid"}
                                                     : std::vector<std::string>{};
  }());
  return *options;
}

std::vector<std::string> nvrtc_options(int arch, bool arch_specific, bool fast_compile) {
  std::vector<std::string> opts{"-std=c++17", "-default-device", "-DKILN_NVRTC=1"};
  static const bool minimal = nvrtc_has_minimal();
  if (minimal) opts.push_back("-minimal");
  if (arch_specific) {
    if (!nvrtc_can_emit_cubin(arch))
      throw ValueError("[nvrtc] NVRTC " + nvrtc_version() + " cannot target sm_" + std::to_string(arch) + "a");
    opts.push_back("-arch=sm_" + std::to_string(arch) + "a");
  } else if (nvrtc_can_emit_cubin(arch)) {
    opts.push_back("-arch=sm_" + std::to_string(arch));
  } else {
    // Newer GPU than this NVRTC knows: emit PTX for the newest arch it has; the driver JITs it.
    int best = 0;
    for (int a : supported_archs())
      if (a <= arch) best = std::max(best, a);
    if (best == 0) throw ValueError("[nvrtc] NVRTC " + nvrtc_version() + " cannot target sm_" + std::to_string(arch));
    opts.push_back("-arch=compute_" + std::to_string(best));
  }
  for (const auto& d : cuda_include_dirs()) opts.push_back("-I" + d);
  static const bool has_fast_compile = !quick_tier_options().empty();
  if (fast_compile && has_fast_compile) opts.push_back("-Ofc=min");
  return opts;
}

CompiledModule compile(const CompileRequest& req) {
  auto start = std::chrono::steady_clock::now();
  std::vector<std::string> options =
      nvrtc_options(req.arch, wants_arch_specific(req.source), wants_fast_compile(req.source) && !req.quick);
  if (req.quick) {
    const std::vector<std::string> quick = quick_tier_options();
    if (quick.empty()) throw ValueError("[nvrtc] NVRTC " + nvrtc_version() + " has no fast-compile mode (12.8+)");
    options.insert(options.end(), quick.begin(), quick.end());
  }
  const NvrtcRequest nvrtc{req.source, req.op + ".cu", std::move(options), nvrtc_can_emit_cubin(req.arch)};
  NvrtcOutput out = run_nvrtc(nvrtc);
  if (!out.ok) {
    std::string why, log = out.log.empty() ? nvrtcGetErrorString(static_cast<nvrtcResult>(out.result)) : out.log;
    const std::string path = write_failed_source(req, &why);
    if (path.empty()) log += "\nkiln could not write the source to a file: " + why;
    throw CompileError(req.op, req.dtypes, log, numbered(req.source), path);
  }
  CompiledModule m;
  m.ptx = std::move(out.ptx);
  m.cubin = std::move(out.cubin);
  m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  log().debug("compiled {}{} for sm_{}{} in {:.1f} ms", req.op, req.dtypes.empty() ? "" : " (" + req.dtypes + ")",
              req.arch, req.quick ? " (quick tier)" : "", m.ms);
  return m;
}

}  // namespace kiln::rt
