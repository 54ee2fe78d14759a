#pragma once
// Host memory of CPU tensors. Large blocks are kept when freed and handed out again for the
// same size: a training step frees and allocates the same activations every step, and fresh
// pages from the kernel cost a fault and a zeroing each (about 5% of a CPU cnn step).
#include <cstddef>

namespace kiln::cpu {

// 64-byte aligned, so vectorized loops and f64 views never see a misaligned base. Throws
// std::bad_alloc. Contents are unspecified.
void* host_alloc(std::size_t bytes);
// `bytes` as given to host_alloc.
void host_free(void* p, std::size_t bytes) noexcept;

}  // namespace kiln::cpu
