// Pointwise fusion inside compiled calls: ops are held back at dispatch, and a pending group
// becomes one generated kernel that splices each op's device expression (its OpDef) in order.
#include "fusion.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "backend/cuda/layout.h"
#include "core/registry.h"
#include "core/tensor/tensor_impl.h"

namespace kiln::compile_detail {

namespace {

constexpr int kMaxOperands = 8;  // outputs written plus distinct outside inputs

struct Pending {
  const OpDef* op;
  std::pair<double, double> params;
  std::vector<Tensor> inputs;
  Tensor output;
};

}  // namespace

struct Fusion {
  Device device;
  std::vector<Pending> ops;
  std::vector<const void*> storages;  // of every pending input and output
};

thread_local Fusion* t_fusion = nullptr;

namespace {

const void* storage_of(const Tensor& t) { return t.impl()->storage.get(); }

int producer(const std::vector<Pending>& ops, const Tensor& t) {
  for (std::size_t k = 0; k < ops.size(); ++k)
    if (ops[k].output.impl() == t.impl()) return static_cast<int>(k);
  return -1;
}

std::vector<Tensor> outside_inputs(const std::vector<Pending>& ops) {
  std::vector<Tensor> ext;
  for (const Pending& p : ops)
    for (const Tensor& in : p.inputs)
      if (producer(ops, in) < 0 &&
          std::none_of(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); }))
        ext.push_back(in);
  return ext;
}

bool eligible(const Fusion& f, const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) {
  if (!op.pointwise || outputs.size() != 1 || args.device != f.device) return false;
  if (args.inputs.size() != 1 && args.inputs.size() != 2) return false;
  const DType dt = outputs[0].dtype();
  if (dt != DType::f32 && dt != DType::f64) return false;
  if (outputs[0].numel() == 0 || outputs[0].dim() > kernels::kMaxDims) return false;
  for (const Tensor& in : args.inputs)
    if (in.dtype() != dt || in.device() != f.device) return false;
  return true;
}

// Whether op joins the pending group: same shape and dtype, room for its operands, and no
// input that views a pending output in another layout.
bool joins(const Fusion& f, std::span<const Tensor> inputs, const Tensor& out) {
  if (f.ops.empty()) return true;
  const Tensor& first = f.ops.front().output;
  if (out.shape() != first.shape() || out.dtype() != first.dtype()) return false;
  for (const Tensor& in : inputs)
    if (producer(f.ops, in) < 0 && std::find(f.storages.begin(), f.storages.end(), storage_of(in)) != f.storages.end())
      for (const Pending& p : f.ops)
        if (storage_of(p.output) == storage_of(in)) return false;
  std::vector<Pending> trial = f.ops;
  trial.push_back(Pending{nullptr, {}, {inputs.begin(), inputs.end()}, out});
  return static_cast<int>(outside_inputs(trial).size() + trial.size()) <= kMaxOperands;
}

std::string literal(double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  char buf[64];
  std::snprintf(buf, sizeof buf, "__longlong_as_double(0x%016" PRIx64 "LL)", bits);
  return buf;
}

