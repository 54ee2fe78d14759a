#include "driver.h"

#include <dlfcn.h>

#include <mutex>

#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/log.h"

namespace kiln::rt {

namespace {

struct Loaded {
  Driver d;
  std::string why;  // empty when usable
};

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

Loaded load() {
  Loaded out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    out.why = std::string("no CUDA driver: cannot load libcuda.so.1 (") + (err ? err : "unknown") + ")";
    return out;
  }
  auto get = reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!get) {
    out.why = "the CUDA driver is too old: libcuda.so.1 has no cuGetProcAddress_v2 (need driver >= 12.0)";
    return out;
  }
  // cuGetProcAddress resolves the base name to the version matching the headers we built with.
#define KILN_RESOLVE(name)                                                                           \
  {                                                                                                  \
    void* fn = nullptr;                                                                              \
    CUdriverProcAddressQueryResult status{};                                                         \
    if (get(#name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !fn) { \
      out.why = "the CUDA driver lacks " #name " (driver older than CUDA " + std::to_string(CUDA_VERSION / 1000) + ")"; \
      return out;                                                                                    \
    }                                                                                                \
    out.d.name = reinterpret_cast<decltype(out.d.name)>(fn);                                         \
  }
  KILN_DRIVER_FUNCTIONS(KILN_RESOLVE)
#undef KILN_RESOLVE

  CUresult r = out.d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    const char* msg = nullptr;
    out.d.cuGetErrorName(r, &name);
    out.d.cuGetErrorString(r, &msg);
    out.why = std::string("cuInit failed: ") + (name ? name : "?") + " (" + (msg ? msg : "?") + ")";
    return out;
  }
  int count = 0;
  if (out.d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    out.why = "the CUDA driver found no GPU";
    return out;
  }
  return out;
}

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded x = load();
    if (!x.why.empty()) log().debug("GPU unavailable: {}", x.why);
    return x;
  }();
  return l;
}

}  // namespace

const Driver* try_driver(std::string* why) {
  const Loaded& l = loaded();
  if (!l.why.empty()) {
    if (why) *why = l.why;
    return nullptr;
  }
  return &l.d;
}

std::string driver_version() {
  // Resolved before cuInit, so a driver without a usable GPU still answers.
  const Driver& d = loaded().d;
  int v = 0;
  if (!d.cuDriverGetVersion || d.cuDriverGetVersion(&v) != CUDA_SUCCESS || v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

const Driver& driver() {
  std::string why;
  const Driver* d = try_driver(&why);
  if (!d) throw DeviceError("[device] CUDA is not usable: " + why);
  return *d;
}

}  // namespace kiln::rt
