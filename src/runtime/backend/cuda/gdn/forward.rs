//! One Gated-DeltaNet or gated attention layer of a hybrid queued on the device: the segment
//! lists of the pass written once ([`write_plan`]), then per layer the projections, the
//! convolution, the delta rule in its recurrent or chunked form and the gated norm
//! ([`queue_mixer`]), or the gated attention.

use anyhow::Context;

use super::{gdn_plan, HybridRt, CHUNKED_THREADS, HY_THREADS};
use crate::gpu::{dim, DevPtr};
use crate::runtime::backend::cuda::{grid1, launchers, plan, CudaBackend, LinRef, ATT_THREADS};
use crate::runtime::backend::ForwardBatch;
use crate::runtime::hybrid::LayerType;

/// Plan and upload the Gated-DeltaNet segments of the forward pass about to be queued.
pub(in crate::runtime::backend::cuda) fn write_plan(
    b: &mut CudaBackend,
    batch: &ForwardBatch,
    pad_to: Option<usize>,
) -> anyhow::Result<()> {
    let Some(hy) = b.hy.as_mut() else {
        return Ok(());
    };
    let st = hy
        .states
        .as_mut()
        .context("forward of a hybrid before init_state_slots")?;
    let p = gdn_plan(batch, pad_to, &mut st.positions)?;
    anyhow::ensure!(
        p.all.len() <= hy.seg_cap,
        "{} segments; the backend holds {}",
        p.all.len(),
        hy.seg_cap
    );
    let cap = hy.seg_cap;
    for (i, list) in [&p.all, &p.recurrent, &p.chunked].into_iter().enumerate() {
        let flat: Vec<i32> = list.iter().flatten().copied().collect();
        b.gpu.write(&hy.segs, i * cap * 16, &flat)?;
    }
    hy.counts = (p.all.len(), p.recurrent.len(), p.chunked.len());
    Ok(())
}

/// Queue the token mixer of hybrid layer `li` (after its input norm, `h` holding the normed
/// rows): Gated-DeltaNet or gated attention. Returns the device address of `o_proj`'s (or
/// `out_proj`'s) input, `p.tokens` rows.
#[allow(clippy::too_many_arguments)]
pub(in crate::runtime::backend::cuda) fn queue_mixer(
    b: &mut CudaBackend,
    li: usize,
    p: &plan::Plan,
    kc: u64,
    vc: u64,
    ks: f32,
    vs: f32,
    fp8_kv: bool,
    block_size: usize,
) -> anyhow::Result<u64> {
    // The hybrid runtime is taken out for the layer (the profiler's op marks borrow the backend
    // mutably) and always put back.
    let hy = b.hy.take().context("hybrid runtime missing")?;
    let r = mixer(b, &hy, li, p, (kc, vc, ks, vs, fp8_kv, block_size));
    b.hy = Some(hy);
    r
}

