// Kernels a compiled step adds to its graph: one stores the per-step scalars (learning rate,
// bias corrections, the generator's seed and offset) that the host gives each replay, one
// copies the call's inputs into the graph's static input buffers (and writes the casts the step
// asks of them, autocast's of the images say, and the rows it gathers by them, a batch of a
// dataset on the device, so the step needs no kernel of its own for those) and, at the head of
// the graph, also stores the words of up to four such stores (one kernel fewer each).
// NVRTC -std=c++17.

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
  unsigned long long dst[8], src[8], bytes[8];           // bytes read from src (a gather: a row's)
  unsigned long long index[8], rows[8], index_count[8];  // a gather: i64 row numbers, src's rows, their count
  int convert[8];                                        // kCopy, or the conversion below
  int count, stores;
  unsigned long long store_dst[4];
  int store_count[4];
  Words store_words[4];
};

// The conversions a copy can make, f32 to a half type, rounded to nearest even by the cvt
// instructions the half headers' conversions use (the cast kernels' bits), without those
// headers, which would dominate this kernel's compile.
enum : int { kCopy = 0, kF32ToF16 = 1, kF32ToBF16 = 2 };

__device__ __forceinline__ unsigned short to_half_bits(float v, int convert) {
  unsigned short r;
  if (convert == kF32ToF16) {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  }
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
#else
  const unsigned u = __float_as_uint(v);
  r = (u & 0x7fffffffu) > 0x7f800000u ? 0x7fff : static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  return r;
}

// dst's rows = src's rows named by index, in words of W bytes; an index out of [0, rows) gives a
// row of zeros (index_select's kernel does the same).
template <class W>
__device__ void gather_rows(const unsigned char* src, unsigned char* dst, const long long* index,
                            unsigned long long row_bytes, unsigned long long rows, unsigned long long count,
                            unsigned long long first, unsigned long long step) {
  const unsigned long long words = row_bytes / sizeof(W);
  for (unsigned long long i = first; i < count * words; i += step) {
    const unsigned long long j = i / words, w = i % words;
    const long long k = index[j];
    W v{};
    if (k >= 0 && static_cast<unsigned long long>(k) < rows) v = reinterpret_cast<const W*>(src + k * row_bytes)[w];
    reinterpret_cast<W*>(dst + j * row_bytes)[w] = v;
  }
}

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
  if (c.index[k] != 0) {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    const long long* ix = reinterpret_cast<const long long*>(c.index[k]);
    const unsigned long long a = dst | src | bytes;
    if ((a & 15ULL) == 0)
      gather_rows<uint4>(s, d, ix, bytes, c.rows[k], c.index_count[k], first, step);
    else if ((a & 7ULL) == 0)
      gather_rows<unsigned long long>(s, d, ix, bytes, c.rows[k], c.index_count[k], first, step);
    else if ((a & 3ULL) == 0)
      gather_rows<unsigned>(s, d, ix, bytes, c.rows[k], c.index_count[k], first, step);
    else
      gather_rows<unsigned char>(s, d, ix, bytes, c.rows[k], c.index_count[k], first, step);
    return;
  }
  if (const int cv = c.convert[k]; cv != kCopy) {  // four f32 in, four halves out where aligned
    const float* s = reinterpret_cast<const float*>(src);
    unsigned short* d = reinterpret_cast<unsigned short*>(dst);
    const unsigned long long n = bytes / 4;
    const unsigned long long quads = ((src & 15ULL) == 0 && (dst & 7ULL) == 0) ? n / 4 : 0;
    for (unsigned long long i = first; i < quads; i += step) {
      const float4 v = reinterpret_cast<const float4*>(s)[i];
      const unsigned lo = to_half_bits(v.x, cv) | static_cast<unsigned>(to_half_bits(v.y, cv)) << 16;
      const unsigned hi = to_half_bits(v.z, cv) | static_cast<unsigned>(to_half_bits(v.w, cv)) << 16;
      reinterpret_cast<uint2*>(d)[i] = make_uint2(lo, hi);
    }
    for (unsigned long long i = quads * 4 + first; i < n; i += step) d[i] = to_half_bits(s[i], cv);
    return;
  }
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
