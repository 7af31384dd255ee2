// rigbench's raw-pointer entry point to vLLM's Marlin GEMM for NVFP4 weights (E2M1 codes, E4M3
// block scales per 16 elements along K, one FP32 tensor scale) and BF16 activations/output.
//
// This file is rigbench's own; it is compiled by scripts/build-marlin.sh together with the Marlin
// kernel templates that scripts/fetch-peers.sh extracts from the vLLM source distribution on PyPI
// (csrc/quantization/marlin/{marlin_template.h,kernel.h,...} and csrc/core/scalar_type.hpp). No
// PyTorch header is used: the one macro the templates need comes from shim/.
//
// Compiled several times: with -DRB_MARLIN_PART=1..4 it instantiates the kernels of that many
// 16-row M blocks per CTA (part 1 also the 8-row variant); with -DRB_MARLIN_PART=0 it holds the
// host functions below. The parts compile in parallel and are linked into one shared library.
//
// Facts this follows (vLLM's csrc/quantization/marlin/marlin.cu and the Python side,
// vllm/model_executor/layers/quantization/utils/marlin_utils*.py, as read for docs/w4a16-notes.md):
// - CTA tiles (thread_k, thread_n, threads): small M (one 16-row block) prefers (128,128,256),
//   then (64,128,128), (128,64,128); larger M prefers (64,256,256), then the same two. A tile
//   is usable when K and N are multiples of it and its 4-stage pipeline fits in shared memory.
//   When the grid would have at most a quarter of a wave of work, (128,64,128) is taken if it
//   fits (more, narrower tiles).
// - M is split into launches of at most 4 blocks of 16 rows × 16 parallel problems (× 8 when
//   N ≤ 4096); each launch runs one persistent CTA per SM with the largest opt-in shared memory.
// - Workspace: one int lock per SM (zeroed once; the kernel leaves them zero), and an FP32
//   buffer of SMs × min(round_up(M, 16), 64) × 256 values for the FP32 global reduction.
// - Weight layout: gptq_marlin_repack's 16×64 tiles; scales permuted and re-encoded as S0E5M3
//   (see scripts/peer_kernels.py, which does both on the GPU with PyTorch ops).

#ifndef RB_MARLIN_PART
#define RB_MARLIN_PART 0
#endif

#include "kernel.h"

#if RB_MARLIN_PART >= 1
#include "marlin_template.h"
#endif

#include <cstdio>
#include <cstring>

namespace rbm {

constexpr auto kA = vllm::kBFloat16.id();
constexpr auto kB = vllm::kFE2M1f.id();
constexpr auto kC = vllm::kBFloat16.id();
constexpr auto kS = vllm::kFE4M3fn.id();
constexpr int kStages = 4;  // Marlin's pipeline depth on sm_80 and newer
constexpr int kGroupBlocks = 1;  // NVFP4: one scale per 16 elements = one 16-wide k block

using KernelFn = void (*)(MARLIN_KERNEL_PARAMS);

// One CTA tile shape.
struct Tile {
  int k;
  int n;
  int threads;
};

}  // namespace rbm

// The 15 kernels (tile threads, 16-row blocks, n/16, k/16, 8-row variant): each part defines the
// accessors of its own kernels; part 0 declares all of them.
#define RB_KERNELS(X)      \
  X(256, 1, 8, 8, false)   \
  X(128, 1, 8, 4, false)   \
  X(128, 1, 4, 8, false)   \
  X(256, 1, 8, 8, true)    \
  X(128, 1, 8, 4, true)    \
  X(128, 1, 4, 8, true)    \
  X(256, 2, 16, 4, false)  \
  X(128, 2, 8, 4, false)   \
  X(128, 2, 4, 8, false)   \
  X(256, 3, 16, 4, false)  \
  X(128, 3, 8, 4, false)   \
  X(128, 3, 4, 8, false)   \
  X(256, 4, 16, 4, false)  \
  X(128, 4, 8, 4, false)   \
  X(128, 4, 4, 8, false)