fn mixer(
    b: &mut CudaBackend,
    hy: &HybridRt,
    li: usize,
    p: &plan::Plan,
    (kc, vc, ks, vs, fp8_kv, block_size): (u64, u64, f32, f32, bool, usize),
) -> anyhow::Result<u64> {
    let t = p.tokens;
    let c = b.config.clone();
    b.op_begin()?;
    b.gemm(
        LinRef {
            layer: li,
            which: super::super::LayerLinear::Qkv,
        },
        t,
        b.bufs.h.ptr(),
        b.bufs.qkv.ptr(),
    )?;
    b.op_end(if c.layer_type(li) == LayerType::Gdn {
        "GEMM in_proj_qkv + in_proj_z"
    } else {
        "GEMM qkv (query and gate)"
    })?;
    if c.layer_type(li) == LayerType::Gdn {
        return queue_gdn(b, hy, li, t);
    }
    let meta = b.bufs.meta.ptr();
    let at = |off: usize| meta + (off * 4) as u64;
    let l = p.layout;
    let layer = &b.weights.layers[li];
    let (qn, kn) = (
        layer.q_norm.as_ref().map_or(0, |x| x.ptr()),
        layer.k_norm.as_ref().map_or(0, |x| x.ptr()),
    );
    b.op_begin()?;
    launchers::gdn::hy_qk_norm_rope_kv(
        &hy.module,
        &b.gpu,
        (
            dim("t", t)?,
            dim(
                "c.num_heads + 2 * c.num_kv_heads",
                c.num_heads + 2 * c.num_kv_heads,
            )?,
            1,
        ),
        (c.head_dim.clamp(32, 256) as u32 / 32 * 32, 1, 1),
        0,
        &b.bufs.qkv,
        t,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.rotary_dim,
        DevPtr::at(qn),
        DevPtr::at(kn),
        &b.bufs.inv_freq,
        c.rms_norm_eps,
        DevPtr::at(at(l.pos)),
        DevPtr::at(at(l.slot)),
        &b.bufs.q,
        DevPtr::at(kc),
        DevPtr::at(vc),
        block_size,
        fp8_kv,
        1.0 / ks,
        1.0 / vs,
    )?;
    b.op_end("q/k norm + partial RoPE + KV write")?;
    b.op_begin()?;
    if c.head_dim <= 128 || b.decode_attention() == super::super::decode_attn::DecodeAttn::Flash {
        b.attention(p, kc, vc, ks, vs, fp8_kv, block_size)?;
    } else {
        anyhow::ensure!(
            p.tiles == 0,
            "tensor-core prefill tiles planned for head_dim {}",
            c.head_dim
        );
        if p.dec_tokens > 0 {
            if fp8_kv {
                launchers::gdn::hy_attn_decode_fp8(
                    &hy.module,
                    &b.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_kv_heads", c.num_kv_heads)?,
                        dim("p.att_parts", p.att_parts)?,
                    ),
                    (HY_THREADS, 1, 1),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    &b.bufs.q,
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
                    1.0 / (c.head_dim as f32).sqrt(),
                    &b.bufs.attn,
                    &b.bufs.part_ml,
                    &b.bufs.part_o,
                )
            } else {
                launchers::gdn::hy_attn_decode_bf16(
                    &hy.module,
                    &b.gpu,
                    (
                        dim("p.dec_tokens", p.dec_tokens)?,
                        dim("c.num_kv_heads", c.num_kv_heads)?,
                        dim("p.att_parts", p.att_parts)?,
                    ),
                    (HY_THREADS, 1, 1),
                    0,
                    DevPtr::at(at(l.dec_tok)),
                    &b.bufs.q,
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
                    1.0 / (c.head_dim as f32).sqrt(),
                    &b.bufs.attn,
                    &b.bufs.part_ml,
                    &b.bufs.part_o,
                )
            }?;
            if p.att_parts > 1 {
                launchers::rt::rt_attn_combine(
                    &b.rt,
                    &b.gpu,
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
                    &b.bufs.part_ml,
                    &b.bufs.part_o,
                    &b.bufs.attn,
                )?;
            }
        }
    }
    b.op_end("attention")?;
    let _ = ATT_THREADS;
    b.op_begin()?;
    let width = 2 * c.q_dim() + 2 * c.kv_dim();
    launchers::gdn::hy_attn_gate(
        &hy.module,
        &b.gpu,
        grid1(t * c.q_dim(), 256),
        (256, 1, 1),
        0,
        &b.bufs.attn,
        &b.bufs.qkv,
        t,
        c.num_heads,
        c.head_dim,
        width,
    )?;
    b.op_end("attention output gate")?;
    Ok(b.bufs.attn.ptr())
}

