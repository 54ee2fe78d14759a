// jitcc warm --plan FILE: a run's kernel plan (kiln/kernel_plan.h) compiled into a cache, the
// kernels shipped with kiln from this kiln's templates and generated ones from the plan's
// source; the entries are the very ones the run's module cache looks up.
#include <set>

#include "jitcc_test_util.h"
#include "kiln/kiln.h"
#include "kiln/runtime/disk_cache.h"

using namespace jitcc_test;

namespace {

constexpr const char* kPlanLabel = "fused(plan,test) f32";
const std::string kGeneratedSource =
    "// kiln kernel fused_jitcc_plan_0001 (u8) variant 0\n"
    "extern \"C\" __global__ void kiln_fused(float* p) { p[threadIdx.x] += 7.f; }\n";

kiln::KernelPlan two_kernel_plan() {
  kiln::KernelPlan plan;
  plan.kernels.push_back({"relu", "f32,f32", 0, "", ""});
  plan.kernels.push_back({"fused_jitcc_plan_0001", "u8", 0, kPlanLabel, kGeneratedSource});
  return plan;
}

}  // namespace

TEST_CASE("KernelPlan saves and loads its kernels; a file that is not a plan is a typed error") {
  ScratchDir dir;
  const std::string file = (dir.path() / "run.plan").string();
  kiln::KernelPlan plan = two_kernel_plan();
  plan.kernels[1].late = true;  // a tuner's alternative
  const kiln::KernelPlan::Measurement product{
      "cublaslt", "m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 256", "f32/tf32"};
  plan.measurements.push_back(product);
  plan.save(file);
  const kiln::KernelPlan back = kiln::KernelPlan::load(file);
  REQUIRE(back.kernels.size() == 2);
  CHECK(back.kernels[0].op == "relu");
  CHECK(back.kernels[0].dtypes == "f32,f32");
  CHECK(back.kernels[0].label.empty());
  CHECK_FALSE(back.kernels[0].late);
  CHECK(back.kernels[1].label == kPlanLabel);
  CHECK(back.kernels[1].source == kGeneratedSource);
  CHECK(back.kernels[1].late);

  CHECK(back.measurements == std::vector<kiln::KernelPlan::Measurement>{product});

  kiln::KernelPlan merged = two_kernel_plan();
  merged.merge(back);
  merged.merge(back);
  CHECK(merged.kernels.size() == 2);
  CHECK(merged.measurements.size() == 1);
  std::ofstream(dir.path() / "badmeasure.json")
      << R"({"kiln_kernel_plan": 1, "kernels": [], "measurements": [{"site": "cublaslt"}]})";
  CHECK_THROWS_WITH_AS(kiln::KernelPlan::load((dir.path() / "badmeasure.json").string()),
                       doctest::Contains("measurement 0 needs site, problem and dtypes"), kiln::ValueError);

  std::ofstream(dir.path() / "not.json") << "kernels: relu";
  CHECK_THROWS_AS(kiln::KernelPlan::load((dir.path() / "not.json").string()), kiln::ValueError);
  std::ofstream(dir.path() / "other.json") << R"({"kiln_kernel_plan": 7, "kernels": []})";
  CHECK_THROWS_WITH_AS(kiln::KernelPlan::load((dir.path() / "other.json").string()),
                       doctest::Contains("format 7"), kiln::ValueError);
  std::ofstream(dir.path() / "nosource.json")
      << R"({"kiln_kernel_plan": 1, "kernels": [{"op": "f", "dtypes": "u8", "variant": 0, "label": "fused(x) f32"}]})";
  CHECK_THROWS_WITH_AS(kiln::KernelPlan::load((dir.path() / "nosource.json").string()),
                       doctest::Contains("no source"), kiln::ValueError);
  CHECK_THROWS_AS(kiln::KernelPlan::load((dir.path() / "absent.json").string()), kiln::IoError);
}

