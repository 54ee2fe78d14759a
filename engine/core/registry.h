#pragma once
// The op registry and generic dispatcher. Every op is one OpDef, defined in its own
// engine/ops/<family>.cpp; nothing else needs editing to add one.
//
// How to add an op (say `square`, in engine/ops/elementwise_unary.cpp, where it is written
// shorter with the builders of elementwise_common.h):
//
//   const OpRef kSquare = register_op({
//       .name = "square",
//       .dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64},
//       // dtype_rule/shape_rule left empty: inputs promoted together, outputs broadcast.
//       .cpu = [](const OpArgs& a, std::span<Tensor> out) {
//         cpu::visit(out[0].dtype(), [&]<class T>() {
//           cpu::map_unary<T, T>(a.inputs[0], out[0], [](auto x) { return x * x; });
//         });
//       },
//       .gpu = [k = gpu::LazyKernel("square")](const OpArgs& a, std::span<Tensor> out) {
//         kernels::launch_unary(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0]),
//                               gpu::operand(out[0]), out[0].shape(), 0, 0, stream_of(a.device));
//       },
//       // The device math: register_op registers the kernel spec "square" from it.
//       .pointwise = PointwiseExpr{.expr = "x * x", .domain = kernels::PointwiseDomain::numeric},
//       .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
//         return {g[0] * c.saved_input(0) * 2};  // public ops; grad mode is off in here
//       },
//       .save = {.inputs = {0}},
//   });
//   Tensor square(const Tensor& x) { return call(kSquare, {x}); }  // declared in a public header
//
// The dispatcher checks devices, applies the dtype rule (casting inputs to the dtypes
// it names), checks the key dtype against .dtypes, applies the shape rule, allocates
// contiguous outputs (unless .makes_outputs), runs .cpu or .gpu, and records an autograd
// node when grad mode is on and an input requires grad. Rules throw with the op's name.
// Implementations get inputs of the planned dtypes, with any strides; outputs they are
// given are contiguous. The engine casts each input's gradient back to that input's
// dtype; vjps return gradients of the input's shape (ops/sum_to.h for broadcast inputs).
// Non-tensor arguments travel in Attrs (a.attrs.get<Scalar>("scalar")); TestHints tell
// the registry-driven tests which attrs and input ranges to use. Elementwise ops are
// shorter through the builders of elementwise_common.h; a pointwise op also needs a host
// reference in tests/support/elementwise_reference.h (engine_tests fails without one), except
// the ops kiln::pointwise registers at run time (engine/ops/user_pointwise.cpp).
#include <atomic>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/step/step_state.h"
#include "core/cpu/loops.h"
#include "backend/cuda/elementwise_kernels.h"
#include "kiln/attrs.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/dtype_promotion.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "kiln/tensor.h"
#include "core/tensor/dispatch.h"

