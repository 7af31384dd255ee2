//! Quality probes against any OpenAI-compatible engine (`rigbench e2e --quality`):
//!
//! - **Perplexity** of the fixed public-domain text
//!   ([`FIXED_TEXT`]): one `/v1/completions` request with the text as
//!   the prompt, `echo: true`, `logprobs: 0` and `max_tokens: 1`, as vLLM and `rigbench serve`
//!   answer it (the prompt tokens' log-probabilities in `logprobs.token_logprobs`, the first
//!   `null`); vLLM's `prompt_logprobs` field is read when present instead. Perplexity =
//!   `exp(−mean)` over the prompt tokens that have one. The same probe on a quantized
//!   deployment and on rigbench's BF16 reference of the same weights compares the two.
//!   llama.cpp's server returns no prompt log-probabilities (its `n_probs` covers generated
//!   tokens only), so the probe says so for it instead of a figure.
//! - **Exact recall** (needle in a haystack): a pass code hidden at several depths of filler
//!   text of several lengths, the model asked for it (greedy, chat); the pass rate is reported
//!   beside speed.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The fixed public-domain text of the perplexity probes, here and in the built-in runtime's
/// fidelity study (see `tests/fixtures/text/README.md` for its sources).
pub const FIXED_TEXT: &str = include_str!("../../tests/fixtures/text/public-domain.txt");

/// Its name in reports.
pub const FIXED_TEXT_NAME: &str = "tests/fixtures/text/public-domain.txt (Austen, Lincoln, the Declaration of Independence, the US Constitution's preamble; public domain)";

/// The perplexity probe's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerplexityProbe {
    /// The text (its name).
    pub text: String,
    /// Prompt tokens the engine reported.
    pub prompt_tokens: usize,
    /// Tokens with a log-probability (prompt tokens less the first).
    pub scored_tokens: usize,
    /// Mean negative log-likelihood, nats.
    pub mean_nll: f64,
    /// Perplexity.
    pub ppl: f64,
    /// Where the log-probabilities came from (`logprobs.token_logprobs` with echo, or vLLM's
    /// `prompt_logprobs`).
    pub source: String,
}

/// One needle-in-a-haystack case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecallCase {
    /// Filler words around the needle.
    pub haystack_words: usize,
    /// Where the needle sits, as a fraction of the haystack (0 = start).
    pub depth: f64,
    /// The pass code asked for.
    pub needle: String,
    /// Whether the answer contained it.
    pub passed: bool,
    /// The answer (first 120 characters).
    pub answer: String,
}

/// The recall probe's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecallProbe {
    /// Cases run.
    pub cases: Vec<RecallCase>,
    /// Fraction passed.
    pub pass_rate: f64,
}

/// Both probes, with what could not be measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityProbes {
    /// The perplexity probe, when the engine returns prompt log-probabilities.
    pub perplexity: Option<PerplexityProbe>,
    /// The exact-recall probe.
    pub recall: Option<RecallProbe>,
    /// Why a probe gave no figure.
    pub notes: Vec<String>,
}

/// Haystack lengths (words) and needle depths of the recall probe.
pub const RECALL_WORDS: [usize; 2] = [150, 600];
/// Needle depths.
pub const RECALL_DEPTHS: [f64; 3] = [0.1, 0.5, 0.9];

