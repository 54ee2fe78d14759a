#include "gemm_cpu.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/error.h"
#include "kiln/half.h"
#include "parallel.h"

#ifndef KILN_HAVE_OPENBLAS
#define KILN_HAVE_OPENBLAS 0
#endif

#if KILN_HAVE_OPENBLAS
// Declared here, not taken from cblas.h: a machine may have the library without its headers.
// The CBLAS enums are passed as ints, as the C ABI does.
extern "C" {
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc);
void openblas_set_num_threads(int threads);
}
#endif

namespace kiln::cpu {

namespace {

constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

// What each storage type accumulates in: f32 for the half types, and unsigned integers so
// integer products wrap modulo 2^bits exactly (signed overflow would be undefined).
template <class T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<Half> {
  using type = float;
};
template <>
struct AccOf<BFloat16> {
  using type = float;
};
template <>
struct AccOf<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct AccOf<std::int64_t> {
  using type = std::uint64_t;
};
template <class T>
using acc_t = typename AccOf<T>::type;

template <class T>
inline acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<float>(v);
  else
    return static_cast<acc_t<T>>(v);
}
template <class T>
inline T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(v);
  else
    return static_cast<T>(v);  // modulo 2^bits for the integers (C++20)
}
// alpha/beta in the accumulator type; checked integral beforehand for the integer dtypes.
template <class T>
inline acc_t<T> scalar_as(double v) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<acc_t<T>>(static_cast<std::int64_t>(v));
  else
    return static_cast<acc_t<T>>(v);
}

template <class F>
void visit_gemm_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::f16:
      return f.template operator()<Half>();
    case DType::bf16:
      return f.template operator()<BFloat16>();
    case DType::i32:
      return f.template operator()<std::int32_t>();
    case DType::i64:
      return f.template operator()<std::int64_t>();
    default:
      throw DTypeError("[gemm] dtype " + std::string(dtype_name(dtype)) +
                       " is not supported on the CPU (f32, f64, f16, bf16, i32, i64)");
  }
}

// Validates the call; false when there is nothing to do (an empty batch or output).
bool check_args(DType dtype, const GemmShape& s, double alpha, double beta, const GemmOutput& c) {
  if (s.batch < 0 || s.m < 0 || s.n < 0 || s.k < 0)
    throw ShapeError("[gemm] negative size: batch=" + std::to_string(s.batch) + " m=" + std::to_string(s.m) +
                     " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
  visit_gemm_dtype(dtype, []<class T>() {});  // DTypeError for the rest
  if (is_integral(dtype)) {
    for (double v : {alpha, beta})
      if (!(std::trunc(v) == v && std::fabs(v) < 9.2e18))
        throw ValueError("[gemm] integer gemm needs integral alpha and beta, got " + std::to_string(v));
  }
  if (s.batch == 0 || s.m == 0 || s.n == 0) return false;
  if (s.batch > 1 && c.batch_stride == 0)
    throw ValueError("[gemm] the output cannot broadcast over a batch of " + std::to_string(s.batch));
  return true;
}

// C = beta * C: the whole job when K == 0 or alpha == 0. beta == 0 writes zeros unread.
template <class T>
void scale_output(const GemmShape& s, double beta, const GemmOutput& c) {
  if (beta == 1) return;
  const acc_t<T> be = scalar_as<T>(beta);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    T* cb = static_cast<T*>(c.data) + b * c.batch_stride;
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        T& out = cb[i * c.row_stride + j * c.col_stride];
        out = beta == 0 ? from_acc<T>(acc_t<T>(0)) : from_acc<T>(be * to_acc(out));
      }
  }
}

// ---- Blocked loops: C tiles of kMC x kNC accumulate over K in kKC slices of packed A and B ----

constexpr std::int64_t kMC = 64, kNC = 256, kKC = 256;
constexpr int kMR = 4;
template <class Acc>
constexpr int kNR = sizeof(Acc) == 4 ? 8 : 4;  // two SSE registers a row

// acc (MR x NR, in registers) = sum_p a[p][:] outer b[p][:], added into the C tile.
template <class Acc, int NR>
inline void micro_kernel(std::int64_t kc, const Acc* __restrict a, const Acc* __restrict b, Acc* __restrict tile,
                         std::int64_t ld_tile, int rows, int cols) {
  Acc acc[kMR][NR] = {};
  for (std::int64_t p = 0; p < kc; ++p)
    for (int i = 0; i < kMR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[p * kMR + i] * b[p * NR + j];
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) tile[i * ld_tile + j] += acc[i][j];
}

