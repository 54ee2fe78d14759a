#include "norm_batch_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

// sum of f(i) for i in [0, n), in double with eight accumulators so the adds overlap (the
// compiler may not reorder one running sum).
template <class F>
double sum8(std::int64_t n, F&& f) {
  double acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += f(i + k);
  for (; i < n; ++i) acc[0] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// y = (x - mu) * scale + shift, then the ReLU when asked (keeping NaN, as the reference).
template <class T>
void apply_row(const T* __restrict x, T* __restrict y, std::int64_t n, double mu, double scale, double shift,
               bool relu) {
  if (relu)
    for (std::int64_t i = 0; i < n; ++i) {
      const T r = static_cast<T>((static_cast<double>(x[i]) - mu) * scale + shift);
      y[i] = r > T(0) || r != r ? r : T(0);
    }
  else
    for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((static_cast<double>(x[i]) - mu) * scale + shift);
}

// The gradient through the fused ReLU: g where y > 0, else 0.
template <class T>
void mask_row(const T* __restrict g, const T* __restrict y, T* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T gi = g[i], yi = y[i];
    out[i] = yi > T(0) ? gi : T(0);
  }
}

// dx = k * (dy - mdb - (x - mu) * is * mdw) in training, k * dy in eval.
template <class T>
void dx_row(const T* __restrict dy, const T* __restrict x, T* __restrict dx, std::int64_t n, double k, double mu,
            double is, double mdb, double mdw, bool training) {
  if (training)
    for (std::int64_t i = 0; i < n; ++i)
      dx[i] = static_cast<T>(k * (static_cast<double>(dy[i]) - mdb - (static_cast<double>(x[i]) - mu) * is * mdw));
  else
    for (std::int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(k * static_cast<double>(dy[i]));
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
            sum += sum8(l.s, [&](std::int64_t i) { return static_cast<double>(x[i]); });
          }
          const double mu = sum / m;
          for (std::int64_t n = 0; n < l.n; ++n) {
            const T* x = px + row(n);
            sq += sum8(l.s, [&](std::int64_t i) {
              const double d = static_cast<double>(x[i]) - mu;
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
          apply_row(px + row(n), py + row(n), l.s, mean[c], invstd[c] * w[c], b[c], p.relu);
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
        // The incoming gradient of row n: g, or g where the fused ReLU passed it.
        std::vector<T> masked(py ? static_cast<std::size_t>(l.s) : 0);
        auto dy = [&](std::int64_t n) {
          if (!py) return pg + row(n);
          mask_row(pg + row(n), py + row(n), masked.data(), l.s);
          return static_cast<const T*>(masked.data());
        };
        const double mu = mean[c], is = invstd[c];
        double sdy = 0, sdx = 0;
        for (std::int64_t n = 0; n < l.n; ++n) {
          const T *d = dy(n), *x = px + row(n);
          sdy += sum8(l.s, [&](std::int64_t i) { return static_cast<double>(d[i]); });
          sdx +=
              sum8(l.s, [&](std::int64_t i) { return static_cast<double>(d[i]) * (static_cast<double>(x[i]) - mu); });
        }
        db[c] = sdy;
        dw[c] = sdx * is;
        const double k = w[c] * is, mdb = db[c] / m, mdw = dw[c] / m;
        for (std::int64_t n = 0; n < l.n; ++n)
          dx_row(dy(n), px + row(n), pdx + row(n), l.s, k, mu, is, mdb, mdw, p.training);
      });
    }
  });
  store_values(out[1], dw);
  store_values(out[2], db);
  return true;
}

}  // namespace kiln::norm_detail
