//! Per-position top-k log-probabilities of a teacher-forced prompt, read from the answers of
//! OpenAI-compatible engines (docs/quality.md, "Where the log-probabilities come from"):
//!
//! - vLLM's `prompt_logprobs` (and `rigbench serve`'s, the same form): per prompt position
//!   `null` (the first) or `{"<token id>": {"logprob", "rank", "decoded_token"}}`, the prompt
//!   token's own entry first, then the top-k alternatives (ranks 1..=k); keyed by token id.
//!   In the choice for completions, at the top of the body for chat;
//! - OpenAI's legacy completions `echo: true` + `logprobs: k`: `logprobs.tokens`,
//!   `token_logprobs` and `top_logprobs` (a `{text: logprob}` per token, the first `null`),
//!   for the first `usage.prompt_tokens` tokens; keyed by token text.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One teacher-forced position: the distribution that predicts the prompt token `token`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The prompt token actually there (its id as text, or its text; see [`Source`]).
    pub token: String,
    /// Its log-probability (natural log); `None` when the engine did not give it.
    pub token_logprob: Option<f64>,
    /// The top-k alternatives, most probable first (natural logs).
    pub top: Vec<(String, f64)>,
}

/// Where the positions came from, which fixes what a token key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// vLLM's `prompt_logprobs` (keys are token ids).
    PromptLogprobs,
    /// Completions `echo` + `logprobs` (keys are token texts).
    EchoLogprobs,
}

impl Source {
    /// In words.
    pub fn label(self) -> &'static str {
        match self {
            Source::PromptLogprobs => "prompt_logprobs (vLLM's field; keyed by token id)",
            Source::EchoLogprobs => "completions echo + logprobs (keyed by token text)",
        }
    }
}

fn num(v: &Value, what: &str) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("{what} is not a number")),
        // vLLM writes -inf as a JSON string when the probability underflows.
        Value::String(s) if s == "-inf" || s == "-Infinity" => Ok(f64::NEG_INFINITY),
        _ => Err(format!("{what} is not a number: {v}")),
    }
}

/// Positions from a `prompt_logprobs` array (see the module docs) for the prompt `ids` that
/// was sent, with `k` alternatives asked for. The first entry (`null`: nothing predicts the
/// first token) is skipped. The prompt token's entry is found by its id, never by its place in
/// the object: JSON objects have no order a reader may rely on (vLLM writes the prompt token
/// first, `rigbench serve` in key order).
///
/// # Errors
/// An array whose length is not the prompt's, an entry that is not an object of
/// `{logprob, rank}` objects, or one without the prompt token.
pub fn from_prompt_logprobs(pl: &[Value], ids: &[u32], k: usize) -> Result<Vec<Position>, String> {
    if pl.len() != ids.len() {
        return Err(format!(
            "prompt_logprobs has {} entries for a prompt of {} tokens",
            pl.len(),
            ids.len()
        ));
    }
    let mut out = Vec::with_capacity(pl.len());
    for (i, e) in pl.iter().enumerate().skip(1) {
        let m = e
            .as_object()
            .ok_or_else(|| format!("prompt_logprobs[{i}] is not an object"))?;
        let tok = ids[i].to_string();
        let own = m.get(&tok).ok_or_else(|| {
            format!("prompt_logprobs[{i}] has no entry for the prompt token {tok}")
        })?;
        let lp = num(
            own.get("logprob").unwrap_or(&Value::Null),
            &format!("prompt_logprobs[{i}][{tok}].logprob"),
        )?;
        let mut top = Vec::new();
        for (key, v) in m {
            // The alternatives are ranks 1..=k; the prompt token's own rank may lie below.
            let rank = v.get("rank").and_then(Value::as_u64).unwrap_or(u64::MAX);
            if rank as usize <= k {
                let l = num(
                    v.get("logprob").unwrap_or(&Value::Null),
                    &format!("prompt_logprobs[{i}][{key}].logprob"),
                )?;
                top.push((key.clone(), l));
            }
        }
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        out.push(Position {
            token: tok,
            token_logprob: Some(lp),
            top,
        });
    }
    Ok(out)
}

