//! Batch-1 decode on the CUDA backend at several contexts: tok/s (CUDA graphs on) and the per-op
//! GPU time of one step (eager, CUDA events around each op), with each op's bytes where it has a
//! byte floor. The runtime section renders it against the copy bandwidth of the same run
//! ([`render`]): each op's share of the step's bound (weights + KV at that context ÷ copy rate).
//!
//! The KV contents do not matter for speed, so no prompt is prefilled: the decoded token attends
//! to `context` positions of whatever the cache holds (zeros after allocation). A hybrid's
//! Gated-DeltaNet state must continue from the position its slot has reached, and a recurrent
//! step reads and writes the whole state whatever the position; so the state after one token
//! is saved once (`Backend::snapshot_state`) and restored at each context's position
//! (`Backend::restore_state`), and the timed steps of a hybrid continue from there instead of
//! returning to the context every four steps (docs/runtime.md, "State snapshots").

use std::fmt::Write as _;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::runtime::backend::cuda::CudaBackend;
use crate::runtime::backend::{Backend, ForwardBatch, KvCacheSpec, RowSampling, SeqSegment};
use crate::runtime::config::KvCacheDtype;

/// Contexts at which batch-1 decode tok/s is measured.
pub const TOK_S_CONTEXTS: [usize; 3] = [128, 4096, 32_768];
/// Contexts at which one step is also profiled per op.
pub const PROFILE_CONTEXTS: [usize; 3] = [128, 4096, 32_768];
/// Decode steps timed per context (after 3 warm-up steps, which also capture the graph).
pub const TIMED_STEPS: usize = 32;
/// Eager steps profiled per context (after one warm-up step).
pub const PROFILED_STEPS: usize = 4;
/// The largest context; the backend must be loaded with `max_model_len` above it.
pub const MAX_CONTEXT: usize = 32_768;

/// One op of one profiled decode step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTime {
    /// The op as the backend's profile names it (`GEMM qkv`, `attention`, …).
    pub op: String,
    /// Launch groups per step.
    pub calls: u64,
    /// GPU seconds per step.
    pub seconds: f64,
    /// Bytes the op must read per step, where it has a byte floor (weights, KV).
    pub bytes: Option<u64>,
}

/// Batch-1 decode at one context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextDecode {
    /// Positions the decoded token attends to.
    pub context: usize,
    /// Decode tok/s, CUDA graphs on, over [`TIMED_STEPS`] steps (host loop included).
    pub tok_per_s: f64,
    /// Weight bytes of one step ([`CudaBackend::decode_weight_bytes`]).
    pub weight_bytes: u64,
    /// KV bytes one step reads at this context (K and V, every attention layer).
    pub kv_bytes: u64,
    /// Gated-DeltaNet state bytes one step reads and writes (every such layer's recurrent and
    /// convolution state, read once and written once; 0 for dense decoders and in results
    /// written before this field).
    #[serde(default)]
    pub state_bytes: u64,
    /// Per-op GPU time of one eager step (empty where not profiled).
    pub ops: Vec<OpTime>,
}

impl ContextDecode {
    /// The step's bound in seconds at `copy_bytes_per_s`: (weights + KV + Gated-DeltaNet state
    /// read and written) ÷ copy rate.
    pub fn bound_seconds(&self, copy_bytes_per_s: f64) -> f64 {
        (self.weight_bytes + self.kv_bytes + self.state_bytes) as f64 / copy_bytes_per_s
    }
    /// Measured tok/s ÷ the bound's tok/s.
    pub fn fraction_of_bound(&self, copy_bytes_per_s: f64) -> f64 {
        self.tok_per_s * self.bound_seconds(copy_bytes_per_s)
    }
    /// The profiled `attention` op's seconds ÷ (its KV bytes ÷ copy rate), when profiled.
    pub fn attention_vs_bound(&self, copy_bytes_per_s: f64) -> Option<f64> {
        let a = self.ops.iter().find(|o| o.op == "attention")?;
        let b = a.bytes.filter(|b| *b > 0)?;
        Some(a.seconds / (b as f64 / copy_bytes_per_s))
    }
}

