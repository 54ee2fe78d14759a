// Choices by measurement (backend/cuda/tuner.h): the fastest candidate that agrees with the
// reference is chosen, remembered in memory and in the disk cache, and used without measuring
// again; a candidate that disagrees is never chosen; KILN_TUNE's modes. Then the two sites:
// cuBLASLt algorithms for linear and the generated convolutions, tuned, against the CPU
// reference.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/tuner.h"
#include "core/tensor/dispatch.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/tuning.h"
#include "quick_tier_on.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

// Sets the tuning mode for a scope.
struct TuneModeGuard {
  rt::TuneMode was = rt::tune_mode();
  explicit TuneModeGuard(rt::TuneMode m) { rt::set_tune_mode(m); }
  ~TuneModeGuard() { rt::set_tune_mode(was); }
};

std::uint64_t fnv_of(const std::string& s) { return rt::fnv1a64(s); }

// A problem no earlier run has stored: the test cache is shared between runs.
std::string fresh_problem(const std::string& what) {
  return what + " pid " + std::to_string(::getpid()) + " t " +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

// Candidates filling `y` (1 Mi floats): `value` each time, `repeats` times (slower when more).
struct Fills {
  Tensor y = zeros({1 << 20}, {.device = kGpu});
  std::vector<int> runs;
  std::vector<kernels::TuneCandidate> make(const std::vector<std::pair<double, int>>& spec) {
    runs.assign(spec.size(), 0);
    std::vector<kernels::TuneCandidate> c;
    for (std::size_t i = 0; i < spec.size(); ++i)
      c.push_back({"fill " + std::to_string(i), [this, i, v = spec[i].first, r = spec[i].second] {
                     ++runs[i];
                     for (int k = 0; k < r; ++k) y.fill_(v);
                   }});
    return c;
  }
  kernels::TuneCheck check() const { return {{{device_address(y), DType::f32, 1, y.numel(), y.numel()}}, 1e-6}; }
};

// A generated kernel no cache holds yet (its source names this process and instant), and a
// candidate that fills f.y with 1 with it.
std::span<const rt::KernelSpec* const> fresh_fill_module(const std::string& what) {
  const std::string tag = fresh_problem(what);
  const auto module = rt::generated_kernels(rt::GeneratedKey("test_tune_deferred").add(fnv_of(tag)), [&] {
    return rt::GeneratedModule{
        "// " + tag +
            "\nextern \"C\" __global__ void kiln_test_fill_once(float* y, long long n, float v) {\n"
            "  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += gridDim.x * 256ll) y[i] = v;\n}\n",
        "test deferred fill",
        {"kiln_test_fill_once"}};
  });
  REQUIRE_FALSE(rt::function_if_cached(*module[0], rt::generated_dtypes(), 0, 0));
  return module;
}
kernels::TuneCandidate generated_fill(Fills& f, std::span<const rt::KernelSpec* const> module) {
  return {"generated fill", [&f, module] {
            rt::launch(rt::generated_function(module, "kiln_test_fill_once", 0), rt::linear_config(f.y.numel()),
                       rt::default_stream(0), device_address(f.y), static_cast<long long>(f.y.numel()), 1.0f);
          }};
}

// The disk cache's choice for a cuBLASLt product whose tune label contains every one of `parts`.
std::optional<rt::TuneChoice> stored_product_choice(std::initializer_list<std::string_view> parts) {
  for (const rt::EntryInfo& info : rt::DiskCache::global().list()) {
    if (info.key.kind != rt::kTuneKind || info.key.op != "tune/cublaslt") continue;
    if (std::all_of(parts.begin(), parts.end(),
                    [&](std::string_view p) { return info.key.label.find(p) != std::string::npos; }))
      if (const std::optional<rt::Entry> e = rt::DiskCache::global().read(info.path)) return rt::tune_entry_choice(*e);
  }
  return std::nullopt;
}

}  // namespace

