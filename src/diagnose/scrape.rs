//! What a `/metrics` scrape says about the engine: its name (metric prefix), KV capacity and
//! speculative decoding. Names: vLLM V1 (`vllm:cache_config_info`, `vllm:spec_decode_*`),
//! SGLang (`sglang:max_total_num_tokens`, `sglang:spec_accept_length`), llama.cpp
//! (`llamacpp:*`, which carries no capacity).

use serde::{Deserialize, Serialize};

use super::prometheus::Exposition;
use super::spec::{k_from_counts, SpecPooled};

/// Facts read from one scrape (or from the difference of two).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsFacts {
    /// `vllm`, `sglang`, `llama.cpp` from the metric-name prefix.
    pub engine: Option<String>,
    /// Samples read.
    pub samples: usize,
    /// Families announced by HELP/TYPE without any sample ("no data", never zero).
    pub families_without_samples: Vec<String>,
    /// Lines skipped as invalid.
    pub warnings: Vec<String>,
    /// KV capacity in tokens, with its source.
    pub kv_capacity: Option<(u64, String)>,
    /// Speculative decoding counters: on when drafts > 0.
    pub spec: Option<SpecPooled>,
    /// How spec was established (`drafts counter`, `families present, no samples`).
    pub spec_evidence: Option<String>,
}

/// The engine a scrape comes from, by its metric-name prefix.
pub fn engine_of(e: &Exposition) -> Option<String> {
    [
        ("vllm:", "vllm"),
        ("sglang:", "sglang"),
        ("llamacpp:", "llama.cpp"),
    ]
    .iter()
    .find(|(p, _)| {
        e.samples.iter().any(|s| s.name.starts_with(p))
            || e.families.keys().any(|k| k.starts_with(p))
    })
    .map(|(_, n)| n.to_string())
}

/// KV capacity from a scrape: vLLM `cache_config_info` (`kv_cache_size_tokens`, or
/// `num_gpu_blocks` × `block_size`), SGLang `max_total_num_tokens`.
pub fn kv_capacity(e: &Exposition) -> Option<(u64, String)> {
    if let Some(l) = e.labels_of("vllm:cache_config_info") {
        let get = |n: &str| {
            l.get(n)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| v as u64)
        };
        if let Some(t) = get("kv_cache_size_tokens") {
            return Some((t, "vllm:cache_config_info kv_cache_size_tokens".into()));
        }
        if let (Some(b), Some(n)) = (get("block_size"), get("num_gpu_blocks")) {
            return Some((
                b.saturating_mul(n),
                "vllm:cache_config_info num_gpu_blocks × block_size".into(),
            ));
        }
    }
    e.max("sglang:max_total_num_tokens")
        .filter(|t| *t >= 1.0)
        .map(|t| (t as u64, "sglang:max_total_num_tokens".into()))
}

/// Speculative decoding from counter values (totals since start, or deltas when `before` is
/// given). `None` when the scrape has no speculative-decoding family.
pub fn spec(before: Option<&Exposition>, after: &Exposition) -> Option<(SpecPooled, String)> {
    let d = |n: &str| -> Option<f64> {
        let a = after.sum(n)?;
        match before {
            Some(b) => {
                let b = b.sum(n).unwrap_or(0.0);
                (a >= b).then_some(a - b)
            }
            None => Some(a),
        }
    };
    if after.has_family("vllm:spec_decode_num_drafts") {
        let drafts = d("vllm:spec_decode_num_drafts");
        let draft_tokens = d("vllm:spec_decode_num_draft_tokens");
        let accepted = d("vllm:spec_decode_num_accepted_tokens");
        let Some(drafts) = drafts else {
            return Some((
                SpecPooled::default(),
                "speculative-decoding families announced, no samples: no data".into(),
            ));
        };
        let mut p = SpecPooled {
            drafts: Some(drafts.round() as u64),
            counts: accepted.is_some() && draft_tokens.is_some(),
            samples: 1,
            ..Default::default()
        };
        p.accepted = accepted.map_or(0, |a| a.round() as u64);
        p.drafted = draft_tokens.map_or(0, |a| a.round() as u64);
        let positions = after.sum_by("vllm:spec_decode_num_accepted_tokens_per_pos", "position");
        if let Some(dt) = draft_tokens {
            if let Some(k) = k_from_counts(dt, drafts) {
                p.k = Some(k);
                p.k_source = Some("/metrics draft_tokens / drafts".into());
            }
        }
        if p.k.is_none() && !positions.is_empty() {
            p.k = Some(positions.len() as u32);
            p.k_source = Some("/metrics accepted-per-position series".into());
        }
        if let (Some(a), Some(dt)) = (accepted, draft_tokens) {
            if dt > 0.0 {
                p.acceptance_rate = Some(a / dt);
            }
            if drafts > 0.0 {
                p.mean_acceptance_length = Some(1.0 + a / drafts);
            }
        }
        let why = format!(
            "{} drafts{}",
            drafts.round(),
            if before.is_some() {
                " between the scrapes"
            } else {
                " since the engine started (counter totals)"
            }
        );
        return Some((p, why));
    }
    if let Some(len) = after.max("sglang:spec_accept_length") {
        return Some((
            SpecPooled {
                mean_acceptance_length: Some(len),
                acceptance_rate: after.max("sglang:spec_accept_rate"),
                samples: 1,
                ..Default::default()
            },
            "sglang:spec_accept_length gauge".into(),
        ));
    }
    None
}

/// Everything [`MetricsFacts`] holds, from one scrape.
pub fn facts(e: &Exposition) -> MetricsFacts {
    let mut f = MetricsFacts {
        engine: engine_of(e),
        samples: e.samples.len(),
        warnings: e.warnings.clone(),
        kv_capacity: kv_capacity(e),
        ..Default::default()
    };
    f.families_without_samples = e
        .families
        .keys()
        .filter(|k| e.matching(k).next().is_none() && e.histogram(k).is_none())
        .cloned()
        .collect();
    if let Some((s, why)) = spec(None, e) {
        f.spec = Some(s);
        f.spec_evidence = Some(why);
    }
    f
}
