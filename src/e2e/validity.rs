//! The validity guard: a run whose output is empty, degenerate (repetition), much shorter than
//! requested, whose requests failed, or whose conditions are incomplete or contradicted is marked
//! invalid, and its throughput is not presented as a result.
//!
//! Rules (each reason is written into the report):
//! - the run was interrupted, or the engine failed during it;
//! - no request completed, or any request failed;
//! - any completed request produced no token (`empty`); one that produced tokens but no visible
//!   text (special tokens, or text vLLM held back as incomplete UTF-8) is a note, and invalidates
//!   the run only beyond 10% of the requests, like degenerate output;
//! - a prompt length disagrees with the engine's `usage.prompt_tokens` beyond max(2%, 2
//!   tokens) after the engine's known overhead (chat template, BOS): the prompts were not the
//!   lengths the report states ([`super::conditions::PromptCheck`]);
//! - (not a reason: a note) completed requests whose output repeats itself (the last ≤ 512
//!   characters repeat a pattern of period p at least 4 times with ≤ 2% mismatches, or fewer
//!   than 25% of the word trigrams are distinct over ≥ 40 words): a property of the model's
//!   output, reported with what it affects (quality, speculative acceptance); the speed figures
//!   stand;
//! - with a fixed output length (`ignore_eos`), any request is truncated: it produced fewer
//!   tokens than requested (exactly counted by `usage`; within 2% when re-counted by a
//!   tokenizer), or ended for another reason than the length (`finish_reason` not `length`).
//!   Its throughput would count a shorter answer as the requested one, so the run's throughput
//!   is not presented;
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
use super::metrics::{RequestRecord, TokenSource, BURSTY_FLAG, NO_TEXT_FLAG, RETRIED_FLAG};

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

/// Share of completed requests that may produce tokens but no visible text before the run is
/// invalid (repetitive output is a note whatever its share: see `repetition_note`).
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

/// Relative tolerance of an output length re-counted by a tokenizer (a decode/encode round trip
/// may merge or split a token), and of the cross-check of `usage` against such a count.
pub const TOKEN_COUNT_TOLERANCE: f64 = 0.02;

/// Flags for one completed request: `empty`, `degenerate: ...`, `truncated: ...`.
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
    // Tokens produced: the engine's count, else the chunks that carried one.
    let produced = r.output_tokens.unwrap_or(r.token_chunks as u64);
    if produced == 0 || (r.content_chars + r.reasoning_chars == 0 && r.token_chunks == 0) {
        f.push("empty".to_string());
        return f;
    }
    if r.content_chars + r.reasoning_chars == 0 {
        // vLLM streams a token whose text is held back (incomplete UTF-8) or has none (a special
        // token) as a chunk with an empty `content`: tokens were produced, none became text.
        f.push(format!(
            "{NO_TEXT_FLAG}: {produced} tokens produced in {} chunks, none decoded to visible text (special tokens, or bytes that never completed a UTF-8 character)",
            r.token_chunks
        ));
    }
    if judge_repetition {
        if let Some(why) = degenerate(text) {
            f.push(format!("degenerate: {why}"));
        }
    }
    if output_fixed {
        let want = u64::from(r.output_tokens_requested);
        let exact = matches!(r.token_source, Some(TokenSource::Usage) | None);
        match r.output_tokens {
            Some(n) if exact && n < want => f.push(format!("truncated: {n} of {want} tokens")),
            Some(n)
                if !exact
                    && r.token_source != Some(TokenSource::Chunks)
                    && (n as f64) < want as f64 * (1.0 - TOKEN_COUNT_TOLERANCE) =>
            {
                f.push(format!(
                    "truncated: {n} of {want} tokens (re-counted by a tokenizer)"
                ))
            }
            _ => {
                if let Some(fr) = r.finish_reason.as_deref().filter(|fr| *fr != "length") {
                    // A tokenizer's re-count can exceed the engine's own count by its tolerance:
                    // then the reason is the better evidence, and it stays a truncation.
                    let recounted = matches!(
                        r.token_source,
                        Some(TokenSource::EngineTokenizer | TokenSource::LocalTokenizer)
                    );
                    match r.output_tokens {
                        // Every token asked for arrived: not truncated, whatever the reason says.
                        Some(n) if n >= want && !recounted => f.push(format!(
                            "{UNEXPECTED_FINISH_FLAG} '{fr}' with ignore_eos, though all {n} of {want} tokens arrived"
                        )),
                        n => f.push(format!(
                            "truncated: finish_reason '{fr}' with ignore_eos ({} of {want} tokens)",
                            n.map_or_else(|| "?".to_string(), |n| n.to_string())
                        )),
                    }
                }
            }
        }
    }
    f
}