// The check runs on the device (kiln_tune_scale, kiln_tune_compare) by outputs_agree's rules:
// within tolerance of the reference's largest finite magnitude, NaN and infinities where the
// reference has them; only the lines' elements count, not the gaps between them.
TEST_CASE("run_tuned's check on the device: tolerance, NaN, infinity, and only the lines' elements") {
  TuneModeGuard on(rt::TuneMode::on);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  // 3 lines of 4 elements, 6 apart; the reference's largest finite magnitude is 100.
  const std::vector<double> ref{1, 2, 3, 100, -7, -7, 5, nan, -inf, 0, -9, -9, 0.5, 0.25, -100, 8};
  auto with = [&](std::size_t i, double v) {
    std::vector<double> r = ref;
    r[i] = v;
    return r;
  };
  struct Variant {
    std::vector<double> values;
    bool agrees;
  };
  const std::vector<Variant> variants{
      {with(1, 2.05), true},      // 0.05 <= 1e-3 * 100
      {with(4, 1e6), true},       // in a gap between lines
      {with(2, 3.2), false},      // 0.2 > 0.1
      {with(7, 1.0), false},      // NaN where the reference has NaN
      {with(8, inf), false},      // the other infinity
      {with(0, nan), false},      // NaN where the reference is finite
      {with(14, -100.05), true},  // a negative value within the limit
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    CAPTURE(dtype_name(dt));
    Tensor y = zeros({static_cast<std::int64_t>(ref.size())}, {.dtype = dt, .device = kGpu});
    std::vector<kernels::TuneCandidate> c;
    std::vector<Tensor> sources{from_vector(ref).to(dt).to(kGpu)};
    for (const Variant& v : variants) sources.push_back(from_vector(v.values).to(dt).to(kGpu));
    for (std::size_t i = 0; i < sources.size(); ++i)
      c.push_back({"copy " + std::to_string(i), [&y, &sources, i] { y.copy_(sources[i]); }});
    const kernels::TuneCheck check{{{device_address(y), dt, 3, 4, 6}}, 1e-3};
    const rt::TuneKey key{"test", fresh_problem("device check"), std::string(dtype_name(dt)), 90, "test 1"};
    kernels::run_tuned(key, c, check, rt::default_stream(0));
    const std::optional<rt::TuneChoice> stored = rt::find_choice(key);
    REQUIRE(stored);
    for (std::size_t i = 0; i < variants.size(); ++i) {
      // bf16 keeps 8 bits: 2.05 rounds to 2.0625 (still within), 3.2 to 3.203125 (still out).
      const bool rejected = stored->detail.find("copy " + std::to_string(i + 1) + ": rejected") != std::string::npos;
      CAPTURE(i);
      CHECK(rejected == !variants[i].agrees);
    }
  }
}

TEST_CASE("run_tuned picks the fastest candidate that agrees with the reference, and remembers it") {
  TuneModeGuard on(rt::TuneMode::on);
  Fills f;
  // 0: the reference, slow; 1: wrong and fastest; 2: right and fast; 3: right and slower.
  const auto c = f.make({{1.0, 40}, {2.0, 1}, {1.0, 1}, {1.0, 10}});
  const rt::TuneKey key{"test", fresh_problem("fills"), "f32", 90, "test 1"};
  const KernelStats before = kernel_stats();
  const kernels::TuneOutcome first = kernels::run_tuned(key, c, f.check(), rt::default_stream(0));
  CHECK(first.index == 2);
  CHECK(first.settled);
  CHECK(kernel_stats().tuned == before.tuned + 1);  // one choice measured, and the time it took
  CHECK(kernel_stats().tune_ms > before.tune_ms);
  // The output is the chosen one's.
  CHECK(max(f.y).item<float>() == 1.0f);
  CHECK(min(f.y).item<float>() == 1.0f);
  const std::optional<rt::TuneChoice> stored = rt::find_choice(key);
  REQUIRE(stored);
  CHECK(stored->variant == "fill 2");
  CHECK(stored->detail.find("fill 1: rejected") != std::string::npos);
  CHECK(stored->detail.find("fill 3: ") != std::string::npos);

  // Later calls run the choice alone, also after the memory is forgotten (from the disk cache).
  for (bool forget : {false, true}) {
    if (forget) rt::forget_choices_in_memory();
    const auto again = f.make({{1.0, 40}, {2.0, 1}, {1.0, 1}, {1.0, 10}});
    CHECK(kernels::run_tuned(key, again, f.check(), rt::default_stream(0)).index == 2);
    CHECK(f.runs == std::vector<int>{0, 0, 1, 0});
  }
  CHECK(kernel_stats().tuned == before.tuned + 1);  // remembered choices measure nothing
}

