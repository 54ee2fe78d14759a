#pragma once
// --checkpoint and --resume: after every epoch, one checkpoint file (written atomically) with
// everything an exact continuation of the run needs beside the model and optimizer state; and
// a run continued from such a file at its next epoch, ending with the weights an uninterrupted
// run ends with.
#include <cstdint>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "train.h"

namespace mnist {

// The objects of a run whose state a checkpoint holds; the rest follows from the options.
struct RunParts {
  kiln::nn::Module& model;
  kiln::optim::Optimizer& opt;
  kiln::optim::LrScheduler* schedule;  // null for --schedule none
  kiln::optim::GradScaler& scaler;
  kiln::Generator& init;           // the initial weights' generator
  kiln::data::DataLoader& loader;  // the training data, its order a function of (seed, epoch)
};

// How far a run got.
struct RunSoFar {
  int epoch = 0;                      // epochs done
  std::int64_t step = 0;              // training steps done
  std::vector<EpochMetrics> metrics;  // one per epoch done (rank 0's)
};

// The file to resume from: o.resume, or for "auto" o.checkpoint when it exists; empty: start afresh.
std::string resume_path(const TrainOptions& o);

// Writes `path` after so_far.epoch epochs. IoError naming the file when the write fails.
void write_checkpoint(const std::string& path, const TrainOptions& o, int world, const RunParts& run,
                      const RunSoFar& so_far);

// Loads `path` (written by write_checkpoint) into `run` and says where it stopped. ValueError
// naming --resume and the file when it cannot be read or is no such checkpoint, when it was
// written with other settings (listing those that differ), or when the data order differs.
RunSoFar resume_from(const std::string& path, const TrainOptions& o, int world, RunParts& run);

}  // namespace mnist
