// max_pool2d (with argmax indices as a second output) and avg_pool2d on NCHW, and their
// backward ops. GPU: kernel_templates/pool.cu; CPU: plain loops written here, and for max
// pooling in f32/f64 a threaded path over planes (the loops stay as .cpu_reference).
#include <algorithm>
#include <bit>
#include <limits>
#include <type_traits>

#include "core/dtype_sets.h"
#include "conv_common.h"
#include "cpu_fast.h"
#include "core/cpu/parallel.h"
#include "kiln/conv.h"
#include "core/registry.h"

namespace kiln {

namespace {

using namespace conv_detail;

// Mirrors struct PoolParams of pool.cu.
struct PoolParams {
  long long planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, include_pad;
};

struct PoolGeom {
  PoolParams p;
  Shape in, out;
};

PoolGeom geometry(const Shape& x, const Attrs& attrs, const std::string& op) {
  if (x.size() != 4) throw ShapeError("[" + op + "] input must be 4-D (N, C, H, W), got shape " + paren(x));
  const auto k = pair_attr(attrs, "kernel", -1, 1, op);
  const auto st = attrs.has("stride") && !attrs.get<std::vector<std::int64_t>>("stride").empty()
                      ? pair_attr(attrs, "stride", 1, 1, op)
                      : k;
  const auto pad = pair_attr(attrs, "padding", 0, 0, op);
  const auto dil = pair_attr(attrs, "dilation", 1, 1, op);
  if (op.starts_with("avg") && (dil[0] != 1 || dil[1] != 1))
    throw ValueError("[" + op + "] takes no dilation, got " + paren({dil[0], dil[1]}));
  if (pad[0] > k[0] / 2 || pad[1] > k[1] / 2)
    throw ShapeError("[" + op + "] padding " + paren({pad[0], pad[1]}) + " must be at most half the kernel " +
                     paren({k[0], k[1]}));
  const std::int64_t ekh = dil[0] * (k[0] - 1) + 1, ekw = dil[1] * (k[1] - 1) + 1;
  if (ekh > x[2] + 2 * pad[0] || ekw > x[3] + 2 * pad[1])
    throw ShapeError("[" + op + "] window " + paren({ekh, ekw}) + " is larger than the padded input " +
                     paren({x[2] + 2 * pad[0], x[3] + 2 * pad[1]}) + " of input " + paren(x));
  PoolGeom g;
  g.p = {x[0] * x[1],
         x[2],
         x[3],
         (x[2] + 2 * pad[0] - ekh) / st[0] + 1,
         (x[3] + 2 * pad[1] - ekw) / st[1] + 1,
         k[0],
         k[1],
         st[0],
         st[1],
         pad[0],
         pad[1],
         dil[0],
         dil[1],
         attrs.get_or("count_include_pad", true) ? 1 : 0};
  g.in = x;
  g.out = {x[0], x[1], g.p.oh, g.p.ow};
  return g;
}

// Calls f(out_index, in_index, oy, ox) for every element inside each window, row-major.
template <class F>
void for_each_window(const PoolParams& p, F&& f) {
  for (long long pl = 0; pl < p.planes; ++pl)
    for (long long oy = 0; oy < p.oh; ++oy)
      for (long long ox = 0; ox < p.ow; ++ox) {
        const long long oi = (pl * p.oh + oy) * p.ow + ox;
        for (long long ki = 0; ki < p.kh; ++ki) {
          const long long iy = oy * p.sh - p.ph + ki * p.dh;
          if (iy < 0 || iy >= p.h) continue;
          for (long long kj = 0; kj < p.kw; ++kj) {
            const long long ix = ox * p.sw - p.pw + kj * p.dw;
            if (ix >= 0 && ix < p.w) f(oi, pl * p.h * p.w + iy * p.w + ix, oy, ox);
          }
        }
      }
}

long long avg_divisor(const PoolParams& p, long long oy, long long ox) {
  if (p.include_pad) return p.kh * p.kw;
  const long long y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
  return (std::min(y0 + p.kh, p.h) - std::max(y0, 0LL)) * (std::min(x0 + p.kw, p.w) - std::max(x0, 0LL));
}

template <class F>
void visit_float(DType t, F&& f) {
  cpu::visit(t, [&]<class T>() {
    if constexpr (std::is_floating_point_v<cpu::compute_t<T>>) f.template operator()<T>();
  });
}

template <class T, class C>
void store_all(const std::vector<C>& v, const Tensor& out) {
  T* po = cpu::ptr<T>(out);
  for (std::size_t i = 0; i < v.size(); ++i) po[i] = cpu::store<T>(v[i]);
}

void max_cpu(const OpArgs& a, std::span<Tensor> out) {
  const PoolParams p = geometry(a.inputs[0].shape(), a.attrs, a.name()).p;
  visit_float(out[0].dtype(), [&]<class T>() {
    using C = cpu::compute_t<T>;
    auto x = load_dense<T>(a.inputs[0]);
    std::vector<C> best(static_cast<std::size_t>(out[0].numel()), C(0));
    std::vector<std::int64_t> arg(best.size(), -1);
    std::vector<bool> nan_seen(best.size(), false);
    // The first maximum in window order wins; a NaN wins over everything and stops the search.
    for_each_window(p, [&](auto oi, auto xi, auto, auto) {
      const C v = x[xi];
      if (nan_seen[oi]) return;
      if (arg[oi] < 0 || v > best[oi] || v != v) {
        best[oi] = v;
        arg[oi] = xi % (p.h * p.w);
        nan_seen[oi] = v != v;
      }
    });
    store_all<T>(best, out[0]);
    std::copy(arg.begin(), arg.end(), cpu::ptr<std::int64_t>(out[1]));
  });
}

// ---- The fast max pooling: contiguous f32/f64, one plane per item over cpu::parallel_for, the
// same window order, tie and NaN rules as max_cpu. False for other dtypes.

template <class F>
void visit_f32_f64(DType t, F&& f) {
  if (t == DType::f32)
    f.template operator()<float>();
  else
    f.template operator()<double>();
}

// 2x2 windows, stride 2, no padding or dilation (the usual pooling): no bounds to check, and
// selects the compiler vectorizes. The first maximum wins; a NaN, the first in window order.
template <class T>
void max_2x2(const PoolParams& p, const T* px, T* py, std::int64_t* pi) {
  cpu::parallel_for(p.planes, 4, [&](std::int64_t pl0, std::int64_t pl1) {
    for (std::int64_t pl = pl0; pl < pl1; ++pl)
      for (long long oy = 0; oy < p.oh; ++oy) {
        const T* __restrict r0 = px + pl * p.h * p.w + 2 * oy * p.w;
        const T* __restrict r1 = r0 + p.w;
        T* __restrict y = py + (pl * p.oh + oy) * p.ow;
        std::int64_t* __restrict idx = pi + (pl * p.oh + oy) * p.ow;
        const std::int64_t top = 2 * oy * p.w;
        // Integer masks of T's width, not branches or float selects, so the loop vectorizes.
        using K = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
        for (long long ox = 0; ox < p.ow; ++ox) {
          const T v[4] = {r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1]};
          T best = v[0];
          K k = 0;  // window position: row k >> 1, column k & 1
          for (int j = 1; j < 4; ++j) {
            const K m = -K(v[j] > best);
            k = (k & ~m) | (K(j) & m);
            best = std::max(best, v[j]);
          }
          // In reverse, so the first NaN's mask is the last applied.
          K bits = std::bit_cast<K>(best);
          for (int j = 3; j >= 0; --j) {
            const K m = -K(v[j] != v[j]);
            k = (k & ~m) | (K(j) & m);
            bits = (bits & ~m) | (std::bit_cast<K>(v[j]) & m);
          }
          y[ox] = std::bit_cast<T>(bits);
          idx[ox] = top + 2 * ox + (k & 1) + (k >> 1) * p.w;
        }
      }
  });
}

bool max_fast(const OpArgs& a, std::span<Tensor> out) {
  const DType t = out[0].dtype();
  if (t != DType::f32 && t != DType::f64) return false;
  const PoolParams p = geometry(a.inputs[0].shape(), a.attrs, a.name()).p;
  NoGradGuard no_grad;
  const Tensor x = a.inputs[0].contiguous();
  visit_f32_f64(t, [&]<class T>() {
    const T* px = cpu::ptr<const T>(x);
    T* py = cpu::ptr<T>(out[0]);
    std::int64_t* pi = cpu::ptr<std::int64_t>(out[1]);
    if (p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.ph == 0 && p.pw == 0 && p.dh == 1 && p.dw == 1) {
      max_2x2(p, px, py, pi);
      return;
    }
    cpu::parallel_for(p.planes, 4, [&](std::int64_t pl0, std::int64_t pl1) {
      for (std::int64_t pl = pl0; pl < pl1; ++pl) {
        const T* in = px + pl * p.h * p.w;
        for (long long oy = 0; oy < p.oh; ++oy)
          for (long long ox = 0; ox < p.ow; ++ox) {
            T best = -std::numeric_limits<T>::infinity();
            std::int64_t arg = -1;
            bool nan = false;
            // Without a NaN in the window: "v > best" without branches (maxss and integer
            // arithmetic), since random data defeats a branch. The first maximum wins.
            for (long long ki = 0; ki < p.kh; ++ki) {
              const long long iy = oy * p.sh - p.ph + ki * p.dh;
              if (iy < 0 || iy >= p.h) continue;
              for (long long kj = 0; kj < p.kw; ++kj) {
                const long long ix = ox * p.sw - p.pw + kj * p.dw;
                if (ix < 0 || ix >= p.w) continue;
                const T v = in[iy * p.w + ix];
                const std::int64_t take = static_cast<std::int64_t>((v > best) | (arg < 0));
                arg += (iy * p.w + ix - arg) & -take;  // arithmetic: GCC keeps a branch for "take ?"
                best = std::max(best, v);
                nan = nan || v != v;
              }
            }
            if (arg < 0) best = T(0);  // an empty window, as max_cpu leaves it
            // With one: the first NaN, in window order, as max_cpu.
            for (long long ki = 0; nan && ki < p.kh; ++ki) {
              const long long iy = oy * p.sh - p.ph + ki * p.dh;
              if (iy < 0 || iy >= p.h) continue;
              for (long long kj = 0; nan && kj < p.kw; ++kj) {
                const long long ix = ox * p.sw - p.pw + kj * p.dw;
                if (ix < 0 || ix >= p.w || in[iy * p.w + ix] == in[iy * p.w + ix]) continue;
                best = in[iy * p.w + ix];
                arg = iy * p.w + ix;
                nan = false;
              }
            }
            const std::int64_t oi = (pl * p.oh + oy) * p.ow + ox;
            py[oi] = best;
            pi[oi] = arg;
          }
      }
    });
  });
  return true;
}

// Scatters each window's gradient to its index when that lies inside the window, as the
// reference's gather does; planes are independent, so they run in parallel.
// The 2x2, stride-2 windows of max_2x2 do not overlap and cover whole rows: each writes its
// four positions (the gradient at its index, zeros elsewhere), with no fill beforehand.
template <class T>
void max_backward_2x2(const PoolParams& p, const T* pg, const std::int64_t* pidx, T* pdx) {
  cpu::parallel_for(p.planes, 4, [&](std::int64_t pl0, std::int64_t pl1) {
    for (std::int64_t pl = pl0; pl < pl1; ++pl) {
      T* plane = pdx + pl * p.h * p.w;
      // Rows and columns no window covers (odd sizes) get zeros.
      if (p.h > 2 * p.oh) std::fill(plane + 2 * p.oh * p.w, plane + p.h * p.w, T(0));
      for (long long oy = 0; oy < p.oh; ++oy) {
        const T* __restrict g = pg + (pl * p.oh + oy) * p.ow;
        const std::int64_t* __restrict idx = pidx + (pl * p.oh + oy) * p.ow;
        T* __restrict r0 = plane + 2 * oy * p.w;
        T* __restrict r1 = r0 + p.w;
        const std::int64_t top = 2 * oy * p.w;
        for (long long ox = 0; ox < p.ow; ++ox) {
          const std::int64_t k = idx[ox] - top - 2 * ox;  // 0, 1, w or w + 1 for an index inside
          r0[2 * ox] = k == 0 ? g[ox] : T(0);
          r0[2 * ox + 1] = k == 1 ? g[ox] : T(0);
          r1[2 * ox] = k == p.w ? g[ox] : T(0);
          r1[2 * ox + 1] = k == p.w + 1 ? g[ox] : T(0);
        }
        if (p.w > 2 * p.ow) {
          std::fill(r0 + 2 * p.ow, r0 + p.w, T(0));
          std::fill(r1 + 2 * p.ow, r1 + p.w, T(0));
        }
      }
    }
  });
}

bool max_backward_fast(const OpArgs& a, const PoolParams& p, const Tensor& dx) {
  const DType t = dx.dtype();
  if (t != DType::f32 && t != DType::f64) return false;
  NoGradGuard no_grad;
  const Tensor g = a.inputs[0].contiguous(), idx = a.inputs[1].contiguous();
  visit_f32_f64(t, [&]<class T>() {
    const T* pg = cpu::ptr<const T>(g);
    const std::int64_t* pidx = cpu::ptr<const std::int64_t>(idx);
    T* pdx = cpu::ptr<T>(dx);
    if (p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.ph == 0 && p.pw == 0 && p.dh == 1 && p.dw == 1) {
      max_backward_2x2(p, pg, pidx, pdx);
      return;
    }
    cpu::parallel_for(p.planes, 4, [&](std::int64_t pl0, std::int64_t pl1) {
      std::fill(pdx + pl0 * p.h * p.w, pdx + pl1 * p.h * p.w, T(0));
      for (std::int64_t pl = pl0; pl < pl1; ++pl)
        for (long long oy = 0; oy < p.oh; ++oy)
          for (long long ox = 0; ox < p.ow; ++ox) {
            const std::int64_t oi = (pl * p.oh + oy) * p.ow + ox, i = pidx[oi];
            if (i < 0 || i >= p.h * p.w) continue;
            const long long dy = i / p.w - (oy * p.sh - p.ph), dxx = i % p.w - (ox * p.sw - p.pw);
            if (dy < 0 || dy % p.dh || dy / p.dh >= p.kh || dxx < 0 || dxx % p.dw || dxx / p.dw >= p.kw) continue;
            pdx[pl * p.h * p.w + i] += pg[oi];
          }
    });
  });
  return true;
}

void avg_cpu(const OpArgs& a, std::span<Tensor> out) {
  const PoolParams p = geometry(a.inputs[0].shape(), a.attrs, a.name()).p;
  visit_float(out[0].dtype(), [&]<class T>() {
    using C = cpu::compute_t<T>;
    auto x = load_dense<T>(a.inputs[0]);
    std::vector<C> s(static_cast<std::size_t>(out[0].numel()), C(0));
    for_each_window(p, [&](auto oi, auto xi, auto, auto) { s[oi] += x[xi]; });
    for (long long i = 0; i < static_cast<long long>(s.size()); ++i)
      s[i] /= static_cast<C>(avg_divisor(p, (i / p.ow) % p.oh, i % p.ow));
    store_all<T>(s, out[0]);
  });
}

template <class... Args>
void launch(const gpu::LazyKernel& k, DType t, long long items, const rt::Stream& s, const Args&... args) {
  if (items == 0) return;
  const rt::Function f = rt::get_function(k.get(), DTypes{t}, 0, s.device());
  rt::launch(f, kernels::grid_stride_config(static_cast<std::uint64_t>(items), s.device()), s, args...);
}

Attrs with_input_shape(const Attrs& attrs, const Shape& shape) {
  Attrs a = attrs;
  a.set("input_shape", std::vector<std::int64_t>(shape.begin(), shape.end()));
  return a;
}

// The geometry of a backward op: input_shape from attrs, the gradient checked against it.
PoolGeom backward_geometry(const OpArgs& a) {
  const PoolGeom g = geometry(a.attrs.get<std::vector<std::int64_t>>("input_shape"), a.attrs, a.name());
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    if (a.inputs[i].shape() != g.out)
      throw ShapeError("[" + a.name() + "] input " + std::to_string(i) + " has shape " + paren(a.inputs[i].shape()) +
                       ", expected the pooled shape " + paren(g.out));
  return g;
}

void max_backward_cpu(const OpArgs& a, std::span<Tensor> out) {
  const PoolParams p = backward_geometry(a).p;
  visit_float(out[0].dtype(), [&]<class T>() {
    using C = cpu::compute_t<T>;
    auto g = load_dense<T>(a.inputs[0]);
    auto idx = a.inputs[1].contiguous().to_vector<std::int64_t>();
    std::vector<C> dx(static_cast<std::size_t>(out[0].numel()), C(0));
    // A window's gradient goes to its index only when that lies inside the window, as
    // in the GPU kernel's gather; other indices reach no element.
    for_each_window(p, [&](auto oi, auto xi, auto, auto) {
      if (idx[static_cast<std::size_t>(oi)] == xi % (p.h * p.w))
        dx[static_cast<std::size_t>(xi)] += g[static_cast<std::size_t>(oi)];
    });
    store_all<T>(dx, out[0]);
  });
}

const OpRef kMaxBackward = register_op({
    .name = "max_pool2d_backward",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          const DType t = a.inputs[0].dtype();
          return DTypePlan{{t, DType::i64}, {t}, t};
        },
    .shape_rule = [](const OpArgs& a) { return std::vector<Shape>{backward_geometry(a).in}; },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const PoolParams p = backward_geometry(a).p;
          auto fast = [&](const OpArgs& args, std::span<Tensor> o) { return max_backward_fast(args, p, o[0]); };
          if (!fast(a, out) && !cpu_fast::through_f32(a, out, {0}, fast)) max_backward_cpu(a, out);
        },
    .cpu_reference = max_backward_cpu,
    .gpu =
        [k = gpu::LazyKernel("max_pool2d_backward")](const OpArgs& a, std::span<Tensor> out) {
          const PoolParams p = backward_geometry(a).p;
          const Tensor g = gpu::contiguous(a.inputs[0]), idx = gpu::contiguous(a.inputs[1]);
          // Tiling windows take a thread each (kernel_templates/pool.cu), other geometries one per element.
          const bool tiles = p.kh == p.sh && p.kw == p.sw && p.ph == 0 && p.pw == 0 && p.dh == 1 && p.dw == 1;
          const long long items =
              tiles ? p.planes * ((p.h + p.sh - 1) / p.sh) * ((p.w + p.sw - 1) / p.sw) : p.planes * p.h * p.w;
          launch(k, out[0].dtype(), items, stream_of(a.device), device_address(g), device_address(idx),
                 device_address(out[0]), p);
        },
    // Gradients of the pooled shape and argmax indices within each 4x4 plane.
    .test = {.attrs = {Attrs{{"kernel", std::vector<std::int64_t>{2}},
                             {"input_shape", std::vector<std::int64_t>{2, 3, 4, 4}}}},
             .gradcheck = false,
             .inputs = {{}, {.dtype = DType::i64, .low = 0, .high = 16}},
             .shapes = {{{2, 3, 2, 2}, {2, 3, 2, 2}}}},
});

