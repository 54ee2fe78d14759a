#include "nccl_loader.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>

#include "dlopen_first.h"
#include "kiln/error.h"
#include "kiln/runtime/log.h"

namespace kiln::rt::nccl {

namespace {

constexpr const char* kName = "libnccl.so.2";
constexpr const char* kHint = "install the nvidia-nccl-cu13 wheel or set KILN_NCCL_LIBRARY";

// The wheels PyTorch installs put NCCL under site-packages; no Python is needed to find it.
void add_wheel_paths(const std::string& prefix, std::vector<std::string>& out) {
  for (const char* dir : {"dist-packages", "site-packages"}) {
    const std::string pattern = prefix + "/lib/python3.*/" + dir + "/nvidia/nccl/lib/" + kName;
    glob_t g{};
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
      for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    globfree(&g);
  }
}

const Library& loaded() {
  static const Library l = [] {
    Library x = load(library_candidates());
    if (!x.why.empty()) log().debug("NCCL unavailable: {}", x.why);
    return x;
  }();
  return l;
}

}  // namespace

std::vector<std::string> library_candidates() {
  const char* explicit_path = std::getenv("KILN_NCCL_LIBRARY");
  if (explicit_path && *explicit_path) return {explicit_path};
  std::vector<std::string> out{kName};
  add_wheel_paths("/usr/local", out);
  add_wheel_paths("/usr", out);
  const char* venv = std::getenv("VIRTUAL_ENV");
  if (venv && *venv) add_wheel_paths(venv, out);
  return out;
}

Library load(const std::vector<std::string>& candidates) {
  Library out;
  std::string errors;
  void* lib = dlopen_first(candidates, &out.path, &errors);
  if (!lib) {
    if (candidates.empty()) errors = "no candidate paths";
    out.why = std::string("[nccl] cannot load ") + kName + " (" + errors + "); " + kHint;
    return out;
  }
#define KILN_NCCL_RESOLVE(name, ret, params)                                               \
  out.api.name = reinterpret_cast<decltype(out.api.name)>(dlsym(lib, #name));              \
  if (!out.api.name) {                                                                     \
    out.why = "[nccl] " + out.path + " lacks " #name " (NCCL older than 2.18?); " + kHint; \
    out.api = Api{};                                                                       \
    dlclose(lib);                                                                          \
    return out;                                                                            \
  }
  KILN_NCCL_FUNCTIONS(KILN_NCCL_RESOLVE)
#undef KILN_NCCL_RESOLVE
  return out;
}

const Api* try_api(std::string* why) {
  const Library& l = loaded();
  if (!l.why.empty()) {
    if (why) *why = l.why;
    return nullptr;
  }
  return &l.api;
}

const Api& api() {
  std::string why;
  const Api* a = try_api(&why);
  if (!a) throw DeviceError(why);
  return *a;
}

std::string version() {
  const Api* a = try_api();
  int v = 0;
  if (!a || a->ncclGetVersion(&v) != kSuccess || v <= 0) return "";
  // NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9 (major*1000 before).
  if (v < 10000) return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 100) + "." + std::to_string(v % 100);
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

void check(Result r, const char* call) {
  if (r == kSuccess) return;
  const Api* a = try_api();
  const char* text = a ? a->ncclGetErrorString(r) : nullptr;
  throw DeviceError(std::string("[nccl] ") + call + " failed: " + (text ? text : "unknown error") + " (ncclResult_t " +
                    std::to_string(r) + ")");
}

}  // namespace kiln::rt::nccl
