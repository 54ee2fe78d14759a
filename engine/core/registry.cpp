#include "registry.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "core/autograd/record.h"
#include "kiln/runtime/device.h"
#include "core/tensor/copy.h"
#include "core/tensor/tensor_impl.h"

namespace kiln {

namespace {

struct Registry {
  std::mutex mu;
  std::deque<OpDef> defs;  // stable addresses
  std::vector<const OpDef*> list;
  std::unordered_map<std::string, const OpDef*> by_name;
};

std::atomic<bool> g_cpu_reference{false};

Registry& registry() {
  static Registry r;
  return r;
}

std::string bracket(const OpDef& op) { return "[" + op.name + "] "; }

// The device every input is on (or attrs "device" without inputs); DeviceError otherwise.
Device common_device(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs) {
  if (op.num_inputs >= 0 && static_cast<int>(inputs.size()) != op.num_inputs) {
    throw ValueError(bracket(op) + "takes " + std::to_string(op.num_inputs) + " tensor inputs, got " +
                     std::to_string(inputs.size()));
  }
  if (inputs.empty()) return attrs.get_or<Device>("device", Device::cpu());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined()) throw ValueError(bracket(op) + "input " + std::to_string(i) + " is an undefined tensor");
  Device d = inputs[0].device();
  for (const Tensor& t : inputs)
    if (t.device() != d) throw DeviceError(bracket(op) + "tensors on " + d.str() + " and " + t.device().str());
  return d;
}

DTypePlan make_plan(const OpArgs& args) {
  const OpDef& op = args.op;
  DTypePlan plan = op.dtype_rule ? op.dtype_rule(args) : rules::promote(args);
  if (!op.dtypes.empty() && std::find(op.dtypes.begin(), op.dtypes.end(), plan.key) == op.dtypes.end()) {
    throw DTypeError(bracket(op) + "dtype " + std::string(dtype_name(plan.key)) + " is not supported (supported: " +
                     dtypes_str(op.dtypes) + ")");
  }
  if (plan.inputs.size() != args.inputs.size() || static_cast<int>(plan.outputs.size()) != op.num_outputs)
    throw ValueError(bracket(op) + "dtype rule returned the wrong number of dtypes");
  return plan;
}

// Inputs converted to the plan's dtypes; `storage` keeps converted copies alive.
std::span<const Tensor> cast_inputs(std::span<const Tensor> inputs, const DTypePlan& plan,
                                    std::vector<Tensor>& storage) {
  bool any = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) any = any || inputs[i].dtype() != plan.inputs[i];
  if (!any) return inputs;
  storage.assign(inputs.begin(), inputs.end());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (storage[i].dtype() != plan.inputs[i]) storage[i] = convert(storage[i], plan.inputs[i]);
  return storage;
}

std::vector<Shape> make_shapes(const OpArgs& args) {
  std::vector<Shape> shapes = args.op.shape_rule ? args.op.shape_rule(args) : rules::broadcast(args);
  if (static_cast<int>(shapes.size()) != args.op.num_outputs)
    throw ValueError(bracket(args.op) + "shape rule returned the wrong number of shapes");
  return shapes;
}

const Impl& impl_for(const OpDef& op, Device d) {
  if (step::capturing() && d != step::capture_device())
    throw ValueError(bracket(op) + (d.is_cpu() ? "runs on a CPU tensor" : "runs on " + d.str()) +
                     " inside a step captured on " + step::capture_device().str() +
                     "; a CUDA graph holds the work of one device");
  if (d.is_cpu()) return op.cpu_reference && cpu_reference_in_use() ? op.cpu_reference : op.cpu;
  if (!op.gpu) throw DeviceError(bracket(op) + "has no GPU implementation (tensors on " + d.str() + ")");
  return op.gpu;
}

// PyTorch's canCast: no float -> integer/bool, no number -> bool.
bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != DType::boolean && to == DType::boolean) return false;
  return true;
}

}  // namespace

const std::string& OpArgs::name() const { return op.name; }

void use_cpu_reference(bool on) { g_cpu_reference.store(on, std::memory_order_relaxed); }
bool cpu_reference_in_use() { return g_cpu_reference.load(std::memory_order_relaxed); }

const OpDef& register_op(OpDef def) {
  if (def.name.empty()) throw ValueError("[registry] an op needs a name");
  if (!def.cpu) throw ValueError("[registry] op '" + def.name + "' has no CPU implementation");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (r.by_name.count(def.name)) throw ValueError("[registry] op '" + def.name + "' is registered twice");
  // The kernel first: an op whose spec is refused is not registered either.
  if (const PointwiseExpr* pw = pointwise_expr(def)) {
    kernels::register_pointwise_kernel(def.name, def.num_inputs, pw->expr, pw->domain);
  }
  const OpDef& stored = r.defs.emplace_back(std::move(def));
  r.list.push_back(&stored);
  r.by_name.emplace(stored.name, &stored);
  return stored;
}

std::pair<double, double> pointwise_params(const OpDef& op, const Attrs& attrs) {
  const PointwiseExpr* pw = pointwise_expr(op);
  return pw && pw->params ? pw->params(attrs) : std::pair<double, double>{0.0, 0.0};
}

