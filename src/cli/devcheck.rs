//! `rigbench devcheck` (hidden): the CUDA backend's checks and measurements in one command, for
//! developers bringing the runtime up on a new card. Prints a table; exits 1 when a check fails.

use std::io::Write;

use crate::runtime::backend::cuda::self_check;
use crate::runtime::config::{KvCacheDtype, ModelConfig, WeightFormat};
use crate::runtime_eval::cuda_check;
use crate::ExitStatus;

/// Arguments of `rigbench devcheck`.
#[derive(Debug, clap::Args)]
pub struct DevcheckArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Preset for the speed measurements (`none` skips them).
    #[arg(long, default_value = "qwen3-8b")]
    pub preset: String,
    /// Formats to measure.
    #[arg(long, value_delimiter = ',', default_value = "bf16,fp8,nvfp4")]
    pub formats: Vec<WeightFormat>,
    /// Prompts and greedy steps of the parity check.
    #[arg(long, default_value_t = 8)]
    pub prompts: usize,
    /// Greedy steps per prompt.
    #[arg(long, default_value_t = 64)]
    pub steps: usize,
    /// Checkpoint folders holding a `reference_greedy.json` (transformers' greedy tokens): each is
    /// loaded on the GPU from its safetensors and must reproduce every token.
    #[arg(long = "hf-reference")]
    pub hf_reference: Vec<std::path::PathBuf>,
    /// Run only these parts: kernels, attention, parity, hybrid, reference, moe, moe-gemm,
    /// anatomy, wg-probe, speed, contexts (default: all). `moe` runs greedy parity with the CPU
    /// backend on `synthetic:tiny-moe` (BF16, FP8, NVFP4); `moe-gemm` times the grouped expert
    /// GEMMs of the `qwen3.6-35b-a3b` suite's `[moe]` table against their byte floor. `attention` checks the flash-decoding and CUDA-core
    /// decode-attention kernels against the CPU reference, times them against the KV-streaming
    /// bound, and runs greedy parity with the CPU backend at head_dim 64 and 128; `contexts`
    /// measures batch-1 decode of `--preset` at 128, 4k and 32k contexts with each kernel, with
    /// the per-op profile. `wg-probe` runs every launch configuration of the Hopper W4A16 wgmma
    /// kernel once against the CPU reference (the child process the bench and the runtime start
    /// before they use that kernel).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Hybrid presets: also measure the speed of `--quantize nvfp4-mixed` (NVIDIA's recipe).
    #[arg(long)]
    pub with_mixed: bool,
}

/// Run the checks.
pub fn run(a: DevcheckArgs) -> anyhow::Result<ExitStatus> {
    let mut out = std::io::stdout();
    let mut failed = false;
    let part = |p: &str| a.only.is_empty() || a.only.iter().any(|o| o == p);
    let tiny = ModelConfig::tiny();
    let w = crate::runtime::weights::synthesize(&tiny, 0);
    // Kernel-level checks on a backend over the tiny model.
    if part("kernels") {
        failed |= kernel_checks(&a, &w, &mut out)?;
    }
    if part("attention") {
        failed |= attention_checks(&a, &w, &mut out)?;
    }
    if part("parity") {
        failed |= dense_parity(&a, &w, &mut out)?;
    }
    if part("hybrid") {
        failed |= hybrid_checks(&a, &mut out)?;
    }
    if part("reference") {
        failed |= reference_checks(&a, &mut out)?;
    }
    if part("moe") {
        failed |= moe_parity(&a, &mut out)?;
    }
    if part("moe-gemm") {
        failed |= moe_gemm(&a, &mut out)?;
    }
    if part("wg-probe") {
        failed |= !wg_probe(&mut out, a.device)?;
    }
    if part("anatomy") {
        failed |= anatomy(&a, &mut out)?;
    }
    let hybrid_preset = ModelConfig::preset(&a.preset).is_some_and(|c| c.is_hybrid());
    if a.preset != "none" && !hybrid_preset && part("contexts") {
        failed |= context_speed(&a, &mut out)?;
    }
    if hybrid_preset && part("speed") {
        failed |= hybrid_speed(&a, &mut out)?;
    }
    if a.preset != "none" && !hybrid_preset && part("speed") {
        failed |= dense_speed(&a, &mut out)?;
    }
    Ok(if failed {
        ExitStatus::Error
    } else {
        ExitStatus::Ok
    })
}

