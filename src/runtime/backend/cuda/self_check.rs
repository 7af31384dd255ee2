//! The CUDA backend's checks of its own device code, which need its internals:
//!
//! - [`prefill_matches_decode`]: the tensor-core prefill attention against the CUDA-core decode
//!   kernel on a synthetic case (run at load; a failure turns the tensor-core path off);
//! - [`synthesis_matches_cpu`], [`quantization_matches_cpu`]: GPU weight synthesis and GPU
//!   FP8 / NVFP4 quantization + W4A16 repacking against the CPU code, bit for bit (run by
//!   `rigbench devcheck`);
//! - [`swiglu_quant_matches_unfused`]: the fused SwiGLU + FP8 quantization against the two
//!   launches it replaces, bit for bit (run by `rigbench devcheck`).
//!
//! Whole-model parity and speed, which drive the backend from outside, are in
//! `crate::runtime_eval::cuda_check`.

use super::launchers;
use super::{plan, CudaBackend};
use crate::gpu::dim;
use crate::gpu::DevPtr;
use crate::runtime::backend::{ForwardBatch, SeqSegment};
use crate::runtime::config::{ModelConfig, WeightFormat};
use crate::runtime::weights;

/// rel L2 error allowed between the tensor-core prefill attention and the decode kernel (the
/// prefill kernel rounds the softmax probabilities to BF16 before P·V, FlashAttention-style;
/// 2⁻⁸ relative per term).
pub const PREFILL_VS_DECODE_REL_L2: f64 = 1e-2;
/// One check's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it passed.
    pub pass: bool,
    /// The measured figure and the limit.
    pub detail: String,
}

fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// Tensor-core prefill attention vs the CUDA-core decode kernel on 80 query positions of one
/// sequence (random BF16 q, K and V): `Ok(None)` when the rel L2 difference is within
/// [`PREFILL_VS_DECODE_REL_L2`], else the reason.
///
/// # Errors
/// A device failure.
pub fn prefill_matches_decode(b: &mut CudaBackend) -> anyhow::Result<Option<String>> {
    let c = b.config.clone();
    let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let bs = 16usize;
    let len = 80usize;
    let blocks = len.div_ceil(bs);
    let gpu = &b.gpu;
    // Synthesized q [len, nh, hd] and one layer of K/V cache (blocks + 1 trash) in BF16.
    let q = gpu.alloc(len * nh * hd * 2)?;
    let region = (blocks + 1) * nkv * bs * hd;
    let kv = gpu.alloc(2 * region * 2)?;
    for (buf, n, seed) in [(&q, len * nh * hd, 11u64), (&kv, 2 * region, 12u64)] {
        launchers::rt::rt_synth_bf16(
            &b.rt,
            gpu,
            super::grid1(n, 256),
            (256, 1, 1),
            0,
            buf,
            n,
            weights::synth_stream_base(seed, 1),
            0.0,
            1.0,
        )?;
    }
    let seg = SeqSegment {
        start: 0,
        len,
        first_pos: 0,
        block_table: (0..blocks as u32).collect(),
        num_logits: 0,
        state_slot: 0,
    };
    let batch = ForwardBatch {
        token_ids: vec![0; len],
        seqs: vec![seg],
    };
    let mut env = plan::PlanEnv {
        block_size: bs,
        num_blocks: blocks,
        vocab: c.vocab_size,
        kv_heads: nkv,
        sm_count: gpu.sm_count as usize,
        part_cap: super::PART_CAP,
        tc_prefill: false,
    };
    let outs = [gpu.alloc(len * nh * hd * 2)?, gpu.alloc(len * nh * hd * 2)?];
    let meta = gpu.alloc(1 << 16)?;
    for (i, tc) in [false, true].into_iter().enumerate() {
        env.tc_prefill = tc;
        let p = plan::plan(&batch, &env, None)?;
        anyhow::ensure!(
            p.image.len() * 4 <= meta.bytes(),
            "self-check metadata too large"
        );
        gpu.write(&meta, 0, &p.image)?;
        let at = |off: usize| meta.ptr() + (off * 4) as u64;
        let l = p.layout;
        let sm_scale = 1.0 / (hd as f32).sqrt();
        let (kc, vc) = (kv.ptr(), kv.ptr() + (region * 2) as u64);
        if tc {
            anyhow::ensure!(
                p.tiles > 0 && p.dec_tokens == 0,
                "plan did not use prefill tiles"
            );
            launchers::rt::attn_prefill_bf16(
                &b.rt,
                gpu,
                &format!("rt_attn_prefill_bf16_hd{hd}"),
                (dim("p.tiles", p.tiles)?, dim("nh", nh)?, 1),
                (128, 1, 1),
                dim("2 * 64 * (hd + 8) * 2", 2 * 64 * (hd + 8) * 2)?,
                &q,
                DevPtr::at(at(l.tiles)),
                DevPtr::at(at(l.block_tables)),
                &meta,
                DevPtr::at(kc),
                DevPtr::at(vc),
                1.0,
                1.0,
                nh,
                nkv,
                bs,
                sm_scale,
                &outs[i],
            )?;
        } else {
            launchers::rt::rt_attn_decode_bf16(
                &b.rt,
                gpu,
                (dim("p.dec_tokens", p.dec_tokens)?, dim("nkv", nkv)?, 1),
                (super::ATT_THREADS, 1, 1),
                0,
                DevPtr::at(at(l.dec_tok)),
                &q,
                DevPtr::at(at(l.tok_seq)),
                DevPtr::at(at(l.pos)),
                DevPtr::at(at(l.block_tables)),
                &meta,
                DevPtr::at(kc),
                DevPtr::at(vc),
                1.0,
                1.0,
                nh,
                nkv,
                hd,
                bs,
                sm_scale,
                &outs[i],
                &b.bufs.part_ml,
                &b.bufs.part_o,
            )?;
        }
    }
    let d: Vec<u16> = gpu.download(&outs[0], 0, len * nh * hd)?;
    let t: Vec<u16> = gpu.download(&outs[1], 0, len * nh * hd)?;
    let err = super::rel_l2_bf16(&t, &d);
    Ok((err > PREFILL_VS_DECODE_REL_L2)
        .then(|| format!("rel L2 {err:.2e} > {PREFILL_VS_DECODE_REL_L2:.0e}")))
}

