// kiln_test_helper: a second process for cache tests. Each command prints the module
// cache counters as one JSON line, so a test can show what this process compiled.
//   kiln_test_helper warm OP DTYPES ARCH [VARIANT]  fill the disk cache for ARCH (no GPU needed)
//   kiln_test_helper load OP DTYPES [VARIANT]       load the function on GPU 0
//   kiln_test_helper load-threads OP DTYPES N       N threads load one function at once on GPU 0
//   kiln_test_helper load-all                       load every registered kernel on GPU 0
//   kiln_test_helper warm-bundle OPS DTYPES ARCH     compile OPS (comma-separated; every variant)
//                                                    as one bundle (kernel_bundle.h) for ARCH
//   kiln_test_helper unary-check OPS                 run the f32 unary OPS (abs, neg, exp) on GPU 0 against
//                                                    the CPU
//   kiln_test_helper nvrtc-median ARCH              compile one instantiation per kernel, print median ms
//   kiln_test_helper fused-steps ab|ba               run two compiled, fused steps on GPU 0 in that order
//   kiln_test_helper sync-bn                         under kiln-run: SyncBatchNorm against the global batch
//                                                    (sync_bn_check.cpp)
//   kiln_test_helper dist-rendezvous                 the NCCL-id exchange of kiln::dist from the environment
//                                                    (rank 0 makes a random id; no GPU): "rank R id HEX"
//   kiln_test_helper prefetch-exit ARCH              prefetch one slow compile (seconds) for ARCH, print
//                                                    "server PID" once its compile server runs, then exit
// The cache directory comes from the environment (KILN_CACHE_DIR).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/rendezvous.h"
#include "kiln/dist.h"
#include "kiln/dtype.h"
#include "kiln/kiln.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_bundle.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/version.h"

int sync_bn_check();  // sync_bn_check.cpp

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kiln_test_helper warm OP DTYPES ARCH [VARIANT]\n"
               "       kiln_test_helper load OP DTYPES [VARIANT]\n");
  return 2;
}

void print_counters(const char* outcome) {
  const kiln::rt::CacheCounters c = kiln::rt::cache_counters();
  std::printf(
      "{\"outcome\":\"%s\",\"compiles\":%llu,\"memory_hits\":%llu,\"disk_hits\":%llu,"
      "\"compile_ms\":%.3f,\"load_ms\":%.3f,\"cubin_loads\":%llu,\"ptx_loads\":%llu,\"quick_compiles\":%llu}\n",
      outcome, static_cast<unsigned long long>(c.compiles), static_cast<unsigned long long>(c.memory_hits),
      static_cast<unsigned long long>(c.disk_hits), c.compile_ms, c.load_ms,
      static_cast<unsigned long long>(c.cubin_loads), static_cast<unsigned long long>(c.ptx_loads),
      static_cast<unsigned long long>(c.quick_compiles));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Loads every (kernel, dtypes, variant) on GPU 0; with a warm cache this compiles nothing.
int load_all() {
  std::vector<double> ms;
  for (const kiln::rt::KernelSpec* spec : kiln::rt::registered_kernels())
    for (const kiln::DTypes& d : spec->dtypes)
      for (std::uint32_t v : spec->variants) {
        auto t = std::chrono::steady_clock::now();
        kiln::rt::get_function(*spec, d, v, 0);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
      }
  const kiln::rt::CacheCounters c = kiln::rt::cache_counters();
  std::printf("{\"modules\":%zu,\"compiles\":%llu,\"disk_hits\":%llu,\"load_ms_total\":%.3f,"
              "\"load_ms_per_module\":%.4f,\"get_function_ms_median\":%.4f}\n",
              ms.size(), static_cast<unsigned long long>(c.compiles), static_cast<unsigned long long>(c.disk_hits),
              c.load_ms, ms.empty() ? 0.0 : c.load_ms / static_cast<double>(ms.size()), median(ms));
  return c.compiles == 0 ? 0 : 1;
}

// NVRTC time for one instantiation of each registered kernel, compiled one after another.
int nvrtc_median(int arch) {
  std::vector<double> ms;
  for (const kiln::rt::KernelSpec* spec : kiln::rt::registered_kernels()) {
    const kiln::DTypes& d = spec->dtypes.front();
    kiln::rt::CompileRequest req{spec->op, d.str(), kiln::rt::instantiate_kernel(*spec, d, spec->variants.front()), arch};
    ms.push_back(kiln::rt::compile(req).ms);
  }
  std::printf("{\"kernels\":%zu,\"nvrtc_ms_median\":%.1f,\"nvrtc_ms_min\":%.1f,\"nvrtc_ms_max\":%.1f}\n", ms.size(),
              median(ms), *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()));
  return 0;
}