/// The note on outputs that repeat themselves (flag `degenerate: …`). Repetition is a property
/// of the model's own output (a small model looping under greedy decoding, reproducible outside
/// rigbench), not a measurement fault: the run's speed figures stand, since TTFT, ITL, TPOT and
/// throughput count the tokens the engine generated (empty and truncated outputs are judged on
/// their own). What it does affect is said: the output's quality, and where speculation is on,
/// the acceptance figures (repetitive text is easy to draft).
fn repetition_note(degen: usize, ok: usize, example: &str, c: &Conditions) -> String {
    let spec = if c.spec.state == SpecState::On {
        "; the speculative acceptance rate and acceptance length (repetitive text is easy to draft, so they overstate what other text gets)"
    } else {
        ""
    };
    format!(
        "{degen} of {ok} outputs repeat themselves ({example}): a property of the model's output at temperature {}, reported, not a reason to withhold the run's figures; TTFT, ITL, TPOT and throughput stand (they count the tokens the engine generated); it affects the output's quality{spec}",
        c.temperature
    )
}

/// A missing condition's wording when `--engine-log` was given: its advice to give the log
/// becomes the statement that the log given does not state it.
pub fn with_log_given(missing: &str) -> String {
    missing
        .replace(
            "state it with --spec-method, or give --engine-log",
            "state it with --spec-method; the engine log given with --engine-log does not state it",
        )
        .replace(
            "give --engine-log, or state it with --kv-capacity",
            "the engine log given with --engine-log does not say it; state it with --kv-capacity",
        )
}

/// A [`super::render::how_to_state`] hint when `--engine-log` was given: never advise giving it again; say
/// that the log given does not state the condition.
pub fn hint_with_log(hint: &str, log_given: bool) -> String {
    if !log_given {
        return hint.to_string();
    }
    hint.replace(
        ", or give the engine's log with --engine-log",
        " (the engine log given with --engine-log does not state it)",
    )
    .replace(
        " or the engine's log (--engine-log)",
        " or the engine's log (the one given with --engine-log does not state it)",
    )
}

/// Flag prefix of a request whose every requested token arrived under `ignore_eos` but whose
/// `finish_reason` is not `length` (a note, not a truncation).
pub const UNEXPECTED_FINISH_FLAG: &str = "unexpected finish_reason";

/// Judge a run.
pub fn assess(records: &[RequestRecord], c: &Conditions, stop: &ExecStop) -> Validity {
    let mut v = Validity::default();
    stop_verdict(records, stop, &mut v);
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    request_verdicts(records, &ok, c, &mut v);
    flag_verdicts(&ok, c, &mut v);
    condition_verdicts(c, !ok.is_empty(), &mut v);
    v.valid = v.reasons.is_empty();
    v
}

/// How many of the completed requests `ok` carry a flag starting with `p`.
fn count_flagged(ok: &[&RequestRecord], p: &str) -> usize {
    ok.iter()
        .filter(|r| r.flags.iter().any(|f| f.starts_with(p)))
        .count()
}

/// What ended the run: an interrupt or an engine failure invalidates it; the duration limit
/// is a note.
fn stop_verdict(records: &[RequestRecord], stop: &ExecStop, v: &mut Validity) {
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
}

