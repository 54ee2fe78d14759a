// bench_conv: issue 11's convolution figures on cuda:0 (the MNIST cnn's and the speedrun's
// convolutions set against cuDNN); tools/bench/bench_conv_torch.py times the same rows in
// PyTorch and prints kiln/cuDNN ratios, so both run in one GPU session:
//   ops        conv2d (no bias), conv2d_grad_input, conv2d_grad_weight (kiln/conv.h); the
//              first convs' (conv1, sr1) grad_input is not needed by training but is measured too
//   precisions bf16 (bf16 tensors), tf32 (f32 with set_allow_conv_tf32(true)), f32 (TF32 off)
//   shapes     the cnn's conv1 x(128,1,28,28) w(32,1,5,5) pad 2 and conv2 x(128,32,14,14)
//              w(64,32,5,5) pad 2; the speedrun's (batch 256, no padding) sr1 x(256,1,28,28)
//              w(24,1,5,5) and sr2 x(256,24,12,12) w(32,24,3,3); conv2_b1024, conv2 at batch
//              1024; three shapes no MNIST model has, all at batch 64: res64 3x3 64->64 at 56x56,
//              res128 3x3 128->128 at 28x28, proj256 1x1 256->64 at 56x56 (pad 1, 1, 0); or
//              instead each --shape N,C,H,W,O,kh,kw,stride,pad
// A row's time is the median microseconds per call over --reps event-timed batches of --calls
// calls back to back, after --warmup untimed batches (NVRTC compiles, cuBLAS heuristics and
// pool growth fall there): launched one by one (us), and captured once and replayed as a CUDA
// graph per batch (graph_us, what a compiled training step pays: no host work between the
// kernels, which decides the small rows eagerly). first_ms is the host time of the very first
// call, compiles included, shown apart. TFLOP/s counts 2*N*O*OH*OW*C*kh*kw for each of the
// three ops, at the eager time.
// Prints a table, then one JSON line, also written to --json FILE. Exits 77 without a GPU.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_timing.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/quick_tier.h"

using namespace kiln;

namespace {

struct ConvShape {
  std::string name;
  std::int64_t n, c, h, w, o, kh, kw, stride, pad;
  std::int64_t oh() const { return (h + 2 * pad - kh) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * pad - kw) / stride + 1; }
  double flop() const { return 2.0 * n * o * oh() * ow() * c * kh * kw; }
  // The --shape spelling; bench_conv_torch.py matches rows on it.
  std::string spec() const {
    std::string s;
    for (std::int64_t v : {n, c, h, w, o, kh, kw, stride, pad}) s += (s.empty() ? "" : ",") + std::to_string(v);
    return s;
  }
};

// bench_conv_torch.py's CNN_SHAPES holds the same names and specs (it matches rows by spec).
const std::vector<ConvShape> kCnnShapes = {{"conv1", 128, 1, 28, 28, 32, 5, 5, 1, 2},
                                           {"conv2", 128, 32, 14, 14, 64, 5, 5, 1, 2},
                                           {"sr1", 256, 1, 28, 28, 24, 5, 5, 1, 0},
                                           {"sr2", 256, 24, 12, 12, 32, 3, 3, 1, 0},
                                           {"conv2_b1024", 1024, 32, 14, 14, 64, 5, 5, 1, 2},
                                           {"res64", 64, 64, 56, 56, 64, 3, 3, 1, 1},
                                           {"res128", 64, 128, 28, 28, 128, 3, 3, 1, 1},
                                           {"proj256", 64, 256, 56, 56, 64, 1, 1, 1, 0}};

