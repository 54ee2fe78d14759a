#include "cublas_loader.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "dlopen_first.h"
#include "kiln/error.h"

namespace kiln::rt {

namespace {

#define KILN_STRINGIFY2(x) #x
#define KILN_STRINGIFY(x) KILN_STRINGIFY2(x)
#define KILN_CUBLAS_SONAME(stem) "lib" stem ".so." KILN_STRINGIFY(CUBLAS_VER_MAJOR)

std::atomic<bool> cublas_is_loaded{false};

// The build's toolkit first (the headers' version), then the loader's search path.
void* open_library(const char* soname, std::string* why) {
  std::string loaded, errors;
  if (void* lib = dlopen_first({std::string(KILN_CUBLAS_DIR) + "/" + soname, soname}, &loaded, &errors)) return lib;
  *why = std::string("[cublas] cannot load ") + soname + " (" + errors + ")";
  return nullptr;
}

CublasApi load(std::string* why) {
  CublasApi api;
  // cuBLASLt first: libcublas needs it, and finds the one already loaded.
  void* lt = open_library(KILN_CUBLAS_SONAME("cublasLt"), why);
  void* blas = lt ? open_library(KILN_CUBLAS_SONAME("cublas"), why) : nullptr;
  if (!blas) return api;
#define KILN_CUBLAS_LOAD(lib, name)                                          \
  api.name = reinterpret_cast<decltype(api.name)>(::dlsym(lib, KILN_STRINGIFY(name))); \
  if (!api.name && why->empty()) *why = "[cublas] " KILN_STRINGIFY(name) " is missing from the loaded library";
#define KILN_CUBLAS_LOAD_BLAS(name) KILN_CUBLAS_LOAD(blas, name)
#define KILN_CUBLAS_LOAD_LT(name) KILN_CUBLAS_LOAD(lt, name)
  KILN_CUBLAS_FUNCTIONS(KILN_CUBLAS_LOAD_BLAS)
  KILN_CUBLASLT_FUNCTIONS(KILN_CUBLAS_LOAD_LT)
#undef KILN_CUBLAS_LOAD_LT
#undef KILN_CUBLAS_LOAD_BLAS
#undef KILN_CUBLAS_LOAD
  return api;
}

}  // namespace

const CublasApi& cublas() {
  static std::string why;
  static const CublasApi api = [] {
    CublasApi a = load(&why);
    cublas_is_loaded = why.empty();
    return a;
  }();
  if (!why.empty()) throw DeviceError(why);
  return api;
}

bool cublas_loaded() { return cublas_is_loaded; }

}  // namespace kiln::rt
