#include "conv_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/gemm_cpu.h"
#include "core/cpu/parallel.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"

namespace kiln::conv_detail {

namespace {

// Elements of the column buffer per chunk of samples: 4 MiB of f32, so a chunk's columns stay
// in the last-level cache between im2col and the GEMM (the cnn's step: 16 MiB 113 ms, 4 MiB 98).
constexpr std::int64_t kColsPerChunk = std::int64_t{1} << 20;

// Scratch that lives across calls: a training step would otherwise map and fault in tens of
// MiB per convolution. One per slot and thread, grown as needed.
template <class T>
T* scratch(int slot, std::int64_t elements) {
  thread_local std::vector<T> buffers[2];
  std::vector<T>& b = buffers[slot];
  if (static_cast<std::int64_t>(b.size()) < elements) {
    b.clear();
    b.shrink_to_fit();
    b.resize(static_cast<std::size_t>(elements));
  }
  return b.data();
}

struct CpuPlan {
  const ConvGeometry& s;
  std::int64_t L, K, gk, cg, og, nb;  // L = oh*ow; K = c*kh*kw rows of cols; gk = K / groups
};

CpuPlan plan_of(const ConvGeometry& s) {
  const std::int64_t L = s.oh * s.ow, K = s.c * s.kh * s.kw;
  const std::int64_t per = std::max<std::int64_t>(K * L, 1);
  const std::int64_t nb = std::clamp<std::int64_t>(kColsPerChunk / per, 1, std::max<std::int64_t>(s.n, 1));
  return {s, L, K, K / s.groups, s.c / s.groups, s.o / s.groups, nb};
}

// The outputs ox whose input column ox*sw + x0 lies in [0, w): [lo, hi).
struct Span {
  std::int64_t lo, hi;
};
Span valid_columns(const ConvGeometry& s, std::int64_t x0) {
  const std::int64_t lo = x0 >= 0 ? 0 : (-x0 + s.sw - 1) / s.sw;
  const std::int64_t hi = x0 >= s.w ? 0 : std::min(s.ow, (s.w - 1 - x0) / s.sw + 1);
  return {std::min(lo, s.ow), std::max(std::min(lo, s.ow), hi)};
}

// cols (K, b*L): row (c, ki, kj), column (n, oy, ox) = x[n0+n, c, oy*sh-ph+ki*dh, ox*sw-pw+kj*dw],
// 0 over the padding. The bounds are worked out per row so the inner loops have no branches.
// Stride 1 with the output as wide as the input (as "same" convs are): a tap's rows are the
// plane shifted, so the valid rows are one contiguous copy, whose columns that wrapped around
// a row end are then zeroed (each row loop of the general path costs more than its copy).
template <class T>
void shifted_plane(const ConvGeometry& s, const T* plane, std::int64_t ki, std::int64_t x0, Span v, T* out) {
  const std::int64_t L = s.oh * s.ow;
  const std::int64_t oy0 = std::clamp<std::int64_t>(s.ph - ki * s.dh, 0, s.oh);
  const std::int64_t oy1 = std::clamp<std::int64_t>(s.h + s.ph - ki * s.dh, oy0, s.oh);
  std::fill(out, out + oy0 * s.ow, T(0));
  std::fill(out + oy1 * s.ow, out + L, T(0));
  if (oy1 == oy0) return;
  // out[j] = plane[first + j] over the valid rows, clipped to the plane (what is clipped lies
  // in an edge column, zeroed below).
  const std::int64_t first = (oy0 - s.ph + ki * s.dh) * s.w + x0, count = (oy1 - oy0) * s.ow;
  const std::int64_t lo = std::max<std::int64_t>(0, -first), hi = std::min(count, s.h * s.w - first);
  T* band = out + oy0 * s.ow;
  if (hi > lo) std::memcpy(band + lo, plane + first + lo, sizeof(T) * static_cast<std::size_t>(hi - lo));
  for (std::int64_t oy = oy0; oy < oy1; ++oy) {
    T* row = out + oy * s.ow;
    std::fill(row, row + v.lo, T(0));
    std::fill(row + v.hi, row + s.ow, T(0));
  }
}

template <class T>
void im2col(const CpuPlan& p, const T* x, std::int64_t b, T* cols) {
  const ConvGeometry& s = p.s;
  const bool shifted = s.sh == 1 && s.sw == 1 && s.ow == s.w;
  cpu::parallel_for(p.K, 1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t c = r / (s.kh * s.kw), ki = (r / s.kw) % s.kh, kj = r % s.kw;
      const std::int64_t x0 = kj * s.dw - s.pw;
      const Span v = valid_columns(s, x0);
      for (std::int64_t n = 0; n < b; ++n) {
        const T* plane = x + (n * s.c + c) * s.h * s.w;
        T* row = cols + (r * b + n) * p.L;
        if (shifted) {
          shifted_plane(s, plane, ki, x0, v, row);
          continue;
        }
        for (std::int64_t oy = 0; oy < s.oh; ++oy, row += s.ow) {
          const std::int64_t iy = oy * s.sh - s.ph + ki * s.dh;
          if (iy < 0 || iy >= s.h) {
            for (std::int64_t ox = 0; ox < s.ow; ++ox) row[ox] = T(0);
            continue;
          }
          // Plain loops: rows are short (the output width), where a memcpy call per row costs more.
          const T* in = plane + iy * s.w;
          std::int64_t ox = 0;
          for (; ox < v.lo; ++ox) row[ox] = T(0);
          for (; ox < v.hi; ++ox) row[ox] = in[ox * s.sw + x0];
          for (; ox < s.ow; ++ox) row[ox] = T(0);
        }
      }
    }
  });
}