// "N,C,H,W,O,kh,kw,stride,pad" -> a shape named "shape<index>".
ConvShape parse_shape(const std::string& text, std::size_t index) {
  std::vector<std::int64_t> v;
  std::stringstream in(text);
  for (std::string field; std::getline(in, field, ',');) {
    std::size_t used = 0;
    try {
      v.push_back(std::stoll(field, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != field.size())
      throw ValueError("[bench_conv] --shape \"" + text + "\": \"" + field + "\" is not an integer");
  }
  if (v.size() != 9)
    throw ValueError("[bench_conv] --shape \"" + text + "\" needs 9 values N,C,H,W,O,kh,kw,stride,pad");
  ConvShape s{"shape" + std::to_string(index), v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
  if (s.n < 1 || s.c < 1 || s.h < 1 || s.w < 1 || s.o < 1 || s.kh < 1 || s.kw < 1 || s.stride < 1 || s.pad < 0)
    throw ValueError("[bench_conv] --shape \"" + text + "\": sizes and stride must be >= 1, pad >= 0");
  if (s.kh > s.h + 2 * s.pad || s.kw > s.w + 2 * s.pad)
    throw ValueError("[bench_conv] --shape \"" + text + "\": the kernel is larger than the padded input");
  return s;
}

struct Precision {
  const char* name;
  DType dtype;
  bool tf32;
};
const Precision kPrecisions[] = {{"bf16", DType::bf16, false}, {"tf32", DType::f32, true}, {"f32", DType::f32, false}};

struct Settings {
  int reps = 50, calls = 10, warmup = 3;
};

struct Row {
  std::string name, shape, precision, op;
  double us = -1, graph_us = -1, tflops = -1, first_ms = -1;  // -1: not measured (the note says why)
  std::string note{};
};

const rt::Stream& stream() { return rt::default_stream(0); }

Row measure(const ConvShape& s, const Precision& p, const char* op, const std::function<Tensor()>& call,
            const Settings& set) {
  Row r{s.name, s.spec(), p.name, op};
  try {
    stream().synchronize();  // the inputs' randn out of first_ms
    const auto t0 = std::chrono::steady_clock::now();
    (void)call();
    stream().synchronize();
    r.first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto batch = [&] {
      for (int i = 0; i < set.calls; ++i) (void)call();
    };
    r.us = bench::median_event_ms(stream(), batch, set.reps, set.warmup) * 1e3 / set.calls;
    r.tflops = s.flop() / (r.us * 1e-6) / 1e12;
    CompiledFunction graph = compile(
        [&](const std::vector<Tensor>&) {
          batch();
          return std::vector<Tensor>{};
        },
        {.device = Device::cuda(0)});
    r.graph_us = bench::median_event_ms(stream(), [&] { (void)graph({}); }, set.reps, set.warmup) * 1e3 / set.calls;
  } catch (const std::exception& e) {
    r.note = e.what();
  }
  const auto cell = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return v < 0 ? std::string("n/a") : std::string(buf);
  };
  std::printf("%-11s %-24s %-5s %-19s %10s %10s %9s %10s  %s\n", r.name.c_str(), r.shape.c_str(),
              r.precision.c_str(), r.op.c_str(), cell(r.us).c_str(), cell(r.graph_us).c_str(), cell(r.tflops).c_str(),
              cell(r.first_ms).c_str(), r.note.c_str());
  std::fflush(stdout);
  return r;
}

std::vector<Row> bench_shape(const ConvShape& s, const Precision& p, const Settings& set) {
  const TensorOptions opts{.dtype = p.dtype, .device = Device::cuda(0)};
  const Tensor x = randn({s.n, s.c, s.h, s.w}, opts), w = randn({s.o, s.c, s.kh, s.kw}, opts);
  const Tensor gy = randn({s.n, s.o, s.oh(), s.ow()}, opts);
  const Conv2dOptions co{.stride = {s.stride}, .padding = {s.pad}};
  set_allow_conv_tf32(p.tf32);
  const std::pair<const char*, std::function<Tensor()>> ops[] = {
      {"conv2d", [&] { return conv2d(x, w, Tensor(), co); }},
      {"conv2d_grad_input", [&] { return conv2d_grad_input(gy, w, x.shape(), co); }},
      {"conv2d_grad_weight", [&] { return conv2d_grad_weight(x, gy, w.shape(), co); }}};
  std::vector<Row> rows;
  for (const auto& [op, call] : ops) rows.push_back(measure(s, p, op, call, set));
  return rows;
}

nlohmann::json to_json(const std::vector<Row>& rows, const std::string& device, const Settings& set) {
  auto num = [](double v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json j{{"bench", "kiln_conv"}, {"device", device}, {"reps", set.reps}, {"calls", set.calls}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["rows"].push_back({{"name", r.name},
                         {"shape", r.shape},
                         {"precision", r.precision},
                         {"op", r.op},
                         {"us", num(r.us)},
                         {"graph_us", num(r.graph_us)},
                         {"tflops", num(r.tflops)},
                         {"first_ms", num(r.first_ms)},
                         {"note", r.note}});
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::rt::set_quick_tier(false);  // steady-state kernels are timed, never a first use's quick builds
  CLI::App app{"bench_conv: kiln's conv2d, conv2d_grad_input and conv2d_grad_weight, timed on cuda:0"};
  std::vector<std::string> shape_args, precision_args;
  std::string json_path;
  Settings set;
  app.add_option("--shape", shape_args,
                 "N,C,H,W,O,kh,kw,stride,pad (repeatable; default: the MNIST cnn's conv1 and conv2, the speedrun's "
                 "sr1 and sr2, conv2 at batch 1024, res64, res128 and proj256 at batch 64)");
  app.add_option("--precision", precision_args, "bf16, tf32 or f32 (repeatable; default: all three)")
      ->check(CLI::IsMember({"bf16", "tf32", "f32"}));
  app.add_option("--reps", set.reps, "Event-timed batches per row; the median is reported")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--calls", set.calls, "Calls per timed batch")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", set.warmup, "Untimed batches before timing")->check(CLI::Range(0, 1000000));
  app.add_option("--json", json_path, "Also write the JSON line to this file");
  CLI11_PARSE(app, argc, argv);

  std::vector<ConvShape> shapes;
  try {
    for (const std::string& a : shape_args) shapes.push_back(parse_shape(a, shapes.size()));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (shapes.empty()) shapes = kCnnShapes;
  std::vector<Precision> precisions;
  for (const Precision& p : kPrecisions)
    if (precision_args.empty() ||
        std::find(precision_args.begin(), precision_args.end(), p.name) != precision_args.end())
      precisions.push_back(p);

  std::string why;
  if (!rt::gpu_available(&why)) {
    std::printf("bench_conv: no GPU, nothing to measure (%s)\n", why.c_str());
    return 77;
  }
  std::ofstream json_out;
  if (!json_path.empty()) {
    json_out.open(json_path);  // opened before measuring, so a bad path fails at once
    if (!json_out) {
      std::fprintf(stderr, "[bench_conv] cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  const bool tf32_was = allow_conv_tf32();
  try {
    const rt::DeviceInfo& info = rt::device_info(0);
    std::printf("bench_conv on %s (sm_%d): median of %d batches of %d calls after %d warm-up batches\n",
                info.name.c_str(), info.arch(), set.reps, set.calls, set.warmup);
    std::printf("%-11s %-24s %-5s %-19s %10s %10s %9s %10s  %s\n", "name", "N,C,H,W,O,kh,kw,s,pad", "prec", "op",
                "us/call", "graph_us", "TFLOP/s", "first_ms", "note");
    std::vector<Row> rows;
    for (const ConvShape& s : shapes)
      for (const Precision& p : precisions)
        for (Row& r : bench_shape(s, p, set)) rows.push_back(std::move(r));
    set_allow_conv_tf32(tf32_was);
    const std::string line = to_json(rows, info.name, set).dump();
    std::printf("%s\n", line.c_str());
    if (json_out.is_open()) json_out << line << "\n" << std::flush;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv: %s\n", e.what());
    return 1;
  }
  return 0;
}
