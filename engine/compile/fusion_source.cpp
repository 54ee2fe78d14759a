// The source and key of a fused group: each op's device expression (its OpDef's) as a
// function of its own dtypes, called in order. The group's values keep their dtypes, so the
// fused kernel rounds where the single ops round and gives the same bits.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "fusion_group.h"
#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"

namespace kiln::compile_detail {

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

std::pair<char, int> source_of(const std::vector<Pending>& ops, const std::vector<Tensor>& ext, const Tensor& in) {
  const int k = producer(ops, in);
  if (k >= 0) return {'t', k};
  const auto it = std::find_if(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); });
  return {'v', static_cast<int>(it - ext.begin())};
}

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
std::string op_function(const Pending& p, std::size_t k) {
  const std::string tin = storage(p.inputs[0].dtype()), tout = storage(p.output.dtype());
  std::string s = "__device__ __forceinline__ " + tout + " f" + std::to_string(k) + "(";
  s += p.inputs.size() == 1 ? "const " + tin + " xin" : "const " + tin + " ain, const " + tin + " bin";
  s += ", double p0, double p1) {\n  typedef " + std::string(cuda_compute_type(p.inputs[0].dtype())) + " C;\n";
  if (p.scalar) {
    s += "  const C t = kiln::cvt<C>(xin);\n  const C s = kiln::from_scalar<C>(" + literal(p.scalar->f) + ", " +
         literal(p.scalar->i) + ");\n";
    s += p.scalar_first ? "  const C a = s, b = t;\n" : "  const C a = t, b = s;\n";
  } else if (p.inputs.size() == 1) {
    s += "  const C x = kiln::cvt<C>(xin);\n";
  } else {
    s += "  const C a = kiln::cvt<C>(ain);\n  const C b = kiln::cvt<C>(bin);\n";
  }
  return s + "  return kiln::cvt<" + tout + ">(" + p.expr->expr + ");\n}\n";
}

// The kernel: each op's function called in order. Each f32 or f64 result passes through an
// add.rn of -0 (the identity): ptxas contracts a plain mul and add into an fma even across an
// empty asm barrier, but never across an explicit rounding (half results are rounded anyway).
std::string source(const std::vector<Pending>& ops, const std::vector<Tensor>& ext, const std::vector<int>& stored,
                   int nop) {
  bool f16 = false, bf16 = false;
  for (const Pending& p : ops)
    for (DType t : {p.inputs[0].dtype(), p.output.dtype()}) f16 = f16 || t == DType::f16, bf16 = bf16 || t == DType::bf16;
  std::string s = rt::device_prelude(f16 && bf16 ? DTypes{DType::f16, DType::bf16}
                                     : f16       ? DTypes{DType::f16}
                                     : bf16      ? DTypes{DType::bf16}
                                                 : DTypes{DType::f32});
  for (std::size_t k = 0; k < ops.size(); ++k) s += op_function(ops[k], k);
  const std::string n = std::to_string(nop);
  s += "extern \"C\" __global__ void __launch_bounds__(256) kiln_fused(kiln::Layout<" + n + "> L";
  for (std::size_t j = 0; j < ext.size(); ++j) s += ", const " + storage(ext[j].dtype()) + "* e" + std::to_string(j);
  for (std::size_t k = 0; k < stored.size(); ++k)
    s += ", " + storage(ops[static_cast<std::size_t>(stored[k])].output.dtype()) + "* s" + std::to_string(k);
  s += ") {\n  const long long step = kiln::thread_count();\n";
  s += "  for (long long i = kiln::thread_index(); i < L.n; i += step) {\n";
  s += "    long long off[" + n + "];\n";
  s += "    if (L.ndim == 0) { for (int k = 0; k < " + n + "; ++k) off[k] = i; } else kiln::offsets(L, i, off);\n";
  for (std::size_t j = 0; j < ext.size(); ++j)
    s += "    const " + storage(ext[j].dtype()) + " v" + std::to_string(j) + " = e" + std::to_string(j) + "[off[" +
         std::to_string(stored.size() + j) + "]];\n";
  for (std::size_t k = 0; k < ops.size(); ++k) {
    std::string args;
    for (const Tensor& in : ops[k].inputs) {
      const auto [kind, index] = source_of(ops, ext, in);
      ((args += kind) += std::to_string(index)) += ", ";  // appends: "t" + string&& trips GCC 12's -Wrestrict
    }
    const std::string t = std::string("t") += std::to_string(k);
    const DType out = ops[k].output.dtype();
    // Appended piece by piece: "f" + std::to_string(k) trips GCC 12's -Wrestrict here too.
    const bool round = out == DType::f32 || out == DType::f64;
    ((((s += "    const ") += storage(out)) += " ") += t) += " = ";
    if (round) s += out == DType::f64 ? "__dadd_rn(" : "__fadd_rn(";
    ((((s += "f") += std::to_string(k)) += "(") += args) += literal(ops[k].params.first);
    (((s += ", ") += literal(ops[k].params.second)) += ")") += round ? (out == DType::f64 ? ", -0.0)" : ", -0.0f)") : "";
    s += ";\n";
  }
  for (std::size_t k = 0; k < stored.size(); ++k)
    s += "    s" + std::to_string(k) + "[off[" + std::to_string(k) + "]] = t" + std::to_string(stored[k]) + ";\n";
  s += "  }\n}\n";
  return s;
}

