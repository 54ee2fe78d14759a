// dist::SyncBatchNorm on GPUs. One GPU (a world of 1 through NCCL): the same checks the
// kiln_test_helper sync-bn ranks run (sync_bn_check.cpp: outputs, running statistics and
// gradients against BatchNorm2d, eager and compiled, f64/f32/bf16) in this process, and a
// gradient check in f64 against finite differences. Two GPUs: kiln-run -n 2 of that helper, each
// rank on half the global batch against BatchNorm2d on the whole of it. Skips with a message
// without NCCL, or without a second GPU or kiln-run for the two-GPU case.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "dist/sync_batch_norm_op.h"
#include "error_message.h"
#include "gradcheck.h"
#include "kiln/dist.h"
#include "kiln/dist/sync_batch_norm.h"
#include "kiln/kiln.h"
#include "nccl_or_skip.h"
#include "process.h"
#include "scoped_env.h"

int sync_bn_check();  // tests/support/sync_bn_check.cpp

using namespace kiln;

TEST_CASE("SyncBatchNorm (world of 1) == BatchNorm2d: outputs, running stats, gradients, eager and compiled") {
  if (!kiln_test::nccl_or_skip()) return;
  kiln_test::ScopedEnv env{{"RANK", "0"},
                           {"WORLD_SIZE", "1"},
                           {"LOCAL_RANK", "0"},
                           {"KILN_DIST_ID_FILE", std::nullopt},
                           {"MASTER_ADDR", std::nullopt},
                           {"MASTER_PORT", std::nullopt}};
  CHECK(sync_bn_check() == 0);  // prints its mismatches
}

TEST_CASE("sync_batch_norm (world of 1) on the GPU: gradients against finite differences in f64; device errors") {
  if (!kiln_test::nccl_or_skip()) return;
  dist::ProcessGroup pg = dist::ProcessGroup::init({.env = dist::Env{}});
  const Device dev = pg.device();
  dist::detail::CollectivesHandle handle(dist::detail::group_collectives(pg));
  Generator gen(8);
  const Tensor x = (randn({3, 2, 4, 5}, {.dtype = DType::f64}, &gen) + 2.0).to(dev);
  const Tensor w = (rand({2}, {.dtype = DType::f64}, &gen) + 0.5).to(dev),
               b = randn({2}, {.dtype = DType::f64}, &gen).to(dev);
  for (Activation act : {Activation::none, Activation::relu}) {
    CAPTURE(static_cast<int>(act));
    const auto r = kiln::testing::gradcheck(
        [&](const std::vector<Tensor>& in) {
          return dist::detail::sync_batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], 0.1, 1e-5, act, handle.id());
        },
        {x, w, b});
    CHECK_MESSAGE(r.ok, r.message);
  }
  // A training input on another device than the group's is an error naming both.
  dist::SyncBatchNorm sbn(2, pg);
  const std::string msg = kiln_test::message_of<DeviceError>([&] { sbn(ones({2, 2, 3, 3})); });
  CHECK(msg.find("[dist.SyncBatchNorm] the input is on cpu; the process group's device is cuda:") == 0);
}

TEST_CASE("SyncBatchNorm on two GPUs == BatchNorm2d on the global batch on one GPU (kiln-run -n 2)") {
  if (!kiln_test::nccl_or_skip()) return;
  if (cuda_device_count() < 2) {
    MESSAGE("skipped: needs two GPUs, found " << cuda_device_count());
    return;
  }
  if (std::string(KILN_RUN_PATH).empty() || !std::filesystem::exists(KILN_RUN_PATH)) {
    MESSAGE("skipped: kiln-run was not built (ninja kiln-run)");
    return;
  }
  const kiln_test::ProcessResult r =
      kiln_test::run_process({KILN_RUN_PATH, "-n", "2", "--", KILN_TEST_HELPER_PATH, "sync-bn"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("sync-bn rank 0 of 2") != std::string::npos);
  CHECK(r.out.find("sync-bn rank 1 of 2") != std::string::npos);
  CHECK(r.out.find("MISMATCH") == std::string::npos);
}
