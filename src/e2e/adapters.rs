//! Per-engine adapters: what differs between vLLM, llama.cpp's `llama-server`, SGLang,
//! TensorRT-LLM's `trtllm-serve` and `rigbench serve`, chosen once per session from what the
//! engine says about itself (`/version`, `/props`, `/get_server_info`, the `/metrics` name
//! prefix, `/v1/models` `owned_by`, or its log's line forms). docs/engines/ has one page per
//! engine: what rigbench reads from it, and what it cannot know.
//!
//! | what | vLLM, SGLang, rigbench | llama.cpp |
//! |---|---|---|
//! | tokenize | `POST /tokenize {"model", "prompt"}` → `count` | `POST /tokenize {"content"}` → `tokens` (vLLM's form gets `200 {"tokens": []}`) |
//! | KV capacity | `/metrics` `cache_config_info` (vLLM), `/get_server_info` (SGLang) | `/slots` n_ctx × slots (per-slot caches) or one slot's n_ctx (`kv_unified`), `/props` |
//! | prefix-cache counters | `vllm:prefix_cache_{queries,hits}` (tokens) | `llamacpp:prompt_tokens_cached` (hits) and `llamacpp:prompt_tokens` (prompt tokens not cached) |
//! | speculative method | `/metrics`, `--speculative-config`, log | `/slots` `params["speculative.types"]`, `--spec-type`, `-md` |
//!
//! A tokenization that fails, or counts 0 tokens for a non-empty text, is an error, never a
//! length of 0.

use serde::{Deserialize, Serialize};

use super::client::TokenizeForm;
use super::conditions::{delta, Sourced};
use crate::diagnose::prometheus::Exposition;

/// The engine a session drives, as far as rigbench adapts to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// vLLM.
    Vllm,
    /// llama.cpp's `llama-server`.
    LlamaCpp,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM's `trtllm-serve`.
    TensorRtLlm,
    /// The built-in runtime, `rigbench serve`.
    Rigbench,
    /// Any other OpenAI-compatible server.
    #[default]
    Generic,
}

impl EngineKind {
    /// The kind an engine name stands for (`vllm`, `llama.cpp`, `llamacpp`, `sglang`,
    /// `tensorrt_llm`, `trtllm`, `rigbench`; case-insensitive), [`EngineKind::Generic`] for
    /// anything else.
    pub fn from_name(name: &str) -> Self {
        let n = name.to_ascii_lowercase();
        if n.contains("llama.cpp") || n.contains("llamacpp") || n.contains("llama-server") {
            EngineKind::LlamaCpp
        } else if n.contains("vllm") {
            EngineKind::Vllm
        } else if n.contains("sglang") {
            EngineKind::Sglang
        } else if n.contains("tensorrt") || n.contains("trtllm") || n.contains("trt-llm") {
            EngineKind::TensorRtLlm
        } else if n.contains("rigbench") {
            EngineKind::Rigbench
        } else {
            EngineKind::Generic
        }
    }

    /// The `POST /tokenize` body this engine takes.
    pub fn tokenize_form(self) -> TokenizeForm {
        match self {
            EngineKind::LlamaCpp => TokenizeForm::LlamaCpp,
            _ => TokenizeForm::Vllm,
        }
    }

    /// The endpoint that empties the prefix cache: SGLang's `/flush_cache`, everyone else's
    /// (vLLM, `rigbench serve`) `/reset_prefix_cache`; llama.cpp offers none (404).
    pub fn reset_path(self) -> &'static str {
        match self {
            EngineKind::Sglang => "/flush_cache",
            _ => "/reset_prefix_cache",
        }
    }

    /// Per-request fields that keep a request out of the engine's prompt cache, where the
    /// engine offers such a switch: llama.cpp's `cache_prompt: false` (llama-server's request
    /// parameter, default `true`: `tools/server/server-task.cpp`,
    /// `params_from_json_cmpl`). vLLM and SGLang have none per request (their caches are
    /// emptied with [`EngineKind::reset_path`] instead).
    pub fn uncached_request_fields(self) -> Option<serde_json::Value> {
        match self {
            EngineKind::LlamaCpp => Some(serde_json::json!({"cache_prompt": false})),
            _ => None,
        }
    }

    /// The other body to try when this one counts nothing (an engine of unknown kind).
    pub fn fallback_tokenize_form(self) -> Option<TokenizeForm> {
        match self {
            EngineKind::Generic | EngineKind::Sglang | EngineKind::TensorRtLlm => {
                Some(TokenizeForm::LlamaCpp)
            }
            _ => None,
        }
    }
}

