// Every pointwise op's kernel (registered op x dtype tuple x variant) launched through the
// engine's launchers and compared with a host reference in double (elementwise_reference.h):
// contiguous (vector path), unaligned (scalar path), permuted/broadcast/padded views
// (strided variant) and host scalars. Output elements outside the view must stay
// untouched. KILN_TEST_OPS=add,cast limits the ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <tuple>

#include "backend/cuda/elementwise_kernels.h"
#include "core/registry.h"
#include "ops/user_pointwise.h"
#include "elementwise_reference.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/module_cache.h"

using namespace kiln;
using namespace elt;
namespace kk = kiln::kernels;
using Shape = std::vector<std::int64_t>;

namespace {

const rt::Stream& stream() { return rt::default_stream(0); }

bool kernel_selected(const std::string& op) {
  const char* env = std::getenv("KILN_TEST_OPS");
  if (!env || !*env) return true;
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');)
    if (item == op) return true;
  return false;
}

// How an operand's storage maps onto the output shape.
enum class View {
  contiguous,
  offset,     // contiguous from storage element 1: misaligned for vectors
  permuted,   // dims stored in reverse order (a full transpose)
  broadcast,  // dim 1 stored once (stride 0)
  scalar,     // one element broadcast everywhere
  padded,     // rows padded by one element that the op must not touch
};

struct Buffer {
  DType t{};
  std::int64_t offset = 0;
  std::array<std::int64_t, kk::kMaxDims> strides{};
  Bytes host;  // the whole storage
  rt::DeviceBuffer dev;

  std::size_t storage() const { return host.size() / dtype_size(t); }
  kk::Operand operand() const { return {dev.ptr() + static_cast<std::uint64_t>(offset) * dtype_size(t), strides}; }
  void upload() { rt::copy_to_device(dev.ptr(), host.data(), host.size(), stream()); }
  Bytes download() const {
    Bytes b(host.size());
    rt::copy_to_host(b.data(), dev.ptr(), b.size(), stream());
    return b;
  }
  std::int64_t element(const std::vector<std::int64_t>& idx) const {
    std::int64_t e = offset;
    for (std::size_t d = 0; d < idx.size(); ++d) e += idx[d] * strides[d];
    return e;
  }
};

Buffer make_buffer(DType t, const Shape& shape, View view, Rng& rng, Values values = Values::general) {
  Buffer b;
  b.t = t;
  const int nd = static_cast<int>(shape.size());
  Shape stored = shape;
  if (view == View::broadcast && nd > 1) stored[1] = 1;
  if (view == View::scalar) std::fill(stored.begin(), stored.end(), 1);
  if (view == View::padded) stored.back() += 1;
  std::int64_t step = 1;
  if (view == View::permuted) {
    for (int d = 0; d < nd; ++d) b.strides[d] = step, step *= stored[d];
  } else {
    for (int d = nd - 1; d >= 0; --d) b.strides[d] = stored[d] == 1 && shape[d] != 1 ? 0 : step, step *= stored[d];
  }
  b.offset = view == View::offset ? 1 : 0;
  b.host = make_values(t, static_cast<std::size_t>(step + b.offset), rng, values);
  b.dev = rt::DeviceBuffer(b.host.size(), stream());
  b.upload();
  return b;
}

std::vector<std::int64_t> unravel(std::int64_t i, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) idx[d] = i % shape[d], i /= shape[d];
  return idx;
}

std::string fmt(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.9g", v);
  return s;
}

int g_cases = 0;

// Compares y's storage after the launch: each element of the view with want(idx), every
// other element unchanged. Prints the first mismatches with their indices.
template <class Want, class Inputs>
void check_output(const std::string& name, const Buffer& y, const Shape& shape, Want want, Inputs inputs) {
  ++g_cases;
  const Bytes got = y.download();
  Bytes expected = y.host;
  std::vector<char> covered(y.storage(), 0);
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  for (std::int64_t i = 0; i < n; ++i) {
    auto idx = unravel(i, shape);
    auto e = static_cast<std::size_t>(y.element(idx));
    store(y.t, expected, e, want(idx));
    covered[e] = 1;
  }
  int shown = 0, bad = 0;
  for (std::size_t e = 0; e < y.storage(); ++e) {
    const std::size_t w = dtype_size(y.t);
    const bool ok = covered[e] ? agrees(y.t, load(y.t, got, e), load(y.t, expected, e))
                               : std::equal(got.begin() + e * w, got.begin() + (e + 1) * w, y.host.begin() + e * w);
    if (ok) continue;
    ++bad;
    if (shown++ < 5) {
      std::string where = "storage element " + std::to_string(e);
      for (std::int64_t i = 0; i < n && covered[e]; ++i) {
        auto idx = unravel(i, shape);
        if (static_cast<std::size_t>(y.element(idx)) != e) continue;
        where = "index [";
        for (std::size_t d = 0; d < idx.size(); ++d) where += (d ? "," : "") + std::to_string(idx[d]);
        where += "] inputs " + inputs(idx);
        break;
      }
      MESSAGE(name << ": " << where << ": got " << fmt(load(y.t, got, e)) << ", want "
                   << (covered[e] ? fmt(load(y.t, expected, e)) : "untouched " + fmt(load(y.t, y.host, e))));
    }
  }
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " of " << y.storage() << " elements differ");
}

