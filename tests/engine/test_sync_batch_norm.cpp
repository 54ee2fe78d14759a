// dist::SyncBatchNorm without NCCL: construction, names and errors, convert_sync_batchnorm, and
// the op's math over several ranks, with threads as ranks exchanging CPU tensors through the
// op's Collectives interface, against batch_norm on the global batch.
#include <doctest/doctest.h>

#include <barrier>
#include <exception>
#include <thread>

#include "dist/sync_batch_norm_op.h"
#include "error_message.h"
#include "kiln/dist/sync_batch_norm.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::message_of;

namespace {

std::vector<std::string> names(const nn::NamedTensors& ts) {
  std::vector<std::string> out;
  for (const auto& t : ts) out.push_back(t.first);
  return out;
}

double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  if (a.numel() == 0) return 0;
  return max(abs(a.to(DType::f64) - b.to(DType::f64))).item<double>();
}

// Ranks as threads of one process: each collective waits for all of them at a barrier.
struct Exchange {
  explicit Exchange(int n) : world(n), sync(n), slots(static_cast<std::size_t>(n)) {}
  int world;
  std::barrier<> sync;
  std::vector<Tensor> slots;
};

class ThreadRank : public dist::detail::Collectives {
 public:
  ThreadRank(std::shared_ptr<Exchange> ex, int rank) : ex_(std::move(ex)), rank_(static_cast<std::size_t>(rank)) {}
  int world_size() const override { return ex_->world; }
  Device device() const override { return Device::cpu(); }
  void all_gather(const Tensor& in, Tensor& out) override {
    ex_->slots[rank_] = in.clone();
    ex_->sync.arrive_and_wait();
    Tensor all = stack(ex_->slots);
    ex_->sync.arrive_and_wait();  // every rank has read the slots before the next collective writes them
    out.copy_(reshape(all, out.shape()));
  }
  void all_reduce_sum(Tensor& t) override {
    ex_->slots[rank_] = t.clone();
    ex_->sync.arrive_and_wait();
    Tensor total = ex_->slots[0];
    for (std::size_t r = 1; r < ex_->slots.size(); ++r) total = total + ex_->slots[r];
    ex_->sync.arrive_and_wait();
    t.copy_(total);
  }

 private:
  std::shared_ptr<Exchange> ex_;
  std::size_t rank_;
};

Tensor leaf_copy(const Tensor& t) {
  Tensor c = t.detach().clone();
  c.requires_grad_(true);
  return c;
}

}  // namespace

TEST_CASE("SyncBatchNorm has BatchNorm2d's parameters and buffers, and its eval mode") {
  dist::ProcessGroup empty;  // never used: eval mode does not communicate
  dist::SyncBatchNorm sbn(3, empty);
  nn::BatchNorm2d bn(3);
  CHECK(names(sbn.state()) == names(bn.state()));
  CHECK(names(sbn.state()) ==
        std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  CHECK(sbn.describe() == "SyncBatchNorm(3, eps=1e-05, momentum=0.1)");

  Generator gen(3);
  const Tensor x = randn({2, 3, 4, 5}, {.dtype = DType::f64}, &gen);
  bn.eval();
  sbn.eval();
  CHECK(max_diff(sbn(x), bn(x.to(DType::f32))) < 1e-6);
  CHECK(sbn.forward(x, Activation::relu).to_vector<double>() == relu(sbn(x)).to_vector<double>());

  // In a Sequential a ReLU after it runs in its kernels, as after a BatchNorm2d.
  auto shared = std::make_shared<dist::SyncBatchNorm>(3, empty);
  nn::Sequential net;
  net.push_back(shared);
  net.push_back(nn::ReLU());
  net.eval();
  const Tensor y = net(leaf_copy(x));
  CHECK(y.grad_fn()->name() == "batch_norm");
  CHECK(y.to_vector<double>() == relu(sbn(x)).to_vector<double>());
}

TEST_CASE("SyncBatchNorm: bad arguments and inputs are typed errors naming the module") {
  dist::ProcessGroup empty;
  CHECK(message_of<ValueError>([&] { dist::SyncBatchNorm(0, empty); }).find("[dist.SyncBatchNorm] channels") == 0);
  CHECK(message_of<ValueError>([&] { dist::SyncBatchNorm(3, empty, 0.0); }).find("[dist.SyncBatchNorm] eps") == 0);
  CHECK(message_of<ValueError>([&] { dist::SyncBatchNorm(3, empty, 1e-5, 1.5); }).find("momentum") !=
        std::string::npos);
  dist::SyncBatchNorm sbn(3, empty);
  CHECK(message_of<ShapeError>([&] {
          sbn(zeros({2, 3, 4}));
        }).find("[dist.SyncBatchNorm] expected input (N, 3, H, W)") == 0);
  CHECK(message_of<ShapeError>([&] { sbn(zeros({2, 4, 1, 1})); }).find("got (2,4,1,1)") != std::string::npos);
  // Training needs the group; an empty one says so.
  CHECK(message_of<ValueError>([&] {
          sbn(zeros({2, 3, 2, 2}));
        }).find("this ProcessGroup is empty") != std::string::npos);
}

TEST_CASE("convert_sync_batchnorm swaps BatchNorm2d layers, nested ones too, keeping their tensors") {
  dist::ProcessGroup empty;
  Generator gen(1);
  auto inner = std::make_shared<nn::Sequential>(nn::BatchNorm2d(4));
  nn::Sequential net(nn::Conv2d(1, 4, {3}, {}, false, &gen), nn::BatchNorm2d(4, 1e-3, 0.2), nn::ReLU());
  net.push_back(inner);
  net.eval();
  const nn::NamedTensors before = net.state();
  CHECK(dist::convert_sync_batchnorm(net, empty) == 2);
  const nn::NamedTensors after = net.state();
  REQUIRE(names(after) == names(before));
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i].second.is_same(before[i].second));
  CHECK(net[1].describe() == "SyncBatchNorm(4, eps=0.001, momentum=0.2)");
  CHECK_FALSE(net[1].is_training());
  CHECK((*inner)[0].describe().find("SyncBatchNorm(4") == 0);
  CHECK(dist::convert_sync_batchnorm(net, empty) == 0);
  CHECK(message_of<ValueError>([&] { net.replace(9, std::make_shared<nn::ReLU>()); }).find("out of range") !=
        std::string::npos);
}