#define RB_NAME(T, MB, NB, KB, M8) rb_marlin_kernel_##T##_##MB##_##NB##_##KB##_##M8
#define RB_DECLARE(T, MB, NB, KB, M8) rbm::KernelFn RB_NAME(T, MB, NB, KB, M8)();
RB_KERNELS(RB_DECLARE)

#define RB_DEFINE(T, MB, NB, KB, M8)                                                            \
  namespace marlin {                                                                            \
  template __global__ void Marlin<rbm::kA, rbm::kB, rbm::kC, rbm::kS, T, MB, NB, KB, M8,       \
                                  rbm::kStages, rbm::kGroupBlocks, false>(MARLIN_KERNEL_PARAMS); \
  }                                                                                             \
  rbm::KernelFn RB_NAME(T, MB, NB, KB, M8)() {                                                  \
    return marlin::Marlin<rbm::kA, rbm::kB, rbm::kC, rbm::kS, T, MB, NB, KB, M8, rbm::kStages, \
                          rbm::kGroupBlocks, false>;                                            \
  }
#define RB_DEFINE_IF_PART(T, MB, NB, KB, M8) RB_DEFINE_##MB(T, MB, NB, KB, M8)
#define RB_SKIP(T, MB, NB, KB, M8)
#if RB_MARLIN_PART == 1
#define RB_DEFINE_1 RB_DEFINE
#else
#define RB_DEFINE_1 RB_SKIP
#endif
#if RB_MARLIN_PART == 2
#define RB_DEFINE_2 RB_DEFINE
#else
#define RB_DEFINE_2 RB_SKIP
#endif
#if RB_MARLIN_PART == 3
#define RB_DEFINE_3 RB_DEFINE
#else
#define RB_DEFINE_3 RB_SKIP
#endif
#if RB_MARLIN_PART == 4
#define RB_DEFINE_4 RB_DEFINE
#else
#define RB_DEFINE_4 RB_SKIP
#endif
RB_KERNELS(RB_DEFINE_IF_PART)

#if RB_MARLIN_PART == 0

namespace rbm {

// The kernel for (tile, M blocks, 8-row variant), or null when this build has none.
KernelFn find_kernel(Tile t, int mb, bool m8) {
#define RB_CASE(T, MB, NB, KB, M8) \
  if (t.threads == T && mb == MB && t.n == NB * 16 && t.k == KB * 16 && m8 == M8) \
    return RB_NAME(T, MB, NB, KB, M8)();
  RB_KERNELS(RB_CASE)
#undef RB_CASE
  return nullptr;
}

constexpr Tile kSmallM[3] = {{128, 128, 256}, {64, 128, 128}, {128, 64, 128}};
constexpr Tile kLargeM[3] = {{64, 256, 256}, {64, 128, 128}, {128, 64, 128}};
constexpr Tile kNarrow = {128, 64, 128};

// Shared memory (bytes) a tile's pipeline needs for `mb` blocks of 16 rows: BF16 activation
// stages, packed 4-bit weight stages, the reduction/bias scratch (which reuses the weight
// stages when smaller), and the BF16-sized scale stages of the tile's 16-element groups.
int smem_bytes(Tile t, int mb) {
  const int a = kStages * (16 * mb) * t.k * 2;
  const int b = kStages * (t.k * t.n / 8) * 4;
  const int red = (16 * mb) * (t.n + 8) * 2;
  const int bias = t.n * 2;
  int scratch = (b < red ? b : red) + bias;
  const int big = b > red ? b : red;
  if (big > scratch) scratch = big;
  const int scales = kStages * ((t.k + 15) / 16) * t.n * 2;
  return scratch + a + scales;
}

bool tile_fits(Tile t, int mb, int n, int k, int smem_limit) {
  return k % t.k == 0 && n % t.n == 0 && smem_bytes(t, mb) <= smem_limit;
}

// Device facts, read once per device.
struct Device {
  bool known = false;
  int sms = 0;
  int smem_optin = 0;
  int cc = 0;
};
Device g_dev[64];

int device_facts(Device* out, char* err, int err_len) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    snprintf(err, err_len, "no current CUDA device");
    return 2;
  }
  Device& d = g_dev[dev];
  if (!d.known) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      snprintf(err, err_len, "cudaDeviceGetAttribute failed on device %d", dev);
      return 2;
    }
    d.cc = major * 10 + minor;
    d.known = true;
  }
  *out = d;
  return 0;
}

