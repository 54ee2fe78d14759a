// PyTorch state dicts (safetensors.torch.save_file, format "pt") load into the same model:
// the committed fixture written by tools/interop/make_torch_fixture.py, and every mismatch
// named by tensor.
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/kiln.h"
#include "temp_dir.h"
#include "test_values.h"

using namespace kiln;

namespace {
using kiln_test::values;

const std::string kFixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/torch_state_dict.safetensors";

// The fixture's model: nn.Sequential(Conv2d(1, 2, 3, bias=False), BatchNorm2d(2), ReLU(), Flatten(), Linear(8, 3)).
nn::Sequential tiny_model() {
  Generator gen(5);
  return nn::Sequential{nn::Conv2d(1, 2, {3}, {}, false, &gen), nn::BatchNorm2d(2), nn::ReLU(), nn::Flatten(),
                        nn::Linear(8, 3, true, &gen)};
}


const Tensor& find(const nn::NamedTensors& state, const std::string& name) {
  auto it = std::find_if(state.begin(), state.end(), [&](const auto& p) { return p.first == name; });
  REQUIRE_MESSAGE(it != state.end(), name);
  return it->second;
}

}  // namespace

TEST_CASE("io load_state_dict: a PyTorch state dict of the same model loads under PyTorch's names") {
  io::Metadata meta;
  const nn::NamedTensors file = io::load_safetensors(kFixture, &meta);
  MESSAGE("fixture written by " << meta["written_by"]);
  CHECK(meta.at("format") == "pt");
  nn::Sequential net = tiny_model();
  // The same names: kiln's Sequential numbers its children as PyTorch's does.
  std::vector<std::string> want, got;
  for (const auto& [name, t] : net.state()) want.push_back(name);
  for (const auto& [name, t] : file) got.push_back(name);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  CHECK(got == want);

  io::load_state_dict(kFixture, net);
  const nn::NamedTensors s = net.state();
  CHECK(values(find(s, "0.weight"))[0] == -9.0 / 16);
  CHECK(values(find(s, "0.weight"))[17] == 8.0 / 16);
  CHECK(values(find(s, "1.running_mean")) == std::vector<double>{0.5, -1.0});
  CHECK(values(find(s, "1.running_var")) == std::vector<double>{4.0, 0.25});
  CHECK(find(s, "1.num_batches_tracked").dtype() == DType::i64);
  CHECK(find(s, "1.num_batches_tracked").item<std::int64_t>() == 7);
  CHECK(values(find(s, "4.bias")) == std::vector<double>{0.125, -0.25, 0.5});

  // Its output in eval mode is PyTorch's (recorded by the script in the metadata).
  net.eval();
  std::vector<float> in(16);
  for (int i = 0; i < 16; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(i) / 16 - 0.5f;
  const std::vector<double> y = values(net(from_vector<float>(in, {1, 1, 4, 4})));
  const auto expected = nlohmann::json::parse(meta.at("expected_output")).get<std::vector<double>>();
  REQUIRE(y.size() == expected.size());
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(expected[i]).epsilon(1e-5));

  // load_checkpoint takes the same file for the model and leaves the optimizer as it was.
  nn::Sequential other = tiny_model();
  optim::SGD opt(other.parameters(), {.lr = 0.1, .momentum = 0.9});
  io::load_checkpoint(kFixture, other, &opt);
  CHECK(opt.steps() == 0);
  CHECK(values(find(other.state(), "4.weight")) == values(find(s, "4.weight")));
}

TEST_CASE("io load_state_dict: a mismatched PyTorch state dict is refused naming the tensor, nothing changed") {
  kiln_test::TempDir dir;
  nn::NamedTensors good = io::load_safetensors(kFixture);
  auto write = [&](const std::string& name, nn::NamedTensors tensors, const io::Metadata& meta = {{"format", "pt"}}) {
    const std::string path = dir.file(name);
    io::save_safetensors(path, tensors, meta);
    return path;
  };
  auto replaced = [&](const std::string& name, const Tensor& t) {
    nn::NamedTensors out = good;
    for (auto& [n, v] : out)
      if (n == name) v = t;
    return out;
  };
  nn::Sequential net = tiny_model();
  const std::vector<double> before = values(find(net.state(), "0.weight"));
  auto refused = [&](const std::string& path) {
    CAPTURE(path);
    return kiln_test::message_of<ValueError>([&] { io::load_state_dict(path, net); });
  };

  const std::string half =
      refused(write("half.safetensors", replaced("4.weight", zeros({3, 8}, {.dtype = DType::f16}))));
  CHECK(half.find("4.weight: dtype f16 in file, f32 expected") != std::string::npos);
  CHECK(half.find("half.safetensors") != std::string::npos);
  const std::string shape = refused(write("shape.safetensors", replaced("0.weight", zeros({2, 1, 5, 5}))));
  CHECK(shape.find("0.weight: shape (2,1,5,5) in file, (2,1,3,3) expected") != std::string::npos);

  nn::NamedTensors no_count = good;
  std::erase_if(no_count, [](const auto& p) { return p.first == "1.num_batches_tracked"; });
  CHECK(refused(write("missing.safetensors", no_count)).find("missing 1.num_batches_tracked") != std::string::npos);

  // Saved from a wrapper (DataParallel's "module."): every name misses, and the message says so.
  nn::NamedTensors wrapped;
  for (const auto& [n, t] : good) wrapped.emplace_back("module." + n, t);
  const std::string prefixed = refused(write("wrapped.safetensors", wrapped));
  CHECK(prefixed.find("missing 0.weight") != std::string::npos);
  CHECK(prefixed.find("unexpected module.") != std::string::npos);
  CHECK(prefixed.find("no name matches") != std::string::npos);

  CHECK(values(find(net.state(), "0.weight")) == before);  // nothing was copied

  // Another framework's format is an IoError; a file without metadata is taken as a state dict.
  const std::string tf = write("tf.safetensors", good, {{"format", "tf"}});
  CHECK(kiln_test::message_of<IoError>([&] { io::load_state_dict(tf, net); }).find("\"tf\"") != std::string::npos);
  io::load_state_dict(write("bare.safetensors", good, {}), net);
  CHECK(values(find(net.state(), "0.weight")) == values(find(good, "0.weight")));
}
