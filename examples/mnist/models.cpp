#include "models.h"

namespace mnist {

using namespace kiln;

std::shared_ptr<nn::Sequential> make_model(const std::string& name, Generator& gen) {
  auto net = std::make_shared<nn::Sequential>();
  if (name == "mlp") {
    net->push_back(nn::Flatten());
    net->push_back(nn::Linear(784, 512, true, &gen));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(512, 512, true, &gen));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(512, 10, true, &gen));
  } else if (name == "cnn") {
    // Batch norm follows each conv, so the convs need no bias.
    const Conv2dOptions same5{.padding = {2}};
    net->push_back(nn::Conv2d(1, 32, {5}, same5, false, &gen));
    net->push_back(nn::BatchNorm2d(32));
    net->push_back(nn::ReLU());
    net->push_back(nn::MaxPool2d({2}));  // (B, 32, 14, 14)
    net->push_back(nn::Conv2d(32, 64, {5}, same5, false, &gen));
    net->push_back(nn::BatchNorm2d(64));
    net->push_back(nn::ReLU());
    net->push_back(nn::MaxPool2d({2}));  // (B, 64, 7, 7)
    net->push_back(nn::Flatten());
    net->push_back(nn::Linear(64 * 7 * 7, 128, true, &gen));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(128, 10, true, &gen));
  } else {
    throw ValueError("[mnist-train] unknown model '" + name + "'; choose mlp or cnn");
  }
  return net;
}

}  // namespace mnist
