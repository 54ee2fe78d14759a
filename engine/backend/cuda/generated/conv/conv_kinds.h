#pragma once
// Each generated conv kind's planner, source builder and launcher; conv_plan.cpp dispatches
// on ConvKernel to these (family-internal).
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "conv_plan.h"
#include "kiln/runtime/kernel_registry.h"

namespace kiln::kernels::conv_kinds {

using Module = std::span<const rt::KernelSpec* const>;

std::optional<IgemmPlan> plan_igemm(ConvPass pass, const ConvGeometry& g, ConvMath math, const ConvTarget& target,
                                    ConvTile tile);
std::vector<ConvTile> igemm_alternatives(const ConvLaunch& h);
bool igemm_slower_than_fallback(const ConvLaunch& l);
std::string igemm_source(const ConvLaunch& l);
void launch_igemm(const ConvLaunch& l, const ConvOperands& ops, Module m);

std::optional<PatchPlan> plan_patch(ConvPass pass, const ConvGeometry& g, ConvMath math, const ConvTarget& target,
                                    int rows);
std::vector<ConvTile> patch_alternatives(const ConvLaunch& h, const ConvTarget& target);
std::optional<ConvLaunch> patch_with_totals(ConvLaunch l);
std::int64_t patch_stats_floats(const ConvLaunch& l);
std::optional<ConvLaunch> patch_with_pool_sums(ConvLaunch l, const ConvPoolSums& s, const ConvTarget& target);
std::int64_t patch_parked_splits(const ConvLaunch& l);
std::string patch_source(const ConvLaunch& l);
void launch_patch(const ConvLaunch& l, const ConvOperands& ops, Module m);

std::optional<WgradPlan> plan_wgrad(ConvPass pass, const ConvGeometry& g, ConvMath math, const ConvTarget& target);
std::string wgrad_source(const ConvLaunch& l);
void launch_wgrad(const ConvLaunch& l, const ConvOperands& ops, Module m);

std::optional<SmallWgradPlan> plan_wgrad_small(ConvPass pass, const ConvGeometry& g, DType t, ConvMath math,
                                               const ConvTarget& target);
std::string wgrad_small_source(const ConvLaunch& l);
void launch_wgrad_small(const ConvLaunch& l, const ConvOperands& ops, Module m);

std::optional<DirectPlan> plan_direct(ConvPass pass, const ConvGeometry& g, ConvMath math,
                                      const ConvTarget& target);
std::optional<ConvLaunch> direct_with_totals(ConvLaunch l, const ConvTarget& target);
std::int64_t direct_stats_floats(const ConvLaunch& l);
std::string direct_source(const ConvLaunch& l);
void launch_direct(const ConvLaunch& l, const ConvOperands& ops, Module m);

// The statistics a kind's forward takes (conv_stats.cu), from at most kMaxStatsBlocks blocks:
// stats_floats_of gives their f32 partials (2 * channels, blocks).
constexpr std::int64_t kMaxStatsBlocks = 65536;
std::int64_t stats_floats_of(std::int64_t blocks, std::int64_t channels);

// A stride-1 forward or input gradient as the forward conv it runs (the input gradient's over gy,
// its padding mirrored); none for other strides and the weight gradient.
std::optional<PatchConv> as_forward(ConvPass pass, const ConvGeometry& g);
// The sizes as the templates name them (N, C, H, ..., G), less those a template leaves out.
rt::Bindings size_bindings(const ConvGeometry& g, std::initializer_list<std::string_view> skip = {});
std::string num(std::int64_t v);

}  // namespace kiln::kernels::conv_kinds
