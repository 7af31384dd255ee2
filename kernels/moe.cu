// Mixture-of-experts routing and combine for the runtime's sparse MLP blocks (src/gemm/moe.rs;
// docs/runtime.md, "Mixtures of experts"). A layer of t tokens, E experts, top-k:
//
//   moe_route:   router logits (BF16 [t, E], the router GEMM's output, as transformers' BF16
//                F.linear) -> p = softmax(logits) in FP32, the k largest of p in torch.topk's
//                order (descending; equal values: lower expert first; NaN above every number),
//                renormalised to sum to 1 when `renorm`. Writes ids [t, k] and weights [t, k].
//                One warp per token; E <= 32 * MOE_MAX_PER_LANE.
//                shared = 1 (the shared expert routed as expert E, src/gemm/moe.rs RouteSpec):
//                the logits rows are [t, E + 1], column E the shared expert's gate logit (the
//                router GEMM carries its row); each token gets a (k+1)-th pair, expert E with
//                weight sigmoid(logit E) = 1 / (1 + exp(-g)), so ids and weights are [t, k + 1]
//                and the sort and combine below take it as any expert (last in ascending order,
//                where the shared expert's term came before).
//   moe_sort:    the t * k routed (token, choice) pairs p = token * k + choice grouped by expert,
//                ascending expert and, within an expert, ascending p: sorted[P], the active
//                (routed-to) experts in ascending order active[j], offsets[j] .. offsets[j + 1]
//                their ranges in sorted, and *n_active (also written to n_active_log, when given:
//                the experts a step touched, per layer). One CTA; thread e owns expert e.
//   moe_combine: out[t, h] = bf16( sum over the token's k choices, in ascending expert order, of
//                weight * y[p, h]  +  sigmoid(sgate[t]) * shared[t, h] ) where y is the routed
//                experts' down output (BF16 [t * k, H]), shared the shared expert's (BF16 [t, H],
//                optional) and sgate its gate logit (BF16 [t], optional). FP32 sums, one rounding.
//
// The grouped expert GEMMs between them are kernels/gemv.cu's moe_gemv_* (BF16, FP8 E4M3) and
// kernels/w4a16.cu's w4a16_moe_* (W4A16 NVFP4). No host synchronization anywhere: a decode step
// with its routing is captured into one CUDA graph; the grouped GEMMs launch one CTA column per
// possible active expert (min(E, t * k)) and the columns past *n_active exit.

#include "common.cuh"

#define MOE_MAX_PER_LANE 32