/// Measure [`ContextDecode`] at every context of `contexts` (profiling those in `profiled`).
/// Re-initializes the backend's KV cache (BF16, block size 16) for the largest context; CUDA
/// graphs are on again afterwards.
///
/// # Errors
/// A backend failure, or a context above [`MAX_CONTEXT`].
pub fn measure(
    b: &mut CudaBackend,
    contexts: &[usize],
    profiled: &[usize],
) -> anyhow::Result<Vec<ContextDecode>> {
    let bs = 16usize;
    let max_ctx = contexts.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        max_ctx <= MAX_CONTEXT,
        "decode profile context {max_ctx} above {MAX_CONTEXT}"
    );
    let blocks = (max_ctx + TIMED_STEPS + 8).div_ceil(bs);
    b.init_kv_cache(KvCacheSpec {
        num_blocks: blocks,
        block_size: bs,
        dtype: KvCacheDtype::Bf16,
    })?;
    b.init_state_slots(1)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let greedy = [RowSampling {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
        draw: 0,
    }];
    let step = |b: &mut CudaBackend, pos: usize, tok: u32| -> anyhow::Result<u32> {
        let batch = ForwardBatch {
            token_ids: vec![tok],
            seqs: vec![SeqSegment {
                start: 0,
                len: 1,
                first_pos: pos,
                block_table: table.clone(),
                num_logits: 1,
                state_slot: 0,
            }],
        };
        Ok(b.sample_forward(&batch, &greedy)?[0])
    };
    let vocab = b.config().vocab_size as u32;
    let hybrid = b.config().is_hybrid();
    // Hybrids: the state after one token (a segment at position 0 resets the slot), placed at
    // each context by `place`.
    let mut state = if hybrid {
        step(b, 0, 1 % vocab)?;
        Some(b.snapshot_state(0)?)
    } else {
        None
    };
    let mut place = |b: &mut CudaBackend, pos: usize| -> anyhow::Result<()> {
        if let Some(s) = state.as_mut() {
            s.position = pos;
            b.restore_state(0, s)?;
        }
        Ok(())
    };
    let mut out = Vec::with_capacity(contexts.len());
    for &ctx in contexts {
        // The decoded token sits at position ctx − 1 (it attends to ctx positions).
        let pos0 = ctx.max(1) - 1;
        b.set_cuda_graphs(true);
        place(b, pos0)?;
        let mut tok = 1 % vocab;
        for i in 0..3 {
            tok = step(b, pos0 + i, tok)?;
        }
        let t0 = Instant::now();
        for i in 0..TIMED_STEPS {
            // Stay at the context (± the few steps): the KV read stays that of `ctx`. A hybrid's
            // state cannot go back without a restore inside the timed loop, so its steps go on
            // (contexts ctx … ctx + TIMED_STEPS + 2).
            let pos = if hybrid { pos0 + 3 + i } else { pos0 + i % 4 };
            tok = step(b, pos, tok)?;
        }
        let tok_per_s = TIMED_STEPS as f64 / t0.elapsed().as_secs_f64();
        let mut ops = Vec::new();
        if profiled.contains(&ctx) {
            b.set_profiling(false)?;
            place(b, pos0)?;
            step(b, pos0, tok)?; // eager warm-up (first use of any eager-only plan)
            b.set_profiling(true)?;
            for _ in 0..PROFILED_STEPS {
                // The restore is a copy between steps, outside every op's CUDA events.
                place(b, pos0)?;
                step(b, pos0, tok)?;
            }
            let bytes = b.op_bytes(ctx);
            ops = b
                .profile()
                .into_iter()
                .map(|(op, calls, secs)| OpTime {
                    bytes: bytes.iter().find(|(n, _)| *n == op).map(|(_, v)| *v),
                    op,
                    calls: calls / PROFILED_STEPS as u64,
                    seconds: secs / PROFILED_STEPS as f64,
                })
                .collect();
            b.set_profiling(false)?;
            b.set_cuda_graphs(true);
        }
        let kv_bytes = b
            .op_bytes(ctx)
            .iter()
            .find(|(n, _)| *n == "attention")
            .map_or(0, |x| x.1);
        out.push(ContextDecode {
            context: ctx,
            tok_per_s,
            weight_bytes: b.decode_weight_bytes(),
            kv_bytes,
            state_bytes: b.state_bytes_per_step(),
            ops,
        });
    }
    Ok(out)
}

