// Reductions of a contiguous [outer, r, inner] input to [outer, inner]; one module per
// (op, in, out). inner == 1 reduces rows (a group of lanes or a whole block per row),
// inner > 1 reduces columns (lanes across inner, coalesced, looping over r). A launch
// may instead write partial states [outer, splits, inner] that a second launch of the
// same kernel combines and finalizes. Variant 0 holds the row loops, variant 1 the column
// loops: a module compiles only one kind. The ops themselves are in reduce_ops.cu.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS

typedef ${IN} In;
typedef ${OUT} Out;
typedef ${ACC} Acc;
constexpr int kVec = 16 / sizeof(In);  // elements per 16-byte load

${OPS}

typedef ${OP}<Acc> Op;
typedef Op::State State;
static_assert(sizeof(State) <= 32, "the launcher allocates 32 bytes per partial state");
static_assert(sizeof(State) % 4 == 0, "states are shuffled as 32-bit words");

constexpr int kBlock = 256;  // the launcher always launches 256 threads

// ---- intra-warp and intra-block combining, in a fixed tree order
__device__ __forceinline__ State shfl_down(State v, int delta, int width) {
  union Words {
    State s;
    int w[sizeof(State) / 4];
  } u;
  u.s = v;
#pragma unroll
  for (int k = 0; k < int(sizeof(State) / 4); ++k) u.w[k] = __shfl_down_sync(0xffffffffu, u.w[k], delta, width);
  return u.s;
}

// Lane 0 of each aligned group of `width` lanes receives the group's result.
__device__ __forceinline__ State group_reduce(State s, int width) {
  for (int d = width / 2; d > 0; d /= 2) s = Op::combine(s, shfl_down(s, d, width));
  return s;
}

// Thread 0 receives the block's result.
__device__ State block_reduce(State s) {
  __shared__ State warp_part[kBlock / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  s = group_reduce(s, 32);
  if (lane == 0) warp_part[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < int(blockDim.x >> 5) ? warp_part[lane] : Op::identity();
    s = group_reduce(s, 32);
  }
  __syncthreads();  // warp_part is reused by the next row
  return s;
}

__device__ __forceinline__ void emit(void* out, long long idx, const State& s, bool to_state, long long n,
                                     double param) {
  if (to_state)
    static_cast<State*>(out)[idx] = s;
  else
    static_cast<Out*>(out)[idx] = Op::finalize(s, n, param);
}

// ---- rows: elements [b, e) of row o of a [outer, r] input, lane `lane` of `width`.
union Vec {
  uint4 u;
  In e[kVec];
};

// Ops with a cheaper way to take a whole vector define update_batch; the rest go element by element.
template <class O>
__device__ __forceinline__ auto update_many(State& s, const Acc* x, long long idx, int)
    -> decltype(O::update_batch(s, x, idx)) {
  O::update_batch(s, x, idx);
}
template <class O>
__device__ __forceinline__ void update_many(State& s, const Acc* x, long long idx, long) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) O::update(s, x[j], idx + j);
}

__device__ __forceinline__ void update_vec(State& s, const Vec& v, long long idx) {
  Acc x[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) x[j] = to_acc(v.e[j]);
  update_many<Op>(s, x, idx, 0);
}

// Scalar head up to a 16-byte boundary, 16-byte body (four loads in flight), scalar tail.
__device__ State row_elements(const In* __restrict__ row, long long b, long long e, int lane, int width) {
  State s = Op::identity();
  const In* p = row + b;
  const long long n = e - b;
  long long head = static_cast<long long>(((16u - (reinterpret_cast<unsigned long long>(p) & 15u)) & 15u) / sizeof(In));
  if (head > n) head = n;
  for (long long k = lane; k < head; k += width) Op::update(s, to_acc(p[k]), b + k);
  const long long nvec = (n - head) / kVec;
  const uint4* __restrict__ q = reinterpret_cast<const uint4*>(p + head);
  const long long base = b + head;
  long long v = lane;
  for (; v + 3 * width < nvec; v += 4 * width) {
    Vec x0, x1, x2, x3;
    x0.u = __ldg(q + v);
    x1.u = __ldg(q + v + width);
    x2.u = __ldg(q + v + 2 * width);
    x3.u = __ldg(q + v + 3 * width);
    update_vec(s, x0, base + v * kVec);
    update_vec(s, x1, base + (v + width) * kVec);
    update_vec(s, x2, base + (v + 2 * width) * kVec);
    update_vec(s, x3, base + (v + 3 * width) * kVec);
  }
  for (; v < nvec; v += width) {
    Vec x;
    x.u = __ldg(q + v);
    update_vec(s, x, base + v * kVec);
  }
  for (long long k = head + nvec * kVec + lane; k < n; k += width) Op::update(s, to_acc(p[k]), b + k);
  return s;
}

