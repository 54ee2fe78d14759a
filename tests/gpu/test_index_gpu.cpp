// The index and join ops on the GPU against the CPU reference on the same inputs: gather,
// index_select, scatter_add, one_hot, cat, pad and the view ops, every dtype each kernel
// takes, contiguous and non-contiguous (transposed, step-sliced) inputs, i32 indices,
// and gradients through them on the device.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kiln/kiln.h"
#include "gpu_match.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;
using Ints = std::vector<std::int64_t>;

// Values in f64 on the host, row-major.
std::vector<double> host_f64(const Tensor& t) { return t.to(Device::cpu()).to(DType::f64).to_vector<double>(); }

// GPU result against the CPU one: same shape and dtype, values within tol (exact by default);
// the first mismatches are printed with their flat index.
void check_close(const Tensor& cpu, const Tensor& gpu, const std::string& name, double tol = 0) {
  CAPTURE(name);
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(cpu.shape() == gpu.shape());
  REQUIRE(cpu.dtype() == gpu.dtype());
  const auto a = host_f64(cpu), b = host_f64(gpu);
  int shown = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool ok = std::fabs(a[i] - b[i]) <= tol * (1 + std::fabs(a[i])) || (std::isnan(a[i]) && std::isnan(b[i]));
    if (!ok && shown++ < 5) FAIL_CHECK(name << " at " << i << ": cpu " << a[i] << ", gpu " << b[i]);
  }
  CHECK(shown == 0);
}

Tensor values(Shape s, DType dt, std::uint64_t seed) {
  Generator g(seed);
  Tensor r = randn(s, {.dtype = DType::f32}, &g) * 4.0;
  return (is_floating(dt) ? r : r.to(DType::i64)).to(dt);
}

Tensor indices(Shape s, std::int64_t high, std::uint64_t seed, DType dt = DType::i64) {
  Generator g(seed);
  return randint(0, high, s, {.dtype = dt}, &g);
}

const std::vector<DType> kValueTypes{DType::f32, DType::f64, DType::f16, DType::bf16,
                                     DType::i32, DType::i64, DType::u8,  DType::boolean};
const std::vector<DType> kScatterTypes{DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};

std::string tag(const char* op, DType dt, const char* layout) {
  return std::string(op) + "(dtype=" + std::string(dtype_name(dt)) + ", " + layout + ")";
}

}  // namespace

TEST_CASE("gather and index_select on the GPU match the CPU") {
  for (DType dt : kValueTypes) {
    Tensor x = values({5, 7, 11}, dt, 1);
    Tensor xt = permute(x, {2, 0, 1});                          // (11,5,7), transposed
    Tensor xs = slice(slice(x, 0, 1, kEnd, 2), 2, 0, kEnd, 3);  // (2,7,4), stepped
    Tensor idx = indices({5, 3, 11}, 7, 2);
    check_close(gather(x, 1, idx), gather(x.to(kGpu), 1, idx.to(kGpu)), tag("gather", dt, "contiguous"));
    Tensor it = indices({11, 5, 4}, 5, 3, DType::i32);
    check_close(gather(xt, 1, it), gather(xt.to(kGpu), 1, it.to(kGpu)), tag("gather", dt, "i32 index"));
    // A device view: permute of the device copy keeps the strides.
    Tensor xg = x.to(kGpu);
    check_close(gather(xt, 0, indices({3, 5, 7}, 11, 4)),
                gather(permute(xg, {2, 0, 1}), 0, indices({3, 5, 7}, 11, 4).to(kGpu)), tag("gather", dt, "transposed"));
    Tensor is = permute(indices({4, 7, 2}, 2, 5), {2, 1, 0});  // non-contiguous index
    check_close(gather(xs, 0, is), gather(slice(slice(xg, 0, 1, kEnd, 2), 2, 0, kEnd, 3), 0, is.to(kGpu)),
                tag("gather", dt, "stepped input and transposed index"));

    Tensor sel = indices({9}, 11, 6);
    check_close(index_select(x, 2, sel), index_select(xg, 2, sel.to(kGpu)), tag("index_select", dt, "contiguous"));
    Tensor sel_step = slice(indices({12}, 5, 7), 0, 1, kEnd, 3);
    check_close(index_select(xt, 1, sel_step), index_select(permute(xg, {2, 0, 1}), 1, sel_step.to(kGpu)),
                tag("index_select", dt, "transposed input, stepped index"));
  }
}

