// bench_gemm: the tile-engine issue's GEMM figures on cuda:0. Each row is one product kiln runs
// in training (the forward, input-gradient and weight-gradient products of every linear layer of
// the MNIST mlp at batch 128 and 1024 and of the wide MLP, 784-4096-4096-10, at batch 1024), or
// a square product (4096^3, 8192^3), timed through kiln's public ops beside cuBLASLt's best
// algorithm for the same product and epilogue (every algorithm its heuristic offers, timed).
// tools/bench/bench_gemm_torch.py times the same rows in PyTorch and prints the ratios.
//   fwd    linear(x, w, b): y (batch, out), the bias added in the product's epilogue
//   dgrad  matmul(gp, w): dx (batch, in)
//   wgrad  linear_grads(gp, x): dW (out, in) and db (out), db in the product's epilogue
//   square matmul(a, b), n x n x n
// Precisions: f32 (exact), tf32 (set_allow_tf32), bf16. A row's time is the median
// microseconds per call over --reps event-timed batches of --calls calls: kiln's eager calls
// (each op dispatched from the host), and the same calls captured once by kiln::compile and
// replayed as one CUDA graph per batch (graph_us, what a compiled training step pays; the
// ratios use it). Prints a table, then one JSON line, also written to --json FILE. Exits 77
// without a GPU.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/quick_tier.h"
#include "lt_best.h"

using namespace kiln;