/// The perplexity from a `/v1/completions` response to an echoed prompt (see the module docs).
///
/// # Errors
/// A response without prompt log-probabilities (named), or with a non-number among them.
pub fn perplexity_from_response(v: &Value, text: &str) -> Result<PerplexityProbe, String> {
    let choice = v
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or("the response has no choices")?;
    let prompt_tokens = v
        .get("usage")
        .and_then(|u| u.get("prompt_tokens"))
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    let (lps, source): (Vec<f64>, &str) = if let Some(Value::Array(pl)) = choice
        .get("prompt_logprobs")
        .or_else(|| v.get("prompt_logprobs"))
    {
        // vLLM: [null, {"<id>": {"logprob", "rank", ...}}, ...]; the prompt token's entry is
        // the one that is not among the top alternatives when it ranks below them, so take the
        // entry whose rank is its own: the first key is the prompt token in vLLM's order.
        let mut out = Vec::new();
        for e in pl.iter().skip(1) {
            let m = e
                .as_object()
                .ok_or("a prompt_logprobs entry is not an object")?;
            let first = m
                .values()
                .next()
                .and_then(|x| x.get("logprob"))
                .and_then(Value::as_f64)
                .ok_or("a prompt_logprobs entry has no logprob")?;
            out.push(first);
        }
        (out, "vLLM prompt_logprobs")
    } else {
        let tl = choice
            .get("logprobs")
            .and_then(|l| l.get("token_logprobs"))
            .and_then(Value::as_array)
            .ok_or("the response has no logprobs.token_logprobs: the engine returned no prompt log-probabilities for echo")?;
        let n = prompt_tokens
            .unwrap_or(tl.len().saturating_sub(1))
            .min(tl.len());
        let mut out = Vec::new();
        for (i, x) in tl.iter().take(n).enumerate() {
            match x {
                Value::Null if i == 0 => {}
                Value::Null => return Err(format!("prompt token {i} has no log-probability")),
                x => out.push(
                    x.as_f64()
                        .ok_or("a token log-probability is not a number")?,
                ),
            }
        }
        (out, "logprobs.token_logprobs with echo")
    };
    if lps.is_empty() {
        return Err("no prompt token has a log-probability".into());
    }
    let mean = -lps.iter().sum::<f64>() / lps.len() as f64;
    Ok(PerplexityProbe {
        text: text.to_string(),
        prompt_tokens: prompt_tokens.unwrap_or(lps.len() + 1),
        scored_tokens: lps.len(),
        mean_nll: mean,
        ppl: mean.exp(),
        source: source.into(),
    })
}

/// A recall case's prompt: filler words with the needle sentence at `depth`.
pub fn recall_prompt(words: usize, depth: f64, code: &str) -> String {
    let filler: Vec<&str> = FIXED_TEXT.split_whitespace().collect();
    let mut hay: Vec<String> = (0..words)
        .map(|i| filler[i % filler.len()].to_string())
        .collect();
    let at = ((words as f64) * depth.clamp(0.0, 1.0)).round() as usize;
    hay.insert(
        at.min(hay.len()),
        format!("\n\nThe secret pass code is {code}. Remember it.\n\n"),
    );
    format!(
        "Read the text below; somewhere in it is a secret pass code.\n\n{}\n\nWhat is the secret pass code? Answer with the number only.",
        hay.join(" ")
    )
}

/// What the probes send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeSpec<'a> {
    /// The text whose perplexity is measured, and its name.
    pub text: (&'a str, &'a str),
    /// Haystack lengths, words.
    pub recall_words: &'a [usize],
    /// Needle depths.
    pub recall_depths: &'a [f64],
}

impl Default for ProbeSpec<'static> {
    /// The fixed text whole; [`RECALL_WORDS`] × [`RECALL_DEPTHS`].
    fn default() -> Self {
        ProbeSpec {
            text: (FIXED_TEXT, FIXED_TEXT_NAME),
            recall_words: &RECALL_WORDS,
            recall_depths: &RECALL_DEPTHS,
        }
    }
}

/// Run both probes against `base` (e.g. `http://127.0.0.1:8000`) for `model`.
pub async fn run(base: &str, model: &str, timeout: Duration) -> QualityProbes {
    run_with(base, model, timeout, ProbeSpec::default()).await
}