// The adjoint of im2col: dx[n0+n] = sum over the taps of cols, one (n, c) plane per item.
template <class T>
void col2im(const CpuPlan& p, const T* cols, std::int64_t b, T* dx) {
  const ConvGeometry& s = p.s;
  cpu::parallel_for(b * s.c, 1, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t n = i / s.c, c = i % s.c;
      T* plane = dx + i * s.h * s.w;
      std::fill(plane, plane + s.h * s.w, T(0));
      for (std::int64_t ki = 0; ki < s.kh; ++ki)
        for (std::int64_t kj = 0; kj < s.kw; ++kj) {
          const T* row = cols + (((c * s.kh + ki) * s.kw + kj) * b + n) * p.L;
          const std::int64_t x0 = kj * s.dw - s.pw;
          const Span v = valid_columns(s, x0);
          for (std::int64_t oy = 0; oy < s.oh; ++oy, row += s.ow) {
            const std::int64_t iy = oy * s.sh - s.ph + ki * s.dh;
            if (iy < 0 || iy >= s.h) continue;
            T* out = plane + iy * s.w;
            if (s.sw == 1)
              for (std::int64_t ox = v.lo; ox < v.hi; ++ox) out[ox + x0] += row[ox];
            else
              for (std::int64_t ox = v.lo; ox < v.hi; ++ox) out[ox * s.sw + x0] += row[ox];
          }
        }
    }
  });
}

// (b, O, L) <-> (O, b*L): samples-major as the tensors are, channels-major as the GEMMs want.
template <class T>
void to_channels_major(const CpuPlan& p, const T* src, std::int64_t b, T* dst) {
  cpu::parallel_for(b * p.s.o, 4, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i)
      std::memcpy(dst + ((i % p.s.o) * b + i / p.s.o) * p.L, src + i * p.L, sizeof(T) * p.L);
  });
}
template <class T>
void to_samples_major(const CpuPlan& p, const T* src, std::int64_t b, T* dst) {
  cpu::parallel_for(b * p.s.o, 4, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i)
      std::memcpy(dst + i * p.L, src + ((i % p.s.o) * b + i / p.s.o) * p.L, sizeof(T) * p.L);
  });
}

// C (m, n) = alpha * A @ B + beta * C, each row-major with the given row and column strides.
void gemm(DType t, std::int64_t m, std::int64_t n, std::int64_t k, cpu::GemmOperand a, cpu::GemmOperand b, double beta,
          cpu::GemmOutput c) {
  cpu::gemm(t, {1, m, n, k}, 1.0, a, b, beta, c);
}

