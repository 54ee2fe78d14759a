// GPU building blocks of the tensor layer and the ops (declared in core/registry.h and
// core/tensor/dispatch.h) over the launchers of engine/backend/cuda.
#include <numeric>
#include <string_view>
#include <utility>

#include "backend/cuda/reduce_kernels.h"
#include "kiln/runtime/device.h"
#include "registry.h"
#include "core/tensor/tensor_impl.h"

namespace kiln::gpu {

kernels::Operand operand(const Tensor& t, const Shape& shape) {
  if (shape.size() > static_cast<std::size_t>(kernels::kMaxDims))
    throw ShapeError("[gpu] kernels take at most " + std::to_string(kernels::kMaxDims) + " dims; got shape " +
                     shape_str(shape));
  kernels::Operand op;
  op.ptr = device_address(t);
  Shape s = cpu::broadcast_strides(t.shape(), t.strides(), shape);
  for (std::size_t i = 0; i < s.size(); ++i) op.strides[i] = s[i];
  return op;
}

void copy(const Tensor& src, const Tensor& dst) {
  kernels::launch_cast(src.dtype(), dst.dtype(), operand(src, dst.shape()), operand(dst), dst.shape(),
                       stream_of(dst.device()));
}

Tensor contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor d = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  copy(t, d);
  return d;
}

void fill(const Tensor& dst, const Scalar& value) {
  const kernels::Scalar v = value.is_floating() ? kernels::Scalar(value.to_double()) : kernels::Scalar(value.to_int());
  kernels::launch_fill(dst.dtype(), operand(dst), dst.shape(), v, stream_of(dst.device()));
}

namespace {

std::int64_t dims_product(const Shape& shape, int from, int to) {
  std::int64_t p = 1;
  for (int d = from; d < to; ++d) p *= shape[static_cast<std::size_t>(d)];
  return p;
}

// Sum, prod, max and min of a contiguous tensor over axes in separate runs, e.g. (0, 2, 3) of
// NCHW for batch norm: one run at a time from the innermost, each an [outer, r, inner]
// reduction, instead of a strided gather copy. Sums in f16/bf16 would round in between, so
// they take the gather.
bool reduce_by_runs(const rt::KernelSpec& spec, const Tensor& in, const std::vector<int>& axes, const Tensor& out,
                    double param) {
  const std::string_view op = spec.op;
  const bool order_free = op == "max" || op == "min";
  if (!in.is_contiguous() || !(order_free || op == "sum" || op == "prod")) return false;
  if (!order_free && (out.dtype() == DType::f16 || out.dtype() == DType::bf16)) return false;
  std::vector<std::pair<int, int>> runs;  // [first, last) of each run of consecutive axes
  for (int ax : axes) {
    if (!runs.empty() && runs.back().second == ax)
      runs.back().second = ax + 1;
    else
      runs.emplace_back(ax, ax + 1);
  }
  if (runs.size() < 2) return false;
  const rt::Stream& s = stream_of(in.device());
  Shape shape = in.shape();
  Tensor cur = in;
  for (std::size_t r = runs.size(); r-- > 0;) {
    const auto [first, last] = runs[r];
    Shape next = shape;
    for (int d = first; d < last; ++d) next[static_cast<std::size_t>(d)] = 1;
    Tensor dst = r == 0 ? out : Tensor(make_impl(next, out.dtype(), in.device()));
    kernels::launch_reduce(spec, cur.dtype(), dst.dtype(), device_address(cur), device_address(dst),
                           dims_product(shape, 0, first), dims_product(shape, first, last),
                           dims_product(shape, last, static_cast<int>(shape.size())), s, param);
    cur = dst;
    shape = std::move(next);
  }
  return true;
}

}  // namespace

void reduce(const rt::KernelSpec& spec, const Tensor& in, const std::vector<int>& axes, const Tensor& out,
            double param) {
  const Shape& shape = in.shape();
  const int nd = in.dim();
  auto prod = [&](int from, int to) { return dims_product(shape, from, to); };
  const rt::Stream& s = stream_of(in.device());
  // Reduced axes forming one run of a contiguous tensor are already [outer, r, inner].
  bool run = axes.empty() || axes.back() - axes.front() + 1 == static_cast<int>(axes.size());
  if (in.is_contiguous() && run) {
    const int first = axes.empty() ? nd : axes.front();
    const int last = axes.empty() ? nd : axes.back() + 1;
    kernels::launch_reduce(spec, in.dtype(), out.dtype(), device_address(in), device_address(out), prod(0, first),
                           prod(first, last), prod(last, nd), s, param);
    return;
  }
  if (reduce_by_runs(spec, in, axes, out, param)) return;
  // Otherwise gather: kept dims first, reduced dims last, into a contiguous [outer, r, 1].
  std::vector<int> order;
  for (int d = 0; d < nd; ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) order.push_back(d);
  const std::int64_t outer = std::accumulate(order.begin(), order.end(), std::int64_t{1},
                                             [&](std::int64_t p, int d) { return p * shape[static_cast<std::size_t>(d)]; });
  order.insert(order.end(), axes.begin(), axes.end());
  Shape pshape, pstrides;
  for (int d : order) {
    pshape.push_back(shape[static_cast<std::size_t>(d)]);
    pstrides.push_back(in.strides()[static_cast<std::size_t>(d)]);
  }
  Tensor gathered(make_impl(pshape, in.dtype(), in.device()));
  copy(make_view(in, pshape, pstrides, in.offset()), gathered);
  kernels::launch_reduce(spec, in.dtype(), out.dtype(), device_address(gathered), device_address(out), outer,
                         in.numel() / std::max<std::int64_t>(outer, 1), 1, s, param);
}

}  // namespace kiln::gpu
