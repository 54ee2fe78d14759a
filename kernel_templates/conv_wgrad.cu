// Weight gradient of a stride-1 convolution on tensor cores, generated for one exact shape:
// dw[o][c][r][s] = sum over images and pixels of gy[o][pixel] * x[c][pixel shifted by (r, s)].
// A block takes one kernel row r (its KW taps), 64 output channels and BC input channels over
// IPB images: per image it stages gy as [o][pixel] and the x rows the taps read as
// [y][x][c] (zero-padded) in shared memory, then multiplies with ldmatrix/mma.sync (bf16,
// f16) or lds/mma.sync (TF32), f32 accumulation. Each block parks its sums for its images in
// `ws`; kiln_conv_wgrad_reduce adds the image groups in order (deterministic).
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${TX} TX;  // x and gy storage type
typedef ${TO} TO;  // dw storage type
#define MMA ${MMA}  // 0 bf16, 1 f16, 2 tf32
${MMA_OPS}
typedef MmaT MT_;
constexpr int N = ${N}, C = ${C}, H = ${H}, W = ${W}, O = ${O}, KH = ${KH}, KW = ${KW};
constexpr int OH = ${OH}, OW = ${OW}, PH = ${PH}, PW = ${PW}, DH = ${DH}, DW = ${DW}, G = ${G};
constexpr int BC = ${BC}, IPB = ${IPB};
constexpr int CG = C / G, OG = O / G, RS = KH * KW, OHW = OH * OW, BO = 64;
constexpr int IG = (N + IPB - 1) / IPB, OT = (OG + BO - 1) / BO, TOTAL = O * CG * RS;
constexpr int PWC = OW + (KW - 1) * DW, NT = BC / 8;
// TF32's row stride is 4 mod 32 words and CP 8 mod 32, so its fragment reads miss conflicts.
constexpr int KS = MMA == 2 ? 8 : 16, CP = BC + 8;
constexpr int KP = MMA == 2 ? ((OHW + 7) / 8 * 8 + 27) / 32 * 32 + 4 : (OHW + 15) / 16 * 16 + 8;
constexpr int PIX = OH * PWC;  // staged pixels; one more row of zeros follows them
constexpr int GYS = BO * KP, PATCH = (PIX + 1) * CP;
constexpr int THREADS = 128;



// Shared-memory offset (elements) of pixel p's tap s in the staged rows, or of the zero row.
__device__ __forceinline__ int pixel_base(int p) { return p < OHW ? ((p / OW) * PWC + p % OW) * CP : PIX * CP; }

extern "C" __global__ void __launch_bounds__(THREADS) kiln_conv_wgrad(const TX* __restrict__ x,
                                                                      const TX* __restrict__ gy,
                                                                      float* __restrict__ ws) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(16) unsigned char smem[];
  MT_* gys = reinterpret_cast<MT_*>(smem);
  MT_* patch = gys + GYS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t = lane & 3;
  const int r = blockIdx.x, o0 = (blockIdx.y % OT) * BO, c0 = (blockIdx.y / OT) * BC;
  const int g = blockIdx.z % G, ig = blockIdx.z / G;
  // Pixels past OHW in gy and the zero row are never overwritten: clear them once.
  for (int i = tid; i < BO * (KP - OHW); i += THREADS) gys[(i / (KP - OHW)) * KP + OHW + i % (KP - OHW)] = to_mt(0.f);
  for (int i = tid; i < CP; i += THREADS) patch[PIX * CP + i] = to_mt(0.f);

  float acc[KW][NT][4];
