// softmax and log_softmax over one dim. CPU: per-row loops in the compute type (f32 for
// f16/bf16); GPU: kernel_templates/softmax.cu over rows made contiguous (the softmax dim
// moved innermost by a strided copy when needed).
#include <cmath>
#include <limits>

#include "core/dtype_sets.h"
#include "kiln/amp.h"
#include "kiln/nn_functional.h"
#include "core/registry.h"
#include "backend/cuda/softmax_kernels.h"

namespace kiln {

namespace {


int dim_of(const OpArgs& a) { return normalize_axis(a.attrs.get<std::int64_t>("dim"), a.inputs[0].dim(), a.op.name); }

template <class T>
void softmax_rows(const Tensor& x, const Tensor& y, int dim, bool log_mode) {
  using C = cpu::compute_t<T>;
  const bool scalar = x.dim() == 0;
  Shape rows_shape = x.shape();
  if (!scalar) rows_shape[static_cast<std::size_t>(dim)] = 1;
  const std::int64_t n = scalar ? 1 : x.shape()[static_cast<std::size_t>(dim)];
  const std::int64_t sx = scalar ? 0 : x.strides()[static_cast<std::size_t>(dim)];
  const std::int64_t sy = scalar ? 0 : y.strides()[static_cast<std::size_t>(dim)];
  const T* px = cpu::ptr<const T>(x);
  T* py = cpu::ptr<T>(y);
  cpu::for_each_offset<2>(rows_shape, {&x.strides(), &y.strides()}, {0, 0}, [&](const std::array<std::int64_t, 2>& o) {
    const T* r = px + o[0];
    T* w = py + o[1];
    C m = -std::numeric_limits<C>::infinity();
    for (std::int64_t k = 0; k < n; ++k) {
      const C v = cpu::load(r[k * sx]);
      if (std::isnan(v) || v > m) m = v;
    }
    C s = 0;
    for (std::int64_t k = 0; k < n; ++k) s += std::exp(cpu::load(r[k * sx]) - m);
    // (v - m) - log s, not v - (m + log s): the sum would round at the scale of m.
    const C log_s = std::log(s);
    for (std::int64_t k = 0; k < n; ++k) {
      const C v = cpu::load(r[k * sx]) - m;
      w[k * sy] = cpu::store<T>(log_mode ? v - log_s : std::exp(v) / s);
    }
  });
}

// Runs the row kernel with `dim` innermost: directly on a contiguous input whose dim is
// last, otherwise through contiguous temporaries in the permuted order.
void softmax_gpu(const Tensor& x, const Tensor& y, int dim, bool log_mode) {
  const rt::Stream& s = stream_of(x.device());
  const int nd = x.dim();
  const std::int64_t cols = nd == 0 ? 1 : x.shape()[static_cast<std::size_t>(dim)];
  const std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  if (x.is_contiguous() && (nd == 0 || dim == nd - 1)) {
    kernels::launch_softmax(x.dtype(), device_address(x), device_address(y), rows, cols, log_mode, s);
    return;
  }
  Shape pshape, xstr, ystr;
  for (int d = 0; d <= nd; ++d) {
    const int src = d == nd ? dim : d;
    if (d < nd && d == dim) continue;
    pshape.push_back(x.shape()[static_cast<std::size_t>(src)]);
    xstr.push_back(x.strides()[static_cast<std::size_t>(src)]);
    ystr.push_back(y.strides()[static_cast<std::size_t>(src)]);
  }
  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  Tensor in = empty(pshape, opts), out = empty(pshape, opts);
  gpu::copy(make_view(x, pshape, xstr, x.offset()), in);
  kernels::launch_softmax(x.dtype(), device_address(in), device_address(out), rows, cols, log_mode, s);
  gpu::copy(out, make_view(y, pshape, ystr, y.offset()));
}

OpDef softmax_def(std::string name, bool log_mode) {
  OpDef d;
  d.name = std::move(name);
  d.dtypes = dtype_sets::floating;
  d.shape_rule = rules::same_shape_as_input;
  d.cpu = [log_mode](const OpArgs& a, std::span<Tensor> out) {
    const int dim = dim_of(a);
    cpu::visit(out[0].dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<cpu::compute_t<T>>) softmax_rows<T>(a.inputs[0], out[0], dim, log_mode);
    });
  };
  d.gpu = [log_mode](const OpArgs& a, std::span<Tensor> out) { softmax_gpu(a.inputs[0], out[0], dim_of(a), log_mode); };
  d.test.attrs = {Attrs{{"dim", std::int64_t{-1}}}, Attrs{{"dim", std::int64_t{0}}}, Attrs{{"dim", std::int64_t{1}}}};
  d.test.low = -4.0;
  d.test.high = 4.0;
  return d;
}

// Sum over the softmax dim, kept for broadcasting; a zero-dim tensor is its own row.
Tensor row_sum(const Tensor& t, std::int64_t dim) { return t.dim() == 0 ? t : sum(t, {dim}, true); }

const OpRef kSoftmax = register_op([] {
  OpDef d = softmax_def("softmax", false);
  // dx = y * (g - sum(g * y)).
  d.vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
    const Tensor y = c.saved_output(0);
    return {mul(y, sub(g[0], row_sum(mul(g[0], y), c.attrs().get<std::int64_t>("dim"))))};
  };
  d.save = {.outputs = {0}};
  return d;
}());

const OpRef kLogSoftmax = register_op([] {
  OpDef d = softmax_def("log_softmax", true);
  // dx = g - exp(y) * sum(g), with exp(y) recomputed as softmax(x).
  d.vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
    const std::int64_t dim = c.attrs().get<std::int64_t>("dim");
    return {sub(g[0], mul(softmax(c.saved_input(0), dim), row_sum(g[0], dim)))};
  };
  d.save = {.inputs = {0}};
  return d;
}());

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return call(kSoftmax, {autocast_f32(x)}, Attrs{{"dim", dim}}); }
Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  return call(kLogSoftmax, {autocast_f32(x)}, Attrs{{"dim", dim}});
}

}  // namespace kiln
