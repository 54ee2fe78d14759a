// NVRTC compilation: options, outputs, and what a failed compile reports.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "scoped_env.h"

namespace rt = kiln::rt;

namespace {
const char* kHalfKernel =
    "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void k(__half* x, __nv_bfloat16* y) { x[0] = __float2half(1.f); y[0] = "
    "__float2bfloat16(2.f); }\n";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("compile emits PTX and CUBIN for sm_80 and sm_90 with the fp16/bf16 headers") {
  for (int arch : {80, 90}) {
    CAPTURE(arch);
    REQUIRE(rt::nvrtc_can_emit_cubin(arch));
    rt::CompiledModule m = rt::compile({"half_probe", "f16,bf16", kHalfKernel, arch});
    CHECK(m.ptx.find(".target sm_" + std::to_string(arch)) != std::string::npos);
    CHECK(m.cubin.size() > 100);
    CHECK(m.cubin.compare(0, 4,
                          "\x7f"
                          "ELF") == 0);
    CHECK(m.ms > 0);
  }
}

TEST_CASE("a quick-tier compile adds NVRTC's fast-compile mode and builds the same kernel") {
  const std::vector<std::string> quick = rt::quick_tier_options();
  if (rt::nvrtc_version() >= "12.8") CHECK(quick == std::vector<std::string>{"-Ofc=mid"});
  if (quick.empty()) {
    CHECK_THROWS_AS(rt::compile({"half_probe", "f16,bf16", kHalfKernel, 90, true}), kiln::ValueError);
    return;
  }
  const rt::CompiledModule full = rt::compile({"half_probe", "f16,bf16", kHalfKernel, 90});
  const rt::CompiledModule fast = rt::compile({"half_probe", "f16,bf16", kHalfKernel, 90, true});
  CHECK(fast.cubin.compare(0, 4,
                           "\x7f"
                           "ELF") == 0);
  CHECK(fast.ptx.find(".entry k(") != std::string::npos);
  CHECK(full.ptx.find(".entry k(") != std::string::npos);
  for (const std::string& o : rt::nvrtc_options(90)) CHECK(o.rfind("-Ofc", 0) != 0);  // not in the cache key's options
}

TEST_CASE("nvrtc_options name the exact arch and the include dirs") {
  auto opts = rt::nvrtc_options(90);
  CHECK(std::find(opts.begin(), opts.end(), std::string("-arch=sm_90")) != opts.end());
  CHECK(std::any_of(opts.begin(), opts.end(), [](const std::string& o) { return o.rfind("-I", 0) == 0; }));
  CHECK(rt::nvrtc_version().find('.') != std::string::npos);
}

TEST_CASE("parse_arch accepts sm_XX, compute_XX and digits, and names bad input") {
  CHECK(rt::parse_arch("sm_90") == 90);
  CHECK(rt::parse_arch("compute_80") == 80);
  CHECK(rt::parse_arch("86") == 86);
  for (const char* bad : {"sm_", "gfx90a", "sm_9x", "sm_1", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(rt::parse_arch(bad), doctest::Contains("[arch]"), kiln::ValueError);
  }
}

TEST_CASE("a failed compile throws CompileError with the log, op, dtypes and numbered source, also on disk") {
  const std::string source = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undeclared_name;\n}\n";
  try {
    rt::compile({"broken_op", "f32,f16", source, 90});
    FAIL("compile should have thrown");
  } catch (const kiln::CompileError& e) {
    const std::string what = e.what();
    CHECK(what.find("[broken_op]") == 0);
    CHECK(what.find("f32,f16") != std::string::npos);
    CHECK(e.log().find("undeclared_name") != std::string::npos);
    CHECK(what.find("  2    x[0] = undeclared_name;") != std::string::npos);  // numbered line 2
    REQUIRE(std::filesystem::exists(e.source_path()));
    CHECK(what.find(e.source_path()) != std::string::npos);
    CHECK(slurp(e.source_path()) == source);
  }
}

TEST_CASE("a failed compile's source goes to a folder of this user's, or the error says why it could not") {
  const std::string source = "extern \"C\" __global__ void k(float* x) { x[0] = nope; }\n";
  const std::string folder = "kiln-compile-errors-" + std::to_string(::geteuid());
  auto error_of = [&] {
    try {
      rt::compile({"broken_op", "f32", source, 90});
    } catch (const kiln::CompileError& e) {
      return std::make_pair(std::string(e.what()), e.source_path());
    }
    FAIL("compile should have thrown");
    return std::make_pair(std::string(), std::string());
  };
  const auto [what, path] = error_of();
  REQUIRE(!path.empty());
  CHECK(what.find("source written to " + path) != std::string::npos);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  CHECK(dir.filename() == folder);
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);  // another user can neither read it nor plant files in it
  CHECK(st.st_uid == ::geteuid());

