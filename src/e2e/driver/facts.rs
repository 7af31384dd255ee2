//! What the engine says of itself: name and version, metric names, served models, its log's
//! facts; `/metrics` scrapes; the chat template's prompt overhead; the progress bar.

use super::*;

/// Engine name and version from `/version`, the metric names, `/v1/models` and the log.
pub(super) async fn engine_facts(
    client: &EngineClient,
    opts: &E2eOptions,
    boot: &BootLog,
    probe: &EngineProbe,
) -> anyhow::Result<EngineFacts> {
    let mut f = EngineFacts::default();
    let version: Option<Value> = match client.version().await {
        Ok(v) => v,
        Err(e) => {
            let why = format!("{e:#}");
            eprintln!(
                "rigbench e2e: {why}; the engine's name and version come from its other answers"
            );
            f.side_notes.push(why);
            None
        }
    };
    if let Some(v) = &version {
        if let Some(n) = v
            .get("engine")
            .or_else(|| v.get("name"))
            .and_then(Value::as_str)
        {
            f.name = Some(Sourced::new(n.to_string(), "/version"));
        }
        if let Some(n) = v.get("version").and_then(Value::as_str) {
            f.version = Some(Sourced::new(n.to_string(), "/version"));
        }
    }
    f.runtime = version
        .as_ref()
        .and_then(crate::e2e::runtime_facts::from_version);
    // An engine that refuses rigbench (401/403: it wants an API key) would fail every request:
    // stop here with the fix.
    let models = match client.models().await {
        Ok(m) => m,
        Err(e) if format!("{e:#}").contains(crate::e2e::client::API_KEY_FIX) => return Err(e),
        Err(e) => {
            let why = format!("{e:#}");
            eprintln!("rigbench e2e: {why}; the served model is not read from it");
            f.side_notes.push(why);
            Vec::new()
        }
    };
    let metrics = match client.metrics().await {
        Ok(m) => m,
        Err(e) => {
            f.metrics_note = Some(format!("{e:#}"));
            None
        }
    };
    f.metrics = metrics.is_some();
    if f.name.is_none() {
        let prefix = metrics
            .as_ref()
            .and_then(crate::diagnose::scrape::engine_of);
        let owned = models
            .first()
            .and_then(|m| m.1.clone())
            .filter(|o| !o.is_empty() && o != "organization-owner");
        f.name = match (prefix, owned) {
            (_, Some(o)) => Some(Sourced::new(o, "/v1/models owned_by")),
            (Some(p), None) => Some(Sourced::new(p, "/metrics name prefix")),
            _ => None,
        };
    }
    // Engines without /version: their own endpoints, the log, or the user's statement.
    if f.name.as_ref().is_none_or(|n| n.source != "/version") {
        f.name = probe.name.clone().or(f.name);
    }
    f.name = f.name.or_else(|| {
        boot.engine
            .clone()
            .map(|e| Sourced::new(e, "engine log (line forms)"))
    });
    f.version = f.version.or_else(|| probe.version.clone());
    f.version = version_with_log(f.version.take(), boot);
    if f.version.is_none() {
        if let Some(v) = &opts.stated.engine_version {
            f.version = Some(Sourced::new(v.clone(), stated("--engine-version")));
        }
    }
    f.model = match &opts.served_model {
        Some(m) => Some(Sourced::new(m.clone(), "stated (--served-model-name)")),
        None => models
            .first()
            .map(|m| Sourced::new(m.0.clone(), "/v1/models")),
    };
    speculative_facts(&mut f, version.as_ref(), opts, boot, probe);
    f.kind = f
        .name
        .as_ref()
        .map(|n| EngineKind::from_name(&n.value))
        .unwrap_or_default();
    probe_tokenizer(client, &mut f).await;
    f.max_model_len = f.max_model_len.or(probe.max_model_len);
    Ok(f)
}

