#pragma once
// Runs one of several ways of doing the same GPU work, the one measured fastest for this exact
// problem. The first time a problem is seen (KILN_TUNE=on, outside a graph capture), every
// candidate runs once, its output is checked on the device against candidate 0's (the
// heuristic's pick, the reference; kernel_templates/tune_check.cu), and the ones that agree are
// timed; the fastest is remembered in memory and in the disk cache (rt::store_choice), so later
// calls and later processes run it without measuring.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/tuning.h"

namespace kiln::kernels {

struct TuneCandidate {
  std::string name;           // stable across processes: it is what the cache remembers
  std::function<void()> run;  // enqueues the work on the tuning stream
};

// Device memory every candidate writes: `lines` runs of `length` elements, `stride` apart.
struct TuneOutput {
  rt::DevicePtr ptr = 0;
  DType dtype = DType::f32;
  std::int64_t lines = 1, length = 0, stride = 0;
};

struct TuneCheck {
  std::vector<TuneOutput> outputs;
  // Largest |candidate - reference| accepted, as a share of the reference's largest magnitude.
  double tolerance = 1e-5;
};

struct TuneOutcome {
  std::size_t index = 0;  // the candidate that ran
  bool settled = true;    // false: a capture or shape-only pass ran the heuristic's pick, not yet measured
};

// What measuring the candidates compiles first (kernels generated for them), all at once on the
// prefetch threads: nothing, kernels measured only under KILN_TUNE=on, or kernels measured under
// auto too (a few, where they are likely to win).
enum class TuneCompiles { none, under_on, under_auto };

// Runs the chosen candidate on `s`. Candidate 0 runs when there is a single one, while
// capturing, with KILN_TUNE=off, or with nothing remembered where the mode does not measure:
// cached, or auto when the candidates compile only under on. Under auto with the quick tier on
// (quick_tier.h) it also runs, unsettled, while kernels the measurement needs are not yet
// compiled: they compile on the prefetch threads and a later call measures. A shape-only pass
// runs them all, so each kernel is planned, the others' after candidate 0's (callers whose work
// is not skipped in such a pass, library calls, must not come here in one).
TuneOutcome run_tuned(const rt::TuneKey& key, std::span<const TuneCandidate> candidates, const TuneCheck& check,
                      const rt::Stream& s, TuneCompiles compiles = TuneCompiles::none);

// Whether the candidate running now on this thread is run_tuned's outcome, whose output the
// caller keeps (not a measurement's run, nor a shape-only pass's planning of the others).
bool running_outcome();

// The problems a shape-only pass on this thread found the tuner will measure at their first
// call (no choice remembered), in order, each once; returned and forgotten. plan_kernels puts
// them in its plan, and prefetch_kernels measures the cuBLASLt ones ahead of the run.
struct PlannedMeasurement {
  std::string site, problem, dtypes;
};
std::vector<PlannedMeasurement> take_planned_measurements();

// The candidate to run, from each one's survey time in ms (infinity: rejected). A survey times
// a short span, so when several lie within 25% of the fastest, each of those is timed again by
// `again` over a longer span, its time in ms replaced, and the fastest second timing wins: the
// survey only sorts out the clearly slower ones, the cheap part of a cold run's tuning.
std::size_t fastest(std::vector<double>& ms, const std::function<double(std::size_t)>& again);

// Whether `got` agrees with `want` within `tolerance` of want's largest magnitude, NaNs in the
// same places; the values as doubles. The rule the device check follows, stated on the host for
// the tests.
bool outputs_agree(std::span<const double> want, std::span<const double> got, double tolerance);

}  // namespace kiln::kernels
