//! Speculative decoding: the engines' log lines, `/metrics` counters and vLLM's per-request
//! object in the last SSE chunk, pooled into one acceptance figure with its k.
//!
//! Definitions (vLLM's, see docs/architecture.md, "Terms"): acceptance rate = accepted / drafted
//! tokens; mean acceptance length = 1 + accepted / drafts (a draft is one speculation step of k
//! tokens, so drafts = drafted / k); per-position acceptance = accepted at position i / drafts.
//!
//! vLLM's log line came in four generations ([`SpecLogGeneration`]); V0 lines carry cumulative
//! counts, later ones per-interval counts. [`pool_spec`] pools them the way Prometheus'
//! `increase()` would: interval counts are summed, cumulative counts contribute the last value of
//! each run of non-decreasing values (a drop marks an engine restart). The pooled acceptance rate
//! is Σaccepted / Σdrafted, never a mean of per-interval rates.
//!
//! SGLang prints per-interval ratios only (`accept len: 2.50[, accept rate: 0.38]` on its
//! `Decode batch.` lines, `scheduler_metrics_mixin.py` `log_decode_stats`): without counts they
//! are averaged per interval and marked so. Its `accept len` is (accepted drafts + one bonus
//! token per verify step) / verify steps, the same quantity as vLLM's mean acceptance length,
//! so 1.00 means no draft token was accepted. Its `accept rate` is accept len / draft tokens
//! per step (`speculative_num_draft_tokens`, the bonus position included), which is not vLLM's
//! acceptance rate (accepted / drafted): rigbench converts, (accept len − 1) / k with k the
//! draft tokens per step from the configuration, and labels SGLang's own figure with its
//! meaning. llama.cpp's `llama-server` prints per request `draft acceptance rate = 0.57143
//! (   12 accepted /    21 generated)`, newer builds `draft acceptance = 0.16667 ( 2 accepted
//! / 12 generated), mean len = 3.00` (mean len = 1 + accepted / verify steps), and per
//! implementation cumulative `statistics ngram_simple: #calls = …, #gen drafts = D, #acc drafts
//! = …, #gen tokens = G, #acc tokens = A` lines (`common/speculative.cpp`): per-request counts
//! are summed; the cumulative lines count only when no per-request line exists, the last of
//! each run per implementation. Builds with MTP drafting (`--spec-type draft-mtp`, 2026) add
//! per request `mean acceptance length = 3.65, acceptance rate per position = (0.809, 0.723,
//! 0.596, 0.525)` and to the statistics line `#mean acc len = 3.65, #acc rate/pos = (…)`: k is
//! the number of positions, the per-position rates are accepted at position i / drafts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The generation (engine and format) of a speculative-decoding log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecLogGeneration {
    /// vLLM V0 `Speculative metrics: ... System efficiency ... Number of emitted tokens`:
    /// cumulative counts since start.
    V0Cumulative,
    /// Early vLLM V1 `Speculative metrics: Draft acceptance rate, Number of accepted tokens,
    /// Number of draft tokens` (per interval).
    V1EarlySpeculative,
    /// Early vLLM V1 `SpecDecoding metrics: Draft acceptance rate: X%, Accepted: N tokens,
    /// Drafted: N tokens` (per interval, no mean acceptance length).
    V1Early,
    /// vLLM V1 `SpecDecoding metrics:` with mean acceptance length and per-position rates
    /// (per interval).
    V1,
    /// SGLang `Decode batch. ... accept len: X[, accept rate: Y]` (per interval, ratios only).
    Sglang,
    /// llama.cpp `draft acceptance rate = R (A accepted / D generated)` or `draft acceptance =
    /// R (A accepted / D generated), mean len = M` (per request).
    Llamacpp,
    /// llama.cpp `statistics NAME: … #gen drafts = D, … #gen tokens = G, #acc tokens = A`
    /// (cumulative per speculative implementation).
    LlamacppStatistics,
}

impl SpecLogGeneration {
    /// Whether counts are cumulative since engine start (else per interval or per request).
    pub fn cumulative(self) -> bool {
        matches!(
            self,
            SpecLogGeneration::V0Cumulative | SpecLogGeneration::LlamacppStatistics
        )
    }