TEST_CASE("KILN_TUNE modes: cached and off run the reference where nothing is remembered; off ignores the store") {
  Fills f;
  const rt::TuneKey key{"test", fresh_problem("modes"), "f32", 90, "test 1"};
  {
    TuneModeGuard cached(rt::TuneMode::cached);
    const auto c = f.make({{1.0, 20}, {1.0, 1}});
    CHECK(kernels::run_tuned(key, c, f.check(), rt::default_stream(0)).index == 0);
    CHECK(f.runs == std::vector<int>{1, 0});
    CHECK_FALSE(rt::find_choice(key));  // cached mode measures nothing, stores nothing
  }
  {
    TuneModeGuard on(rt::TuneMode::on);
    const auto c = f.make({{1.0, 20}, {1.0, 1}});
    CHECK(kernels::run_tuned(key, c, f.check(), rt::default_stream(0)).index == 1);
  }
  {
    TuneModeGuard off(rt::TuneMode::off);
    const auto c = f.make({{1.0, 20}, {1.0, 1}});
    CHECK(kernels::run_tuned(key, c, f.check(), rt::default_stream(0)).index == 0);
  }
  TuneModeGuard cached(rt::TuneMode::cached);
  const auto c = f.make({{1.0, 20}, {1.0, 1}});
  CHECK(kernels::run_tuned(key, c, f.check(), rt::default_stream(0)).index == 1);
}

TEST_CASE("KILN_TUNE=auto measures candidates that need no compile, and not those that do") {
  Fills f;
  {  // the fill and check kernels loaded, as a measurement under `on` leaves them
    TuneModeGuard on(rt::TuneMode::on);
    const auto c = f.make({{1.0, 1}, {1.0, 1}});
    kernels::run_tuned({"test", fresh_problem("auto loads"), "f32", 90, "test 1"}, c, f.check(), rt::default_stream(0));
  }
  TuneModeGuard automatic(rt::TuneMode::auto_);
  const rt::TuneKey compiled{"test", fresh_problem("auto compiled"), "f32", 90, "test 1"};
  auto c = f.make({{1.0, 20}, {1.0, 1}});
  CHECK(kernels::run_tuned(compiled, c, f.check(), rt::default_stream(0), kernels::TuneCompiles::under_on).index == 0);
  CHECK_FALSE(rt::find_choice(compiled));
  const rt::TuneKey free{"test", fresh_problem("auto free"), "f32", 90, "test 1"};
  c = f.make({{1.0, 20}, {1.0, 1}});
  CHECK(kernels::run_tuned(free, c, f.check(), rt::default_stream(0), kernels::TuneCompiles::none).index == 1);
  CHECK(rt::find_choice(free));
}

TEST_CASE(
    "KILN_TUNE=auto with the quick tier measures once a candidate's kernel has compiled, the first runs meanwhile") {
  TuneModeGuard automatic(rt::TuneMode::auto_);
  const kiln_test::QuickTierOn tier;
  Fills f;
  const auto module = fresh_fill_module("deferred kernel");
  auto c = f.make({{1.0, 20}});  // slow: candidate 0, the heuristic's pick
  c.push_back(generated_fill(f, module));
  const rt::TuneKey key{"test", fresh_problem("auto deferred"), "f32", 90, "test 1"};
  const kernels::TuneOutcome first = kernels::run_tuned(key, c, f.check(), rt::default_stream(0));
  CHECK(first.index == 0);
  CHECK_FALSE(first.settled);
  CHECK_FALSE(rt::find_choice(key));  // nothing stored while a candidate compiles
  CHECK(f.runs[0] == 1);
  rt::wait_for_prefetch();  // the candidate's kernel compiled on the prefetch threads
  CHECK(rt::function_if_cached(*module[0], rt::generated_dtypes(), 0, 0, false));
  const kernels::TuneOutcome second = kernels::run_tuned(key, c, f.check(), rt::default_stream(0));
  CHECK(second.settled);
  CHECK(second.index == 1);
  REQUIRE(rt::find_choice(key));
  CHECK(rt::find_choice(key)->variant == "generated fill");
}