TEST_CASE("jitcc warm --plan compiles a plan's kernels, then finds them cached") {
  ScratchDir dir, cache;
  const std::string file = (dir.path() / "run.plan").string();
  two_kernel_plan().save(file);
  const std::vector<std::string> args{"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache.path().string()};

  nlohmann::json first = jitcc_json(args);
  CHECK(first.at("kernels") == 2);
  CHECK(first.at("compiled") == 2);
  CHECK(first.at("failed") == 0);
  CHECK(first.at("stored") == true);
  nlohmann::json list = jitcc_json({"list", "--cache-dir", cache.path().string()});
  REQUIRE(list.at("entries").size() == 2);
  bool relu = false, fused = false;
  for (const nlohmann::json& e : list.at("entries")) {
    relu = relu || (e.at("op") == "relu" && e.at("dtypes") == "f32,f32" && e.at("arch") == "sm_90");
    fused = fused || (e.at("label") == kPlanLabel && e.at("op") == "fused_jitcc_plan_0001");
  }
  CHECK(relu);  // warmed as `jitcc warm --ops relu` would: the entry a run's lookup finds
  CHECK(fused);

  nlohmann::json second = jitcc_json(args);
  CHECK(second.at("compiled") == 0);
  CHECK(second.at("cached") == 2);
  ProcessResult text = jitcc(args);
  CHECK(text.exit_code == 0);
  CHECK(text.out.find("2 kernels from the plan " + file + " for sm_90") != std::string::npos);
}

TEST_CASE("jitcc warm --plan compiles kiln's own kernels of a template together, a generated one alone") {
  ScratchDir dir, cache;
  const std::string file = (dir.path() / "run.plan").string();
  kiln::KernelPlan plan = two_kernel_plan();
  plan.kernels.push_back({"relu", "f32,f32", 1, "", ""});
  plan.kernels.push_back({"sigmoid", "f32,f32", 0, "", ""});
  plan.save(file);
  const nlohmann::json j =
      jitcc_json({"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache.path().string()});
  CHECK(j.at("compiled") == 4);
  CHECK(j.at("programs") == 2);  // the three unary kernels, and the fused one
  std::set<std::string> bundles;
  const nlohmann::json listed = jitcc_json({"list", "--cache-dir", cache.path().string()});
  for (const nlohmann::json& e : listed.at("entries")) {
    CAPTURE(e.at("op"));
    CHECK((e.at("label") == kPlanLabel) == (e.at("bundle") == ""));
    bundles.insert(e.at("bundle").get<std::string>());
  }
  CHECK(bundles.size() == 2);
  const nlohmann::json alone =
      jitcc_json({"warm", "--plan", file, "--arch", "sm_90", "--bundle", "1", "--cache-dir", cache.path().string()});
  CHECK(alone.at("cached") == 4);  // the same entries, whichever way they were compiled
  CHECK(alone.at("programs") == 4);
}

TEST_CASE("jitcc warm --timings: compile milliseconds per kernel family, a generated kernel's by its kind") {
  ScratchDir dir, cache;
  kiln::KernelPlan plan = two_kernel_plan();
  // A generated kernel named as the runtime names them: <kind>_<16 hex digits>.
  plan.kernels.push_back({"fused_0011223344556677", "u8", 0, "fused(kind,test) f32",
                          "// kiln kernel fused_0011223344556677 (u8) variant 0\n"
                          "extern \"C\" __global__ void kiln_fused(float* p) { p[threadIdx.x] -= 2.f; }\n"});
  const std::string file = (dir.path() / "run.plan").string();
  plan.save(file);
  const std::vector<std::string> args{"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache.path().string()};

  const nlohmann::json first = jitcc_json(args);
  REQUIRE(first.at("compiled") == 3);
  std::set<std::string> families;
  for (const nlohmann::json& f : first.at("families")) {
    families.insert(f.at("family").get<std::string>());
    CHECK(f.at("compiled") == 1);
    CHECK(f.at("median_ms").get<double>() > 0);
    CHECK(f.at("max_ms") == f.at("median_ms"));
    CHECK(f.at("total_ms") == f.at("median_ms"));
  }
  // relu's template; the kind of the runtime-named kernel; a name of another form as it is.
  CHECK(families == std::set<std::string>{"elementwise_unary", "fused", "fused_jitcc_plan_0001"});
  // Costliest first.
  for (std::size_t i = 1; i < first.at("families").size(); ++i)
    CHECK(first.at("families")[i - 1].at("total_ms").get<double>() >= first.at("families")[i].at("total_ms").get<double>());

  const nlohmann::json again = jitcc_json(args);  // all cached: nothing compiled, no family
  CHECK(again.at("families").empty());
  std::vector<std::string> timed = args;
  timed.push_back("--timings");
  const ProcessResult text = jitcc(timed);
  CHECK(text.exit_code == 0);
  CHECK(text.out.find("per family") != std::string::npos);
  CHECK(jitcc(args).out.find("per family") == std::string::npos);  // only with --timings
}

TEST_CASE("the debug log names a compiled kernel with its dtypes, a generated one by its label alone") {
  ScratchDir dir, cache;
  const std::string file = (dir.path() / "run.plan").string();
  two_kernel_plan().save(file);
  kiln_test::EnvOverrides env = child_env();
  for (auto& [name, value] : env)
    if (name == "KILN_LOG_LEVEL") value = "debug";
  const ProcessResult r = kiln_test::run_process(
      jitcc_argv({"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache.path().string()}), env);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string log = r.out + r.err;
  CHECK(log.find("compiled relu (f32,f32) for sm_90 in") != std::string::npos);
  // Its key holds the runtime's placeholder tuple, which names nothing a user chose.
  CHECK(log.find(std::string("compiled ") + kPlanLabel + " for sm_90 in") != std::string::npos);
  CHECK(log.find("(u8)") == std::string::npos);
}

TEST_CASE(
    "jitcc warm --plan: an unknown kernel, dtypes or variant and a broken source are named; a bad plan is a "
    "usage error") {
  ScratchDir dir, cache;
  kiln::KernelPlan plan;
  plan.kernels.push_back({"no_such_kernel", "f32", 0, "", ""});
  plan.kernels.push_back({"relu", "f32,i64", 0, "", ""});  // a tuple relu does not take
  plan.kernels.push_back({"relu", "f32,f32", 9, "", ""});  // nor that variant
  plan.kernels.push_back({"relu", "f32,f32", 0, "", ""});  // fine
  plan.kernels.push_back({"fused_jitcc_plan_broken", "u8", 0, "fused(broken) f32",
                          "extern \"C\" __global__ void kiln_fused() { this does not compile }\n"});
  const std::string file = (dir.path() / "bad.plan").string();
  plan.save(file);
  nlohmann::json j =
      jitcc_json({"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache.path().string()}, 1);
  CHECK(j.at("failed") == 4);
  CHECK(j.at("compiled") == 1);
  ProcessResult text = jitcc({"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache.path().string()});
  CHECK(text.exit_code == 1);
  CHECK(text.err.find("no_such_kernel") != std::string::npos);
  CHECK(text.err.find("dtypes (f32,i64) not supported") != std::string::npos);
  CHECK(text.err.find("variant 9 not supported") != std::string::npos);
  CHECK(text.err.find("fused(broken) f32") != std::string::npos);

  std::ofstream(dir.path() / "junk.plan") << "junk";
  ProcessResult junk = jitcc({"warm", "--plan", (dir.path() / "junk.plan").string(), "--arch", "sm_90"});
  CHECK(junk.exit_code == 2);
  CHECK(junk.err.find("junk.plan") != std::string::npos);
  ProcessResult absent = jitcc({"warm", "--plan", (dir.path() / "absent.plan").string(), "--arch", "sm_90"});
  CHECK(absent.exit_code == 2);
  ProcessResult with_ops = jitcc({"warm", "--plan", file, "--ops", "add", "--arch", "sm_90"});
  CHECK(with_ops.exit_code == 2);
  CHECK(with_ops.err.find("--ops") != std::string::npos);
}

TEST_CASE("a compile in a compile server gives the bytes an in-process compile gives, and its errors") {
  ScratchDir dir, served, in_process;
  const std::string file = (dir.path() / "run.plan").string();
  two_kernel_plan().save(file);
  for (const auto& [cache, mode] : {std::pair{&served, "0"}, std::pair{&in_process, "1"}}) {
    ProcessResult r = jitcc({"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", cache->path().string()},
                            {{"KILN_COMPILE_IN_PROCESS", mode}});
    CHECK(r.exit_code == 0);
  }
  const kiln::rt::DiskCache a(served.path(), kiln::rt::CacheMode::read_only, 0);
  const kiln::rt::DiskCache b(in_process.path(), kiln::rt::CacheMode::read_only, 0);
  const auto listed = a.list();
  REQUIRE(listed.size() == 2);
  for (const kiln::rt::EntryInfo& info : listed) {
    CAPTURE(info.key.op);
    const auto x = a.read(info.path);
    const auto y = b.read(b.dir() / info.path.parent_path().filename() / info.path.filename());
    REQUIRE(x);
    REQUIRE(y);
    CHECK(x->ptx == y->ptx);
    CHECK(x->cubin == y->cubin);
    CHECK_FALSE(x->cubin.empty());
  }

  kiln::KernelPlan broken;
  broken.kernels.push_back({"fused_jitcc_plan_broken", "u8", 0, "fused(broken) f32",
                            "extern \"C\" __global__ void kiln_fused() { this does not compile }\n"});
  broken.save(file);
  ProcessResult r = jitcc({"warm", "--plan", file, "--arch", "sm_90", "--cache-dir", served.path().string(), "--json"},
                          {{"KILN_COMPILE_IN_PROCESS", "0"}});
  CHECK(r.exit_code == 1);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  REQUIRE(j.at("failures").size() == 1);
  CHECK(j.at("failures")[0].at("error").get<std::string>().find("fused(broken) f32") != std::string::npos);
}

TEST_CASE("compile servers that cannot run cost no compile, and after three none is started") {
  ScratchDir dir, cache;
  const std::string file = (dir.path() / "run.plan").string();
  two_kernel_plan().save(file);
  // /bin/false ends before answering, as a server that cannot load NVRTC would.
  for (const char* server : {"/bin/false", "/nonexistent/kiln-nvrtc-server"}) {
    CAPTURE(server);
    ScratchDir fresh;
    ProcessResult r = jitcc({"warm", "--plan", file, "--arch", "sm_90", "-j", "1", "--cache-dir", fresh.path().string()},
                            {{"KILN_NVRTC_SERVER", server}});
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("2 compiled") != std::string::npos);
    const bool missing = std::string(server).find("nonexistent") != std::string::npos;
    CHECK((r.err.find("KILN_NVRTC_SERVER=") != std::string::npos) == missing);
  }
  // Three stillborn servers, then the warning, once, and the rest compile in-process.
  kiln::KernelPlan many;
  for (const char* op : {"add", "sub", "mul", "div"}) many.kernels.push_back({op, "f32,f32", 0, "", ""});
  many.save(file);
  ProcessResult r = jitcc(
      {"warm", "--plan", file, "--arch", "sm_90", "-j", "1", "--bundle", "1", "--cache-dir", cache.path().string()},
      {{"KILN_NVRTC_SERVER", "/bin/false"}});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("4 compiled") != std::string::npos);
  const std::string warning = "compile servers failed to start or ended before answering";
  const std::size_t at = r.err.find(warning);
  CHECK(at != std::string::npos);
  CHECK(r.err.find(warning, at + 1) == std::string::npos);
}