    /// Whether the form is vLLM's.
    pub fn is_vllm(self) -> bool {
        !matches!(
            self,
            SpecLogGeneration::Sglang
                | SpecLogGeneration::Llamacpp
                | SpecLogGeneration::LlamacppStatistics
        )
    }
}

/// One speculative-decoding log line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecLogLine {
    /// Its format generation.
    pub generation: SpecLogGeneration,
    /// Accepted draft tokens.
    pub accepted: Option<u64>,
    /// Drafted tokens.
    pub drafted: Option<u64>,
    /// Emitted tokens (vLLM V0).
    pub emitted: Option<u64>,
    /// The acceptance rate as printed (fraction, 0..1, percent signs converted).
    pub acceptance_rate: Option<f64>,
    /// Mean acceptance length as printed (1 + accepted / drafts; SGLang's `accept len`).
    pub mean_acceptance_length: Option<f64>,
    /// Per-position acceptance rates as printed.
    pub per_position: Vec<f64>,
    /// Draft tokens per step: `Number of speculative tokens` or the per-position count.
    pub k: Option<u32>,
    /// 1-based line number in its file.
    pub line: usize,
    /// Verify steps (drafts), when the line states them (llama.cpp `#gen drafts`).
    #[serde(default)]
    pub drafts: Option<u64>,
    /// The speculative implementation the line reports (llama.cpp `statistics ngram_simple`).
    #[serde(default)]
    pub method: Option<String>,
}

/// Speculative decoding pooled over lines (or scrapes, or requests).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpecPooled {
    /// Σ accepted tokens (0 when the source prints no counts; see `counts`).
    pub accepted: u64,
    /// Σ drafted tokens.
    pub drafted: u64,
    /// Σ drafts (verify steps), when known.
    pub drafts: Option<u64>,
    /// Whether the source printed counts (SGLang prints ratios only).
    pub counts: bool,
    /// Σaccepted / Σdrafted (or the mean of printed rates when there are no counts).
    pub acceptance_rate: Option<f64>,
    /// 1 + Σaccepted / Σdrafts, where drafts = drafted / k per line (lines with k known).
    pub mean_acceptance_length: Option<f64>,
    /// Per-position acceptance pooled over lines that print it, weighted by their drafts.
    pub per_position: Vec<f64>,
    /// k when every line that states it agrees.
    pub k: Option<u32>,
    /// Where k came from.
    pub k_source: Option<String>,
    /// Lines (or requests) pooled.
    pub samples: usize,
    /// How `acceptance_rate` was obtained, when not Σaccepted / Σdrafted (SGLang: from its
    /// accept len and k).
    pub acceptance_rule: Option<String>,
    /// A rate the engine printed under another definition, with that definition (SGLang's
    /// `accept rate`), shown beside rigbench's acceptance rate, never instead of it.
    pub engine_rate: Option<(f64, String)>,
}

struct Pats {
    per_position: Regex,
    sglang: Regex,
    sglang_rate: Regex,
    llamacpp: Regex,
    llama_stats: Regex,
    llama_stats_pos: Regex,
}

fn pats() -> &'static Pats {
    static P: OnceLock<Pats> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("static regex");
        Pats {
            per_position: r(
                r"Per-position acceptance rate:\s*(?P<l>[\d.]+(?:\s*,\s*[\d.]+)*)",
            ),
            sglang: r(r"Decode batch\..*?\baccept len: (?P<len>[\d.]+)"),
            sglang_rate: r(r"\baccept rate: (?P<r>[\d.]+)"),
            llamacpp: r(
                r"draft acceptance(?: rate)? = (?P<r>[\d.]+) \(\s*(?P<a>\d+) accepted /\s*(?P<d>\d+) generated\)(?:, mean (?:len|acceptance length) =\s*(?P<m>[\d.]+))?(?:, acceptance rate per position = \((?P<pp>[\d.,\s]*)\))?",
            ),
            llama_stats: r(
                r"statistics\s+(?P<n>[\w.\-]+):.*?#gen drafts\s*=\s*(?P<gd>\d+).*?#gen tokens\s*=\s*(?P<gt>\d+).*?#acc tokens\s*=\s*(?P<at>\d+)",
            ),
            llama_stats_pos: r(r"#acc rate/pos\s*=\s*\((?P<pp>[\d.,\s]*)\)"),
        }
    })
}