/// What [`compare_kernels`] returns: (flash rows, CUDA-core rows, the backend's notes, the kernel
/// the first run used).
pub type KernelComparison = (Vec<ContextDecode>, Vec<ContextDecode>, Vec<String>, String);

/// Both decode-attention kernels on one synthetic preset in one format: the backend loaded once
/// (`quantize` = the format), [`measure`] with the flash-decoding kernel, then with the CUDA-core
/// kernel (`CudaBackend::set_flash_decode(false)`). Returns (flash rows, CUDA-core rows, the
/// backend's notes, the kernel the first run used).
///
/// # Errors
/// An unknown preset or a backend failure.
pub fn compare_kernels(
    device: usize,
    preset: &str,
    format: crate::runtime::config::WeightFormat,
) -> anyhow::Result<KernelComparison> {
    use crate::runtime::backend::cuda::{CudaLoadSpec, CudaOptions, WeightSource};
    let config = crate::runtime::config::ModelConfig::preset(preset)
        .ok_or_else(|| anyhow::anyhow!("unknown preset synthetic:{preset}"))?;
    // Loaded with the flash kernel on (the default, said here so that a change of default
    // does not silently make both rows the CUDA-core kernel's), so that its shared memory is
    // set up and its self-check runs.
    let mut b = CudaBackend::load_with(
        CudaLoadSpec {
            device,
            weights: WeightSource::Synthetic { config, seed: 0 },
            quantize: Some(format.into()),
            max_num_batched_tokens: 256,
            max_num_seqs: 1,
            max_model_len: MAX_CONTEXT + TIMED_STEPS + 16,
            kv_dtype: KvCacheDtype::Bf16,
            block_size: 16,
        },
        CudaOptions {
            flash_decode: true,
            ..Default::default()
        },
    )?;
    let first = format!("{:?}", b.decode_attention());
    let flash = measure(&mut b, &TOK_S_CONTEXTS, &PROFILE_CONTEXTS)?;
    b.set_flash_decode(false);
    let cores = measure(&mut b, &TOK_S_CONTEXTS, &PROFILE_CONTEXTS)?;
    Ok((flash, cores, b.notes.clone(), first))
}