// A cold run's plan is queued on the prefetch threads, and the run waits for a product measured
// ahead of it: the measurement waits for its candidates' kernels alone. Here every prefetch
// thread is held until the measurement returns (or two minutes pass), so it loads its own.
TEST_CASE("a measurement waits for its candidates' kernels, not for everything queued to prefetch") {
  TuneModeGuard automatic(rt::TuneMode::auto_);
  Fills f;
  const auto module = fresh_fill_module("own kernels");
  auto c = f.make({{1.0, 20}});
  c.push_back(generated_fill(f, module));
  std::promise<void> release;
  const std::shared_future<void> released = release.get_future().share();
  for (int i = 0; i < rt::background_compile_jobs(); ++i) rt::run_in_background([released] { released.wait(); });
  const rt::TuneKey key{"test", fresh_problem("own kernels"), "f32", 90, "test 1"};
  auto measured = std::async(std::launch::async, [&] {
    return kernels::run_tuned(key, c, f.check(), rt::default_stream(0), kernels::TuneCompiles::under_auto);
  });
  const bool returned = measured.wait_for(std::chrono::minutes(2)) == std::future_status::ready;
  release.set_value();
  const kernels::TuneOutcome out = measured.get();
  rt::wait_for_prefetch();
  CHECK(returned);
  CHECK(out.settled);
  CHECK(out.index == 1);
  REQUIRE(rt::find_choice(key));
  CHECK(rt::find_choice(key)->variant == "generated fill");
}

TEST_CASE("tuned cuBLASLt algorithms for linear match the CPU reference, and the choice is in the disk cache") {
  TuneModeGuard on(rt::TuneMode::on);
  Generator gen(11);
  // A shape of its own (k = 781), so this process measures it unless an earlier run stored it.
  const Tensor x = randn({128, 781}, {.device = kGpu}, &gen), w = randn({512, 781}, {.device = kGpu}, &gen),
               b = randn({512}, {.device = kGpu}, &gen);
  const Tensor y = linear(x, w, b, Activation::relu);
  const Tensor ref = linear(x.to(Device::cpu()), w.to(Device::cpu()), b.to(Device::cpu()), Activation::relu);
  kiln_test::check_match(ref, y, 2e-4, "tuned linear");
  const std::optional<rt::TuneChoice> choice = stored_product_choice({"k781"});
  REQUIRE(choice);
  // Under `on` the generated kinds are timed too: the choice is one of the candidates listed.
  CHECK(choice->detail.find(choice->variant) != std::string::npos);
  CHECK(choice->detail.find("algo") != std::string::npos);
  CHECK(choice->detail.find("ffma ") != std::string::npos);
}