/// Prefix-cache counter deltas over a run, in tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheCounts {
    /// Prompt tokens looked up in the cache (cached + computed).
    pub queries: Option<u64>,
    /// Prompt tokens served from the cache.
    pub hits: u64,
    /// The counters read.
    pub source: &'static str,
}

/// The prefix-cache counters of whichever engine wrote the scrapes: vLLM's
/// `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` (tokens), else llama.cpp's
/// `llamacpp:prompt_tokens_cached` (hits; help text "Number of prompt tokens reused from the
/// cache") with `llamacpp:prompt_tokens` ("Number of prompt tokens processed, excluding cached
/// tokens"), so queries = processed + cached. `None` when neither engine's counters are on both
/// scrapes (or one went backwards: a restart).
pub fn prefix_cache_counts(
    before: Option<&Exposition>,
    after: Option<&Exposition>,
) -> Option<CacheCounts> {
    let d = |n: &str| delta(before, after, n).map(|x| x.round() as u64);
    if let Some(h) = d("vllm:prefix_cache_hits") {
        return Some(CacheCounts {
            queries: d("vllm:prefix_cache_queries"),
            hits: h,
            source: "vllm:prefix_cache_hits / vllm:prefix_cache_queries",
        });
    }
    if let Some(h) = d("llamacpp:prompt_tokens_cached") {
        return Some(CacheCounts {
            queries: d("llamacpp:prompt_tokens").map(|p| p + h),
            hits: h,
            source: "llamacpp:prompt_tokens_cached / (llamacpp:prompt_tokens + cached)",
        });
    }
    None
}

/// The speculative method in the field's names (ARCHITECTURE.md: mtp, ngram, draft model, eagle)
/// for an engine's own spelling: vLLM `ngram`, `eagle3`, `deepseek_mtp`, `draft_model`; SGLang
/// `EAGLE`, `NEXTN`; llama.cpp `ngram-simple`, `draft-simple`, `draft-mtp`. `None` for "none" /
/// empty; an unknown name is kept as written.
pub fn normalize_spec_method(raw: &str) -> Option<String> {
    let r = raw.trim().trim_matches(|c| c == '"' || c == '\'');
    let l = r.to_ascii_lowercase();
    if l.is_empty() || l == "none" || l == "off" || l == "null" {
        return None;
    }
    Some(
        if l.contains("ngram") || l.contains("lookup") || l.contains("prompt_lookup") {
            "ngram"
        } else if l.contains("mtp") || l == "nextn" {
            "mtp"
        } else if l.contains("eagle") {
            "eagle"
        } else if l.contains("draft") {
            "draft model"
        } else {
            r
        }
        .to_string(),
    )
}

/// llama.cpp's `params["speculative.types"]` (on `/slots` and `/props`): a comma-separated list
/// whose last entry is the type in use (`none`, `ngram-simple`, `draft-simple`, `none,draft-mtp`).
/// `(method, raw type)`, `None` for `none`.
pub fn llamacpp_spec_type(types: &str) -> Option<(String, String)> {
    let last = types
        .split(',')
        .map(str::trim)
        .rfind(|t| !t.is_empty() && *t != "none")?;
    Some((normalize_spec_method(last)?, last.to_string()))
}

