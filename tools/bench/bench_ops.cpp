// bench_ops: the numbers of issue 3's "Performance" section on cuda:0, as a table and one
// JSON line (tools/bench/bench_ops_torch.py prints the same rows for PyTorch, so the two
// can run in one GPU session and be divided row by row):
//   copy      rt::copy_device of 2^28*4 bytes: the bandwidth the rest is measured against
//   add/mul/relu/cast on 2^28 elements (f32, f16, bf16): GB/s of bytes read + written
//   sum       over 2^28 elements
//   matmul    4096^3 (f32, TF32, bf16, f16) as TFLOP/s, next to cublasGemmEx called directly
//   overhead  host microseconds per add of 1-element tensors (batches of 256, below the
//             launch queue's depth), with and without autograd recording; "sustained" is
//             10000 in a row; launch/launch_raw/alloc_free/empty split the no-grad op into its
//             parts (launch_raw: the kernel launch alone, its function looked up beforehand)
//   replay    a compiled chain of n adds/muls of 1-element tensors (n = 10, 100): host_n* is
//             the host's microseconds per replay call (inputs copied in, graph launched; no
//             sync inside a batch) with eager/replay the same chain run op by op; gpu_n* is the
//             GPU's microseconds per kernel node (event-timed replays / kernels in the graph)
// GPU times are medians of event-timed repetitions after warm-up. Ops are looked up in the
// registry, so a missing op prints n/a instead of failing. Exits 77 without a GPU.
//   bench_ops [--reps N]
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_timing.h"
#include "kiln/kiln.h"
#include "kiln/runtime/cublas.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/quick_tier.h"

using namespace kiln;

namespace {

int g_reps = 10;
constexpr std::int64_t kN = std::int64_t{1} << 28;
constexpr std::int64_t kMat = 4096;

const rt::Stream& stream() { return rt::default_stream(0); }

double time_ms(const std::function<void()>& body) { return bench::median_event_ms(stream(), body, g_reps); }

struct Row {
  std::string name{}, dtype{}, unit{};
  double ms = -1, value = -1;  // -1: not measured (op missing or failed)
  double ref = -1;             // copy GB/s fraction or cuBLAS TFLOP/s
  std::string ref_label{}, note{};
};
std::vector<Row> g_rows;

void add_row(Row r) {
  if (r.value < 0)
    std::printf("%-10s %-10s %10s %12s %-8s %s\n", r.name.c_str(), r.dtype.c_str(), "n/a", "n/a", r.unit.c_str(),
                r.note.c_str());
  else if (r.ref < 0)
    std::printf("%-10s %-10s %10.4f %12.2f %-8s %s\n", r.name.c_str(), r.dtype.c_str(), r.ms, r.value,
                r.unit.c_str(), r.note.c_str());
  else
    std::printf("%-10s %-10s %10.4f %12.2f %-8s %s %.3f %s\n", r.name.c_str(), r.dtype.c_str(), r.ms, r.value,
                r.unit.c_str(), r.ref_label.c_str(), r.ref, r.note.c_str());
  std::fflush(stdout);
  g_rows.push_back(std::move(r));
}

// Times `make()` (which returns the op's outputs, kept alive until the stop event).
Row measure(const std::string& name, const std::string& dtype, const std::string& unit, double work,
            const std::function<std::vector<Tensor>()>& make) {
  Row r{name, dtype, unit};
  try {
    r.ms = time_ms([&] { (void)make(); });
    r.value = work / (r.ms * 1e-3);
  } catch (const std::exception& e) {
    r.note = e.what();
  }
  return r;
}

void bench_elementwise(double copy_gbs) {
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const double sz = static_cast<double>(dtype_size(dt)), n = static_cast<double>(kN);
    const std::string dn(dtype_name(dt));
    Tensor x = randn({kN}, {.dtype = dt, .device = gpu}), y = randn({kN}, {.dtype = dt, .device = gpu});
    auto with_copy = [&](Row r) {
      if (r.value >= 0) r.ref = r.value / copy_gbs, r.ref_label = "of copy";
      add_row(std::move(r));
    };
    with_copy(measure("add", dn, "GB/s", 3 * n * sz / 1e9, [&] { return std::vector<Tensor>{add(x, y)}; }));
    with_copy(measure("mul", dn, "GB/s", 3 * n * sz / 1e9, [&] { return std::vector<Tensor>{mul(x, y)}; }));
    with_copy(measure("relu", dn, "GB/s", 2 * n * sz / 1e9, [&] { return std::vector<Tensor>{relu(x)}; }));
    for (DType to : {DType::f32, DType::f16, DType::bf16}) {
      if (to == dt) continue;
      const double bytes = n * (sz + static_cast<double>(dtype_size(to)));
      with_copy(measure("cast", dn + "->" + std::string(dtype_name(to)), "GB/s", bytes / 1e9, [&] {
        return std::vector<Tensor>{x.to(to)};
      }));
    }
    with_copy(measure("sum", dn, "GB/s", n * sz / 1e9, [&] { return std::vector<Tensor>{sum(x)}; }));
  }
}

