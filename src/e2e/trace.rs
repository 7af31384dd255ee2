//! Trace files: what a replay sends and when (docs/traces.md).
//!
//! Three formats, one JSON object per line (a conversations file may also be one JSON array):
//! - `mooncake`: `timestamp` (milliseconds), `input_length`, `output_length`, `hash_ids` (one
//!   label per block of [`MOONCAKE_BLOCK_TOKENS`] prompt tokens, the last block partial), as in
//!   Mooncake's published traces; optional `session_id` (lines of one session are its turns, in
//!   order) and `delay` (milliseconds of think time after the previous turn's answer), as
//!   AIPerf's Mooncake replay reads them;
//! - `timed_trace`: vLLM's `vllm bench serve --dataset-name timed_trace` records: the same
//!   fields, `timestamp` in seconds (vLLM multiplies it by `--timed-trace-sec-multiplier`,
//!   default 1) and [`TIMED_TRACE_BLOCK_TOKENS`] tokens per hash id (vLLM's
//!   `--timed-trace-chunk-hash-size`, default 16);
//! - `conversations`: ShareGPT-like sessions, `{"id": ..., "timestamp": s, "conversations":
//!   [{"from": "system"|"human"|"tool"|"gpt", "value": text, "think_time_s": s}]}`; each human
//!   (or tool) turn is a request whose history is every earlier turn, with the answers the engine
//!   actually gave; a `gpt` turn's text sets the output length (its token count, or
//!   `output_tokens` when given) and is not sent.
//!
//! Prompt text for `hash_ids` ([`super::trace_replay`]) is synthesised block by block: a hash id
//! always gives the same text, fitted to the block's token count with the served model's
//! tokenizer, so two requests that share their first k hash ids share their first k blocks of
//! tokens at the engine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RigError;

/// Tokens per hash id in Mooncake's traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;
/// Tokens per hash id in vLLM's `timed_trace` (its `--timed-trace-chunk-hash-size` default).
pub const TIMED_TRACE_BLOCK_TOKENS: u32 = 16;

/// Built-in traces, by name: `(name, format, JSONL text)`; made by `scripts/make_traces.py`.
pub const BUILTIN_TRACES: &[(&str, TraceFormat, &str)] = &[
    (
        "agentic",
        TraceFormat::TimedTrace,
        include_str!("../../traces/agentic.jsonl"),
    ),
    (
        "chat",
        TraceFormat::Conversations,
        include_str!("../../traces/chat.jsonl"),
    ),
];

/// A trace's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// Mooncake JSONL (timestamps in ms, 512-token blocks).
    Mooncake,
    /// vLLM's timed_trace JSONL (timestamps in s, 16-token blocks).
    #[value(name = "timed-trace")]
    TimedTrace,
    /// ShareGPT-like multi-turn sessions.
    Conversations,
}

/// What a turn sends.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnInput {
    /// Blocks labelled by hash id, `input_length` tokens in all.
    Blocks {
        /// The hash ids.
        hash_ids: Vec<u64>,
        /// Prompt tokens.
        input_length: u32,
    },
    /// Literal messages appended to the session's history (`(role, text)`).
    Messages(Vec<(String, String)>),
}

/// One request of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceTurn {
    /// What it sends.
    pub input: TurnInput,
    /// `max_tokens` (with `ignore_eos`).
    pub output_tokens: u32,
    /// Seconds (trace time) after the previous turn's answer before this one is sent.
    pub think_s: f64,
    /// Absolute send time in trace seconds, when the trace gives one.
    pub at_s: Option<f64>,
}

/// One session: turns sent one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSession {
    /// Its id in the file (or the line number).
    pub id: String,
    /// When its first turn is sent, trace seconds.
    pub start_s: f64,
    /// The turns.
    pub turns: Vec<TraceTurn>,
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The file (or `traces/<name>.jsonl (built in)`).
    pub origin: PathBuf,
    /// Its format.
    pub format: TraceFormat,
    /// Tokens per hash id.
    pub block_tokens: u32,
    /// Sessions, by start time.
    pub sessions: Vec<TraceSession>,
}

/// How a trace is replayed (`--trace-speed`, `--trace-start`, `--trace-duration`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TraceWindow {
    /// Time scale: 2 sends twice as fast (timestamps and think times divided by 2).
    pub speed: f64,
    /// Sessions starting before this many trace seconds are left out.
    pub start_s: f64,
    /// Sessions starting this many trace seconds after `start_s` or later are left out.
    pub duration_s: Option<f64>,
}

