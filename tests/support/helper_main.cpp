// kiln_test_helper: a second process for cache tests. Each command prints the module
// cache counters as one JSON line, so a test can show what this process compiled.
//   kiln_test_helper warm OP DTYPES ARCH [VARIANT]  fill the disk cache for ARCH (no GPU needed)
//   kiln_test_helper load OP DTYPES [VARIANT]       load the function on GPU 0
// The cache directory comes from the environment (KILN_CACHE_DIR).
#include <cstdio>
#include <exception>
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/version.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kiln_test_helper warm OP DTYPES ARCH [VARIANT]\n"
               "       kiln_test_helper load OP DTYPES [VARIANT]\n");
  return 2;
}

void print_counters(const char* outcome) {
  const kiln::rt::CacheCounters c = kiln::rt::cache_counters();
  std::printf(
      "{\"outcome\":\"%s\",\"compiles\":%llu,\"memory_hits\":%llu,\"disk_hits\":%llu,"
      "\"compile_ms\":%.3f,\"load_ms\":%.3f}\n",
      outcome, static_cast<unsigned long long>(c.compiles), static_cast<unsigned long long>(c.memory_hits),
      static_cast<unsigned long long>(c.disk_hits), c.compile_ms, c.load_ms);
}

}  // namespace

int main(int argc, char** argv) {
  // Referencing libkiln loads it, and with it the kernels it registers.
  if (!kiln::version()) return 1;
  if (argc < 4) return usage();
  const std::string cmd = argv[1];
  try {
    const kiln::rt::KernelSpec* spec = kiln::rt::find_kernel(argv[2]);
    if (!spec) {
      std::fprintf(stderr, "kiln_test_helper: unknown op '%s'\n", argv[2]);
      return 2;
    }
    const kiln::DTypes dtypes = kiln::DTypes::parse(argv[3]);
    if (cmd == "warm" && (argc == 5 || argc == 6)) {
      const int arch = kiln::rt::parse_arch(argv[4]);
      const auto variant = static_cast<std::uint32_t>(argc == 6 ? std::stoul(argv[5]) : spec->variants.front());
      auto outcome = kiln::rt::warm_kernel(*spec, dtypes, variant, arch);
      print_counters(outcome == kiln::rt::WarmOutcome::compiled ? "compiled" : "cached");
      return 0;
    }
    if (cmd == "load" && (argc == 4 || argc == 5)) {
      const auto variant = static_cast<std::uint32_t>(argc == 5 ? std::stoul(argv[4]) : spec->variants.front());
      kiln::rt::Function f = kiln::rt::get_function(*spec, dtypes, variant, 0);
      print_counters(f.handle ? "loaded" : "null");
      return f.handle ? 0 : 1;
    }
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_test_helper: %s\n", e.what());
    return 1;
  }
}