fn num(s: &str) -> Option<u64> {
    s.trim().replace(',', "").parse().ok()
}

fn fnum(s: &str) -> Option<f64> {
    s.trim()
        .trim_end_matches(',')
        .replace(',', "")
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
}

/// A rate as printed: `88.8%` → 0.888, `0.642` → 0.642.
fn rate(v: &str) -> Option<f64> {
    let v = v.trim();
    match v.strip_suffix('%') {
        Some(p) => fnum(p).map(|x| x / 100.0),
        None => fnum(v),
    }
}

/// The leading integer of `464 tokens`.
fn count(v: &str) -> Option<u64> {
    v.split_whitespace().next().and_then(num)
}

/// llama.cpp's per-position list `0.809, 0.723, 0.596` (rates in 0..1); empty when absent.
fn positions(list: Option<&str>) -> Vec<f64> {
    list.map(|l| l.split(',').filter_map(fnum).collect())
        .unwrap_or_default()
}

/// k from a per-position list: one rate per draft position.
fn k_of(per_position: &[f64]) -> Option<u32> {
    (!per_position.is_empty()).then(|| u32::try_from(per_position.len()).unwrap_or(u32::MAX))
}

/// Parse one message as a speculative-decoding line of any engine; `None` otherwise.
pub fn parse_spec_line(line_no: usize, msg: &str) -> Option<SpecLogLine> {
    let p = pats();
    if let Some(c) = p.llamacpp.captures(msg) {
        let a = num(&c["a"]);
        let d = num(&c["d"]);
        let m = c.name("m").and_then(|m| fnum(m.as_str()));
        let per_position = positions(c.name("pp").map(|x| x.as_str()));
        // mean len = 1 + accepted / verify steps: the steps follow when anything was accepted.
        let drafts = match (a, m) {
            (Some(a), Some(m)) if a > 0 && m > 1.0 => Some((a as f64 / (m - 1.0)).round() as u64),
            _ => None,
        };
        return Some(SpecLogLine {
            generation: SpecLogGeneration::Llamacpp,
            accepted: a,
            drafted: d,
            emitted: None,
            acceptance_rate: fnum(&c["r"]),
            mean_acceptance_length: m,
            k: k_of(&per_position),
            per_position,
            line: line_no,
            drafts,
            method: None,
        });
    }
    if let Some(c) = p.llama_stats.captures(msg) {
        let a = num(&c["at"]);
        let d = num(&c["gt"]);
        let drafts = num(&c["gd"]);
        let per_position = positions(
            p.llama_stats_pos
                .captures(msg)
                .and_then(|x| x.name("pp"))
                .map(|x| x.as_str()),
        );
        return Some(SpecLogLine {
            generation: SpecLogGeneration::LlamacppStatistics,
            accepted: a,
            drafted: d,
            emitted: None,
            acceptance_rate: match (a, d) {
                (Some(a), Some(d)) if d > 0 => Some(a as f64 / d as f64),
                _ => None,
            },
            mean_acceptance_length: match (a, drafts) {
                (Some(a), Some(n)) if n > 0 => Some(1.0 + a as f64 / n as f64),
                _ => None,
            },
            k: k_of(&per_position),
            per_position,
            line: line_no,
            drafts,
            method: Some(c["n"].replace('_', "-")),
        });
    }
    if let Some(c) = p.sglang.captures(msg) {
        return Some(SpecLogLine {
            generation: SpecLogGeneration::Sglang,
            accepted: None,
            drafted: None,
            emitted: None,
            acceptance_rate: p.sglang_rate.captures(msg).and_then(|r| fnum(&r["r"])),
            mean_acceptance_length: fnum(&c["len"]),
            per_position: Vec::new(),
            k: None,
            line: line_no,
            drafts: None,
            method: None,
        });
    }
    let (body, v1) = if let Some(i) = msg.find("SpecDecoding metrics:") {
        (&msg[i + "SpecDecoding metrics:".len()..], true)
    } else if let Some(i) = msg.find("Speculative metrics:") {
        (&msg[i + "Speculative metrics:".len()..], false)
    } else {
        return None;
    };
    let mut per_position = Vec::new();
    let mut body = body.to_string();
    if let Some(c) = p.per_position.captures(&body.clone()) {
        per_position = c["l"].split(',').filter_map(fnum).collect();
        body = body.replace(c.get(0).map_or("", |m| m.as_str()), "");
    }
    let mut kv: BTreeMap<String, String> = BTreeMap::new();
    for part in body.split(", ") {
        if let Some((k, v)) = part.split_once(':') {
            kv.insert(
                k.trim().to_ascii_lowercase(),
                v.trim().trim_end_matches(['.', ',']).to_string(),
            );
        }
    }
    let get = |keys: &[&str]| keys.iter().find_map(|k| kv.get(*k).cloned());
    let accepted = get(&["number of accepted tokens", "accepted"]).and_then(|v| count(&v));
    let drafted = get(&["number of draft tokens", "drafted"]).and_then(|v| count(&v));
    let emitted = get(&["number of emitted tokens"]).and_then(|v| count(&v));
    let acceptance_rate =
        get(&["draft acceptance rate", "avg draft acceptance rate"]).and_then(|v| rate(&v));
    let mean_acceptance_length = get(&["mean acceptance length"]).and_then(|v| fnum(&v));
    let stated_k = get(&["number of speculative tokens"]).and_then(|v| count(&v));
    let k = stated_k
        .and_then(|k| u32::try_from(k).ok())
        .or_else(|| (!per_position.is_empty()).then_some(per_position.len() as u32));
    let generation = if !v1 {
        if kv.contains_key("system efficiency") || emitted.is_some() {
            SpecLogGeneration::V0Cumulative
        } else {
            SpecLogGeneration::V1EarlySpeculative
        }
    } else if mean_acceptance_length.is_some() || !per_position.is_empty() {
        SpecLogGeneration::V1
    } else {
        SpecLogGeneration::V1Early
    };
    if accepted.is_none() && drafted.is_none() && acceptance_rate.is_none() {
        return None;
    }
    Some(SpecLogLine {
        generation,
        accepted,
        drafted,
        emitted,
        acceptance_rate,
        mean_acceptance_length,
        per_position,
        k,
        line: line_no,
        drafts: None,
        method: None,
    })
}

