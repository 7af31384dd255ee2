//! Checks that keep end-to-end figures honest on the streams real engines send:
//!
//! - [`mark_opening_wave`]: a closed loop releases `concurrency` requests at once after the
//!   warm-up; against an engine with one prefill slot they queue behind each other (TTFT 108,
//!   208, 308, 408 ms where the steady state is 101–154 ms), so they are left out of the latency
//!   statistics. Throughput still covers the whole run (first send to last completion).
//! - [`cross_check_tokens`]: `usage` counts against the received text re-counted by a tokenizer
//!   (the whole text at once, without special tokens: a BOS added per piece would double the
//!   count), flagged beyond 2%.
//! - [`kernel_env`]: the environment variables that change an engine's kernels, recorded when
//!   rigbench starts the engine.
//! - [`determinism_check`]: the same seeded prompts sent twice at temperature 0, output hashes
//!   compared (`e2e --check-determinism`), reported ahead of any speed or quality figure.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::adapters::EngineKind;
use super::client::EngineClient;
use super::conditions::{CacheCondition, TokenCheck};
use super::executor::{execute, ExecConfig, LoadPoint, StopSignal};
use super::metrics::{RequestRecord, TokenSource};
use super::validity::TOKEN_COUNT_TOLERANCE;
use super::workload::{prepare, CacheTemp, Suite, TokenCounter};

/// Mark the opening wave of a closed-loop point: the requests with index below the concurrency
/// (the executor hands out indices in order, so these are the ones released together). Returns
/// a note for the run, or `None` for an open loop. When every request belongs to the first
/// wave nothing is marked (there is no steady state to measure) and the note says so.
pub fn mark_opening_wave(point: &LoadPoint, records: &mut [RequestRecord]) -> Option<String> {
    let LoadPoint::Closed { concurrency } = point else {
        return None;
    };
    let c = *concurrency as usize;
    if c <= 1 {
        return None;
    }
    if records.len() <= c {
        return Some(format!(
            "all {} requests were released together (concurrency {c}): their latencies include the queueing of that burst; send more requests than the concurrency for steady-state figures",
            records.len()
        ));
    }
    let mut n = 0;
    for r in records.iter_mut().filter(|r| r.index < c) {
        r.opening_wave = true;
        n += 1;
    }
    Some(format!(
        "closed loop: the opening wave ({n} requests released together after the warm-up) is left out of the latency statistics; throughput covers the whole run"
    ))
}

/// Re-count the output of each completed request whose count came from `usage`, with
/// `counter`, on `texts[i]` (the request's reasoning and content); flag a request whose two
/// counts differ by more than [`TOKEN_COUNT_TOLERANCE`]. `None` when no tokenizer is available
/// or `skip` says why the check does not apply.
pub async fn cross_check_tokens(
    records: &mut [RequestRecord],
    texts: &BTreeMap<usize, String>,
    counter: &TokenCounter,
    skip: Option<&str>,
) -> Option<TokenCheck> {
    let source = counter.source()?;
    let mut check = TokenCheck {
        source: source.label().to_string(),
        tolerance: TOKEN_COUNT_TOLERANCE,
        ..Default::default()
    };
    if let Some(why) = skip {
        check.source = format!("not cross-checked: {why}");
        return Some(check);
    }
    for r in records.iter_mut() {
        if !r.ok || r.token_source != Some(TokenSource::Usage) {
            continue;
        }
        let (Some(usage), Some(text)) = (r.output_tokens, texts.get(&r.index)) else {
            continue;
        };
        let Ok(Some(n)) = counter.count(text).await else {
            continue;
        };
        let n = n as u64;
        r.output_tokens_retokenized = Some(n);
        check.checked += 1;
        let rel = (n as f64 - usage as f64).abs() / (usage.max(1) as f64);
        check.max_rel_diff = check.max_rel_diff.max(rel);
        if rel > TOKEN_COUNT_TOLERANCE {
            check.disagreeing += 1;
            r.flags.push(format!(
                "token count: usage {usage} vs re-counted {n} ({:+.1}%)",
                100.0 * (n as f64 / usage.max(1) as f64 - 1.0)
            ));
        }
    }
    Some(check)
}

/// Prefixes of environment variables that change what an engine's kernels do (vLLM, SGLang,
/// llama.cpp/GGML, PyTorch and its compilers, CUDA and its libraries, NCCL, TensorRT-LLM and
/// Transformer Engine, FlashInfer, Triton).
pub const KERNEL_ENV_PREFIXES: &[&str] = &[
    "VLLM_",
    "SGLANG_",
    "SGL_",
    "LLAMA_",
    "GGML_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "CUDA_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUDNN_",
    "NCCL_",
    "NVTE_",
    "TRTLLM_",
    "TLLM_",
    "FLASHINFER_",
    "TRITON_",
    "XFORMERS_",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
    "MKL_",
];

