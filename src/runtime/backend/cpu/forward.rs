//! One forward pass of the CPU backend over a batch of segments: the embedding lookup, then per
//! layer the RMSNorm, the mixer (attention over the paged KV cache, or a Gated-DeltaNet layer
//! on its state slot), the MLP or mixture of experts, and the final logits.

use anyhow::Context;

use super::matmul::{matmul, quantize_activations_nvfp4, PAR_MIN_WORK};
use super::SlotState;
use crate::runtime::backend::{ForwardBatch, Logits};
use crate::runtime::config::ModelConfig;
use crate::runtime::gdn::{self, Form, GdnDims};
use crate::runtime::kv_cache::PagedKvStore;
use crate::runtime::model::{apply_rope, attend_one, rms_norm, rms_norm_inplace, silu, AttnShape};
use crate::runtime::weights::{GdnWeights, LayerWeights, Linear, ModelWeights};

/// The delta-rule form of a segment of `len` tokens asking for `num_logits` rows: chunked for a
/// prefill chunk (several tokens, at most one logit row), recurrent otherwise (decode, and draft
/// verification: token by token, the recurrent form gives every row exactly what decoding that
/// token alone gives, so speculative greedy output equals plain greedy output and a rollback by
/// replay matches a sequence that never saw the rejected drafts, bit for bit).
fn form_for(len: usize, num_logits: usize) -> Form {
    if len > 1 && num_logits <= 1 {
        Form::Chunked(gdn::CHUNK)
    } else {
        Form::Recurrent
    }
}

pub(super) fn forward_impl(
    w: &ModelWeights,
    inv_freq: &[f32],
    kv: &mut PagedKvStore,
    states: &mut [SlotState],
    batch: &ForwardBatch,
    threads: usize,
    (gpu_rounding, emulate_w4a4, routes): (bool, bool, Option<&RouteLog>),
) -> anyhow::Result<Logits> {
    let c = &w.config;
    let (h, t) = (c.hidden_size, batch.token_ids.len());
    let mut total = 0;
    for s in &batch.seqs {
        anyhow::ensure!(
            s.start == total && s.len > 0 && s.num_logits <= s.len,
            "malformed segment {s:?}"
        );
        total += s.len;
    }
    anyhow::ensure!(total == t, "segments cover {total} tokens of {t}");
    // Slots of every token, checked once.
    let mut slots = Vec::with_capacity(t);
    for s in &batch.seqs {
        for i in 0..s.len {
            slots.push(kv.slot(&s.block_table, s.first_pos + i)?);
        }
    }
    // Embedding lookup.
    let mut x = vec![0f32; t * h];
    for (i, &id) in batch.token_ids.iter().enumerate() {
        anyhow::ensure!(
            (id as usize) < c.vocab_size,
            "token id {id} is outside the vocabulary ({})",
            c.vocab_size
        );
        w.embed
            .dequantize_row(id as usize, &mut x[i * h..(i + 1) * h]);
    }
    let p = Pass {
        c,
        batch,
        inv_freq,
        slots: &slots,
        shape: AttnShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        },
        group: c.num_heads / c.num_kv_heads,
        gated: c.attn_output_gate(),
        threads,
        gpu_rounding,
        emulate_w4a4,
        routes,
    };
    let mut hbuf = vec![0f32; t * h];
    let (mut kctx, mut vctx) = (Vec::new(), Vec::new());
    let (mut kv_layer, mut gdn_layer) = (0usize, 0usize);
    for layer in &w.layers {
        for i in 0..t {
            rms_norm(
                &x[i * h..(i + 1) * h],
                &layer.input_norm,
                c.rms_norm_eps,
                &mut hbuf[i * h..(i + 1) * h],
            );
        }
        p.r(&mut hbuf);
        if let Some(g) = &layer.gdn {
            gdn_mixer_layer(&p, g, states, gdn_layer, &hbuf, &mut x)?;
            gdn_layer += 1;
        } else {
            let li = kv_layer;
            kv_layer += 1;
            attention_layer(&p, layer, li, kv, &hbuf, (&mut kctx, &mut vctx), &mut x)?;
        }
        mlp_layer(&p, layer, &mut hbuf, &mut x);
    }
    Ok(final_logits(&p, w, &x))
}

