// NVRTC's -minimal leaves out what kiln's kernels never use, so it must change nothing in the
// code: a sample of kiln's templates compiles to the same CUBIN with and without it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/version.h"
#include "nvrtc_run.h"

using namespace kiln;

TEST_CASE("kiln's kernels compile to the same CUBIN with and without NVRTC's -minimal") {
  REQUIRE(kiln::version() != nullptr);  // keeps libkiln linked: its initialisers register the specs
  int major = 0, minor = 0;
  const std::string version = rt::nvrtc_version();
  REQUIRE(std::sscanf(version.c_str(), "%d.%d", &major, &minor) == 2);
  const bool has_minimal = major > 12 || (major == 12 && minor >= 4);
  const std::vector<std::string> plain = rt::nvrtc_options(90);
  CHECK((std::count(plain.begin(), plain.end(), "-minimal") == 1) == has_minimal);
  if (!has_minimal) return;
  // One kernel of each kind of template: elementwise (a 16-bit one with its headers), a
  // reduction, normalization, softmax, the optimizer, indexing, random numbers, pooling.
  const std::pair<const char*, const char*> sample[] = {{"fill", "f32"},    {"add", "bf16,bf16"},
                                                        {"sum", "f32,f32"}, {"batch_norm_stats", ""},
                                                        {"softmax", ""},    {"adam_step", ""},
                                                        {"gather", ""},     {"randn", ""},
                                                        {"max_pool2d", ""}, {"softmax_cross_entropy", ""}};
  for (const auto& entry : sample) {
    const char *op = entry.first, *dtypes = entry.second;  // not a structured binding: CAPTURE's lambda takes them
    const rt::KernelSpec* spec = rt::find_kernel(op);
    REQUIRE(spec != nullptr);
    const DTypes d = *dtypes ? DTypes::parse(dtypes) : spec->dtypes.front();
    CAPTURE(op);
    CAPTURE(d.str());
    const std::string source = rt::instantiate_kernel(*spec, d, spec->variants.front());
    std::vector<std::string> with = rt::nvrtc_options(90, rt::wants_arch_specific(source)), without = with;
    std::erase(without, std::string("-minimal"));
    REQUIRE(without.size() + 1 == with.size());
    const rt::NvrtcOutput a = rt::run_nvrtc_in_process({source, std::string(op) + ".cu", with, true});
    const rt::NvrtcOutput b = rt::run_nvrtc_in_process({source, std::string(op) + ".cu", without, true});
    REQUIRE(a.ok);
    REQUIRE(b.ok);
    CHECK(a.cubin.size() > 100);
    CHECK(a.cubin == b.cubin);
  }
}
