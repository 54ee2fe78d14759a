// rand, randn, randint, bernoulli: Philox 4x32-10 with the scheme in kiln/random.h. The
// GPU kernel (kernel_templates/random.cu) repeats this file's arithmetic operation for
// operation; doubles are rounded explicitly there and never contracted into FMAs here.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "core/dtype_sets.h"
#include "kiln/random.h"

#include <bit>
#include <cmath>

#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "core/registry.h"
#include "core/tensor/copy.h"

namespace kiln {

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k) {
  constexpr std::uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const std::uint64_t p0 = kM0 * c[0], p1 = kM1 * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
  }
  return c;
}

void Generator::manual_seed(std::uint64_t seed) {
  std::lock_guard lock(mu_);
  seed_ = seed;
  offset_ = 0;
}
std::uint64_t Generator::seed() const {
  std::lock_guard lock(mu_);
  return seed_;
}
std::uint64_t Generator::offset() const {
  std::lock_guard lock(mu_);
  return offset_;
}
void Generator::set_offset(std::uint64_t blocks) {
  std::lock_guard lock(mu_);
  offset_ = blocks;
}
std::uint64_t Generator::reserve(std::uint64_t blocks) {
  std::lock_guard lock(mu_);
  const std::uint64_t first = offset_;
  offset_ += blocks;
  return first;
}

Generator& default_generator() {
  static Generator g;
  return g;
}
void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

