// Smallest useful embedding: a two-layer network's loss and gradients, on the GPU
// when there is one, else on the CPU. Only kiln/kiln.h is included.
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>

int main() {
  using namespace kiln;
  try {
    const Device dev = cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
    Generator gen(42);
    Tensor x = randn({64, 784}, {.device = dev}, &gen);
    Tensor labels = randint(0, 10, {64}, {.device = dev}, &gen);
    Tensor w1 = (randn({128, 784}, {.device = dev}, &gen) * 0.03).requires_grad_();
    Tensor w2 = (randn({10, 128}, {.device = dev}, &gen) * 0.09).requires_grad_();

    Tensor loss = cross_entropy(linear(relu(linear(x, w1)), w2), labels);  // records the graph
    loss.backward();
    std::printf("kiln %s on %s: loss %.4f, |dL/dw1| %.4f\n", version(), dev.str().c_str(), loss.item<float>(),
                std::sqrt(sum(w1.grad() * w1.grad()).item<float>()));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
