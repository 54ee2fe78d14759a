// The fused pointwise family (backend/cuda/generated/fused) builds kernels that compile with
// NVRTC for random groups of the registry's pointwise ops: every dtype, casts between them,
// broadcast and repeated inputs, tensor-scalar operands, several stored results; runs without a
// GPU. tests/gpu/test_fusion_gpu.cpp checks their bits against the unfused ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/generated/fused/fused_kernels.h"
#include "compile_check.h"
#include "core/registry.h"
#include "kiln/error.h"
#include "kiln/runtime/generated_kernels.h"

using namespace kiln;
using kernels::FusedGroup;
using kernels::FusedInput;
using kernels::FusedOp;

namespace {

constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};

// Pointwise ops of `arity` whose output has their input's dtype and that take no attrs, by name.
std::vector<const OpDef*> same_dtype_ops(int arity) {
  std::vector<const OpDef*> out;
  for (const OpDef* op : registered_ops()) {
    const PointwiseExpr* pw = pointwise_expr(*op);
    if (!pw || op->num_inputs != arity || pw->params) continue;
    if (pw->domain == kernels::PointwiseDomain::numeric || pw->domain == kernels::PointwiseDomain::floating)
      out.push_back(op);
  }
  std::sort(out.begin(), out.end(), [](const OpDef* a, const OpDef* b) { return a->name < b->name; });
  return out;
}

bool takes(const OpDef& op, DType t) {
  return pointwise_expr(op)->domain == kernels::PointwiseDomain::numeric || is_floating(t);
}

// A random group: each op reads the last value or an earlier one of its dtype (or an outside
// input), casts change the dtype, a few ops take a scalar; the last value and a middle one stored.
FusedGroup random_group(std::mt19937& rng) {
  static const std::vector<const OpDef*> unary = same_dtype_ops(1), binary = same_dtype_ops(2);
  FusedGroup g;
  std::vector<DType> values;  // the dtype of each op's result
  g.outside.push_back(kDTypes[rng() % std::size(kDTypes)]);
  auto last = [&] { return values.empty() ? FusedInput{false, 0} : FusedInput{true, static_cast<int>(values.size()) - 1}; };
  auto dtype_of = [&](FusedInput in) { return in.from_op ? values[static_cast<std::size_t>(in.index)] : g.outside[static_cast<std::size_t>(in.index)]; };
  const int length = 2 + static_cast<int>(rng() % 7);
  for (int i = 0; i < length; ++i) {
    const FusedInput x = last();
    const DType t = dtype_of(x);
    const int r = static_cast<int>(rng() % 6);
    FusedOp op;
    op.in = op.out = t;
    op.inputs = {x};
    if (r == 0) {  // a cast
      op.name = "cast", op.expr = pointwise_expr(get_op("cast"))->expr;
      op.out = kDTypes[rng() % std::size(kDTypes)];
    } else if (r == 1) {  // a second operand: an earlier value of t, or a new outside input
      const OpDef* b = binary[rng() % binary.size()];
      if (!takes(*b, t)) b = &get_op("add");
      FusedInput y{false, static_cast<int>(g.outside.size())};
      for (std::size_t k = 0; k < values.size(); ++k)
        if (values[k] == t && rng() % 2) y = {true, static_cast<int>(k)};
      if (!y.from_op) g.outside.push_back(t);
      op.name = b->name, op.expr = pointwise_expr(*b)->expr, op.inputs.push_back(y);
    } else if (r == 2) {  // a tensor-scalar op
      op.name = "mul_scalar", op.expr = pointwise_expr(get_op("mul"))->expr;
      op.scalar = kernels::Scalar(rng() % 2 ? 3.0 : -1.5), op.scalar_first = rng() % 2;
    } else {
      const OpDef* u = unary[rng() % unary.size()];
      if (!takes(*u, t)) u = &get_op("neg");
      op.name = u->name, op.expr = pointwise_expr(*u)->expr;
    }
    values.push_back(op.out);
    g.ops.push_back(std::move(op));
  }
  g.stored = {length / 2, length - 1};
  return g;
}

}  // namespace

TEST_CASE("fused kernels compile for random groups over every dtype, casts and scalars included") {
  std::mt19937 rng(31);
  std::vector<kiln_test::CompileJob> jobs;
  std::vector<FusedGroup> groups;
  for (int trial = 0; trial < 24; ++trial) {
    groups.push_back(random_group(rng));
    const std::string src = kernels::fused_source(groups.back());
    CHECK(src.find("kiln_fused(kiln::Layout<" + std::to_string(groups.back().operands()) + "> L") != std::string::npos);
    for (int arch : {80, 90}) jobs.push_back(kiln_test::generated_job("check_fused", src, "kiln_fused", arch));
  }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("check_fused: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.ptx.find("kiln_fused") != std::string::npos);
    if (jobs[i].arch >= 90) CHECK(kiln_test::every_kernel_waits_for_prior_grids(o.ptx));
  }
}

TEST_CASE("a fused kernel rounds each f32 and f64 result apart: no fma across ops") {
  // mul then add, as two ops: the product must round before the sum (ptxas would contract a
  // plain mul and add into an fma, which the unfused kernels never see).
  for (DType t : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(t));
    FusedGroup g;
    g.outside = {t, t, t};
    g.ops.push_back({"mul", pointwise_expr(get_op("mul"))->expr, t, t, {}, {{false, 0}, {false, 1}}});
    g.ops.push_back({"add", pointwise_expr(get_op("add"))->expr, t, t, {}, {{true, 0}, {false, 2}}});
    g.stored = {1};
    const std::string src = kernels::fused_source(g);
    CHECK(src.find(t == DType::f32 ? "__fadd_rn(f0(" : "__dadd_rn(f0(") != std::string::npos);
    const kiln_test::CompileSummary r =
        kiln_test::compile_all({kiln_test::generated_job("check_fused", src, "kiln_fused", 90)});
    REQUIRE(r.outcomes[0].error.empty());
    const std::string& ptx = r.outcomes[0].ptx;
    CHECK(ptx.find(t == DType::f32 ? "fma.rn.f32" : "fma.rn.f64") == std::string::npos);
    CHECK(ptx.find(t == DType::f32 ? "add.rn.f32" : "add.rn.f64") != std::string::npos);
  }
}