/// The Markdown of one format's decode contexts at `copy_bytes_per_s` (`None`: the shares are
/// "not measured"): a tok/s table over the contexts, then one per-op table with a column pair
/// (ms, share of the bound) per profiled context. `attention` names the decode-attention kernel
/// the rows ran with (a condition of every row), where known.
pub fn render(
    format: &str,
    rows: &[ContextDecode],
    copy_bytes_per_s: Option<f64>,
    attention: Option<&str>,
) -> String {
    let mut o = String::new();
    if rows.is_empty() {
        return o;
    }
    let _ = writeln!(o, "\n#### Batch-1 decode by context, {format}\n");
    if let Some(k) = attention {
        let _ = writeln!(o, "Decode attention: {k}.\n");
    }
    let with_state = rows.iter().any(|r| r.state_bytes > 0);
    let t: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                crate::output::table::thousands(r.context as u64),
                format!("{:.1}", r.tok_per_s),
                if with_state {
                    format!(
                        "{:.2} + {:.3} + {:.3}",
                        r.weight_bytes as f64 / 1e9,
                        r.kv_bytes as f64 / 1e9,
                        r.state_bytes as f64 / 1e9
                    )
                } else {
                    format!(
                        "{:.2} + {:.3}",
                        r.weight_bytes as f64 / 1e9,
                        r.kv_bytes as f64 / 1e9
                    )
                },
                copy_bytes_per_s
                    .map_or("not measured: no copy bandwidth in this run".into(), |bw| {
                        format!("{:.1}", 1.0 / r.bound_seconds(bw))
                    }),
                copy_bytes_per_s.map_or("—".into(), |bw| {
                    format!("{:.1}%", 100.0 * r.fraction_of_bound(bw))
                }),
            ]
        })
        .collect();
    o.push_str(&crate::output::table::markdown_table(
        &[
            "context",
            "tok/s",
            if with_state {
                "GB per step (weights + KV read + Gated-DeltaNet state read and written)"
            } else {
                "GB read per step (weights + KV)"
            },
            "bound tok/s",
            "of bound",
        ],
        &t,
    ));
    if with_state {
        let _ = writeln!(
            o,
            "\nGated-DeltaNet state: the state after one token, restored at each context's position (a recurrent step reads and writes the whole state at any position); the 32 timed steps go on from there (contexts up to {} past the one named), the profiled steps each start from the restored state.",
            TIMED_STEPS + 2
        );
    }
    let profiled: Vec<&ContextDecode> = rows.iter().filter(|r| !r.ops.is_empty()).collect();
    if profiled.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "\nOne eager step per op (GPU time between CUDA events, mean of {PROFILED_STEPS} steps; no graph, so the sum is above the graph-replayed step). Share of the bound = op time ÷ the step's bound time (weights + KV at that context{} ÷ copy rate); op at its floor = op time ÷ (its own bytes ÷ copy rate); MB per step: the bytes of the op's floor (weights; K and V at that context{}).\n",
        if with_state { " + Gated-DeltaNet state read and written" } else { "" },
        if with_state { "; the Gated-DeltaNet state read and written" } else { "" }
    );
    let mut names: Vec<String> = Vec::new();
    for r in &profiled {
        for op in &r.ops {
            if !names.contains(&op.op) {
                names.push(op.op.clone());
            }
        }
    }
    let mut header = vec!["op".to_string(), "calls".to_string()];
    for r in &profiled {
        let c = crate::output::table::thousands(r.context as u64);
        header.push(format!("ms @{c}"));
        header.push(format!("share of bound @{c}"));
        header.push(format!("at its floor @{c}"));
        header.push(format!("MB per step @{c}"));
    }
    let mut t: Vec<Vec<String>> = Vec::new();
    for n in names.iter().chain(std::iter::once(&"sum".to_string())) {
        let mut row = vec![n.clone()];
        let calls = profiled
            .iter()
            .flat_map(|r| r.ops.iter())
            .find(|o| &o.op == n)
            .map_or("".to_string(), |o| o.calls.to_string());
        row.push(calls);
        for r in &profiled {
            let (secs, bytes) = if n == "sum" {
                (Some(r.ops.iter().map(|o| o.seconds).sum::<f64>()), None)
            } else {
                r.ops
                    .iter()
                    .find(|o| &o.op == n)
                    .map_or((None, None), |o| (Some(o.seconds), o.bytes))
            };
            row.push(secs.map_or("—".into(), |s| format!("{:.3}", s * 1e3)));
            row.push(match (secs, copy_bytes_per_s) {
                (Some(s), Some(bw)) => format!("{:.1}%", 100.0 * s / r.bound_seconds(bw)),
                _ => "—".into(),
            });
            row.push(match (secs, bytes, copy_bytes_per_s) {
                (Some(s), Some(b), Some(bw)) if b > 0 => format!("{:.2}×", s / (b as f64 / bw)),
                _ => "—".into(),
            });
            row.push(bytes.map_or("—".into(), |b| format!("{:.1}", b as f64 / 1e6)));
        }
        t.push(row);
    }
    let hdr: Vec<&str> = header.iter().map(|s| s.as_str()).collect();
    o.push_str(&crate::output::table::markdown_table(&hdr, &t));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<ContextDecode> {
        vec![
            ContextDecode {
                context: 128,
                tok_per_s: 200.0,
                weight_bytes: 16_000_000_000,
                kv_bytes: 18_874_368,
                state_bytes: 0,
                ops: vec![
                    OpTime {
                        op: "GEMM gate_up".into(),
                        calls: 36,
                        seconds: 2.0e-3,
                        bytes: Some(7_000_000_000),
                    },
                    OpTime {
                        op: "attention".into(),
                        calls: 36,
                        seconds: 0.1e-3,
                        bytes: Some(18_874_368),
                    },
                ],
            },
            ContextDecode {
                context: 32_768,
                tok_per_s: 150.0,
                weight_bytes: 16_000_000_000,
                kv_bytes: 4_831_838_208,
                state_bytes: 0,
                ops: Vec::new(),
            },
        ]
    }

    /// A hybrid's rows: the Gated-DeltaNet state read and written counts in the bound, the
    /// table says so, and each op's bytes (the delta rule's state) are shown per step.
    #[test]
    fn hybrid_rows_count_the_state_bytes() {
        let mut r = rows();
        for x in &mut r {
            x.state_bytes = 2_000_000_000;
        }
        r[0].ops.push(OpTime {
            op: "Gated-DeltaNet delta rule".into(),
            calls: 48,
            seconds: 0.5e-3,
            bytes: Some(301_989_888),
        });
        let bw = 4.0e12;
        let want = (16_000_000_000u64 + 18_874_368 + 2_000_000_000) as f64 / bw;
        assert!((r[0].bound_seconds(bw) - want).abs() < 1e-12);
        let md = render("bf16", &r, Some(bw), None);
        assert!(md.contains("Gated-DeltaNet state read and written"), "{md}");
        assert!(md.contains("16.00 + 0.019 + 2.000"), "{md}");
        assert!(md.contains("| Gated-DeltaNet delta rule"), "{md}");
        assert!(md.contains("302.0"), "the delta rule's MB per step: {md}");
        // Dense rows keep the two-term column.
        let dense = render("bf16", &rows(), Some(bw), None);
        assert!(!dense.contains("Gated-DeltaNet"), "{dense}");
    }

    #[test]
    fn bounds_and_shares_are_ratios_of_the_rows() {
        let r = rows();
        let bw = 4.0e12;
        // (16e9 + 18.9e6) / 4e12 = 4.0047 ms; 200 tok/s × that = 80.1%.
        assert!((r[0].bound_seconds(bw) - 4.004_718_592e-3).abs() < 1e-12);
        assert!((r[0].fraction_of_bound(bw) - 0.800_943_718_4).abs() < 1e-9);
        // Attention 0.1 ms against 18.9 MB / 4 TB/s = 4.72 µs: 21.2×.
        let a = r[0].attention_vs_bound(bw).unwrap();
        assert!((a - 0.1e-3 / (18_874_368.0 / bw)).abs() < 1e-9, "{a}");
        assert!(r[1].attention_vs_bound(bw).is_none());
    }

    fn collapse_spaces(s: &str) -> String {
        s.split(' ')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn render_shows_every_context_and_the_profile() {
        // Table columns are padded to their widths: compare with runs of spaces collapsed.
        let md = collapse_spaces(&render("bf16", &rows(), Some(4.0e12), Some("CUDA cores")));
        assert!(md.contains("Decode attention: CUDA cores."), "{md}");
        assert!(md.contains("| 128 | 200.0 |"), "{md}");
        assert!(md.contains("| 32,768 | 150.0 |"), "{md}");
        assert!(md.contains("80.1%"), "{md}");
        // GEMM gate_up: 2 ms of a 4.0047 ms bound = 49.9%; 2 ms against 1.75 ms = 1.14×.
        assert!(
            md.contains("| GEMM gate_up | 36 | 2.000 | 49.9% | 1.14× |"),
            "{md}"
        );
        assert!(md.contains("| sum |"), "{md}");
        let none = render("bf16", &rows(), None, None);
        assert!(!none.contains("Decode attention:"), "{none}");
        assert!(
            none.contains("not measured: no copy bandwidth in this run"),
            "{none}"
        );
        assert!(render("bf16", &[], Some(1.0), Some("x")).is_empty());
    }
}
