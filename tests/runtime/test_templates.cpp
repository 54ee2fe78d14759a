// Kernel templates (placeholders, instantiation errors, KILN_TEMPLATE_DIR) and the
// kernel registry (registration, ids, rejection of unsupported tuples and variants).
#include <doctest/doctest.h>

#include "error_message.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <unistd.h>

#include "backend/cuda/launch_common.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {
using kiln_test::message_of;


using kiln_test::contains;

// Sets KILN_TEMPLATE_DIR to a fresh directory for one scope, then restores the environment.
struct TemplateDirScope {
  fs::path dir;
  TemplateDirScope() {
    dir = fs::temp_directory_path() / ("kiln-templates-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    ::setenv("KILN_TEMPLATE_DIR", dir.c_str(), 1);
  }
  ~TemplateDirScope() {
    ::unsetenv("KILN_TEMPLATE_DIR");
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir / (name + ".cu")) << text; }
};

}  // namespace

TEST_CASE("template_placeholders lists distinct names in order of first use") {
  auto p = rt::template_placeholders("${OUT} y = ${OP}(x); ${OUT} z; $X ${lower} ${1A} ${A_1} ${}");
  CHECK(p == std::vector<std::string>{"OUT", "OP", "A_1"});
  CHECK(rt::template_placeholders("no placeholders here").empty());
}

TEST_CASE("instantiate replaces every placeholder in one pass") {
  std::string out = rt::instantiate("t", "${T} f(${T} x) { return ${OP}; }${END}",
                                    {{"T", "float"}, {"OP", "x * ${T}"}, {"END", ""}});
  // A binding's value is not scanned again, so it may itself contain "${".
  CHECK(out == "float f(float x) { return x * ${T}; }");
}

TEST_CASE("instantiate errors name the template and the placeholder or binding") {
  const char* text = "${TIN} x; ${OUT} y;";
  std::string missing =
      message_of<ValueError>([&] { rt::instantiate("elementwise_unary", text, {{"TIN", "float"}}); });
  CHECK(missing == "[template elementwise_unary] placeholder ${OUT} has no binding");

  std::string unknown = message_of<ValueError>(
      [&] { rt::instantiate("elementwise_unary", text, {{"TIN", "float"}, {"OUT", "float"}, {"TOUT", "int"}}); });
  CHECK(contains(unknown, "[template elementwise_unary]"));
  CHECK(contains(unknown, "binding TOUT"));
  CHECK(contains(unknown, "${TIN} ${OUT}"));

  std::string twice = message_of<ValueError>(
      [&] { rt::instantiate("t", text, {{"TIN", "float"}, {"OUT", "float"}, {"TIN", "int"}}); });
  CHECK(contains(twice, "binding TIN is given twice"));

  std::string malformed = message_of<ValueError>([&] { rt::instantiate("t", "a\nb ${Oops} c", {}); });
  CHECK(contains(malformed, "[template t] malformed placeholder at line 2"));
}

TEST_CASE("embedded templates are listed and readable") {
  auto names = rt::template_names();
  for (const char* n : {"prelude", "elementwise_unary", "elementwise_binary", "fill", "where"}) {
    CAPTURE(n);
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
    CHECK_FALSE(rt::template_source(n).empty());
  }
  auto p = rt::template_placeholders(rt::template_source("elementwise_unary"));
  CHECK(p == std::vector<std::string>{"PRELUDE", "VARIANT", "TIN", "TOUT", "COMPUTE", "OP"});
  CHECK(contains(message_of<ValueError>([] { rt::template_source("no_such_template"); }), "no_such_template"));
  CHECK_THROWS_AS(rt::template_source("../etc/passwd"), ValueError);
}

TEST_CASE("every template takes the one device prelude and repeats none of its helpers") {
  // reduce_ops, mma, conv_common, conv_stats, conv_wgrad_small_reduce, row_sums, tf32_split and
  // bn_pool_window are pasted into templates after the prelude.
  const std::vector<std::string> without{"prelude",       "reduce_ops", "mma",      "conv_common",
                                         "conv_stats",    "tf32_split", "row_sums", "conv_wgrad_small_reduce",
                                         "bn_pool_window"};
  for (const std::string& name : rt::template_names()) {
    const std::string text = rt::template_source(name);
    const auto p = rt::template_placeholders(text);
    const bool takes = std::find(p.begin(), p.end(), "PRELUDE") != p.end();
    const bool exempt = std::find(without.begin(), without.end(), name) != without.end();
    CHECK_MESSAGE(takes == !exempt, name);
    if (name == "prelude") continue;
    // The row loop, the lane reductions and the last-block ticket live in the prelude too.
    for (const std::string helper :
         {"__half2float", "__bfloat162float", "__float2half_rn", "__float2bfloat16_rn", "struct Lim", "struct is_same",
          "thread_index() {", "kMaxDims =", "for_each_row(", "void for_each(", "combine_warps(", "last_block(",
          "last_to_finish(unsigned", "namespace m {"})
      CHECK_MESSAGE(!contains(text, helper), name, " defines its own ", helper);
  }
  // Only the half headers a tuple needs: they dominate NVRTC's compile time.
  const std::string f16 = rt::instantiate_kernel(kernels::kernel("sum"), {DType::f16, DType::f16}, 0);
  CHECK(contains(f16, "namespace kiln {"));
  CHECK(f16.find("#include <cuda_fp16.h>\n") < f16.find("namespace kiln {"));
  CHECK_FALSE(contains(f16, "cuda_bf16.h"));
  const std::string f32 = rt::instantiate_kernel(kernels::kernel("softmax"), {DType::f32}, 0);
  CHECK(contains(f32, "namespace kiln"));
  CHECK_FALSE(contains(f32, "cuda_fp16.h"));
}