// a ranks above b (torch.topk order): NaN first, then larger, then lower index.
__device__ __forceinline__ bool moe_better(float a, int ia, float b, int ib) {
  const bool na = a != a, nb = b != b;
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// One token's routing by one warp (lane = threadIdx.x & 31): softmax of `row` (E BF16 logits),
// top-k in torch.topk's order, renormalised when `renorm`; lanes < k write ids / wts. PL: the
// probabilities each lane holds (entries lane + 32 i, i < PL; E <= 32 PL), so the loops run over
// what E needs, not over MOE_MAX_PER_LANE. The top-k keeps each lane's best entry not yet taken:
// a round is one warp arg-max of those (5 shuffle steps), after which only the winning lane
// rescans its PL entries.
template <int PL>
__device__ __forceinline__ void moe_route_token_pl(const uint16_t* __restrict__ row, int e, int k, int renorm,
                                                   int shared, int lane, int* __restrict__ ids,
                                                   float* __restrict__ wts) {
  float v[PL];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int x = lane + 32 * i;
    v[i] = x < e ? bf2f(row[x]) : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int x = lane + 32 * i;
    v[i] = x < e ? expf(v[i] - mx) : 0.f;
    sum += v[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL, sum, o);
#pragma unroll
  for (int i = 0; i < PL; ++i) v[i] = v[i] / sum;
  // This lane's best entry not yet taken (bit i of `taken`: entry lane + 32 i); 0x7fffffff: none.
  uint32_t taken = 0u;
  float lv = 0.f;
  int li = 0x7fffffff;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int x = lane + 32 * i;
    if (x < e && (li == 0x7fffffff || moe_better(v[i], x, lv, li))) {
      lv = v[i];
      li = x;
    }
  }
  float wsum = 0.f, mine = 0.f;
  int my_id = 0;
  for (int c = 0; c < k; ++c) {
    float bv = lv;
    int bi = li;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(FULL, bv, o);
      const int oi = __shfl_xor_sync(FULL, bi, o);
      if (oi != 0x7fffffff && (bi == 0x7fffffff || moe_better(ov, oi, bv, bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if ((bi & 31) == lane) {  // the winner: take its entry, find its next best
      taken |= 1u << (bi >> 5);
      lv = 0.f;
      li = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < PL; ++i) {
        const int x = lane + 32 * i;
        if (x < e && !((taken >> i) & 1u) && (li == 0x7fffffff || moe_better(v[i], x, lv, li))) {
          lv = v[i];
          li = x;
        }
      }
    }
    wsum += bv;  // in choice order, as the CPU reference sums them
    if (lane == c) {
      mine = bv;
      my_id = bi;
    }
  }
  if (lane < k) {
    ids[lane] = my_id;
    wts[lane] = (renorm && wsum > 0.f) ? mine / wsum : mine;
  }
  if (shared && lane == k) {
    ids[k] = e;
    wts[k] = 1.f / (1.f + expf(-bf2f(row[e])));
  }
}

// moe_route_token_pl with the least PL (a power of two, at least 2) that holds E.
__device__ __forceinline__ void moe_route_token(const uint16_t* __restrict__ row, int e, int k, int renorm,
                                                int shared, int lane, int* __restrict__ ids,
                                                float* __restrict__ wts) {
  if (e <= 64)
    moe_route_token_pl<2>(row, e, k, renorm, shared, lane, ids, wts);
  else if (e <= 128)
    moe_route_token_pl<4>(row, e, k, renorm, shared, lane, ids, wts);
  else if (e <= 256)
    moe_route_token_pl<8>(row, e, k, renorm, shared, lane, ids, wts);
  else if (e <= 512)
    moe_route_token_pl<16>(row, e, k, renorm, shared, lane, ids, wts);
  else
    moe_route_token_pl<MOE_MAX_PER_LANE>(row, e, k, renorm, shared, lane, ids, wts);
}

extern "C" __global__ void moe_route(const uint16_t* __restrict__ logits, int t, int e, int k, int renorm,
                                     int shared, int* __restrict__ ids, float* __restrict__ wts) {
  const int tok = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (tok >= t) return;
  const int kk = k + shared;
  moe_route_token(logits + (size_t)tok * (e + shared), e, k, renorm, shared, threadIdx.x & 31,
                  ids + (size_t)tok * kk, wts + (size_t)tok * kk);
}

extern "C" __global__ void moe_sort(const int* __restrict__ ids, int pairs, int e, int* __restrict__ sorted,
                                    int* __restrict__ active, int* __restrict__ offsets, int* __restrict__ n_active,
                                    int* __restrict__ n_active_log) {
  extern __shared__ int sm[];  // count[e], start[e]
  int* count = sm;
  int* start = sm + e;
  for (int x = threadIdx.x; x < e; x += blockDim.x) {
    int c = 0;
    for (int p = 0; p < pairs; ++p) c += (__ldg(&ids[p]) == x);
    count[x] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int pos = 0, j = 0;
    for (int x = 0; x < e; ++x) {
      start[x] = pos;
      if (count[x] > 0) {
        active[j] = x;
        offsets[j] = pos;
        ++j;
      }
      pos += count[x];
    }
    offsets[j] = pos;
    *n_active = j;
    if (n_active_log) *n_active_log = j;
  }
  __syncthreads();
  for (int x = threadIdx.x; x < e; x += blockDim.x) {
    if (count[x] == 0) continue;
    int pos = start[x];
    for (int p = 0; p < pairs; ++p)
      if (__ldg(&ids[p]) == x) sorted[pos++] = p;
  }
}

extern "C" __global__ void moe_combine(const uint16_t* __restrict__ y, const int* __restrict__ ids,
                                       const float* __restrict__ wts, int k, int h,
                                       const uint16_t* __restrict__ shared, const uint16_t* __restrict__ sgate,
                                       uint16_t* __restrict__ out) {
  const int tok = blockIdx.x;
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  if (col >= h) return;
  // The token's choices in ascending expert order: ids and weights read once into registers,
  // each choice's rank (the token's experts are distinct), then the r-th smallest selected per r;
  // every index below is a compile-time one, so nothing spills to local memory.
  int id[16];
  float w[16];
  const int kk = min(k, 16);
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    id[c] = c < kk ? ids[(size_t)tok * k + c] : 0x7fffffff;
    w[c] = c < kk ? wts[(size_t)tok * k + c] : 0.f;
  }
  int rank[16];
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    int r = 0;
#pragma unroll
    for (int d = 0; d < 16; ++d) r += (id[d] < id[c]) || (id[d] == id[c] && d < c);
    rank[c] = r;
  }
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    if (r >= kk) break;
    int sel = 0;
    float ws = 0.f;
#pragma unroll
    for (int c = 0; c < 16; ++c)
      if (rank[c] == r) {
        sel = c;
        ws = w[c];
      }
    acc += ws * bf2f(y[((size_t)tok * k + sel) * h + col]);
  }
  if (shared) {
    const float g = bf2f(sgate[tok]);
    acc += (1.f / (1.f + expf(-g))) * bf2f(shared[(size_t)tok * h + col]);
  }
  out[(size_t)tok * h + col] = f2bf(acc);
}