/// SGLang's interval lines pooled: the mean accept len (= mean acceptance length), the
/// acceptance rate converted from it when k is known, SGLang's own `accept rate` labelled.
/// `config_k` is the draft tokens per step (`speculative_num_steps`).
pub fn pool_sglang(lines: &[&SpecLogLine], config_k: Option<u32>) -> SpecPooled {
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let mal = mean(
        lines
            .iter()
            .filter_map(|l| l.mean_acceptance_length)
            .collect(),
    );
    let printed = mean(lines.iter().filter_map(|l| l.acceptance_rate).collect());
    let k = config_k.filter(|k| *k > 0);
    let acceptance_rate = match (mal, k) {
        (Some(m), Some(k)) => Some(((m - 1.0) / f64::from(k)).clamp(0.0, 1.0)),
        _ => None,
    };
    SpecPooled {
        counts: false,
        acceptance_rate,
        acceptance_rule: acceptance_rate.map(|_| {
            format!(
                "(mean accept len − 1) / k, k = {} from the configuration: SGLang's accept len counts the bonus token of every verify step",
                k.unwrap_or(0)
            )
        }),
        engine_rate: printed.map(|r| {
            (
                r,
                "SGLang's accept rate = accept len / draft tokens per step, the bonus token included; not the acceptance rate (accepted / drafted)".to_string(),
            )
        }),
        mean_acceptance_length: mal,
        k,
        k_source: k.map(|_| "engine configuration in the log".to_string()),
        samples: lines.len(),
        ..Default::default()
    }
}

