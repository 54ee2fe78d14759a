// kiln::dist through NCCL on one GPU: a world of 1 (every collective is the identity there), set
// up from the environment with the file rendezvous, eager and inside a compiled step. Skips with
// a message when libnccl.so.2 does not load.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/dist.h"
#include "kiln/kiln.h"
#include "nccl_or_skip.h"
#include "world_of_one.h"

using namespace kiln;
using namespace kiln::dist;
using kiln_test::message_of;

namespace {

const std::vector<float> kValues{1.5f, -2.f, 3.25f, 4.f, 0.f, -0.5f};  // exact in bf16 and f16

}  // namespace

TEST_CASE("dist (world of 1): all_reduce sum/avg/max, broadcast and all_gather on f32 and bf16 keep the values") {
  if (!kiln_test::nccl_or_skip()) return;
  kiln_test::WorldOfOne world;
  ProcessGroup& pg = world.group;
  CHECK(pg.rank() == 0);
  CHECK(pg.world_size() == 1);
  CHECK(pg.device() == Device::cuda(0));
  CHECK_FALSE(std::filesystem::exists(world.tmp.file("nccl-id")));  // written by rank 0, removed once all joined
  MESSAGE("NCCL " << nccl_version());
  const Device dev = pg.device();

  for (DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    const Tensor host = from_vector(kValues, {2, 3}).to(dt);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
      CAPTURE(static_cast<int>(op));
      Tensor t = host.to(dev);
      const std::uint64_t version = t.version();
      pg.all_reduce(t, op);
      CHECK(t.version() > version);  // autograd sees the in-place write
      CHECK(t.to(Device::cpu()).to_vector<float>() == kValues);
    }
    Tensor b = host.to(dev);
    pg.broadcast(b, 0);
    CHECK(b.to(Device::cpu()).to_vector<float>() == kValues);
    Tensor gathered = zeros({1, 2, 3}, {.dtype = dt, .device = dev});
    pg.all_gather(host.to(dev), gathered);
    CHECK(gathered.to(Device::cpu()).to_vector<float>() == kValues);
  }
  for (DType dt : {DType::f16, DType::f64, DType::i32, DType::i64, DType::u8}) {
    CAPTURE(dtype_name(dt));
    Tensor t = from_vector(std::vector<float>{1, 2, 3}, {3}).to(dt).to(dev);
    pg.all_reduce(t);
    CHECK(t.to(Device::cpu()).to_vector<float>() == std::vector<float>{1, 2, 3});
  }
  pg.watch("the eager collectives");
  synchronize(dev);
  pg.check();
  CHECK_FALSE(pg.failed());
}

TEST_CASE("dist (world of 1): wrong device, dtype, layout, root or size are typed errors naming the op") {
  if (!kiln_test::nccl_or_skip()) return;
  ProcessGroup pg = ProcessGroup::init({.env = Env{}, .device = Device::cuda(0)});
  const Device dev = pg.device();
  Tensor cpu = zeros({4});
  CHECK(message_of<DeviceError>([&] { pg.all_reduce(cpu); }).find("[dist.all_reduce] the tensor is on cpu") == 0);
  Tensor flags = zeros({4}, {.dtype = DType::boolean, .device = dev});
  CHECK(message_of<DTypeError>([&] { pg.broadcast(flags, 0); }).find("[dist.broadcast] dtype bool") == 0);
  Tensor strided = transpose(zeros({2, 3}, {.device = dev}), 0, 1);
  CHECK(message_of<ValueError>([&] { pg.all_reduce(strided); }).find("is not contiguous") != std::string::npos);
  Tensor t = zeros({4}, {.device = dev});
  CHECK(message_of<ValueError>([&] { pg.broadcast(t, 1); }).find("[dist.broadcast] root 1") == 0);
  Tensor small = zeros({3}, {.device = dev});
  CHECK_THROWS_AS(pg.all_gather(t, small), ShapeError);
  Tensor other = zeros({4}, {.dtype = DType::f64, .device = dev});
  CHECK_THROWS_AS(pg.all_gather(t, other), DTypeError);
  ProcessGroup moved = std::move(pg);
  CHECK(moved.rank() == 0);
  CHECK_THROWS_AS(pg.all_reduce(t), ValueError);  // NOLINT(bugprone-use-after-move): the moved-from group is empty
}

TEST_CASE("dist (world of 1): an all_reduce inside kiln::compile is captured and replays correctly") {
  if (!kiln_test::nccl_or_skip()) return;
  ProcessGroup pg = ProcessGroup::init({.env = Env{}});
  const Device dev = pg.device();
  CompiledFunction step = compile([&](const std::vector<Tensor>& in) {
    Tensor y = in[0] * 2.0;
    pg.all_reduce(y, ReduceOp::avg);
    y = y + 1.0;
    return std::vector<Tensor>{y};
  });
  for (int call = 0; call < 4; ++call) {
    CAPTURE(call);
    std::vector<float> x(256);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.f + static_cast<float>(call);
    const Tensor out = step({from_vector(x, {16, 16}).to(dev)})[0];
    const std::vector<float> got = out.to(Device::cpu()).to_vector<float>();
    REQUIRE(got.size() == x.size());
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(got[i] == 2 * x[i] + 1);
    pg.watch("the compiled step");
  }
  const CompileStats s = step.stats();
  CHECK(s.captures == 1);
  CHECK(s.replays == 2);
  synchronize(dev);
  pg.check();
}