/// The speculative method and k: the engine's own word (`/version`, its log) first, then what
/// rigbench passed to its own engine, then a statement.
fn speculative_facts(
    f: &mut EngineFacts,
    version: Option<&Value>,
    opts: &E2eOptions,
    boot: &BootLog,
    probe: &EngineProbe,
) {
    // `rigbench serve` states its speculative configuration in /version.
    let version_spec = version
        .and_then(|v| v.get("speculative"))
        .filter(|s| s.is_object());
    let version_method = version_spec
        .and_then(|s| s.get("method"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let version_k = version_spec
        .and_then(|s| s.get("num_speculative_tokens"))
        .and_then(Value::as_u64)
        .map(|k| k as u32);
    // Speculative method: what rigbench passed to its own engine, the engine's log, or stated.
    let builtin = matches!(opts.engine, EngineChoice::Builtin { .. });
    // Speculative config: the engine's own word (/version, its log) first, then what rigbench
    // passed to its own engine, then a statement.
    let command_spec = match &opts.engine {
        EngineChoice::Command { command, .. } => crate::e2e::adapters::spec_from_command(command),
        _ => None,
    };
    f.spec_method = if let Some(m) = version_method {
        Some(Sourced::new(m, "/version"))
    } else if let Some(m) = probe.spec_method.clone() {
        Some(m)
    } else if let Some(m) = command_spec.as_ref().and_then(|c| c.method.clone()) {
        Some(m)
    } else if let Some(m) = &boot.spec_method {
        Some(Sourced::new(m.clone(), "engine log (config)"))
    } else {
        opts.spec_method.as_ref().map(|m| {
            Sourced::new(
                m.clone(),
                if builtin {
                    "passed to rigbench serve"
                } else {
                    "stated (--spec-method), not verified"
                },
            )
        })
    };
    f.spec_k = if let Some(k) = version_k {
        Some(Sourced::new(k, "/version"))
    } else if let Some(k) = probe.spec_k.clone() {
        Some(k)
    } else if let Some(k) = command_spec.as_ref().and_then(|c| c.k.clone()) {
        Some(k)
    } else if let Some(k) = boot.spec_k {
        Some(Sourced::new(k, "engine log (config)"))
    } else {
        opts.spec_k.map(|k| {
            Sourced::new(
                k,
                if builtin {
                    "passed to rigbench serve"
                } else {
                    "stated (--spec-k), not verified"
                },
            )
        })
    };
}

/// The engine's tokenizer, in the body its kind takes (then the other one, for an engine of
/// unknown kind). Counting nothing for a non-empty text is a failure, never a length of 0.
async fn probe_tokenizer(client: &EngineClient, f: &mut EngineFacts) {
    const PROBE_TEXT: &str = "rigbench counts the tokens of this sentence.";
    let model = f
        .model
        .as_ref()
        .map(|m| m.value.clone())
        .unwrap_or_default();
    let mut forms = vec![f.kind.tokenize_form()];
    forms.extend(f.kind.fallback_tokenize_form());
    let mut failures = Vec::new();
    for form in forms {
        match client.tokenize_as(form, &model, PROBE_TEXT).await {
            Ok(Some(t)) => {
                f.tokenize = true;
                f.tokenize_form = Some(form);
                f.max_model_len = t.max_model_len;
                break;
            }
            Ok(None) => {
                failures.push("the engine has no POST /tokenize (404)".to_string());
                break;
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    if !f.tokenize {
        f.tokenize_note = Some(failures.join("; "));
    }
}

/// One scrape during a run; a failure (a stalled or oversized `/metrics`) is kept in `polls`
/// with its reason, not taken for "no /metrics".
pub(super) async fn scrape_into(
    client: &EngineClient,
    polls: &mut PollStats,
) -> Option<Exposition> {
    match client.metrics().await {
        Ok(e) => e,
        Err(e) => {
            polls.note_failure(format!("{e:#}"));
            None
        }
    }
}

/// The prompt tokens the engine adds around a prompt text (chat template, BOS): one
/// non-streaming request with the suite's API, thinking setting and a short probe text
/// (`max_tokens` 1), its `usage.prompt_tokens` minus `counter`'s count of the text. `None`
/// without a tokenizer or when the engine reports no prompt count.
pub(super) async fn prompt_overhead(
    client: &EngineClient,
    opts: &E2eOptions,
    facts: &EngineFacts,
    counter: &TokenCounter,
) -> Option<Sourced<i64>> {
    const TEXT: &str = "[probe] Count the tokens of this short message, please.";
    let counted = counter.count(TEXT).await.ok().flatten()?;
    let s = &opts.suite;
    let req = GenRequest {
        api: s.workload.api,
        model: facts
            .model
            .as_ref()
            .map(|m| m.value.clone())
            .unwrap_or_else(|| "default".into()),
        prompt: TEXT.to_string(),
        max_tokens: 1,
        ignore_eos: false,
        temperature: 0.0,
        seed: s.sampling.seed,
        thinking: if s.workload.api == Api::Chat {
            s.sampling.thinking
        } else {
            None
        },
    };
    let reported = client.prompt_tokens_of(&req).await.ok().flatten()?;
    Some(Sourced::new(
        reported as i64 - counted as i64,
        format!(
            "measured: a probe {} request counted {reported} prompt tokens for a {counted}-token text ({})",
            match s.workload.api {
                Api::Chat => "chat",
                Api::Completions => "completions",
            },
            counter.source().map_or("no tokenizer", |t| t.label())
        ),
    ))
}

/// One scrape at the start or the end of a run, timed and counted into `polls`.
pub(super) async fn timed_scrape(
    client: &EngineClient,
    polls: &mut PollStats,
) -> Option<Exposition> {
    let t = std::time::Instant::now();
    let e = scrape_into(client, polls).await;
    polls.timed(t.elapsed());
    if let Some(x) = &e {
        polls.add(x);
    }
    e
}

pub(super) fn progress_bar(enabled: bool, n: usize, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>14} [{bar:30}] {pos}/{len} requests {elapsed_precise} {msg}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(label.to_string());
    pb
}

/// Whether two spellings of an engine's version name the same build: llama.cpp's `/props`
/// `b1-0c1e57098` and its log's `b1 (0c1e57098)` (the same digits and letters, in order).
fn same_build(a: &str, b: &str) -> bool {
    let key = |s: &str| -> String { s.chars().filter(char::is_ascii_alphanumeric).collect() };
    key(a) == key(b)
}

/// The engine's version line in its log (llama.cpp `common_params_print_info: build N (hash)`,
/// vLLM's banner): the version where the endpoints gave none, else checked against theirs and
/// cited (agreeing, or naming another build).
fn version_with_log(
    mut version: Option<Sourced<String>>,
    boot: &BootLog,
) -> Option<Sourced<String>> {
    let Some(lv) = &boot.engine_version else {
        return version;
    };
    let line = boot
        .engine_version_line
        .map(|n| format!("engine log line {n}"))
        .unwrap_or_else(|| "engine log".into());
    match &mut version {
        None => version = Some(Sourced::new(lv.clone(), line)),
        Some(v) => {
            let check = if same_build(&v.value, lv) {
                format!("the {line} agrees ({lv})")
            } else {
                format!("the {line} says {lv}: the log is of another build than the engine that answers")
            };
            v.source = format!("{}; {check}", v.source);
        }
    }
    version
}
