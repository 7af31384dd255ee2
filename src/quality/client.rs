//! One side of a comparison through its OpenAI-compatible API: its tokenization of the corpus
//! (`POST /tokenize`, vLLM's form, which `rigbench serve` also answers), the teacher-forced
//! top-k log-probabilities (`POST /v1/completions` with the token ids as the prompt and
//! `prompt_logprobs`, else `echo` + `logprobs`), and the task pack's answers
//! (`POST /v1/chat/completions`, one request at a time, timed).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::corpus::Document;
use super::logprobs::{self, Position, Source};
use super::tasks::{self, Item};

/// How a task item is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// Temperature 0.
    Greedy,
    /// Temperature 0.7, top-p 0.95, seed `base + item index` (the same seed at both ends).
    Seeded,
}

/// One way of running the task pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    /// `chat_template_kwargs.enable_thinking` (models without a thinking switch ignore it).
    pub thinking: bool,
    /// Greedy or seeded sampling.
    pub sampling: Sampling,
}

impl Variant {
    /// `think-off/greedy`, ...
    pub fn label(&self) -> String {
        format!(
            "think-{}/{}",
            if self.thinking { "on" } else { "off" },
            match self.sampling {
                Sampling::Greedy => "greedy",
                Sampling::Seeded => "seeded",
            }
        )
    }
}

/// What a run sends.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// Cap on corpus positions (all documents together) and on task items per variant.
    pub limit: Option<usize>,
    /// Alternatives per position (at least 1; engines cap it: vLLM's and `rigbench serve`'s
    /// `--max-logprobs`, default 20).
    pub top_k: usize,
    /// Task pack variants.
    pub variants: Vec<Variant>,
    /// Seed base of seeded sampling.
    pub seed: u64,
    /// Output tokens of a thinking-off answer.
    pub max_tokens_off: u32,
    /// Of a thinking-on answer (its reasoning included).
    pub max_tokens_on: u32,
    /// Per request.
    pub timeout: Duration,
    /// Run the task pack (off for the noise floor's second reference run).
    pub tasks: bool,
}

/// One side to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// `reference`, `candidate-1`, ... or a name given.
    pub label: String,
    /// How it was reached or started, in words (`url`, `command`, `builtin --quantize fp8`).
    pub how: String,
    /// Base URL.
    pub url: String,
    /// Model name sent (`None`: the first of `/v1/models`).
    pub model: Option<String>,
}

/// One document's teacher-forced positions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DocScores {
    /// The document's name.
    pub name: String,
    /// The token ids sent (the side's own tokenization, cut to the limit).
    pub ids: Vec<u32>,
    /// Per position 1.. the log-probabilities.
    pub positions: Vec<Position>,
    /// Where they came from.
    pub source: Source,
}

/// One task item's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    /// Item id.
    pub id: String,
    /// Variant label.
    pub variant: String,
    /// Exactly right.
    pub passed: bool,
    /// The answer's content (first 300 characters; reasoning fields left out).
    pub reply: String,
    /// Output tokens the engine counted (`usage.completion_tokens`).
    pub completion_tokens: Option<u64>,
    /// Wall time of the request, seconds.
    pub seconds: f64,
}

/// A side's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideRun {
    /// The side.
    pub side: Side,
    /// The model name used.
    pub model: String,
    /// The corpus, scored.
    pub docs: Vec<DocScores>,
    /// The task pack's answers.
    pub tasks: Vec<TaskOutcome>,
}

