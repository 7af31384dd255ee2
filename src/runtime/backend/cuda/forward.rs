//! One forward pass: upload the plan, queue embedding, the decoder layers (norms, linears,
//! q/k norm + RoPE + KV write, attention, SwiGLU) and the logits, replay decode steps from CUDA
//! graphs, and sample on the device.

use super::launchers;
use crate::gpu::dim;
use crate::gpu::DevPtr;
use anyhow::Context;

use super::gdn;
use super::{grid1, plan, CudaBackend, LayerLinear, LinRef, RowSampling, PART_CAP};
use crate::gemm::gemv::GemvFormat;
use crate::gemm::ops::GemmClass;
use crate::runtime::backend::ForwardBatch;
use crate::runtime::config::KvCacheDtype;

impl CudaBackend {
    pub(super) fn kv_ptrs(&self, layer: usize) -> anyhow::Result<(u64, u64)> {
        let (buf, spec) = self.kv.as_ref().context("forward before init_kv_cache")?;
        let c = &self.config;
        // Only the layers with attention have a KV cache (all of them in a dense decoder).
        let layer = gdn::attention_index(c, layer);
        let region = (spec.num_blocks + 1)
            * c.num_kv_heads
            * spec.block_size
            * c.head_dim
            * spec.dtype.bytes();
        let base = buf.ptr() + (2 * layer * region) as u64;
        Ok((base, base + region as u64))
    }

