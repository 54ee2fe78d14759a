// kiln_kernel_sources: the SHA-256 of every registered kernel's instantiated source, one line per
// (op, dtypes, variant), sorted; or one instantiated source. Needs no GPU. Two listings diffed show
// which kernels a change to kernel_templates/ or the bindings touched.
//   kiln_kernel_sources                              op dtypes variant sha256, one line each
//   kiln_kernel_sources --source OP [DTYPES [VARIANT]]  the source (default: OP's first tuple, variant)
#include <cstdio>
#include <exception>
#include <string>

#include "kernel_sources.h"
#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/version.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kiln_kernel_sources                               (op dtypes variant sha256 per line)\n"
               "       kiln_kernel_sources --source OP [DTYPES [VARIANT]]  (one instantiated source)\n");
  return 2;
}

int print_source(const std::string& op, const char* dtypes, const char* variant) {
  const kiln::rt::KernelSpec* spec = kiln::rt::find_kernel(op);
  if (!spec) {
    std::fprintf(stderr, "kiln_kernel_sources: no registered kernel '%s'\n", op.c_str());
    return 1;
  }
  const kiln::DTypes d = dtypes ? kiln::DTypes::parse(dtypes) : spec->dtypes.front();
  const std::uint32_t v = variant ? static_cast<std::uint32_t>(std::stoul(variant)) : spec->variants.front();
  const std::string src = kiln::rt::instantiate_kernel(*spec, d, v);
  std::fwrite(src.data(), 1, src.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Referencing libkiln keeps it linked, so its static initialisers register the specs.
  if (!kiln::version()) return 1;
  try {
    if (argc == 1) {
      for (const std::string& line : kiln_test::kernel_source_lines()) std::printf("%s\n", line.c_str());
      return 0;
    }
    if (std::string(argv[1]) == "--source" && argc >= 3 && argc <= 5)
      return print_source(argv[2], argc >= 4 ? argv[3] : nullptr, argc >= 5 ? argv[4] : nullptr);
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_kernel_sources: %s\n", e.what());
    return 1;
  }
}
