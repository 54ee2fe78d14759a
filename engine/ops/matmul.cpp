// matmul (torch.matmul semantics, batch dims broadcast). One op, "matmul", with attr
// transpose_b: linear (linear.cpp) passes w as it is stored, and the transposed view costs
// nothing on either device. GPU: kernels::gemm (cuBLAS), CPU: cpu::gemm.
#include "ops/sum_to.h"
#include "core/dtype_sets.h"
#include "core/cpu/gemm_cpu.h"
#include "backend/cuda/gemm.h"
#include "kiln/amp.h"
#include "kiln/linalg.h"
#include "core/registry.h"

namespace kiln {

namespace {

std::string paren(const Shape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + ")";
}

// The shapes of one product: batch dims (broadcast), m, n, k, and which side was a vector.
struct Plan {
  Shape batch, out;
  std::int64_t m = 1, n = 1, k = 1;
};

Plan plan(const Shape& a, const Shape& b_stored, bool transpose_b) {
  Shape b = b_stored;
  if (transpose_b && b.size() >= 2) std::swap(b[b.size() - 1], b[b.size() - 2]);
  if (a.empty() || b.empty())
    throw ShapeError("[matmul] both arguments need at least one dimension, got shapes " + paren(a) + " and " +
                     paren(b));
  Plan p;
  const std::int64_t ka = a.back();
  const std::int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb) throw ShapeError("[matmul] shapes " + paren(a) + " and " + paren(b) + " cannot be multiplied");
  p.k = ka;
  if (a.size() >= 2) p.m = a[a.size() - 2];
  if (b.size() >= 2) p.n = b.back();
  Shape a_batch = a.size() > 2 ? Shape(a.begin(), a.end() - 2) : Shape{};
  Shape b_batch = b.size() > 2 ? Shape(b.begin(), b.end() - 2) : Shape{};
  p.batch = broadcast_shapes(a_batch, b_batch, "matmul");
  p.out = p.batch;
  if (a.size() >= 2) p.out.push_back(p.m);
  if (b.size() >= 2) p.out.push_back(p.n);
  return p;
}

// One operand as a (rows, cols) matrix per batch index, batch strides broadcast to the plan.
struct Mat {
  std::int64_t rows, cols, rs, cs;
  Shape batch_strides;
};

Mat as_matrix(const Tensor& t, bool is_b, bool transpose, const Plan& p) {
  const Shape& sh = t.shape();
  const Shape& st = t.strides();
  const std::size_t d = sh.size();
  Mat m{};
  if (d == 1) {
    // A vector: a row of `a` or a column of `b`; the size-1 axis takes any stride.
    if (is_b)
      m = {p.k, 1, st[0], 1, {}};
    else
      m = {1, p.k, 1, st[0], {}};
    m.batch_strides = Shape(p.batch.size(), 0);
    return m;
  }
  m = {sh[d - 2], sh[d - 1], st[d - 2], st[d - 1], {}};
  if (transpose) {
    std::swap(m.rows, m.cols);
    std::swap(m.rs, m.cs);
  }
  m.batch_strides = cpu::broadcast_strides(Shape(sh.begin(), sh.end() - 2), Shape(st.begin(), st.end() - 2), p.batch);
  return m;
}

// Calls f(off_a, off_b, off_c, batch, bs_a, bs_b, bs_c) for each run of batch dims that
// collapses to one stride per operand; the outer dims are looped here, on the host.
template <class F>
void for_each_batch(const Plan& p, const Mat& a, const Mat& b, F&& f) {
  Shape c_strides = contiguous_strides(p.batch);
  for (auto& s : c_strides) s *= p.m * p.n;
  struct Dim {
    std::int64_t size, sa, sb, sc;
  };
  std::vector<Dim> dims;
  for (std::size_t i = 0; i < p.batch.size(); ++i) {
    if (p.batch[i] == 1) continue;
    Dim d{p.batch[i], a.batch_strides[i], b.batch_strides[i], c_strides[i]};
    if (!dims.empty()) {
      Dim& q = dims.back();
      if (q.sa == d.sa * d.size && q.sb == d.sb * d.size && q.sc == d.sc * d.size) {
        q = {q.size * d.size, d.sa, d.sb, d.sc};
        continue;
      }
    }
    dims.push_back(d);
  }
  for (const Dim& d : dims)
    if (d.size == 0) return;
  if (dims.empty()) return f(0, 0, 0, 1, 0, 0, 0);
  const Dim inner = dims.back();
  dims.pop_back();
  std::vector<std::int64_t> idx(dims.size(), 0);
  while (true) {
    std::int64_t oa = 0, ob = 0, oc = 0;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      oa += idx[i] * dims[i].sa;
      ob += idx[i] * dims[i].sb;
      oc += idx[i] * dims[i].sc;
    }
    f(oa, ob, oc, inner.size, inner.sa, inner.sb, inner.sc);
    int i = static_cast<int>(dims.size()) - 1;
    for (; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < dims[static_cast<std::size_t>(i)].size) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
    if (i < 0) return;
  }
}

bool transpose_b_of(const Attrs& attrs) { return attrs.get_or("transpose_b", false); }