// Everything source() depends on, as words: per op its (expression's) name hash, its dtypes,
// params and scalar bits, and where each input comes from (an earlier op, or an outside input
// by first use); then the outside inputs' dtypes and the stored outputs. A repeated group finds
// its kernel without building source.
rt::GeneratedKey group_key(const std::vector<Pending>& ops, const std::vector<Tensor>& ext,
                           const std::vector<int>& stored) {
  rt::GeneratedKey key("fused");
  key.add(ops.size(), ext.size(), stored.size());
  for (const Pending& p : ops) {
    // The arity in 8 bits, then each input in 28: the op making it, or 2^27 + its outside index.
    std::uint64_t wiring = p.inputs.size();
    for (std::size_t i = 0; i < p.inputs.size(); ++i) {
      const auto [kind, index] = source_of(ops, ext, p.inputs[i]);
      const std::uint64_t from = static_cast<std::uint64_t>(index) + (kind == 't' ? 0 : (1u << 27));
      wiring |= from << (8 + 28 * i);
    }
    key.add(rt::fnv1a64(p.expr->expr), p.inputs[0].dtype(), p.output.dtype(), p.params.first, p.params.second, wiring);
    if (p.scalar) key.add(p.scalar->f, p.scalar->i, p.scalar_first ? 2 : 1);
  }
  for (const Tensor& e : ext) key.add(e.dtype());
  for (int k : stored) key.add(k);
  return key;
}

}  // namespace

rt::Function fused_function(const std::vector<Pending>& ops, const std::vector<Tensor>& ext,
                            const std::vector<int>& stored, int nop, int device) {
  // The name follows from the key alone, so another process finds the module in the disk cache.
  const auto module = rt::generated_kernels(group_key(ops, ext, stored), [&] {
    std::string names;
    for (const Pending& p : ops) (names += names.empty() ? "" : ",") += p.op->name;
    // The dtypes in order of appearance: "fused(cast,relu) bf16 f32".
    std::string label = "fused(" + names + ")";
    std::vector<DType> seen;
    for (const Pending& p : ops)
      for (DType t : {p.inputs[0].dtype(), p.output.dtype()})
        if (std::find(seen.begin(), seen.end(), t) == seen.end()) seen.push_back(t), (label += " ") += dtype_name(t);
    return rt::GeneratedModule{source(ops, ext, stored, nop), std::move(label), {"kiln_fused"}};
  });
  return rt::generated_function(module, "kiln_fused", device);
}

}  // namespace kiln::compile_detail
