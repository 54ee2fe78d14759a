#include "norm_batch_cpu.h"

#include <cmath>
#include <limits>

#include "cpu/parallel.h"

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

// sum of f(i) over one channel, in double with eight accumulators so the adds overlap
// (the compiler may not reorder one running sum).
template <class F>
double channel_sum(const Layout& l, std::int64_t c, F&& f) {
  double acc[8] = {};
  for (std::int64_t n = 0; n < l.n; ++n) {
    const std::int64_t base = (n * l.c + c) * l.s;
    std::int64_t s = 0;
    for (; s + 8 <= l.s; s += 8)
      for (int k = 0; k < 8; ++k) acc[k] += f(base + s + k);
    for (; s < l.s; ++s) acc[0] += f(base + s);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class F>
void for_channel(const Layout& l, std::int64_t c, F&& f) {
  for (std::int64_t n = 0; n < l.n; ++n) {
    const std::int64_t base = (n * l.c + c) * l.s;
    for (std::int64_t s = 0; s < l.s; ++s) f(base + s);
  }
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
        if (p.training) {
          const double mu = channel_sum(l, c, [&](std::int64_t i) { return static_cast<double>(px[i]); }) / m;
          const double sq = channel_sum(l, c, [&](std::int64_t i) {
            const double d = static_cast<double>(px[i]) - mu;
            return d * d;
          });
          // A NaN or Inf in the channel: NaN statistics, as in the reference.
          mean[c] = std::isnan(sq) ? std::numeric_limits<double>::quiet_NaN() : mu;
          invstd[c] = 1.0 / std::sqrt(sq / m + p.eps);
          rm[c] = (1 - p.momentum) * rm[c] + p.momentum * mean[c];
          rv[c] = (1 - p.momentum) * rv[c] + p.momentum * sq / (m - 1);
        } else {
          mean[c] = rm[c];
          invstd[c] = 1.0 / std::sqrt(rv[c] + p.eps);
        }
        const double mu = mean[c], scale = invstd[c] * w[c], shift = b[c];
        if (p.relu)
          for_channel(l, c, [&](std::int64_t i) {
            const double v = (static_cast<double>(px[i]) - mu) * scale + shift;
            py[i] = static_cast<T>(v > 0 || v != v ? v : 0.0);
          });
        else
          for_channel(
              l, c, [&](std::int64_t i) { py[i] = static_cast<T>((static_cast<double>(px[i]) - mu) * scale + shift); });
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
      // The incoming gradient, zero where the fused ReLU was off.
      auto dy = [&](std::int64_t i) { return py && !(py[i] > 0) ? 0.0 : static_cast<double>(pg[i]); };
      each_channel(l, [&](std::int64_t c) {
        const double mu = mean[c], is = invstd[c];
        db[c] = channel_sum(l, c, dy);
        dw[c] = channel_sum(l, c, [&](std::int64_t i) { return dy(i) * (static_cast<double>(px[i]) - mu); }) * is;
        const double k = w[c] * is, mdb = db[c] / m, mdw = dw[c] / m;
        if (p.training)
          for_channel(l, c, [&](std::int64_t i) {
            const double xhat = (static_cast<double>(px[i]) - mu) * is;
            pdx[i] = static_cast<T>(k * (dy(i) - mdb - xhat * mdw));
          });
        else
          for_channel(l, c, [&](std::int64_t i) { pdx[i] = static_cast<T>(k * dy(i)); });
      });
    }
  });
  store_values(out[1], dw);
  store_values(out[2], db);
  return true;
}

}  // namespace kiln::norm_detail
