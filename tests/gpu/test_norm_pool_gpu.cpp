// batch_norm_max_pool2d's kernels (kernel_templates/norm.cu) against the two ops they replace
// on the GPU: pooled values and running statistics bit for bit, gradients within the rounding
// of a reordered sum, in f32 and in bf16 beside f32 parameters, training and eval, with the
// ReLU or not, windows that leave rows unpooled, channels of many splits; and nn::Sequential's
// compiled cnn step, which then holds neither the apply kernel nor the pool's, nor one to count
// the batches; windows in groups along a row against one a thread.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "backend/cuda/norm_kernels.h"
#include "bn_pool_run.h"
#include "conv_tf32.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln_test::check_match;
using kiln_test::f32_bits;
using kiln_test::f64_bits;
using kiln_test::kGpu;
using kiln_test::PoolRun;
using kiln_test::random_f64;
using kiln_test::run_bn_pool;

namespace {

using Dims = std::vector<std::int64_t>;

}  // namespace

TEST_CASE("batch_norm_max_pool2d on the GPU: the pooled values bit for bit as batch_norm then max_pool2d") {
  for (DType t : {DType::f32, DType::bf16})
    // The last: over 32 of the backward's splits a channel, which dx loads in two rounds.
    for (const Shape& s : {Shape{16, 8, 28, 28}, Shape{4, 3, 29, 31}, Shape{3, 5, 9, 10}, Shape{64, 2, 64, 64}})
      for (const Dims& k : {Dims{2}, Dims{3, 2}})
        for (bool training : {true, false})
          for (Activation act : {Activation::none, Activation::relu}) {
            const std::string name = std::string(dtype_name(t)) + " " + shape_str(s) + " k=" + std::to_string(k[0]) +
                                     (training ? " train" : " eval") + (act == Activation::relu ? " relu" : "");
            CAPTURE(name);
            // x in t, weight and bias in f32 (autocast's mixed precision for bf16).
            const Tensor x = random_f64(s, 1, 2.0, 0.3).to(t).to(kGpu);
            const Tensor w = random_f64({s[1]}, 2).to(DType::f32).to(kGpu);
            const Tensor b = random_f64({s[1]}, 3).to(DType::f32).to(kGpu);
            const Tensor cot = random_f64({s[0], s[1], s[2] / k[0], s[3] / k.back()}, 4).to(DType::f32).to(kGpu);
            const PoolRun fused = run_bn_pool(true, x, w, b, training, act, k, cot, DType::f32),
                          plain = run_bn_pool(false, x, w, b, training, act, k, cot, DType::f32);
            CHECK(fused.y.dtype() == t);
            CHECK(f32_bits(fused.y) == f32_bits(plain.y));
            CHECK(f32_bits(fused.running_mean) == f32_bits(plain.running_mean));
            CHECK(f32_bits(fused.running_var) == f32_bits(plain.running_var));
            // The same terms summed in another order: the rounding of t over a channel's sums.
            const double tol = t == DType::f32 ? 1e-4 : 3e-2;
            for (std::size_t i = 0; i < 3; ++i)
              check_match(plain.grads[i].to(Device::cpu()), fused.grads[i], tol, name + " grad " + std::to_string(i));
          }
}

TEST_CASE("batch_norm_max_pool2d on the GPU: windows taken in groups along a row, against one window a thread") {
  struct Restore {
    ~Restore() { kernels::set_batch_norm_pool_groups(true); }
  } restore;
  // Rows of 24 (groups of four windows), 12 (two), 10 (none: one window a thread), an odd height
  // (the forward in groups, dx not), one image.
  for (DType t : {DType::f32, DType::bf16, DType::f64})
    for (const Shape& s :
         {Shape{16, 8, 24, 24}, Shape{4, 6, 12, 12}, Shape{3, 5, 6, 10}, Shape{2, 3, 9, 8}, Shape{1, 2, 4, 16}})
      for (bool training : {true, false})
        for (Activation act : {Activation::none, Activation::relu}) {
          const std::string name = std::string(dtype_name(t)) + " " + shape_str(s) + (training ? " train" : " eval") +
                                   (act == Activation::relu ? " relu" : "");
          CAPTURE(name);
          const DType p = t == DType::bf16 ? DType::f32 : t;
          const Tensor x = random_f64(s, 31, 2.0, 0.3).to(t).to(kGpu);
          const Tensor w = random_f64({s[1]}, 32).to(p).to(kGpu), b = random_f64({s[1]}, 33).to(p).to(kGpu);
          const Tensor cot = random_f64({s[0], s[1], s[2] / 2, s[3] / 2}, 34).to(p).to(kGpu);
          kernels::set_batch_norm_pool_groups(false);
          const PoolRun single = run_bn_pool(true, x, w, b, training, act, {2}, cot, p);
          kernels::set_batch_norm_pool_groups(true);
          const PoolRun grouped = run_bn_pool(true, x, w, b, training, act, {2}, cot, p);
          CHECK(f64_bits(grouped.y) == f64_bits(single.y));
          // The backward's sums add the same terms in another order: the rounding of t over a channel.
          const double tol = t == DType::f64 ? 1e-10 : t == DType::f32 ? 1e-4 : 3e-2;
          for (std::size_t g = 0; g < 3; ++g)
            check_match(single.grads[g].to(Device::cpu()), grouped.grads[g], tol, name + " grad " + std::to_string(g));
        }
}