impl Default for TraceWindow {
    fn default() -> Self {
        Self {
            speed: 1.0,
            start_s: 0.0,
            duration_s: None,
        }
    }
}

fn bad(origin: &Path, line: usize, m: impl std::fmt::Display) -> RigError {
    RigError::file(origin, format!("line {line}: {m}"))
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

impl Trace {
    /// A built-in trace by name, or a file by path; `format` overrides the guess (a line with
    /// `conversations` is a conversation; else `timed_trace` for a name containing
    /// `timed_trace`, Mooncake otherwise). `block_tokens` overrides the format's block size.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] (`--trace`) for neither a built-in name nor a readable file;
    /// [`RigError::BadFile`] naming the file and line for bad content.
    pub fn load(
        name_or_path: &str,
        format: Option<TraceFormat>,
        block_tokens: Option<u32>,
    ) -> Result<Self, RigError> {
        let builtin = BUILTIN_TRACES.iter().find(|(n, _, _)| *n == name_or_path);
        let (origin, text) = match builtin {
            Some((n, _, t)) => (
                PathBuf::from(format!("traces/{n}.jsonl (built in)")),
                t.to_string(),
            ),
            None => {
                let p = Path::new(name_or_path);
                if !p.is_file() {
                    let names: Vec<&str> = BUILTIN_TRACES.iter().map(|(n, _, _)| *n).collect();
                    return Err(RigError::flag(
                        "--trace",
                        format!(
                            "'{name_or_path}' is neither a built-in trace ({}) nor a file",
                            names.join(", ")
                        ),
                    ));
                }
                let t = std::fs::read_to_string(p)
                    .map_err(|e| RigError::file(p, format!("cannot read the trace: {e}")))?;
                (p.to_path_buf(), t)
            }
        };
        let guess = if let Some((_, f, _)) = builtin {
            *f
        } else if text.contains("\"conversations\"") {
            TraceFormat::Conversations
        } else if name_or_path.contains("timed_trace") || name_or_path.contains("timed-trace") {
            TraceFormat::TimedTrace
        } else {
            TraceFormat::Mooncake
        };
        Self::parse(&text, &origin, format.unwrap_or(guess), block_tokens)
    }

    /// Parse `text` (named `origin` in errors) as `format`.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the line and field.
    pub fn parse(
        text: &str,
        origin: &Path,
        format: TraceFormat,
        block_tokens: Option<u32>,
    ) -> Result<Self, RigError> {
        let values: Vec<(usize, Value)> = if text.trim_start().starts_with('[') {
            let v: Vec<Value> = serde_json::from_str(text).map_err(|e| {
                RigError::file(origin, format!("not a JSON array of sessions: {e}"))
            })?;
            v.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect()
        } else {
            let mut out = Vec::new();
            for (i, l) in text.lines().enumerate() {
                if l.trim().is_empty() {
                    continue;
                }
                let v: Value = serde_json::from_str(l)
                    .map_err(|e| bad(origin, i + 1, format!("not JSON: {e}")))?;
                out.push((i + 1, v));
            }
            out
        };
        if values.is_empty() {
            return Err(RigError::file(origin, "the trace is empty"));
        }
        let block = block_tokens.unwrap_or(match format {
            TraceFormat::Mooncake => MOONCAKE_BLOCK_TOKENS,
            _ => TIMED_TRACE_BLOCK_TOKENS,
        });
        if block == 0 {
            return Err(RigError::flag("--trace-block-tokens", "must be at least 1"));
        }
        let mut sessions = match format {
            TraceFormat::Conversations => values
                .iter()
                .map(|(l, v)| conversation(origin, *l, v))
                .collect::<Result<Vec<_>, _>>()?,
            _ => blocks(origin, &values, format, block)?,
        };
        sessions.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        Ok(Self {
            origin: origin.to_path_buf(),
            format,
            block_tokens: block,
            sessions,
        })
    }

    /// The sessions starting inside `w`'s window, with times shifted to its start and divided
    /// by its speed.
    pub fn windowed(&self, w: &TraceWindow) -> Vec<TraceSession> {
        let end = w.duration_s.map(|d| w.start_s + d);
        self.sessions
            .iter()
            .filter(|s| s.start_s >= w.start_s && end.is_none_or(|e| s.start_s < e))
            .map(|s| {
                let mut s = s.clone();
                s.start_s = (s.start_s - w.start_s) / w.speed;
                for t in &mut s.turns {
                    t.think_s /= w.speed;
                    t.at_s = t.at_s.map(|a| (a - w.start_s) / w.speed);
                }
                s
            })
            .collect()
    }

    /// Requests in all.
    pub fn requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }
}