namespace kiln {

struct OpDef;

// What rules and implementations see of one call.
struct OpArgs {
  const OpDef& op;
  std::span<const Tensor> inputs;  // for impls: already cast to the dtype plan
  const Attrs& attrs;
  Device device;  // the inputs' device, or attrs "device" for an op without tensor inputs
  const std::string& name() const;
};

struct DTypePlan {
  std::vector<DType> inputs;   // each input is cast to this before the impl runs
  std::vector<DType> outputs;
  DType key = DType::f32;      // checked against OpDef::dtypes
};

using DTypeRule = std::function<DTypePlan(const OpArgs&)>;
using ShapeRule = std::function<std::vector<Shape>(const OpArgs&)>;
// Writes outputs (allocated, contiguous) or, for a view op, assigns them.
using Impl = std::function<void(const OpArgs&, std::span<Tensor> outputs)>;

// What a vjp sees: the call's attrs, input/output metadata and the saved tensors.
// ReLU masks handed from one vjp to the next (OpDef::relu_masked_gradient), filled by the engine,
// and the producers whose whole gradient a vjp computes.
struct GradientMasks {
  std::vector<bool> may_mask;  // by input: its gradient may be returned masked
  std::vector<bool> masked;    // by input: the vjp returned it masked
  std::vector<bool> incoming;  // by output: its gradient arrived masked
  std::vector<const Node*> sole_producer;  // by input: VjpContext::sole_producer
  // The grad sink that a node's vjp will find for its input j (VjpContext::producer_sink).
  std::function<Tensor(const Node&, int)> sink_of;
};

class VjpContext {
 public:
  VjpContext(const Node& node, const std::vector<bool>& needs, const std::vector<Tensor>* sinks = nullptr,
             const std::vector<bool>* unit = nullptr, GradientMasks* masks = nullptr)
      : node_(node), needs_(needs), sinks_(sinks), unit_(unit), masks_(masks) {}
  const Attrs& attrs() const;
  const TensorMeta& input(int i) const;   // as the caller passed it (before casts)
  const TensorMeta& output(int i) const;
  Tensor saved_input(int i) const;   // after the dtype plan's cast; throws if not in the save policy
  Tensor saved_output(int i) const;
  bool needs_grad(int i) const { return needs_[static_cast<std::size_t>(i)]; }
  int num_inputs() const { return static_cast<int>(needs_.size()); }
  const std::string& name() const;
  // In a compiled step: input i's .grad() buffer when i is a leaf whose gradient zero_grad
  // left pending, so the vjp may write its result there and return that tensor (no copy).
  // Undefined otherwise.
  Tensor grad_sink(int i) const {
    return sinks_ && static_cast<std::size_t>(i) < sinks_->size() ? (*sinks_)[static_cast<std::size_t>(i)] : Tensor();
  }
  // The dtype input i's gradient may be returned in: the input's own, or, where the input is
  // the output of an op with OpDef::gradient_in_input_dtype (a parameter's 16-bit copy under
  // autocast), that op's input dtype, which the engine passes on unconverted. The grad sink
  // of such an input is then the parameter's .grad() buffer.
  DType grad_dtype(int i) const;
  // Output i's incoming gradient is the implicit 1 of backward() on this one-element root,
  // nothing else adds to it, and the graph is not retained: a vjp may hand back a gradient its
  // forward already wrote for a gradient of 1 (the saved tensor is not used again).
  bool unit_gradient(int i) const {
    return unit_ && static_cast<std::size_t>(i) < unit_->size() && (*unit_)[static_cast<std::size_t>(i)];
  }
  // Input i is the output of a ReLU (an op whose OpDef::relu_masked_gradient holds) read by this
  // op alone: its gradient may be returned already zero where the input is not > 0, the ReLU's
  // own mask, which the ReLU's vjp then skips. A vjp that does so calls masked_input_gradient(i).
  bool may_mask_input_gradient(int i) const { return flag(masks_ ? &masks_->may_mask : nullptr, i); }
  void masked_input_gradient(int i) const;
  // Output k's incoming gradient is already zero wherever output k is not > 0.
  bool gradient_masked(int k) const { return flag(masks_ ? &masks_->incoming : nullptr, k); }
  // The node whose output 0 input i is, where the gradient this vjp returns for input i is that
  // output's whole gradient (nothing else reads it, it is no root) in the input's dtype, so that
  // the vjp may also compute what the producer's vjp will reduce it to; null otherwise.
  const Node* sole_producer(int i) const {
    return masks_ && i >= 0 && static_cast<std::size_t>(i) < masks_->sole_producer.size()
               ? masks_->sole_producer[static_cast<std::size_t>(i)]
               : nullptr;
  }
  // In a compiled step: the grad sink that input i's sole producer's vjp will find for its own
  // input j (undefined where none). A vjp that writes it hands the producer's vjp that gradient
  // made (linear's ahead bias gradient), which that vjp then returns.
  Tensor producer_sink(int i, int j) const {
    const Node* p = sole_producer(i);
    return p && masks_->sink_of ? masks_->sink_of(*p, j) : Tensor();
  }