// Packs the (mc x kc) block of A at `a` into panels of kMR rows, p-major, zero-padded.
template <class T>
void pack_a(const T* a, std::int64_t rs, std::int64_t cs, std::int64_t mc, std::int64_t kc, acc_t<T>* dst) {
  for (std::int64_t ir = 0; ir < mc; ir += kMR, dst += kMR * kc) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kMR, mc - ir));
    for (std::int64_t p = 0; p < kc; ++p)
      for (int i = 0; i < kMR; ++i) dst[p * kMR + i] = i < rows ? to_acc(a[(ir + i) * rs + p * cs]) : acc_t<T>(0);
  }
}

// Packs the (kc x nc) block of B at `b` into panels of NR columns, p-major, zero-padded.
template <class T, int NR>
void pack_b(const T* b, std::int64_t rs, std::int64_t cs, std::int64_t kc, std::int64_t nc, acc_t<T>* dst) {
  for (std::int64_t jr = 0; jr < nc; jr += NR, dst += NR * kc) {
    const int cols = static_cast<int>(std::min<std::int64_t>(NR, nc - jr));
    for (std::int64_t p = 0; p < kc; ++p)
      for (int j = 0; j < NR; ++j) dst[p * NR + j] = j < cols ? to_acc(b[p * rs + (jr + j) * cs]) : acc_t<T>(0);
  }
}

template <class T>
void run_blocked(const GemmShape& s, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
                 const GemmOutput& c) {
  using Acc = acc_t<T>;
  constexpr int NR = kNR<Acc>;
  const Acc al = scalar_as<T>(alpha), be = scalar_as<T>(beta);
  std::vector<Acc> ap(static_cast<std::size_t>(kMC * kKC));
  std::vector<Acc> bp(static_cast<std::size_t>(kKC * kNC));
  std::vector<Acc> tile(static_cast<std::size_t>(kMC * kNC));
  for (std::int64_t bi = 0; bi < s.batch; ++bi) {
    const T* ab = static_cast<const T*>(a.data) + bi * a.batch_stride;
    const T* bb = static_cast<const T*>(b.data) + bi * b.batch_stride;
    T* cb = static_cast<T*>(c.data) + bi * c.batch_stride;
    for (std::int64_t ic = 0; ic < s.m; ic += kMC) {
      const std::int64_t mc = std::min(kMC, s.m - ic);
      for (std::int64_t jc = 0; jc < s.n; jc += kNC) {
        const std::int64_t nc = std::min(kNC, s.n - jc);
        std::fill(tile.begin(), tile.end(), Acc(0));
        for (std::int64_t pc = 0; pc < s.k; pc += kKC) {
          const std::int64_t kc = std::min(kKC, s.k - pc);
          pack_a(ab + ic * a.row_stride + pc * a.col_stride, a.row_stride, a.col_stride, mc, kc, ap.data());
          pack_b<T, NR>(bb + pc * b.row_stride + jc * b.col_stride, b.row_stride, b.col_stride, kc, nc, bp.data());
          for (std::int64_t jr = 0; jr < nc; jr += NR)
            for (std::int64_t ir = 0; ir < mc; ir += kMR)
              micro_kernel<Acc, NR>(kc, ap.data() + ir * kc, bp.data() + jr * kc, tile.data() + ir * kNC + jr, kNC,
                                    static_cast<int>(std::min<std::int64_t>(kMR, mc - ir)),
                                    static_cast<int>(std::min<std::int64_t>(NR, nc - jr)));
        }
        for (std::int64_t i = 0; i < mc; ++i)
          for (std::int64_t j = 0; j < nc; ++j) {
            T& out = cb[(ic + i) * c.row_stride + (jc + j) * c.col_stride];
            Acc v = al * tile[static_cast<std::size_t>(i * kNC + j)];
            if (beta != 0) v += be * to_acc(out);
            out = from_acc<T>(v);
          }
      }
    }
  }
}

// ---- OpenBLAS ----

#if KILN_HAVE_OPENBLAS
bool fits_int(std::int64_t v) { return v <= INT_MAX; }