TEST_CASE("scatter_add on the GPU matches the CPU, with f32 accumulation for f16/bf16") {
  for (DType dt : kScatterTypes) {
    // Few targets, many sources: atomics collide. Integer sums are exact; float sums differ
    // from the CPU's order only by rounding.
    const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f64 ? 1e-12 : is_floating(dt) ? 1e-2 : 0;
    Tensor self = values({4, 6}, dt, 10), src = values({40, 6}, dt, 11);
    Tensor idx = indices({40, 6}, 4, 12);
    check_close(scatter_add(self, 0, idx, src), scatter_add(self.to(kGpu), 0, idx.to(kGpu), src.to(kGpu)),
                tag("scatter_add", dt, "contiguous"), tol);
    // Transposed self and src, index smaller than src, i32 index.
    Tensor st = permute(values({6, 4}, dt, 13), {1, 0});
    Tensor srct = permute(values({9, 5}, dt, 14), {1, 0});
    Tensor it = indices({3, 7}, 6, 15, DType::i32);
    check_close(scatter_add(st, 1, it, srct),
                scatter_add(permute(values({6, 4}, dt, 13).to(kGpu), {1, 0}), 1, it.to(kGpu),
                            permute(values({9, 5}, dt, 14).to(kGpu), {1, 0})),
                tag("scatter_add", dt, "transposed"), tol);
    // index_select's backward pattern: a broadcast (stride-0) index.
    Tensor bi = broadcast_to(reshape(indices({5}, 3, 16), {1, 5}), {4, 5});
    Tensor s2 = values({4, 5}, dt, 17);
    check_close(scatter_add(zeros({4, 3}, {.dtype = dt}), 1, bi, s2),
                scatter_add(zeros({4, 3}, {.dtype = dt, .device = kGpu}), 1,
                            broadcast_to(reshape(indices({5}, 3, 16).to(kGpu), {1, 5}), {4, 5}), s2.to(kGpu)),
                tag("scatter_add", dt, "broadcast index"), tol);
  }
  // 2048 + 1 + 1 in f16 stays 2048 when rounded at every step; f32 scratch gives 2050.
  Tensor h =
      scatter_add(full({1}, 2048.0, {.dtype = DType::f16, .device = kGpu}), 0,
                  zeros({2}, {.dtype = DType::i64, .device = kGpu}), ones({2}, {.dtype = DType::f16, .device = kGpu}));
  CHECK(host_f64(h)[0] == 2050);
}

TEST_CASE("one_hot on the GPU matches the CPU") {
  Tensor idx = indices({3, 5, 7}, 6, 20);
  check_close(one_hot(idx, 6), one_hot(idx.to(kGpu), 6), "one_hot(contiguous)");
  Tensor it = permute(indices({7, 5}, 4, 21, DType::i32), {1, 0});
  check_close(one_hot(it, 4), one_hot(it.to(kGpu), 4), "one_hot(i32, transposed)");
  Tensor gt = permute(indices({7, 5}, 4, 21).to(kGpu), {1, 0});
  check_close(one_hot(permute(indices({7, 5}, 4, 21), {1, 0}), 4), one_hot(gt, 4), "one_hot(device view)");
  // Out of range on the device is documented as a zero row (no sync to check it).
  Tensor bad = from_vector(std::vector<std::int64_t>{1, 9}).to(kGpu);
  CHECK(host_f64(one_hot(bad, 3)) == std::vector<double>{0, 1, 0, 0, 0, 0});
}

