//! Typed launchers of the kernel bench's CUDA sources (`kernels/fp8_quant.cu`,
//! `kernels/w4a16.cu`, `kernels/w4a16_v2.cu`, `kernels/w4a16_wg.cu`), declared with
//! [`kernel_launchers!`](crate::kernel_launchers): one function per kernel (or per family of
//! kernels a macro stamps out), checked against the sources by `tests/it/kernel_abi.rs`. Shapes
//! follow docs/architecture.md ("Terms"): activations M×K, weights N×K, output M×N.

/// `kernels/fp8_quant.cu`: FP8 E4M3 row-wise quantization of BF16 activations (alone or fused
/// with RMSNorm) and the row-wise scale epilogue.
pub mod fp8_quant {
    use crate::gpu::launch::DevPtr;
    crate::kernel_launchers! {
        source "fp8_quant";
        /// Quantize M rows of K BF16 values to E4M3 with one FP32 scale per row (the variants
        /// `_t{threads}_v{vectors}` of `src/kernels/fp8_quant.rs`); `static_scale` > 0: that
        /// scale for every row instead of amax / 448.
        pub fn quant_rows = family "fp8_quant_rows_bf16_t*_v*"(r#in: DevPtr<u16>, m: i32, k: i32, static_scale: f32, out: DevPtr<u8>, scales: DevPtr<f32>);
        /// RMSNorm (weights `w`, epsilon `eps`) then row-wise E4M3 quantization.
        pub fn rmsnorm_quant_rows = family "rmsnorm_fp8_quant_rows_bf16_t*_v*"(r#in: DevPtr<u16>, w: DevPtr<f32>, eps: f32, m: i32, k: i32, out: DevPtr<u8>, scales: DevPtr<f32>);
        /// Row-wise E4M3 quantization for any K (one CTA of 1024 threads per row).
        pub fn fp8_quant_rows_bf16_any = "fp8_quant_rows_bf16_any"(r#in: DevPtr<u16>, m: i32, k: i32, static_scale: f32, out: DevPtr<u8>, scales: DevPtr<f32>);
        /// `out[m][n] = acc[m][n] · tok_scale[m] · chan_scale[n]` as BF16 (M×N).
        pub fn fp8_rowwise_scale_out = "fp8_rowwise_scale_out"(acc: DevPtr<f32>, m: i32, n: i32, tok_scale: DevPtr<f32>, chan_scale: DevPtr<f32>, out: DevPtr<u16>);
    }
}

/// `kernels/w4a16.cu`: the W4A16 NVFP4 GEMM (split-K variants `_ks`) and its dequantizer.
pub mod w4a16 {
    use crate::gpu::launch::{Bf16, DevPtr, U32x4};
    crate::kernel_launchers! {
        source "w4a16";
        /// The W4A16 GEMM `w4a16_nt{NT}_w{WARPS}_n{WN}[_ks]` (M×K BF16 activations, N×K
        /// packed E2M1 weights with E4M3 block scales, M×N BF16 out).
        pub fn gemm = family "w4a16_nt*_w*_n*"(wq: DevPtr<U32x4>, sc: DevPtr<u32>, act: DevPtr<Bf16>, out: DevPtr<Bf16>, ws: DevPtr<f32>, counters: DevPtr<u32>, m: i32, n: i32, k: i32, strips: i32, kt_n: i32, splits: i32, pairs_per_split: i32, out_scale: f32);
        /// The grouped expert W4A16 GEMM `w4a16_moe[_ns]_w{WARPS}_n{WN}` (`src/gemm/moe.rs`,
        /// [`crate::gemm::w4a16::GroupedW4`]): per-expert code / scale addresses and epilogue
        /// factors, the routed pairs grouped by expert.
        pub fn moe = family "w4a16_moe_*_n*"(wqp: DevPtr<u64>, scp: DevPtr<u64>, out_scales: DevPtr<f32>, act: DevPtr<Bf16>, x_div: i32, sorted: DevPtr<i32>, active: DevPtr<i32>, offsets: DevPtr<i32>, n_active: DevPtr<i32>, out: DevPtr<Bf16>, n: i32, k: i32, strips: i32, kt_n: i32);
        /// Dequantize the packed N×K weights to BF16.
        pub fn w4a16_dequant_bf16 = "w4a16_dequant_bf16"(wq: DevPtr<U32x4>, sc: DevPtr<u32>, wout: DevPtr<Bf16>, n: i32, k: i32, strips: i32, kt_n: i32);
    }
}

/// `kernels/w4a16_v2.cu`: the second W4A16 GEMM (stream-K units) and an empty kernel for the
/// launch-overhead anatomy.
pub mod w4a16_v2 {
    use crate::gpu::launch::{Bf16, DevPtr, U32x4};
    crate::kernel_launchers! {
        source "w4a16_v2";
        /// The W4A16 GEMM `w4v2_nt{NT}_w{WARPS}_n{WN}`.
        pub fn gemm = family "w4v2_nt*_w*_n*"(wq: DevPtr<U32x4>, sc: DevPtr<u32>, act: DevPtr<Bf16>, out: DevPtr<Bf16>, ws: DevPtr<f32>, counters: DevPtr<u32>, m: i32, n: i32, k: i32, strips: i32, kt_n: i32, units: i32, stages: i32, max_slices: i32, out_scale: f32);
        /// A kernel that does nothing (writes `sink` only when `v` is 0x7fffffff).
        pub fn w4v2_empty = "w4v2_empty"(sink: DevPtr<i32>, v: i32);
    }
}

/// `kernels/w4a16_wg.cu`: the sm_90a wgmma W4A16 GEMM and its activation pre-pass.
pub mod w4a16_wg {
    use crate::gpu::launch::{Bf16, DevPtr};
    crate::kernel_launchers! {
        source "w4a16_wg";
        /// The pre-pass: the M×K BF16 activations `act` written to `actp` (M×`kpad`, `kpad` = 64
        /// · k tiles) in the packed weights' K order, zeros from K on.
        pub fn w4wg_permute_act = "w4wg_permute_act"(act: DevPtr<Bf16>, actp: DevPtr<Bf16>, m: i32, k: i32, kpad: i32);
        /// The wgmma W4A16 GEMM `w4wg_t{TN}_g{WG}[_p]` (`act`: the pre-pass's output, row stride
        /// 64 · `kt_n`).
        pub fn gemm = family "w4wg_t*_g*"(wq: DevPtr<u8>, sc: DevPtr<u32>, act: DevPtr<Bf16>, out: DevPtr<Bf16>, ws: DevPtr<f32>, counters: DevPtr<u32>, m: i32, n: i32, k: i32, strips: i32, kt_n: i32, stages: i32, out_scale: f32);
    }
}

/// `kernels/gemv.cu`: the small-M GEMMs (M ≤ 8) of BF16 and FP8 E4M3 weights
/// (`src/gemm/gemv.rs`).
pub mod gemv {
    use crate::gpu::launch::{DevPtr, U32x4};
    crate::kernel_launchers! {
        source "gemv";
        /// `y[M, N] = bf16(x[M, K] · w[N, K]ᵀ)`, `gemv_bf16_w{WARPS}_u{UNROLL}`.
        pub fn bf16 = family "gemv_bf16_w*_u*"(w: DevPtr<U32x4>, x: DevPtr<U32x4>, y: DevPtr<u16>, m: i32, n: i32, k: i32);
        /// `y[M, N] = x[M, K] · w[N, K]ᵀ` as FP32, `gemv_bf16f32_w{WARPS}_u{UNROLL}`.
        pub fn bf16f32 = family "gemv_bf16f32_w*_u*"(w: DevPtr<U32x4>, x: DevPtr<U32x4>, y: DevPtr<f32>, m: i32, n: i32, k: i32);
        /// `y[M, N] = bf16(xs · ws · qx[M, K] · qw[N, K]ᵀ)` over E4M3 codes, `ws_stride` /
        /// `xs_stride` 1 for per-channel / per-token scales, 0 for one per tensor.
        pub fn fp8 = family "gemv_fp8_w*_u*"(w: DevPtr<U32x4>, x: DevPtr<U32x4>, ws: DevPtr<f32>, ws_stride: i32, xs: DevPtr<f32>, xs_stride: i32, y: DevPtr<u16>, m: i32, n: i32, k: i32);
        /// The grouped expert GEMV `moe_gemv_{bf16,fp8}_w{WARPS}_u{UNROLL}[_t8]`
        /// (`src/gemm/moe.rs`): `wptr` the per-expert weight addresses, the routed pairs grouped
        /// by expert in `sorted` / `active` / `offsets` / `n_active`; FP8 E4M3 weights take
        /// per-expert row scales at `sptr` and per-row activation scales `xs` (BF16: unused).
        pub fn moe = family "moe_gemv_*_w*_u*"(wptr: DevPtr<u64>, sptr: DevPtr<u64>, x: DevPtr<U32x4>, xs: DevPtr<f32>, x_div: i32, sorted: DevPtr<i32>, active: DevPtr<i32>, offsets: DevPtr<i32>, n_active: DevPtr<i32>, y: DevPtr<u16>, n: i32, k: i32);
    }
}

/// `kernels/moe.cu`: routing and combine of the sparse MLP blocks (`src/gemm/moe.rs`).
pub mod moe {
    use crate::gpu::launch::{DevPtr, Void};
    crate::kernel_launchers! {
        source "moe";
        /// Softmax and top-k of `t` BF16 logit rows of `e` experts into `ids` / `wts` `[t, k]`.
        pub fn moe_route = "moe_route"(logits: DevPtr<u16>, t: i32, e: i32, k: i32, renorm: i32, shared: i32, ids: DevPtr<i32>, wts: DevPtr<f32>);
        /// The `pairs` routed pairs grouped by expert (`n_active_log`: 0 or a slot for the count).
        pub fn moe_sort = "moe_sort"(ids: DevPtr<i32>, pairs: i32, e: i32, sorted: DevPtr<i32>, active: DevPtr<i32>, offsets: DevPtr<i32>, n_active: DevPtr<i32>, n_active_log: DevPtr<i32>);
        /// `moe_route` and `moe_sort` in one CTA (decode-sized batches).
        pub fn moe_route_sort = "moe_route_sort"(logits: DevPtr<u16>, t: i32, e: i32, k: i32, renorm: i32, shared: i32, ids: DevPtr<i32>, wts: DevPtr<f32>, sorted: DevPtr<i32>, active: DevPtr<i32>, offsets: DevPtr<i32>, n_active: DevPtr<i32>, n_active_log: DevPtr<i32>);
        /// The grouped expert GEMV for any K (BF16, or FP8 with `fp8` = 1), one warp per row.
        pub fn moe_gemv_any = "moe_gemv_any"(wptr: DevPtr<u64>, sptr: DevPtr<u64>, fp8: i32, x: DevPtr<Void>, xs: DevPtr<f32>, x_div: i32, sorted: DevPtr<i32>, active: DevPtr<i32>, offsets: DevPtr<i32>, n_active: DevPtr<i32>, y: DevPtr<u16>, n: i32, k: i32);
        /// Weighted sum of each token's expert outputs plus the gated shared expert.
        pub fn moe_combine = "moe_combine"(y: DevPtr<u16>, ids: DevPtr<i32>, wts: DevPtr<f32>, k: i32, h: i32, shared: DevPtr<u16>, sgate: DevPtr<u16>, out: DevPtr<u16>);
    }
}

/// Every launcher declaration of the bench's sources (for `tests/it/kernel_abi.rs`).
pub fn signatures() -> Vec<crate::gpu::launch::KernelSig> {
    [
        fp8_quant::SIGNATURES,
        w4a16::SIGNATURES,
        w4a16_v2::SIGNATURES,
        w4a16_wg::SIGNATURES,
        gemv::SIGNATURES,
        moe::SIGNATURES,
    ]
    .concat()
}
