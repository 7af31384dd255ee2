//! The validity guard: a run whose output is empty, degenerate (repetition), much shorter than
//! requested, whose requests failed, or whose conditions are incomplete or contradicted is marked
//! invalid, and its throughput is not presented as a result.
//!
//! Rules (each reason is written into the report):
//! - the run was interrupted, or the engine failed during it;
//! - no request completed, or any request failed;
//! - any completed request produced no text;
//! - more than 10% of completed requests are degenerate: the last ≤ 512 characters repeat a
//!   pattern of period p at least 4 times with ≤ 2% mismatches, or fewer than 25% of the word
//!   trigrams are distinct (over ≥ 40 words);
//! - with a fixed output length (`ignore_eos`), any request produced less than half the
//!   requested tokens;
//! - reasoning output came back with thinking off;
//! - the cache temperature is contradicted by the hit counters, or cannot be verified;
//!
//! A condition the engine does not expose (engine name or version, model, speculative state or
//! method, KV capacity, cache temperature, output token counts) is listed as unknown in
//! [`Validity::missing_conditions`] and shown with the run; it does not invalidate the run: only
//! what the run shows does. Flags can state such conditions (`--engine-version`,
//! `--kv-capacity`, `--spec`), and the report marks them "stated by the user".

use serde::{Deserialize, Serialize};

use super::conditions::{Conditions, SpecState};
use super::executor::ExecStop;
use super::metrics::{RequestRecord, TokenSource};

/// The verdict on one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Validity {
    /// Whether the run's throughput may be presented as a result.
    pub valid: bool,
    /// Why not (empty when valid).
    pub reasons: Vec<String>,
    /// Conditions that are unknown (shown with the run; they do not invalidate it).
    pub missing_conditions: Vec<String>,
    /// Observations that do not invalidate the run.
    pub notes: Vec<String>,
}

/// Share of completed requests that may be degenerate before the run is invalid.
pub const DEGENERATE_TOLERANCE: f64 = 0.10;

