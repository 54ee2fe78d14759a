// jitcc show --plan: a kernel plan's compiled steps, group by group, and KernelPlan's file
// keeping them (a plan written before steps were recorded still loads).
#include "jitcc_test_util.h"
#include "kiln/kiln.h"

using namespace jitcc_test;

namespace {

kiln::KernelPlan plan_with_a_step() {
  kiln::KernelPlan plan;
  plan.kernels.push_back({"relu", "f32,f32", 0, "", ""});
  kiln::KernelPlan::Step step{"grad|cuda:0|f32(64,32)", {}};
  step.groups.push_back({{"matmul"}, "(64,32)", "its own kernel: not a pointwise op", ""});
  step.groups.push_back({{"mul", "add", "relu"},
                         "(64,32)",
                         "one kernel writing 1 of 3 results",
                         "other work reads or writes a value it holds"});
  step.groups.push_back({{"sum"}, "()", "its own kernel: not a pointwise op", ""});
  plan.steps.push_back(step);
  return plan;
}

}  // namespace

TEST_CASE("KernelPlan keeps its steps' groups; one without steps loads with none; a broken step is named") {
  ScratchDir dir;
  const std::string file = (dir.path() / "run.plan").string();
  plan_with_a_step().save(file);
  const kiln::KernelPlan back = kiln::KernelPlan::load(file);
  REQUIRE(back.steps.size() == 1);
  CHECK(back.steps[0].signature == "grad|cuda:0|f32(64,32)");
  REQUIRE(back.steps[0].groups.size() == 3);
  const kiln::KernelPlan::Group& fused = back.steps[0].groups[1];
  CHECK(fused.ops == std::vector<std::string>{"mul", "add", "relu"});
  CHECK(fused.shape == "(64,32)");
  CHECK(fused.result == "one kernel writing 1 of 3 results");
  CHECK(fused.ended == "other work reads or writes a value it holds");
  CHECK(back.steps[0].groups[0].ended.empty());

  kiln::KernelPlan merged = plan_with_a_step();
  merged.merge(back);
  CHECK(merged.steps.size() == 2);  // a second pass's step is its own, even with the same signature

  std::ofstream(dir.path() / "old.plan")
      << R"({"kiln_kernel_plan": 1, "kernels": [{"op": "relu", "dtypes": "f32,f32", "variant": 0}]})";
  CHECK(kiln::KernelPlan::load((dir.path() / "old.plan").string()).steps.empty());
  std::ofstream(dir.path() / "broken.plan")
      << R"({"kiln_kernel_plan": 1, "kernels": [], "steps": [{"signature": "s", "groups": [{"ops": "mul"}]}]})";
  CHECK_THROWS_WITH_AS(kiln::KernelPlan::load((dir.path() / "broken.plan").string()), doctest::Contains("step 0"),
                       kiln::ValueError);
}

TEST_CASE("jitcc show --plan prints each step's groups and the choices to measure, as a table and as JSON") {
  ScratchDir dir;
  const std::string file = (dir.path() / "run.plan").string();
  kiln::KernelPlan plan = plan_with_a_step();
  const std::string problem = "m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 256";
  plan.measurements.push_back({"cublaslt", problem, "bf16"});
  plan.save(file);
  const ProcessResult text = jitcc({"show", "--plan", file});
  INFO(text.out << text.err);
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("step grad|cuda:0|f32(64,32): 3 groups, 1 of them fused") != std::string::npos);
  CHECK(text.out.find("mul, add, relu") != std::string::npos);
  CHECK(text.out.find("one kernel writing 1 of 3 results") != std::string::npos);
  CHECK(text.out.find("other work reads or writes a value it holds") != std::string::npos);
  // In the order they run: the product, the group, the sum.
  CHECK(text.out.find("matmul") < text.out.find("mul, add, relu"));
  CHECK(text.out.find("mul, add, relu") < text.out.find("sum"));
  CHECK(text.out.find("1 choice the tuner will measure at a first call") != std::string::npos);
  CHECK(text.out.find(problem) != std::string::npos);

  const nlohmann::json j = jitcc_json({"show", "--plan", file});
  REQUIRE(j.at("steps").size() == 1);
  REQUIRE(j.at("steps")[0].at("groups").size() == 3);
  CHECK(j.at("steps")[0].at("groups")[1].at("ops") == nlohmann::json{"mul", "add", "relu"});
  CHECK(j.at("steps")[0].at("groups")[1].at("result") == "one kernel writing 1 of 3 results");
  REQUIRE(j.at("measurements").size() == 1);
  CHECK(j.at("measurements")[0].at("problem") == problem);
  CHECK(j.at("measurements")[0].at("dtypes") == "bf16");
}

TEST_CASE("jitcc show --plan: a plan without steps, an op beside --plan and neither are usage errors") {
  ScratchDir dir;
  const std::string file = (dir.path() / "kernels.plan").string();
  kiln::KernelPlan kernels_only;
  kernels_only.kernels.push_back({"relu", "f32,f32", 0, "", ""});
  kernels_only.save(file);
  const ProcessResult none = jitcc({"show", "--plan", file});
  CHECK(none.exit_code == 2);
  CHECK(none.err.find("records no compiled step") != std::string::npos);
  const ProcessResult both = jitcc({"show", "relu", "--plan", file});
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("takes no op") != std::string::npos);
  const ProcessResult neither = jitcc({"show"});
  CHECK(neither.exit_code == 2);
  CHECK(neither.err.find("needs an op") != std::string::npos);
  const ProcessResult absent = jitcc({"show", "--plan", (dir.path() / "absent.plan").string()});
  CHECK(absent.exit_code == 2);
  CHECK(absent.err.find("absent.plan") != std::string::npos);
}