 private:
  static bool flag(const std::vector<bool>* v, int i) {
    return v && static_cast<std::size_t>(i) < v->size() && (*v)[static_cast<std::size_t>(i)];
  }
  const Node& node_;
  const std::vector<bool>& needs_;
  const std::vector<Tensor>* sinks_;
  const std::vector<bool>* unit_;
  GradientMasks* masks_;
};

// One gradient per input (undefined where none flows); one incoming gradient per output.
using Vjp = std::function<std::vector<Tensor>(const VjpContext&, std::span<const Tensor> grads)>;

// Which tensors a node keeps for the vjp. Nothing else is kept.
struct SavePolicy {
  std::vector<int> inputs{};
  std::vector<int> outputs{};
};

// One input's test data: a fixed dtype (i64 labels, a bool condition) and its own range.
struct InputHint {
  std::optional<DType> dtype{};
  double low = 0, high = 0;  // used when low < high; integers take [low, high)
};

// How the registry-driven tests exercise an op.
struct TestHints {
  std::vector<Attrs> attrs{Attrs{}};  // attribute sets to try (cases the CPU rejects are skipped)
  double low = -2.0, high = 2.0;      // range of random floating inputs
  bool gradcheck = true;              // false when finite differences do not apply
  bool same_shape_inputs = false;     // no broadcasting pairs
  // Outputs summed over many terms (matmul, conv) round differently on each device.
  double tolerance_scale = 1.0;
  // f32 may run on TF32 tensor cores (convolutions by default): f32 cases then compare at
  // bf16's tolerance, since rounding every input to 11 bits errs more over a sum than
  // rounding only the output does.
  bool tf32 = false;
  // >= 0: the NaN/Inf case puts them in this input only (a convolution's taps over padding
  // multiply zero by the weight on tensor cores, where the reference skips them).
  int specials_input = -1;
  std::vector<InputHint> inputs{};           // by input index; missing: the case's dtype and range
  std::vector<std::vector<Shape>> shapes{};  // explicit input shape sets; empty: the generic ones
};

// A pointwise op's device math, spliced into the elementwise templates' ${OP} and, later,
// into fused kernels: one expression of x (unary) or a, b (binary) in the input's compute
// type C, plus the double params p0, p1; it may call the prelude's kiln::math
// functions (kernel_templates/prelude.cu) and nothing else.
struct PointwiseExpr {
  std::string expr;
  kernels::PointwiseDomain domain = kernels::PointwiseDomain::numeric;
  // p0, p1 from the call's attrs (leaky_relu's slope, clamp's bounds, user params); empty: 0, 0.
  std::function<std::pair<double, double>(const Attrs&)> params{};
};

// A tensor-scalar op (add_scalar, rdiv_scalar) that runs the binary op `binary`'s expression
// with the attrs' "scalar" as b (as a when scalar_first): fusion splices it from there.
struct ScalarForm {
  std::string binary;
  bool scalar_first = false;
};

struct OpDef {
  std::string name{};
  int num_inputs = 1;  // tensor inputs; -1: any number
  int num_outputs = 1;
  std::vector<DType> dtypes{};  // supported key dtypes
  DTypeRule dtype_rule{};       // empty: rules::promote
  ShapeRule shape_rule{};       // empty: rules::broadcast
  Impl cpu{};
  // Set when .cpu is a fast path (BLAS, threads): the independent loops it must agree with,
  // run instead of .cpu while use_cpu_reference is on (the GPU tests compare against these).
  Impl cpu_reference{};
  Impl gpu{};                   // empty: the op runs on the CPU only (DeviceError on cuda)
  // Set: register_op registers the op's elementwise kernel spec, named after the op.
  std::optional<PointwiseExpr> pointwise{};
  std::optional<ScalarForm> scalar_form{};  // set by the tensor-scalar ops; fusion reads it
  bool makes_outputs = false;  // the impl creates the outputs itself (views, transfers)
  Vjp vjp{};                    // empty: not differentiable (outputs never require grad)
  // -1: every output carries a gradient (missing ones reach the vjp as zeros); n: outputs from
  // n on (masks, statistics) carry none, and reach the vjp undefined at no cost.
  int differentiable_outputs = -1;
  // The vjp hands the gradient of its one output to its one input unchanged, in the input's
  // dtype (a cast of a parameter under autocast): the op consuming the output may give that
  // gradient in the input's dtype already (VjpContext::grad_dtype), and the engine converts it
  // nowhere on the way, so a 16-bit product's gradient reaches an f32 .grad() with no cast.
  bool gradient_in_input_dtype = false;
  // Set where, for these attrs, the vjp first zeroes output 0's gradient wherever output 0 is not
  // > 0 (a ReLU), and skips that when VjpContext::gradient_masked(0) says the op reading the
  // output did it already (VjpContext::may_mask_input_gradient).
  std::function<bool(const Attrs&)> relu_masked_gradient{};
  SavePolicy save{};
  TestHints test{};
};

// Registers `def` for the life of the process; the reference is stable. Throws
// ValueError on a duplicate name or a definition without a CPU implementation, and for a
// pointwise op that is not unary or binary or whose kernel spec cannot be registered.
const OpDef& register_op(OpDef def);
// What an op's file keeps of it: `const OpRef kSquare = register_op({...});`, used as a
// const OpDef&. Not a `const OpDef&` itself: GCC 13's -Wdangling-reference takes a reference bound
// to a call with a temporary argument (the OpDef) for a dangling one.
class OpRef {
 public:
  OpRef(const OpDef& op) : op_(&op) {}
  operator const OpDef&() const { return *op_; }
  const OpDef* operator->() const { return op_; }

