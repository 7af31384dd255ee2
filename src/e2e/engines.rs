//! Engines other than vLLM, and plain OpenAI-compatible servers: reaching them, reading the
//! facts they expose, and the conditions a user states for what they do not expose.
//!
//! - Health: `GET /health`, else `GET /v1/models` (quoting the status `/health` gave). A server
//!   that answers neither with 2xx is refused with both statuses; one that does not answer at
//!   all is an environment error (exit 1), never a command-line error.
//! - SGLang: `GET /get_server_info` (server args: `version`, `speculative_algorithm`,
//!   `speculative_num_steps`, `max_total_num_tokens`, `context_length`) and `sglang:` metrics.
//! - llama.cpp `llama-server`: `GET /props` (`build_info`, `default_generation_settings.n_ctx`,
//!   `total_slots`) and `GET /slots` (per slot `n_ctx`, `speculative`, `params["speculative.types"]`,
//!   `params["speculative.n_max"]`); per-request draft counts in the final chunk's `timings`
//!   (`draft_n`, `draft_n_accepted`). KV capacity: the slots' `n_ctx` summed (each slot has its
//!   own cache), or one slot's `n_ctx` when the log says `kv_unified = true` (every slot then
//!   reports the whole shared cache). `speculative: true` says speculation is on, not how:
//!   n-gram speculation (`--spec-type ngram-simple`) has no draft model; the method comes from
//!   `speculative.types`, the engine command or the user. See docs/engines/llama.cpp.md.
//! - Stated conditions (`--engine-version`, `--kv-capacity`, `--spec off|on`): used only where the
//!   engine exposes nothing, and marked "stated by the user"; an unknown condition is reported
//!   as unknown and does not invalidate a run (see `validity`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::bootlog::BootLog;
use super::client::EngineClient;
use super::conditions::{Sourced, SpecCondition, SpecState};
use super::metrics::RequestRecord;
use crate::diagnose::spec::{pool_requests, RequestSpec};

/// Conditions the user stated on the command line, for engines that do not expose them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stated {
    /// `--engine-version`.
    pub engine_version: Option<String>,
    /// `--kv-capacity` (tokens).
    pub kv_capacity: Option<u64>,
    /// `--spec on|off` (or `--spec-method none`): whether speculative decoding is on.
    pub spec: Option<bool>,
}

/// The source string of a stated condition.
pub fn stated(flag: &str) -> String {
    format!("stated by the user ({flag})")
}

/// What an engine's own endpoints say about it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineProbe {
    /// `sglang` or `llama.cpp`.
    pub name: Option<Sourced<String>>,
    /// Version or build.
    pub version: Option<Sourced<String>>,
    /// KV capacity in tokens.
    pub kv_capacity: Option<Sourced<u64>>,
    /// Speculative decoding on (`Some(true)`), off (`Some(false)`), with the source.
    pub spec_on: Option<Sourced<bool>>,
    /// Speculative method.
    pub spec_method: Option<Sourced<String>>,
    /// Speculative k.
    pub spec_k: Option<Sourced<u32>>,
    /// llama.cpp's slots: `n_ctx` of each, as `/slots` (or `/props`) gave them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slot_ctx: Vec<u64>,
    /// Where [`Self::slot_ctx`] was read (`/slots n_ctx`, `/props n_ctx and total_slots`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub slot_ctx_from: String,
    /// Why the KV capacity is unknown although the engine exposes its slots (llama.cpp with
    /// several slots and no log saying whether they share one cache), with both candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_capacity_unknown: Option<String>,
    /// The longest prompt + output one request may have, tokens (llama.cpp: a slot's `n_ctx`;
    /// SGLang: `context_length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

fn http() -> reqwest::Client {
    super::client::side_http()
}

async fn get(base: &str, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let r = http()
        .get(format!("{base}{path}"))
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| super::client::error_chain(&e))?;
    let status = r.status().as_u16();
    let body = super::client::read_body_limited(
        r,
        super::client::MAX_BODY_BYTES,
        false,
        &format!("GET {path}"),
    )
    .await?;
    Ok((status, body))
}