#pragma unroll
  for (int s = 0; s < KW; ++s)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[s][j][0] = acc[s][j][1] = acc[s][j][2] = acc[s][j][3] = 0.f;

  for (int img = ig * IPB; img < N && img < (ig + 1) * IPB; ++img) {
    __syncthreads();  // the previous image's reads are done
    for (int i = tid; i < BO * OHW; i += THREADS) {
      const int o = i / OHW, p = i % OHW;
      float v = 0.f;
      if (o0 + o < OG) v = kiln::cvt<float>(gy[(img * O + g * OG + o0 + o) * OHW + p]);
      gys[o * KP + p] = to_mt(v);
    }
    for (int i = tid; i < BC * PIX; i += THREADS) {
      const int px = i % PWC, oy = (i / PWC) % OH, c = i / PIX;
      const int iy = oy - PH + r * DH, ix = px - PW;
      float v = 0.f;
      if (c0 + c < CG && iy >= 0 && iy < H && ix >= 0 && ix < W)
        v = kiln::cvt<float>(x[((img * C + g * CG + c0 + c) * H + iy) * W + ix]);
      patch[(oy * PWC + px) * CP + c] = to_mt(v);
    }
    __syncthreads();
#if MMA == 2
    const MT_* arow = gys + (warp * 16 + gq) * KP + t;
#pragma unroll 1
    for (int k0 = 0; k0 < OHW; k0 += KS) {
      unsigned int a[4];
      a[0] = __float_as_uint(arow[k0]);
      a[1] = __float_as_uint(arow[8 * KP + k0]);
      a[2] = __float_as_uint(arow[k0 + 4]);
      a[3] = __float_as_uint(arow[8 * KP + k0 + 4]);
      const int p0 = pixel_base(k0 + t), p1 = pixel_base(k0 + t + 4);
      const bool v0 = k0 + t < OHW, v1 = k0 + t + 4 < OHW;
#pragma unroll
      for (int s = 0; s < KW; ++s)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          unsigned int b[2];
          b[0] = __float_as_uint(patch[(v0 ? p0 + s * DW * CP : p0) + j * 8 + gq]);
          b[1] = __float_as_uint(patch[(v1 ? p1 + s * DW * CP : p1) + j * 8 + gq]);
          mma(acc[s][j], a, b);
        }
    }
#else
    const unsigned int sa =
        static_cast<unsigned int>(__cvta_generic_to_shared(gys + (warp * 16 + (lane & 15)) * KP + (lane >> 4) * 8));
    const unsigned int sp = static_cast<unsigned int>(__cvta_generic_to_shared(patch));
#pragma unroll 1
    for (int k0 = 0; k0 < OHW; k0 += KS) {
      unsigned int a[4];
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                   : "r"(sa + k0 * 2));
      // B via ldmatrix.trans: lane l gives the row of pixel k0 + l % 8 (+ 8 for the odd
      // matrices) at channel offset (l / 16) * 8 within a pair of 8-channel tiles.
      const int p = k0 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int base = pixel_base(p), coff = (lane >> 4) * 8;
      const bool valid = p < OHW;
#pragma unroll
      for (int s = 0; s < KW; ++s) {
        const int off = (valid ? base + s * DW * CP : base) + coff;
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          unsigned int b[4];
          if (j + 1 < NT) {
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                         : "r"(sp + (off + j * 8) * 2));
            mma(acc[s][j], a, b);
            mma(acc[s][j + 1], a, b + 2);
          } else {
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                         : "=r"(b[0]), "=r"(b[1])
                         : "r"(sp + ((valid ? base + s * DW * CP : base) + j * 8) * 2));
            mma(acc[s][j], a, b);
          }
        }
      }
    }
#endif
  }

  // This block's sums for its image group: rows o (warp's 16), columns (c, tap).
  float* part = ws + static_cast<long long>(ig) * TOTAL;
#pragma unroll
  for (int s = 0; s < KW; ++s)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int o = o0 + warp * 16 + gq + (q >> 1) * 8, c = c0 + j * 8 + 2 * t + (q & 1);
        if (o < OG && c < CG) part[((g * OG + o) * CG + c) * RS + r * KW + s] = acc[s][j][q];
      }
}

// dw = the image groups' sums added in order.
extern "C" __global__ void kiln_conv_wgrad_reduce(const float* __restrict__ ws, TO* __restrict__ dw) {
  kiln::wait_prior_grids();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < TOTAL; i += gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < IG; ++k) s += ws[static_cast<long long>(k) * TOTAL + i];
    kiln::store(dw + i, s);
  }
}