/// [`run`] with chosen sizes.
pub async fn run_with(
    base: &str,
    model: &str,
    timeout: Duration,
    spec: ProbeSpec<'_>,
) -> QualityProbes {
    let mut out = QualityProbes::default();
    let http = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(h) => h,
        Err(e) => {
            out.notes.push(format!("no HTTP client: {e}"));
            return out;
        }
    };
    let (text, text_name) = spec.text;
    let body = json!({"model": model, "prompt": text, "max_tokens": 1, "temperature": 0,
        "echo": true, "logprobs": 0});
    let url = format!("{}/v1/completions", base.trim_end_matches('/'));
    match http.post(&url).json(&body).send().await {
        Ok(r) if r.status().is_success() => match r.json::<Value>().await {
            Ok(v) => match perplexity_from_response(&v, text_name) {
                Ok(p) => out.perplexity = Some(p),
                Err(e) => out.notes.push(format!("perplexity: {e}")),
            },
            Err(e) => out
                .notes
                .push(format!("perplexity: the response is not JSON: {e}")),
        },
        Ok(r) => {
            let status = r.status();
            let t = r.text().await.unwrap_or_default();
            out.notes.push(format!(
                "perplexity: the engine refused an echoed prompt with logprobs ({status}: {}); engines without prompt log-probabilities (llama.cpp's server) cannot give this figure",
                t.chars().take(200).collect::<String>()
            ));
        }
        Err(e) => out.notes.push(format!("perplexity: {e}")),
    }
    let mut cases = Vec::new();
    let chat = format!("{}/v1/chat/completions", base.trim_end_matches('/'));
    let mut n = 0u32;
    for &words in spec.recall_words {
        for &depth in spec.recall_depths {
            n += 1;
            let code = format!("{}", 4000 + (n * 7919) % 5000);
            let body = json!({"model": model, "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "user", "content": recall_prompt(words, depth, &code)}]});
            let answer = match http.post(&chat).json(&body).send().await {
                Ok(r) => match r.json::<Value>().await {
                    Ok(v) => v["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    Err(e) => format!("(not JSON: {e})"),
                },
                Err(e) => format!("(request failed: {e})"),
            };
            cases.push(RecallCase {
                haystack_words: words,
                depth,
                passed: answer.contains(&code),
                needle: code,
                answer: answer.chars().take(120).collect(),
            });
        }
    }
    let passed = cases.iter().filter(|c| c.passed).count();
    out.recall = Some(RecallProbe {
        pass_rate: passed as f64 / cases.len().max(1) as f64,
        cases,
    });
    out
}

/// Markdown lines for a report.
pub fn render_markdown(q: &QualityProbes) -> String {
    let mut o = String::from("### Quality probes\n\n");
    match &q.perplexity {
        Some(p) => o.push_str(&format!(
            "- perplexity of {}: {:.3} over {} tokens ({})\n",
            p.text, p.ppl, p.scored_tokens, p.source
        )),
        None => o.push_str("- perplexity: not measured\n"),
    }
    if let Some(r) = &q.recall {
        let words: std::collections::BTreeSet<usize> =
            r.cases.iter().map(|c| c.haystack_words).collect();
        o.push_str(&format!(
            "- exact recall (needle in a haystack, {} cases over {:?} words of filler, depths 10-90%): {:.0}% passed\n",
            r.cases.len(),
            words,
            100.0 * r.pass_rate
        ));
    }
    for n in &q.notes {
        o.push_str(&format!("- note: {n}\n"));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_from_echo_and_from_vllm_prompt_logprobs() {
        let v = json!({"choices": [{"logprobs": {"token_logprobs": [null, -1.0, -3.0, -0.5]}}],
            "usage": {"prompt_tokens": 3}});
        let p = perplexity_from_response(&v, "t").unwrap();
        // The completion token (the 4th) is not part of the prompt.
        assert_eq!(p.scored_tokens, 2);
        assert!((p.ppl - 2f64.exp()).abs() < 1e-12);
        let v = json!({"choices": [{"prompt_logprobs": [null, {"5": {"logprob": -2.0, "rank": 3}}, {"7": {"logprob": -4.0, "rank": 1}}]}]});
        let p = perplexity_from_response(&v, "t").unwrap();
        assert!((p.mean_nll - 3.0).abs() < 1e-12);
        assert!(
            perplexity_from_response(&json!({"choices": [{"text": "x"}]}), "t")
                .unwrap_err()
                .contains("no prompt log-probabilities")
        );
        let r = recall_prompt(20, 0.5, "1234");
        assert!(r.contains("pass code is 1234") && r.ends_with("number only."));
    }
}