fn kernel_relevant(name: &str) -> bool {
    KERNEL_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The kernel-relevant environment an engine started by rigbench gets: rigbench's own
/// environment (inherited), overlaid with the `NAME=value` assignments that lead `command`
/// (`VLLM_X=1 vllm serve ...`, also after `env`), filtered by [`KERNEL_ENV_PREFIXES`].
pub fn kernel_env(command: Option<&str>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| kernel_relevant(k))
        .collect();
    if let Some(cmd) = command {
        for word in cmd.split_whitespace() {
            if word == "env" {
                continue;
            }
            match word.split_once('=') {
                Some((k, v))
                    if !k.is_empty()
                        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                {
                    if kernel_relevant(k) {
                        out.insert(
                            k.to_string(),
                            v.trim_matches(|c| c == '"' || c == '\'').to_string(),
                        );
                    }
                }
                _ => break,
            }
        }
    }
    out
}

/// A warm run where every completed request reported its cached tokens
/// (`usage.prompt_tokens_details.cached_tokens`): each request must have reused more than a cold
/// run could (the `shared_prefix` tokens of the workload and its own chat-template tokens,
/// prompt tokens − tokens counted in the message), else the run is not verified warm and the note
/// says how many requests were served warm. Other runs are returned unchanged.
pub fn warm_per_request(
    mut c: CacheCondition,
    records: &[RequestRecord],
    shared_prefix: u64,
) -> CacheCondition {
    if c.temperature != CacheTemp::Warm || c.verified != Some(true) {
        return c;
    }
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let per: Option<Vec<(u64, u64)>> = ok
        .iter()
        .map(|r| {
            let template = match (r.prompt_tokens, r.input_tokens_counted) {
                (Some(p), Some(n)) => p.saturating_sub(n),
                _ => 0,
            };
            Some((r.cached_tokens?, shared_prefix + template))
        })
        .collect();
    let Some(per) = per.filter(|p| !p.is_empty()) else {
        return c;
    };
    let warm = per.iter().filter(|(cached, cold)| cached > cold).count();
    if warm < per.len() {
        c.verified = Some(false);
        c.note = format!(
            "NOT verified warm: {warm} of {} requests reused more of their prompt than a cold run also reuses (shared prefix, chat-template tokens; usage.prompt_tokens_details.cached_tokens of each request); the others were not served from the cache",
            per.len()
        );
    }
    c
}

/// The outcome of `e2e --check-determinism`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeterminismCheck {
    /// Prompts sent (each twice).
    pub prompts: usize,
    /// Requests in flight in each pass.
    pub concurrency: u32,
    /// `max_tokens` of each request.
    pub max_tokens: u32,
    /// Temperature sent (0: greedy).
    pub temperature: f64,
    /// Seed sent.
    pub seed: Option<u64>,
    /// Prompts whose two outputs have the same hash.
    pub identical: usize,
    /// Prompts whose outputs differ: index, hashes of the two passes, and the character where
    /// the texts first differ.
    pub differing: Vec<DeterminismDiff>,
    /// Requests that failed in either pass (not compared).
    pub failed: usize,
    /// How the engine's prompt (prefix) cache was kept out of the comparison: the second pass
    /// served from the cache may differ from the first for that reason alone.
    #[serde(default)]
    pub prompt_cache: String,
    /// Whether neither pass could reuse a prompt from the cache (sent uncached, or the cache
    /// emptied before each pass).
    #[serde(default)]
    pub prompt_cache_excluded: bool,
}

impl DeterminismCheck {
    /// Whether every compared prompt gave the same output twice (and at least one was compared).
    pub fn deterministic(&self) -> bool {
        self.identical > 0 && self.differing.is_empty()
    }

    /// One line for reports.
    pub fn summary(&self) -> String {
        if self.identical + self.differing.len() == 0 {
            return format!(
                "determinism NOT checked: every request of the check failed ({} prompts)",
                self.prompts
            );
        }
        if self.differing.is_empty() {
            format!(
                "deterministic: {} prompts sent twice at temperature {} gave identical outputs (output hashes equal){}",
                self.identical,
                self.temperature,
                if self.failed > 0 {
                    format!("; {} requests failed and were not compared", self.failed)
                } else {
                    String::new()
                }
            )
        } else {
            let first = &self.differing[0];
            let cause = if self.prompt_cache_excluded {
                format!(
                    "; speed and quality figures of this engine are not reproducible as configured (prompt cache: {})",
                    self.prompt_cache
                )
            } else {
                format!(
                    "; likely cause: the engine's prompt cache ({}), which serves the second pass differently from the first, not the engine's kernels",
                    if self.prompt_cache.is_empty() {
                        "not kept out"
                    } else {
                        &self.prompt_cache
                    }
                )
            };
            format!(
                "NONDETERMINISTIC: {} of {} prompts sent twice at temperature {} gave different outputs (first: prompt {}, texts differ from character {}){cause}",
                self.differing.len(),
                self.identical + self.differing.len(),
                self.temperature,
                first.prompt,
                first.first_difference
            )
        }
    }
}