/// The Gated-DeltaNet mixer of layer `li` after its fused `[in_proj_qkv; in_proj_z]` GEMM.
fn queue_gdn(b: &mut CudaBackend, hy: &HybridRt, li: usize, t: usize) -> anyhow::Result<u64> {
    b.op_begin()?;
    b.gemm(
        LinRef {
            layer: li,
            which: super::super::LayerLinear::GdnAb,
        },
        t,
        b.bufs.h.ptr(),
        hy.ab.ptr(),
    )?;
    b.op_end("GEMM in_proj_a + in_proj_b")?;
    let eps = b.config.rms_norm_eps;
    let st = hy
        .states
        .as_ref()
        .context("forward of a hybrid before init_state_slots")?;
    let g = hy.gdn_index(li);
    let d = hy.dims;
    let (cd, vd) = (d.conv_dim(), d.value_dim());
    let slots = st.slots + 1;
    let conv_state = st.conv.ptr() + (g * slots * d.conv_state_len() * 2) as u64;
    let ssm = st.ssm.ptr() + (g * slots * d.ssm_state_len() * 4) as u64;
    let (conv_w, a_log, dt_bias, norm_w) = {
        let layer = b.weights.layers[li]
            .gdn
            .as_ref()
            .context("a Gated-DeltaNet layer without its tensors")?;
        (
            layer.conv_w.ptr(),
            layer.a_log.ptr(),
            layer.dt_bias.ptr(),
            layer.norm.ptr(),
        )
    };
    let (n_all, n_rec, n_chunk) = hy.counts;
    let segs = |i: usize| hy.segs.ptr() + (i * hy.seg_cap * 16) as u64;
    b.op_begin()?;
    launchers::gdn::gdn_conv_silu(
        &hy.module,
        &b.gpu,
        (
            dim("cd.div_ceil(128)", cd.div_ceil(128))?,
            dim("n_all", n_all)?,
            1,
        ),
        (128, 1, 1),
        0,
        &b.bufs.qkv,
        cd + vd,
        cd,
        d.kernel,
        DevPtr::at(conv_w),
        DevPtr::at(segs(0)),
        DevPtr::at(conv_state),
        &hy.mixed,
    )?;
    b.op_end("Gated-DeltaNet causal conv")?;
    b.op_begin()?;
    if n_rec > 0 {
        launchers::gdn::gdn_recurrent(
            &hy.module,
            &b.gpu,
            (dim("nv", d.nv)?, dim("recurrent segments", n_rec)?, 1),
            (dim("4·dv", 4 * d.dv)?, 1, 1),
            0,
            &hy.mixed,
            &hy.ab,
            DevPtr::at(a_log),
            DevPtr::at(dt_bias),
            DevPtr::at(segs(1)),
            d.nk,
            d.nv,
            d.dk,
            d.dv,
            DevPtr::at(ssm),
            &hy.core,
        )?;
    }
    if n_chunk > 0 {
        launchers::gdn::gdn_chunked(
            &hy.module,
            &b.gpu,
            (dim("nv", d.nv)?, dim("chunked segments", n_chunk)?, 1),
            (CHUNKED_THREADS, 1, 1),
            hy.chunk_smem,
            &hy.mixed,
            &hy.ab,
            DevPtr::at(a_log),
            DevPtr::at(dt_bias),
            DevPtr::at(segs(2)),
            d.nk,
            d.nv,
            d.dk,
            d.dv,
            hy.chunk,
            DevPtr::at(ssm),
            &hy.core,
        )?;
    }
    b.op_end("Gated-DeltaNet delta rule")?;
    b.op_begin()?;
    launchers::gdn::gdn_gated_norm(
        &hy.module,
        &b.gpu,
        (dim("t", t)?, dim("d.nv", d.nv)?, 1),
        (d.dv.clamp(32, 256).div_ceil(32) as u32 * 32, 1, 1),
        0,
        &hy.core,
        DevPtr::at(b.bufs.qkv.ptr() + (cd * 2) as u64),
        cd + vd,
        DevPtr::at(norm_w),
        d.nv,
        d.dv,
        eps,
        &hy.normed,
    )?;
    b.op_end("Gated-DeltaNet gated RMSNorm")?;
    Ok(hy.normed.ptr())
}