// Two compiled steps whose pointwise chains fuse: a relu(x * y + x), b tanh(sigmoid(x) * y).
// The order changes which fused kernel a process meets first, not what is compiled.
int fused_steps(const std::string& order) {
  using namespace kiln;
  Generator g(7);
  const Device gpu = Device::cuda(0);
  const Tensor x = randn({64, 32}, {}, &g).to(gpu), y = randn({64, 32}, {}, &g).to(gpu);
  CompiledFunction a = compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0] * in[1] + in[0])}; },
                               {.fuse = true});
  CompiledFunction b = compile(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{kiln::tanh(sigmoid(in[0]) * in[1])}; },
      {.fuse = true});
  for (char step : order)
    for (int call = 0; call < 3; ++call) (step == 'a' ? a : b)({x, y})[0].to(Device::cpu());  // eager, capture, replay
  print_counters("ran");
  return 0;
}

std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

const kiln::rt::KernelSpec& spec_named(const std::string& op) {
  const kiln::rt::KernelSpec* spec = kiln::rt::find_kernel(op);
  if (!spec) throw kiln::ValueError("unknown op '" + op + "'");
  return *spec;
}

int warm_bundle(const std::string& ops, const std::string& dtypes, int arch) {
  std::vector<kiln::rt::BundleItem> items;
  for (const std::string& op : comma_list(ops)) {
    const kiln::rt::KernelSpec& spec = spec_named(op);
    for (std::uint32_t v : spec.variants) items.push_back({&spec, kiln::DTypes::parse(dtypes), v});
  }
  bool compiled = false;
  for (const kiln::rt::BundleResult& r : kiln::rt::warm_bundle(items, arch)) {
    if (!r.outcome) std::rethrow_exception(r.error);
    compiled = compiled || *r.outcome == kiln::rt::WarmOutcome::compiled;
  }
  print_counters(compiled ? "compiled" : "cached");
  return 0;
}

// Each op on the GPU against the same op on the CPU, over values from -4 to 4.
int unary_check(const std::string& ops) {
  using namespace kiln;
  Generator g(3);
  const Tensor x = rand({4096}, {}, &g) * 8.0 - 4.0;
  bool same = true;
  for (const std::string& op : comma_list(ops)) {
    auto apply = [&](const Tensor& t) {
      if (op == "abs") return kiln::abs(t);
      if (op == "neg") return kiln::neg(t);
      if (op == "exp") return kiln::exp(t);
      throw ValueError("unary-check knows abs, neg and exp, not '" + op + "'");
    };
    const Tensor want = apply(x), got = apply(x.to(Device::cuda(0))).to(Device::cpu());
    const std::vector<float> w = want.to_vector<float>(), o = got.to_vector<float>();
    for (std::size_t i = 0; i < w.size(); ++i) same = same && std::abs(w[i] - o[i]) <= 1e-6f * (1 + std::abs(w[i]));
  }
  print_counters(same ? "same" : "different");
  return same ? 0 : 1;
}

// What ProcessGroup::init does before NCCL: every rank prints the first bytes of the id it got.
int dist_rendezvous() {
  const kiln::dist::Env env = kiln::dist::env_from_environment();
  kiln::dist::detail::IdBytes id{};
  if (env.rank == 0)
    for (unsigned char& b : id) b = static_cast<unsigned char>(std::random_device{}());
  const auto where = kiln::dist::detail::rendezvous_from_environment(env);
  id = kiln::dist::detail::exchange_id(where, env, id, kiln::dist::timeout_from_environment());
  std::printf("rank %d id %02x%02x%02x%02x%02x%02x%02x%02x\n", env.rank, id[0], id[1], id[2], id[3], id[4], id[5],
              id[6], id[7]);
  return 0;
}

