// rigbench W4A16 NVFP4 GEMM for Hopper (sm_90a only): wgmma with the dequantized weights as the
// register A operand. C[M, N] = A[M, K] (BF16) · W[N, K]^T (NVFP4 in the layout of
// src/formats/w4a16_pack.rs), BF16 out; docs/w4a16-notes.md has the design and its figures.
//
// The swapped GEMM: Cᵀ[N, M] = W[N, K] · Aᵀ[K, M]. The weights are wgmma's A (64 rows of N per
// warpgroup, one 16-row strip per warp), the tokens are wgmma's N (TN = 8 … 256), the
// activations its B operand in shared memory.
// - A from registers. The register-A fragment of wgmma m64nNk16 holds, per warp, the
//   mma.m16n8k16 A fragment of that warp's 16 rows (PTX ISA, "Register Fragments and Shared
//   Memory Matrix Layouts" for wgmma; CUTLASS ALayout_64x16), so the packed layout and the
//   E2M1 -> BF16 dequantization of kernels/w4a16.cu feed it unchanged: one 16-byte shared load
//   per lane and k tile, two integer ops and one bf16x2 multiply per register.
// - B in shared memory, K-major with the 128-byte swizzle (8-row atoms of 128 bytes, 1024 bytes
//   apart; 16-byte chunk c of row r stored at chunk c ^ (r & 7)). The packed weights carry a K
//   permutation inside each 64-wide k tile (MMA k position p of step j holds actual k offset
//   16·(p%8/2) + 4j + 2·(p/8) + p%2). A pre-pass (`w4wg_permute_act`, one launch before the
//   GEMM) writes the activations once in that order, K padded to the k tiles with zeros, into
//   the workspace; the GEMM then stages them with 16-byte cp.async, eight per 128-byte k tile of
//   a token row, each to its swizzled chunk. (Before: one 4-byte cp.async per BF16 pair, with
//   its own index math, issued by every CTA for every stage: about half of the CTA's issue
//   slots at TN = 64, by the count in docs/w4a16-notes.md.)
// - Pipeline: persistent CTAs walk contiguous stripes of (group of 4·WG strips, k-tile pair)
//   units, as kernels/w4a16_v2.cu; a `stages`-deep cp.async ring (16-byte L2-only copies for
//   codes, scales and the permuted activations) with one CTA barrier per stage. Each
//   warpgroup dequantizes the pair's two k tiles into two register sets and issues 4 + 4 wgmmas
//   (two commit groups), then waits for them before the next stage is reused; the `_p`
//   instances (TN >= 64) keep one commit group in flight instead (loads run stages - 2 ahead).
// - Token tiles: blockIdx.y selects tokens [TN·y, TN·y + TN); rows of a tile beyond M are zeroed
//   once and never loaded.
// - A group whose k range is split between CTAs is reduced deterministically: each slice writes
//   its FP32 partial to its own workspace slot, and the last slice to arrive (atomic counter)
//   sums the slots in slice order, writes the output and resets the counter.
// The index math here is mirrored on the CPU by src/kernels/impls/w4a16_wg.rs (`emulate`), whose
// tests check a whole launch against the exact reference GEMM (f64, 1e-9 relative) and the
// split-K reduction for independence from the CTAs' arrival order.

#include "common.cuh"

#define REG_MASK 0x81C081C0u
#define R3_MASK_A 0x00400040u
#define R3_MASK_B 0x81808180u
#define SCALE_BASE 0x70007000u

__device__ __forceinline__ uint32_t rotl32(uint32_t x, int r) { return __funnelshift_l(x, x, r); }

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 z = __hmul2(x, y);
  return *reinterpret_cast<uint32_t*>(&z);
}

// Byte `b` of the scale word as a bf16x2 pair (scale * 2^119, twice).
__device__ __forceinline__ uint32_t scale2(uint32_t word, int b) {
  uint32_t y = __byte_perm(word, 0u, (uint32_t)(b | (4 << 4) | (b << 8) | (4 << 12)));
  return (y << 4) | SCALE_BASE;
}

// One k16 step: the four A registers of rows g (a[0], a[2]) and g+8 (a[1], a[3]).
__device__ __forceinline__ void dequant_step(uint32_t q, uint32_t s_lo, uint32_t s_hi, uint32_t (&a)[4]) {
  const uint32_t r0 = q & REG_MASK;
  const uint32_t r1 = rotl32(q, 4) & REG_MASK;
  const uint32_t r2 = rotl32(q, 10) & REG_MASK;
  const uint32_t r3 = (rotl32(q, 6) & R3_MASK_A) | (rotl32(q, 14) & R3_MASK_B);
  a[0] = bf16x2_mul(r0, s_lo);
  a[1] = bf16x2_mul(r1, s_hi);
  a[2] = bf16x2_mul(r2, s_lo);
  a[3] = bf16x2_mul(r3, s_hi);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte async copy through L2 only; zero-fills when `valid` is false (src-size 0).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  // wait_group needs an immediate: dispatch the depths the host may choose (stages - 2).
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
  }
}

