// Kernels compiled several to a program (kernel_bundle.h): which may share one, the program's
// source, and the entries a bundle stores: each found by its own source, holding the bundle's
// binaries and the name of its entry point there. No GPU needed.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/kernel_bundle.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/version.h"

namespace rt = kiln::rt;
using kiln::DType;
using kiln::DTypes;

namespace {

const DTypes kF32{DType::f32, DType::f32};
const DTypes kF16{DType::f16, DType::f16};

rt::BundleItem item(const char* op, const DTypes& d, std::uint32_t variant = 0) {
  REQUIRE(kiln::version());  // loads the engine's registered kernels
  const rt::KernelSpec* spec = rt::find_kernel(op);
  REQUIRE(spec);
  return {spec, d, variant};
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A copy of a registered unary kernel under a name of its own, so that nothing compiled it
// before this test run (registered once per process); `op` replaces its expression when given.
const rt::KernelSpec* copy_of(const char* from, const std::string& name, const char* op = nullptr) {
  if (const rt::KernelSpec* known = rt::find_kernel(name)) return known;
  REQUIRE(kiln::version());
  const rt::KernelSpec* spec = rt::find_kernel(from);
  REQUIRE(spec);
  rt::KernelSpec s = *spec;
  s.op = name;
  if (op)
    s.bind = [bind = spec->bind, op = std::string(op)](const DTypes& d, std::uint32_t v) {
      rt::Bindings b = bind(d, v);
      for (auto& [key, value] : b)
        if (key == "OP") value = op;
      return b;
    };
  return &rt::register_kernel(std::move(s));
}

}  // namespace

TEST_CASE("kernels of one template and header set share a bundle, at most `most` each, the largest first") {
  const std::vector<rt::BundleItem> items{item("abs", kF32),    item("abs", kF16),    item("neg", kF32, 1),
                                          item("exp", kF32),    item("neg", kF16, 1), item("add", kF32, 0),
                                          item("sqrt", kF32, 1)};
  using Groups = std::vector<std::vector<std::size_t>>;
  // f32 unary kernels together; the f16 ones take another prelude (cuda_fp16.h); add is binary.
  CHECK(rt::bundle_groups(items, 8) == Groups{{0, 2, 3, 6}, {1, 4}, {5}});
  CHECK(rt::bundle_groups(items, 3) == Groups{{0, 2, 3}, {1, 4}, {5}, {6}});
  CHECK(rt::bundle_groups(items, 1) == Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}});
  CHECK_THROWS_AS(rt::bundle_groups(items, 0), kiln::ValueError);
  CHECK(rt::bundle_groups({}, 8).empty());
  CHECK(rt::bundleable(items[0]));
  CHECK_THROWS_AS(rt::bundleable(item("abs", kF32, 7)), kiln::ValueError);
  // One its spec does not support is left alone, for warm_bundle to report.
  const std::vector<rt::BundleItem> odd{item("abs", kF32), item("abs", kF32, 7), item("neg", kF32)};
  CHECK(rt::bundle_groups(odd, 8) == Groups{{0, 2}, {1}});
  const std::vector<rt::BundleResult> r = rt::warm_bundle(std::vector<rt::BundleItem>{odd[1]}, 90);
  CHECK_FALSE(r.at(0).outcome);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(r.at(0).error), doctest::Contains("variant 7 not supported"),
                       kiln::ValueError);
}