/// The requests' outcomes: none completed, failures, empty or textless outputs, prompt
/// lengths the engine disagrees with, retries.
fn request_verdicts(
    records: &[RequestRecord],
    ok: &[&RequestRecord],
    c: &Conditions,
    v: &mut Validity,
) {
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
    let count = |p: &str| count_flagged(ok, p);
    let empty = count("empty");
    if empty > 0 {
        v.reasons.push(format!(
            "{empty} of {} completed requests returned empty output",
            ok.len()
        ));
    }
    let no_text = count(NO_TEXT_FLAG);
    if no_text > 0 {
        let msg = format!(
            "{no_text} of {} completed requests produced tokens but no visible text (special tokens or incomplete UTF-8; counted from the engine's per-chunk usage)",
            ok.len()
        );
        if no_text as f64 > DEGENERATE_TOLERANCE * ok.len() as f64 {
            v.reasons.push(msg);
        } else {
            v.notes.push(msg);
        }
    }
    if let Some(p) = c.lengths.prompt_check.as_ref().filter(|p| p.mismatched > 0) {
        v.reasons.push(format!(
            "{} of {} prompt lengths disagree with the engine's usage.prompt_tokens by more than max({:.0}%, {} tokens) after its overhead of {} tokens ({}): the prompts are not the stated lengths; e.g. {}",
            p.mismatched,
            p.checked,
            100.0 * super::conditions::PROMPT_TOLERANCE_REL,
            super::conditions::PROMPT_TOLERANCE_TOKENS,
            p.overhead,
            p.overhead_source,
            p.example.as_deref().unwrap_or("")
        ));
    }
    let retried = records.iter().filter(|r| r.retries > 0).count();
    if retried > 0 {
        v.notes.push(format!(
            "{retried} of {} requests were sent again once on a fresh connection: the kept-alive connection failed before any response (the engine had closed it); {RETRIED_FLAG} requests' latencies include the retry",
            records.len()
        ));
    }
}