TEST_CASE("rt::device_prelude is the half headers a tuple needs, then the prelude template") {
  const std::string prelude = rt::template_source("prelude");
  CHECK(rt::device_prelude({DType::f32, DType::i64}) == prelude);
  CHECK(rt::device_prelude({DType::f16, DType::f32}) == "#include <cuda_fp16.h>\n" + prelude);
  CHECK(rt::device_prelude({DType::bf16}) == "#include <cuda_bf16.h>\n" + prelude);
  CHECK(rt::device_prelude({DType::bf16, DType::f16, DType::bf16}) ==
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + prelude);
  // The helpers the templates share, under names that say what they are.
  for (const char* name : {"namespace math {", "namespace warp {", "namespace block {", "namespace rows {"})
    CHECK_MESSAGE(contains(prelude, name), name);
}

TEST_CASE("KILN_TEMPLATE_DIR reads templates from disk") {
  const std::string embedded = rt::template_source("fill");
  {
    TemplateDirScope scope;
    scope.write("fill", "// edited ${PRELUDE} ${VARIANT} ${T}\n");
    scope.write("prelude", "// prelude");
    CHECK(rt::template_source("fill") == "// edited ${PRELUDE} ${VARIANT} ${T}\n");
    CHECK(rt::template_names() == std::vector<std::string>{"fill", "prelude"});

    std::string missing = message_of<ValueError>([] { rt::template_source("where"); });
    CHECK(contains(missing, "'where'"));
    CHECK(contains(missing, (scope.dir / "where.cu").string()));

    // Kernel specs instantiate the text on disk, prelude included.
    CHECK(rt::instantiate_kernel(kernels::kernel("fill"), {DType::f32}, 1) ==
          "// kiln kernel fill (f32) variant 1\n// edited // prelude 1 float\n");
  }
  CHECK(rt::template_source("fill") == embedded);
}

TEST_CASE("instantiate_kernel binds an op's expression for its dtypes and variant") {
  const rt::KernelSpec& add = kernels::kernel("add");
  std::string src = rt::instantiate_kernel(add, {DType::f16, DType::f16}, 1);
  CHECK(contains(src, "typedef __half Tin;"));
  CHECK(contains(src, "typedef float C;"));
  CHECK(contains(src, "#define KILN_VARIANT 1"));
  CHECK(contains(src, "a + b"));
  CHECK(contains(src, "extern \"C\" __global__"));
  CHECK(contains(src, add.entry));
  CHECK(rt::template_placeholders(src).empty());

  std::string cast = rt::instantiate_kernel(kernels::kernel("cast"), {DType::i64, DType::boolean}, 0);
  CHECK(contains(cast, "typedef long long Tin;"));
  CHECK(contains(cast, "typedef bool Tout;"));
}

TEST_CASE("instantiate_kernel rejects unsupported dtypes and variants with typed errors") {
  const rt::KernelSpec& add = kernels::kernel("add");
  std::string dt = message_of<DTypeError>([&] { rt::instantiate_kernel(add, {DType::u8, DType::f16}, 0); });
  CHECK(contains(dt, "[add] dtypes (u8,f16) not supported; supported: (f32,f32)"));
  std::string var = message_of<ValueError>([&] { rt::instantiate_kernel(add, {DType::f32, DType::f32}, 7); });
  CHECK(var == "[add] variant 7 not supported; supported: 0 1 2");
  CHECK_THROWS_AS(rt::instantiate_kernel(kernels::kernel("exp"), {DType::i32, DType::i32}, 0), DTypeError);
}

TEST_CASE("the registry assigns ids in order, keeps addresses and refuses duplicates") {
  // Copies of the fill spec under new names, so that they still compile when the
  // compile-everything test walks the registry after this one.
  auto make = [](std::string op) {
    rt::KernelSpec s = kernels::kernel("fill");
    s.op = std::move(op);
    s.dtypes = {{DType::f32}};
    s.variants = {0};
    return s;
  };
  const std::size_t before = rt::registered_kernels().size();
  const rt::KernelSpec* a = &rt::register_kernel(make("test_registry_a"));
  const rt::KernelSpec* b = &rt::register_kernel(make("test_registry_b"));
  CHECK(a->id == before);
  CHECK(b->id == before + 1);
  CHECK(rt::find_kernel("test_registry_a") == a);
  CHECK(rt::registered_kernels().back() == b);
  CHECK(rt::find_kernel("test_registry_missing") == nullptr);

  std::string dup = message_of<ValueError>([&] { rt::register_kernel(make("test_registry_a")); });
  CHECK(contains(dup, "[test_registry_a]"));
  CHECK(rt::registered_kernels().size() == before + 2);

  rt::KernelSpec no_bind = make("test_registry_c");
  no_bind.bind = nullptr;
  CHECK_THROWS_AS(rt::register_kernel(no_bind), ValueError);
  rt::KernelSpec no_dtypes = make("test_registry_d");
  no_dtypes.dtypes.clear();
  CHECK_THROWS_AS(rt::register_kernel(no_dtypes), ValueError);
}
