#pragma once
// The per-channel sums a conv2d forward wrote beside its output under a ConvStatsForBatchNorm
// (kiln/conv.h), kept on this thread for the batch norm that reads the output.
#include "kiln/tensor.h"

namespace kiln::conv_totals {

// Whether a ConvStatsForBatchNorm lives on this thread.
bool wanted();
// Keeps `totals` of y's channels, as y stands now: (2, C) f64, sums then sums of squares; or
// (2 * C, rows) f32, a row of partials for each of them (the batch norm adds them up).
void keep(const Tensor& y, Tensor totals);
// The totals kept for exactly x (same storage, place, shape and dtype, unwritten since), taken;
// undefined when none are.
Tensor take(const Tensor& x);

}  // namespace kiln::conv_totals
