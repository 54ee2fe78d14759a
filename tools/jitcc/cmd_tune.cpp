// jitcc tune: measures, ahead of time, the choices kiln makes by measurement (KILN_TUNE): each
// convolution's kernel and tiles for its three passes, and for a linear layer's forward and
// backward products the cuBLASLt algorithms and the generated GEMM's tiles (sm_90), on random
// inputs of the given sizes on GPU 0. The choices land in the cache as entries of kind "tune",
// where later processes find them.
#include <cstdio>
#include <memory>
#include <sstream>

#include "cli.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/tuning.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

struct TuneArgs {
  std::vector<std::string> convs, linears;
  std::string precisions = "default";
};

// "8,1,28,28" -> {8, 1, 28, 28}; UsageError naming the option unless there are `count` positive
// integers (the last `zeros_ok` may be 0).
std::vector<std::int64_t> parse_spec(const std::string& text, std::size_t count, std::size_t zeros_ok,
                                     const std::string& option, const std::string& form) {
  std::vector<std::int64_t> v;
  std::stringstream in(text);
  for (std::string field; std::getline(in, field, ',');) {
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != field.size()) throw UsageError(option + " '" + text + "': '" + field + "' is not an integer");
    v.push_back(x);
  }
  if (v.size() != count) throw UsageError(option + " '" + text + "' needs " + form);
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] < (i + zeros_ok >= count ? 0 : 1))
      throw UsageError(option + " '" + text + "': sizes must be positive" + (zeros_ok ? ", padding >= 0" : ""));
  return v;
}

// Sets the library's TF32 switches for a precision; the dtype its tensors use.
kiln::DType apply(const std::string& precision) {
  kiln::set_allow_conv_tf32(precision != "f32");
  kiln::set_allow_tf32(precision == "tf32");
  return precision == "bf16" ? kiln::DType::bf16 : kiln::DType::f32;
}

int run_tune(const TuneArgs& a, const Common& common) {
  apply_cache_dir(common);
  const std::vector<std::string> precisions = split_list(a.precisions);
  for (const std::string& p : precisions)
    if (p != "default" && p != "f32" && p != "tf32" && p != "bf16")
      throw UsageError("--precision: '" + p + "' is not one of default, f32, tf32, bf16");
  std::vector<std::vector<std::int64_t>> convs, linears;
  for (const std::string& c : a.convs) {
    convs.push_back(parse_spec(c, 8, 1, "--conv", "8 values N,C,H,W,O,K,stride,pad"));
    const auto& v = convs.back();
    if (v[5] > v[2] + 2 * v[7] || v[5] > v[3] + 2 * v[7])
      throw UsageError("--conv '" + c + "': the kernel is larger than the padded input");
  }
  for (const std::string& l : a.linears) linears.push_back(parse_spec(l, 3, 0, "--linear", "3 values BATCH,IN,OUT"));
  if (convs.empty() && linears.empty()) throw UsageError("tune needs at least one --conv or --linear");
  std::string why;
  if (!rt::gpu_available(&why)) throw std::runtime_error("tune measures on a GPU, and none is usable: " + why);

  auto stored = [] {
    std::size_t n = 0;
    for (const rt::EntryInfo& e : rt::DiskCache::global().list()) n += e.ok && e.key.kind == rt::kTuneKind;
    return n;
  };
  const std::size_t before = stored();
  rt::set_tune_mode(rt::TuneMode::on);
  const kiln::Device gpu = kiln::Device::cuda(0);
  kiln::Generator gen(1);
  for (const std::string& p : precisions) {
    const kiln::DType t = apply(p);
    for (const auto& v : convs) {
      const kiln::Conv2dOptions o{.stride = {v[6]}, .padding = {v[7]}};
      const kiln::Tensor x = kiln::randn({v[0], v[1], v[2], v[3]}, {.device = gpu}, &gen).to(t);
      const kiln::Tensor w = kiln::randn({v[4], v[1], v[5], v[5]}, {.device = gpu}, &gen).to(t);
      const kiln::Tensor y = kiln::conv2d(x, w, {}, o);
      (void)kiln::conv2d_grad_input(y, w, x.shape(), o);
      (void)kiln::conv2d_grad_weight(x, y, w.shape(), o);
    }
    for (const auto& v : linears) {
      kiln::Tensor x = kiln::randn({v[0], v[1]}, {.device = gpu}, &gen).to(t);
      kiln::Tensor w = kiln::randn({v[2], v[1]}, {.device = gpu}, &gen).to(t);
      kiln::Tensor b = kiln::randn({v[2]}, {.device = gpu}, &gen).to(t);
      for (kiln::Tensor* leaf : {&x, &w, &b}) leaf->requires_grad_();
      kiln::sum(kiln::linear(x, w, b, kiln::Activation::relu)).backward();
    }
  }
  rt::default_stream(0).synchronize();
  const std::size_t after = stored();
  char text[256];
  std::snprintf(text, sizeof text, "%zu convs and %zu linears tuned in %zu precisions: %zu new choices, %zu in the cache\n",
                convs.size(), linears.size(), precisions.size(), after - before, after);
  emit(common,
       Json{{"convs", convs.size()}, {"linears", linears.size()}, {"precisions", precisions}, {"new_choices", after - before},
            {"choices", after}, {"cache", cache_dir(common).string()}},
       text);
  return 0;
}

}  // namespace

void add_tune(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand(
      "tune", "Measure kiln's choices by measurement ahead of time, on GPU 0: the kernel and tiles of each --conv's "
              "three passes, and the cuBLASLt algorithms and generated GEMM tiles of each --linear's products, kept "
              "in the cache");
  auto args = std::make_shared<TuneArgs>();
  TuneArgs& a = *args;
  sub->add_option("--conv", a.convs, "N,C,H,W,O,K,stride,pad: a conv2d with a KxK kernel (repeatable)");
  sub->add_option("--linear", a.linears, "BATCH,IN,OUT: a linear layer with bias and ReLU (repeatable)");
  sub->add_option("--precision", a.precisions,
                  "comma-separated: default (TF32 convs, f32 matmuls), f32 (exact), tf32, bf16")
      ->capture_default_str();
  add_common_options(*sub, ctx.common);
  sub->callback([&ctx, args] { ctx.run = [&ctx, args] { return run_tune(*args, ctx.common); }; });
}

}  // namespace jitcc