/// Positions from a completions answer to `echo: true, logprobs: k` (see the module docs):
/// the first `prompt_tokens` tokens, less the first.
///
/// # Errors
/// No `logprobs.tokens` / `token_logprobs`, arrays of different lengths, or a non-number.
pub fn from_echo(choice: &Value, prompt_tokens: usize) -> Result<Vec<Position>, String> {
    let lp = choice.get("logprobs").ok_or("the choice has no logprobs")?;
    let arr = |name: &str| {
        lp.get(name)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("logprobs.{name} is missing: the engine returned no prompt log-probabilities for echo"))
    };
    let (tokens, tlps) = (arr("tokens")?, arr("token_logprobs")?);
    let tops = lp.get("top_logprobs").and_then(Value::as_array);
    let n = prompt_tokens.min(tokens.len()).min(tlps.len());
    let mut out = Vec::with_capacity(n);
    for i in 1..n {
        let token = tokens[i]
            .as_str()
            .ok_or_else(|| format!("logprobs.tokens[{i}] is not a string"))?
            .to_string();
        let token_logprob = Some(num(&tlps[i], &format!("token_logprobs[{i}]"))?);
        let mut top: Vec<(String, f64)> = match tops.and_then(|t| t.get(i)) {
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| Ok((k.clone(), num(v, &format!("top_logprobs[{i}][{k}]"))?)))
                .collect::<Result<_, String>>()?,
            _ => Vec::new(),
        };
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        out.push(Position {
            token,
            token_logprob,
            top,
        });
    }
    Ok(out)
}

/// The positions of a whole answer to the prompt `ids` with `k` alternatives:
/// `prompt_logprobs` (choice or top level) when present, else echo's `logprobs`.
///
/// # Errors
/// Neither is present (the engine cannot teacher-force through its API), or one is malformed.
pub fn from_response(v: &Value, ids: &[u32], k: usize) -> Result<(Vec<Position>, Source), String> {
    let choice = v
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or("the answer has no choices")?;
    if let Some(Value::Array(pl)) = choice
        .get("prompt_logprobs")
        .or_else(|| v.get("prompt_logprobs"))
    {
        return Ok((from_prompt_logprobs(pl, ids, k)?, Source::PromptLogprobs));
    }
    let prompt_tokens = v
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .ok_or("the answer has neither prompt_logprobs nor usage.prompt_tokens")?;
    Ok((
        from_echo(choice, prompt_tokens as usize)?,
        Source::EchoLogprobs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn vllm_prompt_logprobs_keep_the_prompt_token_apart_from_the_top_k() {
        // Position 1: the prompt token 5 ranks 3rd, below the top 2 (7, 9).
        // Position 2: the prompt token 7 is itself the top-1.
        let pl = json!([null,
            {"5": {"logprob": -2.0, "rank": 3}, "7": {"logprob": -0.5, "rank": 1}, "9": {"logprob": -1.5, "rank": 2}},
            {"7": {"logprob": -0.1, "rank": 1}, "3": {"logprob": -3.0, "rank": 2}}]);
        let p = from_prompt_logprobs(pl.as_array().unwrap(), &[1, 5, 7], 2).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].token, "5");
        assert_eq!(p[0].token_logprob, Some(-2.0));
        assert_eq!(p[0].top, vec![("7".into(), -0.5), ("9".into(), -1.5)]);
        assert_eq!(p[1].top[0], ("7".into(), -0.1));
        assert_eq!(p[1].top.len(), 2);
    }

    #[test]
    fn echo_logprobs_stop_at_the_prompt() {
        let v = json!({"choices": [{"logprobs": {"tokens": ["a", "b", "c", "X"],
            "token_logprobs": [null, -1.0, -2.0, -0.3],
            "top_logprobs": [null, {"b": -1.0, "z": -0.7}, {"c": -2.0, "q": -0.2}, {"X": -0.3}]}}],
            "usage": {"prompt_tokens": 3}});
        let (p, s) = from_response(&v, &[0, 1, 2], 2).unwrap();
        assert_eq!(s, Source::EchoLogprobs);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].top[0], ("z".into(), -0.7));
        assert!(from_response(&json!({"choices": [{"text": "x"}]}), &[0], 2).is_err());
        // A prompt token missing from its entry is an error, never a silent skip.
        let pl = json!([null, {"9": {"logprob": -0.1, "rank": 1}}]);
        assert!(from_prompt_logprobs(pl.as_array().unwrap(), &[1, 5], 1)
            .unwrap_err()
            .contains("no entry for the prompt token 5"));
    }
}
