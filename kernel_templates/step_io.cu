// Kernels a compiled step adds to its graph: one stores the per-step scalars (learning rate,
// bias corrections, the generator's seed and offset) that the host gives each replay, one
// copies the call's inputs into the graph's static input buffers and, at the head of the
// graph, also stores the words of up to four such stores (one kernel fewer each). NVRTC -std=c++17.

${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS

struct Words {
  unsigned long long w[8];
};

extern "C" __global__ void kiln_store_words(unsigned long long* dst, Words words, int count) {
  kiln::wait_prior_grids();
  const int i = threadIdx.x;
  if (i < count) dst[i] = words.w[i];
}

struct InputCopies {
  unsigned long long dst[8], src[8], bytes[8];
  int count, stores;
  unsigned long long store_dst[4];
  int store_count[4];
  Words store_words[4];
};

// blockIdx.y picks the input; 16-byte words where both addresses and the size allow. Block
// (0, 0) also does the word stores.
extern "C" __global__ void __launch_bounds__(256) kiln_copy_inputs(InputCopies c) {
  kiln::wait_prior_grids();
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int s = 0; s < c.stores; ++s)
      if (static_cast<int>(threadIdx.x) < c.store_count[s])
        reinterpret_cast<unsigned long long*>(c.store_dst[s])[threadIdx.x] = c.store_words[s].w[threadIdx.x];
  const int k = blockIdx.y;
  if (k >= c.count) return;
  const unsigned long long dst = c.dst[k], src = c.src[k], bytes = c.bytes[k];
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  if (((dst | src | bytes) & 15ULL) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (unsigned long long i = first; i < bytes / 16; i += step) d[i] = s[i];
  } else {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    for (unsigned long long i = first; i < bytes; i += step) d[i] = s[i];
  }
}