 private:
  const OpDef* op_;
};
// The op's device expression; nullptr for an op that is not pointwise.
inline const PointwiseExpr* pointwise_expr(const OpDef& op) { return op.pointwise ? &*op.pointwise : nullptr; }
// p0, p1 of a pointwise op for one call's attrs.
std::pair<double, double> pointwise_params(const OpDef& op, const Attrs& attrs);
const OpDef* find_op(std::string_view name);
const std::vector<const OpDef*>& registered_ops();

// Runs one op call (see the guide above). Returns every output; call and call_inplace
// (tensor/dispatch.h) return the first. `into`: tensors the outputs may be written to (by
// index; used when defined, contiguous and of the output's shape and dtype), for an op that
// is not pointwise and records no history (a vjp's grad sinks).
std::vector<Tensor> dispatch(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs = {},
                             std::span<const Tensor> into = {});

namespace rules {
// Inputs promoted together (and with attrs "scalar" when present); outputs that dtype.
DTypePlan promote(const OpArgs& a);
// As promote, but integer/bool results become f32 (true division, exp, mean...).
DTypePlan promote_float(const OpArgs& a);
// Inputs promoted, outputs bool (comparisons).
DTypePlan compare(const OpArgs& a);
// Inputs unchanged; every output has input 0's dtype.
DTypePlan same_as_input(const OpArgs& a);
// Every output has the broadcast shape of the inputs.
std::vector<Shape> broadcast(const OpArgs& a);
std::vector<Shape> same_shape_as_input(const OpArgs& a);
// Ops without inputs (creation, random): the dtype from attrs "dtype", the shape from attrs
// "shape" (a negative size is a ShapeError naming the op).
DTypePlan dtype_from_attrs(const OpArgs& a);
std::vector<Shape> shape_from_attrs(const OpArgs& a);
// The vjp of an op whose gradient is its output's (copies, casts that autograd sees through).
inline std::vector<Tensor> pass_through(const VjpContext&, std::span<const Tensor> g) { return {g[0]}; }
}  // namespace rules

// A created tensor (creation and random ops), made to require grad when o asks.
inline Tensor with_grad_option(Tensor t, const TensorOptions& o) {
  if (o.requires_grad) t.requires_grad_();
  return t;
}

// Broadcasting (broadcast_shapes), axis handling, make_view and bump_version: tensor/dispatch.h.


// Reductions share the attrs "axes" (every dim for a full reduction) and "keepdim".
std::vector<int> reduction_axes(const Attrs& attrs, int ndim, std::string_view op);
Shape reduced_shape(const Shape& in, const std::vector<int>& axes, bool keepdim);

// While on, CPU calls run each op's cpu_reference where it has one (process-wide; the GPU
// test suite turns it on). CpuReferenceGuard sets it for a scope.
void use_cpu_reference(bool on);
bool cpu_reference_in_use();
class CpuReferenceGuard {
 public:
  explicit CpuReferenceGuard(bool on = true) : prev_(cpu_reference_in_use()) { use_cpu_reference(on); }
  ~CpuReferenceGuard() { use_cpu_reference(prev_); }
  CpuReferenceGuard(const CpuReferenceGuard&) = delete;
  CpuReferenceGuard& operator=(const CpuReferenceGuard&) = delete;

 private:
  bool prev_;
};

// For implementations.
std::string dtypes_str(const std::vector<DType>& dtypes);  // "f32, f64"

// GPU building blocks over engine/backend/cuda (core/gpu_helpers.cpp).
namespace gpu {
// A kernel spec found on first use: specs register while the library loads, in
// other files, so an op cannot look its kernel up at its own registration.
class LazyKernel {
 public:
  explicit LazyKernel(std::string op) : op_(std::move(op)) {}
  LazyKernel(const LazyKernel& o) : op_(o.op_), spec_(o.spec_.load()) {}
  const rt::KernelSpec& get() const {
    const rt::KernelSpec* s = spec_.load(std::memory_order_acquire);
    if (!s) {
      s = &kernels::kernel(op_);
      spec_.store(s, std::memory_order_release);
    }
    return *s;
  }

 private:
  std::string op_;
  mutable std::atomic<const rt::KernelSpec*> spec_{nullptr};
};

// t's address with its strides viewed at `shape` (broadcast dims get stride 0).
kernels::Operand operand(const Tensor& t, const Shape& shape);
inline kernels::Operand operand(const Tensor& t) { return operand(t, t.shape()); }
// Reduces `in` over `axes` (normalised, sorted) into the contiguous `out`, whose elements
// are the kept dims in row-major order, with a reduction kernel (reduce_kernels.h).
// Reduced dims are first gathered into one contiguous run when the layout needs it.
void reduce(const rt::KernelSpec& spec, const Tensor& in, const std::vector<int>& axes, const Tensor& out,
            double param = 0);
}  // namespace gpu

}  // namespace kiln
