#pragma once
// What the tensor layer needs of the rest of core without the whole registry header: op
// lookup and calls, in-place history, broadcasting and axes, views, GPU copies and fills
// (defined in core/registry.cpp, core/gpu_helpers.cpp and core/autograd/).
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <vector>

#include "core/step/step_state.h"
#include "kiln/attrs.h"
#include "kiln/device.h"
#include "kiln/runtime/device.h"
#include "kiln/scalar.h"
#include "kiln/tensor.h"

namespace kiln {

struct OpDef;

const OpDef& get_op(std::string_view name);  // throws ValueError naming known ops

// Autograd's side of an in-place write (core/autograd/view_history.cpp): whether `self` needs
// its history rewritten, the checks that refuse one autograd cannot follow, and the rewrite.
bool inplace_needs_history(const Tensor& self, std::span<const Tensor> others);
void check_inplace(const Tensor& self, std::string_view who);
void rebase_history(const Tensor& self, const Tensor& result);
// The first output.
Tensor call(const OpDef& op, std::initializer_list<Tensor> inputs, const Attrs& attrs = {});
// `self` op= inputs: runs op on (self, inputs...) and writes the result into self,
// which must already have the result's shape and a dtype the result casts to.
Tensor& call_inplace(const OpDef& op, Tensor& self, std::initializer_list<Tensor> others, const Attrs& attrs = {});

// Broadcasting. Errors name the op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);
// Axis handling: negative axes count from the end; ShapeError names the op.
int normalize_axis(std::int64_t axis, int ndim, std::string_view op);
std::vector<int> normalize_axes(const std::vector<std::int64_t>& axes, int ndim, std::string_view op);

// A view of `base`'s storage (same version counter) with no autograd history.
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, std::int64_t offset);
void bump_version(const Tensor& t);

const rt::Stream& stream_of(Device d);  // the stream ops on `d` run on
// While a step is captured, the graph keeps every tensor whose address it takes alive.
inline std::uint64_t device_address(const Tensor& t) {
  step::before_use(t);
  if (step::capturing()) step::keep_alive(t);
  return reinterpret_cast<std::uint64_t>(t.data_ptr());
}

namespace gpu {
// dst = src broadcast to dst's shape and converted to dst's dtype; any strides.
void copy(const Tensor& src, const Tensor& dst);
// t itself when contiguous, else a contiguous copy on its device (outside autograd), for
// kernels that take dense operands.
Tensor contiguous(const Tensor& t);
// Every element of dst (any strides) = value in dst's dtype.
void fill(const Tensor& dst, const Scalar& value);
}  // namespace gpu

}  // namespace kiln
