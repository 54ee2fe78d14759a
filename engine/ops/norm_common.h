#pragma once
// What batch_norm (norm_batch.cpp) and layer_norm (norm_layer.cpp) share: the dtype plan that
// keeps f32 parameters beside f16/bf16 inputs, optional inputs, and the CPU references' reads
// and writes in double.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/norm_kernels.h"
#include "core/registry.h"
#include "cpu_fast.h"
#include "elementwise_common.h"
#include "kiln/nn_functional.h"

namespace kiln::norm_detail {

// x (N, C, d...) as (N, C, S), as the batch-norm kernels take it.
inline kernels::BatchNormShape batch_norm_shape(const Tensor& x) {
  const std::int64_t c = x.shape()[1], n = x.shape()[0];
  const std::int64_t s = c * n == 0 ? 1 : x.numel() / (c * n);
  return {c, s, n * s};
}

using cpu_fast::is_half;
// The kernels' compute type, which is also the dtype of the saved mean and invstd.
inline DType acc_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The dtype the parameters (weight, bias, running statistics) are used in for input dtype x:
// theirs when they agree and the kernels pair it with x (x's own, or f32 beside f16/bf16 x, as
// autocast leaves parameters), else x's compute dtype. Undefined tensors are absent.
inline DType param_dtype(DType x, const std::vector<Tensor>& params) {
  bool any = false, same = true;
  DType p = acc_of(x);
  for (const Tensor& t : params) {
    if (!t.defined()) continue;
    same = same && (!any || t.dtype() == p);
    p = any ? p : t.dtype();
    any = true;
  }
  return any && same && kernels::norm_dtypes_supported(x, p) ? p : acc_of(x);
}

// Absent optional inputs travel as a placeholder (the input x, never read) flagged false in
// the attrs "has_<name>", so every call has the same arity.
inline bool has(const Attrs& a, const char* name) { return a.get_or<bool>(std::string("has_") + name, true); }

inline void check_floating(const OpArgs& a, const char* what, const Tensor& t) {
  if (!is_floating(t.dtype()))
    throw DTypeError("[" + a.op.name + "] " + what + " must be floating; got " + std::string(dtype_name(t.dtype())));
}

inline void check_shape(const OpArgs& a, const char* what, const Tensor& t, const Shape& expect) {
  if (t.shape() != expect)
    throw ShapeError("[" + a.op.name + "] " + what + " has shape " + shape_str(t.shape()) + "; expected " +
                     shape_str(expect));
}

// The dtype plan of a norm op for x of dtype t: each input takes the dtype of its role, x's
// (x, y, gradients), the parameters' or the compute dtype (saved statistics); an absent input
// keeps its own, so the placeholder is never cast.
enum class Role { x, param, stats, counter };  // counter: an i64 the op adds to, kept as it is
struct Slot {
  Role role;
  bool present = true;
  const char* name = "input";
};
inline DTypePlan norm_plan(const OpArgs& a, DType t, DType params, const std::vector<Slot>& in,
                           const std::vector<Role>& out) {
  auto dtype = [&](Role r) { return r == Role::x ? t : r == Role::param ? params : acc_of(t); };
  DTypePlan p;
  p.key = t;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bool keep = !in[i].present || in[i].role == Role::counter;
    if (!keep && in[i].role != Role::stats) check_floating(a, in[i].name, a.inputs[i]);
    p.inputs.push_back(keep ? a.inputs[i].dtype() : dtype(in[i].role));
  }
  for (Role r : out) p.outputs.push_back(dtype(r));
  return p;
}

inline rt::DevicePtr address_or_0(const Tensor& t) { return t.defined() ? device_address(t) : rt::DevicePtr(0); }