namespace {

// The template's DIST values.
enum class Dist : int { uniform = 0, normal = 1, randint = 2, bernoulli = 3, bernoulli_tensor = 4 };

constexpr std::uint64_t kNarrowRange = 1ULL << 32;

// Values one Philox block yields for (dist, dtype, randint range).
std::int64_t per_block(Dist dist, DType dtype, std::uint64_t range) {
  if (dist == Dist::randint) return range <= kNarrowRange ? 4 : 2;
  if (dist == Dist::uniform || dist == Dist::normal) return dtype == DType::f64 ? 2 : 4;
  return 4;
}

// log(x) for x in (0, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)], log m = 2 atanh(s),
// s = (m - 1) / (m + 1), |s| <= 0.172, so ten series terms reach double precision.
double log01(double x) {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  std::int64_t e = static_cast<std::int64_t>((bits >> 52) & 0x7ff) - 1023;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
  if (m > 1.4142135623730951) {
    m = m * 0.5;
    e = e + 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 0.047619047619047616;
  p = std::fma(p, s2, 0.052631578947368418);
  p = std::fma(p, s2, 0.058823529411764705);
  p = std::fma(p, s2, 0.066666666666666666);
  p = std::fma(p, s2, 0.076923076923076927);
  p = std::fma(p, s2, 0.090909090909090912);
  p = std::fma(p, s2, 0.1111111111111111);
  p = std::fma(p, s2, 0.14285714285714285);
  p = std::fma(p, s2, 0.20000000000000001);
  p = std::fma(p, s2, 0.33333333333333331);
  const double two_s = s * 2.0;
  const double lm = std::fma(two_s, s2 * p, two_s);
  return std::fma(static_cast<double>(e), 0.69314718055994529, lm);
}

// sin and cos of 2 pi u for u in [0, 1): exact reduction to a quadrant and |f| <= 1/2,
// then Taylor polynomials of (pi/2) f.
void sincos2pi(double u, double& s_out, double& c_out) {
  const double t = u * 4.0;
  int q = static_cast<int>(t);
  double f = t - static_cast<double>(q);
  if (f > 0.5) {
    f = f - 1.0;
    q = q + 1;
  }
  const double x = f * 1.5707963267948966;
  const double x2 = x * x;
  double ps = 2.8114572543455206e-15;
  ps = std::fma(ps, x2, -7.6471637318198164e-13);
  ps = std::fma(ps, x2, 1.6059043836821613e-10);
  ps = std::fma(ps, x2, -2.505210838544172e-08);
  ps = std::fma(ps, x2, 2.7557319223985893e-06);
  ps = std::fma(ps, x2, -0.00019841269841269841);
  ps = std::fma(ps, x2, 0.0083333333333333332);
  ps = std::fma(ps, x2, -0.16666666666666666);
  const double sn = std::fma(x * x2, ps, x);
  double pc = -1.5619206968586225e-16;
  pc = std::fma(pc, x2, 4.7794773323873853e-14);
  pc = std::fma(pc, x2, -1.1470745597729725e-11);
  pc = std::fma(pc, x2, 2.08767569878681e-09);
  pc = std::fma(pc, x2, -2.7557319223985888e-07);
  pc = std::fma(pc, x2, 2.4801587301587302e-05);
  pc = std::fma(pc, x2, -0.0013888888888888889);
  pc = std::fma(pc, x2, 0.041666666666666664);
  pc = std::fma(pc, x2, -0.5);
  const double cs = std::fma(x2, pc, 1.0);
  switch (q & 3) {
    case 0: s_out = sn, c_out = cs; break;
    case 1: s_out = cs, c_out = -sn; break;
    case 2: s_out = -sn, c_out = -cs; break;
    default: s_out = -cs, c_out = sn; break;
  }
}

// Box-Muller: u1 in (0, 1], u2 in [0, 1).
void box_muller(double u1, double u2, double& z0, double& z1) {
  const double r = std::sqrt(-2.0 * log01(u1));
  double s, c;
  sincos2pi(u2, s, c);
  z0 = r * c;
  z1 = r * s;
}

std::uint64_t wide(std::uint32_t hi, std::uint32_t lo) { return (static_cast<std::uint64_t>(hi) << 32) | lo; }
double u24(std::uint32_t x) { return static_cast<double>(x >> 8) * 0x1p-24; }
double u53(std::uint64_t w) { return static_cast<double>(w >> 11) * 0x1p-53; }

// The uniform of one 32-bit word, exact in T: 24 bits (f32), 11 (f16), 8 (bf16).
template <class T>
double uniform_word(std::uint32_t x) {
  if constexpr (std::is_same_v<T, Half>) return static_cast<double>(x >> 21) * 0x1p-11;
  else if constexpr (std::is_same_v<T, BFloat16>) return static_cast<double>(x >> 24) * 0x1p-8;
  else return u24(x);
}

struct RandomCall {
  Dist dist;
  std::uint64_t seed, offset;
  std::int64_t low = 0;
  std::uint64_t range = 0;
  double p = 0;
};

RandomCall call_of(const OpArgs& a, Dist dist) {
  RandomCall c{dist, static_cast<std::uint64_t>(a.attrs.get<std::int64_t>("seed")),
               static_cast<std::uint64_t>(a.attrs.get<std::int64_t>("offset"))};
  if (dist == Dist::randint) {
    c.low = a.attrs.get<std::int64_t>("low");
    c.range = static_cast<std::uint64_t>(a.attrs.get<std::int64_t>("high")) - static_cast<std::uint64_t>(c.low);
  }
  if (dist == Dist::bernoulli) c.p = a.attrs.get<double>("p");
  return c;
}

template <class T>
void generate_cpu(const RandomCall& c, const Tensor& out, const Tensor* probs) {
  T* y = cpu::ptr<T>(out);
  const std::int64_t n = out.numel();
  const std::int64_t per = per_block(c.dist, out.dtype(), c.range);
  const std::array<std::uint32_t, 2> key{static_cast<std::uint32_t>(c.seed), static_cast<std::uint32_t>(c.seed >> 32)};
  for (std::int64_t b = 0; b * per < n; ++b) {
    const std::uint64_t ctr = c.offset + static_cast<std::uint64_t>(b);
    const auto x = philox4x32_10({static_cast<std::uint32_t>(ctr), static_cast<std::uint32_t>(ctr >> 32), 0, 0}, key);
    double v[4] = {0, 0, 0, 0};
    std::int64_t iv[4] = {0, 0, 0, 0};
    if (c.dist == Dist::uniform) {
      if (per == 2) v[0] = u53(wide(x[0], x[1])), v[1] = u53(wide(x[2], x[3]));
      else for (int j = 0; j < 4; ++j) v[j] = uniform_word<T>(x[j]);
    } else if (c.dist == Dist::normal) {
      if (per == 2) {
        box_muller(u53(wide(x[0], x[1])) + 0x1p-53, u53(wide(x[2], x[3])), v[0], v[1]);
      } else {
        box_muller(u24(x[0]) + 0x1p-24, u24(x[1]), v[0], v[1]);
        box_muller(u24(x[2]) + 0x1p-24, u24(x[3]), v[2], v[3]);
      }
    } else if (c.dist == Dist::randint) {
      if (per == 2) for (int j = 0; j < 2; ++j) iv[j] = c.low + static_cast<std::int64_t>(wide(x[2 * j], x[2 * j + 1]) % c.range);
      else for (int j = 0; j < 4; ++j) iv[j] = c.low + static_cast<std::int64_t>(x[j] % c.range);
    } else {
      for (int j = 0; j < 4; ++j) {
        const std::int64_t i = b * per + j;
        const double p = c.dist == Dist::bernoulli ? c.p : i < n ? static_cast<double>(cpu::load(cpu::ptr<const T>(*probs)[i])) : 0;
        v[j] = u24(x[j]) < p ? 1.0 : 0.0;
      }
    }
    for (std::int64_t j = 0; j < per && b * per + j < n; ++j)
      y[b * per + j] = c.dist == Dist::randint ? cpu::store<T>(iv[j]) : cpu::store<T>(v[j]);
  }
}

void random_cpu(const OpArgs& a, std::span<Tensor> out, Dist dist) {
  const RandomCall c = call_of(a, dist);
  Tensor probs = dist == Dist::bernoulli_tensor ? a.inputs[0].contiguous() : Tensor();
  cpu::visit(out[0].dtype(), [&]<class T>() { generate_cpu<T>(c, out[0], probs.defined() ? &probs : nullptr); });
}

// One kernel spec per distribution over the template kernel_templates/random.cu.
const rt::KernelSpec& register_spec(const char* op, Dist dist, const std::vector<DType>& dtypes) {
  rt::KernelSpec s;
  s.op = op;
  s.template_name = "random";
  s.entry = "kiln_random";
  for (DType t : dtypes) s.dtypes.push_back({t});
  s.bind = [dist](const DTypes& d, std::uint32_t) {
    return rt::Bindings{{"PRELUDE", rt::device_prelude(d)}, {"T", std::string(cuda_storage_type(d[0]))}, {"DIST", std::to_string(static_cast<int>(dist))}};
  };
  return rt::register_kernel(std::move(s));
}


void random_gpu(const rt::KernelSpec& spec, const OpArgs& a, std::span<Tensor> out, Dist dist) {
  const RandomCall c = call_of(a, dist);
  const Tensor& y = out[0];
  const std::int64_t n = y.numel();
  if (n == 0) return;
  const std::int64_t blocks = (n + per_block(dist, y.dtype(), c.range) - 1) / per_block(dist, y.dtype(), c.range);
  Tensor probs = dist == Dist::bernoulli_tensor ? a.inputs[0].contiguous() : Tensor();
  const int dev = a.device.index();
  const rt::Function f = rt::get_function(spec, DTypes{y.dtype()}, 0, dev);
  const rt::LaunchConfig cfg = kernels::grid_stride_config(static_cast<std::uint64_t>(blocks), dev);
  const rt::DevicePtr probs_ptr = probs.defined() ? device_address(probs) : 0;
  const rt::DevicePtr state = static_cast<rt::DevicePtr>(a.attrs.get_or("state", std::int64_t{0}));
  rt::launch(f, cfg, stream_of(a.device), device_address(y), static_cast<long long>(n),
             static_cast<unsigned long long>(c.seed), static_cast<unsigned long long>(c.offset),
             static_cast<long long>(c.low), static_cast<unsigned long long>(c.range), c.p, probs_ptr, state);
}

using rules::dtype_from_attrs;
using rules::shape_from_attrs;

OpDef random_op(const char* name, Dist dist, std::vector<DType> dtypes, Attrs test_attrs) {
  const rt::KernelSpec& spec = register_spec(name, dist, dtypes);
  return OpDef{
      .name = name,
      .num_inputs = 0,
      .dtypes = std::move(dtypes),
      .dtype_rule = dtype_from_attrs,
      .shape_rule = shape_from_attrs,
      .cpu = [dist](const OpArgs& a, std::span<Tensor> out) { random_cpu(a, out, dist); },
      .gpu = [&spec, dist](const OpArgs& a, std::span<Tensor> out) { random_gpu(spec, a, out, dist); },
      .test = {.attrs = {std::move(test_attrs)}, .gradcheck = false},
  };
}

Attrs sample_attrs(DType dtype) {
  return Attrs{{"shape", std::vector<std::int64_t>{5, 7, 11, 13}}, {"dtype", dtype}, {"seed", std::int64_t{42}},
               {"offset", std::int64_t{7}}};
}

const OpRef kRand = register_op(random_op("rand", Dist::uniform, dtype_sets::floating, sample_attrs(DType::f32)));
const OpRef kRandn = register_op(random_op("randn", Dist::normal, dtype_sets::floating, sample_attrs(DType::f32)));
const OpRef kRandint = register_op(random_op(
    "randint", Dist::randint, dtype_sets::numeric, sample_attrs(DType::i64).set("low", std::int64_t{-5}).set("high", std::int64_t{9})));
const OpRef kBernoulliOp =
    register_op(random_op("bernoulli", Dist::bernoulli, dtype_sets::floating, sample_attrs(DType::f32).set("p", 0.3)));

const OpRef kBernoulliTensorOp = [] {
  const rt::KernelSpec& spec = register_spec("bernoulli_tensor", Dist::bernoulli_tensor, dtype_sets::floating);
  return std::cref(register_op({
      .name = "bernoulli_tensor",
      .dtypes = dtype_sets::floating,
      .dtype_rule = rules::same_as_input,
      .shape_rule = rules::same_shape_as_input,
      .cpu = [](const OpArgs& a, std::span<Tensor> out) { random_cpu(a, out, Dist::bernoulli_tensor); },
      .gpu = [&spec](const OpArgs& a, std::span<Tensor> out) { random_gpu(spec, a, out, Dist::bernoulli_tensor); },
      .test = {.attrs = {Attrs{{"seed", std::int64_t{42}}, {"offset", std::int64_t{0}}}},
               .low = 0.0, .high = 1.0, .gradcheck = false},
  }));
}().get();

// Reserves the call's blocks and returns attrs naming exactly which numbers it draws.
Attrs draw(Generator* gen, Dist dist, const Shape& shape, DType dtype, Device device, std::uint64_t range = 0) {
  Generator& g = gen ? *gen : default_generator();
  const std::int64_t per = per_block(dist, dtype, range);
  const std::uint64_t blocks = static_cast<std::uint64_t>((shape_numel(shape) + per - 1) / per);
  // In a captured step the kernel reads (seed, offset) from the device, which each replay
  // refreshes; the offset in attrs is then relative to the step's first draw.
  const step::RngState captured =
      step::capturing() && device.is_cuda() ? step::rng_state(g, device) : step::RngState{};
  const std::uint64_t offset = g.reserve(blocks) - captured.base;
  Attrs attrs{{"shape", std::vector<std::int64_t>(shape)},
              {"dtype", dtype},
              {"device", device},
              {"seed", static_cast<std::int64_t>(g.seed())},
              {"offset", static_cast<std::int64_t>(offset)}};
  if (captured.state) attrs.set("state", static_cast<std::int64_t>(captured.state));
  return attrs;
}


}  // namespace

Tensor rand(const Shape& shape, TensorOptions o, Generator* gen) {
  const DType dt = o.dtype.value_or(DType::f32);
  return with_grad_option(call(kRand, {}, draw(gen, Dist::uniform, shape, dt, o.device)), o);
}

Tensor randn(const Shape& shape, TensorOptions o, Generator* gen) {
  const DType dt = o.dtype.value_or(DType::f32);
  return with_grad_option(call(kRandn, {}, draw(gen, Dist::normal, shape, dt, o.device)), o);
}

Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, TensorOptions o, Generator* gen) {
  if (high <= low)
    throw ValueError("[randint] high (" + std::to_string(high) + ") must be greater than low (" + std::to_string(low) + ")");
  const DType dt = o.dtype.value_or(DType::i64);
  check_fits(low, dt, "randint");
  check_fits(high - 1, dt, "randint");  // the largest value drawn
  const std::uint64_t range = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
  Attrs attrs = draw(gen, Dist::randint, shape, dt, o.device, range);
  attrs.set("low", low).set("high", high);
  return with_grad_option(call(kRandint, {}, attrs), o);
}

Tensor bernoulli(const Shape& shape, double p, TensorOptions o, Generator* gen) {
  if (!(p >= 0.0 && p <= 1.0)) throw ValueError("[bernoulli] p must be in [0, 1], got " + std::to_string(p));
  const DType dt = o.dtype.value_or(DType::f32);
  Attrs attrs = draw(gen, Dist::bernoulli, shape, dt, o.device);
  attrs.set("p", p);
  return with_grad_option(call(kBernoulliOp, {}, attrs), o);
}

Tensor bernoulli(const Tensor& p, Generator* gen) {
  Attrs attrs = draw(gen, Dist::bernoulli_tensor, p.shape(), p.dtype(), p.device());
  return call(kBernoulliTensorOp, {p.detach()}, attrs);
}

}  // namespace kiln