/// Mooncake / timed_trace lines into sessions (one per line, or grouped by `session_id`).
fn blocks(
    origin: &Path,
    values: &[(usize, Value)],
    format: TraceFormat,
    block: u32,
) -> Result<Vec<TraceSession>, RigError> {
    let scale = if format == TraceFormat::Mooncake {
        1e-3
    } else {
        1.0
    };
    let mut order: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, TraceSession> = HashMap::new();
    for (line, v) in values {
        let need = |k: &str| {
            num(v, k).ok_or_else(|| bad(origin, *line, format!("'{k}' is missing or not a number")))
        };
        let input = need("input_length")?;
        let output = need("output_length")?;
        if input < 1.0 || output < 1.0 || input > 1e7 || output > 1e7 {
            return Err(bad(
                origin,
                *line,
                "input_length and output_length must be between 1 and 10,000,000 tokens",
            ));
        }
        let hash_ids: Vec<u64> = match v.get("hash_ids") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|h| {
                    h.as_u64().ok_or_else(|| {
                        bad(
                            origin,
                            *line,
                            "hash_ids holds a value that is not a non-negative integer",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad(origin, *line, "'hash_ids' is missing or not a list")),
        };
        let want = (input as u64).div_ceil(u64::from(block));
        if hash_ids.len() as u64 != want {
            return Err(bad(
                origin,
                *line,
                format!(
                    "{} hash_ids for {input} tokens, where blocks of {block} tokens need {want} (set the block size with --trace-block-tokens, or the format with --trace-format)",
                    hash_ids.len()
                ),
            ));
        }
        let at = num(v, "timestamp").map(|t| t * scale);
        let think = num(v, "delay").map(|d| d * 1e-3).unwrap_or(0.0);
        let turn = TraceTurn {
            input: TurnInput::Blocks {
                hash_ids,
                input_length: input as u32,
            },
            output_tokens: output as u32,
            think_s: think,
            at_s: at,
        };
        let id = match v.get("session_id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => format!("line {line}"),
        };
        match by_id.get_mut(&id) {
            Some(s) => {
                // Later turns of a session wait for the answer before; their timestamp is a
                // lower bound.
                s.turns.push(turn);
            }
            None => {
                order.push(id.clone());
                by_id.insert(
                    id.clone(),
                    TraceSession {
                        id,
                        start_s: at.unwrap_or(0.0),
                        turns: vec![turn],
                    },
                );
            }
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect())
}

/// One ShareGPT-like session.
fn conversation(origin: &Path, line: usize, v: &Value) -> Result<TraceSession, RigError> {
    let turns = v
        .get("conversations")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(origin, line, "'conversations' is missing or not a list"))?;
    let id = match v.get("id").or_else(|| v.get("session_id")) {
        Some(Value::String(s)) => s.clone(),
        Some(x) if !x.is_null() => x.to_string(),
        _ => format!("line {line}"),
    };
    let mut out = Vec::new();
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut think = 0.0;
    for (k, t) in turns.iter().enumerate() {
        let from = t
            .get("from")
            .or_else(|| t.get("role"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad(origin, line, format!("turn {k}: 'from' is missing")))?;
        let value = t
            .get("value")
            .or_else(|| t.get("content"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        think += num(t, "think_time_s").unwrap_or(0.0);
        match from {
            "gpt" | "assistant" | "chatgpt" | "bing" => {
                if pending.is_empty() {
                    continue;
                }
                let out_tokens = num(t, "output_tokens")
                    .map(|n| n.max(1.0) as u32)
                    // About 4 characters per token when the trace gives no count.
                    .unwrap_or_else(|| (value.chars().count() as u32 / 4).max(1));
                out.push(TraceTurn {
                    input: TurnInput::Messages(std::mem::take(&mut pending)),
                    output_tokens: out_tokens,
                    think_s: std::mem::take(&mut think),
                    at_s: None,
                });
            }
            "system" => pending.push(("system".into(), value)),
            "human" | "user" => pending.push(("user".into(), value)),
            // Tool results go back as user messages: a tool role needs the call ids a replay
            // does not have.
            "tool" | "function" | "observation" => {
                pending.push(("user".into(), format!("Tool result:\n{value}")))
            }
            other => {
                return Err(bad(
                    origin,
                    line,
                    format!("turn {k}: unknown speaker '{other}' (take system, human, tool, gpt)"),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(bad(
            origin,
            line,
            "the session has no human turn followed by a gpt turn",
        ));
    }
    Ok(TraceSession {
        id,
        start_s: num(v, "timestamp").unwrap_or(0.0),
        turns: out,
    })
}

/// Prefix reuse the trace implies, tokens: for each request in send order (its hash ids and
/// prompt length), the full blocks of its leading hash-id chain that an earlier request already
/// sent in full, times the block size. A partial last block is neither reused nor cached, as in
/// a block-granular prefix cache.
pub fn implied_block_reuse(order: &[(&[u64], u32)], block: u32) -> Vec<u64> {
    let mut seen: std::collections::HashSet<Vec<u64>> = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(order.len());
    for (ids, input) in order {
        let full = ((*input / block.max(1)) as usize).min(ids.len());
        let mut k = 0;
        while k < full && seen.contains(&ids[..=k]) {
            k += 1;
        }
        out.push(k as u64 * u64::from(block));
        for j in 0..full {
            seen.insert(ids[..=j].to_vec());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_lines_parse_with_units_and_blocks() {
        let t = "{\"timestamp\": 1500, \"input_length\": 20, \"output_length\": 4, \"hash_ids\": [1, 2, 3]}\n\
                 {\"timestamp\": 0, \"input_length\": 16, \"output_length\": 4, \"hash_ids\": [1, 2]}\n";
        let tr = Trace::parse(t, Path::new("x.jsonl"), TraceFormat::Mooncake, Some(8)).unwrap();
        assert_eq!(tr.sessions.len(), 2);
        assert_eq!(tr.sessions[1].start_s, 1.5);
        let e = Trace::parse(t, Path::new("x.jsonl"), TraceFormat::Mooncake, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.jsonl") && e.contains("line 1") && e.contains("--trace-block-tokens"),
            "{e}"
        );
        let tt = Trace::parse(t, Path::new("y"), TraceFormat::TimedTrace, Some(8)).unwrap();
        assert_eq!(tt.sessions[1].start_s, 1500.0);
        let w = tr.windowed(&TraceWindow {
            speed: 2.0,
            start_s: 0.5,
            duration_s: Some(10.0),
        });
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].start_s, 0.5);
    }

    #[test]
    fn conversations_keep_turns_and_think_time() {
        let t = r#"{"id": "a", "timestamp": 2, "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there", "output_tokens": 5}, {"from": "human", "value": "more", "think_time_s": 1.5}, {"from": "gpt", "value": "abcdefgh"}]}"#;
        let tr = Trace::parse(t, Path::new("c"), TraceFormat::Conversations, None).unwrap();
        let s = &tr.sessions[0];
        assert_eq!(s.turns.len(), 2);
        assert_eq!(s.turns[0].output_tokens, 5);
        assert_eq!(s.turns[1].think_s, 1.5);
        assert_eq!(s.turns[1].output_tokens, 2);
        assert!(matches!(&s.turns[0].input, TurnInput::Messages(m) if m.len() == 2));
    }

    #[test]
    fn implied_reuse_counts_leading_chains_only() {
        let a = [1u64, 2, 3];
        let b = [1u64, 2, 9];
        let c = [5u64, 2, 3]; // same blocks, different chain: no reuse
        let d = [1u64, 2, 3, 4];
        let r = implied_block_reuse(&[(&a, 48), (&b, 48), (&c, 48), (&d, 64)], 16);
        assert_eq!(r, vec![0, 32, 0, 48]);
        // A partial block is not cached: the next request reuses only what was sent in full.
        let r = implied_block_reuse(&[(&a, 40), (&d, 64)], 16);
        assert_eq!(r, vec![0, 32]);
    }

    #[test]
    fn builtin_traces_parse() {
        for (n, _, _) in BUILTIN_TRACES {
            let t = Trace::load(n, None, None).unwrap_or_else(|e| panic!("{n}: {e}"));
            assert!(t.requests() >= 10, "{n}");
        }
    }
}