// C = A @ B (row-major, all 4096x4096) through cublasGemmEx: column-major C^T = B^T A^T.
void cublas_gemm(DType dt, bool tf32, const Tensor& a, const Tensor& b, const Tensor& c) {
  const cudaDataType_t type = dt == DType::f32 ? CUDA_R_32F : dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1, beta = 0;
  const int n = static_cast<int>(kMat);
  auto h = static_cast<cublasHandle_t>(rt::cublas_handle(stream()));
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, b.data_ptr(), type, n, a.data_ptr(),
                                   type, n, &beta, c.data_ptr(), type, n, compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CudaError("cublasGemmEx", cublasGetStatusName(st), cublasGetStatusString(st), __FILE__, __LINE__);
}

void bench_matmul() {
  const Device gpu = Device::cuda(0);
  const double flop = 2.0 * kMat * kMat * kMat / 1e12;
  struct Mode {
    const char* label;
    DType dt;
    bool tf32;
  };
  for (Mode m : {Mode{"f32", DType::f32, false}, Mode{"tf32", DType::f32, true}, Mode{"bf16", DType::bf16, false},
                 Mode{"f16", DType::f16, false}}) {
    Tensor a = randn({kMat, kMat}, {.dtype = m.dt, .device = gpu}),
           b = randn({kMat, kMat}, {.dtype = m.dt, .device = gpu});
    Tensor c = empty({kMat, kMat}, {.dtype = m.dt, .device = gpu});
    set_allow_tf32(m.tf32);
    Row r = measure("matmul", m.label, "TFLOP/s", flop, [&] { return std::vector<Tensor>{matmul(a, b)}; });
    Row direct = measure("cublas", m.label, "TFLOP/s", flop, [&] {
      cublas_gemm(m.dt, m.tf32, a, b, c);
      return std::vector<Tensor>{};
    });
    set_allow_tf32(false);
    if (r.value >= 0 && direct.value >= 0) r.ref = r.value / direct.value, r.ref_label = "of cuBLAS";
    add_row(std::move(r));
    add_row(std::move(direct));
  }
}

// Host microseconds per launch-bound op: N adds of 1-element tensors, no sync inside.
// Median host microseconds per call of `body` over batches of `batch` calls, synchronised
// between batches. Batches of 256 stay under the driver's launch queue, so the host never
// waits for the GPU; 10000 in a row measure the sustained rate (host or GPU, the slower).
double host_us_per_call(const std::function<void()>& body, int batch = 256, int batches = 40) {
  std::vector<double> us;
  for (int rep = 0; rep < 2 + batches; ++rep) {
    stream().synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) body();
    auto t1 = std::chrono::steady_clock::now();
    if (rep >= 2) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
  }
  stream().synchronize();
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void add_overhead_row(const char* what, double us, int calls = 256) {
  Row r{"overhead", what, "us/op"};
  r.value = us;
  r.ms = us * calls / 1e3;  // per batch
  add_row(std::move(r));
}

void bench_overhead() {
  for (bool grad : {false, true}) {
    Tensor x = ones({1}, {.dtype = DType::f32, .device = Device::cuda(0), .requires_grad = grad});
    add_overhead_row(grad ? "autograd" : "no_grad", host_us_per_call([&] { (void)add(x, x); }));
  }
  {
    Tensor x = ones({1}, {.device = Device::cuda(0)});
    add_overhead_row("sustained", host_us_per_call([&] { (void)add(x, x); }, 10000, std::max(1, g_reps / 2)), 10000);
  }
  // Where a no-grad op's time goes: the kernel launch alone, a 4-byte allocation and free,
  // and an empty 1-element tensor (the op's output without its kernel).
  Tensor a = ones({1}, {.device = Device::cuda(0)}), y = empty({1}, {.device = Device::cuda(0)});
  const auto pa = reinterpret_cast<rt::DevicePtr>(a.data_ptr()), py = reinterpret_cast<rt::DevicePtr>(y.data_ptr());
  const rt::KernelSpec* add_spec = rt::find_kernel("add");
  if (!add_spec) throw ValueError("[bench_ops] the kernel spec \"add\" is not registered");
  rt::LaunchConfig one;
  one.grid = {1, 1, 1};
  one.block = {256, 1, 1};
  const long long n = 1;
  const double p0 = 0, p1 = 0;
  // The module cache's lookup and the launch, as every eager op pays them.
  add_overhead_row("launch", host_us_per_call([&] {
                     rt::launch(rt::get_function(*add_spec, {DType::f32, DType::f32}, 0, 0), one, stream(), pa, pa, py,
                                n, p0, p1);
                   }));
  // The driver's share: the same kernel with the function looked up once.
  const rt::Function add_fn = rt::get_function(*add_spec, {DType::f32, DType::f32}, 0, 0);
  add_overhead_row("launch_raw", host_us_per_call([&] { rt::launch(add_fn, one, stream(), pa, pa, py, n, p0, p1); }));
  add_overhead_row("alloc_free", host_us_per_call([&] { rt::DeviceBuffer b(4, stream()); }));
  add_overhead_row("empty", host_us_per_call([&] { (void)empty({1}, {.device = Device::cuda(0)}); }));
}