    /// Queue the whole forward pass for an uploaded plan (no host synchronization inside, so it
    /// can be captured into a graph).
    pub(super) fn queue_forward(&mut self, p: &plan::Plan) -> anyhow::Result<()> {
        let c = self.config.clone();
        let (h, t) = (c.hidden_size, p.tokens);
        let meta = self.bufs.meta.ptr();
        let at = |off: usize| meta + (off * 4) as u64;
        let l = p.layout;
        let spec = self.kv.as_ref().context("forward before init_kv_cache")?.1;
        let fp8_kv = spec.dtype == KvCacheDtype::Fp8;
        self.op_begin()?;
        launchers::rt::rt_embed(
            &self.rt,
            &self.gpu,
            (dim("t", t)?, 1, 1),
            (256, 1, 1),
            0,
            DevPtr::at(at(l.ids)),
            t,
            &self.weights.embed,
            h,
            &self.bufs.x,
        )?;
        self.op_end("embedding")?;
        let nl = c.num_layers;
        for li in 0..nl {
            let (kc, vc) = self.kv_ptrs(li)?;
            let layer = &self.weights.layers[li];
            let (in_norm, post_norm) = (layer.input_norm.ptr(), layer.post_norm.ptr());
            let (qn, kn) = (
                layer.q_norm.as_ref().map_or(0, |b| b.ptr()),
                layer.k_norm.as_ref().map_or(0, |b| b.ptr()),
            );
            let (ks, vs) = (layer.k_scale, layer.v_scale);
            let delta = if li == 0 { 0 } else { self.bufs.hout.ptr() };
            let qkv_ref = LinRef {
                layer: li,
                which: LayerLinear::Qkv,
            };
            // Hybrids' first linear is the mixer's own (in gdn): no fused quantization there.
            let qkv_quant = self
                .hy
                .is_none()
                .then(|| self.fused_quant(qkv_ref))
                .flatten();
            self.op_begin()?;
            match qkv_quant {
                Some(st) => {
                    self.norm_quant(delta, t, in_norm, self.bufs.h.ptr(), st)?;
                    self.op_end("residual add + RMSNorm + FP8 quant")?;
                }
                None => {
                    self.norm(delta, 0, t, in_norm, self.bufs.h.ptr())?;
                    self.op_end("residual add + RMSNorm")?;
                }
            }
            if self.hy.is_some() {
                // Hybrids: the Gated-DeltaNet or gated attention mixer, then the common tail.
                let o_in = gdn::queue_mixer(self, li, p, kc, vc, ks, vs, fp8_kv, spec.block_size)?;
                self.op_begin()?;
                self.gemm(
                    LinRef {
                        layer: li,
                        which: LayerLinear::O,
                    },
                    t,
                    o_in,
                    self.bufs.hout.ptr(),
                )?;
                self.op_end("GEMM o_proj / out_proj")?;
                self.mlp(li, t, post_norm)?;
                continue;
            }
            self.op_begin()?;
            if qkv_quant.is_some() {
                self.gemm_prequantized(qkv_ref, t, self.bufs.qkv.ptr())?;
            } else {
                self.gemm(qkv_ref, t, self.bufs.h.ptr(), self.bufs.qkv.ptr())?;
            }
            self.op_end("GEMM qkv")?;
            self.op_begin()?;
            launchers::rt::rt_qk_norm_rope_kv(
                &self.rt,
                &self.gpu,
                (
                    dim("t", t)?,
                    dim(
                        "c.num_heads + 2 * c.num_kv_heads",
                        c.num_heads + 2 * c.num_kv_heads,
                    )?,
                    1,
                ),
                (c.head_dim.clamp(32, 128) as u32 / 32 * 32, 1, 1),
                0,
                &self.bufs.qkv,
                t,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                DevPtr::at(qn),
                DevPtr::at(kn),
                &self.bufs.inv_freq,
                c.rms_norm_eps,
                DevPtr::at(at(l.pos)),
                DevPtr::at(at(l.slot)),
                &self.bufs.q,
                DevPtr::at(kc),
                DevPtr::at(vc),
                spec.block_size,
                fp8_kv,
                1.0 / ks,
                1.0 / vs,
            )?;
            self.op_end("q/k norm + RoPE + KV write")?;
            self.op_begin()?;
            self.attention(p, kc, vc, ks, vs, fp8_kv, spec.block_size)?;
            self.op_end("attention")?;
            self.op_begin()?;
            self.gemm(
                LinRef {
                    layer: li,
                    which: LayerLinear::O,
                },
                t,
                self.bufs.attn.ptr(),
                self.bufs.hout.ptr(),
            )?;
            self.op_end("GEMM o_proj")?;
            self.mlp(li, t, post_norm)?;
        }
        self.op_begin()?;
        // Last residual add, final norm on the logit rows, lm_head in FP32.
        launchers::rt::rt_add_rows(
            &self.rt,
            &self.gpu,
            grid1(t * h, 256),
            (256, 1, 1),
            0,
            &self.bufs.x,
            &self.bufs.hout,
            t * h,
        )?;
        self.op_end("final residual add")?;
        if p.rows > 0 {
            self.op_begin()?;
            self.norm(
                0,
                at(l.rows),
                p.rows,
                self.weights.norm.ptr(),
                self.bufs.last_h.ptr(),
            )?;
            self.op_end("final RMSNorm")?;
            self.op_begin()?;
            let head = self
                .weights
                .lm_head
                .as_ref()
                .unwrap_or(&self.weights.embed)
                .ptr();
            let v = c.vocab_size;
            let (x, y) = (self.bufs.last_h.ptr(), self.bufs.logits.ptr());
            if let Some(gv) = self.gemv_for(GemvFormat::Bf16F32, v, h, p.rows) {
                self.run_gemv(GemvFormat::Bf16F32, gv, (head, x, y), None, p.rows, v, h)?;
            } else {
                let g = self.plans.get(
                    &self.lt,
                    self.bufs.one.ptr(),
                    (GemmClass::Bf16ToF32, p.rows, v, h),
                )?;
                g.run(&self.lt, &self.gpu, 1.0, head, x, y)?;
            }
            self.op_end("GEMM lm_head (FP32 logits)")?;
        }
        Ok(())
    }