/// What every layer of one CPU forward pass reads: the config, the batch, the RoPE frequencies,
/// the KV-cache slot of every token, the attention shape, and the pass's numeric choices.
struct Pass<'a> {
    c: &'a ModelConfig,
    batch: &'a ForwardBatch,
    inv_freq: &'a [f32],
    /// The KV-cache slot of every token of the batch, in batch order.
    slots: &'a [usize],
    shape: AttnShape,
    /// Query heads per KV head.
    group: usize,
    /// q_proj also emits an output gate per head (Qwen3.5 attention).
    gated: bool,
    threads: usize,
    /// BF16 rounding at the CUDA backend's rounding points.
    gpu_rounding: bool,
    /// NVFP4 matmuls quantize their activations to NVFP4 (emulated W4A4).
    emulate_w4a4: bool,
    /// Where the sparse layers' routes go, one entry per sparse layer (routing parity checks).
    routes: Option<&'a RouteLog>,
}

/// The sparse layers' routes of the forward passes since it was made: one entry per sparse
/// layer and pass, each token's route ([`super::CpuBackend::with_route_log`]).
pub(super) type RouteLog = std::sync::Mutex<Vec<Vec<crate::runtime::moe::Route>>>;

impl Pass<'_> {
    /// BF16 rounding at the CUDA backend's rounding points (identity unless `gpu_rounding`).
    #[inline]
    fn r(&self, v: &mut [f32]) {
        if self.gpu_rounding {
            v.iter_mut()
                .for_each(|x| *x = crate::formats::bf16_round(*x));
        }
    }

    /// `x · Wᵀ` for `m` rows (activations quantized to NVFP4 first when emulating W4A4), rounded
    /// as [`Pass::r`].
    #[inline]
    fn mm(&self, x: &[f32], m: usize, l: &Linear) -> Vec<f32> {
        let mut y = match l {
            Linear::Nvfp4(w) if self.emulate_w4a4 => {
                matmul(&quantize_activations_nvfp4(x, w.k), m, l, self.threads)
            }
            _ => matmul(x, m, l, self.threads),
        };
        self.r(&mut y);
        y
    }
}

/// A Gated-DeltaNet layer (the `gdn_layer`-th): its projections, the delta rule per segment on
/// its state slot (inputs kept for a snapshot), the gated norm, out_proj added to `x`.
fn gdn_mixer_layer(
    p: &Pass,
    g: &GdnWeights,
    states: &mut [SlotState],
    gdn_layer: usize,
    hbuf: &[f32],
    x: &mut [f32],
) -> anyhow::Result<()> {
    let (c, t) = (p.c, p.batch.token_ids.len());
    // Gated-DeltaNet mixer.
    let d = GdnDims::from(
        c.hybrid
            .as_ref()
            .context("a Gated-DeltaNet layer in a dense config")?,
    );
    let qkv = p.mm(hbuf, t, &g.qkv);
    let z = p.mm(hbuf, t, &g.z);
    let a = p.mm(hbuf, t, &g.a);
    let b = p.mm(hbuf, t, &g.b);
    let (cd, vd, nv) = (d.conv_dim(), d.value_dim(), d.nv);
    let mut o = vec![0f32; t * vd];
    for s in &p.batch.seqs {
        let st = &mut states[s.state_slot as usize];
        let (r0, r1) = (s.start, s.start + s.len);
        let (sq, sa, sb) = (
            &qkv[r0 * cd..r1 * cd],
            &a[r0 * nv..r1 * nv],
            &b[r0 * nv..r1 * nv],
        );
        if let Some(snap) = &mut st.snap {
            snap.inputs.push((sq.to_vec(), sa.to_vec(), sb.to_vec()));
        }
        let out = gdn::mixer_core(
            &d,
            &g.params(),
            sq,
            sa,
            sb,
            s.len,
            &mut st.layers[gdn_layer],
            form_for(s.len, s.num_logits),
            p.gpu_rounding,
            p.threads,
        );
        o[r0 * vd..r1 * vd].copy_from_slice(&out);
    }
    gdn::gated_rms_norm(&mut o, &z, &g.norm, d.dv, c.rms_norm_eps);
    p.r(&mut o);
    let out = p.mm(&o, t, &g.out);
    for (a, b) in x.iter_mut().zip(&out) {
        *a += b;
    }
    Ok(())
}

