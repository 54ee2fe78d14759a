// run_generated_conv: every generated kernel that can run a conv pass, with its tile
// alternatives, as candidates for kernels::run_tuned; the heuristic's pick (the order conv.cpp
// used before tuning: patch, then igemm; wgrad, wgrad_small, then igemm) is the reference.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/tuner.h"
#include "conv_igemm.h"
#include "core/registry.h"
#include "kiln/conv.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/templates.h"

namespace kiln::conv_detail {

namespace {

using kernels::TuneCandidate;

std::string problem_text(ConvPass pass, const ConvSizes& s) {
  static const char* passes[] = {"fwd", "dgrad", "wgrad"};
  std::string t = passes[static_cast<int>(pass)];
  for (std::int64_t v : {s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, s.groups})
    t.append(" ").append(std::to_string(v));
  return t;
}

// The kernels' sources decide what the candidates are: a changed template is a new question.
std::string library_text() {
  static const std::string text = [] {
    std::uint64_t h = rt::kFnvOffset;
    for (const char* name : {"conv_igemm", "conv_ffma", "conv_common", "conv_patch", "conv_wgrad", "conv_wgrad_small",
                             "mma", "prelude"})
      h = rt::fnv1a64(rt::template_source(name), h);
    return "kiln conv " + std::to_string(h);
  }();
  return text;
}

std::vector<TuneCandidate> candidates(ConvPass pass, const ConvSizes& s, const Tensor& a, const Tensor& b,
                                      const Tensor& out, const rt::DeviceInfo& info) {
  std::vector<TuneCandidate> c;
  const DType t = out.dtype();
  const int sms = std::max(1, info.sm_count), smem = std::max(48 * 1024, info.max_shared_optin);
  if (pass == ConvPass::grad_weight) {
    if (run_conv_wgrad(s, a, b, out, false)) c.push_back({"wgrad", [=] { run_conv_wgrad(s, a, b, out); }});
    if (run_conv_wgrad_small(s, a, b, out, false))
      c.push_back({"wgrad_small", [=] { run_conv_wgrad_small(s, a, b, out); }});
  } else {
    const bool flip = pass == ConvPass::grad_input;
    if (run_conv_patch(flip, s, a, b, out, 0, false)) {
      c.push_back({"patch", [=] { run_conv_patch(flip, s, a, b, out); }});
      for (int rows : patch_alternatives(flip, s, t, sms, smem))
        c.push_back({std::string("patch rows ").append(std::to_string(rows)),
                     [=] { run_conv_patch(flip, s, a, b, out, rows); }});
    }
  }
  // wgrad's igemm takes (gy, x); a and b come in the op's order (x, gy).
  const Tensor ia = pass == ConvPass::grad_weight ? b : a;
  const Tensor ib = pass == ConvPass::grad_weight ? a : b;
  if (run_conv_igemm(pass, s, ia, ib, out, {}, false)) {
    c.push_back({"igemm", [=] { run_conv_igemm(pass, s, ia, ib, out); }});
    for (ConvTiles tiles : igemm_alternatives(pass, s, t, sms))
      c.push_back({std::string("igemm ").append(std::to_string(tiles.bm)).append("x").append(std::to_string(tiles.bn)),
                   [=] { run_conv_igemm(pass, s, ia, ib, out, tiles); }});
  }
  return c;
}

}  // namespace

bool run_generated_conv(ConvPass pass, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return false;
  const rt::DeviceInfo* info = generated_conv_device({&out, &a, &b});
  if (!info) return false;
  const std::vector<TuneCandidate> c = candidates(pass, s, a, b, out, *info);
  if (c.empty()) return false;
  const DType t = out.dtype();
  const bool tf32 = t == DType::f32 && allow_conv_tf32();
  const rt::TuneKey key{"conv2d", problem_text(pass, s), std::string(dtype_name(t)).append(tf32 ? "/tf32" : ""),
                        info->arch(), library_text()};
  kernels::TuneCheck check;
  check.outputs.push_back({device_address(out), t, 1, out.numel(), out.numel()});
  // Low-precision products summed in other orders and splits; a wrong kernel is far off.
  check.tolerance = t == DType::bf16 ? 4e-2 : t == DType::f32 && !tf32 ? 1e-4 : 1e-2;
  kernels::run_tuned(key, c, check, stream_of(out.device()), true);  // alternatives cost compiles
  return true;
}

}  // namespace kiln::conv_detail