const OpRef kAvgBackward = register_op({
    .name = "avg_pool2d_backward",
    .dtypes = dtype_sets::floating,
    .shape_rule = [](const OpArgs& a) { return std::vector<Shape>{backward_geometry(a).in}; },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const PoolParams p = backward_geometry(a).p;
          visit_float(out[0].dtype(), [&]<class T>() {
            using C = cpu::compute_t<T>;
            auto g = load_dense<T>(a.inputs[0]);
            std::vector<C> dx(static_cast<std::size_t>(out[0].numel()), C(0));
            for_each_window(p, [&](auto oi, auto xi, auto oy, auto ox) {
              dx[xi] += g[oi] / static_cast<C>(avg_divisor(p, oy, ox));
            });
            store_all<T>(dx, out[0]);
          });
        },
    .gpu =
        [k = gpu::LazyKernel("avg_pool2d_backward")](const OpArgs& a, std::span<Tensor> out) {
          const PoolParams p = backward_geometry(a).p;
          const Tensor g = gpu::contiguous(a.inputs[0]);
          launch(k, out[0].dtype(), p.planes * p.h * p.w, stream_of(a.device), device_address(g),
                 device_address(out[0]), p);
        },
    .test = {.attrs = {Attrs{{"kernel", std::vector<std::int64_t>{2}},
                             {"input_shape", std::vector<std::int64_t>{2, 3, 4, 4}}}},
             .gradcheck = false,
             .shapes = {{{2, 3, 2, 2}}}},
});

