#include "norm_batch_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cpu/parallel.h"

namespace kiln::norm_detail {

namespace {

// x (N, C, S) contiguous: channel c is N runs of S values, run n at (n * C + c) * S.
struct Layout {
  std::int64_t n, c, s;
  double per_channel() const { return static_cast<double>(n * s); }
};

Layout layout_of(const Tensor& x) {
  const std::int64_t n = x.shape()[0], c = x.shape()[1];
  return {n, c, c * n == 0 ? 1 : x.numel() / (c * n)};
}

// The row loops below take restrict pointers and do selects on loaded values, so the compiler
// vectorizes them; random signs would defeat a branch.

// sum of f(i) for i in [0, n): blocks of 256 summed in T with 16 accumulators, so the loop
// vectorizes at T's width and the adds overlap, then the blocks in double. An f32 sum thus
// rounds like one of 16 terms, however long the row.
template <class T, class F>
double row_sum(std::int64_t n, F&& f) {
  constexpr std::int64_t kLanes = 16, kBlock = 256;
  double total = 0;
  std::int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T acc[kLanes] = {};
    for (std::int64_t j = 0; j < kBlock; j += kLanes)
      for (std::int64_t k = 0; k < kLanes; ++k) acc[k] += f(i + j + k);
    for (std::int64_t k = 0; k < kLanes; ++k) total += static_cast<double>(acc[k]);
  }
  for (; i < n; ++i) total += static_cast<double>(f(i));
  return total;
}

// y = (x - mu) * scale + shift in T, then the ReLU when asked (keeping NaN, as the reference).
template <class T>
void apply_row(const T* __restrict x, T* __restrict y, std::int64_t n, T mu, T scale, T shift, bool relu) {
  if (relu)
    for (std::int64_t i = 0; i < n; ++i) {
      const T r = (x[i] - mu) * scale + shift;
      y[i] = r > T(0) || r != r ? r : T(0);
    }
  else
    for (std::int64_t i = 0; i < n; ++i) y[i] = (x[i] - mu) * scale + shift;
}

// The incoming gradient of element i: g, or through the fused ReLU (kRelu) g where y > 0,
// else 0, as an integer mask so that loops over it vectorize.
template <bool kRelu, class T>
inline T masked(const T* __restrict g, const T* __restrict y, std::int64_t i) {
  if constexpr (!kRelu) {
    return g[i];
  } else {
    using K = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
    return std::bit_cast<T>(std::bit_cast<K>(g[i]) & -K(y[i] > T(0)));
  }
}

// dx = k * (dy - mdb - (x - mu) * ismdw) in training, k * dy in eval, in T.
template <bool kRelu, class T>
void dx_row(const T* __restrict g, const T* __restrict y, const T* __restrict x, T* __restrict dx, std::int64_t n, T k,
            T mu, T ismdw, T mdb, bool training) {
  if (training)
    for (std::int64_t i = 0; i < n; ++i) dx[i] = k * (masked<kRelu>(g, y, i) - mdb - (x[i] - mu) * ismdw);
  else
    for (std::int64_t i = 0; i < n; ++i) dx[i] = k * masked<kRelu>(g, y, i);
}

template <class F>
void each_channel(const Layout& l, F&& f) {
  cpu::parallel_for(l.c, 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) f(c);
  });
}

}  // namespace

BatchNormParams batch_norm_params(const Attrs& a) {
  return {a.get_or<bool>("training", true),
          a.get_or<bool>("relu", false),
          has(a, "weight"),
          has(a, "bias"),
          has(a, "running_mean"),
          has(a, "running_var"),
          a.get_or<double>("momentum", 0.1),
          a.get_or<double>("eps", 1e-5)};
}