/// One prompt whose two outputs differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeterminismDiff {
    /// Prompt index.
    pub prompt: usize,
    /// FNV-1a hash of the first output (reasoning + content), hex.
    pub first_hash: String,
    /// Hash of the second output.
    pub second_hash: String,
    /// Character index where the two texts first differ.
    pub first_difference: usize,
}

/// FNV-1a 64-bit hash of `text`, hex: the output's fingerprint (the received text is a function
/// of the generated tokens).
pub fn output_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Send the same `prompts` seeded prompts of `suite` twice, at temperature 0, with
/// `concurrency` in flight, and compare the outputs' hashes. The engine's prompt cache is kept
/// out where `kind` allows: requests sent uncached ([`EngineKind::uncached_request_fields`],
/// llama.cpp's `cache_prompt: false`), else the prefix cache emptied before each pass
/// ([`EngineKind::reset_path`]); where neither works the result says so and names the cache as
/// the likely cause of a difference.
///
/// # Errors
/// The prompts cannot be prepared (tokenizer failure, lengths).
#[allow(clippy::too_many_arguments)]
pub async fn determinism_check(
    client: &EngineClient,
    suite: &Suite,
    counter: &TokenCounter,
    model: &str,
    max_model_len: Option<u64>,
    prompts: usize,
    concurrency: u32,
    exec: &ExecConfig,
    stop: &StopSignal,
    kind: EngineKind,
) -> anyhow::Result<DeterminismCheck> {
    let uncached = kind.uncached_request_fields();
    let client = match &uncached {
        Some(f) => client.with_body_fields(f),
        None => client.clone(),
    };
    let mut cache = match &uncached {
        Some(f) => (format!("every request sent with {f}"), true),
        None => (String::new(), true),
    };
    let mut s = suite.clone();
    s.sampling.temperature = 0.0;
    let seed = s.sampling.seed.or(Some(0));
    s.sampling.seed = seed;
    let mut reqs = prepare(&s, counter, model, "determinism", prompts, max_model_len).await?;
    for r in reqs.iter_mut() {
        r.req.temperature = 0.0;
        r.req.seed = seed;
    }
    let max_tokens = reqs.first().map_or(0, |r| r.req.max_tokens);
    let reqs = Arc::new(reqs);
    let point = LoadPoint::Closed {
        concurrency: concurrency.max(1),
    };
    let mut outs: Vec<BTreeMap<usize, Option<String>>> = Vec::new();
    for _ in 0..2 {
        if uncached.is_none() {
            let path = kind.reset_path();
            let emptied = client.reset_prefix_cache_at(path).await.ok().flatten() == Some(true);
            if emptied && cache.1 {
                cache.0 = format!("emptied with POST {path} before each pass");
            } else if !emptied {
                cache = (
                    format!("not kept out: POST {path} did not empty it and the engine has no per-request switch"),
                    false,
                );
            }
        }
        let o = execute(
            &client,
            &point,
            reqs.clone(),
            exec,
            stop,
            indicatif::ProgressBar::hidden(),
        )
        .await;
        outs.push(
            o.records
                .into_iter()
                .map(|r| {
                    let ok = r.outcome.error.is_none() && r.outcome.done;
                    (
                        r.index,
                        ok.then(|| format!("{}{}", r.outcome.reasoning, r.outcome.content)),
                    )
                })
                .collect(),
        );
    }
    let mut check = DeterminismCheck {
        prompts,
        concurrency: concurrency.max(1),
        max_tokens,
        temperature: 0.0,
        seed,
        prompt_cache: cache.0,
        prompt_cache_excluded: cache.1,
        ..Default::default()
    };
    for i in 0..prompts {
        match (
            outs[0].get(&i).cloned().flatten(),
            outs[1].get(&i).cloned().flatten(),
        ) {
            (Some(a), Some(b)) => {
                let (ha, hb) = (output_hash(&a), output_hash(&b));
                if ha == hb {
                    check.identical += 1;
                } else {
                    let first_difference = a
                        .chars()
                        .zip(b.chars())
                        .position(|(x, y)| x != y)
                        .unwrap_or_else(|| a.chars().count().min(b.chars().count()));
                    check.differing.push(DeterminismDiff {
                        prompt: i,
                        first_hash: ha,
                        second_hash: hb,
                        first_difference,
                    });
                }
            }
            _ => check.failed += 1,
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_wave_of_a_closed_loop() {
        let mut recs: Vec<RequestRecord> = (0..16)
            .map(|i| RequestRecord {
                index: i,
                ok: true,
                ..Default::default()
            })
            .collect();
        let note = mark_opening_wave(&LoadPoint::Closed { concurrency: 4 }, &mut recs).unwrap();
        assert!(note.contains("opening wave (4 requests"), "{note}");
        assert_eq!(recs.iter().filter(|r| r.opening_wave).count(), 4);
        assert!(recs[..4].iter().all(|r| r.opening_wave));
        // Concurrency 1 has no burst; requests ≤ concurrency: nothing marked, said so.
        let mut few = recs[..4].to_vec();
        few.iter_mut().for_each(|r| r.opening_wave = false);
        assert!(mark_opening_wave(&LoadPoint::Closed { concurrency: 1 }, &mut few).is_none());
        let note = mark_opening_wave(&LoadPoint::Closed { concurrency: 4 }, &mut few).unwrap();
        assert!(note.contains("all 4 requests were released together"));
        assert!(few.iter().all(|r| !r.opening_wave));
    }

    #[test]
    fn env_of_an_engine_command() {
        let env = kernel_env(Some(
            "VLLM_MARLIN_USE_ATOMIC_ADD=1 env NCCL_NVLS_ENABLE=0 HOME=/x vllm serve m --port 8000",
        ));
        assert_eq!(env["VLLM_MARLIN_USE_ATOMIC_ADD"], "1");
        assert_eq!(env["NCCL_NVLS_ENABLE"], "0");
        assert!(!env.contains_key("HOME"));
        assert!(kernel_relevant("SGLANG_ENABLE_TORCH_COMPILE") && !kernel_relevant("PATH"));
    }

    #[test]
    fn hashes_and_summary() {
        assert_eq!(output_hash("abc"), output_hash("abc"));
        assert_ne!(output_hash("abc"), output_hash("abd"));
        let mut c = DeterminismCheck {
            prompts: 2,
            identical: 2,
            ..Default::default()
        };
        assert!(c.deterministic() && c.summary().starts_with("deterministic"));
        c.identical = 1;
        c.differing.push(DeterminismDiff {
            prompt: 1,
            first_hash: "a".into(),
            second_hash: "b".into(),
            first_difference: 7,
        });
        assert!(!c.deterministic());
        assert!(
            c.summary().starts_with("NONDETERMINISTIC: 1 of 2"),
            "{}",
            c.summary()
        );
        // The prompt cache not kept out: named as the likely cause.
        assert!(
            c.summary()
                .contains("likely cause: the engine's prompt cache (not kept out)"),
            "{}",
            c.summary()
        );
        c.prompt_cache = "every request sent with {\"cache_prompt\":false}".into();
        c.prompt_cache_excluded = true;
        assert!(c
            .summary()
            .contains("not reproducible as configured (prompt cache: every request sent with"));
    }

    #[test]
    fn warm_needs_every_request_to_reuse_more_than_the_shared_prefix() {
        // The run: 1,054 prompt tokens, 794 of them cached per request: the shared
        // prefix a cold run reuses too.
        let r = |cached: u64| RequestRecord {
            ok: true,
            prompt_tokens: Some(1054),
            input_tokens_counted: Some(1045),
            cached_tokens: Some(cached),
            ..Default::default()
        };
        let warm = CacheCondition {
            temperature: CacheTemp::Warm,
            reset: None,
            salted: true,
            queries: None,
            hits: None,
            hit_rate: None,
            hits_allowed: 0,
            verified: Some(true),
            counters: None,
            note: "warm".into(),
        };
        let c = warm_per_request(warm.clone(), &[r(794), r(794)], 785);
        assert_eq!(c.verified, Some(false));
        assert!(c.note.contains("0 of 2 requests"), "{}", c.note);
        let c = warm_per_request(warm.clone(), &[r(1053), r(794)], 785);
        assert!(c.note.contains("1 of 2 requests"), "{}", c.note);
        let c = warm_per_request(warm.clone(), &[r(1053), r(1053)], 785);
        assert_eq!(c.verified, Some(true));
        // Cold runs, and requests without the field, are left as they are.
        let c = warm_per_request(
            warm,
            &[
                r(1053),
                RequestRecord {
                    ok: true,
                    ..Default::default()
                },
            ],
            785,
        );
        assert_eq!(c.verified, Some(true));
    }
}