template <class T>
void call_blas(const BlasGemm& g, T alpha, const T* first, const T* second, T beta, T* c) {
  const int ta = g.a.trans ? kCblasTrans : kCblasNoTrans, tb = g.b.trans ? kCblasTrans : kCblasNoTrans;
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(kCblasRowMajor, ta, tb, i(g.m), i(g.n), i(g.k), alpha, first, i(g.a.ld), second, i(g.b.ld), beta, c,
                i(g.c.ld));
  else
    cblas_dgemm(kCblasRowMajor, ta, tb, i(g.m), i(g.n), i(g.k), alpha, first, i(g.a.ld), second, i(g.b.ld), beta, c,
                i(g.c.ld));
}

// f32/f64 straight from the caller's memory, one call per batch.
template <class T>
bool blas_direct(const GemmShape& s, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
                 const GemmOutput& c) {
  auto g = blas_gemm(s.m, s.n, s.k, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride, c.col_stride);
  if (!g || !fits_int(g->a.ld) || !fits_int(g->b.ld) || !fits_int(g->c.ld)) return false;
  for (std::int64_t bi = 0; bi < s.batch; ++bi) {
    const T* ab = static_cast<const T*>(a.data) + bi * a.batch_stride;
    const T* bb = static_cast<const T*>(b.data) + bi * b.batch_stride;
    T* cb = static_cast<T*>(c.data) + bi * c.batch_stride;
    call_blas<T>(*g, static_cast<T>(alpha), g->swap_ab ? bb : ab, g->swap_ab ? ab : bb, static_cast<T>(beta), cb);
  }
  return true;
}

template <class T, class U>
void copy_matrix(const T* src, std::int64_t rs, std::int64_t cs, std::int64_t rows, std::int64_t cols, U* dst,
                 std::int64_t dst_rs, std::int64_t dst_cs) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) dst[i * dst_rs + j * dst_cs] = static_cast<U>(src[i * rs + j * cs]);
}

// f16/bf16: contiguous f32 copies into sgemm, rounded once on the way back.
template <class T>
bool blas_via_f32(const GemmShape& s, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
                  const GemmOutput& c) {
  std::vector<float> fa(static_cast<std::size_t>(s.m * s.k)), fb(static_cast<std::size_t>(s.k * s.n));
  std::vector<float> fc(static_cast<std::size_t>(s.m * s.n));
  const BlasGemm g{false, s.m, s.n, s.k, {false, s.k}, {false, s.n}, {false, s.n}};
  for (std::int64_t bi = 0; bi < s.batch; ++bi) {
    const T* ab = static_cast<const T*>(a.data) + bi * a.batch_stride;
    const T* bb = static_cast<const T*>(b.data) + bi * b.batch_stride;
    T* cb = static_cast<T*>(c.data) + bi * c.batch_stride;
    // A broadcast operand is converted once.
    if (bi == 0 || a.batch_stride != 0) copy_matrix(ab, a.row_stride, a.col_stride, s.m, s.k, fa.data(), s.k, 1);
    if (bi == 0 || b.batch_stride != 0) copy_matrix(bb, b.row_stride, b.col_stride, s.k, s.n, fb.data(), s.n, 1);
    if (beta != 0) copy_matrix(cb, c.row_stride, c.col_stride, s.m, s.n, fc.data(), s.n, 1);
    call_blas<float>(g, static_cast<float>(alpha), fa.data(), fb.data(), static_cast<float>(beta), fc.data());
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j)
        cb[i * c.row_stride + j * c.col_stride] = T(fc[static_cast<std::size_t>(i * s.n + j)]);
  }
  return true;
}
#endif

// The BLAS path after check_args and the trivial cases.
bool run_blas(DType dtype, const GemmShape& s, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
              const GemmOutput& c) {
#if KILN_HAVE_OPENBLAS
  if (!fits_int(s.m) || !fits_int(s.n) || !fits_int(s.k)) return false;
  switch (dtype) {
    case DType::f32:
      return blas_direct<float>(s, alpha, a, b, beta, c);
    case DType::f64:
      return blas_direct<double>(s, alpha, a, b, beta, c);
    case DType::f16:
      return fits_int(s.m * s.k) && fits_int(s.k * s.n) && fits_int(s.m * s.n) &&
             blas_via_f32<Half>(s, alpha, a, b, beta, c);
    case DType::bf16:
      return fits_int(s.m * s.k) && fits_int(s.k * s.n) && fits_int(s.m * s.n) &&
             blas_via_f32<BFloat16>(s, alpha, a, b, beta, c);
    default:
      return false;
  }
#else
  (void)dtype, (void)s, (void)alpha, (void)a, (void)b, (void)beta, (void)c;
  return false;
#endif
}