/// GPU synthesis of the tiny preset's embedding against the CPU's, bit for bit.
///
/// # Errors
/// A device failure.
pub fn synthesis_matches_cpu(b: &CudaBackend, seed: u64) -> anyhow::Result<Check> {
    let c = ModelConfig::preset("qwen3-8b").unwrap_or_else(ModelConfig::tiny);
    // One layer's q_proj: large enough to span many 65,536-element chunks.
    let (n, k) = (c.q_dim(), c.hidden_size);
    let id = weights::synth_tensor_id(Some(0), 1);
    let std = 1.0 / (k as f32).sqrt();
    let buf = b.gpu.alloc(n * k * 2)?;
    launchers::rt::rt_synth_bf16(
        &b.rt,
        &b.gpu,
        super::grid1(n * k, 256),
        (256, 1, 1),
        0,
        &buf,
        n * k,
        weights::synth_stream_base(seed, id),
        0.0,
        std,
    )?;
    let got: Vec<u16> = b.gpu.download(&buf, 0, n * k)?;
    let mut one = c.clone();
    one.num_layers = 1;
    let host = weights::synthesize(&one, seed);
    let want = match &host.layers[0].q {
        weights::Linear::Bf16 { data, .. } => data.clone(),
        _ => anyhow::bail!("synthesized q_proj is not BF16"),
    };
    let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    Ok(Check {
        name: format!("GPU weight synthesis = CPU ({n}×{k} BF16, seed {seed})"),
        pass: diff == 0,
        detail: format!("{diff} of {} values differ (limit 0)", n * k),
    })
}