  // $TMPDIR decides where; a folder that cannot be made is named in the error, with the reason.
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved ? saved : "";
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / ("kiln-tmpdir-" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp / folder) << "a file where the folder should be";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const auto [blocked, none] = error_of();
  saved ? ::setenv("TMPDIR", saved_value.c_str(), 1) : ::unsetenv("TMPDIR");
  std::filesystem::remove_all(tmp);
  CHECK(none.empty());
  CHECK(blocked.find("source not written to a file") != std::string::npos);
  CHECK(blocked.find("kiln could not write the source to a file: " + (tmp / folder).string()) != std::string::npos);
  CHECK(blocked.find("nope") != std::string::npos);  // the log and the source are still in the message
}

TEST_CASE("KILN_CUDA_INCLUDE overrides where NVRTC looks for cuda_fp16.h") {
  setenv("KILN_CUDA_INCLUDE", "/nonexistent/kiln-include", 1);
  auto dirs = rt::cuda_include_dirs();
  CHECK(dirs == std::vector<std::string>{"/nonexistent/kiln-include"});
  CHECK_THROWS_WITH_AS(rt::compile({"half_probe", "f16", kHalfKernel, 90}), doctest::Contains("cuda_fp16.h"),
                       kiln::CompileError);
  unsetenv("KILN_CUDA_INCLUDE");
  CHECK(rt::cuda_include_dirs() != dirs);
}

TEST_CASE("fast compiles: the templates that ask build at -Ofc=min, unless KILN_FAST_COMPILE=off") {
  CHECK(rt::wants_fast_compile("// header\n#define KILN_FAST_COMPILE 1\nint x;"));
  CHECK_FALSE(rt::wants_fast_compile("// #define KILN_FAST_COMPILE 1\nint x;"));
  const std::vector<std::string> plain = rt::nvrtc_options(90), fast = rt::nvrtc_options(90, false, true);
  CHECK(std::find(plain.begin(), plain.end(), "-Ofc=min") == plain.end());
  if (!rt::quick_tier_options().empty()) CHECK(std::find(fast.begin(), fast.end(), "-Ofc=min") != fast.end());

  // The simple loops ask; the training steps' own kernels (norm, reduce, softmax, optim, pool) do not.
  const std::set<std::string> asking = {
      "elementwise_unary", "elementwise_binary", "fill", "index", "where", "random", "im2col", "tune_check"};
  std::set<std::string> seen;
  for (const rt::KernelSpec* spec : rt::registered_kernels()) {
    CAPTURE(spec->op);
    const std::string source = rt::instantiate_kernel(*spec, spec->dtypes.front(), spec->variants.front());
    CHECK(rt::wants_fast_compile(source) == (asking.count(spec->template_name) == 1));
    seen.insert(spec->template_name);
  }
  for (const std::string& t : asking) CHECK(seen.count(t) == 1);

  const char* marked = "#define KILN_FAST_COMPILE 1\nextern \"C\" __global__ void k(float* x) { x[0] = 1.f; }\n";
  const rt::CompiledModule m = rt::compile({"fast_probe", "f32", marked, 90});
  CHECK(m.cubin.compare(0, 4,
                        "\x7f"
                        "ELF") == 0);
  {
    kiln_test::ScopedEnv off{{"KILN_FAST_COMPILE", "off"}};
    CHECK_FALSE(rt::wants_fast_compile(marked));
  }
  kiln_test::ScopedEnv bad{{"KILN_FAST_COMPILE", "maybe"}};
  CHECK_THROWS_WITH_AS(rt::wants_fast_compile(marked), "[nvrtc] KILN_FAST_COMPILE='maybe' must be on or off",
                       kiln::ValueError);
}
