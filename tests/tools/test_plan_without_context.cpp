// A shape-only pass needs no CUDA context: mnist-train plans its runs under the test driver
// (tests/support/driver_shim.cpp), which answers device queries as an sm_90 GPU and refuses
// every call that needs a context. So a cold run plans and starts its compiles while the
// context is still being created, and this holds on machines without a GPU too.
#include <cstdlib>

#include "kiln/kernel_plan.h"
#include "mnist_train_util.h"

using namespace mnist_test;

namespace {

// Preloaded, so the process's dlopen of libcuda.so.1 finds it whatever the host has installed
// (under ASan too, which otherwise wants its runtime first in the list).
kiln_test::EnvOverrides test_driver() {
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string before = asan && *asan ? std::string(asan) + ":" : "";
  return {{"LD_PRELOAD", std::string(KILN_TEST_DRIVER_DIR) + "/libcuda.so.1"},
          {"ASAN_OPTIONS", before + "verify_asan_link_order=0"}};
}

}  // namespace

TEST_CASE("mnist-train --plan-only plans every model, precision and the speedrun with no CUDA context") {
  jitcc_test::ScratchDir scratch;
  kiln_test::EnvOverrides env = test_driver();
  env.emplace_back("KILN_CACHE_DIR", (scratch.path() / "cache").string());
  const std::vector<std::vector<std::string>> runs{{"--model", "mlp"},
                                                   {"--model", "mlp", "--precision", "bf16"},
                                                   {"--model", "cnn"},
                                                   {"--model", "cnn", "--precision", "tf32"},
                                                   {"--model", "cnn", "--precision", "bf16"},
                                                   {"--recipe", "speedrun"},
                                                   {"--recipe", "speedrun", "--eager"}};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::vector<std::string> args = runs[i];
    const std::string plan = (scratch.path() / ("run" + std::to_string(i) + ".plan")).string();
    args.insert(args.end(), {"--kernel-plan", plan, "--plan-only"});
    std::string flags;
    for (const std::string& a : runs[i]) flags += a + " ";
    CAPTURE(flags);
    const kiln_test::ProcessResult r = train(args, env);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.find("test driver: in use") != std::string::npos);
    CHECK(r.err.find("refused") == std::string::npos);  // the test driver names each call it refuses
    CHECK(r.out.find("kernel plan: ") != std::string::npos);
    const kiln::KernelPlan p = kiln::KernelPlan::load(plan);
    bool product = false, conv = false, fill = false;
    for (const kiln::KernelPlan::Kernel& k : p.kernels) {
      product = product || k.label.rfind("gemm ", 0) == 0;
      conv = conv || k.label.rfind("conv2d ", 0) == 0;
      fill = fill || k.op == "fill";
    }
    CHECK(fill);  // a template kernel
    // The per-shape kernels: the linear layers' generated candidates (the FFMA kind for exact
    // f32 and small 16-bit products, the warpgroup kind for TF32), and the convolutions.
    const bool tf32 = std::find(args.begin(), args.end(), "tf32") != args.end();
    if (runs[i][1] == "mlp" || tf32) CHECK(product);
    if (runs[i][1] != "mlp") CHECK(conv);
    CHECK(p.kernels.size() >= 20);
    // The speedrun's weight gradients: both convs' on the small kind's tensor-core kernel (conv2's
    // warps splitting its 216 taps), the output layer's weights and bias in one kernel.
    if (runs[i][0] == "--recipe") {
      int small = 0;
      bool narrow = false;
      for (const kiln::KernelPlan::Kernel& k : p.kernels) {
        small += k.label == "conv2d wgrad wgrad_small bf16";
        narrow = narrow || k.op == "narrow_linear_grad";
      }
      CHECK(small == 2);
      CHECK(narrow);
    }
    // The tuner's alternatives (exact f32's FFMA candidates beside cuBLASLt) and the kernels
    // that check them are marked late, and nothing the run launches whatever the tuner picks.
    bool late = false;
    for (const kiln::KernelPlan::Kernel& k : p.kernels) {
      late = late || k.late;
      if (k.late) CHECK((k.label.rfind("gemm ", 0) == 0 || k.op == "tune_scale" || k.op == "tune_compare"));
    }
    if (runs[i].size() == 2 && runs[i][1] == "mlp") CHECK(late);
    // The products the tuner will measure at their first call, for prefetch_kernels to measure
    // ahead: a linear layer's forward at least, named as the tuner's keys name them.
    bool forward = false;
    for (const kiln::KernelPlan::Measurement& m : p.measurements) {
      CHECK(m.site == "cublaslt");
      forward = forward || m.problem.find("epilogue relu_bias") != std::string::npos;
    }
    CHECK(forward);
  }
}

TEST_CASE("mnist-train under a driver without contexts: a run that needs the GPU fails naming the call") {
  Scratch s;
  const kiln_test::ProcessResult r = train({"--data", s.dir.path().string(), "--model", "mlp", "--epochs", "1"},
                                           {{"LD_LIBRARY_PATH", KILN_TEST_DRIVER_DIR}});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("test driver: in use") != std::string::npos);
  CHECK(r.err.find("refused") != std::string::npos);
  CHECK(r.err.find("CUDA_ERROR_INVALID_CONTEXT") != std::string::npos);
}
