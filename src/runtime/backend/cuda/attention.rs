//! Paged attention over the KV cache: decode attention (the flash-decoding kernel on tensor
//! cores, or the CUDA-core kernel; both split over partitions for long contexts and merged by
//! `rt_attn_combine`; [`decode_attn::choose`] picks one) and the tensor-core prefill tiles.

use super::decode_attn::{self, DecodeAttn};
use super::launchers;
use super::{plan, CudaBackend, ATT_THREADS};
use crate::gpu::{dim, DevPtr, Gpu, Module};

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        p: &plan::Plan,
        kc: u64,
        vc: u64,
        ks: f32,
        vs: f32,
        fp8_kv: bool,
        block_size: usize,
    ) -> anyhow::Result<()> {
        let c = &self.config;
        let meta = self.bufs.meta.ptr();
        let at = |off: usize| meta + (off * 4) as u64;
        let l = p.layout;
        let sm_scale = 1.0 / (c.head_dim as f32).sqrt();
        if p.dec_tokens > 0 {
            let kernel = self.decode_attention();
            let (threads, smem) = match kernel {
                DecodeAttn::Flash => (
                    decode_attn::FLASH_THREADS,
                    decode_attn::flash_smem_bytes(c.head_dim, if fp8_kv { 1 } else { 2 }),
                ),
                DecodeAttn::CudaCores => (ATT_THREADS, 0),
                DecodeAttn::None => anyhow::bail!(
                    "no decode-attention kernel of kernels/runtime.cu covers head_dim {} with {} query heads per KV head",
                    c.head_dim,
                    c.num_heads / c.num_kv_heads.max(1)
                ),
            };
            launch_decode_attention(
                &self.rt,
                &self.gpu,
                kernel,
                fp8_kv,
                (
                    dim("p.dec_tokens", p.dec_tokens)?,
                    dim("c.num_kv_heads", c.num_kv_heads)?,
                    dim("p.att_parts", p.att_parts)?,
                ),
                (threads, 1, 1),
                smem,
                &DecodeAttnArgs {
                    tok_list: DevPtr::at(at(l.dec_tok)),
                    q: DevPtr::at(self.bufs.q.ptr()),
                    tok_seq: DevPtr::at(at(l.tok_seq)),
                    pos: DevPtr::at(at(l.pos)),
                    block_tables: DevPtr::at(at(l.block_tables)),
                    bt_stride: DevPtr::at(meta),
                    k_cache: kc,
                    v_cache: vc,
                    k_scale: ks,
                    v_scale: vs,
                    nh: c.num_heads,
                    nkv: c.num_kv_heads,
                    hd: c.head_dim,
                    block_size,
                    sm_scale,
                    out: DevPtr::at(self.bufs.attn.ptr()),
                    part_ml: DevPtr::at(self.bufs.part_ml.ptr()),
                    part_o: DevPtr::at(self.bufs.part_o.ptr()),
                },
            )?;
            if p.att_parts > 1 {
                launchers::rt::rt_attn_combine(
                    &self.rt,
                    &self.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_heads", c.num_heads)?,
                        1,
                    ),
                    (
                        dim("c.head_dim.clamp(32, 256)", c.head_dim.clamp(32, 256))?,
                        1,
                        1,
                    ),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    DevPtr::at(at(l.pos)),
                    c.num_heads,
                    c.head_dim,
                    p.att_parts,
                    &self.bufs.part_ml,
                    &self.bufs.part_o,
                    &self.bufs.attn,
                )?;
            }
        }
        if p.tiles > 0 {
            let name = format!(
                "rt_attn_prefill_{}_hd{}",
                if fp8_kv { "fp8" } else { "bf16" },
                c.head_dim
            );
            let smem = (2 * 64 * (c.head_dim + 8) * 2) as u32;
            if fp8_kv {
                launchers::rt::attn_prefill_fp8(
                    &self.rt,
                    &self.gpu,
                    &name,
                    (
                        dim("p.tiles", p.tiles)?,
                        dim("c.num_heads", c.num_heads)?,
                        1,
                    ),
                    (128, 1, 1),
                    smem,
                    &self.bufs.q,
                    DevPtr::at(at(l.tiles)),
                    DevPtr::at(at(l.block_tables)),
                    DevPtr::at(meta),
                    DevPtr::at(kc),
                    DevPtr::at(vc),
                    ks,
                    vs,
                    c.num_heads,
                    c.num_kv_heads,
                    block_size,
                    sm_scale,
                    &self.bufs.attn,
                )
            } else {
                launchers::rt::attn_prefill_bf16(
                    &self.rt,
                    &self.gpu,
                    &name,
                    (
                        dim("p.tiles", p.tiles)?,
                        dim("c.num_heads", c.num_heads)?,
                        1,
                    ),
                    (128, 1, 1),
                    smem,
                    &self.bufs.q,
                    DevPtr::at(at(l.tiles)),
                    DevPtr::at(at(l.block_tables)),
                    DevPtr::at(meta),
                    DevPtr::at(kc),
                    DevPtr::at(vc),
                    ks,
                    vs,
                    c.num_heads,
                    c.num_kv_heads,
                    block_size,
                    sm_scale,
                    &self.bufs.attn,
                )
            }?;
        }
        Ok(())
    }
}

