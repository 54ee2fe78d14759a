// ConvKernel's dispatch to the kinds, and each launch's generated module: keyed by the kind,
// pass, arithmetic, dtype, the kind's plan words and the sizes; its source built on a miss.
#include "conv_plan.h"

#include <algorithm>

#include "conv_kinds.h"

namespace kiln::kernels {

namespace {

// The module key's kind: a static string per ConvKernel.
const char* module_kind(ConvKernel k) {
  static const char* kinds[] = {"conv_igemm", "conv_patch", "conv_wgrad", "conv_wgrad_small", "conv_direct"};
  return kinds[static_cast<int>(k)];
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;  // clang 14 deduces no aggregate's arguments

conv_kinds::Module module_of(const ConvLaunch& l) {
  rt::GeneratedKey key(module_kind(l.kernel));
  key.add(l.pass, l.math, l.dtype);
  std::visit(Overloaded{[&](const IgemmPlan& p) { key.add(p.bm, p.bn, p.splitk); },
                        [&](const PatchPlan& p) {
                          key.add(p.rows, p.bn, p.totals, p.pool_sums, p.pool_p, p.pool_h, p.pool_w, p.pool_copy);
                        },
                        [&](const WgradPlan& p) { key.add(p.bc, p.ipb); },
                        [&](const SmallWgradPlan& p) { key.add(p.ipb, p.bands, p.mma, p.split_taps, p.f32_out); },
                        [&](const DirectPlan& p) { key.add(p.ot, p.p, p.rows, p.threads, p.mma, p.totals); }},
             l.plan);
  l.g.add_to(key);
  return rt::generated_kernels(key, [&] {
    std::string label = std::string("conv2d ") + pass_name(l.pass) + " " + kernel_name(l.kernel) + " " +
                        math_name(l.math);
    return rt::GeneratedModule{source(l), std::move(label), entry_points(l)};
  });
}

}  // namespace

const char* kernel_name(ConvKernel k) {
  static const char* names[] = {"igemm", "patch", "wgrad", "wgrad_small", "direct"};
  return names[static_cast<int>(k)];
}

std::string ConvTile::text() const {
  if (rows > 0) return "rows " + std::to_string(rows);
  if (bm > 0) return std::to_string(bm) + "x" + std::to_string(bn);
  return {};
}

std::optional<ConvLaunch> plan(ConvKernel k, ConvPass pass, const ConvGeometry& g, DType t, ConvMath math,
                               const ConvTarget& target, ConvTile tile) {
  std::optional<std::variant<IgemmPlan, PatchPlan, WgradPlan, SmallWgradPlan, DirectPlan>> p;
  switch (k) {
    case ConvKernel::igemm:
      if (auto q = conv_kinds::plan_igemm(pass, g, math, target, tile)) p = *q;
      break;
    case ConvKernel::patch:
      if (auto q = conv_kinds::plan_patch(pass, g, math, target, tile.rows)) p = *q;
      break;
    case ConvKernel::wgrad:
      if (auto q = conv_kinds::plan_wgrad(pass, g, math, target)) p = *q;
      break;
    case ConvKernel::wgrad_small:
      if (auto q = conv_kinds::plan_wgrad_small(pass, g, t, math, target)) p = *q;
      break;
    case ConvKernel::direct:
      if (auto q = conv_kinds::plan_direct(pass, g, math, target)) p = *q;
      break;
  }
  if (!p) return std::nullopt;
  return ConvLaunch{k, pass, g, t, math, std::move(*p)};
}

std::optional<ConvLaunch> with_totals(const ConvLaunch& l, const ConvTarget& target) {
  if (l.kernel == ConvKernel::direct) return conv_kinds::direct_with_totals(l, target);
  if (l.kernel == ConvKernel::patch) return conv_kinds::patch_with_totals(l);
  return std::nullopt;
}

std::int64_t stats_floats(const ConvLaunch& l) {
  if (l.kernel == ConvKernel::direct) return conv_kinds::direct_stats_floats(l);
  if (l.kernel == ConvKernel::patch) return conv_kinds::patch_stats_floats(l);
  return 0;
}

std::optional<ConvLaunch> with_pool_sums(const ConvLaunch& l, const ConvPoolSums& s, const ConvTarget& target) {
  if (l.kernel == ConvKernel::patch) return conv_kinds::patch_with_pool_sums(l, s, target);
  return std::nullopt;
}

std::int64_t parked_splits(const ConvLaunch& l) {
  if (l.kernel == ConvKernel::patch) return conv_kinds::patch_parked_splits(l);
  return l.kernel == ConvKernel::direct ? conv_kinds::direct_stats_floats(l) / (2 * l.g.o) : 0;
}

bool slower_than_fallback(const ConvLaunch& l) {
  return l.kernel == ConvKernel::igemm && conv_kinds::igemm_slower_than_fallback(l);
}

std::vector<ConvTile> alternatives(const ConvLaunch& h, const ConvTarget& target) {
  if (h.kernel == ConvKernel::igemm) return conv_kinds::igemm_alternatives(h);
  if (h.kernel == ConvKernel::patch) return conv_kinds::patch_alternatives(h, target);
  return {};
}

std::string source(const ConvLaunch& l) {
  switch (l.kernel) {
    case ConvKernel::igemm: return conv_kinds::igemm_source(l);
    case ConvKernel::patch: return conv_kinds::patch_source(l);
    case ConvKernel::wgrad: return conv_kinds::wgrad_source(l);
    case ConvKernel::wgrad_small: return conv_kinds::wgrad_small_source(l);
    case ConvKernel::direct: return conv_kinds::direct_source(l);
  }
  return {};
}

std::vector<std::string> entry_points(const ConvLaunch& l) {
  switch (l.kernel) {
    case ConvKernel::igemm: return {l.math == ConvMath::f32 ? "kiln_conv_ffma" : "kiln_conv_igemm"};
    case ConvKernel::patch:
      return {"kiln_conv_patch"};
    case ConvKernel::wgrad: return {"kiln_conv_wgrad", "kiln_conv_wgrad_reduce"};
    case ConvKernel::wgrad_small: return {"kiln_conv_wgrad_small", "kiln_conv_wgrad_small_reduce"};
    case ConvKernel::direct: return {"kiln_conv_direct"};
  }
  return {};
}

void launch(const ConvLaunch& l, const ConvOperands& ops) {
  const conv_kinds::Module m = module_of(l);
  switch (l.kernel) {
    case ConvKernel::igemm: return conv_kinds::launch_igemm(l, ops, m);
    case ConvKernel::patch: return conv_kinds::launch_patch(l, ops, m);
    case ConvKernel::wgrad: return conv_kinds::launch_wgrad(l, ops, m);
    case ConvKernel::wgrad_small: return conv_kinds::launch_wgrad_small(l, ops, m);
    case ConvKernel::direct: return conv_kinds::launch_direct(l, ops, m);
  }
}

namespace conv_kinds {

std::string num(std::int64_t v) { return std::to_string(v); }

std::int64_t stats_floats_of(std::int64_t blocks, std::int64_t channels) { return 2 * channels * blocks; }

std::optional<PatchConv> as_forward(ConvPass pass, const ConvGeometry& s) {
  if (s.sh != 1 || s.sw != 1 || pass == ConvPass::grad_weight) return std::nullopt;
  if (pass == ConvPass::forward)
    return PatchConv{s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.ph, s.pw, s.dh, s.dw, s.groups};
  const std::int64_t ph = s.dh * (s.kh - 1) - s.ph, pw = s.dw * (s.kw - 1) - s.pw;
  if (ph < 0 || pw < 0) return std::nullopt;
  return PatchConv{s.n, s.o, s.oh, s.ow, s.c, s.kh, s.kw, s.h, s.w, ph, pw, s.dh, s.dw, s.groups};
}

rt::Bindings size_bindings(const ConvGeometry& g, std::initializer_list<std::string_view> skip) {
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"N", g.n},   {"C", g.c},   {"H", g.h},   {"W", g.w},   {"O", g.o},   {"KH", g.kh}, {"KW", g.kw}, {"OH", g.oh},
      {"OW", g.ow}, {"SH", g.sh}, {"SW", g.sw}, {"PH", g.ph}, {"PW", g.pw}, {"DH", g.dh}, {"DW", g.dw}, {"G", g.groups}};
  rt::Bindings b;
  for (const auto& [name, v] : sizes)
    if (std::find(skip.begin(), skip.end(), name) == skip.end()) b.push_back({name, num(v)});
  return b;
}

}  // namespace conv_kinds

}  // namespace kiln::kernels