// One launch of the plan.
struct Launch {
  int rows;  // M rows of this launch
  int mb;    // 16-row blocks per CTA
  bool m8;   // the 8-row variant
  Tile tile;
  KernelFn fn;
};

// The launches for M×N×K on `d` (at most `cap`); returns how many, or -1 with `err` set.
int plan(const Device& d, int m, int n, int k, Launch* out, int cap, char* err, int err_len) {
  if (m <= 0 || n <= 0 || k <= 0) {
    snprintf(err, err_len, "M, N, K must be positive (M=%d N=%d K=%d)", m, n, k);
    return -1;
  }
  if (n % 64 != 0 || k % 64 != 0 || k % 16 != 0) {
    snprintf(err, err_len,
             "Marlin needs N %% 64 == 0 and K %% 64 == 0 (N=%d K=%d): pad the weight first", n, k);
    return -1;
  }
  const int par_cap = n <= 4096 ? 16 * 8 : 16;
  int left = m, max_mb = 4, count = 0;
  while (left > 0) {
    int par = left / (max_mb * 16);
    if (par > par_cap) par = par_cap;
    const int rows = par > 0 ? par * max_mb * 16 : left;
    int mb = (rows + 15) / 16;
    if (mb > max_mb) mb = max_mb;
    const bool m8 = rows <= 8;
    const Tile* list = mb > 1 ? kLargeM : kSmallM;
    Tile chosen = {-1, -1, -1};
    for (int i = 0; i < 3; i++) {
      if (tile_fits(list[i], mb, n, k, d.smem_optin - 512) && find_kernel(list[i], mb, m8)) {
        chosen = list[i];
        break;
      }
    }
    if (chosen.k > 0 && (n / chosen.n) * ((rows + mb * 16 - 1) / (mb * 16)) * 4 <= d.sms &&
        tile_fits(kNarrow, mb, n, k, d.smem_optin) && find_kernel(kNarrow, mb, m8)) {
      chosen = kNarrow;
    }
    if (chosen.k < 0) {
      if (max_mb > 1) {
        max_mb--;
        continue;
      }
      snprintf(err, err_len, "no Marlin tile fits M=%d N=%d K=%d in %d bytes of shared memory", m,
               n, k, d.smem_optin);
      return -1;
    }
    if (count == cap) {
      snprintf(err, err_len, "M=%d needs more than %d launches", m, cap);
      return -1;
    }
    out[count++] = Launch{rows, mb, m8, chosen, find_kernel(chosen, mb, m8)};
    left -= rows;
  }
  return count;
}

}  // namespace rbm

