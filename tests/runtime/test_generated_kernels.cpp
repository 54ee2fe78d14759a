// Generated kernels: the builder runs once per key (also from many threads at once), keys
// name their specs stably, and the specs instantiate to the built source.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"

using namespace kiln;
using namespace kiln::rt;

namespace {

// Each test case uses its own kinds: the registry of generated kernels lives for the process.
GeneratedModule module_with(const std::string& body, std::vector<std::string> entries, std::string label = "test") {
  std::string src;
  for (const std::string& e : entries) src += "extern \"C\" __global__ void " + e + "(float* p) { " + body + " }\n";
  return {src, std::move(label), std::move(entries)};
}

// The name a module of `kind` with this source takes when it is free.
std::string hashed_name(std::string_view kind, const std::string& source) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(source)));
  return std::string(kind) + "_" + hex;
}

}  // namespace

// A key keeps a view of its kind: a literal or a string that outlives it, never a temporary.
static_assert(std::is_constructible_v<GeneratedKey, const char*>);
static_assert(std::is_constructible_v<GeneratedKey, std::string_view>);
static_assert(std::is_constructible_v<GeneratedKey, const std::string&>);
static_assert(!std::is_constructible_v<GeneratedKey, std::string&&>);
static_assert(!std::is_constructible_v<GeneratedKey, std::string>);

TEST_CASE("generated kernels: the builder runs once per key, only on a miss") {
  int built = 0;
  auto build = [&] {
    ++built;
    return module_with("p[0] = 1.f;", {"kiln_test_once"});
  };
  const std::uint64_t before = generated_builds();
  const auto first = generated_kernels(GeneratedKey("test_gen_once").add(1, 2), build);
  const auto again = generated_kernels(GeneratedKey("test_gen_once").add(1, 2), build);
  CHECK(built == 1);
  CHECK(generated_builds() == before + 1);
  REQUIRE(first.size() == 1);
  CHECK(again.data() == first.data());
  CHECK(again[0] == first[0]);
  CHECK(first[0]->entry == "kiln_test_once");
}

TEST_CASE("generated kernels: the same key from 8 threads builds once and all get the same specs") {
  std::atomic<int> built{0};
  std::latch start(8);
  std::vector<const KernelSpec*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      const auto specs = generated_kernels(GeneratedKey("test_gen_threads").add(7), [&] {
        built.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the others arrive meanwhile
        return module_with("p[0] = 2.f;", {"kiln_test_threads"});
      });
      got[static_cast<std::size_t>(t)] = specs[0];
    });
  for (auto& th : threads) th.join();
  CHECK(built.load() == 1);
  REQUIRE(got[0] != nullptr);
  for (const KernelSpec* s : got) CHECK(s == got[0]);
}

TEST_CASE("generated kernels: different keys with different sources give different specs") {
  int n = 0;
  auto build = [&] { return module_with("p[0] = " + std::to_string(++n) + ".f;", {"kiln_test_keys"}); };
  const KernelSpec* a = generated_kernels(GeneratedKey("test_gen_keys").add(1), build)[0];
  const KernelSpec* b = generated_kernels(GeneratedKey("test_gen_keys").add(2), build)[0];
  const KernelSpec* c = generated_kernels(GeneratedKey("test_gen_keys").add(1, 0), build)[0];
  const KernelSpec* d = generated_kernels(GeneratedKey("test_gen_keys_other").add(1), build)[0];
  const KernelSpec* e = generated_kernels(GeneratedKey("test_gen_keys").add(-0.0), build)[0];
  const KernelSpec* f = generated_kernels(GeneratedKey("test_gen_keys").add(0.0), build)[0];
  CHECK(n == 6);
  const std::vector<const KernelSpec*> all{a, b, c, d, e, f};
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(all[i] != all[j]);
      CHECK(all[i]->op != all[j]->op);
    }
  CHECK(d->op.rfind("test_gen_keys_other_", 0) == 0);
}