__device__ State row_states(const State* __restrict__ row, long long b, long long e, int lane, int width) {
  State s = Op::identity();
  for (long long k = b + lane; k < e; k += width) s = Op::combine(s, row[k]);
  return s;
}

template <bool kFromState>
__device__ State row_chunk(const void* in, long long o, long long r, long long b, long long e, int lane, int width) {
  if (kFromState) return row_states(static_cast<const State*>(in) + o * r, b, e, lane, width);
  return row_elements(static_cast<const In*>(in) + o * r, b, e, lane, width);
}

// Work item w = (row o, split sp). group == 0: a whole block per item; else `group`
// lanes (a power of two <= 32) per item, kBlock / group items per block.
template <bool kFromState>
__device__ void reduce_rows(const void* in, void* out, long long outer, long long r, long long splits,
                            long long chunk, int group, bool to_state, long long n, double param) {
  const long long items = outer * splits;
  if (group == 0) {
    for (long long w = blockIdx.x; w < items; w += gridDim.x) {
      const long long o = w / splits, b = (w - o * splits) * chunk;
      const long long e = b + chunk < r ? b + chunk : r;
      State s = block_reduce(row_chunk<kFromState>(in, o, r, b, e, threadIdx.x, blockDim.x));
      if (threadIdx.x == 0) emit(out, w, s, to_state, n, param);
    }
    return;
  }
  const int per_block = blockDim.x / group, lane = threadIdx.x % group, gid = threadIdx.x / group;
  const long long step = static_cast<long long>(gridDim.x) * per_block;
  // Every lane runs every round so the shuffles see full warps.
  for (long long first = static_cast<long long>(blockIdx.x) * per_block; first < items; first += step) {
    const long long w = first + gid;
    State s = Op::identity();
    if (w < items) {
      const long long o = w / splits, b = (w - o * splits) * chunk;
      const long long e = b + chunk < r ? b + chunk : r;
      s = row_chunk<kFromState>(in, o, r, b, e, lane, group);
    }
    s = group_reduce(s, group);
    if (lane == 0 && w < items) emit(out, w, s, to_state, n, param);
  }
}

// ---- columns: a block is bx lanes across inner, by lanes along r and bz = kBlock / (bx * by)
// rows of outer (many short columns share a block). With kVecCols each lane owns kColVec
// adjacent columns and reads them with one load (inner % kColVec == 0, 16-byte aligned input).
constexpr int kColVec = kVec < 4 ? kVec : 4;
template <int kBytes> struct Bits;
template <> struct Bits<4> { typedef unsigned int T; };
template <> struct Bits<8> { typedef uint2 T; };
template <> struct Bits<16> { typedef uint4 T; };
union ColVec {
  Bits<kColVec * sizeof(In)>::T u;
  In e[kColVec];
};