template <class T>
void forward(const CpuPlan& p, DType t, const T* x, const T* w, T* y) {
  const ConvGeometry& s = p.s;
  T* cols = scratch<T>(0, p.K * p.nb * p.L);
  T* tmp = scratch<T>(1, s.o * p.nb * p.L);
  for (std::int64_t n0 = 0; n0 < s.n; n0 += p.nb) {
    const std::int64_t b = std::min(p.nb, s.n - n0), bl = b * p.L;
    im2col(p, x + n0 * s.c * s.h * s.w, b, cols);
    // tmp[group] (og, b*L) = w[group] (og, gk) @ cols[group] (gk, b*L)
    for (std::int64_t g = 0; g < s.groups; ++g)
      gemm(t, p.og, bl, p.gk, {w + g * p.og * p.gk, 0, p.gk, 1}, {cols + g * p.gk * bl, 0, bl, 1}, 0,
           {tmp + g * p.og * bl, 0, bl, 1});
    to_samples_major(p, tmp, b, y + n0 * s.o * p.L);
  }
}

template <class T>
void grad_input(const CpuPlan& p, DType t, const T* gy, const T* w, T* dx) {
  const ConvGeometry& s = p.s;
  T* cols = scratch<T>(0, p.K * p.nb * p.L);
  T* gt = scratch<T>(1, s.o * p.nb * p.L);
  for (std::int64_t n0 = 0; n0 < s.n; n0 += p.nb) {
    const std::int64_t b = std::min(p.nb, s.n - n0), bl = b * p.L;
    to_channels_major(p, gy + n0 * s.o * p.L, b, gt);
    // cols[group] (gk, b*L) = w[group]^T (gk, og) @ gt[group] (og, b*L)
    for (std::int64_t g = 0; g < s.groups; ++g)
      gemm(t, p.gk, bl, p.og, {w + g * p.og * p.gk, 0, 1, p.gk}, {gt + g * p.og * bl, 0, bl, 1}, 0,
           {cols + g * p.gk * bl, 0, bl, 1});
    col2im(p, cols, b, dx + n0 * s.c * s.h * s.w);
  }
}

template <class T>
void grad_weight(const CpuPlan& p, DType t, const T* x, const T* gy, T* dw) {
  const ConvGeometry& s = p.s;
  if (s.n == 0) std::fill(dw, dw + s.o * p.gk, T(0));
  T* cols = scratch<T>(0, p.K * p.nb * p.L);
  T* gt = scratch<T>(1, s.o * p.nb * p.L);
  for (std::int64_t n0 = 0; n0 < s.n; n0 += p.nb) {
    const std::int64_t b = std::min(p.nb, s.n - n0), bl = b * p.L;
    im2col(p, x + n0 * s.c * s.h * s.w, b, cols);
    to_channels_major(p, gy + n0 * s.o * p.L, b, gt);
    // dw[group] (og, gk) += gt[group] (og, b*L) @ cols[group]^T (b*L, gk)
    for (std::int64_t g = 0; g < s.groups; ++g)
      gemm(t, p.og, p.gk, bl, {gt + g * p.og * bl, 0, bl, 1}, {cols + g * p.gk * bl, 0, 1, bl}, n0 == 0 ? 0.0 : 1.0,
           {dw + g * p.og * p.gk, 0, p.gk, 1});
  }
}

}  // namespace

bool run_conv_cpu(ConvPass pass, const ConvGeometry& s, const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  const DType t = out.dtype();
  if (a_in.dtype() != t || b_in.dtype() != t) return false;
  NoGradGuard no_grad;  // contiguous copies of views need no history
  if (t == DType::f16 || t == DType::bf16) {
    // In f32, as the kernels and the reference accumulate, rounded once at the end.
    Tensor wide = empty(out.shape(), {.dtype = DType::f32});
    run_conv_cpu(pass, s, a_in.to(DType::f32), b_in.to(DType::f32), wide);
    Tensor(out).copy_(wide);
    return true;
  }
  if (t != DType::f32 && t != DType::f64) return false;
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
#if KILN_HAVE_DNNL
  if (t == DType::f32 && run_conv_dnnl(pass, s, a, b, out)) return true;
#endif
  const CpuPlan p = plan_of(s);
  auto run = [&]<class T>() {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (pass == ConvPass::forward) forward<T>(p, t, pa, pb, po);
    if (pass == ConvPass::grad_input) grad_input<T>(p, t, pa, pb, po);
    if (pass == ConvPass::grad_weight) grad_weight<T>(p, t, pa, pb, po);
  };
  if (t == DType::f32)
    run.template operator()<float>();
  else
    run.template operator()<double>();
  return true;
}

}  // namespace kiln::conv_detail
