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
    /// Run only these parts: kernels, parity, reference, anatomy, speed (default: all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
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
    }
    let parity_cases: &[(WeightFormat, KvCacheDtype)] = if part("parity") {
        &[
            (WeightFormat::Bf16, KvCacheDtype::Bf16),
            (WeightFormat::Fp8, KvCacheDtype::Bf16),
            (WeightFormat::Nvfp4, KvCacheDtype::Bf16),
            (WeightFormat::Bf16, KvCacheDtype::Fp8),
        ]
    } else {
        &[]
    };
    for &(fmt, kv) in parity_cases {
        match cuda_check::greedy_parity(a.device, &w, fmt, kv, a.prompts, a.steps) {
            Ok(p) => {
                failed |= !p.pass();
                writeln!(
                    out,
                    "{} parity tiny {} KV {}: top-1 {}/{} (+{} near-ties), greedy sequences identical: {}; logits rel L2 max {:.2e} mean {:.2e}, max |Δ| {:.3} (tolerance {:?})",
                    if p.pass() { "PASS" } else { "FAIL" },
                    fmt.id(),
                    kv.vllm_name(),
                    p.top1_equal,
                    p.tokens,
                    p.near_ties,
                    p.greedy_identical,
                    p.max_rel_l2,
                    p.mean_rel_l2,
                    p.max_abs,
                    p.tol
                )?;
            }
            Err(e) => {
                failed = true;
                writeln!(out, "FAIL parity tiny {}: {e:#}", fmt.id())?;
            }
        }
        out.flush()?;
    }
    if part("reference") {
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
    }
    if part("anatomy") {
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
    }
    if a.preset != "none" && part("speed") {
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
                    writeln!(
                        out,
                        "  batch-1 decode at a 128-token context: {:.1} tok/s ({:.0}% of the bound)",
                        s.b1_short_tok_s,
                        100.0 * s.b1_short_tok_s / bound
                    )?;
                    let total: f64 = s.profile.iter().map(|p| p.2).sum();
                    writeln!(
                        out,
                        "  profile of one eager batch-1 step at a 4,096-token context (sum {:.2} ms):",
                        total * 1e3
                    )?;
                    for (name, calls, secs) in &s.profile {
                        writeln!(out, "    {name}: {calls} calls, {:.3} ms", secs * 1e3)?;
                    }
                    for n in s.notes {
                        writeln!(out, "  note: {n}")?;
                    }
                }
                Err(e) => {
                    failed = true;
                    writeln!(out, "FAIL speed {} {}: {e:#}", a.preset, fmt.id())?;
                }
            }
            out.flush()?;
        }
    }
    Ok(if failed {
        ExitStatus::Error
    } else {
        ExitStatus::Ok
    })
}