/// A speculative configuration read from the command that started the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    /// Method, normalized ([`normalize_spec_method`]).
    pub method: Option<Sourced<String>>,
    /// k, when the command states it.
    pub k: Option<Sourced<u32>>,
    /// The command says speculation is off (`--spec-type none`).
    pub off: bool,
}

/// Read the speculative configuration from an engine command line (`--engine-cmd`): llama.cpp
/// `--spec-type T`, `-md`/`--model-draft` (a draft model), `--draft-max N` / `--spec-draft-n-max N`;
/// vLLM `--speculative-config '{"method": …, "num_speculative_tokens": N}'` (or
/// `--speculative_config`, `--speculative-config.method M`); SGLang `--speculative-algorithm A`,
/// `--speculative-num-steps N`. `None` when the command says nothing about it.
pub fn spec_from_command(cmd: &str) -> Option<CommandSpec> {
    let words = shell_words(cmd);
    let value = |names: &[&str]| -> Option<(String, String)> {
        for (i, w) in words.iter().enumerate() {
            for n in names {
                if w == n {
                    if let Some(v) = words.get(i + 1) {
                        return Some((n.to_string(), v.clone()));
                    }
                } else if let Some(v) = w.strip_prefix(&format!("{n}=")) {
                    return Some((n.to_string(), v.to_string()));
                }
            }
        }
        None
    };
    let src = |flag: &str, v: &str| format!("engine command ({flag} {v})");
    let mut out = CommandSpec {
        method: None,
        k: None,
        off: false,
    };
    // llama.cpp
    if let Some((f, v)) = value(&["--spec-type"]) {
        match llamacpp_spec_type(&v) {
            Some((m, _)) => out.method = Some(Sourced::new(m, src(&f, &v))),
            None => out.off = true,
        }
    }
    if out.method.is_none() {
        if let Some((f, v)) = value(&["-md", "--model-draft", "--hf-repo-draft", "-hfd"]) {
            out.method = Some(Sourced::new("draft model".into(), src(&f, &v)));
        }
    }
    if let Some((f, v)) = value(&[
        "--draft-max",
        "--draft",
        "--draft-n",
        "--spec-draft-n-max",
        "--speculative-num-steps",
        "--num-speculative-tokens",
    ]) {
        if let Ok(k) = v.parse::<u32>() {
            out.k = Some(Sourced::new(k, src(&f, &v)));
        }
    }
    // vLLM
    if let Some((f, v)) = value(&["--speculative-config", "--speculative_config", "-sc"]) {
        let j: Option<serde_json::Value> = serde_json::from_str(&v).ok();
        let method = j
            .as_ref()
            .and_then(|j| j.get("method").or_else(|| j.get("model")))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        if let Some(m) = method.as_deref().and_then(|m| {
            // `{"model": "path/to/drafter"}` without a method: a draft model.
            if j.as_ref().is_some_and(|j| j.get("method").is_none()) {
                Some("draft model".to_string())
            } else {
                normalize_spec_method(m)
            }
        }) {
            out.method = Some(Sourced::new(m, format!("engine command ({f})")));
        }
        if let Some(k) = j
            .as_ref()
            .and_then(|j| j.get("num_speculative_tokens"))
            .and_then(serde_json::Value::as_u64)
            .and_then(|k| u32::try_from(k).ok())
        {
            out.k = Some(Sourced::new(k, format!("engine command ({f})")));
        }
    }
    if let Some((f, v)) = value(&["--speculative-config.method"]) {
        if let Some(m) = normalize_spec_method(&v) {
            out.method = Some(Sourced::new(m, src(&f, &v)));
        }
    }
    if let Some((f, v)) = value(&["--speculative-config.num_speculative_tokens"]) {
        if let Ok(k) = v.parse::<u32>() {
            out.k = Some(Sourced::new(k, src(&f, &v)));
        }
    }
    // SGLang
    if let Some((f, v)) = value(&["--speculative-algorithm", "--speculative-algo"]) {
        if let Some(m) = normalize_spec_method(&v) {
            out.method = Some(Sourced::new(m, src(&f, &v)));
        }
    }
    (out.method.is_some() || out.k.is_some() || out.off).then_some(out)
}