/// GPU FP8 and NVFP4 quantization (and the W4A16 repacking) of a synthesized weight against
/// the CPU code, bit for bit.
///
/// # Errors
/// A device failure.
pub fn quantization_matches_cpu(b: &CudaBackend) -> anyhow::Result<Vec<Check>> {
    let (n, k) = (96usize, 512usize);
    let vals: Vec<f32> = (0..n * k)
        .map(|i| {
            let x = ((i as f32) * 0.618_034).fract() - 0.5;
            x * (1.0 + (i % 7) as f32)
        })
        .collect();
    let bits: Vec<u16> = vals.iter().map(|v| bf16_bits(*v)).collect();
    let host = weights::Linear::Bf16 {
        n,
        k,
        data: bits.clone(),
    };
    let amax = host.bf16_amax().unwrap_or(0.0);
    let loader = super::load::Loader {
        gpu: &b.gpu,
        rt: &b.rt,
        recipe: None,
    };
    let mut out = Vec::new();
    // FP8.
    let dev = loader.quantize_dev(b.gpu.upload(&bits)?, n, k, WeightFormat::Fp8)?;
    let cpu = host.clone().quantized_with_amax(WeightFormat::Fp8, amax)?;
    if let (super::DLinear::Fp8 { w, scales, .. }, weights::Linear::Fp8 { w: cw, .. }) =
        (&dev, &cpu)
    {
        let got: Vec<u8> = b.gpu.download(w, 0, n * k)?;
        let s: Vec<f32> = b.gpu.download(scales, 0, 1)?;
        let diff = got.iter().zip(&cw.data).filter(|(a, b)| a != b).count();
        out.push(Check {
            name: "GPU FP8 quantization = CPU (96×512)".into(),
            pass: diff == 0 && s[0] == cw.scales[0],
            detail: format!(
                "{diff} codes differ; scale {} vs {} (limit: identical)",
                s[0], cw.scales[0]
            ),
        });
    }
    // Per-token FP8 activation quantization (the GEMM layer's `kernels/fp8_quant.cu`, W8A8's
    // dynamic scales, and a static input scale): the one-pass kernel (K a multiple of 8) and
    // the any-K one.
    let own = own_fp8q(b)?;
    let fq = b
        .fp8q
        .as_ref()
        .or(own.as_ref())
        .ok_or_else(|| anyhow::anyhow!("no kernels/fp8_quant.cu"))?;
    for (kk, st) in [(k, 0.0f32), (k - 2, 0.0), (k, 0.05)] {
        let t = 5usize;
        let rows: Vec<u16> = bits[..t * kk].to_vec();
        let input = b.gpu.upload(&rows)?;
        let codes = b.gpu.alloc(t * kk)?;
        let scales = b.gpu.alloc(t * 4)?;
        crate::gemm::fp8_quant::launch_quant_rows(
            &b.gpu,
            fq,
            input.ptr(),
            t,
            kk,
            st,
            codes.ptr(),
            scales.ptr(),
        )?;
        let got: Vec<u8> = b.gpu.download(&codes, 0, t * kk)?;
        let got_s: Vec<f32> = b.gpu.download(&scales, 0, t)?;
        let (mut diff, mut sdiff) = (0usize, 0usize);
        for r in 0..t {
            let row: Vec<f32> = rows[r * kk..(r + 1) * kk]
                .iter()
                .map(|x| f32::from_bits((*x as u32) << 16))
                .collect();
            let (want, sc) = crate::gemm::fp8_quant::quant_row_with(&row, st);
            sdiff += usize::from(got_s[r] != sc);
            diff += want
                .iter()
                .zip(&got[r * kk..(r + 1) * kk])
                .filter(|(w, g)| w != g)
                .count();
        }
        out.push(Check {
            name: format!(
                "GPU per-token FP8 activation quantization = CPU ({t}×{kk}, {} kernel, {})",
                if crate::gemm::fp8_quant::variant_for(kk).is_some() {
                    "one-pass"
                } else {
                    "any-K"
                },
                if st > 0.0 {
                    format!("static scale {st}")
                } else {
                    "dynamic scales".into()
                }
            ),
            pass: diff == 0 && sdiff == 0,
            detail: format!("{diff} codes and {sdiff} row scales differ (limit: identical)"),
        });
    }
    // NVFP4 + repack.
    let dev = loader.quantize_dev(b.gpu.upload(&bits)?, n, k, WeightFormat::Nvfp4)?;
    let cpu = host.quantized_with_amax(WeightFormat::Nvfp4, amax)?;
    if let (super::DLinear::W4 { dev }, weights::Linear::Nvfp4(cw)) = (&dev, &cpu) {
        let p = crate::formats::w4a16_pack::repack(cw)?;
        let gw: Vec<u8> = b.gpu.download(&dev.wq, 0, p.weights.len())?;
        let gs: Vec<u8> = b.gpu.download(&dev.sc, 0, p.scales.len())?;
        let dw = gw.iter().zip(&p.weights).filter(|(a, b)| a != b).count();
        let ds = gs.iter().zip(&p.scales).filter(|(a, b)| a != b).count();
        out.push(Check {
            name: "GPU NVFP4 quantization + W4A16 repack = CPU (96×512)".into(),
            pass: dw == 0 && ds == 0 && dev.out_scale == p.out_scale,
            detail: format!(
                "{dw} code bytes and {ds} scale bytes differ; epilogue scale {} vs {} (limit: identical)",
                dev.out_scale, p.out_scale
            ),
        });
    }
    Ok(out)
}

