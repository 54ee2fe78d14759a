// The GEMM family's source: kernel_templates/gemm_wgmma.cu with the shape, the tile, the
// warpgroup MMA instruction for the tile's width and the hooks filled in.
#include <string>

#include "gemm_internal.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

// mma(acc, da, db, accumulate): one m64nBNk(16 or 8) warpgroup MMA on shared-memory descriptors,
// accumulating into acc[0 .. BN/2) or, for the first k of a tile, overwriting it; mma_rs(acc, a,
// db, accumulate) the same with A's fragment in four registers (only REG_A kernels call it).
std::string mma_function(int bn, GemmMath math, bool a_mn, bool b_mn) {
  const int regs = bn / 2;
  const bool tf32 = tf32_mma(math);
  const std::string in = tf32 ? "tf32" : math_name(math);
  std::string outs, list;
  for (int r = 0; r < regs; ++r) {
    list += (r ? ", %" : "%") + num(r);
    outs += std::string(r ? ", " : "") + "\"+f\"(acc[" + num(r) + "])";
  }
  // The transpose immediates (1: MN-major) exist for 16-bit inputs only; with A in registers,
  // B's alone.
  const std::string shape = "m64n" + num(bn) + "k" + (tf32 ? "8" : "16");
  const std::string op = "wgmma.mma_async.sync.aligned." + shape + ".f32." + in + "." + in + " {" + list + "}, ";
  const std::string tail = tf32 ? "p, 1, 1;" : "p, 1, 1, " + num(a_mn) + ", " + num(b_mn) + ";";
  const std::string rs_tail = tf32 ? "p, 1, 1;" : "p, 1, 1, " + num(b_mn) + ";";
  const std::string a_regs = "{%" + num(regs) + ", %" + num(regs + 1) + ", %" + num(regs + 2) + ", %" + num(regs + 3) + "}";
  return "__device__ __forceinline__ void mma(float* acc, unsigned long long da, unsigned long long db, bool "
         "accumulate) {\n"
         "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" +
         num(regs + 2) + ", 0;\\n" + op + "%" + num(regs) + ", %" + num(regs + 1) + ", " + tail + "\\n}\\n\"\n    : " +
         outs + "\n    : \"l\"(da), \"l\"(db), \"r\"(static_cast<int>(accumulate)));\n}\n"
         "__device__ __forceinline__ void mma_rs(float* acc, const unsigned* a, unsigned long long db, bool "
         "accumulate) {\n"
         "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" +
         num(regs + 5) + ", 0;\\n" + op + a_regs + ", %" + num(regs + 4) + ", " + rs_tail + "\\n}\\n\"\n    : " +
         outs +
         "\n    : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(db), "
         "\"r\"(static_cast<int>(accumulate)));\n}";
}

}  // namespace

std::string prelude_for(const GemmGeometry& g, const GemmHooks& h) {
  bool f16 = false, bf16 = false;
  auto note = [&](DType t) {
    f16 = f16 || t == DType::f16;
    bf16 = bf16 || t == DType::bf16;
  };
  note(input_dtype(g.math));
  note(output_dtype(g));
  for (const auto* inputs : {h.epilogue ? &h.epilogue->inputs : nullptr, h.prologue ? &h.prologue->inputs : nullptr})
    if (inputs)
      for (const HookInput& in : *inputs) note(in.dtype);
  DTypes d{DType::f32};
  if (f16)
    d = bf16 ? DTypes{DType::f16, DType::bf16} : DTypes{DType::f16};
  else if (bf16)
    d = DTypes{DType::bf16};
  return rt::device_prelude(d);
}

rt::Bindings plain_product_bindings(const GemmLaunch& l) {
  const GemmGeometry& g = l.g;
  return {{"BM", num(l.bm)},
          {"BN", num(l.bn)},
          {"EPILOGUE", num(static_cast<int>(g.epilogue))},
          {"M", num(g.m)},
          {"N", num(g.n)},
          {"K", num(g.k)},
          {"LDA", num(g.lda)},
          {"LDB", num(g.ldb)},
          {"LDD", num(g.ldd)},
          {"A_MN", g.a_mn ? "true" : "false"},
          {"B_MN", g.b_mn ? "true" : "false"}};
}

