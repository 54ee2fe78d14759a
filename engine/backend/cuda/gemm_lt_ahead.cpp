// Measuring a run's cuBLASLt products ahead of it (gemm_lt_ahead.h).
#include "gemm_lt_ahead.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "gemm.h"
#include "kiln/error.h"
#include "kiln/half.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/tuning.h"

namespace kiln::kernels {

namespace {

constexpr const char* kEpilogues[] = {"none", "bias", "relu_bias", "bgrad_b", "relu_mask"};
constexpr int kEpilogueCount = 5;

// Operands past this many bytes are not allocated to measure ahead: the run measures them.
constexpr std::size_t kMaxOperandBytes = std::size_t{256} << 20;

thread_local bool t_measuring_ahead = false;

// The bytes of A, B, D and the bias (none without an epilogue) that a product reads and writes.
std::array<std::size_t, 4> operand_sizes(const LtMatmul& g) {
  const std::size_t in = dtype_size(g.dtype), out = dtype_size(g.out.value_or(g.dtype));
  const std::int64_t a_cols = g.trans_a ? g.m : g.k, b_cols = g.trans_b ? g.k : g.n;
  const std::int64_t bias_len = g.epilogue == LtEpilogue::none        ? 0
                                : g.epilogue == LtEpilogue::bgrad_b   ? g.n
                                : g.epilogue == LtEpilogue::relu_mask ? g.ldd * g.n
                                                                      : g.m;
  return {static_cast<std::size_t>(g.lda * a_cols) * in, static_cast<std::size_t>(g.ldb * b_cols) * in,
          static_cast<std::size_t>(g.ldd * g.n) * out, static_cast<std::size_t>(bias_len) * out};
}

// Scratch operands of one product, filled with values in [-1, 1) so that the tuner's check of
// each candidate against the first compares real sums.
class Operands {
 public:
  Operands(const LtProblem& p, const rt::Stream& s) : s_(s) {
    const LtMatmul& g = p.g;
    const DType out = g.out.value_or(g.dtype);
    const std::array<std::size_t, 4> bytes = operand_sizes(g);
    a_ = take(bytes[0], p.align[0], g.dtype);
    b_ = take(bytes[1], p.align[1], g.dtype);
    d_ = take(bytes[2], p.align[2], out);
    if (bytes[3] > 0) bias_ = take(bytes[3], p.align[3], out);
  }
  ~Operands() {
    for (rt::DevicePtr base : bases_) rt::device_free(base, s_);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
  LtMatmul bind(LtMatmul g) const {
    g.a = a_;
    g.b = b_;
    g.d = d_;
    g.bias = bias_;
    return g;
  }

 private:
  // `bytes` at an address of exactly `align` (a pool block is 256-aligned), filled.
  rt::DevicePtr take(std::size_t bytes, std::uint32_t align, DType dtype) {
    const std::size_t offset = align % 256;
    const rt::DevicePtr base = rt::device_alloc(bytes + offset, s_);
    bases_.push_back(base);
    const rt::DevicePtr p = base + offset;
    const std::size_t n = bytes / dtype_size(dtype);
    std::vector<unsigned char> host(bytes);
    std::uint32_t x = 12345;
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      const float v = static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.f;
      if (dtype == DType::f32)
        std::memcpy(&host[i * 4], &v, 4);
      else if (dtype == DType::f64) {
        const double w = v;
        std::memcpy(&host[i * 8], &w, 8);
      } else {
        const std::uint16_t h = dtype == DType::bf16 ? float_to_bf16_bits(v) : float_to_half_bits(v);
        std::memcpy(&host[i * 2], &h, 2);
      }
    }
    rt::copy_to_device(p, host.data(), bytes, s_);
    return p;
  }