// The CPU references read any layout and dtype as doubles in row-major order.
inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }
// Writes v into t (any strides along one dim, or contiguous) in t's dtype.
inline void store_values(const Tensor& t, const std::vector<double>& v) {
  const std::int64_t step = t.dim() == 1 ? t.strides()[0] : 1;
  cpu::visit(t.dtype(), [&]<class T>() {
    T* p = cpu::ptr<T>(t);
    for (std::size_t i = 0; i < v.size(); ++i)
      p[static_cast<std::int64_t>(i) * step] = cpu::store<T>(static_cast<cpu::compute_t<T>>(v[i]));
  });
}

// ---- batch_norm and batch_norm_max_pool2d: inputs x, weight, bias, running_mean, running_var,
// num_batches_tracked, absent ones flagged in the attrs; outputs y, mean, invstd. ----

inline const char* const kBatchNormParamNames[] = {"weight", "bias", "running_mean", "running_var"};
inline constexpr std::size_t kCounterInput = 5;

// A batch counter (a module's num_batches_tracked, one i64) that training adds one to: in the
// statistics kernel on the GPU, so it costs no kernel of its own. Absent unless flagged.
inline bool counts_batches(const Attrs& a) {
  return a.get_or<bool>("training", true) && a.get_or<bool>("has_num_batches_tracked", false);
}
inline void check_counter(const OpArgs& a) {
  if (!a.attrs.get_or<bool>("has_num_batches_tracked", false)) return;
  const Tensor& t = a.inputs[kCounterInput];
  if (t.dtype() != DType::i64 || t.numel() != 1)
    throw DTypeError("[" + a.op.name + "] num_batches_tracked must be one i64 element; got " +
                     std::string(dtype_name(t.dtype())) + " of shape " + shape_str(t.shape()));
}
// The CPU side of the count.
inline void count_batch_cpu(const OpArgs& a) {
  if (counts_batches(a.attrs)) ++*cpu::ptr<std::int64_t>(a.inputs[kCounterInput]);
}

// The parameters and running statistics present in a forward call.
inline std::vector<Tensor> present_params(const OpArgs& a) {
  std::vector<Tensor> present;
  for (int i = 0; i < 4; ++i)
    if (has(a.attrs, kBatchNormParamNames[i])) present.push_back(a.inputs[static_cast<std::size_t>(i + 1)]);
  return present;
}

inline DTypePlan batch_norm_forward_dtypes(const OpArgs& a) {
  const DType t = a.inputs[0].dtype();
  std::vector<Slot> in{{Role::x}};
  for (const char* name : kBatchNormParamNames) in.push_back({Role::param, has(a.attrs, name), name});
  in.push_back({Role::counter, true, "num_batches_tracked"});
  return norm_plan(a, t, param_dtype(t, present_params(a)), in, {Role::x, Role::stats, Role::stats});
}

struct BatchNormParams;  // norm_batch_cpu.h
// A batch-norm forward's input gradients from its backward op's (dx, dweight, dbias) `r`: those
// asked for, and in eval the running statistics' (y depends on them there).
std::vector<Tensor> batch_norm_input_grads(const VjpContext& c, const BatchNormParams& p, const std::vector<Tensor>& r);

// A batch-norm forward on the GPU, batch_norm's kernels or batch_norm_max_pool2d's through
// `launch`: contiguous operands, the statistics' scratch (split for x unpooled), and running
// statistics updated in a contiguous copy written back to the caller's tensors.
using BatchNormLaunch = std::function<void(const kernels::BatchNormForward&, const kernels::NormSplit&)>;
void batch_norm_forward_gpu(const OpArgs& a, std::span<Tensor> out, const BatchNormLaunch& launch);

// Calls a forward op (batch_norm or batch_norm_max_pool2d, with `extra` attrs beside the batch
// norm's) and returns y. Running statistics not in the parameters' dtype or not contiguous are
// updated in a copy written back after the call; those updated in place get a new version.
// num_batches_tracked, when given, gets one added in training.
Tensor dispatch_batch_norm(const OpDef& op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                           Activation activation, const Tensor& num_batches_tracked, const Attrs& extra);

}  // namespace kiln::norm_detail
