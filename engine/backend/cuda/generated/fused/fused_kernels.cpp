// The fused family's source, key and launch. Each op is a function f<k> from its inputs'
// storage type to its output's through its compute type; the kernel loads the outside inputs,
// calls the functions in order and stores the results something outside the group reads.
#include "fused_kernels.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "backend/cuda/layout.h"
#include "kiln/error.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/launch.h"

namespace kiln::kernels {

namespace {

std::string literal(double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  char buf[64];
  std::snprintf(buf, sizeof buf, "__longlong_as_double(0x%016" PRIx64 "LL)", bits);
  return buf;
}

std::string literal(std::int64_t v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "static_cast<long long>(0x%016" PRIx64 "ULL)", static_cast<std::uint64_t>(v));
  return buf;
}

std::string storage(DType t) { return std::string(cuda_storage_type(t)); }

// f<k>: op k from its inputs' storage type to its output's, through its compute type C.
std::string op_function(const FusedOp& p, std::size_t k) {
  const std::string tin = storage(p.in), tout = storage(p.out);
  std::string s = "__device__ __forceinline__ " + tout + " f" + std::to_string(k) + "(";
  s += p.inputs.size() == 1 ? "const " + tin + " xin" : "const " + tin + " ain, const " + tin + " bin";
  s += ", double p0, double p1) {\n  typedef " + std::string(cuda_compute_type(p.in)) + " C;\n";
  if (p.scalar) {
    s += "  const C t = kiln::cvt<C>(xin);\n  const C s = kiln::from_scalar<C>(" + literal(p.scalar->f) + ", " +
         literal(p.scalar->i) + ");\n";
    s += p.scalar_first ? "  const C a = s, b = t;\n" : "  const C a = t, b = s;\n";
  } else if (p.inputs.size() == 1) {
    s += "  const C x = kiln::cvt<C>(xin);\n";
  } else {
    s += "  const C a = kiln::cvt<C>(ain);\n  const C b = kiln::cvt<C>(bin);\n";
  }
  ((s += "  return kiln::cvt<") += tout) += ">(";
  return (s += p.expr) += ");\n}\n";
}

// Everything fused_source depends on, as words: per op its expression's hash, its dtypes,
// params, where each input comes from and its scalar's bits; then the outside inputs' dtypes
// and the stored outputs.
rt::GeneratedKey group_key(const FusedGroup& g) {
  rt::GeneratedKey key("fused");
  key.add(g.ops.size(), g.outside.size(), g.stored.size());
  for (const FusedOp& p : g.ops) {
    // The arity in 8 bits, then each input in 28: the op making it, or 2^27 + its outside index.
    std::uint64_t wiring = p.inputs.size();
    for (std::size_t i = 0; i < p.inputs.size(); ++i) {
      const std::uint64_t from = static_cast<std::uint64_t>(p.inputs[i].index) + (p.inputs[i].from_op ? 0 : (1u << 27));
      wiring |= from << (8 + 28 * i);
    }
    key.add(rt::fnv1a64(p.expr), p.in, p.out, p.params.first, p.params.second, wiring);
    if (p.scalar) key.add(p.scalar->f, p.scalar->i, p.scalar_first ? 2 : 1);
  }
  for (DType t : g.outside) key.add(t);
  for (int k : g.stored) key.add(k);
  return key;
}

// "fused(cast,relu) bf16 f32": the ops, then the dtypes in order of appearance.
std::string label(const FusedGroup& g) {
  std::string names;
  for (const FusedOp& p : g.ops) (names += names.empty() ? "" : ",") += p.name;
  std::string text = "fused(" + names + ")";
  std::vector<DType> seen;
  for (const FusedOp& p : g.ops)
    for (DType t : {p.in, p.out})
      if (std::find(seen.begin(), seen.end(), t) == seen.end()) seen.push_back(t), (text += " ") += dtype_name(t);
  return text;
}

template <int N>
void launch_n(const rt::Function& fn, std::span<const std::int64_t> shape, std::span<const Operand> operands,
              std::vector<rt::DevicePtr>& ptrs, const rt::Stream& s) {
  std::array<const Operand*, N> ops{};
  for (int k = 0; k < N; ++k) ops[static_cast<std::size_t>(k)] = &operands[static_cast<std::size_t>(k)];
  Layout<N> L = make_layout<N>("fused", shape, ops);
  std::vector<void*> args{&L};
  for (rt::DevicePtr& p : ptrs) args.push_back(&p);
  args.push_back(nullptr);
  rt::launch_raw(fn, grid_stride_config(static_cast<std::uint64_t>(L.n), s.device()), s, args.data());
}

}  // namespace