/// The arguments of a decode-attention kernel of kernels/runtime.cu, in its parameter order:
/// the CUDA-core `rt_attn_decode_{bf16,fp8}` and the flash-decoding
/// `rt_attn_flash_{bf16,fp8}_hd{64,128,256}` share one parameter list (docs/runtime.md, "Decode
/// attention"). The KV caches are addresses: the launcher of the KV format types them.
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeAttnArgs {
    /// The decode tokens' indices into the batch.
    pub tok_list: DevPtr<i32>,
    /// The queries (BF16 bits).
    pub q: DevPtr<u16>,
    /// The sequence of each token.
    pub tok_seq: DevPtr<i32>,
    /// The position of each token.
    pub pos: DevPtr<i32>,
    /// The block tables of the sequences.
    pub block_tables: DevPtr<i32>,
    /// The block tables' row stride.
    pub bt_stride: DevPtr<i32>,
    /// The paged K cache (BF16 or E4M3 elements).
    pub k_cache: u64,
    /// The paged V cache (BF16 or E4M3 elements).
    pub v_cache: u64,
    /// K's dequantization scale (FP8 KV).
    pub k_scale: f32,
    /// V's dequantization scale (FP8 KV).
    pub v_scale: f32,
    /// Query heads.
    pub nh: usize,
    /// KV heads.
    pub nkv: usize,
    /// head_dim.
    pub hd: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The softmax scale.
    pub sm_scale: f32,
    /// The output (BF16 bits), when the sequence is not split over partitions.
    pub out: DevPtr<u16>,
    /// Each partition's softmax max and sum.
    pub part_ml: DevPtr<f32>,
    /// Each partition's unnormalized output.
    pub part_o: DevPtr<f32>,
}

/// Launch the decode-attention kernel `kernel` (with FP8 or BF16 KV) through its typed
/// launcher: the flash kernel's instance is the one of `args.hd`
/// ([`decode_attn::flash_kernel_name`]). Grid, block and dynamic shared memory are the caller's.
///
/// # Errors
/// [`DecodeAttn::None`], an argument that does not fit its parameter, or a launch failure.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_decode_attention(
    rt: &Module,
    gpu: &Gpu,
    kernel: DecodeAttn,
    fp8_kv: bool,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    a: &DecodeAttnArgs,
) -> anyhow::Result<()> {
    // The parameter list after the launch shape, shared by the four launchers.
    macro_rules! launch {
        ($launcher:path $(, $name:expr)?) => {
            $launcher(
                rt,
                gpu,
                $($name,)?
                grid,
                block,
                smem,
                a.tok_list,
                a.q,
                a.tok_seq,
                a.pos,
                a.block_tables,
                a.bt_stride,
                DevPtr::at(a.k_cache),
                DevPtr::at(a.v_cache),
                a.k_scale,
                a.v_scale,
                a.nh,
                a.nkv,
                a.hd,
                a.block_size,
                a.sm_scale,
                a.out,
                a.part_ml,
                a.part_o,
            )
        };
    }
    let name = decode_attn::flash_kernel_name(fp8_kv, a.hd);
    match (kernel, fp8_kv) {
        (DecodeAttn::Flash, false) => launch!(launchers::rt::attn_flash_bf16, &name),
        (DecodeAttn::Flash, true) => launch!(launchers::rt::attn_flash_fp8, &name),
        (DecodeAttn::CudaCores, false) => launch!(launchers::rt::rt_attn_decode_bf16),
        (DecodeAttn::CudaCores, true) => launch!(launchers::rt::rt_attn_decode_fp8),
        (DecodeAttn::None, _) => anyhow::bail!(
            "no decode-attention kernel of kernels/runtime.cu covers head_dim {}",
            a.hd
        ),
    }?;
    Ok(())
}