  const rt::Stream& s_;
  std::vector<rt::DevicePtr> bases_;
  rt::DevicePtr a_ = 0, b_ = 0, d_ = 0, bias_ = 0;
};

std::size_t operand_bytes(const LtProblem& p) {
  const std::array<std::size_t, 4> bytes = operand_sizes(p.g);
  return bytes[0] + bytes[1] + bytes[2] + bytes[3];
}

// The measuring thread's stream on `device`, kept for the process as the cuBLAS handle and
// workspace that kiln makes for it are (runtime/src/cublas.cpp). One thread at a time uses it.
const rt::Stream& stream_for(int device) {
  static auto* streams = new std::map<int, rt::Stream>;
  auto it = streams->find(device);
  if (it == streams->end()) it = streams->emplace(device, rt::Stream::create(device)).first;
  return it->second;
}

void join_at_exit();

void join_at_exit_after_first_product() {
  static std::atomic<bool> registered{false};
  if (!registered.exchange(true)) std::atexit(join_at_exit);
}

// The one thread measuring ahead. Leaked: exit stops and joins it through join_at_exit, which is
// registered again after the thread's first product so that it runs before the destructors of the
// statics cuBLASLt makes on that first call (a heuristic query once faulted in them at exit).
class Ahead {
 public:
  void start(std::vector<std::pair<std::string, std::string>> products, int device) {
    std::lock_guard lock(mu_);
    if (running_ || products.empty()) return;
    if (thread_.joinable()) thread_.join();
    running_ = true;
    stop_ = false;
    measured_ = 0;
    thread_ = std::thread([this, products = std::move(products), device] { run(products, device); });
  }

  void stop() {
    if (!stop_.load(std::memory_order_relaxed)) stop_ = true;
  }

  // Stops the thread after its product in flight and joins it.
  void finish() {
    stop_ = true;
    std::thread t;
    {
      std::lock_guard lock(mu_);
      t = std::move(thread_);
    }
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }

  std::size_t wait() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return !running_; });
    return measured_;
  }

 private:
  void run(const std::vector<std::pair<std::string, std::string>>& products, int device) {
    t_measuring_ahead = true;
    const rt::UncountedWaits not_the_runs;  // the run's summary counts its own waits only
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t measured = 0;
    try {
      std::vector<LtProblem> todo;
      for (const auto& [problem, dtypes] : products) {
        const std::optional<LtProblem> p = parse_lt_problem(problem, dtypes);
        // Another TF32 setting than the plan's would measure another problem than the run's.
        if (p && p->tf32 == allow_tf32() && operand_bytes(*p) <= kMaxOperandBytes) todo.push_back(*p);
      }
      // Those that time only the library's algorithms first: the others wait for a compile.
      std::stable_partition(todo.begin(), todo.end(),
                            [device](const LtProblem& p) { return !lt_measures_generated(p.g, device); });
      const rt::Stream& s = stream_for(device);  // waits for the context open_device_async makes
      for (const LtProblem& p : todo) {
        if (stop_) break;
        const std::uint64_t before = rt::tune_counters().measured_ahead;
        {
          const Operands ops(p, s);
          const bool ran = lt_matmul(ops.bind(p.g), s);
          join_at_exit_after_first_product();
          if (!ran) continue;
          s.synchronize();
        }
        if (rt::tune_counters().measured_ahead > before) ++measured;
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      rt::log().debug("[tune] measured {} of {} products ahead of the run in {:.0f} ms{}", measured, products.size(),
                      ms, stop_ ? ", until the run reached its products" : "");
    } catch (const std::exception& e) {
      rt::log().debug("[tune] measuring ahead of the run stopped: {}", e.what());
    }
    std::lock_guard lock(mu_);
    measured_ = measured;
    running_ = false;
    done_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable done_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool running_ = false;
  std::size_t measured_ = 0;
};

Ahead& ahead() {
  static auto* a = new Ahead;
  return *a;
}

void join_at_exit() { ahead().finish(); }

std::atomic<bool> g_started{false};  // whether ahead() exists, so run_reaches_products makes none

}  // namespace

std::string lt_problem_text(const LtMatmul& g, const std::array<std::uint32_t, 4>& align) {
  std::string problem;
  for (auto [label, v] :
       {std::pair{"m", g.m}, {" n", g.n}, {" k", g.k}, {" lda", g.lda}, {" ldb", g.ldb}, {" ldd", g.ldd}})
    problem.append(label).append(std::to_string(v));
  problem.append(g.trans_a ? " At" : " A").append(g.trans_b ? " Bt" : " B");
  problem.append(" epilogue ").append(kEpilogues[static_cast<int>(g.epilogue)]).append(" align");
  for (std::uint32_t a : align) problem.append(" ").append(std::to_string(a));
  return problem;
}