// Shared-memory writes of the generic proxy (cp.async, st.shared) made visible to the async
// proxy that wgmma reads B through (PTX ISA, "Async proxy").
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmmas.
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared-memory matrix descriptor of a K-major, 128-byte-swizzled B tile starting at shared
// address `addr` (PTX ISA, "Matrix Descriptor Format"; CUTLASS GmmaDescriptor): start address
// >> 4 in bits 0-13, leading byte offset 1 (unused by swizzled K-major layouts) in bits 16-29,
// stride byte offset 1024 >> 4 (between 8-row atoms) in bits 32-45, base offset 0, layout type
// 1 (128-byte swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t desc_b(uint32_t addr) {
  return (uint64_t)((addr >> 4) & 0x3FFFu) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) | ((uint64_t)1 << 62);
}

// wgmma m64nNk16, F32 += BF16 x BF16, A from registers, B (K-major) from shared memory, scale-d
// on (accumulate), no negation, no transpose. The operand lists are spelled out per N:
// {%0 … %(N/2-1)} accumulators, {a0 … a3}, the B descriptor, scale-d.
__device__ __forceinline__ void wgmma_m64n8(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3"
      "}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n16(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n32(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n256(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int TN>
__device__ __forceinline__ void wgmma_tn(float (&d)[TN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (TN == 8) wgmma_m64n8(d, a, desc);
  else if constexpr (TN == 16) wgmma_m64n16(d, a, desc);
  else if constexpr (TN == 32) wgmma_m64n32(d, a, desc);
  else if constexpr (TN == 64) wgmma_m64n64(d, a, desc);
  else if constexpr (TN == 128) wgmma_m64n128(d, a, desc);
  else wgmma_m64n256(d, a, desc);
}

// The CTA that owns unit u when `units` units are split into `ctas` contiguous stripes
// (stripe c = [c * units / ctas, (c + 1) * units / ctas)).
__device__ __forceinline__ int owner_of(long long u, int units, int ctas) {
  return (int)(((u + 1) * ctas - 1) / units);
}

// The pre-pass: actp[m, kpad] = the activations act[m, K] (row stride K, K even) in the packed
// weights' K order, kpad = 64 · k tiles, zeros from K on. Destination 16-byte chunk c of k tile
// `tile` holds MMA positions 8·(c%2) … +7 of step j = c/2, i.e. the BF16 pairs at actual k
// offsets 16q + 4j + 2·(c%2) (+0, +1) for q = 0 … 3, in that order. One thread per destination
// chunk: four 4-byte reads (the 8 threads of one k tile read one 128-byte row segment), one
// 16-byte write. Launch: ceil(M · kpad / 8 / 256) CTAs of 256 threads.
extern "C" __global__ void __launch_bounds__(256) w4wg_permute_act(const __nv_bfloat16* __restrict__ act,
                                                                   __nv_bfloat16* __restrict__ actp, int M, int K,
                                                                   int kpad) {
  const int cpr = kpad >> 3;  // destination chunks per row
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)M * cpr) return;
  const int m = (int)(i / cpr), cc = (int)(i % cpr);
  const int k0 = (cc >> 3) * 64 + 4 * ((cc & 7) >> 1) + 2 * (cc & 1);
  const uint32_t* row = reinterpret_cast<const uint32_t*>(act + (size_t)m * K);
  uint32_t v[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int k = k0 + 16 * q;
    v[q] = k < K ? __ldg(row + (k >> 1)) : 0u;
  }
  *reinterpret_cast<uint4*>(actp + (size_t)m * kpad + (size_t)cc * 8) = make_uint4(v[0], v[1], v[2], v[3]);
}