template <bool kFromState, bool kVecCols>
__device__ void reduce_columns(const void* in, void* out, long long outer, long long r, long long inner,
                               long long splits, long long chunk, int bx, int by, bool to_state, long long n,
                               double param) {
  constexpr int V = kVecCols ? kColVec : 1;
  __shared__ State part[kBlock];
  const int bz = blockDim.x / (bx * by);
  const int tx = threadIdx.x % bx, ty = (threadIdx.x / bx) % by, tz = threadIdx.x / (bx * by);
  const long long cols = inner / V;  // in units of V columns
  const long long nib = (cols + bx - 1) / bx, items = (outer + bz - 1) / bz * nib * splits;
  for (long long w = blockIdx.x; w < items; w += gridDim.x) {
    const long long sp = w % splits, t = w / splits, ib = t % nib, o = t / nib * bz + tz;
    const long long i = ib * bx + tx, b = sp * chunk;
    const long long e = b + chunk < r ? b + chunk : r;
    const bool active = i < cols && o < outer;
    State s[V];
#pragma unroll
    for (int j = 0; j < V; ++j) s[j] = Op::identity();
    if (active) {
      const long long base = o * r * cols + i;
      long long rr = b + ty;
      if (kFromState) {
        const State* p = static_cast<const State*>(in) + base;
        for (; rr < e; rr += by) s[0] = Op::combine(s[0], p[rr * cols]);
      } else if (kVecCols) {
        const ColVec* p = static_cast<const ColVec*>(in) + base;
        for (; rr + 3 * by < e; rr += 4 * by) {
          ColVec x[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) x[k].u = p[(rr + k * by) * cols].u;  // all loads before any use
#pragma unroll
          for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int j = 0; j < V; ++j) Op::update(s[j], to_acc(x[k].e[j]), rr + k * by);
        }
        for (; rr < e; rr += by) {
          ColVec x;
          x.u = p[rr * cols].u;
#pragma unroll
          for (int j = 0; j < V; ++j) Op::update(s[j], to_acc(x.e[j]), rr);
        }
      } else {
        const In* p = static_cast<const In*>(in) + base;
        for (; rr + 3 * by < e; rr += 4 * by) {
          In x[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) x[k] = p[(rr + k * by) * cols];
#pragma unroll
          for (int k = 0; k < 4; ++k) Op::update(s[0], to_acc(x[k]), rr + k * by);
        }
        for (; rr < e; rr += by) Op::update(s[0], to_acc(p[rr * cols]), rr);
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      part[threadIdx.x] = s[j];
      __syncthreads();
      for (int h = by / 2; h > 0; h /= 2) {
        if (ty < h) {
          s[j] = Op::combine(s[j], part[threadIdx.x + h * bx]);
          part[threadIdx.x] = s[j];
        }
        __syncthreads();
      }
      if (ty == 0 && active) emit(out, (o * splits + sp) * inner + i * V + j, s[j], to_state, n, param);
    }
  }
}

// in: [outer, r, inner] elements (flags & 1: partial states); out: [outer, inner] values
// (flags & 2: partial states [outer, splits, inner], split sp covering r in
// [sp * chunk, (sp + 1) * chunk)); flags & 4: columns read kColVec at a time. lanes: rows'
// group size (0 = block) or columns' bx; lanes_r: columns' by. n: elements reduced in all.
extern "C" __global__ void __launch_bounds__(kBlock)
    kiln_reduce(const void* __restrict__ in, void* __restrict__ out, long long outer, long long r,
                long long inner, long long splits, long long chunk, int lanes, int lanes_r, int flags,
                long long n, double param) {
  kiln::wait_prior_grids();
  const bool from_state = flags & 1, to_state = flags & 2, vec_cols = flags & 4;
#if ${VARIANT} == 0
  (void)inner, (void)lanes_r, (void)vec_cols;
  if (from_state)
    reduce_rows<true>(in, out, outer, r, splits, chunk, lanes, to_state, n, param);
  else
    reduce_rows<false>(in, out, outer, r, splits, chunk, lanes, to_state, n, param);
#else
  if (from_state)
    reduce_columns<true, false>(in, out, outer, r, inner, splits, chunk, lanes, lanes_r, to_state, n, param);
  else if (vec_cols)
    reduce_columns<false, true>(in, out, outer, r, inner, splits, chunk, lanes, lanes_r, to_state, n, param);
  else
    reduce_columns<false, false>(in, out, outer, r, inner, splits, chunk, lanes, lanes_r, to_state, n, param);
#endif
}