// A compiled chain of n elementwise ops. Host figure: batches of 64 calls, a quarter of the
// overhead rows' 256, since each replay queues n kernels and the host must not wait for the GPU.
// GPU figure: events around 100 replays back to back; when the host is the slower (small n),
// the gaps between replays count too.
void bench_replay() {
  const Device gpu = Device::cuda(0);
  for (int n : {10, 100}) {
    const std::string tag = "n" + std::to_string(n);
    const StepFunction chain = [n](const std::vector<Tensor>& in) {
      Tensor y = in[0];
      for (int i = 0; i < n; ++i) y = i % 2 ? mul(y, in[0]) : add(y, in[0]);
      return std::vector<Tensor>{y};
    };
    try {
      const Tensor x = ones({1}, {.dtype = DType::f32, .device = gpu});
      CompiledFunction cf = compile(chain);
      const double eager_us = host_us_per_call([&] { (void)chain({x}); }, 64, 100);
      Row host{"replay", "host_" + tag, "us/call"};
      host.value = host_us_per_call([&] { (void)cf({x}); }, 64, 100);
      host.ms = host.value * 64 / 1e3;  // per batch
      host.ref = eager_us / host.value, host.ref_label = "eager/replay";
      const CompileStats st = cf.stats();
      if (st.replays == 0 || st.kernels_per_graph.empty()) throw ValueError("[bench_ops] the chain was never replayed");
      const std::size_t kernels = st.kernels_per_graph.front();
      add_row(std::move(host));
      constexpr int kReplays = 100;
      Row node{"replay", "gpu_" + tag, "us/node"};
      auto replays = [&] {
        for (int i = 0; i < kReplays; ++i) (void)cf({x});
      };
      node.ms = time_ms(replays) / kReplays;  // per replay
      node.value = node.ms * 1e3 / static_cast<double>(kernels);
      node.note = std::to_string(kernels) + " kernels per graph";
      add_row(std::move(node));
    } catch (const std::exception& e) {
      Row r{"replay", tag, "us"};
      r.note = e.what();
      add_row(std::move(r));
    }
  }
}

void print_json(const std::string& device, double copy_gbs) {
  std::string j =
      "{\"bench\":\"kiln\",\"device\":\"" + device + "\",\"copy_gbs\":" + std::to_string(copy_gbs) + ",\"rows\":[";
  for (std::size_t i = 0; i < g_rows.size(); ++i) {
    const Row& r = g_rows[i];
    j.append(i ? "," : "") += "{\"name\":\"" + r.name + "\",\"dtype\":\"" + r.dtype + "\",\"unit\":\"" +
         r.unit + "\",\"ms\":" + (r.ms < 0 ? "null" : std::to_string(r.ms)) +
         ",\"value\":" + (r.value < 0 ? "null" : std::to_string(r.value)) +
         ",\"ratio\":" + (r.ref < 0 ? "null" : std::to_string(r.ref)) + "}";
  }
  std::printf("%s]}\n", j.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  kiln::rt::set_quick_tier(false);  // steady-state kernels are timed, never a first use's quick builds
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) g_reps = std::max(1, std::atoi(argv[i + 1]));
  std::string why;
  if (!rt::gpu_available(&why)) {
    std::printf("bench_ops: no GPU, nothing to measure (%s)\n", why.c_str());
    return 77;
  }
  try {
    const rt::DeviceInfo& info = rt::device_info(0);
    std::printf("bench_ops on %s (sm_%d), median of %d runs\n", info.name.c_str(), info.arch(), g_reps);
    std::printf("%-10s %-10s %10s %12s %-8s %s\n", "op", "dtype", "ms", "value", "unit", "ratio");
    const std::size_t bytes = static_cast<std::size_t>(kN) * 4;
    double copy_gbs = 0;
    {
      rt::DeviceBuffer src(bytes, stream()), dst(bytes, stream());
      rt::memset_device(src.ptr(), 0, bytes, stream());
      Row r{"copy", "bytes", "GB/s"};
      r.ms = time_ms([&] { rt::copy_device(dst.ptr(), src.ptr(), bytes, stream()); });
      r.value = copy_gbs = 2.0 * static_cast<double>(bytes) / 1e9 / (r.ms * 1e-3);
      add_row(std::move(r));
    }
    bench_elementwise(copy_gbs);
    bench_matmul();
    bench_overhead();
    bench_replay();
    print_json(info.name, copy_gbs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
