// A cuBLASLt product's tune-key text (the problem and dtypes that `jitcc show --tune` prints and a
// kernel plan's measurements carry) reads back into the same product, and text it does not
// write reads as nothing.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/cuda/gemm_lt_ahead.h"

using namespace kiln;
using kernels::LtEpilogue;
using kernels::LtMatmul;

TEST_CASE("cuBLASLt problem text: every field round-trips, and foreign text is refused") {
  std::vector<kernels::LtProblem> problems;
  LtMatmul fwd{.dtype = DType::f32,
               .m = 10,
               .n = 128,
               .k = 512,
               .trans_a = true,
               .lda = 512,
               .ldb = 512,
               .ldd = 10,
               .epilogue = LtEpilogue::bias};
  problems.push_back({fwd, {256, 256, 256, 256}, false});
  problems.push_back({fwd, {256, 16, 4, 256}, true});
  LtMatmul wgrad{.dtype = DType::bf16,
                 .out = DType::f32,
                 .m = 3136,
                 .n = 128,
                 .k = 96,
                 .trans_b = true,
                 .lda = 3136,
                 .ldb = 128,
                 .ldd = 3136,
                 .epilogue = LtEpilogue::bgrad_b};
  problems.push_back({wgrad, {256, 256, 256, 8}, false});
  LtMatmul relu{.dtype = DType::f16,
                .m = 512,
                .n = 96,
                .k = 784,
                .lda = 784,
                .ldb = 784,
                .ldd = 512,
                .epilogue = LtEpilogue::relu_bias};
  problems.push_back({relu, {256, 256, 256, 256}, false});
  LtMatmul masked{.dtype = DType::f32,  // an input gradient masked by the ReLU below
                  .m = 512,
                  .n = 128,
                  .k = 10,
                  .lda = 512,
                  .ldb = 10,
                  .ldd = 512,
                  .epilogue = LtEpilogue::relu_mask};
  problems.push_back({masked, {256, 256, 256, 256}, false});
  for (const kernels::LtProblem& p : problems) {
    const std::string problem = kernels::lt_problem_text(p.g, p.align), dtypes = kernels::lt_dtypes_text(p.g, p.tf32);
    CAPTURE(problem);
    CAPTURE(dtypes);
    const std::optional<kernels::LtProblem> back = kernels::parse_lt_problem(problem, dtypes);
    REQUIRE(back);
    const LtMatmul& g = back->g;
    CHECK(g.dtype == p.g.dtype);
    CHECK(g.out == p.g.out);
    CHECK((g.m == p.g.m && g.n == p.g.n && g.k == p.g.k));
    CHECK((g.lda == p.g.lda && g.ldb == p.g.ldb && g.ldd == p.g.ldd));
    CHECK((g.trans_a == p.g.trans_a && g.trans_b == p.g.trans_b));
    CHECK(g.epilogue == p.g.epilogue);
    CHECK(back->align == p.align);
    CHECK(back->tf32 == p.tf32);
  }
  CHECK(kernels::lt_problem_text(fwd, {256, 256, 256, 256}) ==
        "m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 256");
  CHECK(kernels::lt_dtypes_text(wgrad, false) == "bf16->f32");
  CHECK(kernels::lt_dtypes_text(fwd, true) == "f32/tf32");

  const std::string good = "m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 256";
  CHECK(kernels::parse_lt_problem(good, "f32"));
  for (const std::string& bad :
       {std::string("m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256"),
        std::string("m10 n128 k512 lda512 ldb512 ldd10 At B epilogue gelu align 256 256 256 256"),
        std::string("m10 n128 k0 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 256"),
        std::string("m10 n128 k512 lda512 ldb512 ldd10 Ax B epilogue bias align 256 256 256 256"),
        std::string("m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 96"),
        std::string("m10 n128 k5x2 lda512 ldb512 ldd10 At B epilogue bias align 256 256 256 256"), good + " extra"}) {
    CAPTURE(bad);
    CHECK_FALSE(kernels::parse_lt_problem(bad, "f32"));
  }
  for (const char* bad : {"f33", "bf16/tf32", "f32->f32", "f32->"}) {
    CAPTURE(bad);
    CHECK_FALSE(kernels::parse_lt_problem(good, bad));
  }
}