TEST_CASE("a bundle's source holds the prelude once and each kernel in a namespace, its entry point renamed") {
  const std::vector<rt::BundleItem> items{item("abs", kF32), item("neg", kF32, 1), item("exp", kF32)};
  const std::string src = rt::bundle_source(items);
  const std::string prelude = rt::device_prelude(kF32);
  CHECK(count(src, prelude) == 1);
  CHECK(count(src, "\nKILN_KERNELS_WAIT_FOR_PRIOR_GRIDS\n") == 1);
  for (std::size_t i = 0; i < items.size(); ++i) {
    CHECK(count(src, "namespace kiln_bundle_" + std::to_string(i) + " {") == 1);
    CHECK(count(src, rt::bundled_entry("kiln_unary", i) + "(") == 2);  // declared in both variants' branches
    CHECK(count(src, "// kiln kernel " + items[i].spec->op + " (f32,f32)") == 1);
  }
  CHECK(count(src, " kiln_unary(") == 0);
  CHECK(count(src, "#undef KILN_VARIANT") == 3);  // each kernel's own macros end with it
  CHECK(rt::bundled_entry("kiln_unary", 2) == "kiln_unary__kiln_bundle_2");
  CHECK(rt::entry_name_of("kiln_unary__kiln_bundle_2") == "kiln_unary");
  CHECK(rt::entry_name_of("kiln_unary") == "kiln_unary");
  CHECK(rt::entry_name_of("kiln_unary__kiln_bundle_") == "kiln_unary__kiln_bundle_");
  CHECK(rt::entry_name_of("kiln_unary__kiln_bundle_x") == "kiln_unary__kiln_bundle_x");
  CHECK_THROWS_AS(rt::bundle_source({}), kiln::ValueError);
  const std::vector<rt::BundleItem> mixed{item("abs", kF32), item("abs", kF16)};
  CHECK_THROWS_AS(rt::bundle_source(mixed), kiln::ValueError);
}

TEST_CASE("a bundle stores an entry per kernel, found by its own source, with the bundle's binaries") {
  REQUIRE_MESSAGE(rt::DiskCache::global().mode() == rt::CacheMode::read_write, "these tests need KILN_CACHE=rw");
  const rt::KernelSpec* floor = copy_of("floor", "bundle_test_floor");
  const std::vector<rt::BundleItem> items{
      {floor, kF32, 0}, {floor, kF32, 1}, {copy_of("ceil", "bundle_test_ceil"), kF32, 0}};
  const std::vector<rt::BundleResult> results = rt::warm_bundle(items, 90);
  REQUIRE(results.size() == items.size());
  std::vector<rt::Entry> entries;
  for (std::size_t i = 0; i < items.size(); ++i) {
    CAPTURE(i);
    REQUIRE(results[i].outcome);
    CHECK(results[i].digest.size() == 64);
    // The key a run computes from the kernel's own source finds it.
    const std::string own = rt::instantiate_kernel(*items[i].spec, items[i].dtypes, items[i].variant);
    rt::Entry e = rt::cached_entry(*items[i].spec, items[i].dtypes, items[i].variant, 90);
    CHECK(e.key.digest == results[i].digest);
    CHECK(e.source == own);
    CHECK(e.key.function == rt::bundled_entry("kiln_unary", i));
    CHECK(e.ptx.find(".entry " + e.key.function + "(") != std::string::npos);
    entries.push_back(std::move(e));
  }
  CHECK(!entries[0].key.bundle.empty());
  for (const rt::Entry& e : entries) {
    CHECK(e.key.bundle == entries[0].key.bundle);
    CHECK(e.cubin == entries[0].cubin);
  }
  // Warm again: every kernel is cached already, nothing compiles.
  for (const rt::BundleResult& r : rt::warm_bundle(items, 90)) CHECK(r.outcome == rt::WarmOutcome::cached);
}

TEST_CASE("when a bundle does not compile, each kernel compiles alone and a failure names its own kernel") {
  REQUIRE_MESSAGE(rt::DiskCache::global().mode() == rt::CacheMode::read_write, "these tests need KILN_CACHE=rw");
  const std::vector<rt::BundleItem> items{{copy_of("floor", "bundle_test_good_floor"), kF32, 0},
                                          {copy_of("floor", "bundle_test_broken", "no_such_name(x)"), kF32, 0}};
  CHECK(rt::bundle_groups(items, 8) == std::vector<std::vector<std::size_t>>{{0, 1}});
  const std::vector<rt::BundleResult> results = rt::warm_bundle(items, 90);
  REQUIRE(results[0].outcome);
  CHECK_FALSE(results[1].outcome);
  REQUIRE(results[1].error);
  try {
    std::rethrow_exception(results[1].error);
  } catch (const kiln::CompileError& e) {
    CHECK(std::string(e.what()).find("bundle_test_broken") != std::string::npos);
    CHECK(e.log().find("no_such_name") != std::string::npos);
  }
  // The good kernel's entry is its own compile: no bundle, its entry point as written.
  const rt::Entry good = rt::cached_entry(*items[0].spec, items[0].dtypes, 0, 90);
  CHECK(good.key.function.empty());
  CHECK(good.key.bundle.empty());
}