/// Pool speculative-decoding lines (see the module docs for the rule). `config_k` is k from the
/// engine's configuration, used for lines that do not state it.
pub fn pool_spec(lines: &[SpecLogLine], config_k: Option<u32>) -> Option<SpecPooled> {
    if lines.is_empty() {
        return None;
    }
    let per_request_llama = lines
        .iter()
        .any(|l| l.generation == SpecLogGeneration::Llamacpp);
    let counted: Vec<&SpecLogLine> = lines
        .iter()
        .filter(|l| l.generation != SpecLogGeneration::Sglang)
        .filter(|l| !(per_request_llama && l.generation == SpecLogGeneration::LlamacppStatistics))
        .collect();
    if counted.is_empty() {
        let sglang: Vec<&SpecLogLine> = lines.iter().collect();
        return Some(pool_sglang(&sglang, config_k));
    }
    // Per-line contributions (interval deltas): cumulative lines contribute only the last line
    // of each non-decreasing run, per implementation.
    let mut contrib: Vec<&SpecLogLine> = Vec::new();
    let methods: BTreeSet<Option<&str>> = counted
        .iter()
        .filter(|l| l.generation.cumulative())
        .map(|l| l.method.as_deref())
        .collect();
    for m in methods {
        let cumulative: Vec<&SpecLogLine> = counted
            .iter()
            .copied()
            .filter(|l| l.generation.cumulative() && l.method.as_deref() == m)
            .collect();
        for (i, l) in cumulative.iter().enumerate() {
            let next_resets = match cumulative.get(i + 1) {
                None => true,
                Some(n) => {
                    n.drafted.unwrap_or(0) < l.drafted.unwrap_or(0)
                        || n.accepted.unwrap_or(0) < l.accepted.unwrap_or(0)
                }
            };
            if next_resets {
                contrib.push(l);
            }
        }
    }
    contrib.extend(
        counted
            .iter()
            .copied()
            .filter(|l| !l.generation.cumulative()),
    );

    let mut accepted = 0u64;
    let mut drafted = 0u64;
    let mut acc_k = 0.0;
    let mut drafts_k = 0.0;
    let mut all_have_k = true;
    let mut pos_sum: Vec<f64> = Vec::new();
    let mut pos_weight = 0.0;
    let mut ks = BTreeSet::new();
    let mut any_counts = false;
    for l in &contrib {
        let (Some(a), Some(d)) = (l.accepted, l.drafted) else {
            continue;
        };
        any_counts = true;
        accepted = accepted.saturating_add(a);
        drafted = drafted.saturating_add(d);
        let drafts = match (l.drafts, l.k.or(config_k).filter(|k| *k > 0)) {
            (Some(n), _) => Some(n as f64),
            (None, Some(k)) => Some(d as f64 / f64::from(k)),
            (None, None) => None,
        };
        match drafts {
            Some(drafts) => {
                acc_k += a as f64;
                drafts_k += drafts;
                if !l.per_position.is_empty() {
                    if pos_sum.len() < l.per_position.len() {
                        pos_sum.resize(l.per_position.len(), 0.0);
                    }
                    for (i, r) in l.per_position.iter().enumerate() {
                        pos_sum[i] += r * drafts;
                    }
                    pos_weight += drafts;
                }
            }
            None => all_have_k = false,
        }
    }
    let mut k_source = None;
    for l in lines.iter() {
        if let Some(k) = l.k {
            ks.insert(k);
            k_source.get_or_insert_with(|| {
                if l.per_position.is_empty() {
                    format!("log line {} (Number of speculative tokens)", l.line)
                } else {
                    format!("log line {} (per-position list)", l.line)
                }
            });
        }
    }
    if ks.is_empty() {
        if let Some(k) = config_k {
            ks.insert(k);
            k_source = Some("engine configuration in the log".into());
        }
    }
    let k = if ks.len() == 1 {
        ks.into_iter().next()
    } else {
        k_source = None;
        None
    };
    let drafts = (all_have_k && drafts_k > 0.0).then(|| drafts_k.round() as u64);
    Some(SpecPooled {
        accepted,
        drafted,
        drafts,
        counts: any_counts,
        acceptance_rate: if any_counts {
            (drafted > 0).then(|| accepted as f64 / drafted as f64)
        } else {
            lines.iter().rev().find_map(|l| l.acceptance_rate)
        },
        mean_acceptance_length: (all_have_k && drafts_k > 0.0).then(|| 1.0 + acc_k / drafts_k),
        per_position: if pos_weight > 0.0 {
            pos_sum.iter().map(|s| s / pos_weight).collect()
        } else {
            Vec::new()
        },
        k,
        k_source,
        samples: lines.len(),
        ..Default::default()
    })
}

