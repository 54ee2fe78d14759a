#pragma once
// Loading an optional library at run time (NCCL, cuBLAS): the first of several places that works.
// Internal to runtime/src.
#include <dlfcn.h>

#include <string>
#include <vector>

namespace kiln::rt {

// dlopen's handle (RTLD_NOW | RTLD_LOCAL) of the first candidate that loads, with its name in
// *loaded; null when none does, each candidate's dlerror() then joined by "; " in *errors.
inline void* dlopen_first(const std::vector<std::string>& candidates, std::string* loaded, std::string* errors) {
  for (const std::string& c : candidates) {
    if (void* lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *loaded = c;
      return lib;
    }
    const char* e = ::dlerror();
    *errors += (errors->empty() ? "" : "; ") + std::string(e ? e : c + ": unknown error");
  }
  return nullptr;
}

}  // namespace kiln::rt