std::string source(const GemmLaunch& l) {
  if (l.kernel == GemmKernel::mma_sync) return mma_source(l);
  if (l.kernel == GemmKernel::ffma) return ffma_source(l);
  if (l.kernel == GemmKernel::rowdot) return rowdot_source(l);
  const GemmGeometry& g = l.g;
  const GemmHooks hooks = hooks_of(g);
  const HookSource hs = hook_source(hooks);
  const GemmConv c = g.conv.value_or(GemmConv{});
  // Weight-gradient mode: `splits` problems of f32 partials over taps of channels (padded to
  // 64 and both operands MN-major where they are staged).
  const bool wgrad = g.conv && c.weight_grad;
  const WgradLayout w = wgrad_layout(g);
  const std::int64_t cols = wgrad ? c.r * c.s * w.channels : g.n;
  // A plain product transposed (TF32 with B MN-major) computes D^T: its A is B's matrix, read
  // into registers, and its B is A's.
  const bool swap = reg_a(l);
  const bool staged_a_mn = g.a_mn && !stage_a_transposed(g);  // as the kernel reads A
  const bool a_mn = (wgrad && !w.k_major) || (swap ? g.b_mn : staged_a_mn);
  const bool b_mn = (wgrad && !w.k_major) || (swap ? staged_a_mn : g.b_mn);
  const bool a_batched = !wgrad && g.batch > 1 && (swap ? g.batch_b : g.batch_a) > 0;
  const bool b_batched = !wgrad && g.batch > 1 && (swap ? g.batch_a : g.batch_b) > 0;
  const bool split = split_k(l), partials = wgrad || split;  // f32 partials, one D per split
  // Registers: the producer gives most of its own up; the consumers share the rest.
  const int consumers = l.bm / 64, consumer_regs = consumers == 1 ? 240 : 232;
  rt::Bindings b{{"PRELUDE", prelude_for(g, hooks)},
                 {"IN", std::string(cuda_storage_type(input_dtype(g.math)))},
                 {"OUT", std::string(cuda_storage_type(partials ? DType::f32 : output_dtype(g)))},
                 {"BM", num(l.bm)},
                 {"BN", num(l.bn)},
                 {"STAGES", num(l.stages)},
                 {"GROUP_M", num(l.group_m)},
                 {"M", num(g.m)},
                 {"N", num(cols)},
                 {"K", num(!g.conv || wgrad ? g.k : c.r * c.s * staged_channels(g))},
                 {"LDD", num(wgrad ? cols : g.ldd)},
                 {"BATCH", num(partials ? l.splits : g.batch)},
                 {"BATCH_D", num(partials ? (l.splits > 1 ? g.m * cols : 0) : g.batch > 1 ? g.batch_d : 0)},
                 {"SPLIT_K", split ? "true" : "false"},
                 {"A_MN", a_mn ? "true" : "false"},
                 {"A_BATCHED", a_batched ? "true" : "false"},
                 {"B_BATCHED", b_batched ? "true" : "false"},
                 {"B_MN", b_mn ? "true" : "false"},
                 {"MMA", mma_function(l.bn, g.math, a_mn, b_mn)},
                 {"HOOK_CONSTANTS", hs.constants},
                 {"HOOK_FUNCTIONS", hs.functions},
                 {"TF32_SPLIT", rt::template_source("tf32_split")},
                 {"CONSUMER_REGS", num(consumer_regs)}};
  b.insert(b.end(), {{"CONV_MODE", num(wgrad ? 2 : g.conv ? 1 : 0)},
                     {"CONV_C", num(wgrad ? w.channels : staged_channels(g))},
                     {"SPLIT_F32", split_in_kernel(g) ? "true" : "false"},
                     {"PAIRED", g.conv && c.paired ? "true" : "false"},
                     {"SPLIT_GY", g.conv && c.split_gy ? "true" : "false"},
                     {"TRANSPOSED", l.transposed ? "true" : "false"},
                     {"STAGED_STORES", staged_stores(l) ? "true" : "false"},
                     {"REG_A", swap ? "true" : "false"},
                     {"WGRAD_K_MAJOR", w.k_major ? "true" : "false"},
                     {"WGRAD_ROW", num(w.row)},
                     {"CONV_S", num(c.s)},
                     {"CONV_RS", num(c.r * c.s)},
                     {"CONV_PAD_H", num(c.pad_h)},
                     {"CONV_PAD_W", num(c.pad_w)},
                     {"CONV_OH", num(g.conv ? c.oh() : 0)},
                     {"CONV_OW", num(g.conv ? c.ow() : 0)},
                     {"CONV_IMAGES", num(wgrad ? g.batch : 0)},
                     {"BOX_H", num(l.box.h)},
                     {"BOX_W", num(l.box.w)}});
  return rt::instantiate("gemm_wgmma", rt::template_source("gemm_wgmma"), b);
}

}  // namespace kiln::kernels
