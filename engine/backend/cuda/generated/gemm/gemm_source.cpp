// The GEMM family's source: kernel_templates/gemm_wgmma.cu with the shape, the tile, the
// warpgroup MMA instruction for the tile's width and the epilogue filled in.
#include <string>

#include "gemm_plan.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

const char* type_name(GemmMath m) {
  static const char* names[] = {"__nv_bfloat16", "__half", "float"};
  return names[static_cast<int>(m)];
}

// mma(acc, da, db, accumulate): one m64nBNk(16 or 8) warpgroup MMA on shared-memory descriptors,
// accumulating into acc[0 .. BN/2) or, for the first k of a tile, overwriting it.
std::string mma_function(int bn, GemmMath math, bool a_mn, bool b_mn) {
  const int regs = bn / 2;
  const bool tf32 = math == GemmMath::tf32;
  const std::string in = math_name(math);
  std::string outs, list;
  for (int r = 0; r < regs; ++r) {
    list += (r ? ", %" : "%") + num(r);
    outs += std::string(r ? ", " : "") + "\"+f\"(acc[" + num(r) + "])";
  }
  // The transpose immediates (1: MN-major) exist for 16-bit inputs only.
  const std::string shape = "m64n" + num(bn) + "k" + (tf32 ? "8" : "16");
  const std::string tail = tf32 ? "p, 1, 1;" : "p, 1, 1, " + num(a_mn) + ", " + num(b_mn) + ";";
  return "__device__ __forceinline__ void mma(float* acc, unsigned long long da, unsigned long long db, bool "
         "accumulate) {\n"
         "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" +
         num(regs + 2) + ", 0;\\nwgmma.mma_async.sync.aligned." + shape + ".f32." + in + "." + in + " {" + list +
         "}, %" + num(regs) + ", %" + num(regs + 1) + ", " + tail + "\\n}\\n\"\n    : " + outs +
         "\n    : \"l\"(da), \"l\"(db), \"r\"(static_cast<int>(accumulate)));\n}";
}

struct EpilogueText {
  std::string params, args, body;
};

EpilogueText epilogue_text(GemmEpilogue e) {
  if (e == GemmEpilogue::none) return {};
  EpilogueText t{", const Out* __restrict__ bias", ", bias", "v += kiln::cvt<float>(bias[col]);"};
  if (e == GemmEpilogue::relu_bias)
    t.body += "\n  v = v != v || v > 0.f ? v : 0.f;  // NaN stays NaN, as relu keeps it";
  return t;
}

}  // namespace

std::string source(const GemmLaunch& l) {
  const GemmGeometry& g = l.g;
  const EpilogueText e = epilogue_text(g.epilogue);
  // Registers: the producer gives most of its own up; the consumers share the rest.
  const int consumers = l.bm / 64, consumer_regs = consumers == 1 ? 240 : 232;
  const rt::Bindings b{{"PRELUDE", rt::device_prelude(DTypes{input_dtype(g.math)})},
                       {"IN", type_name(g.math)},
                       {"OUT", type_name(g.math)},
                       {"BM", num(l.bm)},
                       {"BN", num(l.bn)},
                       {"STAGES", num(l.stages)},
                       {"GROUP_M", num(l.group_m)},
                       {"M", num(g.m)},
                       {"N", num(g.n)},
                       {"K", num(g.k)},
                       {"LDD", num(g.ldd)},
                       {"BATCH", num(g.batch)},
                       {"BATCH_D", num(g.batch > 1 ? g.batch_d : 0)},
                       {"A_MN", g.a_mn ? "true" : "false"},
                       {"A_BATCHED", g.batch > 1 && g.batch_a > 0 ? "true" : "false"},
                       {"B_BATCHED", g.batch > 1 && g.batch_b > 0 ? "true" : "false"},
                       {"B_MN", g.b_mn ? "true" : "false"},
                       {"MMA", mma_function(l.bn, g.math, g.a_mn, g.b_mn)},
                       {"EPILOGUE_PARAMS", e.params},
                       {"EPILOGUE", e.body},
                       {"EPILOGUE_ARGS", e.args},
                       {"CONSUMER_REGS", num(consumer_regs)}};
  return rt::instantiate("gemm_wgmma", rt::template_source("gemm_wgmma"), b);
}

}  // namespace kiln::kernels