std::vector<Shape> pooled_shape(const OpArgs& a, int outputs) {
  return std::vector<Shape>(static_cast<std::size_t>(outputs), geometry(a.inputs[0].shape(), a.attrs, a.name()).out);
}

using Dims = std::vector<std::int64_t>;

const OpRef kMaxPool = register_op({
    .name = "max_pool2d",
    .num_outputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          const DType t = a.inputs[0].dtype();
          return DTypePlan{{t}, {t, DType::i64}, t};
        },
    .shape_rule = [](const OpArgs& a) { return pooled_shape(a, 2); },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          if (!max_fast(a, out) && !cpu_fast::through_f32(a, out, {0}, max_fast)) max_cpu(a, out);
        },
    .cpu_reference = max_cpu,
    .gpu =
        [k = gpu::LazyKernel("max_pool2d")](const OpArgs& a, std::span<Tensor> out) {
          const PoolParams p = geometry(a.inputs[0].shape(), a.attrs, a.name()).p;
          const Tensor x = gpu::contiguous(a.inputs[0]);
          launch(k, out[0].dtype(), p.planes * p.oh * p.ow, stream_of(a.device), device_address(x),
                 device_address(out[0]), device_address(out[1]), p);
        },
    // Each output's gradient goes to the input element its saved index names.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      return {call(kMaxBackward, {g[0], c.saved_output(1)}, with_input_shape(c.attrs(), c.input(0).shape))};
    },
    .differentiable_outputs = 1,  // the indices carry no gradient: no zeros are filled for them
    .save = {.outputs = {1}},
    .test = {.attrs = {Attrs{{"kernel", Dims{2}}}, Attrs{{"kernel", Dims{3}}, {"stride", Dims{2}}, {"padding", Dims{1}}},
                       Attrs{{"kernel", Dims{2, 3}}, {"stride", Dims{1}}, {"dilation", Dims{2, 1}}}}},
});