TEST_CASE("batch_norm_max_pool2d on the GPU is bit-identical from run to run") {
  const Tensor x = random_f64({32, 16, 14, 14}, 20).to(DType::bf16).to(kGpu);
  const Tensor w = random_f64({16}, 21).to(DType::f32).to(kGpu), b = random_f64({16}, 22).to(DType::f32).to(kGpu);
  const Tensor cot = random_f64({32, 16, 7, 7}, 23).to(DType::f32).to(kGpu);
  const PoolRun first = run_bn_pool(true, x, w, b, true, Activation::relu, {2}, cot, DType::f32);
  for (int i = 0; i < 3; ++i) {
    const PoolRun again = run_bn_pool(true, x, w, b, true, Activation::relu, {2}, cot, DType::f32);
    CHECK(f32_bits(again.y) == f32_bits(first.y));
    for (std::size_t g = 0; g < 3; ++g) CHECK(f32_bits(again.grads[g]) == f32_bits(first.grads[g]));
  }
}

TEST_CASE(
    "nn::Sequential's BatchNorm2d, ReLU, MaxPool2d on the GPU: one op, the CPU's values, two kernels fewer each way") {
  const kiln_test::ConvTF32 exact(false);  // the GPU's conv in f32, as the CPU's
  Generator gen(80);
  Generator cpu_gen(81), gpu_gen(81);  // the same weights in both nets
  auto make = [](Generator& g) {
    return nn::Sequential(nn::Conv2d(1, 8, {3}, {.padding = {1}}, true, &g), nn::BatchNorm2d(8), nn::ReLU(),
                          nn::MaxPool2d({2}), nn::Flatten(), nn::Linear(8 * 7 * 7, 10, true, &g));
  };
  nn::Sequential cpu_net = make(cpu_gen), gpu_net = make(gpu_gen);
  gpu_net.to(kGpu);
  const Tensor x = randn({16, 1, 14, 14}, {}, &gen), labels = randint(0, 10, {16}, {.dtype = DType::i64}, &gen);
  const Tensor y = gpu_net(x.to(kGpu));
  CHECK(y.grad_fn()->name() == "linear");
  check_match(cpu_net(x), y, 1e-4, "forward");

  // A compiled training step: the batch norm and the pool are two kernels forward and two backward.
  optim::SGD opt(gpu_net.parameters(), {.lr = 0.1});
  CompiledFunction step = compile([&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss = cross_entropy(gpu_net(in[0]), in[1]);
    loss.backward();
    opt.step();
    return std::vector<Tensor>{loss.detach()};
  });
  const Tensor xg = x.to(kGpu), lg = labels.to(kGpu);
  for (int i = 0; i < 4; ++i) (void)step({xg, lg});
  const CompileStats st = step.stats();
  REQUIRE(st.kernel_names_per_graph.size() == 1);
  const std::map<std::string, std::size_t>& k = st.kernel_names_per_graph[0];
  for (const char* name : {"kiln_batch_norm_stats", "kiln_batch_norm_max_pool",
                           "kiln_batch_norm_max_pool_backward_reduce", "kiln_batch_norm_max_pool_backward_dx"}) {
    CAPTURE(name);
    CHECK(k.count(name) == 1);
  }
  for (const char* name : {"kiln_batch_norm_apply", "kiln_max_pool2d", "kiln_max_pool2d_backward",
                           "kiln_batch_norm_backward_reduce", "kiln_batch_norm_backward_dx"}) {
    CAPTURE(name);
    CHECK(k.count(name) == 0);
  }
  // The statistics kernel counts the batches, in the eager call and in every replay.
  Tensor tracked;
  for (const auto& [name, t] : gpu_net.named_buffers())
    if (name == "1.num_batches_tracked") tracked = t;
  REQUIRE(tracked.defined());
  CHECK(tracked.item<std::int64_t>() == 5);  // the first forward above, then four steps
  for (int i = 0; i < 3; ++i) (void)step({xg, lg});
  CHECK(tracked.item<std::int64_t>() == 8);
}

TEST_CASE("batch_norm and batch_norm_max_pool2d on the GPU count batches in the statistics kernel, as the CPU does") {
  Generator gen(82);
  for (DType t : {DType::f32, DType::bf16, DType::f64})
    for (bool pooled : {false, true})
      for (const Shape& s : {Shape{8, 3, 6, 10}, Shape{4, 0, 4, 4}}) {
        CAPTURE(dtype_name(t));
        CAPTURE(pooled);
        CAPTURE(shape_str(s));
        const Tensor x = randn(s, {.dtype = t}, &gen);
        Tensor cpu_count = scalar_tensor(std::int64_t{41});
        Tensor gpu_count = cpu_count.to(kGpu), rm = zeros({s[1]}, {.device = kGpu}),
               rv = ones({s[1]}, {.device = kGpu});
        auto run = [&](const Tensor& in, const Tensor& m, const Tensor& v, const Tensor& count, bool training) {
          return pooled ? batch_norm_max_pool2d(in, m, v, {}, {}, training, 0.1, 1e-5, Activation::relu, {2}, count)
                        : batch_norm(in, m, v, {}, {}, training, 0.1, 1e-5, Activation::relu, count);
        };
        for (bool training : {true, true, false}) {
          const Tensor yg = run(x.to(kGpu), rm, rv, gpu_count, training);
          const Tensor yc = run(x, rm.to(Device::cpu()), rv.to(Device::cpu()), cpu_count, training);
          check_match(yc, yg, t == DType::bf16 ? 2e-2 : 1e-4, "y");
        }
        CHECK(gpu_count.item<std::int64_t>() == 43);
        CHECK(cpu_count.item<std::int64_t>() == 43);
      }
}
