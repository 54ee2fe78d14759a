#pragma once
// Data-parallel training when a launcher (kiln-run, or torchrun) started this process: one
// process per GPU, each training its slice of every global batch, gradients averaged over the
// ranks during the backward (dist::GradReducer). Rank 0 alone prints, evaluates and writes files.
#include <cstdint>
#include <optional>
#include <utility>

#include <kiln/dist.h>
#include <kiln/dist/grad_reducer.h>
#include <kiln/kiln.h>

namespace mnist {

struct Distributed {
  std::optional<kiln::dist::ProcessGroup> group;  // set when launched
  int rank = 0, world = 1;
  bool launched() const { return group.has_value(); }
  bool leader() const { return rank == 0; }
};

// Whether a launcher started this process (WORLD_SIZE is set).
bool launched();
// A process group on cuda:LOCAL_RANK when launched, else none. Without a usable GPU the error
// says that the launcher runs one rank per GPU.
Distributed join_if_launched();

// This rank's rows [begin, end) of a global batch of `len`: equal slices, and a short last batch
// of an epoch split as evenly as it goes (the first len % world ranks take one row more).
std::pair<std::int64_t, std::int64_t> rows_of(std::int64_t len, int rank, int world);

// Every rank reads a --resume checkpoint itself: ValueError on every rank unless all continue
// after the same epoch (e.g. one rank found no file under --resume auto).
void check_same_epoch(kiln::dist::ProcessGroup& group, int epoch);

// Rank 0's parameters and buffers on every rank, so all start from the same weights.
void broadcast_state(kiln::dist::ProcessGroup& group, const kiln::nn::Module& model);

}  // namespace mnist
