#pragma once
// The digest of every registered kernel's instantiated source, one line per (op, dtypes, variant):
// "op dtypes variant sha256", sorted. A refactor of the templates that should change nothing
// compares two such listings (kiln_kernel_sources; test_kernel_sources checks the walk).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/runtime/kernel_registry.h"
#include "sha256.h"

namespace kiln_test {

inline std::vector<std::string> kernel_source_lines() {
  std::vector<std::string> lines;
  for (const kiln::rt::KernelSpec* spec : kiln::rt::registered_kernels())
    for (const kiln::DTypes& d : spec->dtypes)
      for (std::uint32_t v : spec->variants)
        lines.push_back(spec->op + " " + d.str() + " " + std::to_string(v) + " " +
                        kiln::rt::sha256_hex(kiln::rt::instantiate_kernel(*spec, d, v)));
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace kiln_test
