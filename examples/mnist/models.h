#pragma once
// The trainer's two networks; both take (B, 1, 28, 28) and return logits (B, 10).
#include <memory>
#include <string>

#include <kiln/kiln.h>

namespace mnist {

// MNIST's pixel statistics: the networks take (x / 255 - kMean) / kStd.
inline constexpr double kMean = 0.1307, kStd = 0.3081;

// mlp: 784-512-512-10 with ReLU. cnn: two conv5x5 + batch-norm + ReLU + max-pool stages
// (32 and 64 channels), then 3136-128-10. ValueError for another name.
std::shared_ptr<kiln::nn::Sequential> make_model(const std::string& name, kiln::Generator& gen);

}  // namespace mnist