TEST_CASE("generated kernels: keys whose modules have the same source share its specs, compiled once") {
  // As a direct conv's module for two batch sizes: the batch is a run-time argument.
  int built = 0;
  auto build = [&] {
    ++built;
    return module_with("p[1] = 2.f;", {"kiln_test_same", "kiln_test_same2"}, "same");
  };
  const auto a = generated_kernels(GeneratedKey("test_gen_same").add(128), build);
  const auto b = generated_kernels(GeneratedKey("test_gen_same").add(96), build);
  CHECK(built == 2);  // each key's builder runs once; its source decides the name
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(b[0] == a[0]);
  CHECK(b[1] == a[1]);
  CHECK(a[0]->op ==
        hashed_name("test_gen_same", module_with("p[1] = 2.f;", {"kiln_test_same", "kiln_test_same2"}).source));
  // The same source with other entry points is another module.
  const auto c = generated_kernels(GeneratedKey("test_gen_same").add(64),
                                   [] { return module_with("p[1] = 2.f;", {"kiln_test_same"}, "same"); });
  REQUIRE(c.size() == 1);
  CHECK(c[0] != a[0]);
  CHECK(c[0]->op != a[0]->op);
}

TEST_CASE("generated kernels: keys past the inline words compare and hash by all their words") {
  GeneratedKey a("test_gen_long"), b("test_gen_long"), c("test_gen_long");
  for (std::uint64_t w = 0; w < 40; ++w) a.add(w), b.add(w), c.add(w == 39 ? 99 : w);
  REQUIRE(a.words().size() == 40);
  CHECK(a.words()[0] == 0);
  CHECK(a.words()[39] == 39);
  CHECK(a.hash() == b.hash());
  CHECK(a.hash() != c.hash());
  int built = 0;
  auto build = [&] {
    ++built;
    return module_with("p[0] = " + std::to_string(40 + built) + ".f;", {"kiln_test_long"});
  };
  const KernelSpec* sa = generated_kernels(a, build)[0];
  CHECK(generated_kernels(b, build)[0] == sa);
  CHECK(generated_kernels(c, build)[0] != sa);
  CHECK(built == 2);
}

TEST_CASE("generated kernels: names are stable: a known source gives a known name") {
  // FNV-1a 64 of "test_gen_stable", a zero byte and the words 1, 2, 0xdeadbeef (8 bytes each,
  // little-endian), and of the module's source, computed outside kiln; std::hash would differ
  // between builds.
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  const GeneratedKey key = GeneratedKey("test_gen_stable").add(1, 2u, std::uint64_t{0xdeadbeef});
  CHECK(key.hash() == 0x75587194d4154a3bull);
  const auto specs = generated_kernels(key, [] { return module_with("p[0] = 5.f;", {"kiln_a", "kiln_b"}, "stable"); });
  REQUIRE(specs.size() == 2);
  CHECK(specs[0]->op == "test_gen_stable_42eaebcae7905f46");
  CHECK(specs[1]->op == "test_gen_stable_42eaebcae7905f46_1");
  CHECK(specs[0]->template_name == "test_gen_stable_42eaebcae7905f46");
  CHECK(specs[1]->template_name == specs[0]->template_name);
  CHECK(specs[1]->entry == "kiln_b");
  CHECK(find_kernel("test_gen_stable_42eaebcae7905f46") == specs[0]);
}

