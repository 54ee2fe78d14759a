#include "distributed.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace mnist {

using namespace kiln;

bool launched() { return std::getenv("WORLD_SIZE") != nullptr; }

Distributed join_if_launched() {
  Distributed d;
  if (!launched()) return d;
  try {
    d.group.emplace(dist::ProcessGroup::init());
  } catch (const Error& e) {
    if (cuda_device_count() > 0) throw;
    throw DeviceError(std::string("[mnist-train] started by a launcher (WORLD_SIZE is set), which runs one rank per "
                                  "GPU, but this machine has no usable GPU; run mnist-train without the launcher to "
                                  "train on the CPU (") +
                      e.what() + ")");
  }
  d.rank = d.group->rank();
  d.world = d.group->world_size();
  return d;
}

std::pair<std::int64_t, std::int64_t> rows_of(std::int64_t len, int rank, int world) {
  if (len % world == 0) return dist::shard(len, rank, world);
  const std::int64_t base = len / world, extra = len % world;
  const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void check_same_epoch(dist::ProcessGroup& group, int epoch) {
  Tensor mine = full({1}, epoch, {.dtype = DType::i64, .device = group.device()});
  Tensor all = empty({group.world_size()}, {.dtype = DType::i64, .device = group.device()});
  group.all_gather(mine, all);
  const std::vector<std::int64_t> epochs = all.to_vector<std::int64_t>();
  for (std::size_t r = 1; r < epochs.size(); ++r)
    if (epochs[r] != epochs[0])
      throw ValueError("[mnist-train] --resume: rank " + std::to_string(r) + " continues after epoch " +
                       std::to_string(epochs[r]) + ", rank 0 after epoch " + std::to_string(epochs[0]) +
                       "; every rank must see the same checkpoint");
}

void broadcast_state(dist::ProcessGroup& group, const nn::Module& model) {
  NoGradGuard no_grad;
  for (const auto& named : model.state()) {
    Tensor t = named.second.detach();
    group.broadcast(t, 0);
  }
}

}  // namespace mnist