// The kiln-nvrtc-server children of this process.
std::vector<int> compile_servers() {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (line.find("(kiln-nvrtc-ser") == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid()) out.push_back(std::stoi(pid));
  }
  return out;
}

// A process that exits while a prefetch thread compiles: the exit must not wait for the compile.
int prefetch_exit(int arch) {
  const std::string tag =
      std::to_string(::getpid()) + "_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  kiln::rt::EntryKey key;
  key.op = "prefetch_exit_" + tag;
  key.dtypes = "u8";
  key.label = "prefetch exit probe";
  // Hundreds of sines unrolled: seconds of NVRTC on any machine.
  const std::string source = "// " + tag +
                             "\nextern \"C\" __global__ void k(float* y, float v) {\n  float a = v;\n#pragma unroll\n"
                             "  for (int i = 0; i < 500; ++i) a = sinf(a * 1.0001f + i);\n  y[threadIdx.x] = a;\n}\n";
  kiln::rt::prefetch_sources({{key, source, arch}}, 1);
  for (int i = 0; i < 1000 && compile_servers().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (int pid : compile_servers()) std::printf("server %d\n", pid);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the request is in the server's hands
  std::printf("exiting\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Referencing libkiln loads it, and with it the kernels it registers.
  if (!kiln::version()) return 1;
  const std::string cmd = argc > 1 ? argv[1] : "";
  try {
    if (cmd == "load-all" && argc == 2) return load_all();
    if (cmd == "nvrtc-median" && argc == 3) return nvrtc_median(kiln::rt::parse_arch(argv[2]));
    if (cmd == "fused-steps" && argc == 3) return fused_steps(argv[2]);
    if (cmd == "sync-bn" && argc == 2) return sync_bn_check();
    if (cmd == "dist-rendezvous" && argc == 2) return dist_rendezvous();
    if (cmd == "warm-bundle" && argc == 5) return warm_bundle(argv[2], argv[3], kiln::rt::parse_arch(argv[4]));
    if (cmd == "unary-check" && argc == 3) return unary_check(argv[2]);
    if (cmd == "prefetch-exit" && argc == 3) return prefetch_exit(kiln::rt::parse_arch(argv[2]));
    if (argc < 4) return usage();
    const kiln::rt::KernelSpec* spec = kiln::rt::find_kernel(argv[2]);
    if (!spec) {
      std::fprintf(stderr, "kiln_test_helper: unknown op '%s'\n", argv[2]);
      return 2;
    }
    const kiln::DTypes dtypes = kiln::DTypes::parse(argv[3]);
    if (cmd == "warm" && (argc == 5 || argc == 6)) {
      const int arch = kiln::rt::parse_arch(argv[4]);
      const auto variant = static_cast<std::uint32_t>(argc == 6 ? std::stoul(argv[5]) : spec->variants.front());
      auto outcome = kiln::rt::warm_kernel(*spec, dtypes, variant, arch);
      print_counters(outcome == kiln::rt::WarmOutcome::compiled ? "compiled" : "cached");
      return 0;
    }
    if (cmd == "load-threads" && argc == 5) {
      // Every thread asks for the same uncached key at once; the cache must compile it once.
      std::vector<std::thread> threads;
      std::vector<void*> handles(static_cast<std::size_t>(std::stoi(argv[4])));
      for (std::size_t i = 0; i < handles.size(); ++i)
        threads.emplace_back([&, i] { handles[i] = kiln::rt::get_function(*spec, dtypes, spec->variants.front(), 0).handle; });
      for (auto& t : threads) t.join();
      bool same = std::all_of(handles.begin(), handles.end(), [&](void* h) { return h && h == handles[0]; });
      print_counters(same ? "same" : "different");
      return same ? 0 : 1;
    }
    if (cmd == "load" && (argc == 4 || argc == 5)) {
      const auto variant = static_cast<std::uint32_t>(argc == 5 ? std::stoul(argv[4]) : spec->variants.front());
      kiln::rt::Function f = kiln::rt::get_function(*spec, dtypes, variant, 0);
      print_counters(f.handle ? "loaded" : "null");
      return f.handle ? 0 : 1;
    }
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_test_helper: %s\n", e.what());
    return 1;
  }
}