TEST_CASE("cat, stack and pad on the GPU match the CPU") {
  for (DType dt : kValueTypes) {
    Tensor a = values({5, 7, 11}, dt, 30), b = values({5, 2, 11}, dt, 31);
    Tensor c = permute(values({11, 3, 5}, dt, 32), {2, 1, 0});  // (5,3,11) transposed
    Tensor ag = a.to(kGpu), bg = b.to(kGpu);
    Tensor cg = permute(values({11, 3, 5}, dt, 32).to(kGpu), {2, 1, 0});
    check_close(cat({a, b, c}, 1), cat({ag, bg, cg}, 1), tag("cat", dt, "mixed layouts"));
    check_close(cat({slice(a, 2, 0, kEnd, 2), slice(a, 2, 1, kEnd, 2)}, -1),
                cat({slice(ag, 2, 0, kEnd, 2), slice(ag, 2, 1, kEnd, 2)}, -1), tag("cat", dt, "stepped"));
    check_close(stack({a, a}, 3), stack({ag, ag}, 3), tag("stack", dt, "contiguous"));
    check_close(pad(c, {1, 2, 0, 3, 2, 0}, 1), pad(cg, {1, 2, 0, 3, 2, 0}, 1), tag("pad", dt, "transposed"));
    check_close(pad(slice(a, 1, 1, kEnd, 3), {2, 2}), pad(slice(ag, 1, 1, kEnd, 3), {2, 2}), tag("pad", dt, "stepped"));
  }
  check_close(
      cat({ones({2}, {.dtype = DType::i32}), full({1}, 2.5, {.dtype = DType::f16})}),
      cat({ones({2}, {.dtype = DType::i32, .device = kGpu}), full({1}, 2.5, {.dtype = DType::f16, .device = kGpu})}),
      "cat(i32 + f16 promoted)");
}

TEST_CASE("views of device tensors share storage and need no kernel") {
  Tensor x = zeros({4, 6}, {.device = kGpu});
  Tensor v = slice(transpose(x, 0, 1), 0, 1, kEnd, 2);
  v.fill_(3);
  CHECK(host_f64(x)[1] == 3);
  CHECK(host_f64(x)[0] == 0);
  CHECK(v.shares_storage(x));
  auto parts = chunk(x, 3, 1);
  CHECK(parts[2].offset() == 4);
  check_close(contiguous(v).to(Device::cpu()), contiguous(v), "contiguous(view) round trip");
}

TEST_CASE("gradients through the index and join ops on the GPU match finite differences") {
  auto on_gpu = [](Tensor t) { return t.to(kGpu); };
  Generator g(40);
  Tensor x = on_gpu(randn({3, 4}, {.dtype = DType::f64}, &g));
  Tensor idx = on_gpu(from_vector(std::vector<std::int64_t>{3, 0, 3, 1, 2, 2}, {3, 2}));
  auto check = [](const testing::SingleFn& f, const std::vector<Tensor>& in, const char* what) {
    auto r = testing::gradcheck(f, in);
    CHECK_MESSAGE(r.ok, what << ": " << r.message);
  };
  check([&](const auto& v) { return gather(v[0], 1, idx); }, {x}, "gather");
  check(
      [&](const auto& v) {
        return index_select(v[0], 1, on_gpu(from_vector(std::vector<std::int64_t>{1, 1, 3})));
      },
      {x}, "index_select");
  check([&](const auto& v) { return scatter_add(v[0], 1, idx, v[1]); },
        {x, on_gpu(randn({3, 2}, {.dtype = DType::f64}, &g))}, "scatter_add");
  check([&](const auto& v) { return cat({transpose(v[0], 0, 1), v[0].reshape({4, 3})}, 1); }, {x}, "cat");
  check([&](const auto& v) { return pad(slice(v[0], 1, 0, kEnd, 2), {1, 1, 2, 0}, 0.5); }, {x}, "pad of a slice");
  check([&](const auto& v) { return stack({v[0], v[0] * 2.0}, 0); }, {x}, "stack");
}