std::string case_name(const std::string& op, const DTypes& d, const char* kind, const Shape& shape) {
  std::string s = op + "(dtypes=" + d.str() + ", " + kind + ", shape=[";
  for (std::size_t i = 0; i < shape.size(); ++i) s.append(i ? "," : "").append(std::to_string(shape[i]));
  return s + "])";
}

const Shape kBig{5, 7, 11, 13};
const Shape kLine{1001};
const Shape kSmall{6, 5, 7};

// Unary parameters per op and input dtype: leaky_relu's slope, clamp's bounds.
std::vector<std::pair<double, double>> unary_params(const std::string& op, DType t) {
  if (op == "leaky_relu") return {{0.01, 0}};
  if (op != "clamp") return {{0, 0}};
  if (t == DType::u8) return {{10, 200}};
  if (!is_floating(t)) return {{-10, 20}};
  return {{-0.5, 0.75}, {1.0, -1.0}};  // min > max gives max, as torch.clamp
}

void run_unary(const rt::KernelSpec& spec, const DTypes& d, Rng& rng) {
  const DType in = d[0], out = d[1];
  const UnaryRef& ref = unary_refs().at(spec.op);
  const Values values = spec.op == "cast" && is_integral(out) && is_floating(in) ? Values::int_targets : Values::general;
  struct Case {
    const char* kind;
    Shape shape;
    View x, y;
  };
  const Case cases[] = {{"contiguous", kBig, View::contiguous, View::contiguous},
                        {"unaligned", kLine, View::offset, View::offset},
                        {"transposed", kSmall, View::permuted, View::contiguous},
                        {"broadcast_into_padded", kSmall, View::broadcast, View::padded}};
  for (auto item : unary_params(spec.op, in)) {
    const auto p0 = item.first;  // named, not bound: clang 14 cannot capture bindings
    const auto p1 = item.second;
    for (const Case& c : cases) {
      Buffer x = make_buffer(in, c.shape, c.x, rng, values);
      Buffer y = make_buffer(out, c.shape, c.y, rng);
      kk::launch_unary(spec, in, out, x.operand(), y.operand(), c.shape, p0, p1, stream());
      auto xv = [&](const std::vector<std::int64_t>& idx) { return load(in, x.host, x.element(idx)); };
      check_output(case_name(spec.op, d, c.kind, c.shape), y, c.shape,
                   [&](const auto& idx) { return ref(xv(idx), p0, p1); },
                   [&](const auto& idx) { return fmt(xv(idx)); });
    }
  }
}

void run_binary(const rt::KernelSpec& spec, const DTypes& d, Rng& rng) {
  const DType in = d[0], out = d[1];
  const BinaryRef& ref = binary_refs().at(spec.op);
  struct Case {
    const char* kind;
    Shape shape;
    View a, b, y;
  };
  const Case cases[] = {{"contiguous", kBig, View::contiguous, View::contiguous, View::contiguous},
                        {"unaligned", kLine, View::offset, View::contiguous, View::contiguous},
                        {"transposed_broadcast", kSmall, View::permuted, View::broadcast, View::contiguous},
                        {"scalar_tensor_into_transposed", kSmall, View::contiguous, View::scalar, View::permuted}};
  for (const Case& c : cases) {
    Buffer a = make_buffer(in, c.shape, c.a, rng);
    Buffer b = make_buffer(in, c.shape, c.b, rng);
    Buffer y = make_buffer(out, c.shape, c.y, rng);
    kk::launch_binary(spec, in, out, a.operand(), b.operand(), y.operand(), c.shape, stream());
    auto av = [&](const std::vector<std::int64_t>& idx) { return load(in, a.host, a.element(idx)); };
    auto bv = [&](const std::vector<std::int64_t>& idx) { return load(in, b.host, b.element(idx)); };
    check_output(case_name(spec.op, d, c.kind, c.shape), y, c.shape,
                 [&](const auto& idx) { return ref(av(idx), bv(idx)); },
                 [&](const auto& idx) { return fmt(av(idx)) + ", " + fmt(bv(idx)); });
  }

  // Host scalars, on either side, with a contiguous and a transposed tensor operand.
  const kk::Scalar s = in == DType::boolean ? kk::Scalar(true)
                       : is_floating(in)    ? kk::Scalar(-1.25)
                                            : kk::Scalar(std::int64_t{3});
  for (bool first : {false, true}) {
    for (View view : {View::contiguous, View::permuted}) {
      const Shape& shape = view == View::contiguous ? kBig : kSmall;
      Buffer a = make_buffer(in, shape, view, rng);
      Buffer y = make_buffer(out, shape, View::contiguous, rng);
      kk::launch_binary_scalar(spec, in, out, a.operand(), s, first, y.operand(), shape, stream());
      auto av = [&](const std::vector<std::int64_t>& idx) { return load(in, a.host, a.element(idx)); };
      const char* kind = first ? (view == View::contiguous ? "scalar_first" : "scalar_first_transposed")
                               : (view == View::contiguous ? "scalar_second" : "scalar_second_transposed");
      check_output(case_name(spec.op, d, kind, shape), y, shape,
                   [&](const auto& idx) { return first ? ref(s.f, av(idx)) : ref(av(idx), s.f); },
                   [&](const auto& idx) { return fmt(av(idx)) + " scalar " + fmt(s.f); });
    }
  }
}