// Launch (after w4wg_permute_act; `act` is its output actp, row stride 64 · kt_n; K is kept in
// the argument list but no longer read): grid (CTAs, token tiles), 128·WG threads, dynamic shared
// memory stages · STAGE + 1024 bytes (STAGE as below; the 1024 align the ring to the swizzle
// period).
// Only the first and the last segment of a CTA's stripe can cover part of a group's k range, so
// partial sums go to workspace slot (token tile, CTA, 0 = first segment / 1 = last), each
// 64·WG rows × TN floats: token tiles × CTAs × 2 slots when any group is split. Counters: token
// tiles × groups, zero before the first launch (the kernel leaves them zero).
template <int TN, int WG, bool PIPE>
__device__ __forceinline__ void w4wg_body(const uint8_t* __restrict__ wq, const uint32_t* __restrict__ sc,
                                          const __nv_bfloat16* __restrict__ actp, __nv_bfloat16* __restrict__ out,
                                          float* __restrict__ ws, unsigned* __restrict__ counters, int M, int N, int K,
                                          int strips, int kt_n, int stages, float out_scale) {
  constexpr int GS = 4 * WG;                // strips per group: one per warp
  constexpr int ROWS = GS * 16;             // output rows per group
  constexpr int NTHR = 128 * WG;
  constexpr int A_TILE = TN * 128;          // one 64-wide k tile of TN token rows (BF16)
  constexpr int W_OFF = 2 * A_TILE;         // codes of the pair: [GS strips][1024 bytes]
  constexpr int S_OFF = W_OFF + GS * 1024;  // scale words of the pair: [GS strips][128 bytes]
  constexpr int STAGE = (S_OFF + GS * 128 + 1023) / 1024 * 1024;
  constexpr int NACC = TN / 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ unsigned s_last;
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t sbase = (raw + 1023u) & ~1023u;  // shared address of stage 0
  unsigned char* smem = smem_raw + (sbase - raw);  // the same byte, generic

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;  // warp = strip within the group
  const int g = lane >> 2, t = lane & 3;
  const int pairs = kt_n >> 1;
  const int groups = (strips + GS - 1) / GS;
  const int units = groups * pairs;
  const int ctas = gridDim.x, c = blockIdx.x;
  const int tile = blockIdx.y;
  const int tok0 = tile * TN;
  const int kpad = kt_n * 64;  // row stride of the permuted activations
  const int mt = min(TN, M - tok0);  // tokens of this tile
  const int u_begin = (int)((long long)c * units / ctas);
  const int u_end = (int)((long long)(c + 1) * units / ctas);

  // Token rows mt .. TN-1 of every activation tile are never loaded: zero them once.
  {
    const int per_tile = (TN - mt) * 8;  // 16-byte chunks
    for (int i = tid; i < stages * 2 * per_tile; i += NTHR) {
      const int tl = i / per_tile, r = i % per_tile;
      *reinterpret_cast<uint4*>(smem + (tl >> 1) * STAGE + (tl & 1) * A_TILE + (mt + (r >> 3)) * 128 + (r & 7) * 16) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  }

  for (int u = u_begin; u < u_end;) {
    const int grp = u / pairs;
    const int pa = u % pairs;
    const int pb = min(pairs, pa + (u_end - u));
    const int np = pb - pa;
    const int strip0 = grp * GS;
    // Stage `st` <- k-tile pair p of this group (k tiles 2p, 2p+1).
    auto load = [&](int st, int p) {
      const uint32_t base = sbase + st * STAGE;
      for (int i = tid; i < GS * 64; i += NTHR) {
        const int r = i >> 6, ch = i & 63;
        const int strip = strip0 + r;
        const bool ok = strip < strips;
        const uint8_t* src = wq + ((size_t)(ok ? strip : 0) * kt_n + 2 * p) * 512 + ch * 16;
        cp_async16(base + W_OFF + r * 1024 + ch * 16, src, ok);
      }
      for (int i = tid; i < GS * 8; i += NTHR) {
        const int r = i >> 3, part = i & 7;
        const int strip = strip0 + r;
        const bool ok = strip < strips;
        const uint32_t* src = sc + ((size_t)(ok ? strip : 0) * pairs + p) * 32 + part * 4;
        cp_async16(base + S_OFF + r * 128 + part * 16, src, ok);
      }
      // Activations, already in the weights' K order (w4wg_permute_act): 16-byte chunk ch of
      // k tile h of token m goes to chunk ch ^ (m & 7) of row m.
      for (int i = tid; i < mt * 16; i += NTHR) {
        const int m = i >> 4, h = (i >> 3) & 1, ch = i & 7;
        const __nv_bfloat16* src = actp + (size_t)(tok0 + m) * kpad + (2 * p + h) * 64 + ch * 8;
        cp_async16(base + h * A_TILE + m * 128 + ((ch ^ (m & 7)) << 4), src, true);
      }
    };

    float acc[NACC];
#pragma unroll
    for (int r = 0; r < NACC; ++r) acc[r] = 0.f;
    __syncthreads();  // the previous segment's stages are no longer read; the zeroing is done
    // Tiles loaded ahead: stages - 1, or with PIPE stages - 2 (a stage is reused two iterations
    // after it was read, while the wgmmas of the last iteration may still run).
    const int ahead = PIPE ? stages - 2 : stages - 1;
    for (int s = 0; s < ahead; ++s) {
      if (s < np) load(s, pa + s);
      cp_async_commit();
    }
    // One stage: wait for it, load `ahead` tiles on, dequantize its two k tiles and issue
    // 4 + 4 wgmmas (two commit groups). Without PIPE both groups are waited for at the end; with
    // PIPE one group stays in flight (wait_group 1 before each register set is rewritten), so
    // the tensor cores work while the next stage is waited for and dequantized.
    uint32_t a0[4][4], a1[4][4];
    for (int i = 0; i < np; ++i) {
      cp_async_wait_dyn(ahead - 1);
      fence_proxy_async();
      __syncthreads();  // stage i has landed for every thread; the stage reloaded below is no longer read
      const int nxt = i + ahead;
      if (nxt < np) load(nxt % stages, pa + nxt);
      cp_async_commit();
      const int st = i % stages;
      const unsigned char* b = smem + st * STAGE;
      const uint32_t bs = sbase + st * STAGE;
      const uint4 w0 = *reinterpret_cast<const uint4*>(b + W_OFF + warp * 1024 + lane * 16);
      const uint4 w1 = *reinterpret_cast<const uint4*>(b + W_OFF + warp * 1024 + 512 + lane * 16);
      const uint32_t sw = *reinterpret_cast<const uint32_t*>(b + S_OFF + warp * 128 + lane * 4);
      {
        const uint32_t lo = scale2(sw, 0), hi = scale2(sw, 1);
        dequant_step(w0.x, lo, hi, a0[0]);
        dequant_step(w0.y, lo, hi, a0[1]);
        dequant_step(w0.z, lo, hi, a0[2]);
        dequant_step(w0.w, lo, hi, a0[3]);
      }
#pragma unroll
      for (int r = 0; r < NACC; ++r) fence_reg(acc[r]);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_tn<TN>(acc, a0[j], desc_b(bs + 32 * j));
      wgmma_commit();
      if constexpr (PIPE) wgmma_wait<1>();  // the previous stage's second group: a1 is free
      {
        const uint32_t lo = scale2(sw, 2), hi = scale2(sw, 3);
        dequant_step(w1.x, lo, hi, a1[0]);
        dequant_step(w1.y, lo, hi, a1[1]);
        dequant_step(w1.z, lo, hi, a1[2]);
        dequant_step(w1.w, lo, hi, a1[3]);
      }
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_tn<TN>(acc, a1[j], desc_b(bs + A_TILE + 32 * j));
      wgmma_commit();
      if constexpr (PIPE) {
        wgmma_wait<1>();  // this stage's first group: a0 is free
      } else {
        wgmma_wait<0>();
      }
#pragma unroll
      for (int r = 0; r < NACC; ++r) fence_reg(acc[r]);
    }
    if constexpr (PIPE) {
      wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < NACC; ++r) fence_reg(acc[r]);
    }
    cp_async_wait<0>();

    // Accumulator d[4·jn + 2·h + e] holds row 16·warp + g + 8h of the group, token 8·jn + 2t + e
    // (the wgmma D fragment; CUTLASS CLayout_64xN).
    if (pa == 0 && pb == pairs) {
#pragma unroll
      for (int r = 0; r < NACC; ++r) {
        const int n = (strip0 + warp) * 16 + g + 8 * ((r >> 1) & 1);
        const int m = 8 * (r >> 2) + 2 * t + (r & 1);
        if (n < N && m < mt) out[(size_t)(tok0 + m) * N + n] = __float2bfloat16_rn(acc[r] * out_scale);
      }
    } else {
      const long long g0 = (long long)grp * pairs;
      const int first = owner_of(g0, units, ctas);
      const int last = owner_of(g0 + pairs - 1, units, ctas);
      const int slices = last - first + 1;
      const size_t gi = (size_t)tile * groups + grp;
      float* slot = ws + (((size_t)tile * ctas + c) * 2 + (u == u_begin ? 0 : 1)) * (size_t)(ROWS * TN);
#pragma unroll
      for (int r = 0; r < NACC; ++r) {
        const int row = warp * 16 + g + 8 * ((r >> 1) & 1);
        const int m = 8 * (r >> 2) + 2 * t + (r & 1);
        if (m < mt) slot[m * ROWS + row] = acc[r];
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const unsigned prev = atomicAdd(&counters[gi], 1u);
        s_last = (prev == (unsigned)(slices - 1)) ? 1u : 0u;
      }
      __syncthreads();
      if (s_last) {
        __threadfence();
        // CTA q holds this group in its first segment (slot part 0) when its stripe starts in
        // the group, which every CTA after `first` does; `first` holds it in its last segment
        // (part 1) when its stripe started in an earlier group. Summed in slice order
        // (deterministic), CH outputs per thread at a time, QB slices' loads issued before their
        // adds.
        const int first_part = ((long long)first * units / ctas) < g0 ? 1 : 0;
        constexpr int PER = ROWS * TN / NTHR;  // outputs per thread (TN / 2)
        constexpr int CH = PER < 8 ? PER : 8;
        constexpr int QB = 4;
        for (int e0 = 0; e0 < PER && tid + e0 * NTHR < ROWS * mt; e0 += CH) {
          float sum[CH];
#pragma unroll
          for (int e = 0; e < CH; ++e) sum[e] = 0.f;
          for (int q0 = first; q0 <= last; q0 += QB) {
            float v[QB][CH];
#pragma unroll
            for (int b = 0; b < QB; ++b) {
              const int q = q0 + b;
              const float* src =
                  ws + (((size_t)tile * ctas + q) * 2 + (q == first ? first_part : 0)) * (size_t)(ROWS * TN);
#pragma unroll
              for (int e = 0; e < CH; ++e) {
                const int idx = tid + (e0 + e) * NTHR;
                v[b][e] = (q <= last && idx < ROWS * mt) ? __ldcg(&src[idx]) : 0.f;
              }
            }
#pragma unroll
            for (int b = 0; b < QB; ++b)
#pragma unroll
              for (int e = 0; e < CH; ++e)
                if (q0 + b <= last) sum[e] += v[b][e];
          }
#pragma unroll
          for (int e = 0; e < CH; ++e) {
            const int idx = tid + (e0 + e) * NTHR;
            const int m = idx / ROWS, row = idx % ROWS;
            const int n = strip0 * 16 + row;
            if (idx < ROWS * mt && n < N) out[(size_t)(tok0 + m) * N + n] = __float2bfloat16_rn(sum[e] * out_scale);
          }
        }
        if (tid == 0) counters[gi] = 0u;
      }
    }
    u += np;
  }
}