// Grouped expert GEMV for any K (the shapes kernels/gemv.cu's 16-byte vectors cannot take: K not a
// multiple of 32 BF16 / 64 E4M3 values, as in tiny test models): one warp per (weight row, pair),
// lane-strided over K, FP32 sums, BF16 out; the same routing arguments and row mapping as
// moe_gemv_*. fp8 = 1: E4M3 weights with per-row scales (sptr) and E4M3 activations with per-row
// scales (xs); fp8 = 0: BF16. Grid (ceil(n / 8), max active experts), 256 threads.
extern "C" __global__ void moe_gemv_any(const uint64_t* __restrict__ wptr, const uint64_t* __restrict__ sptr, int fp8,
                                        const void* __restrict__ x, const float* __restrict__ xs, int x_div,
                                        const int* __restrict__ sorted, const int* __restrict__ active,
                                        const int* __restrict__ offsets, const int* __restrict__ n_active,
                                        uint16_t* __restrict__ y, int n, int k) {
  const int j = moe_column_expert_slot(blockIdx.y, *n_active);
  if (j < 0) return;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= n) return;
  const int e = active[j];
  const float ws = fp8 ? reinterpret_cast<const float*>(sptr[e])[row] : 1.f;
  for (int r = offsets[j]; r < offsets[j + 1]; ++r) {
    const int p = sorted[r];
    const int xr = p / x_div;
    float acc = 0.f;
    if (fp8) {
      const uint8_t* w = reinterpret_cast<const uint8_t*>(wptr[e]) + (size_t)row * k;
      const uint8_t* xv = reinterpret_cast<const uint8_t*>(x) + (size_t)xr * k;
      for (int i = lane; i < k; i += 32) acc += e4m32f(w[i]) * e4m32f(xv[i]);
    } else {
      const uint16_t* w = reinterpret_cast<const uint16_t*>(wptr[e]) + (size_t)row * k;
      const uint16_t* xv = reinterpret_cast<const uint16_t*>(x) + (size_t)xr * k;
      for (int i = lane; i < k; i += 32) acc += bf2f(w[i]) * bf2f(xv[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL, acc, o);
    if (lane == 0) {
      if (fp8) acc *= ws * xs[xr];
      y[(size_t)p * n + row] = f2bf(acc);
    }
  }
}

// moe_route and moe_sort in one CTA, for decode-sized batches (the host takes it up to
// gemm::moe::FUSED_MAX_TOKENS tokens): the warps route the tokens, then thread x counts expert
// x's pairs, a block-wide scan gives each expert its start and each active expert its slot, and
// thread x writes its pairs in ascending order. Same outputs as the two kernels (shared as for
// moe_route: E + 1 experts to group). blockDim: E + shared rounded up to 32, at least 256, at
// most 1024; 64 + t * (k + shared) ints of dynamic shared memory (the scans' warp totals, then
// the routed ids).
extern "C" __global__ void moe_route_sort(const uint16_t* __restrict__ logits, int t, int e, int k, int renorm,
                                          int shared, int* __restrict__ ids, float* __restrict__ wts,
                                          int* __restrict__ sorted, int* __restrict__ active,
                                          int* __restrict__ offsets, int* __restrict__ n_active,
                                          int* __restrict__ n_active_log) {
  extern __shared__ int sm[];
  const int nt = blockDim.x, x = threadIdx.x, lane = x & 31, warp = x >> 5, warps = nt >> 5;
  const int kk = k + shared;
  for (int tok = warp; tok < t; tok += warps)
    moe_route_token(logits + (size_t)tok * (e + shared), e, k, renorm, shared, lane, ids + (size_t)tok * kk,
                    wts + (size_t)tok * kk);
  __syncthreads();
  // The routed ids, copied once into shared memory (coalesced), where every thread scans them.
  const int pairs = t * kk;
  int* sid = sm + 64;
  for (int p = x; p < pairs; p += nt) sid[p] = ids[p];
  __syncthreads();
  int c = 0;
  if (x < e + shared)
    for (int p = 0; p < pairs; ++p) c += (sid[p] == x);
  // Inclusive block scans of the count and of the active flag, packed in one int each pass:
  // warp shuffles, then the warp totals in shared memory.
  int* wtot = sm;           // [warps] counts
  int* wact = sm + 32;      // [warps] active flags
  int sc = c, sa = (c > 0);
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int uc = __shfl_up_sync(FULL, sc, o), ua = __shfl_up_sync(FULL, sa, o);
    if (lane >= o) {
      sc += uc;
      sa += ua;
    }
  }
  if (lane == 31) {
    wtot[warp] = sc;
    wact[warp] = sa;
  }
  __syncthreads();
  if (warp == 0) {
    int tc = lane < warps ? wtot[lane] : 0, ta = lane < warps ? wact[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int uc = __shfl_up_sync(FULL, tc, o), ua = __shfl_up_sync(FULL, ta, o);
      if (lane >= o) {
        tc += uc;
        ta += ua;
      }
    }
    if (lane < warps) {
      wtot[lane] = tc;
      wact[lane] = ta;
    }
  }
  __syncthreads();
  const int before_c = (warp > 0 ? wtot[warp - 1] : 0) + sc - c;
  const int before_a = (warp > 0 ? wact[warp - 1] : 0) + sa - (c > 0);
  if (c > 0) {
    active[before_a] = x;
    offsets[before_a] = before_c;
    int pos = before_c;
    for (int p = 0; p < pairs; ++p)
      if (sid[p] == x) sorted[pos++] = p;
  }
  if (x == nt - 1) {
    const int na = wact[warps - 1];
    offsets[na] = pairs;
    *n_active = na;
    if (n_active_log) *n_active_log = na;
  }
}
