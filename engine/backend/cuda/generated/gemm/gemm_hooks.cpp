// The GEMM hooks' checks, digest and device source (see gemm_hooks.h).
#include "gemm_hooks.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>

namespace kiln::kernels {

namespace {

bool float_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

bool identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return false;
  return true;
}

// Names the hook functions already use, and the params' spelling.
bool reserved(const std::string& s) {
  static const std::set<std::string> names{"acc", "row", "col", "z", "a", "k", "C", "hp", "kiln"};
  return names.count(s) > 0 || (s.size() > 1 && s[0] == 'p' && std::isdigit(static_cast<unsigned char>(s[1])));
}

// An expression is spliced into a return statement: it may not end or open one.
bool plain_expression(const std::string& e) { return e.find_first_of(";{}#\"\\") == std::string::npos; }

std::string inputs_problem(const char* which, const std::vector<HookInput>& inputs, const std::vector<double>& params,
                           bool per_k) {
  for (double p : params)
    if (!std::isfinite(p)) return std::string(which) + " params must be finite";
  if (inputs.size() > kMaxHookInputs)
    return std::string(which) + " takes at most " + std::to_string(kMaxHookInputs) + " inputs";
  std::set<std::string> seen;
  for (const HookInput& in : inputs) {
    const std::string what = std::string(which) + " input '" + in.name + "'";
    if (!identifier(in.name) || reserved(in.name)) return what + ": not a free C identifier";
    if (!seen.insert(in.name).second) return what + ": named twice";
    if (!float_dtype(in.dtype)) return what + ": dtype must be f32, bf16 or f16";
    if (per_k && in.index != HookIndex::column) return what + ": a prologue's inputs hold one value per k (column)";
    if (in.index == HookIndex::element && in.ld < 1) return what + ": an element-indexed input needs its row stride";
    if (in.batch_stride < 0) return what + ": negative batch stride";
  }
  return "";
}

std::string params_text(const std::vector<double>& params) {
  std::string s;
  char buf[96];
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::snprintf(buf, sizeof buf, "  constexpr double p%zu = %.17g;\n", i, params[i]);
    s += buf;
  }
  return s;
}

// `name`'s value for index expression `at` (the batch stride added per problem).
std::string loads_text(const std::vector<HookInput>& inputs, const char* slots, const char* at_row,
                       const char* at_col) {
  std::string s;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const HookInput& in = inputs[i];
    const std::string at = in.index == HookIndex::row    ? at_row
                           : in.index == HookIndex::column ? at_col
                                                           : "row * " + std::to_string(in.ld) + "LL + " + at_col;
    s += "  const float " + in.name + " = hook_load<" + std::string(cuda_storage_type(in.dtype)) + ">(hp." + slots + "[" +
         std::to_string(i) + "], z * " + std::to_string(in.batch_stride) + "LL + " + at + ");\n";
  }
  return s;
}

void add_inputs(std::string& s, const std::vector<HookInput>& inputs) {
  for (const HookInput& in : inputs)
    s += in.name + "," + std::string(dtype_name(in.dtype)) + "," + std::to_string(static_cast<int>(in.index)) + "," +
         std::to_string(in.ld) + "," + std::to_string(in.batch_stride) + ";";
}

void add_params(std::string& s, const std::vector<double>& params) {
  char buf[32];
  for (double p : params) {
    std::snprintf(buf, sizeof buf, "%a,", p);
    s += buf;
  }
}

// Every field, in order: two descriptions are the same kernel exactly when these agree.
std::string canonical(const GemmHooks& h) {
  std::string s;
  if (h.epilogue) {
    const GemmEpilogueHook& e = *h.epilogue;
    s += "E{" + e.expr + "}";
    add_inputs(s, e.inputs);
    add_params(s, e.params);
    s += std::string(e.out ? dtype_name(*e.out) : std::string_view("-")) + (e.accumulate ? "+" : "=") +
         std::to_string(static_cast<int>(e.stats));
  }
  if (h.prologue) {
    s += "P{" + h.prologue->expr + "}";
    add_inputs(s, h.prologue->inputs);
    add_params(s, h.prologue->params);
  }
  return s;
}

}  // namespace

void GemmHooks::add_to(rt::GeneratedKey& key) const {
  key.add(empty() ? std::uint64_t{0} : rt::fnv1a64(canonical(*this)));
}

std::string GemmHooks::text() const {
  if (empty()) return "";
  char buf[40];
  std::snprintf(buf, sizeof buf, " hooks:%016llx", static_cast<unsigned long long>(rt::fnv1a64(canonical(*this))));
  return buf;
}

bool row_statistics_alone(const GemmHooks& h) {
  if (h.prologue || !h.epilogue) return false;
  const GemmEpilogueHook& e = *h.epilogue;
  return e.stats == HookStats::rows && e.expr.empty() && e.inputs.empty() && e.params.empty() && !e.accumulate &&
         !e.out;
}

std::string hook_problem(const GemmHooks& h) {
  if (h.epilogue) {
    const GemmEpilogueHook& e = *h.epilogue;
    if (!plain_expression(e.expr)) return "epilogue expression '" + e.expr + "' is not a plain expression";
    if (auto p = inputs_problem("epilogue", e.inputs, e.params, false); !p.empty()) return p;
    if (e.out && !float_dtype(*e.out)) return "epilogue output dtype must be f32, bf16 or f16";
    if (e.accumulate && e.stats != HookStats::none) return "epilogue cannot accumulate and take statistics at once";
  }
  if (h.prologue) {
    const GemmPrologueHook& p = *h.prologue;
    if (p.expr.empty() || !plain_expression(p.expr)) return "prologue expression '" + p.expr + "' is not a plain expression";
    if (auto q = inputs_problem("prologue", p.inputs, p.params, true); !q.empty()) return q;
  }
  return "";
}

HookSource hook_source(const GemmHooks& h) {
  HookSource s;
  const GemmEpilogueHook* e = h.epilogue ? &*h.epilogue : nullptr;
  const GemmPrologueHook* p = h.prologue ? &*h.prologue : nullptr;
  s.constants = std::string("constexpr bool kPrologue = ") + (p ? "true" : "false") +
                ", kAccumulate = " + (e && e->accumulate ? "true" : "false") + ";\nconstexpr int kStats = " +
                std::to_string(e ? static_cast<int>(e->stats) : 0) + ";  // 0 none, 1 rows, 2 columns";
  s.functions = "__device__ __forceinline__ float epilogue(float acc, long long row, long long col, long long z, "
                "const HookPointers& hp) {\n";
  if (e && !e->expr.empty())
    s.functions += "  using C = float;\n" + params_text(e->params) + loads_text(e->inputs, "epi", "row", "col") +
                   "  return static_cast<float>(" + e->expr + ");\n}\n";
  else
    s.functions += "  return acc;\n}\n";
  s.functions += "__device__ __forceinline__ float prologue(float a, long long k, long long z, const HookPointers& hp) {\n";
  if (p)
    s.functions += "  using C = float;\n" + params_text(p->params) + loads_text(p->inputs, "pro", "k", "k") +
                   "  return static_cast<float>(" + p->expr + ");\n}";
  else
    s.functions += "  return a;\n}";
  return s;
}

}  // namespace kiln::kernels