/// A full-attention layer (KV layer `li`): q/k/v projections, the output gate split off q
/// (gated layers), q/k norm and RoPE with K/V stored, attention over the cache, the gate, and
/// o_proj added to `x`. `kctx`/`vctx` are the gather buffers, reused across layers.
fn attention_layer(
    p: &Pass,
    layer: &LayerWeights,
    li: usize,
    kv: &mut PagedKvStore,
    hbuf: &[f32],
    (kctx, vctx): (&mut Vec<f32>, &mut Vec<f32>),
    x: &mut [f32],
) -> anyhow::Result<()> {
    let (c, t) = (p.c, p.batch.token_ids.len());
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let qp = p.mm(hbuf, t, &layer.q);
    let mut k = p.mm(hbuf, t, &layer.k);
    let v = p.mm(hbuf, t, &layer.v);
    // q_proj of a gated layer emits, per head, head_dim query values then head_dim gate
    // values (transformers' `view(..., -1, 2 · head_dim)` then `chunk(2)`).
    let (mut q, gate) = if p.gated {
        let mut q = vec![0f32; t * qd];
        let mut gt = vec![0f32; t * qd];
        for ti in 0..t {
            for hh in 0..c.num_heads {
                let src = ti * 2 * qd + hh * 2 * hd;
                let dst = ti * qd + hh * hd;
                q[dst..dst + hd].copy_from_slice(&qp[src..src + hd]);
                gt[dst..dst + hd].copy_from_slice(&qp[src + hd..src + 2 * hd]);
            }
        }
        (q, Some(gt))
    } else {
        (qp, None)
    };
    rope_and_store(p, layer, li, kv, &mut q, &mut k, &v);
    let mut attn = attend(p, li, kv, &q, kctx, vctx)?;
    p.r(&mut attn);
    if let Some(gt) = &gate {
        // Output gate: attn · sigmoid(gate) (transformers' Qwen3_5Attention).
        for (a, gv) in attn.iter_mut().zip(gt) {
            *a *= gdn::sigmoid(*gv);
        }
        p.r(&mut attn);
    }
    let o = p.mm(&attn, t, &layer.o);
    for (a, b) in x.iter_mut().zip(&o) {
        *a += b;
    }
    Ok(())
}

/// Per-head q/k norm (Qwen3) and RoPE (over the first rotary_dim dimensions) of every token,
/// then its K/V stored in the cache of KV layer `li`.
fn rope_and_store(
    p: &Pass,
    layer: &LayerWeights,
    li: usize,
    kv: &mut PagedKvStore,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
) {
    let (c, inv_freq) = (p.c, p.inv_freq);
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    for s in &p.batch.seqs {
        for i in 0..s.len {
            let ti = s.start + i;
            let pos = s.first_pos + i;
            for hh in 0..c.num_heads {
                let qh = &mut q[ti * qd + hh * hd..ti * qd + (hh + 1) * hd];
                if let Some(nw) = &layer.q_norm {
                    rms_norm_inplace(qh, nw, c.rms_norm_eps);
                }
                apply_rope(qh, pos, inv_freq);
                p.r(qh);
            }
            for hh in 0..c.num_kv_heads {
                let kh = &mut k[ti * kvd + hh * hd..ti * kvd + (hh + 1) * hd];
                if let Some(nw) = &layer.k_norm {
                    rms_norm_inplace(kh, nw, c.rms_norm_eps);
                }
                apply_rope(kh, pos, inv_freq);
            }
            kv.write(
                li,
                p.slots[ti],
                &k[ti * kvd..(ti + 1) * kvd],
                &v[ti * kvd..(ti + 1) * kvd],
            );
        }
    }
}

