//! Typed launchers of the runtime's CUDA sources (`kernels/runtime.cu`, `kernels/gdn.cu`),
//! declared with [`kernel_launchers!`](crate::kernel_launchers) and checked against the
//! sources by `tests/it/kernel_abi.rs`. `t` is the number of tokens in the batch, `h` the hidden
//! size, `nh`/`nkv` the query/KV heads, `hd` the head dimension; BF16 tensors are passed as
//! `u16` bit patterns, as the kernels declare them.

/// `kernels/runtime.cu`.
pub mod rt {
    use crate::gpu::launch::{DevPtr, I32x4, Void};
    crate::kernel_launchers! {
        source "runtime";
        /// Synthesize `len` BF16 weights (normal, `mean`, `stdv`) from element index `base` on.
        pub fn rt_synth_bf16 = "rt_synth_bf16"(out: DevPtr<u16>, len: u64, base: u64, mean: f32, stdv: f32);
        /// Widen `len` BF16 values to FP32.
        pub fn rt_bf16_to_f32 = "rt_bf16_to_f32"(r#in: DevPtr<u16>, len: u64, out: DevPtr<f32>);
        /// Absolute maximum of `len` BF16 values, as float bits, into `amax_bits`.
        pub fn rt_amax_bf16 = "rt_amax_bf16"(x: DevPtr<u16>, len: u64, amax_bits: DevPtr<u32>);
        /// Per-tensor E4M3 quantization of `len` BF16 values.
        pub fn rt_quant_fp8_tensor = "rt_quant_fp8_tensor"(x: DevPtr<u16>, len: u64, amax_bits: DevPtr<u32>, q: DevPtr<u8>, scale_out: DevPtr<f32>);
        /// NVFP4 quantization of an N×K BF16 weight (E2M1 values, E4M3 block-16 scales, FP32
        /// global scale).
        pub fn rt_quant_nvfp4 = "rt_quant_nvfp4"(x: DevPtr<u16>, n: i32, k: i32, amax_bits: DevPtr<u32>, packed: DevPtr<u8>, block_scales: DevPtr<u8>, gs_out: DevPtr<f32>);
        /// Repack an NVFP4 N×K weight into the W4A16 kernel's layout.
        pub fn rt_w4a16_repack = "rt_w4a16_repack"(packed: DevPtr<u8>, bsc: DevPtr<u8>, n: i32, k: i32, strips: i32, kt_n: i32, lut: DevPtr<u32>, wq: DevPtr<u32>, sc: DevPtr<u8>);
        /// Embedding rows of `t` token ids into the FP32 residual `x` (hidden size `h`).
        pub fn rt_embed = "rt_embed"(ids: DevPtr<i32>, t: i32, embed: DevPtr<u16>, h: i32, x: DevPtr<f32>);
        /// Residual add of `delta` on rows `rows` then RMSNorm into `out`.
        pub fn rt_add_rmsnorm = "rt_add_rmsnorm"(x: DevPtr<f32>, delta: DevPtr<u16>, rows: DevPtr<i32>, r: i32, w: DevPtr<f32>, h: i32, eps: f32, out: DevPtr<u16>);
        /// [`rt_add_rmsnorm`] fused with the per-token E4M3 quantization of each output row
        /// into `q` / `scales` (`static_scale > 0`: that scale for every row), one block per row.
        pub fn rt_add_rmsnorm_quant = "rt_add_rmsnorm_quant"(x: DevPtr<f32>, delta: DevPtr<u16>, rows: DevPtr<i32>, r: i32, w: DevPtr<f32>, h: i32, eps: f32, out: DevPtr<u16>, static_scale: f32, q: DevPtr<u8>, scales: DevPtr<f32>);
        /// `x += delta` over `n` values.
        pub fn rt_add_rows = "rt_add_rows"(x: DevPtr<f32>, delta: DevPtr<u16>, n: u64);
        /// Q/K RMSNorm, RoPE, and the K/V write into the paged KV cache.
        pub fn rt_qk_norm_rope_kv = "rt_qk_norm_rope_kv"(qkv: DevPtr<u16>, t: i32, nh: i32, nkv: i32, hd: i32, qn: DevPtr<f32>, kn: DevPtr<f32>, inv_freq: DevPtr<f32>, eps: f32, pos: DevPtr<i32>, slot: DevPtr<i32>, q_out: DevPtr<u16>, k_cache: DevPtr<Void>, v_cache: DevPtr<Void>, block_size: i32, kv_fp8: i32, k_inv: f32, v_inv: f32);
        /// SwiGLU: `out = silu(gate) · up` over `t` rows of intermediate size `i`.
        pub fn rt_silu_mul = "rt_silu_mul"(gu: DevPtr<u16>, t: i32, i: i32, out: DevPtr<u16>);
        /// [`rt_silu_mul`] fused with the per-token E4M3 quantization of each output row into
        /// `q` / `scales` (`static_scale > 0`: that scale for every row); grid (t, slices per
        /// row), the row's amax gathered in `amax_bits` / `arrivals` (t u32 each, zero between
        /// launches: the kernel leaves them so).
        pub fn rt_silu_mul_quant = "rt_silu_mul_quant"(gu: DevPtr<u16>, t: i32, i: i32, out: DevPtr<u16>, static_scale: f32, q: DevPtr<u8>, scales: DevPtr<f32>, amax_bits: DevPtr<u32>, arrivals: DevPtr<u32>);
        /// Scale the N columns of `t` BF16 rows in place.
        pub fn rt_scale_cols_bf16 = "rt_scale_cols_bf16"(x: DevPtr<u16>, t: i32, n: i32, col_scale: DevPtr<f32>);
        /// Decode attention over a BF16 paged KV cache (split into partitions).
        pub fn rt_attn_decode_bf16 = "rt_attn_decode_bf16"(tok_list: DevPtr<i32>, q: DevPtr<u16>, tok_seq: DevPtr<i32>, pos: DevPtr<i32>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u16>, v_cache: DevPtr<u16>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, hd: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>, part_ml: DevPtr<f32>, part_o: DevPtr<f32>);
        /// Decode attention over an FP8 paged KV cache.
        pub fn rt_attn_decode_fp8 = "rt_attn_decode_fp8"(tok_list: DevPtr<i32>, q: DevPtr<u16>, tok_seq: DevPtr<i32>, pos: DevPtr<i32>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u8>, v_cache: DevPtr<u8>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, hd: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>, part_ml: DevPtr<f32>, part_o: DevPtr<f32>);
        /// Flash-decoding attention on tensor cores over a BF16 paged KV cache,
        /// `rt_attn_flash_bf16_hd{HD}` (the parameters of [`rt_attn_decode_bf16`]; `hd` is not
        /// read, HD is the instance's).
        pub fn attn_flash_bf16 = family "rt_attn_flash_bf16_hd*"(tok_list: DevPtr<i32>, q: DevPtr<u16>, tok_seq: DevPtr<i32>, pos: DevPtr<i32>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u16>, v_cache: DevPtr<u16>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, hd: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>, part_ml: DevPtr<f32>, part_o: DevPtr<f32>);
        /// Flash-decoding attention on tensor cores over an FP8 paged KV cache,
        /// `rt_attn_flash_fp8_hd{HD}`.
        pub fn attn_flash_fp8 = family "rt_attn_flash_fp8_hd*"(tok_list: DevPtr<i32>, q: DevPtr<u16>, tok_seq: DevPtr<i32>, pos: DevPtr<i32>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u8>, v_cache: DevPtr<u8>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, hd: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>, part_ml: DevPtr<f32>, part_o: DevPtr<f32>);
        /// Combine the `z` decode partitions of each token.
        pub fn rt_attn_combine = "rt_attn_combine"(tok_list: DevPtr<i32>, pos: DevPtr<i32>, nh: i32, hd: i32, z: i32, part_ml: DevPtr<f32>, part_o: DevPtr<f32>, out: DevPtr<u16>);
        /// Prefill attention over a BF16 paged KV cache, `rt_attn_prefill_bf16_hd{HD}`.
        pub fn attn_prefill_bf16 = family "rt_attn_prefill_bf16_hd*"(q: DevPtr<u16>, tiles: DevPtr<I32x4>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u16>, v_cache: DevPtr<u16>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>);
        /// Prefill attention over an FP8 paged KV cache, `rt_attn_prefill_fp8_hd{HD}`.
        pub fn attn_prefill_fp8 = family "rt_attn_prefill_fp8_hd*"(q: DevPtr<u16>, tiles: DevPtr<I32x4>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u8>, v_cache: DevPtr<u8>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>);
        /// Sampling on the device, one block per logits row (vocabulary size `v`).
        pub fn rt_sample = "rt_sample"(logits: DevPtr<f32>, v: i32, temperature: DevPtr<f32>, top_p: DevPtr<f32>, top_k: DevPtr<i32>, seed: DevPtr<u64>, draw: DevPtr<u64>, out: DevPtr<i32>);
    }
}

/// `kernels/gdn.cu`: the Gated-DeltaNet layers of hybrid models and their full-attention
/// layers' extras.
pub mod gdn {
    use crate::gpu::launch::{DevPtr, I32x4, Void};
    crate::kernel_launchers! {
        source "gdn";
        /// Causal depthwise convolution and SiLU over the segments `segs`.
        pub fn gdn_conv_silu = "gdn_conv_silu"(x: DevPtr<u16>, ldx: i32, c: i32, k: i32, w: DevPtr<f32>, segs: DevPtr<I32x4>, state: DevPtr<u16>, out: DevPtr<u16>);
        /// The gated delta rule, one token at a time.
        pub fn gdn_recurrent = "gdn_recurrent"(mixed: DevPtr<u16>, ab: DevPtr<u16>, a_log: DevPtr<f32>, dt_bias: DevPtr<f32>, segs: DevPtr<I32x4>, nk: i32, nv: i32, dk: i32, dv: i32, ssm: DevPtr<f32>, out: DevPtr<u16>);
        /// The gated delta rule in chunks of `chunk` tokens.
        pub fn gdn_chunked = "gdn_chunked"(mixed: DevPtr<u16>, ab: DevPtr<u16>, a_log: DevPtr<f32>, dt_bias: DevPtr<f32>, segs: DevPtr<I32x4>, nk: i32, nv: i32, dk: i32, dv: i32, chunk: i32, ssm: DevPtr<f32>, out: DevPtr<u16>);
        /// RMSNorm gated by `z`.
        pub fn gdn_gated_norm = "gdn_gated_norm"(o: DevPtr<u16>, z: DevPtr<u16>, ldz: i32, w: DevPtr<f32>, nv: i32, dv: i32, eps: f32, out: DevPtr<u16>);
        /// Q/K norm, partial RoPE (`rot` dimensions) and the KV-cache write of a hybrid's
        /// attention layer.
        pub fn hy_qk_norm_rope_kv = "hy_qk_norm_rope_kv"(qkv: DevPtr<u16>, t: i32, nh: i32, nkv: i32, hd: i32, rot: i32, qn: DevPtr<f32>, kn: DevPtr<f32>, inv_freq: DevPtr<f32>, eps: f32, pos: DevPtr<i32>, slot: DevPtr<i32>, q_out: DevPtr<u16>, k_cache: DevPtr<Void>, v_cache: DevPtr<Void>, block_size: i32, kv_fp8: i32, k_inv: f32, v_inv: f32);
        /// The output gate of a hybrid's attention layer.
        pub fn hy_attn_gate = "hy_attn_gate"(attn: DevPtr<u16>, qkv: DevPtr<u16>, t: i32, nh: i32, hd: i32, width: i32);
        /// Decode attention of a hybrid over a BF16 paged KV cache.
        pub fn hy_attn_decode_bf16 = "hy_attn_decode_bf16"(tok_list: DevPtr<i32>, q: DevPtr<u16>, tok_seq: DevPtr<i32>, pos: DevPtr<i32>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u16>, v_cache: DevPtr<u16>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, hd: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>, part_ml: DevPtr<f32>, part_o: DevPtr<f32>);
        /// Decode attention of a hybrid over an FP8 paged KV cache.
        pub fn hy_attn_decode_fp8 = "hy_attn_decode_fp8"(tok_list: DevPtr<i32>, q: DevPtr<u16>, tok_seq: DevPtr<i32>, pos: DevPtr<i32>, block_tables: DevPtr<i32>, bt_stride: DevPtr<i32>, k_cache: DevPtr<u8>, v_cache: DevPtr<u8>, k_scale: f32, v_scale: f32, nh: i32, nkv: i32, hd: i32, block_size: i32, sm_scale: f32, out: DevPtr<u16>, part_ml: DevPtr<f32>, part_o: DevPtr<f32>);
    }
}

/// Every launcher declaration of the runtime's sources (for `tests/it/kernel_abi.rs`).
pub fn signatures() -> Vec<crate::gpu::launch::KernelSig> {
    [rt::SIGNATURES, gdn::SIGNATURES].concat()
}