#define W4WG_KERNEL(TN, WG)                                                                                     \
  extern "C" __global__ void __launch_bounds__(WG * 128, 1) w4wg_t##TN##_g##WG(                                 \
      const uint8_t* __restrict__ wq, const uint32_t* __restrict__ sc, const __nv_bfloat16* __restrict__ act,    \
      __nv_bfloat16* __restrict__ out, float* __restrict__ ws, unsigned* __restrict__ counters, int M, int N,     \
      int K, int strips, int kt_n, int stages, float out_scale) {                                                \
    w4wg_body<TN, WG, false>(wq, sc, act, out, ws, counters, M, N, K, strips, kt_n, stages, out_scale);         \
  }
// The same with one commit group of wgmmas kept in flight (PIPE; stages >= 3): for the
// compute-bound token tiles.
#define W4WG_PIPE_KERNEL(TN, WG)                                                                                \
  extern "C" __global__ void __launch_bounds__(WG * 128, 1) w4wg_t##TN##_g##WG##_p(                             \
      const uint8_t* __restrict__ wq, const uint32_t* __restrict__ sc, const __nv_bfloat16* __restrict__ act,    \
      __nv_bfloat16* __restrict__ out, float* __restrict__ ws, unsigned* __restrict__ counters, int M, int N,     \
      int K, int strips, int kt_n, int stages, float out_scale) {                                                \
    w4wg_body<TN, WG, true>(wq, sc, act, out, ws, counters, M, N, K, strips, kt_n, stages, out_scale);          \
  }

W4WG_KERNEL(8, 1)
W4WG_KERNEL(8, 2)
W4WG_KERNEL(16, 1)
W4WG_KERNEL(16, 2)
W4WG_KERNEL(32, 1)
W4WG_KERNEL(32, 2)
W4WG_KERNEL(64, 1)
W4WG_KERNEL(64, 2)
W4WG_KERNEL(128, 1)
W4WG_KERNEL(128, 2)
W4WG_KERNEL(256, 1)
W4WG_KERNEL(256, 2)
W4WG_PIPE_KERNEL(64, 1)
W4WG_PIPE_KERNEL(64, 2)
W4WG_PIPE_KERNEL(128, 1)
W4WG_PIPE_KERNEL(128, 2)
W4WG_PIPE_KERNEL(256, 1)
W4WG_PIPE_KERNEL(256, 2)