    /// The residual add + post-attention RMSNorm and the MLP of layer `li` (its output in
    /// `hout`).
    pub(super) fn mlp(&mut self, li: usize, t: usize, post_norm: u64) -> anyhow::Result<()> {
        if self.weights.layers[li].moe.is_some() {
            return self.moe_mlp(li, t, post_norm);
        }
        let gu_ref = LinRef {
            layer: li,
            which: LayerLinear::GateUp,
        };
        let down_ref = LinRef {
            layer: li,
            which: LayerLinear::Down,
        };
        let gu_quant = self.fused_quant(gu_ref);
        self.op_begin()?;
        match gu_quant {
            Some(st) => {
                self.norm_quant(self.bufs.hout.ptr(), t, post_norm, self.bufs.h.ptr(), st)?;
                self.op_end("residual add + RMSNorm + FP8 quant")?;
            }
            None => {
                self.norm(self.bufs.hout.ptr(), 0, t, post_norm, self.bufs.h.ptr())?;
                self.op_end("residual add + RMSNorm")?;
            }
        }
        self.op_begin()?;
        if gu_quant.is_some() {
            self.gemm_prequantized(gu_ref, t, self.bufs.gu.ptr())?;
        } else {
            self.gemm(gu_ref, t, self.bufs.h.ptr(), self.bufs.gu.ptr())?;
        }
        self.op_end("GEMM gate_up")?;
        let i = self.config.intermediate_size;
        let down_quant = self.fused_quant(down_ref);
        self.op_begin()?;
        match down_quant {
            Some(st) => {
                // Each row split over enough blocks to fill the SMs at small batches (the
                // row's amax gathered by the last block of the row, plan::silu_quant_slices).
                let slices = plan::silu_quant_slices(t, i, self.gpu.sm_count as usize);
                launchers::rt::rt_silu_mul_quant(
                    &self.rt,
                    &self.gpu,
                    (dim("t", t)?, dim("slices", slices)?, 1),
                    (1024, 1, 1),
                    0,
                    &self.bufs.gu,
                    t,
                    i,
                    &self.bufs.act,
                    st,
                    &self.bufs.hq,
                    &self.bufs.ascale,
                    &self.bufs.quant_amax,
                    &self.bufs.quant_arrivals,
                )?;
                self.op_end("SwiGLU + FP8 quant")?;
            }
            None => {
                self.silu_mul(self.bufs.gu.ptr(), self.bufs.act.ptr(), t, i)?;
                self.op_end("SwiGLU")?;
            }
        }
        self.op_begin()?;
        if down_quant.is_some() {
            self.gemm_prequantized(down_ref, t, self.bufs.hout.ptr())?;
        } else {
            self.gemm(down_ref, t, self.bufs.act.ptr(), self.bufs.hout.ptr())?;
        }
        self.op_end("GEMM down")?;
        Ok(())
    }

    /// Layer `li`'s `gate_up` → SwiGLU → `down` on the normed hidden states `h` (BF16, `t`
    /// rows), its output at `out`: a sparse layer's shared expert (its width from `gate_up`'s
    /// rows). The GEMMs quantize their own input where they are FP8.
    pub(super) fn dense_mlp(&mut self, li: usize, t: usize, out: u64) -> anyhow::Result<()> {
        let gu_ref = LinRef::new(li, LayerLinear::GateUp);
        let i = self.lin(gu_ref).nk().0 / 2;
        self.op_begin()?;
        self.gemm(gu_ref, t, self.bufs.h.ptr(), self.bufs.gu.ptr())?;
        self.op_end("GEMM shared expert gate_up")?;
        self.op_begin()?;
        self.silu_mul(self.bufs.gu.ptr(), self.bufs.act.ptr(), t, i)?;
        self.op_end("shared expert SwiGLU")?;
        self.op_begin()?;
        self.gemm(
            LinRef::new(li, LayerLinear::Down),
            t,
            self.bufs.act.ptr(),
            out,
        )?;
        self.op_end("GEMM shared expert down")?;
        Ok(())
    }