TEST_CASE("generated kernels: the specs instantiate to the module's one source, labelled") {
  const GeneratedModule m =
      module_with("p[threadIdx.x] *= -2.f;", {"kiln_test_inst", "kiln_test_inst2"}, "fused(neg) f32");
  const auto specs = generated_kernels(GeneratedKey("test_gen_inst").add(DType::f32), [&] { return m; });
  REQUIRE(specs.size() == 2);
  CHECK(generated_template_label(specs[0]->template_name) == "fused(neg) f32");
  // Both entries carry the module's name, so their sources (and cache entries) are one.
  CHECK(kernel_source_name(*specs[1]) == specs[0]->op);
  CHECK(instantiate_kernel(*specs[1], generated_dtypes(), 0) == instantiate_kernel(*specs[0], generated_dtypes(), 0));
  for (const KernelSpec* s : specs) {
    const std::string text = instantiate_kernel(*s, generated_dtypes(), 0);
    CHECK(text.rfind("// kiln kernel " + specs[0]->op + " ", 0) == 0);
    REQUIRE(text.size() > m.source.size());
    CHECK(text.substr(text.size() - m.source.size()) == m.source);
  }
  const CompiledModule compiled =
      compile({specs[0]->op, "u8", instantiate_kernel(*specs[0], generated_dtypes(), 0), 80});
  CHECK(compiled.ptx.find("kiln_test_inst2") != std::string::npos);
}

TEST_CASE("generated kernels: a name another module took moves on to a free one") {
  const GeneratedKey key = GeneratedKey("test_gen_clash").add(42);
  const GeneratedModule m = module_with("p[0] = 6.f;", {"kiln_clash", "kiln_clash2"});
  const std::string hashed = hashed_name(key.kind(), m.source);
  // Another module's second entry already holds "<hashed>_1", and its template "<hashed>":
  // "<hashed>_1" cannot be a base (its first entry is taken), so the module becomes "<hashed>_2".
  add_generated_template(hashed, "// another key's module\n", "other");
  KernelSpec other;
  other.op = hashed + "_1";
  other.template_name = hashed;
  other.entry = "kiln_other";
  other.dtypes = {DTypes{DType::u8}};
  other.bind = [](const DTypes&, std::uint32_t) { return Bindings{}; };
  register_kernel(std::move(other));

  const auto specs = generated_kernels(key, [&] { return m; });
  REQUIRE(specs.size() == 2);
  CHECK(specs[0]->op == hashed + "_2");
  CHECK(specs[1]->op == hashed + "_2_1");
  CHECK(specs[0]->template_name == hashed + "_2");
  CHECK(template_source(hashed) == "// another key's module\n");  // the other module is untouched
  CHECK(instantiate_kernel(*specs[0], generated_dtypes(), 0).find("kiln_clash2") != std::string::npos);
}

TEST_CASE("generated kernels: a builder that throws leaves the key to a later call") {
  const GeneratedKey key = GeneratedKey("test_gen_throw").add(1);
  CHECK_THROWS_AS(generated_kernels(key, []() -> GeneratedModule { throw std::runtime_error("no source today"); }),
                  std::runtime_error);
  CHECK_THROWS_AS(generated_kernels(key, [] { return GeneratedModule{"// x\n", "x", {}}; }), ValueError);
  int built = 0;
  const auto specs = generated_kernels(key, [&] {
    ++built;
    return module_with("p[0] = 7.f;", {"kiln_test_throw"});
  });
  CHECK(built == 1);
  REQUIRE(specs.size() == 1);
  CHECK(specs[0]->entry == "kiln_test_throw");
}

TEST_CASE("generated kernels: a function is asked for by its entry point's name") {
  const auto specs = generated_kernels(GeneratedKey("test_gen_entry"),
                                       [] { return module_with("p[0] = 1.f;", {"kiln_first", "kiln_second"}); });
  REQUIRE(specs.size() == 2);
  for (const KernelSpec* s : specs) CHECK(s->dtypes == std::vector<DTypes>{generated_dtypes()});
  // An entry the module lacks is named, with the ones it has, before anything loads.
  try {
    (void)generated_function(specs, "kiln_third", 0);
    FAIL("no error for a missing entry point");
  } catch (const ValueError& e) {
    const std::string what = e.what();
    CHECK(what.find("'kiln_third'") != std::string::npos);
    CHECK(what.find("kiln_first, kiln_second") != std::string::npos);
  }
}