namespace {

struct Precision {
  const char* name;
  DType dtype;
  bool tf32;
  bench::LtPrecision lt;
};
const Precision kPrecisions[] = {{"f32", DType::f32, false, bench::LtPrecision::f32},
                                 {"tf32", DType::f32, true, bench::LtPrecision::tf32},
                                 {"bf16", DType::bf16, false, bench::LtPrecision::bf16}};

// One product: its op on (batch, in) -> (batch, out) layers, or a square one (batch = in = out).
struct Product {
  std::string model;  // "mlp", "mlp4096", "square"
  std::int64_t batch, in, out;
  std::string op;     // "fwd", "dgrad", "wgrad", "square"
  // The product's sizes as bench_gemm_torch.py matches them: "batch,in,out".
  std::string spec() const { return std::to_string(batch) + "," + std::to_string(in) + "," + std::to_string(out); }
  double flop() const { return 2.0 * batch * in * out; }
};

std::vector<Product> training_products() {
  struct Net {
    const char* name;
    std::vector<std::int64_t> widths, batches;
  };
  const Net nets[] = {{"mlp", {784, 512, 512, 10}, {128, 1024}}, {"mlp4096", {784, 4096, 4096, 10}, {1024}}};
  std::vector<Product> out;
  for (const Net& n : nets)
    for (std::int64_t b : n.batches)
      for (std::size_t l = 0; l + 1 < n.widths.size(); ++l)
        for (const char* op : {"fwd", "dgrad", "wgrad"}) out.push_back({n.name, b, n.widths[l], n.widths[l + 1], op});
  return out;
}

struct Settings {
  int reps = 20, calls = 10, warmup = 2, algos = 256;
  bool training = true, square = true;
};

struct Row {
  Product p;
  std::string precision;
  double kiln_us = -1, graph_us = -1, lt_us = -1;
  int lt_algos = 0;
  std::string note{};
};

const rt::Stream& stream() { return rt::default_stream(0); }

// The product's operands and kiln call, and cuBLASLt's view of the same (column-major: see the
// layouts in engine/ops/linear.cpp).
struct Setup {
  Tensor a, b, bias, d, dbias;
  std::function<void()> kiln;
  bench::LtProduct lt;
};

Setup setup(const Product& p, DType t) {
  const TensorOptions o{.dtype = t, .device = Device::cuda(0)};
  Setup s;
  const std::int64_t B = p.batch, I = p.in, O = p.out;
  auto ptr = [](const Tensor& x) { return x.data_ptr(); };
  if (p.op == "fwd") {  // y^T (O x B) = W^T' (O x I) @ x^T (I x B)
    s.a = randn({B, I}, o), s.b = randn({O, I}, o), s.bias = randn({O}, o), s.d = empty({B, O}, o);
    s.kiln = [x = s.a, w = s.b, bias = s.bias] { (void)linear(x, w, bias); };
    s.lt = {O, B, I, true, false, I, I, O, bench::LtEpilogue::bias, ptr(s.b), ptr(s.a), ptr(s.d), ptr(s.bias)};
  } else if (p.op == "dgrad") {  // dx^T (I x B) = W^T (I x O) @ gp^T (O x B)
    s.a = randn({B, O}, o), s.b = randn({O, I}, o), s.d = empty({B, I}, o);
    s.kiln = [a = s.a, b = s.b] { (void)matmul(a, b); };
    s.lt = {I, B, O, false, false, I, O, I, bench::LtEpilogue::none, ptr(s.b), ptr(s.a), ptr(s.d), nullptr};
  } else if (p.op == "wgrad") {  // dW^T (I x O) = x^T (I x B) @ gp (B x O), db = sums of gp over B
    s.a = randn({B, O}, o), s.b = randn({B, I}, o), s.d = empty({O, I}, o), s.dbias = empty({O}, o);
    s.kiln = [gp = s.a, x = s.b] { (void)linear_grads(gp, x); };
    s.lt = {I, O, B, false, true, I, O, I, bench::LtEpilogue::bgrad_b, ptr(s.b), ptr(s.a), ptr(s.d), ptr(s.dbias)};
  } else {  // C^T = B^T @ A^T
    s.a = randn({B, I}, o), s.b = randn({I, O}, o), s.d = empty({B, O}, o);
    s.kiln = [a = s.a, b = s.b] { (void)matmul(a, b); };
    s.lt = {O, B, I, false, false, O, I, O, bench::LtEpilogue::none, ptr(s.b), ptr(s.a), ptr(s.d), nullptr};
  }
  return s;
}

std::string cell(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return v < 0 ? std::string("n/a") : std::string(buf);
}

Row measure(const Product& p, const Precision& prec, const Settings& set) {
  Row r{p, prec.name};
  try {
    set_allow_tf32(prec.tf32);
    const Setup s = setup(p, prec.dtype);
    r.kiln_us = bench::median_event_ms(stream(), [&] {
      for (int i = 0; i < set.calls; ++i) s.kiln();
    }, set.reps, set.warmup) * 1e3 / set.calls;
    CompiledFunction graph = compile([&](const std::vector<Tensor>&) {
      for (int i = 0; i < set.calls; ++i) s.kiln();
      return std::vector<Tensor>{};
    }, {.device = Device::cuda(0)});
    r.graph_us = bench::median_event_ms(stream(), [&] { (void)graph({}); }, set.reps, set.warmup) * 1e3 / set.calls;
    const bench::LtBest best = bench::lt_best(s.lt, prec.lt, stream(), set.algos, set.reps, set.calls);
    r.lt_us = best.us, r.lt_algos = best.algos, r.note = best.error;
  } catch (const std::exception& e) {
    r.note = e.what();
  }
  const double ratio = r.graph_us > 0 && r.lt_us > 0 ? r.lt_us / r.graph_us : -1;
  std::printf("%-8s %-16s %-6s %-5s %10s %10s %10s %5d %8s %9s  %s\n", p.model.c_str(), p.spec().c_str(),
              p.op.c_str(), prec.name, cell(r.kiln_us).c_str(), cell(r.graph_us).c_str(), cell(r.lt_us).c_str(),
              r.lt_algos, cell(ratio).c_str(), cell(r.graph_us > 0 ? p.flop() / (r.graph_us * 1e-6) / 1e12 : -1).c_str(),
              r.note.c_str());
  std::fflush(stdout);
  return r;
}

nlohmann::json to_json(const std::vector<Row>& rows, const std::string& device, const Settings& set) {
  auto num = [](double v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json j{{"bench", "kiln_gemm"}, {"device", device}, {"reps", set.reps}, {"calls", set.calls}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["rows"].push_back({{"model", r.p.model}, {"spec", r.p.spec()}, {"op", r.p.op}, {"precision", r.precision},
                         {"flop", r.p.flop()}, {"kiln_us", num(r.kiln_us)}, {"graph_us", num(r.graph_us)},
                         {"lt_best_us", num(r.lt_us)},
                         {"lt_algos", r.lt_algos}, {"note", r.note}});
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::rt::set_quick_tier(false);  // steady-state kernels are timed, never a first use's quick builds
  CLI::App app{"bench_gemm: kiln's linear-layer and square products beside cuBLASLt's best algorithm, on cuda:0"};
  std::vector<std::string> precision_args;
  std::string json_path, rows_arg = "all";
  Settings set;
  app.add_option("--rows", rows_arg, "training, square or all")->check(CLI::IsMember({"training", "square", "all"}));
  app.add_option("--precision", precision_args, "f32, tf32 or bf16 (repeatable; default: all three)")
      ->check(CLI::IsMember({"f32", "tf32", "bf16"}));
  app.add_option("--reps", set.reps, "Event-timed batches per row; the median is reported")->check(CLI::Range(1, 100000));
  app.add_option("--calls", set.calls, "Calls per timed batch")->check(CLI::Range(1, 100000));
  app.add_option("--algos", set.algos, "Most cuBLASLt algorithms asked of its heuristic")->check(CLI::Range(1, 100000));
  app.add_option("--json", json_path, "Also write the JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  std::vector<Precision> precisions;
  for (const Precision& p : kPrecisions)
    if (precision_args.empty() || std::find(precision_args.begin(), precision_args.end(), p.name) != precision_args.end())
      precisions.push_back(p);
  std::string why;
  if (!rt::gpu_available(&why)) {
    std::printf("bench_gemm: no GPU, nothing to measure (%s)\n", why.c_str());
    return 77;
  }
  std::ofstream json_out;
  if (!json_path.empty()) {
    json_out.open(json_path);  // opened before measuring, so a bad path fails at once
    if (!json_out) {
      std::fprintf(stderr, "[bench_gemm] cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  const bool tf32_was = allow_tf32();
  try {
    const rt::DeviceInfo& info = rt::device_info(0);
    std::printf("bench_gemm on %s (sm_%d): median of %d batches of %d calls; cuBLASLt: the best of up to %d algorithms\n",
                info.name.c_str(), info.arch(), set.reps, set.calls, set.algos);
    std::printf("%-8s %-16s %-6s %-5s %10s %10s %10s %5s %8s %9s  %s\n", "model", "batch,in,out", "op", "prec",
                "kiln_us", "graph_us", "lt_best_us", "algos", "lt/graph", "TFLOP/s", "note");
    std::vector<Product> products;
    if (rows_arg != "square") products = training_products();
    if (rows_arg != "training")
      for (std::int64_t n : {4096, 8192}) products.push_back({"square", n, n, n, "square"});
    std::vector<Row> rows;
    for (const Product& p : products)
      for (const Precision& prec : precisions)
        if (p.model != "square" || prec.dtype != DType::f32 || prec.tf32) rows.push_back(measure(p, prec, set));
    set_allow_tf32(tf32_was);
    const std::string line = to_json(rows, info.name, set).dump();
    std::printf("%s\n", line.c_str());
    if (json_out.is_open()) json_out << line << "\n" << std::flush;
  } catch (const std::exception& e) {
    set_allow_tf32(tf32_was);
    std::fprintf(stderr, "[bench_gemm] %s\n", e.what());
    return 1;
  }
  return 0;
}