    /// SwiGLU `act[r, j] = silu(gu[r, j]) · gu[r, i + j]` over `rows` rows of a gate_up output
    /// (`gu`: BF16 `[rows, 2·i]`) into `act` (BF16 `[rows, i]`), `rt_silu_mul`, on the stream.
    ///
    /// # Errors
    /// A launch failure.
    pub(super) fn silu_mul(&self, gu: u64, act: u64, rows: usize, i: usize) -> anyhow::Result<()> {
        launchers::rt::rt_silu_mul(
            &self.rt,
            &self.gpu,
            grid1(rows * i, 256),
            (256, 1, 1),
            0,
            DevPtr::at(gu),
            rows,
            i,
            DevPtr::at(act),
        )?;
        Ok(())
    }

    /// [`CudaBackend::norm`] over all `r` rows, fused with the per-token FP8 quantization of its
    /// output into `hq` / `ascale` (`st > 0`: the static input scale) for the next FP8 GEMM.
    pub(super) fn norm_quant(
        &self,
        delta: u64,
        r: usize,
        w: u64,
        out: u64,
        st: f32,
    ) -> anyhow::Result<()> {
        launchers::rt::rt_add_rmsnorm_quant(
            &self.rt,
            &self.gpu,
            (dim("r", r)?, 1, 1),
            (1024, 1, 1),
            0,
            &self.bufs.x,
            DevPtr::at(delta),
            DevPtr::null(),
            r,
            DevPtr::at(w),
            self.config.hidden_size,
            self.config.rms_norm_eps,
            DevPtr::at(out),
            st,
            &self.bufs.hq,
            &self.bufs.ascale,
        )?;
        Ok(())
    }

    pub(super) fn norm(
        &self,
        delta: u64,
        rows: u64,
        r: usize,
        w: u64,
        out: u64,
    ) -> anyhow::Result<()> {
        // One block per row; 1,024 threads keep a decode step's single row from being latency
        // bound (a 256-thread block took 19 µs on a 5,120-wide row).
        launchers::rt::rt_add_rmsnorm(
            &self.rt,
            &self.gpu,
            (dim("r", r)?, 1, 1),
            (1024, 1, 1),
            0,
            &self.bufs.x,
            DevPtr::at(delta),
            DevPtr::at(rows),
            r,
            DevPtr::at(w),
            self.config.hidden_size,
            self.config.rms_norm_eps,
            DevPtr::at(out),
        )?;
        Ok(())
    }

    pub(super) fn plan_env(&self) -> anyhow::Result<plan::PlanEnv> {
        let spec = self.kv.as_ref().context("forward before init_kv_cache")?.1;
        Ok(plan::PlanEnv {
            block_size: spec.block_size,
            num_blocks: spec.num_blocks,
            vocab: self.config.vocab_size,
            kv_heads: self.config.num_kv_heads,
            sm_count: self.gpu.sm_count as usize,
            part_cap: PART_CAP,
            tc_prefill: self.opts.tc_prefill,
        })
    }