// Rank r holds rows [begin_r, end_r) of the global batch (unequal counts, even none) and its own copies of
// the parameters and running statistics; its loss is sum(y_r * c_r), so the ranks' losses add up
// to the global one and the sum over ranks of a parameter's gradient is the global gradient.
TEST_CASE("sync_batch_norm over 2 and 3 thread ranks (one without rows) == batch_norm on the global batch (f64)") {
  Generator gen(11);
  const Tensor x = randn({7, 3, 2, 3}, {.dtype = DType::f64}, &gen) * 3.0 + 5.0;
  const Tensor c = randn({7, 3, 2, 3}, {.dtype = DType::f64}, &gen);
  const Tensor w0 = rand({3}, {.dtype = DType::f64}, &gen) + 0.5, b0 = randn({3}, {.dtype = DType::f64}, &gen);
  const Tensor rm0 = randn({3}, {.dtype = DType::f64}, &gen), rv0 = rand({3}, {.dtype = DType::f64}, &gen) + 1.0;
  for (Activation act : {Activation::none, Activation::relu}) {
    for (const std::vector<std::int64_t>& bounds : {std::vector<std::int64_t>{0, 3, 7}, {0, 1, 4, 7}, {0, 0, 2, 7}}) {
      const int world = static_cast<int>(bounds.size()) - 1;
      CAPTURE(world);
      CAPTURE(static_cast<int>(act));
      Tensor gx = leaf_copy(x), gw = leaf_copy(w0), gb = leaf_copy(b0), grm = rm0.clone(), grv = rv0.clone();
      const Tensor gy = batch_norm(gx, grm, grv, gw, gb, true, 0.1, 1e-5, act);
      sum(gy * c).backward();

      auto ex = std::make_shared<Exchange>(world);
      std::vector<std::unique_ptr<dist::detail::CollectivesHandle>> handles;
      for (int r = 0; r < world; ++r)
        handles.push_back(std::make_unique<dist::detail::CollectivesHandle>(std::make_shared<ThreadRank>(ex, r)));
      std::vector<Tensor> xs, ws, bs, rms, rvs, ys;
      for (int r = 0; r < world; ++r) {
        const std::int64_t lo = bounds[static_cast<std::size_t>(r)], n = bounds[static_cast<std::size_t>(r) + 1] - lo;
        xs.push_back(leaf_copy(narrow(x, 0, lo, n)));
        ws.push_back(leaf_copy(w0));
        bs.push_back(leaf_copy(b0));
        rms.push_back(rm0.clone());
        rvs.push_back(rv0.clone());
        ys.emplace_back();
      }
      std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          const auto i = static_cast<std::size_t>(r);
          try {
            ys[i] =
                dist::detail::sync_batch_norm(xs[i], rms[i], rvs[i], ws[i], bs[i], 0.1, 1e-5, act, handles[i]->id());
            const std::int64_t lo = bounds[i], n = bounds[i + 1] - lo;
            sum(ys[i] * narrow(c, 0, lo, n)).backward();
          } catch (...) {
            errors[i] = std::current_exception();
          }
        });
      for (std::thread& t : threads) t.join();
      for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);

      Tensor dw = zeros_like(w0), db = zeros_like(b0);
      for (int r = 0; r < world; ++r) {
        const auto i = static_cast<std::size_t>(r);
        const std::int64_t lo = bounds[i], n = bounds[i + 1] - lo;
        CHECK(max_diff(ys[i], narrow(gy, 0, lo, n)) < 1e-12);
        CHECK(max_diff(xs[i].grad(), narrow(gx.grad(), 0, lo, n)) < 1e-12);
        CHECK(max_diff(rms[i], grm) < 1e-12);
        CHECK(max_diff(rvs[i], grv) < 1e-12);
        dw = dw + ws[i].grad();
        db = db + bs[i].grad();
      }
      CHECK(max_diff(dw, gw.grad()) < 1e-12);
      CHECK(max_diff(db, gb.grad()) < 1e-12);
    }
  }
}

TEST_CASE("sync_batch_norm: a graph whose group handle is gone says so in its backward") {
  Tensor x = leaf_copy(randn({4, 2, 3, 3}, {.dtype = DType::f64}));
  Tensor y;
  {
    auto ex = std::make_shared<Exchange>(1);
    dist::detail::CollectivesHandle handle(std::make_shared<ThreadRank>(ex, 0));
    y = dist::detail::sync_batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, 1e-5, Activation::none,
                                      handle.id());
  }
  CHECK(message_of<ValueError>([&] { sum(y * y).backward(); }).find("[sync_batch_norm] process group handle") == 0);
}