void matmul_cpu(const OpArgs& args, std::span<Tensor> out) {
  const Tensor &A = args.inputs[0], &B = args.inputs[1];
  const bool tb = transpose_b_of(args.attrs);
  const Plan p = plan(A.shape(), B.shape(), tb);
  const Mat a = as_matrix(A, false, false, p), b = as_matrix(B, true, tb, p);
  const auto es = static_cast<std::int64_t>(A.element_size());
  auto* pa = static_cast<const char*>(A.data_ptr());
  auto* pb = static_cast<const char*>(B.data_ptr());
  auto* pc = static_cast<char*>(out[0].data_ptr());
  for_each_batch(p, a, b, [&](auto oa, auto ob, auto oc, auto batch, auto sa, auto sb, auto sc) {
    cpu::gemm(out[0].dtype(), {batch, p.m, p.n, p.k}, 1.0, {pa + oa * es, sa, a.rs, a.cs},
              {pb + ob * es, sb, b.rs, b.cs}, 0.0, {pc + oc * es, sc, p.n, 1});
  });
}

void matmul_gpu(const OpArgs& args, std::span<Tensor> out) {
  Tensor A = args.inputs[0], B = args.inputs[1];
  const bool tb = transpose_b_of(args.attrs);
  const Plan p = plan(A.shape(), B.shape(), tb);
  Mat a = as_matrix(A, false, false, p), b = as_matrix(B, true, tb, p);
  // cuBLAS takes either axis with unit stride (transposed views included); anything else is copied.
  if (!kernels::gemm_layout_ok(a.rows, a.cols, a.rs, a.cs)) {
    A = gpu::contiguous(A);
    a = as_matrix(A, false, false, p);
  }
  if (!kernels::gemm_layout_ok(b.rows, b.cols, b.rs, b.cs)) {
    B = gpu::contiguous(B);
    b = as_matrix(B, true, tb, p);
  }
  const auto es = static_cast<std::int64_t>(A.element_size());
  const auto pa = device_address(A), pb = device_address(B), pc = device_address(out[0]);
  const rt::Stream& s = stream_of(args.device);
  for_each_batch(p, a, b, [&](auto oa, auto ob, auto oc, auto batch, auto sa, auto sb, auto sc) {
    const bool ok = kernels::gemm(out[0].dtype(), {batch, p.m, p.n, p.k}, 1.0,
                                  {pa + static_cast<std::uint64_t>(oa * es), sa, a.rs, a.cs},
                                  {pb + static_cast<std::uint64_t>(ob * es), sb, b.rs, b.cs}, 0.0,
                                  {pc + static_cast<std::uint64_t>(oc * es), sc, p.n, 1}, s);
    if (!ok)
      throw Error("[matmul] cuBLAS refused the layout of shapes " + paren(A.shape()) + " and " + paren(B.shape()) +
                  " after making them contiguous");
  });
}

// The last two dims swapped, as a view (vjps run without grad mode, so no history is lost).
Tensor mT(const Tensor& t) {
  Shape sh = t.shape(), st = t.strides();
  const std::size_t d = sh.size();
  std::swap(sh[d - 1], sh[d - 2]);
  std::swap(st[d - 1], st[d - 2]);
  return make_view(t, sh, st, t.offset());
}

// A 1-D operand as the matrix matmul treats it: a row (1, k) for a, a column (k, 1) for b.
Tensor as_2d(const Tensor& t, bool is_b) {
  if (t.dim() != 1) return t;
  return is_b ? reshape(t, {t.shape()[0], 1}) : reshape(t, {1, t.shape()[0]});
}

const OpDef& kMatmul = register_op({
    .name = "matmul",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule = rules::promote,
    .shape_rule =
        [](const OpArgs& a) {
          return std::vector<Shape>{plan(a.inputs[0].shape(), a.inputs[1].shape(), transpose_b_of(a.attrs)).out};
        },
    .cpu = matmul_cpu,
    .gpu = matmul_gpu,
    // With g of the product's (.., m, n) shape: dA = g @ B^T, dB = A^T @ g, summed over broadcast batch dims.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const bool tb = transpose_b_of(c.attrs());
      Tensor a = as_2d(c.saved_input(0), false), b = as_2d(c.saved_input(1), true);
      const Plan p = plan(c.input(0).shape, c.input(1).shape, tb);
      Shape full = p.batch;
      full.push_back(p.m);
      full.push_back(p.n);
      Tensor gm = reshape(g[0], full);
      std::vector<Tensor> r(2);
      if (c.needs_grad(0)) {
        Tensor da = tb ? matmul(gm, b) : matmul(gm, mT(b));
        r[0] = reshape(sum_to(da, a.shape()), c.input(0).shape);
      }
      if (c.needs_grad(1)) {
        // b as stored is (.., n, k) when transposed: its gradient is g^T @ A.
        Tensor db = tb ? matmul(mT(gm), a) : matmul(mT(a), gm);
        r[1] = reshape(sum_to(db, b.shape()), c.input(1).shape);
      }
      return r;
    },
    .save = {.inputs = {0, 1}},
    .test = {.attrs = {Attrs{}, Attrs{{"transpose_b", true}}}, .tolerance_scale = 4},
});

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return call(kMatmul, {autocast_lower(a), autocast_lower(b)}); }

// x @ w^T for linear without a bias: w's transposed view costs no copy.
Tensor matmul_transposed_b(const Tensor& x, const Tensor& w) { return call(kMatmul, {x, w}, Attrs{{"transpose_b", true}}); }

void set_allow_tf32(bool allow) { kernels::set_allow_tf32(allow); }
bool allow_tf32() { return kernels::allow_tf32(); }

}  // namespace kiln