/// `kernels/fp8_quant.cu` built for the checks when the backend has none (no FP8 linear):
/// `None` when it has one.
///
/// # Errors
/// NVRTC or the module load fails.
fn own_fp8q(b: &CudaBackend) -> anyhow::Result<Option<crate::gpu::Module>> {
    if b.fp8q.is_some() {
        return Ok(None);
    }
    Ok(Some(crate::gemm::ops::compile_fp8_quant(&b.gpu)?))
}

/// `rt_silu_mul_quant` (SwiGLU fused with the per-token FP8 quantization, each row split over
/// blocks) against the two launches it replaces (`rt_silu_mul`, then the GEMM layer's per-token
/// quantization, [`crate::gemm::fp8_quant::launch_quant_rows`]), bit
/// for bit: BF16 output, E4M3 codes and row scales. Rows of several lengths (a multiple of 4 and
/// not), slice counts that leave empty or uneven slices, dynamic and static scales; each case
/// launched twice, so a counter the kernel failed to reset shows as a difference in the second
/// launch.
///
/// # Errors
/// A device failure.
pub fn swiglu_quant_matches_unfused(b: &CudaBackend) -> anyhow::Result<Vec<Check>> {
    let sm = b.gpu.sm_count as usize;
    let own = own_fp8q(b)?;
    let fq = b
        .fp8q
        .as_ref()
        .or(own.as_ref())
        .ok_or_else(|| anyhow::anyhow!("no kernels/fp8_quant.cu"))?;
    let mut out = Vec::new();
    // Inputs: ordinary values; all zeros (amax 0: scale 1); and ordinary values with a NaN and
    // infinities in the first row (NaN left out of the amax; an infinite amax: scale 1).
    #[derive(Clone, Copy, PartialEq)]
    enum Input {
        Values,
        Zeros,
        NanInf,
    }
    for (t, i, slices, st, input) in [
        (
            1,
            12_288,
            plan::silu_quant_slices(1, 12_288, sm),
            0.0f32,
            Input::Values,
        ),
        (
            1,
            25_600,
            plan::silu_quant_slices(1, 25_600, sm),
            0.0,
            Input::Values,
        ),
        (3, 998, 5, 0.0, Input::Values),
        (5, 4096, 32, 0.0, Input::Values),
        (2, 10, 8, 0.0, Input::Values),
        (40, 3000, 1, 0.0, Input::Values),
        (2, 4096, 4, 0.05, Input::Values),
        (2, 4096, 4, 0.0, Input::Zeros),
        (2, 4096, 4, 0.0, Input::NanInf),
    ] {
        let mut gu: Vec<u16> = (0..t * 2 * i)
            .map(|j| {
                let x = ((j as f32) * 0.618_034).fract() - 0.5;
                if input == Input::Zeros {
                    0
                } else {
                    bf16_bits(x * (1.0 + (j % 11) as f32))
                }
            })
            .collect();
        if input == Input::NanInf {
            // gate NaN; gate +inf; up −inf (silu(x)·−inf).
            gu[0] = 0x7FC0;
            gu[5] = 0x7F80;
            gu[i + 9] = 0xFF80;
        }
        let gu = b.gpu.upload(&gu)?;
        let (ref_act, ref_q, ref_s) = (
            b.gpu.alloc(t * i * 2)?,
            b.gpu.alloc(t * i)?,
            b.gpu.alloc(t * 4)?,
        );
        b.silu_mul(gu.ptr(), ref_act.ptr(), t, i)?;
        crate::gemm::fp8_quant::launch_quant_rows(
            &b.gpu,
            fq,
            ref_act.ptr(),
            t,
            i,
            st,
            ref_q.ptr(),
            ref_s.ptr(),
        )?;
        let want_act: Vec<u16> = b.gpu.download(&ref_act, 0, t * i)?;
        let want_q: Vec<u8> = b.gpu.download(&ref_q, 0, t * i)?;
        let want_s: Vec<f32> = b.gpu.download(&ref_s, 0, t)?;
        let (act, q, s) = (
            b.gpu.alloc(t * i * 2)?,
            b.gpu.alloc(t * i)?,
            b.gpu.alloc(t * 4)?,
        );
        let amax = b.gpu.upload(&vec![0u32; t])?;
        let arrivals = b.gpu.upload(&vec![0u32; t])?;
        let mut diffs = Vec::new();
        for _launch in 0..2 {
            // Stale outputs must not pass: every output filled with 0xFF first.
            b.gpu.memset(&q, 0xFF)?;
            b.gpu.memset(&act, 0xFF)?;
            b.gpu.memset(&s, 0xFF)?;
            launchers::rt::rt_silu_mul_quant(
                &b.rt,
                &b.gpu,
                (dim("t", t)?, dim("slices", slices)?, 1),
                (1024, 1, 1),
                0,
                &gu,
                t,
                i,
                &act,
                st,
                &q,
                &s,
                &amax,
                &arrivals,
            )?;
            let got_act: Vec<u16> = b.gpu.download(&act, 0, t * i)?;
            let got_q: Vec<u8> = b.gpu.download(&q, 0, t * i)?;
            let got_s: Vec<f32> = b.gpu.download(&s, 0, t)?;
            let counters: Vec<u32> = b.gpu.download(&amax, 0, t)?;
            let left: Vec<u32> = b.gpu.download(&arrivals, 0, t)?;
            diffs.push((
                got_act
                    .iter()
                    .zip(&want_act)
                    .filter(|(a, b)| a != b)
                    .count(),
                got_q.iter().zip(&want_q).filter(|(a, b)| a != b).count(),
                got_s
                    .iter()
                    .zip(&want_s)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count(),
                counters.iter().chain(&left).filter(|c| **c != 0).count(),
            ));
        }
        out.push(Check {
            name: format!(
                "SwiGLU + FP8 quant fused = the two launches ({t}×{i}, {slices} slices per row, {} scale{})",
                if st > 0.0 { "static" } else { "dynamic" },
                match input {
                    Input::Values => "",
                    Input::Zeros => ", all zeros",
                    Input::NanInf => ", a NaN and infinities",
                }
            ),
            pass: diffs.iter().all(|d| *d == (0, 0, 0, 0)),
            detail: diffs
                .iter()
                .enumerate()
                .map(|(n, (a, q, s, c))| {
                    format!(
                        "launch {}: {a} BF16 values, {q} codes, {s} row scales differ, {c} counters left non-zero",
                        n + 1
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
                + " (limit: identical, counters 0)",
        });
    }
    Ok(out)
}
