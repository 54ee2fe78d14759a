// run_tuned: the measuring side of rt::tuning's store.
#include "tuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

#include "backend/cuda/gemm_lt_ahead.h"
#include "backend/cuda/launch_common.h"
#include "kiln/error.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/quick_tier.h"

namespace kiln::kernels {

namespace {

const rt::KernelSpec& kScale = register_float_spec("tune_scale", "tune_check", "kiln_tune_scale", "ACC");
const rt::KernelSpec& kCompare = register_float_spec("tune_compare", "tune_check", "kiln_tune_compare", "ACC");

thread_local bool t_running_outcome = false;

// Marks the candidate run in its scope as run_tuned's outcome (running_outcome).
struct OutcomeRun {
  OutcomeRun() : before(t_running_outcome) { t_running_outcome = true; }
  ~OutcomeRun() { t_running_outcome = before; }
  OutcomeRun(const OutcomeRun&) = delete;
  OutcomeRun& operator=(const OutcomeRun&) = delete;
  bool before;
};

std::int64_t span_elements(const TuneOutput& o) { return o.lines > 0 ? (o.lines - 1) * o.stride + o.length : 0; }

// The reference's outputs kept on the device, the limit a candidate's elements must keep to, and
// the two words the check kernels write: [0] the reference's largest finite magnitude (its bits),
// [1] how many elements disagree.
struct DeviceCheck {
  std::vector<rt::DeviceBuffer> want;
  rt::DeviceBuffer words;
  double limit = 0;
};

std::uint64_t read_word(const rt::DeviceBuffer& words, int i, const rt::Stream& s) {
  std::uint64_t w = 0;
  rt::copy_to_host(&w, words.ptr() + static_cast<rt::DevicePtr>(i) * 8, 8, s);
  s.synchronize();
  return w;
}

// What candidate 0 just wrote, as the reference.
DeviceCheck reference_check(const TuneCheck& c, const rt::Stream& s) {
  DeviceCheck d;
  d.words = rt::DeviceBuffer(16, s);
  rt::memset_device(d.words.ptr(), 0, 16, s);
  for (const TuneOutput& o : c.outputs) {
    if (o.dtype != DType::f32 && o.dtype != DType::f64 && o.dtype != DType::f16 && o.dtype != DType::bf16)
      throw DTypeError("[tune] outputs of dtype " + std::string(dtype_name(o.dtype)) + " are not checked");
    const std::size_t bytes = static_cast<std::size_t>(span_elements(o)) * dtype_size(o.dtype);
    d.want.emplace_back(std::max<std::size_t>(bytes, 1), s);
    if (bytes == 0) continue;
    rt::copy_device(d.want.back().ptr(), o.ptr, bytes, s);
    rt::launch(rt::get_function(kScale, DTypes{o.dtype}, 0, s.device()),
               grid_stride_config(static_cast<std::uint64_t>(o.lines * o.length), s.device()), s, o.ptr,
               static_cast<long long>(o.lines), static_cast<long long>(o.length), static_cast<long long>(o.stride),
               d.words.ptr());
  }
  const std::uint64_t bits = read_word(d.words, 0, s);
  double scale;
  std::memcpy(&scale, &bits, 8);
  d.limit = c.tolerance * std::max(scale, std::numeric_limits<double>::min());
  return d;
}

// Whether the outputs a candidate just wrote agree with the reference (outputs_agree's rules).
bool agrees(const DeviceCheck& d, const TuneCheck& c, const rt::Stream& s) {
  rt::memset_device(d.words.ptr() + 8, 0, 8, s);
  for (std::size_t i = 0; i < c.outputs.size(); ++i) {
    const TuneOutput& o = c.outputs[i];
    if (o.lines * o.length == 0) continue;
    rt::launch(rt::get_function(kCompare, DTypes{o.dtype}, 0, s.device()),
               grid_stride_config(static_cast<std::uint64_t>(o.lines * o.length), s.device()), s, d.want[i].ptr(),
               o.ptr, static_cast<long long>(o.lines), static_cast<long long>(o.length),
               static_cast<long long>(o.stride), d.limit, d.words.ptr() + 8);
  }
  return read_word(d.words, 1, s) == 0;
}

// A survey's span of GPU time per candidate, and a contender's (fastest's second timing).
constexpr double kSurveySpanMs = 0.2, kContenderSpanMs = 1.0;

// Milliseconds per run of `run` on the GPU: enough runs to span about `span_ms`, captured into
// a graph and replayed, so that the host's cost of launching (which a compiled step never
// pays, and which made a library call of 4 us look like 9) does not decide. Timed back to back
// on the stream instead when the runs cannot be captured.
double time_ms(const std::function<void()>& run, const rt::Stream& s, double span_ms) {
  rt::Event start = rt::Event::create(s.device(), true), stop = rt::Event::create(s.device(), true);
  auto timed = [&](int reps, const std::function<void()>& work) {
    start.record(s);
    work();
    stop.record(s);
    stop.synchronize();
    return static_cast<double>(stop.elapsed_ms_since(start)) / reps;
  };
  auto eager = [&](int reps) {
    return timed(reps, [&] {
      for (int i = 0; i < reps; ++i) run();
    });
  };
  const double once = eager(1);
  const int reps = static_cast<int>(std::clamp(span_ms / std::max(once, 1e-4), 3.0, 50.0));
  try {
    rt::begin_capture(s);
    try {
      for (int i = 0; i < reps; ++i) run();
    } catch (...) {
      rt::abort_capture(s);
      throw;
    }
    const rt::Graph g = rt::Graph::end_capture(s);
    g.launch(s);  // the first replay uploads and warms
    return timed(reps, [&] { g.launch(s); });
  } catch (const Error& e) {
    rt::log().debug("[tune] timing without a graph: {}", e.what());
    return std::min(once, eager(reps));
  }
}

// Compiles every candidate's kernels at once on the prefetch threads, instead of one NVRTC
// compile after another as each first runs, and waits for those alone: a cold run's plan is
// queued on the same threads, and the run waits for a product measured ahead of it.
void compile_all(std::span<const TuneCandidate> candidates) {
  std::vector<rt::KernelRequest> requests;
  {
    rt::ShapeOnlyPass pass;
    for (const TuneCandidate& c : candidates) c.run();
    requests = pass.requests();
  }
  for (rt::KernelRequest& r : requests) r.late = true;  // full builds: they are to be timed
  rt::prefetch(requests);
  // Each waits for its prefetch thread's load, or loads here if none has started it.
  for (const rt::KernelRequest& r : requests) (void)rt::get_function(*r.spec, r.dtypes, r.variant, r.device);
}

// The kernels a measurement of the candidates needs besides the first one's: the others', and
// the two that check their outputs, as late requests of the pass that is on.
void plan_measuring(std::span<const TuneCandidate> candidates, const TuneCheck& check, const rt::Stream& s) {
  const rt::LateRequests late;
  for (std::size_t i = 1; i < candidates.size(); ++i) candidates[i].run();
  for (const TuneOutput& o : check.outputs) {
    rt::get_function(kScale, DTypes{o.dtype}, 0, s.device());
    rt::get_function(kCompare, DTypes{o.dtype}, 0, s.device());
  }
}

// Under KILN_TUNE=auto a problem is measured only once every kernel that takes is loaded or in
// the disk cache. Until then the missing ones compile on the prefetch threads (queued once) and
// the heuristic's pick runs unsettled, so a cold run's first steps do not wait for kernels they
// may never choose; a later call measures and stores the choice.
bool measurable_now(const rt::TuneKey& key, std::span<const TuneCandidate> candidates, const TuneCheck& check,
                    const rt::Stream& s) {
  static std::mutex mu;
  static std::set<std::string> queued;  // problems whose missing kernels the prefetch threads have
  const std::string problem = key.site + "|" + key.problem + "|" + key.dtypes;
  bool was_queued;
  {
    std::lock_guard lock(mu);
    was_queued = queued.count(problem) > 0;
  }
  std::vector<rt::KernelRequest> requests;
  {
    rt::ShapeOnlyPass pass;
    plan_measuring(candidates, check, s);
    requests = pass.requests();
  }
  std::vector<rt::KernelRequest> missing;
  for (const rt::KernelRequest& r : requests)  // once queued, only loads remain to be seen
    if (!rt::function_if_cached(*r.spec, r.dtypes, r.variant, r.device, !was_queued)) missing.push_back(r);
  if (missing.empty()) return true;
  if (!was_queued) {
    rt::log().debug("[tune] {} {}: {} kernels to compile before measuring; the heuristic's pick runs meanwhile",
                    key.site, key.problem, missing.size());
    rt::prefetch(std::move(missing));
    std::lock_guard lock(mu);
    queued.insert(problem);
  }
  return false;
}

thread_local std::vector<PlannedMeasurement> t_planned;

void note_planned(const rt::TuneKey& key) {
  for (const PlannedMeasurement& m : t_planned)
    if (m.site == key.site && m.problem == key.problem && m.dtypes == key.dtypes) return;
  t_planned.push_back({key.site, key.problem, key.dtypes});
}

}  // namespace

std::vector<PlannedMeasurement> take_planned_measurements() { return std::exchange(t_planned, {}); }

bool outputs_agree(std::span<const double> want, std::span<const double> got, double tolerance) {
  if (want.size() != got.size()) return false;
  double scale = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  const double limit = tolerance * std::max(scale, std::numeric_limits<double>::min());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) return false;
    } else if (std::isinf(w) || std::isinf(g)) {
      if (w != g) return false;
    } else if (std::abs(w - g) > limit) {
      return false;
    }
  }
  return true;
}

