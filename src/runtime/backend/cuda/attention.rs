//! Paged attention over the KV cache: decode attention (the flash-decoding kernel on tensor
//! cores, or the CUDA-core kernel; both split over partitions for long contexts and merged by
//! `rt_attn_combine`; [`decode_attn::choose`] picks one) and the tensor-core prefill tiles.

use super::decode_attn::{self, DecodeAttn};
use super::{plan, CudaBackend, ATT_THREADS};
use crate::gpu::KArg;

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
            let (name, threads, smem) = match self.decode_attention() {
                DecodeAttn::Flash => (
                    decode_attn::flash_kernel_name(fp8_kv, c.head_dim),
                    decode_attn::FLASH_THREADS,
                    decode_attn::flash_smem_bytes(c.head_dim, if fp8_kv { 1 } else { 2 }),
                ),
                DecodeAttn::CudaCores => (
                    if fp8_kv {
                        "rt_attn_decode_fp8"
                    } else {
                        "rt_attn_decode_bf16"
                    }
                    .to_string(),
                    ATT_THREADS,
                    0,
                ),
                DecodeAttn::None => anyhow::bail!(
                    "no decode-attention kernel of kernels/runtime.cu covers head_dim {} with {} query heads per KV head",
                    c.head_dim,
                    c.num_heads / c.num_kv_heads.max(1)
                ),
            };
            self.rt.launch(
                &self.gpu,
                &name,
                (
                    p.dec_tokens as u32,
                    c.num_kv_heads as u32,
                    p.att_parts as u32,
                ),
                (threads, 1, 1),
                smem,
                &[
                    KArg::Ptr(at(l.dec_tok)),
                    KArg::Ptr(self.bufs.q.ptr()),
                    KArg::Ptr(at(l.tok_seq)),
                    KArg::Ptr(at(l.pos)),
                    KArg::Ptr(at(l.block_tables)),
                    KArg::Ptr(meta),
                    KArg::Ptr(kc),
                    KArg::Ptr(vc),
                    KArg::F32(ks),
                    KArg::F32(vs),
                    KArg::I32(c.num_heads as i32),
                    KArg::I32(c.num_kv_heads as i32),
                    KArg::I32(c.head_dim as i32),
                    KArg::I32(block_size as i32),
                    KArg::F32(sm_scale),
                    KArg::Ptr(self.bufs.attn.ptr()),
                    KArg::Ptr(self.bufs.part_ml.ptr()),
                    KArg::Ptr(self.bufs.part_o.ptr()),
                ],
            )?;
            if p.att_parts > 1 {
                self.rt.launch(
                    &self.gpu,
                    "rt_attn_combine",
                    (p.dec_tokens as u32, c.num_heads as u32, 1),
                    (c.head_dim.clamp(32, 256) as u32, 1, 1),
                    0,
                    &[
                        KArg::Ptr(at(l.dec_tok)),
                        KArg::Ptr(at(l.pos)),
                        KArg::I32(c.num_heads as i32),
                        KArg::I32(c.head_dim as i32),
                        KArg::I32(p.att_parts as i32),
                        KArg::Ptr(self.bufs.part_ml.ptr()),
                        KArg::Ptr(self.bufs.part_o.ptr()),
                        KArg::Ptr(self.bufs.attn.ptr()),
                    ],
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
            self.rt.launch(
                &self.gpu,
                &name,
                (p.tiles as u32, c.num_heads as u32, 1),
                (128, 1, 1),
                smem,
                &[
                    KArg::Ptr(self.bufs.q.ptr()),
                    KArg::Ptr(at(l.tiles)),
                    KArg::Ptr(at(l.block_tables)),
                    KArg::Ptr(meta),
                    KArg::Ptr(kc),
                    KArg::Ptr(vc),
                    KArg::F32(ks),
                    KArg::F32(vs),
                    KArg::I32(c.num_heads as i32),
                    KArg::I32(c.num_kv_heads as i32),
                    KArg::I32(block_size as i32),
                    KArg::F32(sm_scale),
                    KArg::Ptr(self.bufs.attn.ptr()),
                ],
            )?;
        }
        Ok(())
    }
}