/// Why `text` looks degenerate, or `None`.
pub fn degenerate(text: &str) -> Option<String> {
    let chars: Vec<char> = text.trim().chars().collect();
    let n = chars.len();
    if n >= 32 {
        let w = n.min(512);
        let tail = &chars[n - w..];
        for p in 1..=w / 4 {
            let mismatches = (p..w).filter(|&i| tail[i] != tail[i - p]).count();
            if mismatches * 50 <= w {
                return Some(format!(
                    "repeats a {p}-character pattern over its last {w} characters"
                ));
            }
        }
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() >= 40 {
        let tri: Vec<(&str, &str, &str)> = words.windows(3).map(|x| (x[0], x[1], x[2])).collect();
        let mut d = tri.clone();
        d.sort_unstable();
        d.dedup();
        let ratio = d.len() as f64 / tri.len() as f64;
        if ratio < 0.25 {
            return Some(format!(
                "only {:.0}% of its word trigrams are distinct",
                ratio * 100.0
            ));
        }
    }
    None
}

/// Flags for one completed request: `empty`, `degenerate: ...`, `short: ...`.
pub fn output_flags(
    r: &RequestRecord,
    text: &str,
    output_fixed: bool,
    judge_repetition: bool,
) -> Vec<String> {
    let mut f = Vec::new();
    if !r.ok {
        return f;
    }
    if r.content_chars + r.reasoning_chars == 0 || r.output_tokens == Some(0) {
        f.push("empty".to_string());
        return f;
    }
    if judge_repetition {
        if let Some(why) = degenerate(text) {
            f.push(format!("degenerate: {why}"));
        }
    }
    if output_fixed {
        if let Some(n) = r.output_tokens {
            if n * 2 < u64::from(r.output_tokens_requested) {
                f.push(format!(
                    "short: {n} of {} tokens",
                    r.output_tokens_requested
                ));
            }
        }
    }
    f
}

/// Judge a run.
pub fn assess(records: &[RequestRecord], c: &Conditions, stop: &ExecStop) -> Validity {
    let mut v = Validity::default();
    match stop {
        ExecStop::Interrupted => v.reasons.push(format!(
            "interrupted (Ctrl-C): {} requests in flight were cancelled",
            records.iter().filter(|r| r.cancelled).count()
        )),
        ExecStop::EngineFailed(m) => v.reasons.push(format!("engine failed during the run: {m}")),
        ExecStop::DurationLimit => v.notes.push(
            "the duration limit stopped new requests before all prepared ones were sent".into(),
        ),
        ExecStop::Completed => {}
    }
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let failed: Vec<&RequestRecord> = records.iter().filter(|r| !r.ok && !r.cancelled).collect();
    if ok.is_empty() {
        v.reasons.push("no request completed".into());
    }
    if let Some(first) = failed.first() {
        v.reasons.push(format!(
            "{} of {} requests failed (first: {})",
            failed.len(),
            records.len(),
            first.error.as_deref().unwrap_or("unknown error")
        ));
    }
    let count = |p: &str| {
        ok.iter()
            .filter(|r| r.flags.iter().any(|f| f.starts_with(p)))
            .count()
    };
    let empty = count("empty");
    if empty > 0 {
        v.reasons.push(format!(
            "{empty} of {} completed requests returned empty output",
            ok.len()
        ));
    }
    let degen = count("degenerate");
    if degen > 0 {
        let example = ok
            .iter()
            .flat_map(|r| r.flags.iter())
            .find(|f| f.starts_with("degenerate"))
            .cloned()
            .unwrap_or_default();
        let msg = format!("{degen} of {} outputs degenerate ({example})", ok.len());
        if degen as f64 > DEGENERATE_TOLERANCE * ok.len() as f64 {
            v.reasons.push(msg);
        } else {
            v.notes.push(msg);
        }
    }
    let short = count("short");
    if short > 0 {
        v.reasons.push(format!(
            "{short} of {} outputs much shorter than the fixed length requested ({} tokens)",
            ok.len(),
            c.lengths.output_requested
        ));
    }
    if let Some(flag) = &c.thinking.flag {
        if flag.starts_with("reasoning output with thinking off") || flag.starts_with("<think>") {
            v.reasons.push(flag.clone());
        } else {
            v.notes.push(flag.clone());
        }
    }
    match c.cache.verified {
        Some(true) => {}
        Some(false) => v
            .reasons
            .push(format!("cache temperature contradicted: {}", c.cache.note)),
        None => v
            .missing_conditions
            .push(format!("cache temperature ({})", c.cache.note)),
    }
    if c.engine.is_none() {
        v.missing_conditions.push("engine name".into());
    }
    if c.engine_version.is_none() {
        v.missing_conditions.push("engine version".into());
    }
    if c.model.is_none() {
        v.missing_conditions.push("model id".into());
    }
    match c.spec.state {
        SpecState::Unknown => v
            .missing_conditions
            .push(format!("speculative decoding ({})", c.spec.evidence)),
        SpecState::On if c.spec.method.is_none() => v
            .missing_conditions
            .push("speculative method (state it with --spec-method, or give --engine-log)".into()),
        _ => {}
    }
    if c.kv.capacity_tokens.is_none() {
        v.missing_conditions.push(
            "KV capacity (no cache_config_info on /metrics and none in the engine log)".into(),
        );
    }
    if !ok.is_empty() && c.token_sources.contains(&TokenSource::Chunks) {
        v.missing_conditions.push(
            "output token counts (no usage from the engine and no tokenizer: chunk counts are approximate)".into(),
        );
    }
    if c.lengths.input_exact == Some(false) {
        v.notes.push("some prompts are not token-exact (the tokenizer could not cut them to the exact length); actual counts are recorded".into());
    }
    if c.lengths.output_fixed {
        if let (Some(lo), Some(hi)) = (c.lengths.output_min, c.lengths.output_max) {
            if (lo, hi)
                != (
                    u64::from(c.lengths.output_requested),
                    u64::from(c.lengths.output_requested),
                )
            {
                v.notes.push(format!(
                    "output length not exact: {lo}..{hi} tokens for {} requested",
                    c.lengths.output_requested
                ));
            }
        }
    }
    v.valid = v.reasons.is_empty();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_detector() {
        assert!(degenerate("the the the the the the the the the the the the the").is_some());
        assert!(degenerate(&"abc".repeat(40)).is_some());
        assert!(degenerate(&format!(
            "A fine start to the story. {}",
            "Go on. ".repeat(30)
        ))
        .is_some());
        let prose = "The harbor town woke each morning to the sound of gulls arguing over the fish market \
                     roofs. Before the sun cleared the breakwater, the net menders were already at their \
                     benches, and the smell of tar and coffee drifted up the narrow streets toward the \
                     square where the old clock had stopped at a quarter past nine.";
        assert_eq!(degenerate(prose), None);
        let code = "fn main() {\n    let v = vec![1, 2, 3];\n    for x in &v {\n        println!(\"{x}\");\n    }\n}\n";
        assert_eq!(degenerate(code), None);
        assert_eq!(degenerate("short"), None);
        // Varying tokens in a loop of word trigrams.
        let loopy = "alpha beta gamma delta ".repeat(20);
        assert!(degenerate(&loopy).is_some());
    }

    #[test]
    fn flags() {
        let r = RequestRecord {
            ok: true,
            content_chars: 10,
            output_tokens: Some(3),
            output_tokens_requested: 32,
            ..Default::default()
        };
        assert_eq!(
            output_flags(&r, "0123456789", true, true),
            vec!["short: 3 of 32 tokens"]
        );
        assert!(output_flags(&r, "0123456789", false, true).is_empty());
        let e = RequestRecord {
            ok: true,
            ..Default::default()
        };
        assert_eq!(output_flags(&e, "", false, true), vec!["empty"]);
    }
}