std::size_t fastest(std::vector<double>& ms, const std::function<double(std::size_t)>& again) {
  if (ms.empty()) throw ValueError("[tune] no candidate times to choose from");
  const auto surveyed = std::min_element(ms.begin(), ms.end());
  const double limit = 1.25 * *surveyed;
  if (std::count_if(ms.begin(), ms.end(), [&](double t) { return t < limit; }) < 2)
    return static_cast<std::size_t>(surveyed - ms.begin());  // a clear winner
  std::size_t best = 0;
  double best_ms = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (!(ms[i] < limit)) continue;
    ms[i] = again(i);
    if (ms[i] < best_ms) best_ms = ms[i], best = i;
  }
  return best;
}

bool running_outcome() { return t_running_outcome; }

TuneOutcome run_tuned(const rt::TuneKey& key, std::span<const TuneCandidate> candidates, const TuneCheck& check,
                      const rt::Stream& s, TuneCompiles compiles) {
  if (candidates.empty()) throw ValueError("[tune] " + key.site + ": no candidates for " + key.problem);
  auto run = [&](std::size_t i, bool settled = true) {
    const OutcomeRun outcome;
    candidates[i].run();
    return TuneOutcome{i, settled};
  };
  if (candidates.size() == 1) return run(0);
  auto run_choice = [&](const std::optional<rt::TuneChoice>& c) -> std::optional<TuneOutcome> {
    for (std::size_t i = 0; c && i < candidates.size(); ++i)
      if (candidates[i].name == c->variant) return run(i);
    return std::nullopt;
  };
  if (std::optional<TuneOutcome> remembered = run_choice(rt::find_choice(key))) return *remembered;
  const rt::TuneMode mode = rt::tune_mode();
  const bool measure = mode == rt::TuneMode::on || (mode == rt::TuneMode::auto_ && compiles != TuneCompiles::under_on);
  if (rt::shape_only()) {
    if (!measure) return run(0);
    (void)run(0);
    plan_measuring(candidates, check, s);  // planned after what the run certainly launches
    note_planned(key);
    return {0, false};
  }
  run_reaches_products();  // whatever is measured ahead stops: this thread's work is on the GPU now
  if (!measure) return run(0);
  if (rt::thread_capturing()) return run(0, false);
  if (mode == rt::TuneMode::auto_ && rt::quick_tier() && !measurable_now(key, candidates, check, s))
    return run(0, false);

  const rt::TuneMeasureLock measuring_here(key);  // a node's ranks measure a problem once and agree
  if (std::optional<TuneOutcome> stored = run_choice(rt::find_stored_choice(key))) return *stored;
  const auto measuring = std::chrono::steady_clock::now();
  const rt::FullTierOnly full;           // quick builds would time slower than what later runs launch
  if (compiles != TuneCompiles::none) compile_all(candidates);  // library candidates run in the pass, unplanned
  candidates[0].run();
  const DeviceCheck reference = reference_check(check, s);
  const double unset = std::numeric_limits<double>::infinity();
  std::vector<double> ms(candidates.size(), unset);  // unset: rejected
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (i > 0) {
      candidates[i].run();
      if (!agrees(reference, check, s)) {
        rt::log().warn("[tune] {} {}: candidate '{}' disagrees with '{}'; not used", key.site, key.problem,
                       candidates[i].name, candidates[0].name);
        continue;
      }
    }
    ms[i] = time_ms(candidates[i].run, s, kSurveySpanMs);
  }
  const std::size_t best = fastest(ms, [&](std::size_t i) { return time_ms(candidates[i].run, s, kContenderSpanMs); });
  std::string detail;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    detail += candidates[i].name + (ms[i] == unset ? std::string(": rejected, its output disagrees with the reference\n")
                                                   : ": " + std::to_string(ms[i] * 1e3) + " us\n");
  (void)run(best);  // the output is the chosen candidate's, as in every later call
  rt::store_choice(key, {candidates[best].name, detail});
  const double spent = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - measuring).count();
  rt::count_measured_choice(spent, measuring_ahead());
  rt::log().debug("[tune] {} {} ({}): {} candidates measured in {:.1f} ms, '{}' runs", key.site, key.problem,
                  key.dtypes, candidates.size(), spent, candidates[best].name);
  return {best, true};
}

}  // namespace kiln::kernels