// The kernel: each op's function called in order. Each f32 or f64 result passes through an
// add.rn of -0 (the identity): ptxas contracts a plain mul and add into an fma even across an
// empty asm barrier, but never across an explicit rounding (half results are rounded anyway).
std::string fused_source(const FusedGroup& g) {
  bool f16 = false, bf16 = false;
  for (const FusedOp& p : g.ops)
    for (DType t : {p.in, p.out}) f16 = f16 || t == DType::f16, bf16 = bf16 || t == DType::bf16;
  std::string s = rt::device_prelude(f16 && bf16 ? DTypes{DType::f16, DType::bf16}
                                     : f16       ? DTypes{DType::f16}
                                     : bf16      ? DTypes{DType::bf16}
                                                 : DTypes{DType::f32});
  s += "KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS\n";
  for (std::size_t k = 0; k < g.ops.size(); ++k) s += op_function(g.ops[k], k);
  const std::string n = std::to_string(g.operands());
  s += "extern \"C\" __global__ void __launch_bounds__(256) kiln_fused(kiln::Layout<" + n + "> L";
  for (std::size_t j = 0; j < g.outside.size(); ++j) s += ", const " + storage(g.outside[j]) + "* e" + std::to_string(j);
  for (std::size_t k = 0; k < g.stored.size(); ++k)
    s += ", " + storage(g.ops[static_cast<std::size_t>(g.stored[k])].out) + "* s" + std::to_string(k);
  s += ") {\n  kiln::wait_prior_grids();\n  const long long step = kiln::thread_count();\n";
  s += "  for (long long i = kiln::thread_index(); i < L.n; i += step) {\n";
  s += "    long long off[" + n + "];\n";
  s += "    if (L.ndim == 0) { for (int k = 0; k < " + n + "; ++k) off[k] = i; } else kiln::offsets(L, i, off);\n";
  for (std::size_t j = 0; j < g.outside.size(); ++j)
    s += "    const " + storage(g.outside[j]) + " v" + std::to_string(j) + " = e" + std::to_string(j) + "[off[" +
         std::to_string(g.stored.size() + j) + "]];\n";
  for (std::size_t k = 0; k < g.ops.size(); ++k) {
    const FusedOp& p = g.ops[k];
    std::string args;
    for (const FusedInput& in : p.inputs) ((args += in.from_op ? 't' : 'v') += std::to_string(in.index)) += ", ";
    // Appended piece by piece: "f" + std::to_string(k) trips GCC 12's -Wrestrict.
    const bool round = p.out == DType::f32 || p.out == DType::f64;
    ((((s += "    const ") += storage(p.out)) += " t") += std::to_string(k)) += " = ";
    if (round) s += p.out == DType::f64 ? "__dadd_rn(" : "__fadd_rn(";
    ((((s += "f") += std::to_string(k)) += "(") += args) += literal(p.params.first);
    (((s += ", ") += literal(p.params.second)) += ")") += round ? (p.out == DType::f64 ? ", -0.0)" : ", -0.0f)") : "";
    s += ";\n";
  }
  for (std::size_t k = 0; k < g.stored.size(); ++k)
    s += "    s" + std::to_string(k) + "[off[" + std::to_string(k) + "]] = t" + std::to_string(g.stored[k]) + ";\n";
  s += "  }\n}\n";
  return s;
}

rt::Function fused_function(const FusedGroup& g, int device) {
  const auto module = rt::generated_kernels(group_key(g), [&] {
    return rt::GeneratedModule{fused_source(g), label(g), {"kiln_fused"}};
  });
  return rt::generated_function(module, "kiln_fused", device);
}

void launch_fused(const FusedGroup& g, std::span<const std::int64_t> shape, std::span<const Operand> operands,
                  const rt::Stream& s) {
  const int nop = g.operands();
  if (nop < 1 || nop > kMaxFusedOperands || static_cast<int>(operands.size()) != nop)
    throw ValueError("[fused] a group takes 1 to " + std::to_string(kMaxFusedOperands) + " operands, got " +
                     std::to_string(nop) + " (" + std::to_string(operands.size()) + " given)");
  const rt::Function fn = fused_function(g, s.device());
  // The kernel takes the outside inputs' pointers first, then the stored outputs'.
  std::vector<rt::DevicePtr> ptrs;
  for (std::size_t j = 0; j < g.outside.size(); ++j) ptrs.push_back(operands[g.stored.size() + j].ptr);
  for (std::size_t k = 0; k < g.stored.size(); ++k) ptrs.push_back(operands[k].ptr);
  switch (nop) {
    case 1: return launch_n<1>(fn, shape, operands, ptrs, s);
    case 2: return launch_n<2>(fn, shape, operands, ptrs, s);
    case 3: return launch_n<3>(fn, shape, operands, ptrs, s);
    case 4: return launch_n<4>(fn, shape, operands, ptrs, s);
    case 5: return launch_n<5>(fn, shape, operands, ptrs, s);
    case 6: return launch_n<6>(fn, shape, operands, ptrs, s);
    case 7: return launch_n<7>(fn, shape, operands, ptrs, s);
    default: return launch_n<8>(fn, shape, operands, ptrs, s);
  }
}

}  // namespace kiln::kernels