/// Split a command line into words the way `sh` would for plain quoting (`'…'`, `"…"`,
/// backslash escapes outside single quotes); enough to read flags, not a shell.
fn shell_words(cmd: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut chars = cmd.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                has = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    cur.push(d);
                }
            }
            '"' => {
                has = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                cur.push(e);
                            }
                        }
                        _ => cur.push(d),
                    }
                }
            }
            '\\' => {
                if let Some(e) = chars.next() {
                    cur.push(e);
                    has = true;
                }
            }
            c if c.is_whitespace() => {
                if has || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            c => cur.push(c),
        }
    }
    if has || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// llama.cpp's `kv_unified` as its log states it (`load_model: initializing, n_slots = 4,
/// n_ctx_slot = 2048, kv_unified = 'false'`, or `llama_context: kv_unified = false`): `(value,
/// 1-based line)` of the last statement. With a unified cache every slot reports the whole
/// context as its `n_ctx`, so the capacity is one slot's `n_ctx`, not the sum. A reading of
/// this one value, kept here; everything else in the log is `crate::diagnose::log`'s.
pub fn llamacpp_kv_unified(log: &str) -> Option<(bool, usize)> {
    let mut found = None;
    for (i, line) in log.lines().enumerate() {
        let Some(pos) = line.find("kv_unified") else {
            continue;
        };
        let rest = line[pos + "kv_unified".len()..]
            .trim_start()
            .trim_start_matches(['=', ':'])
            .trim_start()
            .trim_start_matches(['\'', '"']);
        if rest.starts_with("true") || rest.starts_with('1') {
            found = Some((true, i + 1));
        } else if rest.starts_with("false") || rest.starts_with('0') {
            found = Some((false, i + 1));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_from_names() {
        for (n, k) in [
            ("vllm", EngineKind::Vllm),
            ("llama.cpp", EngineKind::LlamaCpp),
            ("llamacpp", EngineKind::LlamaCpp),
            ("SGLang", EngineKind::Sglang),
            ("tensorrt_llm", EngineKind::TensorRtLlm),
            ("rigbench", EngineKind::Rigbench),
            ("organization-owner", EngineKind::Generic),
        ] {
            assert_eq!(EngineKind::from_name(n), k, "{n}");
        }
        assert_eq!(EngineKind::LlamaCpp.tokenize_form(), TokenizeForm::LlamaCpp);
        assert_eq!(EngineKind::Vllm.tokenize_form(), TokenizeForm::Vllm);
        assert_eq!(EngineKind::Vllm.fallback_tokenize_form(), None);
        assert_eq!(
            EngineKind::Generic.fallback_tokenize_form(),
            Some(TokenizeForm::LlamaCpp)
        );
    }

    #[test]
    fn spec_methods_in_the_fields_names() {
        for (raw, m) in [
            ("ngram-simple", Some("ngram")),
            ("ngram", Some("ngram")),
            ("draft-simple", Some("draft model")),
            ("draft_model", Some("draft model")),
            ("draft-mtp", Some("mtp")),
            ("deepseek_mtp", Some("mtp")),
            ("EAGLE", Some("eagle")),
            ("eagle3", Some("eagle")),
            ("medusa", Some("medusa")),
            ("none", None),
            ("", None),
        ] {
            assert_eq!(normalize_spec_method(raw).as_deref(), m, "{raw}");
        }
        assert_eq!(
            llamacpp_spec_type("none,draft-mtp"),
            Some(("mtp".into(), "draft-mtp".into()))
        );
        assert_eq!(
            llamacpp_spec_type("ngram-simple"),
            Some(("ngram".into(), "ngram-simple".into()))
        );
        assert_eq!(llamacpp_spec_type("none"), None);
    }

    #[test]
    fn spec_from_engine_commands() {
        let c = spec_from_command(
            "llama-server -m m.gguf -c 8192 -np 4 --metrics --spec-type ngram-simple --port 8084",
        )
        .unwrap();
        assert_eq!(c.method.as_ref().unwrap().value, "ngram");
        assert!(c
            .method
            .unwrap()
            .source
            .contains("--spec-type ngram-simple"));
        let c = spec_from_command("llama-server -m big.gguf -md small.gguf --draft-max 8").unwrap();
        assert_eq!(c.method.unwrap().value, "draft model");
        assert_eq!(c.k.unwrap().value, 8);
        let c = spec_from_command("llama-server --spec-type=none").unwrap();
        assert!(c.off && c.method.is_none());
        let c = spec_from_command(
            r#"vllm serve Qwen/Qwen3-8B --speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'"#,
        )
        .unwrap();
        assert_eq!(
            (c.method.unwrap().value, c.k.unwrap().value),
            ("ngram".to_string(), 3)
        );
        let c = spec_from_command(
            r#"VLLM_USE_V1=1 vllm serve m --speculative_config "{\"model\": \"/d\", \"num_speculative_tokens\": 5}""#,
        )
        .unwrap();
        assert_eq!(
            (c.method.unwrap().value, c.k.unwrap().value),
            ("draft model".to_string(), 5)
        );
        let c = spec_from_command(
            "python -m sglang.launch_server --speculative-algorithm EAGLE --speculative-num-steps 3",
        )
        .unwrap();
        assert_eq!(
            (c.method.unwrap().value, c.k.unwrap().value),
            ("eagle".to_string(), 3)
        );
        assert!(spec_from_command("vllm serve m --port 8000").is_none());
    }

    #[test]
    fn kv_unified_from_the_log() {
        let log = "0.00.004.059 I srv  llama_server: initializing ...\n\
                   0.00.719.151 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'\n";
        assert_eq!(llamacpp_kv_unified(log), Some((false, 2)));
        let log = "llama_context: kv_unified    = true\n";
        assert_eq!(llamacpp_kv_unified(log), Some((true, 1)));
        assert_eq!(llamacpp_kv_unified("nothing here\n"), None);
    }

    #[test]
    fn cache_counters_of_both_engines() {
        let b = Exposition::parse(
            "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40\n",
        );
        let a = Exposition::parse(
            "vllm:prefix_cache_queries_total 372\nvllm:prefix_cache_hits_total 296\n",
        );
        let c = prefix_cache_counts(Some(&b), Some(&a)).unwrap();
        assert_eq!((c.queries, c.hits), (Some(272), 256));
        // llama.cpp: the real scrapes of a spec-ngram server at boot and after 4 requests.
        let dir = engines_fixture("llama.cpp-0c1e57098");
        let read = |f: &str| {
            let p = dir.join(f);
            Exposition::parse(
                &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
            )
        };
        let boot = read("08_llama-server-0c1e57098_spec-ngram-simple_metrics_boot.prom");
        let after =
            read("09_llama-server-0c1e57098_spec-ngram-simple_metrics_after-4-requests.prom");
        let c = prefix_cache_counts(Some(&boot), Some(&after)).unwrap();
        assert_eq!((c.queries, c.hits), (Some(88), 30));
        assert!(c.source.starts_with("llamacpp:"));
        // No counters on either side: unknown, never 0.
        let plain = Exposition::parse("other 1\n");
        assert!(prefix_cache_counts(Some(&plain), Some(&plain)).is_none());
        assert!(prefix_cache_counts(None, Some(&after)).is_none());
    }

    /// `tests/fixtures/real/engines/<engine>` in the checkout.
    fn engines_fixture(engine: &str) -> std::path::PathBuf {
        crate::real_fixture(&format!("engines/{engine}"))
    }
}