// K == 0 or alpha == 0: only beta * C is left.
bool only_scale(const GemmShape& s, double alpha) { return s.k == 0 || alpha == 0; }

}  // namespace

bool have_blas() { return KILN_HAVE_OPENBLAS != 0; }

void gemm_blocked(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b,
                  double beta, const GemmOutput& c) {
  if (!check_args(dtype, shape, alpha, beta, c)) return;
  visit_gemm_dtype(dtype, [&]<class T>() {
    if (only_scale(shape, alpha))
      scale_output<T>(shape, beta, c);
    else
      run_blocked<T>(shape, alpha, a, b, beta, c);
  });
}

namespace {

// kiln threads big products itself (slices of C over cpu::parallel_for) and keeps OpenBLAS on
// one thread: its workers busy-wait after each call, and beside kiln's own threads (im2col,
// pooling, norms) on the same cores the two pools slow each other down.
void blas_single_threaded() {
#if KILN_HAVE_OPENBLAS
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
#endif
}

}  // namespace

bool gemm_blas(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b,
               double beta, const GemmOutput& c) {
  if (!have_blas() || !is_floating(dtype)) {
    check_args(dtype, shape, alpha, beta, c);
    return false;
  }
  if (!check_args(dtype, shape, alpha, beta, c)) return true;
  blas_single_threaded();
  if (only_scale(shape, alpha)) {
    visit_gemm_dtype(dtype, [&]<class T>() { scale_output<T>(shape, beta, c); });
    return true;
  }
  return run_blas(dtype, shape, alpha, a, b, beta, c);
}

namespace {

void gemm_one(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b,
              double beta, const GemmOutput& c) {
  visit_gemm_dtype(dtype, [&]<class T>() {
    if (only_scale(shape, alpha))
      scale_output<T>(shape, beta, c);
    else if (!(is_floating(dtype) && run_blas(dtype, shape, alpha, a, b, beta, c)))
      run_blocked<T>(shape, alpha, a, b, beta, c);
  });
}

// A big product as slices of C's columns (or rows, when it has more rows), one per thread.
bool gemm_split(DType dtype, const GemmShape& s, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
                const GemmOutput& c) {
  constexpr std::int64_t kMinWork = std::int64_t{1} << 21, kMinSlice = 64;
  if (num_threads() < 2 || s.batch * s.m * s.n * s.k < kMinWork || std::max(s.m, s.n) < 2 * kMinSlice) return false;
  const bool by_columns = s.n >= s.m;
  std::int64_t bytes = 0;
  visit_gemm_dtype(dtype, [&]<class T>() { bytes = sizeof(T); });
  auto at = [&](const void* p, std::int64_t elements) { return static_cast<const char*>(p) + elements * bytes; };
  // One slice per thread: each slice packs its share of A or B again, so smaller ones cost more.
  const std::int64_t extent = by_columns ? s.n : s.m;
  parallel_for(extent, std::max(kMinSlice, (extent + num_threads() - 1) / num_threads()),
               [&](std::int64_t i0, std::int64_t i1) {
                 GemmShape part = s;
                 GemmOperand pa = a, pb = b;
                 GemmOutput pc = c;
                 if (by_columns) {
                   part.n = i1 - i0;
                   pb.data = at(b.data, i0 * b.col_stride);
                   pc.data = const_cast<char*>(at(c.data, i0 * c.col_stride));
                 } else {
                   part.m = i1 - i0;
                   pa.data = at(a.data, i0 * a.row_stride);
                   pc.data = const_cast<char*>(at(c.data, i0 * c.row_stride));
                 }
                 gemm_one(dtype, part, alpha, pa, pb, beta, pc);
               });
  return true;
}

}  // namespace

void gemm(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
          const GemmOutput& c) {
  if (!check_args(dtype, shape, alpha, beta, c)) return;
  blas_single_threaded();
  if (!gemm_split(dtype, shape, alpha, a, b, beta, c)) gemm_one(dtype, shape, alpha, a, b, beta, c);
}

}  // namespace kiln::cpu