std::string lt_dtypes_text(const LtMatmul& g, bool tf32) {
  std::string dtypes = std::string(dtype_name(g.dtype)) + (g.dtype == DType::f32 && tf32 ? "/tf32" : "");
  const DType out = g.out.value_or(g.dtype);
  if (out != g.dtype) dtypes.append("->").append(dtype_name(out));
  return dtypes;
}

std::optional<LtProblem> parse_lt_problem(const std::string& problem, const std::string& dtypes) {
  LtProblem p;
  std::istringstream in(problem);
  auto number = [&in](const char* label, std::int64_t& v) {
    std::string w;
    if (!(in >> w) || w.rfind(label, 0) != 0 || w.size() == std::strlen(label)) return false;
    try {
      std::size_t used = 0;
      v = std::stoll(w.substr(std::strlen(label)), &used);
      return used == w.size() - std::strlen(label) && v > 0;
    } catch (const std::exception&) {
      return false;
    }
  };
  LtMatmul& g = p.g;
  // "lda" before "ldd": each label is checked as a prefix of its own word only.
  if (!number("m", g.m) || !number("n", g.n) || !number("k", g.k) || !number("lda", g.lda) || !number("ldb", g.ldb) ||
      !number("ldd", g.ldd))
    return std::nullopt;
  std::string ta, tb, word, epi;
  if (!(in >> ta >> tb >> word >> epi) || (ta != "A" && ta != "At") || (tb != "B" && tb != "Bt") || word != "epilogue")
    return std::nullopt;
  g.trans_a = ta == "At";
  g.trans_b = tb == "Bt";
  int e = 0;
  while (e < kEpilogueCount && epi != kEpilogues[e]) ++e;
  if (e == kEpilogueCount) return std::nullopt;
  g.epilogue = static_cast<LtEpilogue>(e);
  if (!(in >> word) || word != "align") return std::nullopt;
  for (std::uint32_t& a : p.align) {
    long long v = 0;
    if (!(in >> v) || v < 1 || v > 256 || (v & (v - 1)) != 0) return std::nullopt;
    a = static_cast<std::uint32_t>(v);
  }
  if (in >> word) return std::nullopt;
  std::string in_dtypes = dtypes, out_name;
  if (const std::size_t arrow = in_dtypes.find("->"); arrow != std::string::npos) {
    out_name = in_dtypes.substr(arrow + 2);
    in_dtypes.resize(arrow);
  }
  if (in_dtypes.size() > 5 && in_dtypes.compare(in_dtypes.size() - 5, 5, "/tf32") == 0) {
    p.tf32 = true;
    in_dtypes.resize(in_dtypes.size() - 5);
  }
  const std::optional<DType> d = parse_dtype(in_dtypes);
  if (!d || (p.tf32 && *d != DType::f32)) return std::nullopt;
  g.dtype = *d;
  if (!out_name.empty()) {
    const std::optional<DType> o = parse_dtype(out_name);
    if (!o || *o == g.dtype) return std::nullopt;
    g.out = *o;
  }
  if (lt_problem_text(g, p.align) != problem || lt_dtypes_text(g, p.tf32) != dtypes) return std::nullopt;
  return p;
}

void measure_products_ahead(std::vector<std::pair<std::string, std::string>> products, int device) {
  if (products.empty()) return;
  static const bool joined_at_exit = std::atexit(join_at_exit) == 0;
  (void)joined_at_exit;
  Ahead& a = ahead();
  g_started = true;
  a.start(std::move(products), device);
}

bool measuring_ahead() { return t_measuring_ahead; }

void run_reaches_products() {
  if (t_measuring_ahead || !g_started.load(std::memory_order_relaxed)) return;
  ahead().stop();
}

std::size_t wait_for_products_ahead() {
  if (!g_started.load()) return 0;
  return ahead().wait();
}

}  // namespace kiln::kernels