/// vLLM's per-request speculative-decoding object (`metrics.speculative_decoding` in the last
/// chunk of a stream, newer vLLM).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// `num_spec_steps`: verify steps (drafts).
    pub drafts: Option<u64>,
    /// `num_draft_tokens`.
    pub drafted: Option<u64>,
    /// `num_accepted_draft_tokens`.
    pub accepted: Option<u64>,
    /// `num_spec_tokens`: k.
    pub k: Option<u32>,
    /// `acceptance_histogram[j]`: steps that accepted j draft tokens.
    pub histogram: Vec<u64>,
    /// `draft_acceptance_rate` as sent.
    pub acceptance_rate: Option<f64>,
    /// `mean_acceptance_length` as sent.
    pub mean_acceptance_length: Option<f64>,
}

impl RequestSpec {
    /// Read the object from one parsed chunk; `None` when the chunk has none. Also reads
    /// llama.cpp's `timings.draft_n` / `timings.draft_n_accepted` (drafted and accepted tokens).
    pub fn from_chunk(chunk: &Value) -> Option<Self> {
        if let Some(t) = chunk.get("timings").filter(|t| t.get("draft_n").is_some()) {
            return Some(RequestSpec {
                drafted: t.get("draft_n").and_then(Value::as_u64),
                accepted: t.get("draft_n_accepted").and_then(Value::as_u64),
                ..Default::default()
            });
        }
        let s = chunk
            .pointer("/metrics/speculative_decoding")
            .filter(|s| s.is_object())?;
        let u = |k: &str| s.get(k).and_then(Value::as_u64);
        let f = |k: &str| s.get(k).and_then(Value::as_f64).filter(|x| x.is_finite());
        Some(RequestSpec {
            drafts: u("num_spec_steps").or_else(|| u("num_drafts")),
            drafted: u("num_draft_tokens"),
            accepted: u("num_accepted_draft_tokens").or_else(|| u("num_accepted_tokens")),
            k: u("num_spec_tokens").and_then(|k| u32::try_from(k).ok()),
            histogram: s
                .get("acceptance_histogram")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
            acceptance_rate: f("draft_acceptance_rate"),
            mean_acceptance_length: f("mean_acceptance_length"),
        })
    }

    /// Tokens the histogram accounts for: 1 + Σ (j + 1) · h_j (the token of the prefill step,
    /// then per verify step its accepted drafts plus one token of its own). Equals the request's
    /// completion tokens.
    pub fn histogram_tokens(&self) -> Option<u64> {
        (!self.histogram.is_empty()).then(|| {
            1 + self
                .histogram
                .iter()
                .enumerate()
                .map(|(j, h)| (j as u64 + 1).saturating_mul(*h))
                .fold(0u64, u64::saturating_add)
        })
    }
}