// The kernel source of a group: each op's expression as a function, called in order, with an
// empty asm barrier after each so no contraction crosses ops (results match the single ops).
std::string source(const std::vector<Pending>& ops, const std::vector<Tensor>& ext, const std::vector<int>& stored,
                   int nop) {
  const bool f64 = ops.front().output.dtype() == DType::f64;
  std::string s = rt::device_prelude(DTypes{ops.front().output.dtype()});
  s += std::string("typedef ") + (f64 ? "double" : "float") + " C;\n";
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const bool unary = ops[k].inputs.size() == 1;
    s += "__device__ __forceinline__ C f" + std::to_string(k) + (unary ? "(C x" : "(C a, C b") +
         ", double p0, double p1) { return kiln::cvt<C>(" + ops[k].op->pointwise->expr + "); }\n";
  }
  s += "extern \"C\" __global__ void __launch_bounds__(256) kiln_fused(kiln::Layout<" + std::to_string(nop) + "> L";
  for (std::size_t j = 0; j < ext.size(); ++j) s += ", const C* e" + std::to_string(j);
  for (std::size_t k = 0; k < stored.size(); ++k) s += ", C* s" + std::to_string(k);
  s += ") {\n  const long long step = kiln::thread_count();\n";
  s += "  for (long long i = kiln::thread_index(); i < L.n; i += step) {\n";
  s += "    long long off[" + std::to_string(nop) + "];\n";
  s += "    if (L.ndim == 0) { for (int k = 0; k < " + std::to_string(nop) + "; ++k) off[k] = i; } else kiln::offsets(L, i, off);\n";
  for (std::size_t j = 0; j < ext.size(); ++j)
    s += "    const C v" + std::to_string(j) + " = e" + std::to_string(j) + "[off[" + std::to_string(stored.size() + j) + "]];\n";
  for (std::size_t k = 0; k < ops.size(); ++k) {
    std::string args;
    for (const Tensor& in : ops[k].inputs) {
      const int p = producer(ops, in);
      if (p >= 0) {
        ((args += 't') += std::to_string(p)) += ", ";  // appends: "t" + string&& trips GCC 12's -Wrestrict
      } else {
        const auto it = std::find_if(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); });
        ((args += 'v') += std::to_string(it - ext.begin())) += ", ";
      }
    }
    const std::string t = std::string("t") += std::to_string(k);
    s += "    C " + t + " = f" + std::to_string(k) + "(" + args + literal(ops[k].params.first) + ", " +
         literal(ops[k].params.second) + ");\n";
    s += std::string("    asm volatile(\"\" : \"+") + (f64 ? "d" : "f") + "\"(" + t + "));\n";
  }
  for (std::size_t k = 0; k < stored.size(); ++k)
    s += "    s" + std::to_string(k) + "[off[" + std::to_string(k) + "]] = t" + std::to_string(stored[k]) + ";\n";
  s += "  }\n}\n";
  return s;
}

// Everything source() depends on, as words: the dtype, then per op its name's hash, its
// params' bits and where each input comes from (an earlier op, or an outside input by first
// use), then the stored outputs. A repeated group finds its kernel without building source.
rt::GeneratedKey group_key(const std::vector<Pending>& ops, const std::vector<Tensor>& ext,
                           const std::vector<int>& stored) {
  rt::GeneratedKey key("fused");
  key.add(ops.front().output.dtype(), ops.size(), ext.size(), stored.size());
  for (const Pending& p : ops) {
    // The arity in 8 bits, then each input in 28: the op making it, or 2^27 + its outside index.
    std::uint64_t wiring = p.inputs.size();
    for (std::size_t i = 0; i < p.inputs.size(); ++i) {
      const Tensor& in = p.inputs[i];
      const int k = producer(ops, in);
      const auto it = std::find_if(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); });
      const std::uint64_t from =
          k >= 0 ? static_cast<std::uint64_t>(k) : (1u << 27) + static_cast<std::uint64_t>(it - ext.begin());
      wiring |= from << (8 + 28 * i);
    }
    key.add(rt::fnv1a64(p.op->name), p.params.first, p.params.second, wiring);
  }
  for (int k : stored) key.add(k);
  return key;
}

// The group's spec; its source and label are made only the first time the key is met. The
// name follows from the key alone, so another process finds the module in the disk cache.
const rt::KernelSpec& spec_for(const std::vector<Pending>& ops, const std::vector<Tensor>& ext,
                               const std::vector<int>& stored, int nop) {
  return *rt::generated_kernels(group_key(ops, ext, stored), [&] {
    std::string names;
    for (const Pending& p : ops) (names += names.empty() ? "" : ",") += p.op->name;
    std::string label = "fused(";
    ((label += names) += ") ") += dtype_name(ops.front().output.dtype());
    return rt::GeneratedModule{source(ops, ext, stored, nop), std::move(label), {"kiln_fused"}};
  })[0];
}

template <int N>
void launch_n(const rt::Function& fn, const Shape& shape, const std::vector<kernels::Operand>& operands,
              std::vector<rt::DevicePtr>& ptrs, const rt::Stream& s, int device) {
  std::array<const kernels::Operand*, N> ops{};
  for (int k = 0; k < N; ++k) ops[static_cast<std::size_t>(k)] = &operands[static_cast<std::size_t>(k)];
  kernels::Layout<N> L = kernels::make_layout<N>("fused", shape, ops);
  std::vector<void*> args{&L};
  for (rt::DevicePtr& p : ptrs) args.push_back(&p);
  args.push_back(nullptr);
  rt::launch_raw(fn, kernels::grid_stride_config(static_cast<std::uint64_t>(L.n), device), s, args.data());
}

