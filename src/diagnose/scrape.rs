//! What a `/metrics` scrape says about the engine: its name (metric prefix), KV capacity,
//! speculative decoding, prompt and generation counters, and the prefix cache. Names: vLLM V1
//! (`vllm:cache_config_info`, `vllm:spec_decode_*`, `vllm:prefix_cache_{queries,hits}`,
//! `vllm:{prompt,generation}_tokens`), SGLang (`sglang:max_total_num_tokens`,
//! `sglang:spec_accept_length`, `sglang:spec_accept_rate`), llama.cpp (`llamacpp:prompt_tokens`,
//! `llamacpp:prompt_seconds`, `llamacpp:tokens_predicted`, `llamacpp:tokens_predicted_seconds`,
//! `llamacpp:prompt_tokens_cached` (prompt tokens reused from its prompt cache, a prefix-cache
//! counter), `llamacpp:spec_decode_num_{drafts,draft_tokens,accepted_tokens}`; no capacity).
//!
//! A family counts as "without samples" only when neither its values nor its `_created`
//! series have a sample: a `_created` gauge with samples is data.

use serde::{Deserialize, Serialize};

use super::prometheus::Exposition;
use super::spec::{k_from_counts, pool_sglang, SpecLogGeneration, SpecLogLine, SpecPooled};

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
    /// Prompt and generation counters.
    #[serde(default)]
    pub tokens: Option<TokenCounters>,
    /// Prefix-cache counters.
    #[serde(default)]
    pub prefix_cache: Option<PrefixCache>,
}

/// Prompt and generation counters since the engine started (or between two scrapes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenCounters {
    /// Prompt tokens processed (llama.cpp: excluding tokens reused from its cache).
    pub prompt_tokens: Option<f64>,
    /// Seconds spent on prompts, summed over slots (llama.cpp).
    pub prompt_seconds: Option<f64>,
    /// Generated tokens.
    pub generated_tokens: Option<f64>,
    /// Seconds spent generating, summed over slots (llama.cpp).
    pub generation_seconds: Option<f64>,
    /// The families read.
    pub source: String,
}

/// Prefix-cache counters: tokens found in the cache of the tokens looked up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefixCache {
    /// Tokens served from the cache.
    pub hits: f64,
    /// Tokens looked up (hits included).
    pub queries: f64,
    /// The families read and how `queries` was formed.
    pub source: String,
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
    let prefix = ["vllm:", "llamacpp:"]
        .into_iter()
        .find(|p| after.has_family(&format!("{p}spec_decode_num_drafts")));
    if let Some(prefix) = prefix {
        let drafts = d(&format!("{prefix}spec_decode_num_drafts"));
        let draft_tokens = d(&format!("{prefix}spec_decode_num_draft_tokens"));
        let accepted = d(&format!("{prefix}spec_decode_num_accepted_tokens"));
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
            // llama.cpp's n-gram drafts vary in length: their mean is not k.
            if let Some(k) = k_from_counts(dt, drafts).filter(|_| prefix == "vllm:") {
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
        // The gauge is SGLang's accept len (the bonus token counted); its accept rate is not
        // the acceptance rate (see `super::spec`): without k the rate stays unknown.
        let line = SpecLogLine {
            generation: SpecLogGeneration::Sglang,
            accepted: None,
            drafted: None,
            emitted: None,
            acceptance_rate: after.max("sglang:spec_accept_rate"),
            mean_acceptance_length: Some(len),
            per_position: Vec::new(),
            k: None,
            line: 0,
            drafts: None,
            method: None,
        };
        return Some((
            pool_sglang(&[&line], None),
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
        .filter(|k| {
            e.matching(k).next().is_none()
                && e.histogram(k).is_none()
                && !e.created.iter().any(|s| s.name == **k)
        })
        .cloned()
        .collect();
    f.tokens = token_counters(None, e);
    f.prefix_cache = prefix_cache(None, e);
    if let Some((s, why)) = spec(None, e) {
        f.spec = Some(s);
        f.spec_evidence = Some(why);
    }
    f
}

/// The value of `name` in `after`, less its value in `before` when given (`None` when absent or
/// when the counter went down: a restart).
fn delta(before: Option<&Exposition>, after: &Exposition, name: &str) -> Option<f64> {
    let a = after.sum(name)?;
    match before {
        Some(b) => {
            let b = b.sum(name).unwrap_or(0.0);
            (a >= b).then_some(a - b)
        }
        None => Some(a),
    }
}

/// Prompt and generation counters: llama.cpp `llamacpp:prompt_tokens`, `prompt_seconds`,
/// `tokens_predicted`, `tokens_predicted_seconds`; vLLM `vllm:prompt_tokens`,
/// `vllm:generation_tokens`.
pub fn token_counters(before: Option<&Exposition>, after: &Exposition) -> Option<TokenCounters> {
    if after.has_family("llamacpp:prompt_tokens") || after.has_family("llamacpp:tokens_predicted") {
        let t = TokenCounters {
            prompt_tokens: delta(before, after, "llamacpp:prompt_tokens"),
            prompt_seconds: delta(before, after, "llamacpp:prompt_seconds"),
            generated_tokens: delta(before, after, "llamacpp:tokens_predicted"),
            generation_seconds: delta(before, after, "llamacpp:tokens_predicted_seconds"),
            source: "llamacpp:prompt_tokens_total, prompt_seconds_total, tokens_predicted_total, tokens_predicted_seconds_total".into(),
        };
        return (t.prompt_tokens.is_some() || t.generated_tokens.is_some()).then_some(t);
    }
    if after.has_family("vllm:generation_tokens") || after.has_family("vllm:prompt_tokens") {
        let t = TokenCounters {
            prompt_tokens: delta(before, after, "vllm:prompt_tokens"),
            generated_tokens: delta(before, after, "vllm:generation_tokens"),
            source: "vllm:prompt_tokens_total, vllm:generation_tokens_total".into(),
            ..Default::default()
        };
        return (t.prompt_tokens.is_some() || t.generated_tokens.is_some()).then_some(t);
    }
    None
}

/// Prefix-cache counters: vLLM `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` (tokens);
/// llama.cpp `llamacpp:prompt_tokens_cached` of (cached + `llamacpp:prompt_tokens`, which
/// excludes cached tokens).
pub fn prefix_cache(before: Option<&Exposition>, after: &Exposition) -> Option<PrefixCache> {
    if let (Some(h), Some(q)) = (
        delta(before, after, "vllm:prefix_cache_hits"),
        delta(before, after, "vllm:prefix_cache_queries"),
    ) {
        return Some(PrefixCache {
            hits: h,
            queries: q,
            source: "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total".into(),
        });
    }
    if let (Some(c), Some(p)) = (
        delta(before, after, "llamacpp:prompt_tokens_cached"),
        delta(before, after, "llamacpp:prompt_tokens"),
    ) {
        return Some(PrefixCache {
            hits: c,
            queries: c + p,
            source: "llamacpp:prompt_tokens_cached_total / (prompt_tokens_cached_total + prompt_tokens_total, which excludes cached tokens)".into(),
        });
    }
    None
}