async fn get_json(base: &str, path: &str) -> Option<Value> {
    match get(base, path, Duration::from_secs(10)).await {
        Ok((s, body)) if (200..300).contains(&s) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// Whether the engine answers: `Ok(note)` when `/health` or, failing that, `/v1/models` gives
/// 2xx (the note says which, with the status `/health` gave); `Err(why)` otherwise, with
/// `unreachable` true when nothing answered at all.
pub async fn reach(base: &str, timeout: Duration) -> Result<String, (bool, String)> {
    let health = get(base, "/health", timeout).await;
    match &health {
        Ok((s, _)) if (200..300).contains(s) => return Ok(format!("GET /health answered {s}")),
        Err(e) => {
            return Err((
                true,
                format!("no engine answers at {base}: GET /health failed ({e})"),
            ))
        }
        Ok(_) => {}
    }
    let hs = health.as_ref().map(|h| h.0).unwrap_or(0);
    match get(base, "/v1/models", timeout).await {
        Ok((s, _)) if (200..300).contains(&s) => Ok(format!(
            "GET /health answered {hs}; GET /v1/models answered {s}, used as the health check"
        )),
        Ok((s, _)) if s == 401 || s == 403 => Err((
            false,
            format!(
                "the server at {base} refused rigbench: GET /v1/models answered {s}; {}",
                super::client::API_KEY_FIX
            ),
        )),
        Ok((s, _)) => Err((
            false,
            format!("the server at {base} is not ready: GET /health answered {hs}, GET /v1/models answered {s}"),
        )),
        Err(e) => Err((
            true,
            format!("GET /health answered {hs}, then GET /v1/models failed ({e})"),
        )),
    }
}

/// Whether the engine is up now (health or models), for polling during startup.
pub async fn healthy(client: &EngineClient, timeout: Duration) -> bool {
    client.health(timeout).await || reach(client.base(), timeout).await.is_ok()
}

/// Read SGLang's and llama.cpp's own endpoints (absent ones are skipped).
pub async fn probe(client: &EngineClient) -> EngineProbe {
    let base = client.base();
    let mut p = EngineProbe::default();
    if let Some(v) = get_json(base, "/get_server_info")
        .await
        .filter(Value::is_object)
    {
        apply_sglang(&mut p, &v);
        return p;
    }
    let props = get_json(base, "/props").await.filter(Value::is_object);
    let slots = get_json(base, "/slots").await.filter(Value::is_array);
    if props.is_some() || slots.is_some() {
        apply_llamacpp(&mut p, props.as_ref(), slots.as_ref());
    }
    p
}

/// SGLang's `/get_server_info` answer.
pub fn apply_sglang(p: &mut EngineProbe, v: &Value) {
    const SRC: &str = "/get_server_info";
    p.name = Some(Sourced::new("sglang".into(), SRC));
    if let Some(s) = v.get("version").and_then(Value::as_str) {
        p.version = Some(Sourced::new(s.to_string(), SRC));
    }
    let tokens = v
        .get("max_total_num_tokens")
        .and_then(Value::as_u64)
        .or_else(|| {
            v.pointer("/internal_states/0/max_total_num_tokens")
                .and_then(Value::as_u64)
        });
    if let Some(t) = tokens {
        p.kv_capacity = Some(Sourced::new(t, format!("{SRC} max_total_num_tokens")));
    }
    p.max_model_len = v.get("context_length").and_then(Value::as_u64);
    match v.get("speculative_algorithm") {
        Some(Value::String(m)) if !m.is_empty() && m != "None" => {
            p.spec_on = Some(Sourced::new(true, format!("{SRC} speculative_algorithm")));
            p.spec_method = Some(Sourced::new(m.clone(), SRC));
            if let Some(k) = v.get("speculative_num_steps").and_then(Value::as_u64) {
                p.spec_k = u32::try_from(k)
                    .ok()
                    .map(|k| Sourced::new(k, format!("{SRC} speculative_num_steps")));
            }
        }
        Some(Value::Null) | Some(Value::String(_)) => {
            p.spec_on = Some(Sourced::new(
                false,
                format!("{SRC} speculative_algorithm is none"),
            ));
        }
        _ => {}
    }
}

/// llama.cpp's `/props` and `/slots` answers.
pub fn apply_llamacpp(p: &mut EngineProbe, props: Option<&Value>, slots: Option<&Value>) {
    p.name = Some(Sourced::new(
        "llama.cpp".into(),
        if props.is_some() { "/props" } else { "/slots" },
    ));
    if let Some(b) = props
        .and_then(|v| v.get("build_info"))
        .and_then(Value::as_str)
    {
        p.version = Some(Sourced::new(b.to_string(), "/props build_info"));
    }
    let slot_list: Vec<&Value> = slots
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let ctx: Vec<u64> = slot_list
        .iter()
        .filter_map(|s| s.get("n_ctx").and_then(Value::as_u64))
        .collect();
    let props_ctx = props
        .and_then(|v| v.pointer("/default_generation_settings/n_ctx"))
        .and_then(Value::as_u64);
    p.max_model_len = ctx.iter().copied().max().or(props_ctx);
    if !ctx.is_empty() {
        p.slot_ctx = ctx;
        p.slot_ctx_from = "/slots n_ctx".into();
    } else if let (Some(n), Some(slots)) = (
        props_ctx,
        props
            .and_then(|v| v.get("total_slots"))
            .and_then(Value::as_u64),
    ) {
        p.slot_ctx = vec![n; slots as usize];
        p.slot_ctx_from = "/props n_ctx and total_slots".into();
    }
    llamacpp_capacity_until_the_log_says(p);
    let spec: Vec<bool> = slot_list
        .iter()
        .filter_map(|s| s.get("speculative").and_then(Value::as_bool))
        .collect();
    // The type in use: `params["speculative.types"]` of a slot, else of /props' defaults.
    let types = slot_list
        .iter()
        .find_map(|s| {
            s.pointer("/params/speculative.types")
                .and_then(Value::as_str)
                .map(|t| (t.to_string(), "/slots params speculative.types"))
        })
        .or_else(|| {
            props
                .and_then(|v| v.pointer("/default_generation_settings/params/speculative.types"))
                .and_then(Value::as_str)
                .map(|t| (t.to_string(), "/props params speculative.types"))
        });
    let typed = types
        .as_ref()
        .and_then(|(t, src)| super::adapters::llamacpp_spec_type(t).map(|m| (m, *src)));
    if !spec.is_empty() {
        let on = spec.iter().any(|x| *x);
        p.spec_on = Some(Sourced::new(on, "/slots speculative"));
        if on {
            // `speculative: true` says on, not how (n-gram speculation has no draft model).
            if let Some(((m, raw), src)) = &typed {
                p.spec_method = Some(Sourced::new(m.clone(), format!("{src} = {raw}")));
            }
            if let Some(k) = slot_list.iter().find_map(|s| {
                s.pointer("/params/speculative.n_max")
                    .and_then(Value::as_u64)
            }) {
                p.spec_k = u32::try_from(k).ok().map(|k| {
                    Sourced::new(k, "/slots params speculative.n_max (the most per step)")
                });
            }
        }
    } else if let Some(((m, raw), src)) = typed {
        p.spec_on = Some(Sourced::new(true, format!("{src} = {raw}")));
        p.spec_method = Some(Sourced::new(m, format!("{src} = {raw}")));
    }
}

fn describe_sum(ctx: &[u64]) -> String {
    if ctx.windows(2).all(|w| w[0] == w[1]) {
        format!(
            "{} × {}",
            ctx.len(),
            crate::output::table::thousands(ctx[0])
        )
    } else {
        ctx.iter()
            .map(|c| crate::output::table::thousands(*c))
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// A llama.cpp KV capacity from its slots' `n_ctx` before the log says how the slots hold
/// the cache. One slot: its `n_ctx` either way. Several: the capacity is unknown, never assumed,
/// because both layouts are the engine's default in some command (llama.cpp's
/// `tools/server/server.cpp`, `llama_server()`: without `-np` the server takes 4 slots sharing
/// one cache, `kv_unified = true`, and each slot reports the whole cache; with `-np N` it keeps
/// `common_params::kv_unified = false` (`common/common.h`), each slot holding `n_ctx / N`):
/// the sum of the slots' `n_ctx` is N times too high for the first, one slot's `n_ctx` N times
/// too low for the second. [`EngineProbe::kv_capacity_unknown`] says so with both figures.
fn llamacpp_capacity_until_the_log_says(p: &mut EngineProbe) {
    let ctx = &p.slot_ctx;
    match ctx.len() {
        0 => {}
        1 => {
            p.kv_capacity = Some(Sourced::new(
                ctx[0],
                format!("{} of the one slot", p.slot_ctx_from),
            ))
        }
        n => {
            let one = ctx.iter().copied().max().unwrap_or(0);
            let sum: u64 = ctx.iter().sum();
            p.kv_capacity = None;
            p.kv_capacity_unknown = Some(format!(
                "unknown: {} gives {n} slots ({}); that is {} tokens if the slots share one cache (kv_unified, llama-server's default without -np) or {} if each has its own (its default with -np N); only the engine log says which (give --engine-log, or state it with --kv-capacity)",
                p.slot_ctx_from,
                describe_sum(ctx),
                crate::output::table::thousands(one),
                crate::output::table::thousands(sum),
            ));
        }
    }
}

/// Apply llama.cpp's `kv_unified` (read from its log, see
/// [`super::adapters::llamacpp_kv_unified`]; `line` 1-based) to the slots' `n_ctx`: with a
/// unified cache every slot reports the whole shared cache as its `n_ctx`, so the capacity is
/// one slot's `n_ctx`; else each slot has its own cache and the capacity is their sum.
pub fn apply_kv_unified(p: &mut EngineProbe, unified: bool, line: usize) {
    let Some(max) = p.slot_ctx.iter().copied().max() else {
        return;
    };
    let from = &p.slot_ctx_from;
    p.kv_capacity = Some(if unified {
        Sourced::new(
            max,
            format!(
                "{from} of one slot: the {} slots share one cache (kv_unified = true, engine log line {line})",
                p.slot_ctx.len()
            ),
        )
    } else {
        Sourced::new(
            p.slot_ctx.iter().sum(),
            format!(
                "{from} summed over {} slot(s) ({}), one cache per slot (kv_unified = false, engine log line {line})",
                p.slot_ctx.len(),
                describe_sum(&p.slot_ctx)
            ),
        )
    });
    p.kv_capacity_unknown = None;
}

/// The engine probe completed by a second reading after a run. llama.cpp's `/slots` shows a
/// slot's speculative parameters (`speculative.types`, `speculative.n_max`) as of the last
/// request it served, so a reading before the first request can miss the method and k: what the
/// reading after the run says speculation is (on, its method, its k) fills what the first one
/// lacked, marked "after the run". Nothing else is taken from it.
pub fn with_after(mut before: EngineProbe, after: Option<&EngineProbe>) -> EngineProbe {
    let Some(a) = after else {
        return before;
    };
    let tag = |s: &Sourced<String>| {
        Sourced::new(
            s.value.clone(),
            format!("{} (read after the run)", s.source),
        )
    };
    if a.spec_on.as_ref().is_some_and(|s| s.value) {
        if !before.spec_on.as_ref().is_some_and(|s| s.value) {
            before.spec_on = a
                .spec_on
                .as_ref()
                .map(|s| Sourced::new(true, format!("{} (read after the run)", s.source)));
        }
        if before.spec_method.is_none() {
            before.spec_method = a.spec_method.as_ref().map(tag);
        }
        if before.spec_k.is_none() {
            before.spec_k = a
                .spec_k
                .as_ref()
                .map(|k| Sourced::new(k.value, format!("{} (read after the run)", k.source)));
        }
    }
    before
}

/// Fill a speculative-decoding condition that `/metrics` left unknown: from the requests'
/// per-request objects (newer vLLM's last SSE chunk, llama.cpp's `timings`), the engine's own
/// endpoints, the engine log (a drafter loaded, spec metrics lines, the config) or the user's
/// statement, in that order.
pub fn fill_spec(
    mut c: SpecCondition,
    requests: &[RequestRecord],
    probe: &EngineProbe,
    boot: Option<&BootLog>,
    stated_spec: Option<bool>,
) -> SpecCondition {
    if c.state != SpecState::Unknown {
        return c;
    }
    let reqs: Vec<RequestSpec> = requests.iter().filter_map(|r| r.spec.clone()).collect();
    if let Some(p) = pool_requests(&reqs).filter(|p| p.drafted > 0 || p.drafts.unwrap_or(0) > 0) {
        c.state = SpecState::On;
        c.evidence = format!(
            "per-request speculative metrics in the stream ({} requests)",
            reqs.len()
        );
        c.drafts = p.drafts;
        c.draft_tokens = Some(p.drafted);
        c.accepted_tokens = Some(p.accepted);
        c.acceptance_rate = p.acceptance_rate;
        c.mean_acceptance_length = p.mean_acceptance_length;
        if c.k.is_none() {
            c.k =
                p.k.map(|k| Sourced::new(k, p.k_source.unwrap_or_else(|| "stream".into())));
        }
        return c;
    }
    // What /metrics said when it could not decide (llama.cpp's counters at 0 drafts).
    let counters = (c.drafts == Some(0)).then(|| c.evidence.clone());
    let with_counters = |e: String| match &counters {
        Some(m) => format!("{e}; {m}"),
        None => e,
    };
    if let Some(on) = &probe.spec_on {
        c.state = if on.value {
            SpecState::On
        } else {
            SpecState::Off
        };
        c.evidence = with_counters(format!(
            "{} ({})",
            if on.value { "on" } else { "off" },
            on.source
        ));
        c.method = c.method.or_else(|| probe.spec_method.clone());
        c.k = c.k.or_else(|| probe.spec_k.clone());
        return c;
    }
    if let Some(b) = boot {
        if let Some(why) = b.spec_on() {
            c.state = SpecState::On;
            c.evidence = with_counters(format!("on: the engine log shows {why}"));
            if c.method.is_none() {
                c.method = b
                    .spec_config
                    .method
                    .clone()
                    .map(|m| Sourced::new(m, "engine log (config)"));
            }
            if c.k.is_none() {
                if let Some(p) = b.spec_pooled().filter(|p| p.k.is_some()) {
                    c.k = p.k.map(|k| {
                        Sourced::new(k, p.k_source.unwrap_or_else(|| "engine log".into()))
                    });
                } else if let Some(k) = b.spec_config.k {
                    c.k = Some(Sourced::new(k, "engine log (config)"));
                }
            }
            return c;
        }
        if let Some(l) = b.spec_config.off_line {
            c.state = SpecState::Off;
            c.evidence = with_counters(format!(
                "off: the engine log's configuration says none (line {l})"
            ));
            return c;
        }
    }
    if let Some(on) = stated_spec {
        c.state = if on { SpecState::On } else { SpecState::Off };
        c.evidence = with_counters(format!(
            "{}: {}",
            if on { "on" } else { "off" },
            stated("--spec")
        ));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_and_llamacpp_answers() {
        let mut p = EngineProbe::default();
        apply_sglang(
            &mut p,
            &serde_json::json!({"version": "0.4.6", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "max_total_num_tokens": 46611}),
        );
        assert_eq!(p.name.unwrap().value, "sglang");
        assert_eq!(p.kv_capacity.unwrap().value, 46611);
        assert_eq!(p.spec_k.unwrap().value, 3);
        let mut p = EngineProbe::default();
        apply_sglang(
            &mut p,
            &serde_json::json!({"version": "0.4.6", "speculative_algorithm": null}),
        );
        assert!(!p.spec_on.unwrap().value);
        let mut p = EngineProbe::default();
        apply_llamacpp(
            &mut p,
            Some(
                &serde_json::json!({"build_info": "b5462-a1b2c3d4", "total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}),
            ),
            Some(&serde_json::json!([
                {"id": 0, "n_ctx": 4096, "speculative": true, "params": {"speculative.n_max": 16}},
                {"id": 1, "n_ctx": 4096, "speculative": true, "params": {"speculative.n_max": 16}}
            ])),
        );
        assert_eq!(p.version.unwrap().value, "b5462-a1b2c3d4");
        // Two slots of 4,096 and no log: 4,096 (one shared cache) or 8,192 (one each).
        assert_eq!(p.kv_capacity, None);
        let why = p.kv_capacity_unknown.as_deref().unwrap();
        assert!(
            why.contains("4,096 tokens if the slots share one cache")
                && why.contains("8,192 if each has its own"),
            "{why}"
        );
        assert_eq!(p.spec_k.unwrap().value, 16);
    }

    #[test]
    fn llamacpp_real_slots_and_speculation_types() {
        // The real /slots of llama-server 0c1e57098 (-c 8192 -np 4): 4 × 2,048.
        let p =
            crate::real_fixture("engines/llama.cpp-0c1e57098/04_llama-server-0c1e57098_slots.json");
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let slots: Value = serde_json::from_str(&text).unwrap();
        let mut pr = EngineProbe::default();
        apply_llamacpp(&mut pr, None, Some(&slots));
        // No log: unknown (2,048 shared or 8,192 in four caches), never assumed.
        assert_eq!(pr.kv_capacity, None);
        assert!(pr.kv_capacity_unknown.is_some());
        assert_eq!(pr.max_model_len, Some(2048));
        assert!(!pr.spec_on.as_ref().unwrap().value);
        let mut unified = pr.clone();
        apply_kv_unified(&mut unified, true, 6);
        assert_eq!(unified.kv_capacity.as_ref().unwrap().value, 2048);
        apply_kv_unified(&mut pr, false, 6);
        assert_eq!(pr.kv_capacity.as_ref().unwrap().value, 8192);
        assert_eq!(pr.kv_capacity_unknown, None);
        // One slot: its n_ctx whatever the layout.
        let mut one = EngineProbe::default();
        apply_llamacpp(
            &mut one,
            None,
            Some(&serde_json::json!([{"id": 0, "n_ctx": 4096}])),
        );
        assert_eq!(one.kv_capacity.unwrap().value, 4096);
        assert!(pr
            .kv_capacity
            .unwrap()
            .source
            .contains("kv_unified = false, engine log line 6"));
        // speculative: true says on, not how; the type names the method.
        let spec = |types: &str| serde_json::json!([{"id": 0, "n_ctx": 4096, "speculative": true, "params": {"speculative.types": types, "speculative.n_max": 16}}]);
        let mut pr = EngineProbe::default();
        apply_llamacpp(&mut pr, None, Some(&spec("ngram-simple")));
        assert_eq!(pr.spec_method.as_ref().unwrap().value, "ngram");
        let mut pr = EngineProbe::default();
        apply_llamacpp(&mut pr, None, Some(&spec("none,draft-mtp")));
        assert_eq!(pr.spec_method.as_ref().unwrap().value, "mtp");
        let mut pr = EngineProbe::default();
        apply_llamacpp(&mut pr, None, Some(&spec("none")));
        assert!(pr.spec_on.unwrap().value);
        assert_eq!(pr.spec_method, None, "never guessed as a draft model");
        assert_eq!(pr.spec_k.unwrap().value, 16);
    }

    #[test]
    fn spec_from_log_stream_and_statement() {
        let unknown = SpecCondition {
            state: SpecState::Unknown,
            evidence: "no /metrics".into(),
            method: None,
            k: None,
            drafts: None,
            draft_tokens: None,
            accepted_tokens: None,
            acceptance_rate: None,
            mean_acceptance_length: None,
            per_position: Vec::new(),
        };
        let log = BootLog::parse(
            "(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:1] non-default args: {'speculative_config': {'method': 'mtp', 'num_speculative_tokens': 3}}\n",
        );
        let c = fill_spec(
            unknown.clone(),
            &[],
            &EngineProbe::default(),
            Some(&log),
            None,
        );
        assert_eq!(c.state, SpecState::On);
        assert_eq!(c.k.unwrap().value, 3);
        let r = RequestRecord {
            spec: Some(RequestSpec {
                drafts: Some(43),
                drafted: Some(129),
                accepted: Some(10),
                k: Some(3),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = fill_spec(unknown.clone(), &[r], &EngineProbe::default(), None, None);
        assert_eq!(
            (c.state, c.accepted_tokens, c.drafts),
            (SpecState::On, Some(10), Some(43))
        );
        let c = fill_spec(
            unknown.clone(),
            &[],
            &EngineProbe::default(),
            None,
            Some(false),
        );
        assert_eq!(c.state, SpecState::Off);
        assert!(c.evidence.contains("stated by the user"));
        assert_eq!(
            fill_spec(unknown, &[], &EngineProbe::default(), None, None).state,
            SpecState::Unknown
        );
    }
}
