// Tensor-core helpers the convolution templates paste after the prelude (MMA_OPS), once
// MMA is defined: 0 bf16, 1 f16 (m16n8k16), 2 TF32 held in a float (m16n8k8); f32 accumulators.
#if MMA == 2
typedef float MmaT;
#elif MMA == 1
typedef __half MmaT;
#else
typedef __nv_bfloat16 MmaT;
#endif

// f32 into the MMA type: round to nearest (TF32 away from zero on ties, as cuDNN does).
__device__ __forceinline__ MmaT to_mt(float v) {
#if MMA == 2
  unsigned int r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
#else
  return kiln::cvt<MmaT>(v);
#endif
}

// Two 16-bit values as one fragment register, `lo` in its low half.
__device__ __forceinline__ unsigned pack(unsigned short lo, unsigned short hi) {
  return static_cast<unsigned>(lo) | static_cast<unsigned>(hi) << 16;
}

// d += a * b for one 16x8 tile (k 16, or 8 for TF32) in mma.sync's row.col fragment layouts.
__device__ __forceinline__ void mma(float* d, const unsigned int* a, const unsigned int* b) {
#if MMA == 2
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif MMA == 1
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// dst = src, B bytes, asynchronously (waited for by cp.async.wait_all): B of 4, 8 or 16.
template <int B>
__device__ __forceinline__ void copy_async(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (B == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(B));
}