// Fetches (compiling or loading) every kernel of `ops` on all hardware threads first, so
// a cold cache costs seconds rather than minutes.
void warm(const std::vector<const rt::KernelSpec*>& specs) {
  struct Item {
    const rt::KernelSpec* spec;
    DTypes d;
    std::uint32_t v;
  };
  std::vector<Item> items;
  for (const auto* s : specs)
    for (const auto& d : s->dtypes)
      for (auto v : s->variants) items.push_back({s, d, v});
  std::atomic<std::size_t> next{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t) {
    pool.emplace_back([&] {
      for (std::size_t i = next++; i < items.size(); i = next++) {
        try {
          rt::get_function(*items[i].spec, items[i].d, items[i].v, 0);
        } catch (const std::exception& e) {
          ++failed;
          std::printf("%s\n", e.what());
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  REQUIRE(failed == 0);
}

}  // namespace

TEST_CASE("every pointwise op's kernel matches the host reference for every dtype tuple") {
  // The ops come from the registry: a new pointwise op fails here until its reference is
  // written, instead of going untested.
  std::vector<const rt::KernelSpec*> unary, binary;
  for (const OpDef* op : registered_ops()) {
    // kiln::pointwise ops are compared with their CPU evaluator in test_user_pointwise_gpu.cpp.
    if (!pointwise_expr(*op) || is_user_pointwise(*op) || !kernel_selected(op->name)) continue;
    const bool is_unary = op->num_inputs == 1;
    const bool has_ref = is_unary ? unary_refs().count(op->name) > 0 : binary_refs().count(op->name) > 0;
    CHECK_MESSAGE(has_ref, op->name << " has a device expression but no reference in elementwise_reference.h");
    if (has_ref) (is_unary ? unary : binary).push_back(&kk::kernel(op->name));
  }
  std::vector<const rt::KernelSpec*> specs = unary;
  specs.insert(specs.end(), binary.begin(), binary.end());
  warm(specs);
  Rng rng{42};
  g_cases = 0;
  for (const rt::KernelSpec* spec : unary)
    for (const DTypes& d : spec->dtypes) run_unary(*spec, d, rng);
  for (const rt::KernelSpec* spec : binary)
    for (const DTypes& d : spec->dtypes) run_binary(*spec, d, rng);
  std::printf("elementwise kernels: %d cases over %zu ops compared with the host reference\n", g_cases, specs.size());
}

TEST_CASE("fill writes every dtype exactly, through contiguous and strided views") {
  if (!kernel_selected("fill")) return;
  Rng rng{7};
  for (DType t : kAllDTypes) {
    // Exact 64-bit integers need the integer half of the scalar.
    const kk::Scalar v = t == DType::i64       ? kk::Scalar(std::int64_t{(1ll << 60) + 1})
                         : t == DType::u8      ? kk::Scalar(std::int64_t{200})
                         : t == DType::i32     ? kk::Scalar(std::int64_t{-123456})
                         : t == DType::boolean ? kk::Scalar(0.5)
                                               : kk::Scalar(-1.5);
    for (auto [kind, shape, view] : {std::tuple{"contiguous", kBig, View::contiguous},
                                     std::tuple{"unaligned", kLine, View::offset},
                                     std::tuple{"padded", kSmall, View::padded}}) {
      Buffer y = make_buffer(t, shape, view, rng);
      kk::launch_fill(t, y.operand(), shape, v, stream());
      const double want = t == DType::i64 ? static_cast<double>(v.i) : v.f;
      check_output(case_name("fill", {t}, kind, shape), y, shape, [&](const auto&) { return want; },
                   [](const auto&) { return std::string("none"); });
      if (t == DType::i64) {
        Bytes got = y.download();
        CHECK(raw<std::int64_t>(got, static_cast<std::size_t>(y.offset)) == (1ll << 60) + 1);  // beyond 53 bits
      }
    }
  }
}

TEST_CASE("where selects per element with broadcast conditions for every dtype") {
  if (!kernel_selected("where")) return;
  Rng rng{11};
  struct Case {
    const char* kind;
    Shape shape;
    View c, a, b, y;
  };
  const Case cases[] = {
      {"contiguous", kBig, View::contiguous, View::contiguous, View::contiguous, View::contiguous},
      {"unaligned", kLine, View::offset, View::contiguous, View::offset, View::contiguous},
      {"broadcast", kSmall, View::broadcast, View::permuted, View::scalar, View::padded}};
  for (DType t : kAllDTypes) {
    for (const Case& c : cases) {
      Buffer cond = make_buffer(DType::boolean, c.shape, c.c, rng);
      Buffer a = make_buffer(t, c.shape, c.a, rng);
      Buffer b = make_buffer(t, c.shape, c.b, rng);
      Buffer y = make_buffer(t, c.shape, c.y, rng);
      kk::launch_where(t, cond.operand(), a.operand(), b.operand(), y.operand(), c.shape, stream());
      auto cv = [&](const std::vector<std::int64_t>& i) { return load(DType::boolean, cond.host, cond.element(i)); };
      auto av = [&](const std::vector<std::int64_t>& i) { return load(t, a.host, a.element(i)); };
      auto bv = [&](const std::vector<std::int64_t>& i) { return load(t, b.host, b.element(i)); };
      check_output(case_name("where", {t}, c.kind, c.shape), y, c.shape,
                   [&](const auto& i) { return cv(i) != 0 ? av(i) : bv(i); },
                   [&](const auto& i) { return fmt(cv(i)) + " ? " + fmt(av(i)) + " : " + fmt(bv(i)); });
    }
  }
}

TEST_CASE("empty shapes launch nothing; 0-d and one-element shapes launch one element") {
  Rng rng{3};
  Buffer y = make_buffer(DType::f32, {4}, View::contiguous, rng);
  const Shape empty{0, 4};
  kk::launch_fill(DType::f32, y.operand(), empty, kk::Scalar(1.0), stream());
  kk::launch_unary(kk::kernel("exp"), DType::f32, DType::f32, y.operand(), y.operand(), empty, 0, 0, stream());
  CHECK(y.download() == y.host);

  for (const Shape& shape : {Shape{}, Shape{1}, Shape{1, 1, 1}}) {
    Buffer x = make_buffer(DType::f32, shape, View::contiguous, rng);  // holds NaN
    Buffer z = make_buffer(DType::f32, shape, View::offset, rng);
    kk::launch_binary_scalar(kk::kernel("maximum"), DType::f32, DType::f32, x.operand(), kk::Scalar(1.0), false,
                             z.operand(), shape, stream());
    check_output(case_name("maximum", {DType::f32, DType::f32}, "one_element", shape), z, shape,
                 [](const auto&) { return NAN; }, [](const auto&) { return std::string("NaN"); });
  }
}

TEST_CASE("strided kernels index past 2^32 elements") {
  if (!kernel_selected("fill")) return;
  // u8 view of shape [65537, 65536] whose rows are padded to 65537 bytes: 2^32 + 2^16
  // elements, so the kernel takes its 64-bit path; the padding column must stay 0.
  const std::int64_t rows = 65537, cols = 65536, pitch = cols + 1;
  rt::DeviceBuffer buf(static_cast<std::size_t>(rows * pitch), stream());
  rt::memset_device(buf.ptr(), 0, buf.bytes(), stream());
  kk::Operand y{buf.ptr(), {pitch, 1}};
  const Shape shape{rows, cols};
  kk::launch_fill(DType::u8, y, shape, kk::Scalar(std::int64_t{7}), stream());
  for (std::int64_t row : {std::int64_t{0}, std::int64_t{32768}, rows - 2, rows - 1}) {
    Bytes got(static_cast<std::size_t>(pitch));
    rt::copy_to_host(got.data(), buf.ptr() + static_cast<std::uint64_t>(row * pitch), got.size(), stream());
    CAPTURE(row);
    CHECK(std::count(got.begin(), got.end() - 1, 7) == cols);
    CHECK(got.back() == 0);
  }
}