/// The flags of completed requests: bursty delivery, degenerate repetition, truncation, an
/// unexpected finish reason, token counts that disagree with the tokenizer.
fn flag_verdicts(ok: &[&RequestRecord], c: &Conditions, v: &mut Validity) {
    let count = |p: &str| count_flagged(ok, p);
    let bursty = count(BURSTY_FLAG);
    if bursty > 0 {
        v.notes.push(format!(
            "{bursty} of {} completed requests received their tokens in bursts or several per chunk: ITL measures delivery, not decode steps (TPOT, from first token to end, is not affected)",
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
        v.notes.push(repetition_note(degen, ok.len(), &example, c));
    }
    let truncated = count("truncated");
    if truncated > 0 {
        let example = ok
            .iter()
            .flat_map(|r| r.flags.iter())
            .find(|f| f.starts_with("truncated"))
            .cloned()
            .unwrap_or_default();
        v.reasons.push(format!(
            "{truncated} of {} outputs truncated: shorter than the fixed length requested ({} tokens, ignore_eos; e.g. {example}); throughput not presented",
            ok.len(),
            c.lengths.output_requested
        ));
    }
    let odd_finish = count(UNEXPECTED_FINISH_FLAG);
    if odd_finish > 0 {
        let example = ok
            .iter()
            .flat_map(|r| r.flags.iter())
            .find(|f| f.starts_with(UNEXPECTED_FINISH_FLAG))
            .cloned()
            .unwrap_or_default();
        v.notes.push(format!(
            "{odd_finish} of {} requests ended with a finish_reason other than 'length' under ignore_eos though every requested token arrived (e.g. {example}): not a truncation; the engine reports its stop reason in its own way",
            ok.len()
        ));
    }
    let mismatched = count("token count");
    if mismatched > 0 {
        let example = ok
            .iter()
            .flat_map(|r| r.flags.iter())
            .find(|f| f.starts_with("token count"))
            .cloned()
            .unwrap_or_default();
        v.notes.push(format!(
            "{mismatched} of {} requests: the engine's usage disagrees by more than {:.0}% with the output re-counted by the tokenizer (e.g. {example}); which one is right is not known",
            ok.len(),
            100.0 * TOKEN_COUNT_TOLERANCE
        ));
    }
}

/// The run's conditions: thinking, cache temperature, the engine, model, speculative decoding
/// and KV capacity (missing ones listed), and the prompt and output lengths.
fn condition_verdicts(c: &Conditions, any_ok: bool, v: &mut Validity) {
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
        v.missing_conditions.push(match &c.kv.capacity_note {
            Some(why) => format!("KV capacity ({why})"),
            None => {
                "KV capacity (no cache_config_info on /metrics and none in the engine log)".into()
            }
        });
    }
    if any_ok && c.token_sources.contains(&TokenSource::Chunks) {
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
    fn tokens_without_text_are_a_note_not_empty_output() {
        // vLLM: 34 tokens streamed with empty `content` (held back or special), counted from the
        // per-chunk usage: produced, not empty.
        let silent = RequestRecord {
            ok: true,
            output_tokens: Some(34),
            token_chunks: 34,
            token_source: Some(TokenSource::Usage),
            output_tokens_requested: 34,
            finish_reason: Some("length".into()),
            ..Default::default()
        };
        let f = output_flags(&silent, "", true, true);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].starts_with(NO_TEXT_FLAG) && f[0].contains("34 tokens"),
            "{f:?}"
        );
        // No token at all is empty.
        let none = RequestRecord {
            ok: true,
            output_tokens: Some(0),
            ..Default::default()
        };
        assert_eq!(output_flags(&none, "", false, true), vec!["empty"]);
        // One such request of 32 is a note; beyond 10% the run is invalid.
        let c = conditions();
        let text = RequestRecord {
            content_chars: 40,
            ..silent.clone()
        };
        let with = |n_silent: usize| -> Validity {
            let recs: Vec<RequestRecord> = (0..32)
                .map(|i| {
                    let mut r = if i < n_silent {
                        silent.clone()
                    } else {
                        text.clone()
                    };
                    r.index = i;
                    let t = if i < n_silent { "" } else { "a proper answer" };
                    r.flags = output_flags(&r, t, true, false);
                    r
                })
                .collect();
            assess(&recs, &c, &ExecStop::Completed)
        };
        let v = with(1);
        assert!(v.valid, "{v:#?}");
        assert!(v
            .notes
            .iter()
            .any(|n| n.contains("1 of 32 completed requests produced tokens but no visible text")));
        let v = with(4);
        assert!(!v.valid);
    }

    /// Issue 44, fault 3: a small model that genuinely loops under greedy decoding (every
    /// requested token arrived) keeps its speed figures; the repetition is reported as a
    /// property of its output, with what it affects.
    #[test]
    fn repetitive_output_of_the_model_keeps_the_figures_and_says_what_it_affects() {
        let mut c = conditions();
        let looping = "The cat sat on the mat. ".repeat(30);
        let recs: Vec<RequestRecord> = (0..5)
            .map(|i| {
                let mut r = RequestRecord {
                    index: i,
                    ok: true,
                    content_chars: looping.len(),
                    output_tokens: Some(128),
                    output_tokens_requested: 128,
                    token_source: Some(TokenSource::Usage),
                    finish_reason: Some("length".into()),
                    ..Default::default()
                };
                let t = if i < 4 {
                    looping.as_str()
                } else {
                    "a proper answer"
                };
                r.flags = output_flags(&r, t, true, true);
                r
            })
            .collect();
        assert!(
            recs[0].flags.iter().any(|f| f.starts_with("degenerate")),
            "{:?}",
            recs[0].flags
        );
        let v = assess(&recs, &c, &ExecStop::Completed);
        assert!(v.valid, "{v:#?}");
        let note = v
            .notes
            .iter()
            .find(|n| n.starts_with("4 of 5 outputs repeat themselves"))
            .unwrap();
        assert!(
            note.contains("property of the model's output") && note.contains("TPOT"),
            "{note}"
        );
        assert!(!note.contains("acceptance"), "{note}");
        c.spec.state = SpecState::On;
        let v = assess(&recs, &c, &ExecStop::Completed);
        assert!(
            v.notes
                .iter()
                .any(|n| n.contains("speculative acceptance rate")),
            "{:?}",
            v.notes
        );
    }

    fn conditions() -> Conditions {
        use super::super::conditions::*;
        Conditions {
            engine: None,
            engine_version: None,
            model: None,
            workload: super::super::workload::WorkloadKind::Fixed,
            temperature: 0.0,
            thinking: ThinkingCondition::default(),
            spec: SpecCondition {
                state: SpecState::Off,
                evidence: String::new(),
                method: None,
                k: None,
                drafts: None,
                draft_tokens: None,
                accepted_tokens: None,
                acceptance_rate: None,
                mean_acceptance_length: None,
                per_position: Vec::new(),
            },
            cache: CacheCondition {
                temperature: super::super::workload::CacheTemp::Cold,
                reset: None,
                salted: true,
                queries: None,
                hits: None,
                hit_rate: None,
                hits_allowed: 0,
                verified: Some(true),
                counters: None,
                note: String::new(),
            },
            kv: KvCondition::default(),
            lengths: LengthCondition::default(),
            token_sources: vec![TokenSource::Usage],
            chunk_splits: Vec::new(),
            token_check: None,
        }
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
            vec!["truncated: 3 of 32 tokens"]
        );
        // Any shortfall is truncation, not only below half (a 600-of-1024 answer once passed).
        let r600 = RequestRecord {
            output_tokens: Some(600),
            output_tokens_requested: 1024,
            token_source: Some(TokenSource::Usage),
            finish_reason: Some("length".into()),
            ..r.clone()
        };
        assert_eq!(
            output_flags(&r600, "0123456789", true, true),
            vec!["truncated: 600 of 1024 tokens"]
        );
        let full = RequestRecord {
            output_tokens: Some(1024),
            ..r600.clone()
        };
        assert!(output_flags(&full, "0123456789", true, true).is_empty());
        // A stop for another reason than the length.
        let stopped = RequestRecord {
            finish_reason: Some("stop".into()),
            ..full.clone()
        };
        // Every token arrived: a note on the odd reason, not a truncation (an engine's unknown
        // "banana" once invalidated a run as "shorter than the fixed length").
        let f = output_flags(&stopped, "0123456789", true, true);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].starts_with(UNEXPECTED_FINISH_FLAG)
                && f[0].contains("'stop'")
                && f[0].contains("all 1024 of 1024"),
            "{f:?}"
        );
        // Counted from chunks (a lower bound): every token there, so a note too; fewer, a
        // truncation.
        let chunks = RequestRecord {
            token_source: Some(TokenSource::Chunks),
            ..stopped.clone()
        };
        let f = output_flags(&chunks, "0123456789", true, true);
        assert!(f[0].starts_with(UNEXPECTED_FINISH_FLAG), "{f:?}");
        let short = RequestRecord {
            output_tokens: Some(900),
            ..chunks.clone()
        };
        let f = output_flags(&short, "0123456789", true, true);
        assert!(
            f[0].starts_with("truncated: finish_reason 'stop' with ignore_eos (900 of 1024"),
            "{f:?}"
        );
        // Re-counted by a tokenizer, which can overshoot: the reason stands, a truncation.
        let recounted = RequestRecord {
            token_source: Some(TokenSource::EngineTokenizer),
            ..stopped.clone()
        };
        let f = output_flags(&recounted, "0123456789", true, true);
        assert!(
            f[0].starts_with("truncated: finish_reason 'stop' with ignore_eos (1024 of 1024"),
            "{f:?}"
        );
        // Re-counted by a tokenizer: within 2% is not truncation.
        let recount = RequestRecord {
            output_tokens: Some(1010),
            token_source: Some(TokenSource::EngineTokenizer),
            ..full.clone()
        };
        assert!(output_flags(&recount, "0123456789", true, true).is_empty());
        assert!(output_flags(&r, "0123456789", false, true).is_empty());
        let e = RequestRecord {
            ok: true,
            ..Default::default()
        };
        assert_eq!(output_flags(&e, "", false, true), vec!["empty"]);
    }
}