/// Attention of every segment's queries `q` over all its positions (the new ones included),
/// read back from the cache of KV layer `li`; heads split over threads when the work is large.
fn attend(
    p: &Pass,
    li: usize,
    kv: &PagedKvStore,
    q: &[f32],
    kctx: &mut Vec<f32>,
    vctx: &mut Vec<f32>,
) -> anyhow::Result<Vec<f32>> {
    let (c, t, threads) = (p.c, p.batch.token_ids.len(), p.threads);
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let (shape, group) = (p.shape, p.group);
    let mut attn = vec![0f32; t * qd];
    for s in &p.batch.seqs {
        let ctx = s.first_pos + s.len;
        kv.gather(li, &s.block_table, ctx, kctx, vctx)?;
        let (kctx, vctx): (&[f32], &[f32]) = (kctx, vctx);
        let work = s.len * ctx * qd;
        let nt = if work < PAR_MIN_WORK {
            1
        } else {
            threads.min(c.num_heads)
        };
        let per = c.num_heads.div_ceil(nt);
        let run = |h0: usize, h1: usize, out: &mut [f32]| {
            // out: [s.len, (h1 - h0) · hd]
            let width = (h1 - h0) * hd;
            let mut scores = vec![0f32; ctx];
            for i in 0..s.len {
                let ti = s.start + i;
                let pos = s.first_pos + i;
                for hh in h0..h1 {
                    let qh = &q[ti * qd + hh * hd..ti * qd + (hh + 1) * hd];
                    let o = &mut out[i * width + (hh - h0) * hd..i * width + (hh - h0 + 1) * hd];
                    attend_one(qh, kctx, vctx, shape, hh / group, pos, &mut scores, o);
                }
            }
        };
        if nt == 1 {
            run(
                0,
                c.num_heads,
                &mut attn[s.start * qd..(s.start + s.len) * qd],
            );
        } else {
            let parts: Vec<(usize, usize, Vec<f32>)> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..nt)
                    .map(|i| {
                        let (h0, h1) = (i * per, ((i + 1) * per).min(c.num_heads));
                        let run = &run;
                        sc.spawn(move || {
                            let mut local = vec![0f32; s.len * h1.saturating_sub(h0) * hd];
                            if h1 > h0 {
                                run(h0, h1, &mut local);
                            }
                            (h0, h1, local)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            for (h0, h1, local) in parts {
                let width = (h1 - h0) * hd;
                for i in 0..s.len {
                    let dst = (s.start + i) * qd + h0 * hd;
                    attn[dst..dst + width].copy_from_slice(&local[i * width..(i + 1) * width]);
                }
            }
        }
    }
    Ok(attn)
}

/// The MLP of a layer: post-attention norm into `hbuf`, SwiGLU (or the sparse block of a
/// mixture-of-experts layer, `crate::runtime::moe`), down_proj added to `x`.
fn mlp_layer(p: &Pass, layer: &LayerWeights, hbuf: &mut [f32], x: &mut [f32]) {
    let (c, t) = (p.c, p.batch.token_ids.len());
    let h = c.hidden_size;
    for i in 0..t {
        rms_norm(
            &x[i * h..(i + 1) * h],
            &layer.post_norm,
            c.rms_norm_eps,
            &mut hbuf[i * h..(i + 1) * h],
        );
    }
    p.r(hbuf);
    if let (Some(moe), Some(cfg)) = (&layer.moe, &c.moe) {
        let ops = crate::runtime::moe::Ops {
            mm: &|x: &[f32], m: usize, l: &Linear| p.mm(x, m, l),
            round: &|v: &mut [f32]| p.r(v),
        };
        let (y, routes) = crate::runtime::moe::moe_block(&ops, cfg, moe, hbuf, t, h);
        if let Some(log) = p.routes {
            if let Ok(mut v) = log.lock() {
                v.push(routes);
            }
        }
        for (a, b) in x.iter_mut().zip(&y) {
            *a += b;
        }
        return;
    }
    let mut g = p.mm(hbuf, t, &layer.gate);
    let u = p.mm(hbuf, t, &layer.up);
    for (a, b) in g.iter_mut().zip(&u) {
        *a = silu(*a) * b;
    }
    p.r(&mut g);
    let d = p.mm(&g, t, &layer.down);
    for (a, b) in x.iter_mut().zip(&d) {
        *a += b;
    }
}

/// Final norm and lm_head on the rows that need logits.
fn final_logits(p: &Pass, w: &ModelWeights, x: &[f32]) -> Logits {
    let c = p.c;
    let h = c.hidden_size;
    let rows: Vec<usize> = p
        .batch
        .seqs
        .iter()
        .flat_map(|s| (s.start + s.len - s.num_logits)..(s.start + s.len))
        .collect();
    let mut hn = vec![0f32; rows.len() * h];
    for (r, &ti) in rows.iter().enumerate() {
        rms_norm(
            &x[ti * h..(ti + 1) * h],
            &w.norm,
            c.rms_norm_eps,
            &mut hn[r * h..(r + 1) * h],
        );
    }
    p.r(&mut hn);
    let data = matmul(&hn, rows.len(), w.lm_head(), p.threads);
    Logits {
        vocab: c.vocab_size,
        data,
    }
}