void run(std::vector<Pending> ops) {
  const std::vector<Tensor> ext = outside_inputs(ops);
  // An output is written when something outside the group holds it (a later op, autograd,
  // the caller) or shares its storage.
  std::vector<int> stored;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const Tensor& out = ops[k].output;
    long internal = 1;  // this Pending's own handle
    for (const Pending& p : ops)
      for (const Tensor& in : p.inputs) internal += in.impl() == out.impl();
    if (out.impl_ptr().use_count() > internal || out.impl()->storage.use_count() > 1) stored.push_back(static_cast<int>(k));
  }
  if (stored.empty()) return;  // nothing can see the results
  const int nop = static_cast<int>(stored.size() + ext.size());
  const Shape shape = ops.front().output.shape();
  const int device = ops.front().output.device().index();
  const rt::Function fn = rt::get_function(spec_for(ops, ext, stored, nop), DTypes{DType::u8}, 0, device);
  std::vector<kernels::Operand> operands;
  std::vector<rt::DevicePtr> ptrs;
  for (int k : stored) operands.push_back(gpu::operand(ops[static_cast<std::size_t>(k)].output));
  for (const Tensor& e : ext) operands.push_back(gpu::operand(e, shape));
  for (const Tensor& e : ext) ptrs.push_back(device_address(e));
  for (int k : stored) ptrs.push_back(device_address(ops[static_cast<std::size_t>(k)].output));
  const rt::Stream& s = stream_of(ops.front().output.device());
  switch (nop) {
    case 1: return launch_n<1>(fn, shape, operands, ptrs, s, device);
    case 2: return launch_n<2>(fn, shape, operands, ptrs, s, device);
    case 3: return launch_n<3>(fn, shape, operands, ptrs, s, device);
    case 4: return launch_n<4>(fn, shape, operands, ptrs, s, device);
    case 5: return launch_n<5>(fn, shape, operands, ptrs, s, device);
    case 6: return launch_n<6>(fn, shape, operands, ptrs, s, device);
    case 7: return launch_n<7>(fn, shape, operands, ptrs, s, device);
    default: return launch_n<8>(fn, shape, operands, ptrs, s, device);
  }
}

}  // namespace

bool defer_pointwise(const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) {
  Fusion* f = t_fusion;
  if (!f || !eligible(*f, op, args, outputs)) return false;
  if (!joins(*f, args.inputs, outputs[0])) flush_pointwise();
  Pending p{&op, pointwise_params(op, args.attrs), {args.inputs.begin(), args.inputs.end()}, outputs[0]};
  for (const Tensor& in : p.inputs) f->storages.push_back(storage_of(in));
  f->storages.push_back(storage_of(p.output));
  f->ops.push_back(std::move(p));
  return true;
}

void before_use(const Tensor& t) {
  Fusion* f = t_fusion;
  if (!f || f->ops.empty() || !t.defined()) return;
  if (std::find(f->storages.begin(), f->storages.end(), storage_of(t)) != f->storages.end()) flush_pointwise();
}

void flush_pointwise() {
  Fusion* f = t_fusion;
  if (!f || f->ops.empty()) return;
  std::vector<Pending> ops = std::move(f->ops);
  f->ops.clear();
  f->storages.clear();  // cleared first: the launch takes addresses, which must not flush again
  run(std::move(ops));
}

FusionScope::FusionScope(Device device) {
  if (t_fusion || !device.is_cuda()) return;
  own_ = new Fusion{device, {}, {}};
  t_fusion = own_;
  step::g_fusions.fetch_add(1);
}

FusionScope::~FusionScope() {
  if (!own_) return;
  t_fusion = nullptr;
  step::g_fusions.fetch_sub(1);
  delete own_;
}

void FusionScope::finish() {
  if (own_) flush_pointwise();
}

}  // namespace kiln::compile_detail