const OpDef* find_op(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_name.find(std::string(name));
  return it == r.by_name.end() ? nullptr : it->second;
}

const OpDef& get_op(std::string_view name) {
  if (const OpDef* op = find_op(name)) return *op;
  std::string known;
  for (const OpDef* op : registered_ops()) known += (known.empty() ? "" : " ") + op->name;
  throw ValueError("[registry] unknown op '" + std::string(name) + "' (known: " + known + ")");
}

const std::vector<const OpDef*>& registered_ops() { return registry().list; }

std::vector<Tensor> dispatch(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                             std::span<const Tensor> into) {
  const Device device = common_device(op, inputs, attrs);
  const DTypePlan plan = make_plan(OpArgs{op, inputs, attrs, device});
  std::vector<Tensor> converted;
  const OpArgs args{op, cast_inputs(inputs, plan, converted), attrs, device};
  const std::vector<Shape> shapes = make_shapes(args);
  const Impl& impl = impl_for(op, device);

  std::vector<Tensor> outputs(static_cast<std::size_t>(op.num_outputs));
  if (!into.empty() && (op.makes_outputs || op.pointwise || (grad_enabled() && any_requires_grad(inputs))))
    throw ValueError(bracket(op) + "cannot write into given outputs: the op is pointwise, makes its outputs or records history");
  auto usable = [&](std::size_t i) {
    return i < into.size() && into[i].defined() && into[i].shape() == shapes[i] && into[i].dtype() == plan.outputs[i] &&
           into[i].device() == device && into[i].is_contiguous();
  };
  if (!op.makes_outputs)
    for (std::size_t i = 0; i < outputs.size(); ++i)
      outputs[i] = usable(i) ? into[i] : Tensor(make_impl(shapes[i], plan.outputs[i], device));
  // Inside a compiled call a pointwise op may be held back, to run fused with the next ones.
  if (!step::defer_pointwise(op, args, outputs)) {
    const step::RunAlone alone(op, outputs);
    impl(args, outputs);
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) throw ValueError(bracket(op) + "implementation left output " + std::to_string(i) + " unset");
    // An output must be a new handle, or autograd would rewrite an input's history.
    for (const Tensor& in : inputs)
      if (outputs[i].is_same(in)) outputs[i] = make_view(in, in.shape(), in.strides(), in.offset());
  }
  if (op.makes_outputs && !inputs.empty()) mark_views(inputs[0], outputs);
  if (op.vjp && grad_enabled() && any_requires_grad(inputs)) record_node(op, attrs, inputs, args.inputs, outputs);
  return outputs;
}

Tensor call(const OpDef& op, std::initializer_list<Tensor> inputs, const Attrs& attrs) {
  return dispatch(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs)[0];
}

Tensor& call_inplace(const OpDef& op, Tensor& self, std::initializer_list<Tensor> others, const Attrs& attrs) {
  // "[add_]" for add and add_scalar alike.
  std::string_view base = op.name;
  if (base.ends_with("_scalar")) base.remove_suffix(7);
  std::string who = "[";
  who.append(base).append("_] ");
  if (!self.defined()) throw ValueError(who + "the in-place target is an undefined tensor");
  if (op.makes_outputs || op.num_outputs != 1) throw ValueError(who + "this op cannot run in place");
  std::vector<Tensor> inputs{self};
  inputs.insert(inputs.end(), others.begin(), others.end());

  auto check_result = [&](const Shape& shape, DType dtype) {
    if (shape != self.shape())
      throw ShapeError(who + "the result's shape " + shape_str(shape) + " cannot be written in place into a tensor of shape " +
                       shape_str(self.shape()));
    if (!can_cast(dtype, self.dtype()))
      throw DTypeError(who + "the result's dtype " + std::string(dtype_name(dtype)) +
                       " cannot be written in place into a tensor of dtype " + std::string(dtype_name(self.dtype())));
  };

  if (op.vjp && inplace_needs_history(self, inputs)) {
    check_inplace(self, who);
    // The node may save self; give it a copy, since self is about to be overwritten.
    auto& save = op.save.inputs;
    if (std::find(save.begin(), save.end(), 0) != save.end()) inputs[0] = self.clone();
    Tensor r = dispatch(op, inputs, attrs)[0];
    check_result(r.shape(), r.dtype());
    copy_into(r, self);
    bump_version(self);
    rebase_history(self, r);
    return self;
  }

  const Device device = common_device(op, inputs, attrs);
  const DTypePlan plan = make_plan(OpArgs{op, inputs, attrs, device});
  std::vector<Tensor> converted;
  const OpArgs args{op, cast_inputs(inputs, plan, converted), attrs, device};
  const Shape shape = make_shapes(args)[0];
  check_result(shape, plan.outputs[0]);
  const Impl& impl = impl_for(op, device);
  // Writing straight into self is safe when every input that shares its storage reads
  // exactly the elements being written, in the same layout.
  bool direct = plan.outputs[0] == self.dtype() && self.is_contiguous();
  for (std::size_t i = 1; i < args.inputs.size() && direct; ++i) {
    const Tensor& in = args.inputs[i];
    if (in.shares_storage(self))
      direct = in.offset() == self.offset() && in.shape() == self.shape() && in.strides() == self.strides();
  }
  std::vector<Tensor> outputs{direct ? self : Tensor(make_impl(shape, plan.outputs[0], device))};
  impl(args, outputs);
  if (!direct) copy_into(outputs[0], self);
  bump_version(self);
  return self;
}

