//! Paged attention over the KV cache: the CUDA-core decode kernel (split over partitions for long
//! contexts) and the tensor-core prefill tiles.

use super::launchers;
use super::{plan, CudaBackend, ATT_THREADS};
use crate::gpu::dim;
use crate::gpu::DevPtr;

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
            if fp8_kv {
                launchers::rt::rt_attn_decode_fp8(
                    &self.rt,
                    &self.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_kv_heads", c.num_kv_heads)?,
                        dim("p.att_parts", p.att_parts)?,
                    ),
                    (ATT_THREADS, 1, 1),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    &self.bufs.q,
                    DevPtr::at(at(l.tok_seq)),
                    DevPtr::at(at(l.pos)),
                    DevPtr::at(at(l.block_tables)),
                    DevPtr::at(meta),
                    DevPtr::at(kc),
                    DevPtr::at(vc),
                    ks,
                    vs,
                    c.num_heads,
                    c.num_kv_heads,
                    c.head_dim,
                    block_size,
                    sm_scale,
                    &self.bufs.attn,
                    &self.bufs.part_ml,
                    &self.bufs.part_o,
                )
            } else {
                launchers::rt::rt_attn_decode_bf16(
                    &self.rt,
                    &self.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_kv_heads", c.num_kv_heads)?,
                        dim("p.att_parts", p.att_parts)?,
                    ),
                    (ATT_THREADS, 1, 1),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    &self.bufs.q,
                    DevPtr::at(at(l.tok_seq)),
                    DevPtr::at(at(l.pos)),
                    DevPtr::at(at(l.block_tables)),
                    DevPtr::at(meta),
                    DevPtr::at(kc),
                    DevPtr::at(vc),
                    ks,
                    vs,
                    c.num_heads,
                    c.num_kv_heads,
                    c.head_dim,
                    block_size,
                    sm_scale,
                    &self.bufs.attn,
                    &self.bufs.part_ml,
                    &self.bufs.part_o,
                )
            }?;
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