/// The kernel-level self-checks on a CUDA backend over the tiny model `w`: synthesis,
/// quantization and the fused SwiGLU quantization against the CPU. Returns whether any failed.
fn kernel_checks(
    a: &DevcheckArgs,
    w: &crate::runtime::weights::ModelWeights,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut failed = false;
    let b = crate::runtime::backend::cuda::CudaBackend::load(
        crate::runtime::backend::cuda::CudaLoadSpec {
            device: a.device,
            weights: crate::runtime::backend::cuda::WeightSource::Host(Box::new(w.clone())),
            quantize: None,
            max_num_batched_tokens: 256,
            max_num_seqs: 8,
            max_model_len: 1024,
            kv_dtype: KvCacheDtype::Bf16,
            block_size: 16,
        },
    )?;
    writeln!(out, "device: {:?}", b)?;
    for n in &b.notes {
        writeln!(out, "note: {n}")?;
    }
    let mut checks = vec![self_check::synthesis_matches_cpu(&b, 0)?];
    checks.extend(self_check::quantization_matches_cpu(&b)?);
    checks.extend(self_check::swiglu_quant_matches_unfused(&b)?);
    for c in checks {
        failed |= !c.pass;
        writeln!(
            out,
            "{} {}: {}",
            if c.pass { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        )?;
    }
    Ok(failed)
}

/// Greedy parity of the tiny dense model `w` on the GPU against the CPU backend, in BF16, FP8
/// and NVFP4 with a BF16 KV cache and in BF16 with an FP8 one (FP8 also its CPU-only rounding
/// sensitivity, for information). Returns whether any failed.
fn dense_parity(
    a: &DevcheckArgs,
    w: &crate::runtime::weights::ModelWeights,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut failed = false;
    let parity_cases: &[(WeightFormat, KvCacheDtype)] = &[
        (WeightFormat::Bf16, KvCacheDtype::Bf16),
        (WeightFormat::Fp8, KvCacheDtype::Bf16),
        (WeightFormat::Nvfp4, KvCacheDtype::Bf16),
        (WeightFormat::Bf16, KvCacheDtype::Fp8),
    ];
    for &(fmt, kv) in parity_cases {
        if fmt == WeightFormat::Fp8 {
            // The dense model's own FP8 sensitivity on the CPU alone (compare the hybrid's).
            write_fp8_sensitivity(out, a, "tiny", w)?;
        }
        failed |= write_parity(
            out,
            &format!("tiny {} KV {}", fmt.id(), kv.vllm_name()),
            cuda_check::greedy_parity(a.device, w, fmt, kv, a.prompts, a.steps),
        )?;
        out.flush()?;
    }
    Ok(failed)
}

/// `--hf-reference`: each checkpoint loaded on the GPU from its safetensors must reproduce
/// transformers' greedy tokens (`reference_greedy.json`); a mismatch at a near-tie of the f32
/// logits passes, explained. Returns whether any failed.
fn reference_checks(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let mut failed = false;
    for dir in &a.hf_reference {
        let r = (|| -> anyhow::Result<Vec<(crate::runtime_eval::check::ReferenceOutcome, Option<crate::runtime_eval::check::MismatchExplanation>)>> {
            let hf = ModelConfig::read_hf_config(&dir.join("config.json"))?;
            for w in &hf.warnings {
                writeln!(out, "  config warning: {w}")?;
            }
            let reference = crate::runtime_eval::check::ReferenceGreedy::load(
                &dir.join("reference_greedy.json"),
            )?;
            let mut b = crate::runtime::backend::cuda::CudaBackend::load(
                crate::runtime::backend::cuda::CudaLoadSpec {
                    device: a.device,
                    weights: crate::runtime::backend::cuda::WeightSource::Checkpoint {
                        dir: dir.clone(),
                        config: hf.config.clone(),
                    },
                    quantize: None,
                    max_num_batched_tokens: 256,
                    max_num_seqs: 8,
                    max_model_len: 512,
                    kv_dtype: KvCacheDtype::Bf16,
                    block_size: 16,
                },
            )?;
            let outs = crate::runtime_eval::check::check_reference_greedy(&mut b, &reference)?;
            let host = crate::runtime::weights::load_dir(dir, &hf.config)?;
            outs.into_iter()
                .map(|o| {
                    let e = if o.matches() {
                        None
                    } else {
                        Some(crate::runtime_eval::check::explain_mismatch(
                            &host,
                            &reference,
                            &o,
                            crate::runtime_eval::check::NEAR_TIE_LOGITS,
                        )?)
                    };
                    Ok((o, e))
                })
                .collect()
        })();
        match r {
            Ok(outs) => {
                for (o, e) in outs {
                    let explained = e.as_ref().is_some_and(|e| e.near_tie);
                    failed |= !o.matches() && !explained;
                    writeln!(
                        out,
                        "{} reference {}: '{}' {} of {} tokens equal (first mismatch {:?}){}",
                        if o.matches() {
                            "PASS"
                        } else if explained {
                            "PASS (near-tie)"
                        } else {
                            "FAIL"
                        },
                        dir.display(),
                        o.prompt,
                        o.got
                            .iter()
                            .zip(&o.expected)
                            .filter(|(a, b)| a == b)
                            .count(),
                        o.expected.len(),
                        o.first_mismatch,
                        e.map(|e| format!(
                            "; at step {} the f32 logits of the reference's token {} and the GPU's {} differ by {:.4} (near-tie below {}): BF16 activations flip it",
                            e.step, e.tokens.0, e.tokens.1, e.f32_margin, crate::runtime_eval::check::NEAR_TIE_LOGITS
                        ))
                        .unwrap_or_default()
                    )?;
                }
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL reference {}: {e:#}", dir.display())?;
            }
        }
    }
    Ok(failed)
}

/// The W4A16 kernel anatomy (bytes, BF16 and v2 times, v2 without reduce / mma, an empty grid)
/// on four shapes at M = 1 and 16. Returns whether any failed.
fn anatomy(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let mut failed = false;
    let shapes = [(5120, 6144), (34816, 5120), (5120, 17408), (96, 5120)];
    for m in [1usize, 16] {
        match crate::kernels::anatomy::run(a.device, &shapes, m) {
            Ok(rows) => {
                for r in rows {
                    writeln!(
                        out,
                        "anatomy {}x{} M={}: bytes {:.1} MB; bf16 {:.1} us; v2 {:.1} us ({:.2} TB/s) [no reduce {:.1}, no mma {:.1}, empty grid {:.1}] {}",
                        r.n,
                        r.k,
                        r.m,
                        r.bytes as f64 / 1e6,
                        r.bf16 * 1e6,
                        r.v2 * 1e6,
                        r.bytes as f64 / r.v2 / 1e12,
                        r.v2_no_reduce * 1e6,
                        r.v2_no_mma * 1e6,
                        r.empty * 1e6,
                        r.v2_config
                    )?;
                }
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL anatomy M={m}: {e:#}")?;
            }
        }
        out.flush()?;
    }
    Ok(failed)
}

/// Decode and prefill speed of the dense `--preset` in each of `--formats` against the
/// weight-streaming bound of the measured copy bandwidth, with the per-op profile of one
/// step. Returns whether any failed.
fn dense_speed(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let mut failed = false;
    let gpu = crate::gpu::Gpu::open_device(a.device)?;
    let bw = crate::kernels::bench::copy_bandwidth(&gpu)?.bytes_per_s;
    drop(gpu);
    writeln!(out, "copy bandwidth {:.2} TB/s", bw / 1e12)?;
    for fmt in &a.formats {
        match cuda_check::decode_speed(a.device, &a.preset, *fmt) {
            Ok(s) => {
                let bound = bw / s.weight_bytes as f64;
                writeln!(
                    out,
                    "speed {} {}: weights {:.2} GB; batch-1 decode {:.1} tok/s ({:.0}% of the weight-streaming bound {:.1}; no graphs {:.1}); batch-32 @1k {:.0} tok/s ({:.1}x batch 1); prefill 4k {:.0} tok/s",
                    a.preset,
                    fmt.id(),
                    s.weight_bytes as f64 / 1e9,
                    s.b1_tok_s,
                    100.0 * s.b1_tok_s / bound,
                    bound,
                    s.b1_tok_s_no_graph,
                    s.b32_tok_s,
                    s.b32_tok_s / s.b1_tok_s,
                    s.prefill_tok_s
                )?;
                write_speed_details(out, &s, Some(bound))?;
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL speed {} {}: {e:#}", a.preset, fmt.id())?;
            }
        }
        out.flush()?;
    }
    Ok(failed)
}

/// The lines under a `speed` line: batch-1 decode at a 128-token context (with its share of
/// `bound`, tok/s, when given: the dense models' weight-streaming bound, which at 128 tokens
/// is the step's), the eager per-op profile with its sum, and the run's notes.
fn write_speed_details(
    out: &mut impl Write,
    s: &cuda_check::Speed,
    bound: Option<f64>,
) -> std::io::Result<()> {
    match bound {
        Some(b) => writeln!(
            out,
            "  batch-1 decode at a 128-token context: {:.1} tok/s ({:.0}% of the bound)",
            s.b1_short_tok_s,
            100.0 * s.b1_short_tok_s / b
        )?,
        None => writeln!(
            out,
            "  batch-1 decode at a 128-token context: {:.1} tok/s",
            s.b1_short_tok_s
        )?,
    }
    let total: f64 = s.profile.iter().map(|p| p.2).sum();
    writeln!(
        out,
        "  profile of one eager batch-1 step at a 4,096-token context (sum {:.2} ms):",
        total * 1e3
    )?;
    for (name, calls, secs) in &s.profile {
        writeln!(out, "    {name}: {calls} calls, {:.3} ms", secs * 1e3)?;
    }
    for n in &s.notes {
        writeln!(out, "  note: {n}")?;
    }
    Ok(())
}

/// One line for a whole-model greedy parity run labelled `label`: PASS or FAIL with top-1
/// agreement, near-ties, logits rel L2 (max, mean) and the tolerance, or FAIL with the error.
/// Returns whether it failed.
fn write_parity(
    out: &mut impl Write,
    label: &str,
    r: anyhow::Result<cuda_check::Parity>,
) -> std::io::Result<bool> {
    match r {
        Ok(p) => {
            writeln!(
                out,
                "{} parity {label}: top-1 {}/{} (+{} near-ties), greedy sequences identical: {}; logits rel L2 max {:.2e} mean {:.2e}, max |Δ| {:.3} (tolerance {:?})",
                if p.pass() { "PASS" } else { "FAIL" },
                p.top1_equal,
                p.tokens,
                p.near_ties,
                p.greedy_identical,
                p.max_rel_l2,
                p.mean_rel_l2,
                p.max_abs,
                p.tol
            )?;
            Ok(!p.pass())
        }
        Err(e) => {
            writeln!(out, "FAIL parity {label}: {e:#}")?;
            Ok(true)
        }
    }
}

/// The model's own FP8 sensitivity, on the CPU alone: how far its FP8 logits move when the
/// BF16 roundings are left out (`cuda_check::cpu_rounding_parity`), one INFO line to read the
/// GPU's FP8 parity against (a tiny model whose FP8 logits move this much on the CPU fails the
/// GPU parity for the same reason).
fn write_fp8_sensitivity(
    out: &mut impl Write,
    a: &DevcheckArgs,
    name: &str,
    w: &crate::runtime::weights::ModelWeights,
) -> std::io::Result<()> {
    match crate::runtime_eval::cuda_check::cpu_rounding_parity(
        w,
        WeightFormat::Fp8,
        a.prompts,
        a.steps,
        crate::runtime_eval::cuda_check::PARITY_FP8,
    ) {
        Ok(p) => writeln!(
            out,
            "INFO (CPU only) {name} fp8 with vs without BF16 rounding: top-1 {}/{} (+{} near-ties); logits rel L2 max {:.2e} mean {:.2e}",
            p.top1_equal, p.tokens, p.near_ties, p.max_rel_l2, p.mean_rel_l2
        ),
        Err(e) => writeln!(out, "INFO (CPU only) {name} fp8 sensitivity: {e:#}"),
    }
}

/// Timed runs per kernel and case of `devcheck --only attention`.
const ATTENTION_TIMED_RUNS: usize = 9;

/// `devcheck --only attention`: every [`crate::runtime::backend::cuda::attn_check::devcheck_cases`]
/// case on both decode-attention kernels: rel L2 against the CPU reference (tolerance
/// `FLASH_DECODE_REL_L2`), the two kernels against each other, and each kernel's median time
/// (L2 evicted before each run by a read flush) as a multiple of the KV bytes ÷ the copy rate measured here.
/// Returns whether anything failed.
fn attention_checks(
    a: &DevcheckArgs,
    w: &crate::runtime::weights::ModelWeights,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    use crate::runtime::backend::cuda::{attn_check, decode_attn};
    let b = crate::runtime::backend::cuda::CudaBackend::load(
        crate::runtime::backend::cuda::CudaLoadSpec {
            device: a.device,
            weights: crate::runtime::backend::cuda::WeightSource::Host(Box::new(w.clone())),
            quantize: None,
            max_num_batched_tokens: 256,
            max_num_seqs: 8,
            max_model_len: 1024,
            kv_dtype: KvCacheDtype::Bf16,
            block_size: 16,
        },
    )?;
    for n in &b.notes {
        writeln!(out, "note: {n}")?;
    }
    let bw = crate::kernels::bench::copy_bandwidth(b.gpu())?.bytes_per_s;
    writeln!(
        out,
        "attention: copy bandwidth {:.2} TB/s; tolerance rel L2 {:.0e} against the CPU reference (f64 softmax over the same BF16/E4M3 values); times are medians of {ATTENTION_TIMED_RUNS} runs, each after reading a buffer of twice the L2 size to evict it (clean lines: no write-back inside the timed kernel); bound = KV bytes / copy bandwidth; target <= {:.1}x the bound",
        bw / 1e12,
        decode_attn::FLASH_DECODE_REL_L2,
        decode_attn::ATTENTION_BOUND_TARGET
    )?;
    let mut failed = false;
    // Whole-model greedy parity where the flash kernel runs (the tiny preset's head_dim 16 takes
    // the CUDA-core kernel): the tiny shape with 8 query heads over 2 KV heads at head_dim 64
    // and 128, BF16 and FP8 KV.
    for (hd, kv) in [
        (64, KvCacheDtype::Bf16),
        (128, KvCacheDtype::Bf16),
        (128, KvCacheDtype::Fp8),
    ] {
        let mut c = ModelConfig::tiny();
        c.head_dim = hd;
        c.rotary_dim = hd;
        c.num_heads = 8;
        c.num_kv_heads = 2;
        let wh = crate::runtime::weights::synthesize(&c, 0);
        // With the flash-decoding kernel (the default), then with the CUDA-core kernel, so a
        // difference from the CPU is attributed to the kernel or to the rest of the model.
        for flash in [true, false] {
            let opts = crate::runtime::backend::cuda::CudaOptions {
                flash_decode: flash,
                ..Default::default()
            };
            let kernel = if flash { "flash" } else { "cuda-cores" };
            let label = format!(
                "tiny head_dim {hd} (8 heads / 2 KV heads, {kernel} decode attention) bf16 KV {}",
                kv.vllm_name()
            );
            let r = cuda_check::greedy_parity_with(
                a.device,
                &wh,
                WeightFormat::Bf16,
                kv,
                (a.prompts, a.steps),
                opts,
            );
            failed |= write_parity(out, &label, r)?;
            out.flush()?;
        }
    }
    let cases = attn_check::devcheck_cases();
    let outcomes = b.check_decode_attention(&cases, ATTENTION_TIMED_RUNS)?;
    for (case, o) in cases.iter().zip(outcomes) {
        match o {
            Ok(o) => {
                failed |= !o.pass();
                let bound = case.kv_bytes() as f64 / bw;
                let k = |k: &Option<attn_check::KernelOutcome>| match k {
                    None => "not run (does not cover the shape)".to_string(),
                    Some(k) => format!(
                        "rel L2 {:.2e}{}",
                        k.rel_l2,
                        k.seconds
                            .map(|s| format!(
                                ", {:.1} us = {:.2}x the bound ({:.2} TB/s)",
                                s * 1e6,
                                s / bound,
                                case.kv_bytes() as f64 / s / 1e12
                            ))
                            .unwrap_or_default()
                    ),
                };
                writeln!(
                    out,
                    "{} attention {} ({} partitions, KV {:.2} MB, bound {:.1} us): flash {}; cuda-cores {}{}",
                    if o.pass() { "PASS" } else { "FAIL" },
                    case.label(),
                    o.parts,
                    case.kv_bytes() as f64 / 1e6,
                    bound * 1e6,
                    k(&o.flash),
                    k(&o.cuda_cores),
                    o.flash_vs_cuda_cores
                        .map(|d| format!("; flash vs cuda-cores rel L2 {d:.2e}"))
                        .unwrap_or_default()
                )?;
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL attention {}: {e:#}", case.label())?;
            }
        }
        out.flush()?;
    }
    Ok(failed)
}

/// `devcheck --only contexts`: [`crate::runtime_eval::decode_profile::compare_kernels`] per
/// format of `--formats` on `--preset`, rendered against the copy bandwidth measured here.
/// Returns whether anything failed.
fn context_speed(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    use crate::runtime_eval::decode_profile;
    let gpu = crate::gpu::Gpu::open_device(a.device)?;
    let bw = crate::kernels::bench::copy_bandwidth(&gpu)?.bytes_per_s;
    drop(gpu);
    writeln!(out, "contexts: copy bandwidth {:.2} TB/s", bw / 1e12)?;
    let mut failed = false;
    for fmt in &a.formats {
        match decode_profile::compare_kernels(a.device, &a.preset, *fmt) {
            Ok((flash, cores, notes, first)) => {
                for n in notes {
                    writeln!(out, "note: {n}")?;
                }
                for (kernel, rows) in [(first.as_str(), &flash), ("CudaCores", &cores)] {
                    for r in rows.iter() {
                        writeln!(
                            out,
                            "context {} {} {kernel}: batch-1 decode at {} positions {:.1} tok/s ({:.1}% of the bound {:.1}, weights + KV){}",
                            a.preset,
                            fmt.id(),
                            r.context,
                            r.tok_per_s,
                            100.0 * r.fraction_of_bound(bw),
                            1.0 / r.bound_seconds(bw),
                            r.attention_vs_bound(bw)
                                .map(|x| format!("; attention {x:.2}x its KV bound"))
                                .unwrap_or_default()
                        )?;
                    }
                    let md = decode_profile::render(
                        &format!("{} {kernel}", fmt.id()),
                        rows,
                        Some(bw),
                        None,
                    );
                    writeln!(out, "{md}")?;
                }
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL contexts {} {}: {e:#}", a.preset, fmt.id())?;
            }
        }
        out.flush()?;
    }
    Ok(failed)
}

/// `devcheck --only wg-probe`: [`crate::kernels::impls::w4a16_wg::probe`] on device `device`,
/// one line per (shape, M) and a last line `PASS wg-probe: …` / `FAIL wg-probe: …` (`SKIP` when
/// the card cannot run the kernel). Returns false on a failure.
fn wg_probe(out: &mut impl Write, device: usize) -> anyhow::Result<bool> {
    use crate::gemm::w4a16_wg as wg;
    let gpu = crate::gpu::Gpu::open_device(device)?;
    if let Err(why) = wg::wanted(&gpu) {
        writeln!(out, "SKIP wg-probe: {why}")?;
        return Ok(true);
    }
    let module = match wg::compile(&gpu) {
        Ok((m, _)) => m,
        Err(e) => {
            writeln!(
                out,
                "FAIL wg-probe: kernels/w4a16_wg.cu did not build: {e:#}"
            )?;
            return Ok(false);
        }
    };
    if std::env::var_os(wg::ENV_PTX).is_some() {
        writeln!(out, "wg-probe: loaded the parent's PTX for {}", module.arch)?;
    } else {
        writeln!(
            out,
            "wg-probe: kernels/w4a16_wg.cu compiled for {} in {:.2} s",
            module.arch, module.compile_s
        )?;
    }
    out.flush()?;
    let cases = crate::kernels::impls::w4a16_wg::probe(&gpu, &module)?;
    let (mut configs, mut bad, mut worst) = (0usize, 0usize, 0f64);
    for c in &cases {
        configs += c.configs;
        bad += c.failed.len();
        worst = worst.max(c.worst_rel_l2);
        writeln!(
            out,
            "  case {}x{} M={}: {} configurations, {} failed, worst rel_l2 {:.2e}",
            c.n,
            c.k,
            c.m,
            c.configs,
            c.failed.len(),
            c.worst_rel_l2
        )?;
        for (cfg, why) in &c.failed {
            writeln!(out, "    failed: {cfg}: {why}")?;
        }
    }
    let verdict = if bad == 0 && configs > 0 {
        "PASS"
    } else {
        "FAIL"
    };
    writeln!(
        out,
        "{verdict} wg-probe: {} cases, {configs} configurations, {bad} failed, worst rel_l2 {worst:.2e}",
        cases.len()
    )?;
    Ok(verdict == "PASS")
}

fn print_checks(
    out: &mut impl Write,
    checks: &[crate::runtime::backend::cuda::self_check::Check],
) -> anyhow::Result<bool> {
    let mut failed = false;
    for c in checks {
        failed |= !c.pass;
        writeln!(
            out,
            "{} {}: {}",
            if c.pass { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        )?;
    }
    Ok(failed)
}

/// The Gated-DeltaNet hybrid checks: the GDN kernels against the CPU, parity of whole hybrids
/// (`synthetic:tiny-hybrid`, and a variant with head_dim 256 that takes the wide attention
/// kernel) in every format, and state consistency across prefill forms. Returns whether any
/// failed.
/// Greedy parity of the CUDA backend with the CPU backend on the tiny mixture of experts (a
/// Gated-DeltaNet hybrid with 8 experts top-2 and a shared expert), per format: the routing,
/// grouped GEMMs and combine against `runtime::moe`. Returns whether any failed.
fn moe_parity(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    use anyhow::Context;
    let mut failed = false;
    let c = ModelConfig::preset("tiny-moe").context("the tiny-moe preset")?;
    // tiny-moe's shared expert (48 wide) differs from its routed experts (32): it runs as a
    // separate dense MLP. The same model with a 32-wide shared expert runs it as expert E of
    // the grouped GEMMs (CudaOptions::fuse_shared_expert, the 35B's case).
    let mut fusable = c.clone();
    if let Some(m) = fusable.moe.as_mut() {
        m.shared_expert_intermediate_size = m.expert_intermediate_size;
    }
    for (name, c) in [
        ("tiny-moe", &c),
        ("tiny-moe (shared expert fused)", &fusable),
    ] {
        failed |= moe_parity_of(a, name, c, out)?;
    }
    Ok(failed)
}

/// [`moe_parity`] for one model: routing and greedy parity per format. Returns whether any
/// check failed.
fn moe_parity_of(
    a: &DevcheckArgs,
    name: &str,
    c: &ModelConfig,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut failed = false;
    let w = crate::runtime::weights::synthesize(c, 0);
    write_fp8_sensitivity(out, a, name, &w)?;
    for fmt in [WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Nvfp4] {
        match crate::runtime_eval::cuda_check::routing_parity(a.device, &w, fmt, 512) {
            Ok(p) => {
                failed |= !p.pass();
                writeln!(
                    out,
                    "{} routing {name} {} (512-token prefill, CPU vs GPU): {} of {} routes the same experts, {} differ at a near-tie (< {}), {} downstream of an earlier flip, {} beyond{}",
                    if p.pass() { "PASS" } else { "FAIL" },
                    fmt.id(),
                    p.equal,
                    p.routes,
                    p.near_ties,
                    crate::runtime_eval::cuda_check::ROUTING_NEAR_TIE,
                    p.downstream,
                    p.mismatch_count,
                    if p.mismatches.is_empty() {
                        String::new()
                    } else {
                        format!(": first {:?}", p.mismatches)
                    }
                )?;
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL routing {name} {}: {e:#}", fmt.id())?;
            }
        }
        // A routing flip at a near-tie (the routing check above bounds them) moves that step's
        // logits discontinuously: the largest per-step difference measures the flips, not the
        // kernels. The mean and the token criterion stay.
        let parity = crate::runtime_eval::cuda_check::greedy_parity(
            a.device,
            &w,
            fmt,
            KvCacheDtype::Bf16,
            a.prompts,
            a.steps,
        )
        .map(|mut p| {
            p.tol.max_rel_l2 = f64::INFINITY;
            p
        });
        failed |= write_parity(out, &format!("{name} {}", fmt.id()), parity)?;
    }
    Ok(failed)
}

/// The grouped expert GEMMs of the `qwen3.6-35b-a3b` suite's `[moe]` table on the GPU, cold and
/// in graphs, against their byte floor ([`crate::kernels::moe_grouped`]); a case whose output
/// misses the CPU reference fails. Returns whether any failed.
fn moe_gemm(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    use anyhow::Context;
    let suite = crate::kernels::suite::load("suites/kernels/qwen3.6-35b-a3b.toml")?;
    let spec = suite
        .moe
        .context("the qwen3.6-35b-a3b suite has no [moe] table")?;
    let gpu = crate::gpu::Gpu::open_device_stream(a.device, true)?;
    let copy = crate::kernels::bench::copy_bandwidth(&gpu)?;
    let rule = crate::stats::StoppingRule {
        max_time_s: 0.3,
        ..Default::default()
    };
    let formats = [
        crate::formats::GemmFormat::Bf16,
        crate::formats::GemmFormat::Fp8,
        crate::formats::GemmFormat::W4a16,
    ];
    let r = crate::kernels::moe_grouped::run(
        &gpu,
        &spec,
        &formats,
        &rule,
        copy.bytes_per_s,
        gpu.l2_bytes,
    )?;
    let mut failed = r.cases.is_empty();
    for c in &r.cases {
        let tol = crate::kernels::moe_grouped::TOLERANCE;
        let ok = c.rel_l2.is_some_and(|e| e <= tol);
        failed |= !ok;
        let (oc, og) = c.over_floor(r.copy_bytes_per_s);
        writeln!(
            out,
            "{} moe-gemm {} {} B={} {}: {} of {} experts, cold {:.1} µs ({:.2}× floor), graph {:.1} µs ({:.2}× floor), rel L2 {:.1e} (tolerance {tol:.0e})",
            if ok { "PASS" } else { "FAIL" },
            c.linear,
            c.format,
            c.batch,
            c.distribution,
            c.touched,
            c.experts,
            c.cold.as_ref().map_or(f64::NAN, |t| t.median_s * 1e6),
            oc.unwrap_or(f64::NAN),
            c.graph.as_ref().map_or(f64::NAN, |t| t.median_s * 1e6),
            og.unwrap_or(f64::NAN),
            c.rel_l2.unwrap_or(f64::NAN)
        )?;
    }
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    writeln!(out, "{}", crate::kernels::moe_grouped::markdown(&r))?;
    Ok(failed)
}

fn hybrid_checks(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    use crate::runtime::backend::cuda::{hybrid_check, CudaBackend, CudaLoadSpec, WeightSource};
    let mut failed = false;
    let tiny = crate::runtime::hybrid::tiny_hybrid();
    let w = crate::runtime::weights::synthesize(&tiny, 0);
    let mut wide_c = tiny.clone();
    wide_c.head_dim = 256;
    wide_c.rotary_dim = 64;
    let wide = crate::runtime::weights::synthesize(&wide_c, 0);
    match CudaBackend::load(CudaLoadSpec {
        device: a.device,
        weights: WeightSource::Host(Box::new(w.clone())),
        quantize: None,
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        max_model_len: 1024,
        kv_dtype: KvCacheDtype::Bf16,
        block_size: 16,
    })
    .and_then(|b| hybrid_check::gdn_kernels_match_cpu(&b))
    {
        Ok(checks) => failed |= print_checks(out, &checks)?,
        Err(e) => {
            failed = true;
            writeln!(out, "FAIL Gated-DeltaNet kernels: {e:#}")?;
        }
    }
    let cases = [
        ("tiny-hybrid", &w, WeightFormat::Bf16, KvCacheDtype::Bf16),
        ("tiny-hybrid", &w, WeightFormat::Fp8, KvCacheDtype::Bf16),
        ("tiny-hybrid", &w, WeightFormat::Nvfp4, KvCacheDtype::Bf16),
        ("tiny-hybrid", &w, WeightFormat::Bf16, KvCacheDtype::Fp8),
        (
            "tiny-hybrid head_dim 256",
            &wide,
            WeightFormat::Bf16,
            KvCacheDtype::Bf16,
        ),
        (
            "tiny-hybrid head_dim 256",
            &wide,
            WeightFormat::Bf16,
            KvCacheDtype::Fp8,
        ),
    ];
    let keep = crate::runtime_eval::fp8_bisect::KeepBf16::from_env()?;
    if !keep.is_empty() {
        writeln!(
            out,
            "NOTE {}={}: these linears stay BF16 on both backends in the parity checks below",
            crate::runtime_eval::fp8_bisect::KEEP_BF16_ENV,
            keep.names()
        )?;
    }
    for (name, weights, fmt, kv) in cases {
        if fmt == WeightFormat::Fp8 {
            write_fp8_sensitivity(out, a, name, weights)?;
        }
        failed |= write_parity(
            out,
            &format!("{name} {} KV {}", fmt.id(), kv.vllm_name()),
            crate::runtime_eval::cuda_check::greedy_parity(
                a.device, weights, fmt, kv, a.prompts, a.steps,
            ),
        )?;
        out.flush()?;
    }
    // The hybrids' CUDA-core decode attention (CudaOptions::flash_decode_hybrid off), against
    // which the default rows above (flash decoding; at head_dim 256 prefill runs through it too)
    // are read: the two must give the same figures within their noise.
    for (name, weights, kv) in [
        ("tiny-hybrid", &w, KvCacheDtype::Bf16),
        ("tiny-hybrid head_dim 256", &wide, KvCacheDtype::Bf16),
        ("tiny-hybrid head_dim 256", &wide, KvCacheDtype::Fp8),
    ] {
        let opts = crate::runtime::backend::cuda::CudaOptions {
            flash_decode_hybrid: false,
            ..Default::default()
        };
        let label = format!(
            "{name} bf16 KV {} (CUDA-core decode attention)",
            kv.vllm_name()
        );
        let r = crate::runtime_eval::cuda_check::greedy_parity_with(
            a.device,
            weights,
            WeightFormat::Bf16,
            kv,
            (a.prompts, a.steps),
            opts,
        );
        failed |= write_parity(out, &label, r)?;
        out.flush()?;
    }
    for (name, weights) in [("tiny-hybrid", &w), ("tiny-hybrid head_dim 256", &wide)] {
        match crate::runtime_eval::hybrid_check::prefill_forms_agree(a.device, weights) {
            Ok(c) => {
                failed |= !c.pass;
                writeln!(
                    out,
                    "{} {} ({name}): {}",
                    if c.pass { "PASS" } else { "FAIL" },
                    c.name,
                    c.detail
                )?;
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL prefill forms ({name}): {e:#}")?;
            }
        }
    }
    out.flush()?;
    Ok(failed)
}

/// Speed of a hybrid preset per format (and NVIDIA's mixed recipe with `--with-mixed`), against
/// the weight-streaming bound of a batch-1 step at the 4,096-token context: weights as resident
/// on the GPU + the Gated-DeltaNet state read and written + the KV of the attention layers.
fn hybrid_speed(a: &DevcheckArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    use crate::runtime::config::QuantRecipe;
    let mut failed = false;
    let c = ModelConfig::preset(&a.preset).ok_or_else(|| anyhow::anyhow!("preset"))?;
    let gpu = crate::gpu::Gpu::open_device(a.device)?;
    let bw = crate::kernels::bench::copy_bandwidth(&gpu)?.bytes_per_s;
    drop(gpu);
    writeln!(out, "copy bandwidth {:.2} TB/s", bw / 1e12)?;
    let mut recipes: Vec<QuantRecipe> =
        a.formats.iter().map(|f| QuantRecipe::Uniform(*f)).collect();
    if a.with_mixed {
        recipes.push(QuantRecipe::Nvfp4Mixed);
    }
    let step =
        crate::runtime::memory::decode_step_bytes(&c, WeightFormat::Bf16, KvCacheDtype::Bf16, 4096);
    for r in recipes {
        match crate::runtime_eval::hybrid_check::hybrid_speed(a.device, &a.preset, r) {
            Ok(s) => {
                let bytes = s.weight_bytes + step.kv + step.state;
                let bound = bw / bytes as f64;
                writeln!(
                    out,
                    "speed {} {}: weights {:.2} GB + state {:.0} MB read and written + KV {:.0} MB at 4,096 tokens; batch-1 decode {:.1} tok/s ({:.0}% of the bound {:.1}; no graphs {:.1}); batch-32 @4k {:.0} tok/s ({:.1}x batch 1); prefill 4k {:.0} tok/s",
                    a.preset,
                    r.id(),
                    s.weight_bytes as f64 / 1e9,
                    step.state as f64 / 1e6,
                    step.kv as f64 / 1e6,
                    s.b1_tok_s,
                    100.0 * s.b1_tok_s / bound,
                    bound,
                    s.b1_tok_s_no_graph,
                    s.b32_tok_s,
                    s.b32_tok_s / s.b1_tok_s,
                    s.prefill_tok_s
                )?;
                write_speed_details(out, &s, None)?;
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL speed {} {}: {e:#}", a.preset, r.id())?;
            }
        }
        out.flush()?;
    }
    Ok(failed)
}