const OpRef kAvgPool = register_op({
    .name = "avg_pool2d",
    .dtypes = dtype_sets::floating,
    .shape_rule = [](const OpArgs& a) { return pooled_shape(a, 1); },
    .cpu = avg_cpu,
    .gpu =
        [k = gpu::LazyKernel("avg_pool2d")](const OpArgs& a, std::span<Tensor> out) {
          const PoolGeom g = geometry(a.inputs[0].shape(), a.attrs, a.name());
          const Tensor x = gpu::contiguous(a.inputs[0]);
          launch(k, out[0].dtype(), g.p.planes * g.p.oh * g.p.ow, stream_of(a.device), device_address(x),
                 device_address(out[0]), g.p);
        },
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      return {call(kAvgBackward, {g[0]}, with_input_shape(c.attrs(), c.input(0).shape))};
    },
    .test = {.attrs = {Attrs{{"kernel", Dims{2}}},
                       Attrs{{"kernel", Dims{3}}, {"stride", Dims{2}}, {"padding", Dims{1}}, {"count_include_pad", false}},
                       Attrs{{"kernel", Dims{3, 2}}, {"stride", Dims{1}}, {"padding", Dims{1, 0}}}}},
});

Attrs pool_attrs(const Dims& kernel, const Dims& stride, const Dims& padding) {
  return Attrs{{"kernel", kernel}, {"stride", stride}, {"padding", padding}};
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Dims kernel, Dims stride, Dims padding, Dims dilation) {
  Attrs attrs = pool_attrs(kernel, stride, padding);
  attrs.set("dilation", std::move(dilation));
  return dispatch(kMaxPool, std::vector<Tensor>{x}, attrs)[0];
}

Tensor avg_pool2d(const Tensor& x, Dims kernel, Dims stride, Dims padding, bool count_include_pad) {
  Attrs attrs = pool_attrs(kernel, stride, padding);
  attrs.set("count_include_pad", count_include_pad);
  return dispatch(kAvgPool, std::vector<Tensor>{x}, attrs)[0];
}

}  // namespace kiln