extern "C" {

// Version of this entry point's C interface (scripts/peer_kernels.py checks it).
int rb_marlin_abi_version(void) { return 1; }

// Sizes of the workspace for M rows: FP32 reduction values and int locks (both ≥ 1).
int rb_marlin_workspace(int m, long long* c_tmp_floats, long long* locks, char* err, int err_len) {
  rbm::Device d;
  if (int rc = rbm::device_facts(&d, err, err_len)) return rc;
  int rows = (m + 15) / 16 * 16;
  if (rows > 64) rows = 64;
  if (rows < 16) rows = 16;
  *c_tmp_floats = (long long)d.sms * rows * 256;
  *locks = d.sms;
  return 0;
}

// The launches M×N×K runs as, in words ("M=1: 1 launch: rows 1, 8-row blocks, tile
// k128 n128 256 threads, 132 CTAs").
int rb_marlin_describe(int m, int n, int k, char* out, int out_len) {
  rbm::Device d;
  if (int rc = rbm::device_facts(&d, out, out_len)) return rc;
  rbm::Launch l[64];
  const int c = rbm::plan(d, m, n, k, l, 64, out, out_len);
  if (c < 0) return 3;
  int w = snprintf(out, out_len, "%d launch%s of %d CTAs (one per SM), %d B dynamic smem:", c,
                   c == 1 ? "" : "es", d.sms, d.smem_optin);
  for (int i = 0; i < c && i < 4 && w < out_len; i++) {
    w += snprintf(out + w, out_len - w, "%s M=%d as %s, tile k%d×n%d, %d threads", i ? ";" : "",
                  l[i].rows, l[i].m8 ? "8-row block" : (l[i].mb == 1 ? "1×16 rows" : "n×16 rows"),
                  l[i].tile.k, l[i].tile.n, l[i].tile.threads);
    if (l[i].mb > 1 && w < out_len) w += snprintf(out + w, out_len - w, " (%d×16)", l[i].mb);
  }
  if (c > 4 && w < out_len) snprintf(out + w, out_len - w, "; …");
  return 0;
}

// C[M, N] (BF16, row stride N) = A[M, K] (BF16, row stride lda elements) · Wᵀ, W the Marlin-
// repacked NVFP4 weight `b` with its processed scales `s` and FP32 global scale `gs` (one
// value, on the device). `c_tmp`/`locks`: the workspace of rb_marlin_workspace (locks zeroed
// before the first call). `stream`: a cudaStream_t. Returns 0, or non-zero with `err` set (a
// plan that does not exist, a misaligned pointer, or the launch error).
int rb_marlin_nvfp4_bf16(const void* a, const void* b, const void* s, const float* gs, void* c,
                         float* c_tmp, int* locks, int m, int n, int k, int lda,
                         int use_fp32_reduce, void* stream, char* err, int err_len) {
  if (((unsigned long long)a & 15) || ((unsigned long long)c & 15) || lda % 8 != 0) {
    snprintf(err, err_len, "A and C must be 16-byte aligned and lda a multiple of 8 (lda=%d)", lda);
    return 4;
  }
  rbm::Device d;
  if (int rc = rbm::device_facts(&d, err, err_len)) return rc;
  rbm::Launch l[64];
  const int count = rbm::plan(d, m, n, k, l, 64, err, err_len);
  if (count < 0) return 3;
  const char* ap = static_cast<const char*>(a);
  char* cp = static_cast<char*>(c);
  for (int i = 0; i < count; i++) {
    // Setting the attribute is not a stream operation, so it is also safe during graph capture.
    if (cudaFuncSetAttribute(l[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             d.smem_optin) != cudaSuccess) {
      snprintf(err, err_len, "cudaFuncSetAttribute: %s", cudaGetErrorString(cudaGetLastError()));
      return 5;
    }
    l[i].fn<<<d.sms, l[i].tile.threads, d.smem_optin, static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const int4*>(ap), static_cast<const int4*>(b),
        reinterpret_cast<int4*>(cp), reinterpret_cast<int4*>(c_tmp), nullptr, nullptr,
        static_cast<const int4*>(s), gs, nullptr, l[i].rows, n, k, lda, locks, false, false,
        use_fp32_reduce != 0, d.smem_optin);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      snprintf(err, err_len, "Marlin launch (M=%d part %d): %s", m, i, cudaGetErrorString(e));
      return 6;
    }
    ap += (size_t)l[i].rows * lda * 2;
    cp += (size_t)l[i].rows * n * 2;
  }
  return 0;
}

}  // extern "C"

#endif  // RB_MARLIN_PART == 0