    /// Run the forward pass of `batch` up to the logits on the device (graph replay for decode
    /// steps when graphs are on). Returns the plan.
    pub(super) fn run_forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<plan::Plan> {
        self.gpu.bind()?;
        let env = self.plan_env()?;
        anyhow::ensure!(
            batch.token_ids.len() <= self.max_tokens,
            "{} tokens in one forward pass; the backend was sized for {} (--max-num-batched-tokens)",
            batch.token_ids.len(),
            self.max_tokens
        );
        anyhow::ensure!(
            batch.num_logits() <= self.max_rows,
            "{} logit rows in one forward pass; the backend holds {}",
            batch.num_logits(),
            self.max_rows
        );
        let pad = if self.opts.cuda_graphs && plan::is_decode_step(batch) {
            plan::graph_batch(batch.token_ids.len(), &self.graph_sizes)
        } else {
            None
        };
        let p = plan::plan(batch, &env, pad)?;
        anyhow::ensure!(
            p.image.len() * 4 <= self.bufs.meta.bytes(),
            "batch metadata of {} bytes exceeds its buffer",
            p.image.len() * 4
        );
        self.gpu.write(&self.bufs.meta, 0, &p.image)?;
        gdn::write_plan(self, batch, pad)?;
        self.stats.forwards += 1;
        if p.tiles > 0 {
            self.stats.prefill_tc += 1;
        }
        match pad {
            Some(b) => {
                if !self.graphs.contains_key(&b) {
                    // Plans (cuBLASLt heuristics) are made on first use, outside the capture:
                    // run the step once eagerly, then capture it.
                    self.queue_forward(&p)?;
                    self.gpu.sync()?;
                    self.gpu.begin_capture()?;
                    let r = self.queue_forward(&p);
                    let g = self.gpu.end_capture();
                    r?;
                    self.graphs.insert(b, g?);
                    self.stats.graphs_captured += 1;
                    if self.hy.is_some() {
                        // The eager pass computed this step; replaying it too would advance
                        // the Gated-DeltaNet states twice (the KV writes are idempotent).
                        return Ok(p);
                    }
                }
                self.graphs[&b].launch()?;
                self.stats.graph_replays += 1;
            }
            None => {
                self.queue_forward(&p)?;
                self.prof_collect()?;
            }
        }
        Ok(p)
    }

    /// Forward pass and sampling on the device: one token per logit row (rows in batch order).
    ///
    /// # Errors
    /// As [`Backend::forward`], or `rows.len()` different from the batch's logit rows.
    pub fn sample_forward(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> anyhow::Result<Vec<u32>> {
        anyhow::ensure!(
            rows.len() == batch.num_logits(),
            "{} sampling settings for {} logit rows",
            rows.len(),
            batch.num_logits()
        );
        let p = self.run_forward(batch)?;
        if p.real_rows == 0 {
            return Ok(Vec::new());
        }
        let n = p.real_rows;
        let settings = super::SamplingUpload {
            temp: rows.iter().map(|r| r.temperature).collect(),
            top_p: rows.iter().map(|r| r.top_p).collect(),
            top_k: rows.iter().map(|r| r.top_k).collect(),
            seed: rows.iter().map(|r| r.seed).collect(),
        };
        let draw: Vec<u64> = rows.iter().map(|r| r.draw).collect();
        // Between decode steps only the draw counters change: the other four copies are made
        // when a row's settings differ from what the device holds.
        if self.smp_uploaded.as_ref() != Some(&settings) {
            self.smp_uploaded = None; // a failed copy below leaves nothing claimed
            self.gpu.write(&self.bufs.smp_temp, 0, &settings.temp)?;
            self.gpu.write(&self.bufs.smp_top_p, 0, &settings.top_p)?;
            self.gpu.write(&self.bufs.smp_top_k, 0, &settings.top_k)?;
            self.gpu.write(&self.bufs.smp_seed, 0, &settings.seed)?;
            self.smp_uploaded = Some(settings);
        }
        self.gpu.write(&self.bufs.smp_draw, 0, &draw)?;
        launchers::rt::rt_sample(
            &self.rt,
            &self.gpu,
            (dim("n", n)?, 1, 1),
            (1024, 1, 1),
            0,
            &self.bufs.logits,
            self.config.vocab_size,
            &self.bufs.smp_temp,
            &self.bufs.smp_top_p,
            &self.bufs.smp_top_k,
            &self.bufs.smp_seed,
            &self.bufs.smp_draw,
            &self.bufs.smp_out,
        )?;
        let toks: Vec<i32> = self.gpu.download(&self.bufs.smp_out, 0, n)?;
        Ok(toks.into_iter().map(|t| t as u32).collect())
    }
}