/// A side's HTTP client.
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// For `base` (e.g. `http://127.0.0.1:8000`), each request limited to `timeout`; the API
    /// key of `e2e`'s client (`--api-key`, `VLLM_API_KEY`) is sent when set.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(k) = crate::e2e::client::api_key() {
            let v = reqwest::header::HeaderValue::from_str(&format!("Bearer {k}"))
                .context("the API key is not a valid header value")?;
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .default_headers(headers)
                .build()?,
            base: base.trim_end_matches('/').to_string(),
        })
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let r = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = r.status();
        let text = r
            .text()
            .await
            .with_context(|| format!("POST {url}: reading the answer"))?;
        if !status.is_success() {
            bail!(
                "POST {url} answered {status}: {}",
                text.chars().take(300).collect::<String>()
            );
        }
        serde_json::from_str(&text).with_context(|| format!("POST {url}: the answer is not JSON"))
    }

    /// The first model `/v1/models` lists.
    ///
    /// # Errors
    /// The request failed or the list is empty.
    pub async fn first_model(&self) -> anyhow::Result<String> {
        let url = format!("{}/v1/models", self.base);
        let v: Value = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?
            .json()
            .await
            .with_context(|| format!("GET {url}: not JSON"))?;
        v.pointer("/data/0/id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .with_context(|| format!("GET {url} lists no model; pass the model name"))
    }

    /// The side's token ids of `doc`: a text with its special tokens (as a completions prompt
    /// is encoded), a chat rendered by its template without a generation prompt.
    ///
    /// # Errors
    /// No `/tokenize` (then the tokenizers cannot be asserted equal), or a bad answer.
    pub async fn tokenize(&self, model: &str, doc: &Document) -> anyhow::Result<Vec<u32>> {
        let body = match doc {
            Document::Text { text, .. } => {
                json!({"model": model, "prompt": text, "add_special_tokens": true})
            }
            Document::Chat { messages, .. } => {
                json!({"model": model, "messages": messages, "add_generation_prompt": false})
            }
        };
        let v = self.post("/tokenize", &body).await.with_context(|| {
            format!("tokenizing `{}` (the quality comparison needs vLLM's POST /tokenize to assert both sides tokenize the corpus alike)", doc.name())
        })?;
        v.get("tokens")
            .and_then(Value::as_array)
            .context("POST /tokenize answered without `tokens`")?
            .iter()
            .map(|t| {
                t.as_u64()
                    .map(|t| t as u32)
                    .context("a token id of /tokenize is not a whole number")
            })
            .collect()
    }

    /// Teacher-force `ids` and read `k` alternatives per position.
    ///
    /// # Errors
    /// The engine gives neither `prompt_logprobs` nor echoed log-probabilities.
    pub async fn score(
        &self,
        model: &str,
        ids: &[u32],
        k: usize,
    ) -> anyhow::Result<(Vec<Position>, Source)> {
        let body = json!({"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": k});
        let first = self.post("/v1/completions", &body).await;
        let v = match first {
            Ok(v) if has_prompt_logprobs(&v) => v,
            // OpenAI-style engines: echo the prompt with its log-probabilities.
            first => {
                let body = json!({"model": model, "prompt": ids, "max_tokens": 1,
                    "temperature": 0, "echo": true, "logprobs": k});
                let cap = match &first {
                    Err(e)
                        if k > crate::runtime::serve_guard::DEFAULT_MAX_LOGPROBS
                            && format!("{e:#}").contains("logprobs") =>
                    {
                        format!(
                            "; the first request (prompt_logprobs: {k}) was answered `{e:#}`: if the engine caps the alternatives, start it with --max-logprobs {k} or more (vLLM, rigbench serve; both default to {}), or give a smaller --top-k",
                            crate::runtime::serve_guard::DEFAULT_MAX_LOGPROBS
                        )
                    }
                    _ => String::new(),
                };
                self.post("/v1/completions", &body).await.with_context(|| {
                    format!("the engine gave no prompt log-probabilities (neither vLLM's prompt_logprobs nor completions echo + logprobs){cap}")
                })?
            }
        };
        logprobs::from_response(&v, ids, k).map_err(anyhow::Error::msg)
    }

    /// Ask `item` once in `variant`; `index` picks the seed of seeded sampling.
    ///
    /// # Errors
    /// The request failed (an answer that is wrong is not an error).
    pub async fn ask(
        &self,
        model: &str,
        item: &Item,
        variant: Variant,
        index: usize,
        spec: &RunSpec,
    ) -> anyhow::Result<TaskOutcome> {
        let mut body = json!({"model": model,
            "messages": [{"role": "user", "content": item.prompt}],
            "max_tokens": if variant.thinking { spec.max_tokens_on } else { spec.max_tokens_off },
            "chat_template_kwargs": {"enable_thinking": variant.thinking}});
        match variant.sampling {
            Sampling::Greedy => body["temperature"] = json!(0),
            Sampling::Seeded => {
                body["temperature"] = json!(0.7);
                body["top_p"] = json!(0.95);
                body["seed"] = json!(spec.seed.wrapping_add(index as u64) & 0x7fff_ffff);
            }
        }
        let t0 = Instant::now();
        let v = self.post("/v1/chat/completions", &body).await?;
        let seconds = t0.elapsed().as_secs_f64();
        let content = v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or("");
        Ok(TaskOutcome {
            id: item.id.clone(),
            variant: variant.label(),
            passed: tasks::check(item, content),
            reply: content.chars().take(300).collect(),
            completion_tokens: v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64),
            seconds,
        })
    }
}

fn has_prompt_logprobs(v: &Value) -> bool {
    v.pointer("/choices/0/prompt_logprobs")
        .or_else(|| v.get("prompt_logprobs"))
        .is_some_and(Value::is_array)
}

/// Measure one side: the corpus (cut to the limit), then, when `spec.tasks`, the task pack in
/// every variant. `progress` gets a line per document and per variant.
///
/// # Errors
/// The side cannot be reached, cannot tokenize or cannot give log-probabilities; a failed task
/// request (the answers are not guessed).
pub async fn run_side(
    side: &Side,
    docs: &[Document],
    items: &[Item],
    spec: &RunSpec,
    progress: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<SideRun> {
    let c = Client::new(&side.url, spec.timeout)?;
    let model = match &side.model {
        Some(m) => m.clone(),
        None => c.first_model().await?,
    };
    let mut budget = spec.limit.unwrap_or(usize::MAX);
    let mut scored = Vec::new();
    for d in docs {
        if budget == 0 {
            break;
        }
        let mut ids = c.tokenize(&model, d).await?;
        ids.truncate(budget.saturating_add(1));
        if ids.len() < 2 {
            continue;
        }
        budget -= ids.len() - 1;
        progress(&format!(
            "{}: {} ({} positions)",
            side.label,
            d.name(),
            ids.len() - 1
        ));
        let (positions, source) = c
            .score(&model, &ids, spec.top_k)
            .await
            .with_context(|| format!("{} ({}): scoring `{}`", side.label, side.url, d.name()))?;
        scored.push(DocScores {
            name: d.name().to_string(),
            ids,
            positions,
            source,
        });
    }
    let mut outcomes = Vec::new();
    if spec.tasks {
        let n = spec.limit.unwrap_or(items.len()).min(items.len());
        for v in &spec.variants {
            progress(&format!(
                "{}: task pack {} ({n} items)",
                side.label,
                v.label()
            ));
            for (i, it) in items.iter().take(n).enumerate() {
                outcomes.push(c.ask(&model, it, *v, i, spec).await.with_context(|| {
                    format!("{} ({}): task item {}", side.label, side.url, it.id)
                })?);
            }
        }
    }
    Ok(SideRun {
        side: side.clone(),
        model,
        docs: scored,
        tasks: outcomes,
    })
}