TEST_CASE("KILN_TUNE=auto times a large exact-f32 product on the tile engine's three TF32 products too") {
  TuneModeGuard automatic(rt::TuneMode::auto_);
  Generator gen(12);
  // 1024 x 1024 x 1040 multiply-adds, past 2^30; k = 1040 is this test's own (rows of 16-byte
  // multiples, as the tile engine's tensor maps need).
  const Tensor x = randn({1024, 1040}, {.device = kGpu}, &gen), w = randn({1024, 1040}, {.device = kGpu}, &gen),
               b = randn({1024}, {.device = kGpu}, &gen);
  const Tensor y = linear(x, w, b);
  const Tensor ref = linear(x.to(Device::cpu()), w.to(Device::cpu()), b.to(Device::cpu()));
  kiln_test::check_match(ref, y, 1e-4, "large exact-f32 linear");  // one TF32 product: ~5x past it
  const std::optional<rt::TuneChoice> choice = stored_product_choice({"k1040"});
  REQUIRE(choice);
  CHECK(choice->detail.find(choice->variant) != std::string::npos);
  if (rt::device_info(0).arch() >= 90) {
    MESSAGE("large exact-f32 product: '" << choice->variant << "' runs");
    CHECK(choice->detail.find("wgmma ") != std::string::npos);  // every tile of the kind
    CHECK(choice->detail.find("wgmma ") != choice->detail.rfind("wgmma "));
    CHECK(choice->detail.find("ffma ") == std::string::npos);  // the FFMA kernel is for shallow products
  }
  // Every later call runs the choice: the same bits.
  CHECK(kiln_test::f32_bits(linear(x, w, b)) == kiln_test::f32_bits(y));
  // A weight gradient of that size sums its bias gradient apart, so that its product (k = 1044,
  // both operands MN-major) is timed on the tile engine too, which sums no bias gradient.
  const Tensor gp = randn({1044, 1024}, {.device = kGpu}, &gen), xs = randn({1044, 1024}, {.device = kGpu}, &gen);
  const LinearGrads got = linear_grads(gp, xs), want = linear_grads(gp.to(Device::cpu()), xs.to(Device::cpu()));
  kiln_test::check_match(want.weight, got.weight, 1e-4, "large exact-f32 weight gradient");
  kiln_test::check_match(want.bias, got.bias, 1e-5, "its bias gradient");
  CHECK_FALSE(stored_product_choice({"k1044", "bgrad_b"}));
  const std::optional<rt::TuneChoice> wgrad = stored_product_choice({"k1044", "epilogue none"});
  REQUIRE(wgrad);
  if (rt::device_info(0).arch() >= 90) CHECK(wgrad->detail.find("wgmma ") != std::string::npos);
}

TEST_CASE("tuned convolutions (bf16, TF32; forward, input and weight gradients) match the CPU reference") {
  TuneModeGuard on(rt::TuneMode::on);
  const bool tf32_was = allow_conv_tf32();
  set_allow_conv_tf32(true);
  struct Case {
    Shape x, w;
    std::int64_t pad;
  };
  // The trainer's cnn and the speedrun's convs, at small batches.
  for (const Case& c : {Case{{8, 1, 28, 28}, {32, 1, 5, 5}, 2}, Case{{8, 32, 14, 14}, {64, 32, 5, 5}, 2},
                        Case{{8, 24, 12, 12}, {32, 24, 3, 3}, 0}})
    for (DType t : {DType::bf16, DType::f32}) {
      CAPTURE(t);
      CAPTURE(c.w);
      Generator gen(3);
      const Conv2dOptions o{.padding = {c.pad}};
      const Tensor x = randn(c.x, {.device = kGpu}, &gen).to(t), w = randn(c.w, {.device = kGpu}, &gen).to(t);
      const Tensor y = conv2d(x, w, {}, o);
      const Tensor gy = randn(y.shape(), {.device = kGpu}, &gen).to(t);
      const Tensor dx = conv2d_grad_input(gy, w, c.x, o), dw = conv2d_grad_weight(x, gy, c.w, o);
      auto cpu = [](const Tensor& v) { return v.to(Device::cpu()).to(DType::f64); };
      const double tol = t == DType::bf16 ? 3e-2 : 5e-3;
      auto close = [&](const Tensor& want, const Tensor& got, const char* what) {
        const double scale = max(abs(want)).item<double>();
        const double err = max(abs(sub(want, cpu(got)))).item<double>();
        INFO(what << ": max error " << err << " against max |value| " << scale);
        CHECK(err <= tol * scale);
      };
      close(conv2d(cpu(x), cpu(w), {}, o), y, "forward");
      close(conv2d_grad_input(cpu(gy), cpu(w), c.x, o), dx, "input gradient");
      close(conv2d_grad_weight(cpu(x), cpu(gy), c.w, o), dw, "weight gradient");
    }
  set_allow_conv_tf32(tf32_was);
}