/// Pool per-request objects: Σaccepted / Σdrafted, 1 + Σaccepted / Σdrafts.
pub fn pool_requests(reqs: &[RequestSpec]) -> Option<SpecPooled> {
    if reqs.is_empty() {
        return None;
    }
    let mut p = SpecPooled {
        counts: true,
        samples: reqs.len(),
        ..Default::default()
    };
    let mut drafts = 0u64;
    let mut all_drafts = true;
    let mut ks = BTreeSet::new();
    for r in reqs {
        p.accepted = p.accepted.saturating_add(r.accepted.unwrap_or(0));
        p.drafted = p.drafted.saturating_add(r.drafted.unwrap_or(0));
        match r.drafts {
            Some(d) => drafts = drafts.saturating_add(d),
            None => all_drafts = false,
        }
        if let Some(k) = r.k {
            ks.insert(k);
        }
    }
    if ks.len() == 1 {
        p.k = ks.into_iter().next();
        p.k_source = Some("num_spec_tokens in the last SSE chunk".into());
    } else if all_drafts && drafts > 0 && p.drafted % drafts == 0 {
        p.k = u32::try_from(p.drafted / drafts).ok();
        p.k_source = Some("num_draft_tokens / num_spec_steps in the last SSE chunk".into());
    }
    p.acceptance_rate = (p.drafted > 0).then(|| p.accepted as f64 / p.drafted as f64);
    if all_drafts && drafts > 0 {
        p.drafts = Some(drafts);
        p.mean_acceptance_length = Some(1.0 + p.accepted as f64 / drafts as f64);
    }
    Some(p)
}

/// k from `/metrics` counters: draft tokens / drafts, when that is a whole number.
pub fn k_from_counts(draft_tokens: f64, drafts: f64) -> Option<u32> {
    if drafts <= 0.0 || !draft_tokens.is_finite() || !drafts.is_finite() {
        return None;
    }
    let k = draft_tokens / drafts;
    let r = k.round();
    ((k - r).abs() < 1e-6 && (1.0..1e6).contains(&r)).then_some(r as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_lines() {
        let l = parse_spec_line(
            5,
            "draft acceptance rate = 0.57143 (   12 accepted /    21 generated)",
        )
        .unwrap();
        assert_eq!(
            (l.generation, l.accepted, l.drafted),
            (SpecLogGeneration::Llamacpp, Some(12), Some(21))
        );
        let l = parse_spec_line(
            6,
            "Decode batch. #running-req: 1, #token: 100, token usage: 0.00, accept len: 2.50, accept rate: 0.38, cuda graph: True, gen throughput (token/s): 50.0, #queue-req: 0",
        )
        .unwrap();
        assert_eq!(
            (l.generation, l.mean_acceptance_length, l.acceptance_rate),
            (SpecLogGeneration::Sglang, Some(2.5), Some(0.38))
        );
        assert!(parse_spec_line(
            1,
            "Decode batch. #running-req: 1, gen throughput (token/s): 5"
        )
        .is_none());
        assert!(parse_spec_line(1, "SpecDecoding metrics:").is_none());
        let p = pool_spec(
            &[
                parse_spec_line(1, "Decode batch. accept len: 2.00, accept rate: 0.25").unwrap(),
                parse_spec_line(2, "Decode batch. accept len: 3.00, accept rate: 0.50").unwrap(),
            ],
            Some(4),
        )
        .unwrap();
        assert!(!p.counts);
        assert_eq!(
            (p.mean_acceptance_length, p.acceptance_rate, p.k),
            (Some(2.5), Some(0.375), Some(4))
        );
    }

    #[test]
    fn request_objects_and_k_from_counts() {
        let v: Value = serde_json::from_str(r#"{"metrics":{"speculative_decoding":{"mean_acceptance_length":1.2325581395348837,"draft_acceptance_rate":0.07751937984496124,"acceptance_histogram":[39,1,0,3],"num_spec_steps":43,"num_accepted_draft_tokens":10,"num_draft_tokens":129,"num_spec_tokens":3}}}"#).unwrap();
        let r = RequestSpec::from_chunk(&v).unwrap();
        assert_eq!(r.histogram_tokens(), Some(1 + 39 + 2 + 12));
        let p = pool_requests(&[r.clone(), r]).unwrap();
        assert_eq!(
            (p.accepted, p.drafted, p.drafts, p.k),
            (20, 258, Some(86), Some(3))
        );
        assert!(RequestSpec::from_chunk(&serde_json::json!({"choices": []})).is_none());
        assert_eq!(k_from_counts(90.0, 30.0), Some(3));
        assert_eq!(k_from_counts(91.0, 30.0), None);
        assert_eq!(k_from_counts(1.0, 0.0), None);
    }
}
