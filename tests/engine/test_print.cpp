// operator<<: values laid out like PyTorch, with dtype, device and shape.
#include <doctest/doctest.h>

#include <cmath>

#include "kiln/kiln.h"

using namespace kiln;

TEST_CASE("printing small tensors") {
  CHECK(to_string(from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2})) ==
        "tensor([[1., 2.],\n        [3., 4.]], dtype=f32, device=cpu, shape=(2,2))");
  CHECK(to_string(from_vector(std::vector<float>{1.5f, -0.25f})) ==
        "tensor([ 1.5000, -0.2500], dtype=f32, device=cpu, shape=(2,))");
  CHECK(to_string(scalar_tensor(3)) == "tensor(3, dtype=i64, device=cpu, shape=())");
  CHECK(to_string(from_vector(std::vector<bool>{true, false})) ==
        "tensor([ True, False], dtype=bool, device=cpu, shape=(2,))");
  CHECK(to_string(from_vector(std::vector<double>{1e-6, 1})) ==
        "tensor([1.0000e-06, 1.0000e+00], dtype=f64, device=cpu, shape=(2,))");
  CHECK(to_string(zeros({0})) == "tensor([], dtype=f32, device=cpu, shape=(0,))");
  CHECK(to_string(from_vector(std::vector<float>{NAN, INFINITY, 1})) ==
        "tensor([nan, inf,  1.], dtype=f32, device=cpu, shape=(3,))");
  CHECK(to_string(Tensor()) == "tensor(undefined)");
}

TEST_CASE("printing a 3-d tensor separates blocks with a blank line") {
  std::string s = to_string(arange(8, {.dtype = DType::i32}).view({2, 2, 2}));
  CHECK(s ==
        "tensor([[[0, 1],\n"
        "         [2, 3]],\n"
        "\n"
        "        [[4, 5],\n"
        "         [6, 7]]], dtype=i32, device=cpu, shape=(2,2,2))");
}

TEST_CASE("large tensors are elided to the first and last 3 entries of each dim") {
  std::string s = to_string(arange(2000).view({40, 50}));
  CHECK(s.find("[   0,    1,    2,  ...,   47,   48,   49]") != std::string::npos);
  CHECK(s.find("[1950, 1951, 1952,  ..., 1997, 1998, 1999]]") != std::string::npos);
  CHECK(s.find("...,\n") != std::string::npos);
  CHECK(s.find("1000") == std::string::npos);  // middle rows are not printed
  CHECK(s.find("shape=(40,50)") != std::string::npos);
  // 1000 elements or fewer print in full.
  CHECK(to_string(arange(1000)).find("...") == std::string::npos);
}

TEST_CASE("printing shows autograd state") {
  Tensor x = ones({2}, {.requires_grad = true});
  CHECK(to_string(x).find("requires_grad=true") != std::string::npos);
  CHECK(to_string(x * 2).find("grad_fn=mul_scalar") != std::string::npos);
}