bool batch_norm_forward_fast(const OpArgs& a, std::span<Tensor> out) {
  const DType t = a.inputs[0].dtype();
  if (t != DType::f32 && t != DType::f64) return false;
  const BatchNormParams p = batch_norm_params(a.attrs);
  NoGradGuard no_grad;  // a contiguous copy of a view needs no history
  const Tensor x = a.inputs[0].contiguous();
  const Layout l = layout_of(x);
  const std::size_t C = static_cast<std::size_t>(l.c);
  const std::vector<double> w = p.weight ? values(a.inputs[1]) : std::vector<double>(C, 1.0);
  const std::vector<double> b = p.bias ? values(a.inputs[2]) : std::vector<double>(C, 0.0);
  std::vector<double> rm = p.rm ? values(a.inputs[3]) : std::vector<double>(C);
  std::vector<double> rv = p.rv ? values(a.inputs[4]) : std::vector<double>(C);
  std::vector<double> mean(C), invstd(C);
  const double m = l.per_channel();
  cpu::visit(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* px = cpu::ptr<const T>(x);
      T* py = cpu::ptr<T>(out[0]);
      each_channel(l, [&](std::int64_t c) {
        auto row = [&](std::int64_t n) { return (n * l.c + c) * l.s; };
        if (p.training) {
          double sum = 0, sq = 0;
          for (std::int64_t n = 0; n < l.n; ++n) {
            const T* x = px + row(n);
            sum += row_sum<T>(l.s, [&](std::int64_t i) { return x[i]; });
          }
          const double mu = sum / m;
          const T mu_t = static_cast<T>(mu);
          for (std::int64_t n = 0; n < l.n; ++n) {
            const T* x = px + row(n);
            sq += row_sum<T>(l.s, [&](std::int64_t i) {
              const T d = x[i] - mu_t;
              return d * d;
            });
          }
          // A NaN or Inf in the channel: NaN statistics, as in the reference.
          mean[c] = std::isnan(sq) ? std::numeric_limits<double>::quiet_NaN() : mu;
          invstd[c] = 1.0 / std::sqrt(sq / m + p.eps);
          rm[c] = (1 - p.momentum) * rm[c] + p.momentum * mean[c];
          rv[c] = (1 - p.momentum) * rv[c] + p.momentum * sq / (m - 1);
        } else {
          mean[c] = rm[c];
          invstd[c] = 1.0 / std::sqrt(rv[c] + p.eps);
        }
        for (std::int64_t n = 0; n < l.n; ++n)
          apply_row(px + row(n), py + row(n), l.s, static_cast<T>(mean[c]), static_cast<T>(invstd[c] * w[c]),
                    static_cast<T>(b[c]), p.relu);
      });
    }
  });
  store_values(out[1], mean);
  store_values(out[2], invstd);
  if (p.training && p.rm) store_values(a.inputs[3], rm);
  if (p.training && p.rv) store_values(a.inputs[4], rv);
  return true;
}

bool batch_norm_backward_fast(const OpArgs& a, std::span<Tensor> out) {
  const DType t = a.inputs[1].dtype();
  if (t != DType::f32 && t != DType::f64) return false;
  const BatchNormParams p = batch_norm_params(a.attrs);
  NoGradGuard no_grad;
  const Tensor g = a.inputs[0].contiguous(), x = a.inputs[1].contiguous();
  const Tensor y = p.relu ? a.inputs[2].contiguous() : Tensor();
  const Layout l = layout_of(x);
  const std::size_t C = static_cast<std::size_t>(l.c);
  const std::vector<double> w = p.weight ? values(a.inputs[3]) : std::vector<double>(C, 1.0);
  const std::vector<double> mean = values(a.inputs[4]), invstd = values(a.inputs[5]);
  std::vector<double> dw(C), db(C);
  const double m = l.per_channel();
  cpu::visit(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* pg = cpu::ptr<const T>(g);
      const T* px = cpu::ptr<const T>(x);
      const T* py = p.relu ? cpu::ptr<const T>(y) : nullptr;
      T* pdx = cpu::ptr<T>(out[0]);
      each_channel(l, [&](std::int64_t c) {
        auto row = [&](std::int64_t n) { return (n * l.c + c) * l.s; };
        const double mu = mean[c], is = invstd[c];
        const T mu_t = static_cast<T>(mu);
        auto channel = [&]<bool kRelu>() {
          double sdy = 0, sdx = 0;
          for (std::int64_t n = 0; n < l.n; ++n) {
            const T *g = pg + row(n), *y = kRelu ? py + row(n) : nullptr, *x = px + row(n);
            sdy += row_sum<T>(l.s, [&](std::int64_t i) { return masked<kRelu>(g, y, i); });
            sdx += row_sum<T>(l.s, [&](std::int64_t i) { return masked<kRelu>(g, y, i) * (x[i] - mu_t); });
          }
          db[c] = sdy;
          dw[c] = sdx * is;
          const double k = w[c] * is, mdb = db[c] / m, mdw = dw[c] / m;
          for (std::int64_t n = 0; n < l.n; ++n)
            dx_row<kRelu>(pg + row(n), kRelu ? py + row(n) : nullptr, px + row(n), pdx + row(n), l.s, static_cast<T>(k),
                          mu_t, static_cast<T>(is * mdw), static_cast<T>(mdb), p.training);
        };
        if (py)
          channel.template operator()<true>();
        else
          channel.template operator()<false>();
      });
    }
  });
  store_values(out[1], dw);
  store_values(out[2], db);
  return true;
}

}  // namespace kiln::norm_detail