namespace rules {

DTypePlan promote(const OpArgs& a) {
  ResultType rt;
  for (const Tensor& t : a.inputs) rt.add(t);
  if (a.attrs.has("scalar")) rt.add(a.attrs.get<Scalar>("scalar"));
  DType d = rt.get();
  DTypePlan p;
  p.inputs.assign(a.inputs.size(), d);
  p.outputs.assign(static_cast<std::size_t>(a.op.num_outputs), d);
  p.key = d;
  return p;
}

DTypePlan promote_float(const OpArgs& a) {
  DTypePlan p = promote(a);
  if (!is_floating(p.key)) {
    p.key = kDefaultFloat;
    std::fill(p.inputs.begin(), p.inputs.end(), p.key);
    std::fill(p.outputs.begin(), p.outputs.end(), p.key);
  }
  return p;
}

DTypePlan compare(const OpArgs& a) {
  DTypePlan p = promote(a);
  std::fill(p.outputs.begin(), p.outputs.end(), DType::boolean);
  return p;
}

DTypePlan same_as_input(const OpArgs& a) {
  if (a.inputs.empty()) throw ValueError("[" + a.op.name + "] same_as_input needs an input");
  DTypePlan p;
  for (const Tensor& t : a.inputs) p.inputs.push_back(t.dtype());
  p.outputs.assign(static_cast<std::size_t>(a.op.num_outputs), a.inputs[0].dtype());
  p.key = a.inputs[0].dtype();
  return p;
}

std::vector<Shape> broadcast(const OpArgs& a) {
  Shape s;
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    s = i == 0 ? a.inputs[0].shape() : broadcast_shapes(s, a.inputs[i].shape(), a.op.name);
  return std::vector<Shape>(static_cast<std::size_t>(a.op.num_outputs), s);
}

std::vector<Shape> same_shape_as_input(const OpArgs& a) {
  if (a.inputs.empty()) throw ValueError("[" + a.op.name + "] same_shape_as_input needs an input");
  return std::vector<Shape>(static_cast<std::size_t>(a.op.num_outputs), a.inputs[0].shape());
}

DTypePlan dtype_from_attrs(const OpArgs& a) {
  const DType d = a.attrs.get<DType>("dtype");
  return DTypePlan{{}, {d}, d};
}

std::vector<Shape> shape_from_attrs(const OpArgs& a) {
  const Shape& s = a.attrs.get<std::vector<std::int64_t>>("shape");
  for (std::int64_t d : s)
    if (d < 0) throw ShapeError("[" + a.op.name + "] negative size in shape " + shape_str(s));
  return {s};
}

}  // namespace rules

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ShapeError("[" + std::string(op) + "] shapes " + shape_str(a) + " and " + shape_str(b) +
                       " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}


int normalize_axis(std::int64_t axis, int ndim, std::string_view op) {
  const std::int64_t n = std::max(ndim, 1);  // a zero-dim tensor accepts axis 0 and -1, as PyTorch does
  if (axis < -n || axis >= n)
    throw ShapeError("[" + std::string(op) + "] axis " + std::to_string(axis) + " is out of range for a tensor of " +
                     std::to_string(ndim) + " dims");
  return static_cast<int>(axis < 0 ? axis + n : axis);
}

std::vector<int> normalize_axes(const std::vector<std::int64_t>& axes, int ndim, std::string_view op) {
  std::vector<int> out;
  for (std::int64_t a : axes) {
    int n = normalize_axis(a, ndim, op);
    if (ndim == 0) continue;
    if (std::find(out.begin(), out.end(), n) != out.end())
      throw ShapeError("[" + std::string(op) + "] axis " + std::to_string(n) + " appears twice");
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> reduction_axes(const Attrs& attrs, int ndim, std::string_view op) {
  return normalize_axes(attrs.get<std::vector<std::int64_t>>("axes"), ndim, op);
}

Shape reduced_shape(const Shape& in, const std::vector<int>& axes, bool keepdim) {
  Shape out;
  for (int d = 0; d < static_cast<int>(in.size()); ++d) {
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) out.push_back(in[static_cast<std::size_t>(d)]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, std::int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->dtype = base.dtype();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  return Tensor(std::move(impl));
}

void bump_version(const Tensor& t) { t.impl()->storage->bump_version(); }

const rt::Stream& stream_of(Device d) {
  if (!d.is_cuda()) throw DeviceError("[stream] " + d.str() + " has no stream");
  return rt::default_stream(d.index());
}

std::string dtypes_str(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType t : dtypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(t));
  return s;
}

}  // namespace kiln
