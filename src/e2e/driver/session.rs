//! The session: reach or start the engine, probe it, choose the token counter, check
//! determinism, run the sweep, and record how it stopped.

use super::*;

/// Run a whole session. `on_update` is called after each sweep point with the results so far
/// (for incremental report writing). Ctrl-C (when enabled) or an engine failure ends the
/// session early with what was measured kept.
///
/// # Errors
/// The engine cannot be started or reached, or the workload cannot be prepared (bad lengths,
/// tokenizer failure). Failures during runs are recorded in the results instead.
pub async fn run_session(
    opts: &E2eOptions,
    stop: StopSignal,
    on_update: &mut (dyn FnMut(&E2eResults) + Send),
) -> anyhow::Result<E2eResults> {
    opts.suite
        .validate()
        .map_err(|m| anyhow::anyhow!("suite '{}': {m}", opts.suite.name))?;
    let mut results = E2eResults {
        suite: Some(opts.suite.clone()),
        engine: EngineSummary {
            kind: opts.engine.kind().to_string(),
            command: match &opts.engine {
                EngineChoice::Builtin { args, .. } => {
                    Some(format!("rigbench serve {}", args.join(" ")))
                }
                EngineChoice::Command { command, .. } => Some(command.clone()),
                EngineChoice::Url { .. } => None,
            },
            ..Default::default()
        },
        ..Default::default()
    };
    if opts.handle_ctrl_c {
        // SIGINT and SIGTERM (src/signals.rs): stop, stop the engine's process group, keep
        // what was measured; a second signal exits at once.
        crate::signals::install()?;
        let s = stop.clone();
        tokio::spawn(async move {
            crate::signals::wait().await;
            s.trigger(StopCause::Interrupted);
        });
    }
    // --engine-log: its boot now; what the engine writes during the session, at each read.
    let log_file = opts
        .engine_log
        .as_deref()
        .map(crate::e2e::bootlog::EngineLogFile::open)
        .transpose()?;
    let extra_log = log_file.as_ref().map(|f| f.boot().to_string());
    results.engine.env = match &opts.engine {
        EngineChoice::Builtin { .. } => crate::e2e::checks::kernel_env(None),
        EngineChoice::Command { command, .. } => crate::e2e::checks::kernel_env(Some(command)),
        EngineChoice::Url { .. } => Default::default(),
    };
    let mut engine = EngineHandle::start(&opts.engine, opts.startup_timeout, &stop).await?;
    results.engine.url = Some(engine.url.clone());
    let boot = boot_of(&engine, &extra_log);
    let client = EngineClient::with_idle_timeout(&engine.url, opts.pool_idle_timeout)?;
    let probe = probe_engine(&client, opts, &engine, &extra_log).await;
    let mut facts = engine_facts(&client, opts, &boot, &probe).await?;
    let counter = choose_counter(&client, opts, &facts, &mut results.notes).await?;
    // The tokens the engine adds around a prompt (chat template, BOS), measured once with the
    // suite's own settings, so prompt lengths can be checked against usage.prompt_tokens.
    facts.prompt_overhead = prompt_overhead(&client, opts, &facts, &counter).await;
    results.engine.facts = facts.clone();
    let cpu_backend = facts.runtime.as_ref().is_some_and(|r| r.is_cpu());
    let (power, energy_unknown) =
        match crate::e2e::energy::choose(&opts.power, &engine.url, cpu_backend) {
            Ok(p) => (Some(p), None),
            Err(why) => (None, Some(why)),
        };
    let session = Session {
        opts,
        client,
        facts,
        probe,
        counter,
        reset_told: std::sync::atomic::AtomicBool::new(false),
        power: std::sync::Mutex::new(power),
        energy_unknown,
        stop: stop.clone(),
        exec_cfg: ExecConfig {
            request_timeout: opts.request_timeout,
            duration: opts.suite.load.duration_s.map(Duration::from_secs_f64),
            connect_failure_limit: 3,
        },
    };
    on_update(&results);
    if opts.check_determinism {
        check_determinism(&session, &stop, &mut results).await;
        on_update(&results);
    }
    if opts.quality {
        if let Some(url) = results.engine.url.clone() {
            let q = crate::e2e::quality::run(&url, &session.model(), opts.request_timeout).await;
            if opts.progress {
                eprint!("{}", crate::e2e::quality::render_markdown(&q));
            }
            results.quality = Some(q);
            on_update(&results);
        }
    }
    run_sweep(&session, &engine, &log_file, &stop, &mut results, on_update).await;
    record_stop(&stop, &engine, &mut results).await;
    engine.stop().await;
    results.engine.exit = engine.exit_status();
    let boot = boot_of(&engine, &log_file.as_ref().map(|f| f.text_now()));
    results.engine_log = Some(engine.log_text()).filter(|t| !t.trim().is_empty());
    if let Some(f) = &log_file {
        let (run, how) = f.since_start();
        results
            .notes
            .push(format!("engine log (--engine-log) read: {how}"));
        results.engine_log_file = Some(how);
        if results.engine_log.is_none() {
            results.engine_log = Some(run).filter(|t| !t.trim().is_empty());
        }
    }
    results.boot_log = (!boot.is_empty()).then_some(boot);
    on_update(&results);
    Ok(results)
}

/// What the engine's endpoints say about it, completed from its logs (llama.cpp's unified KV
/// cache) and from the command that started it (speculative decoding).
pub(super) async fn probe_engine(
    client: &EngineClient,
    opts: &E2eOptions,
    engine: &EngineHandle,
    extra_log: &Option<String>,
) -> EngineProbe {
    let mut probe = crate::e2e::engines::probe(client).await;
    // llama.cpp: one cache shared by the slots, or one per slot (its log says which).
    // Each log alone, so the line number is that file's own.
    if !probe.slot_ctx.is_empty() {
        let unified = crate::e2e::adapters::llamacpp_kv_unified(&engine.log_text()).or_else(|| {
            extra_log
                .as_deref()
                .and_then(crate::e2e::adapters::llamacpp_kv_unified)
        });
        if let Some((unified, line)) = unified {
            crate::e2e::engines::apply_kv_unified(&mut probe, unified, line);
        }
    }
    // The command that started the engine says whether (and how) it speculates, where the
    // engine's endpoints do not.
    if let EngineChoice::Command { command, .. } = &opts.engine {
        if let Some(c) = crate::e2e::adapters::spec_from_command(command) {
            if probe.spec_on.is_none() && (c.off || c.method.is_some()) {
                let src = c
                    .method
                    .as_ref()
                    .map(|m| m.source.clone())
                    .unwrap_or_else(|| "engine command (--spec-type none)".into());
                probe.spec_on = Some(Sourced::new(!c.off, src));
            }
            if probe.spec_method.is_none() {
                probe.spec_method = c.method;
            }
        }
    }
    probe
}

/// The session's token counter: `--tokenizer` when given (the engine's POST /tokenize compared
/// with it on a probe text), else the engine's, else none; `notes` say which and why.
pub(super) async fn choose_counter(
    client: &EngineClient,
    opts: &E2eOptions,
    facts: &EngineFacts,
    notes: &mut Vec<String>,
) -> anyhow::Result<TokenCounter> {
    let engine_counter = facts.tokenize.then(|| TokenCounter::Engine {
        client: client.clone(),
        model: facts
            .model
            .as_ref()
            .map(|m| m.value.clone())
            .unwrap_or_default(),
        form: facts.tokenize_form.unwrap_or_default(),
    });
    // A tokenizer the user gives is the one used: it was asked for. The engine's own count of
    // a probe text is compared with it, so a mismatch is visible.
    let counter = if let Some(t) = &opts.tokenizer {
        let local = TokenCounter::local(t)?;
        notes.push(match &engine_counter {
            Some(e) => {
                const CHECK: &str = "The quick brown fox jumps over the lazy dog, 1234567890 times.";
                match (local.count(CHECK).await, e.count(CHECK).await) {
                    (Ok(Some(a)), Ok(Some(b))) if a == b => format!(
                        "token counts from --tokenizer (as asked); the engine's POST /tokenize agrees on a probe text ({a} tokens)"
                    ),
                    (Ok(Some(a)), Ok(Some(b))) => format!(
                        "token counts from --tokenizer (as asked); the engine's POST /tokenize DISAGREES on a probe text ({a} vs {b} tokens): --tokenizer may not be the served model's tokenizer"
                    ),
                    _ => "token counts from --tokenizer (as asked); the engine's POST /tokenize could not be compared".into(),
                }
            }
            None => format!(
                "token counts from --tokenizer; the engine's POST /tokenize is not used ({})",
                facts.tokenize_note.as_deref().unwrap_or("not available")
            ),
        });
        local
    } else if let Some(e) = engine_counter {
        e
    } else {
        notes.push(format!(
            "no usable POST /tokenize ({}) and no --tokenizer: prompt lengths are approximate; give --tokenizer PATH (the model's tokenizer.json) for exact lengths",
            facts.tokenize_note.as_deref().unwrap_or("not available")
        ));
        TokenCounter::None
    };
    if facts.tokenize && opts.tokenizer.is_none() {
        if let Some(form) = facts.tokenize_form {
            if form != facts.kind.tokenize_form() {
                notes.push(format!(
                    "the engine's POST /tokenize answers {} (not the form its kind takes)",
                    form.label()
                ));
            }
        }
    }
    Ok(counter)
}

/// `--check-determinism`, before the sweep: its result, or why it could not run, into the
/// results.
pub(super) async fn check_determinism(
    session: &Session<'_>,
    stop: &StopSignal,
    results: &mut E2eResults,
) {
    let opts = session.opts;
    let conc = opts
        .suite
        .load
        .concurrency
        .iter()
        .copied()
        .max()
        .unwrap_or(1);
    let n = (opts.suite.load.requests as usize).clamp(2, 8);
    match crate::e2e::checks::determinism_check(
        &session.client,
        &opts.suite,
        &session.counter,
        &session.model(),
        session.facts.max_model_len,
        n,
        conc.min(n as u32),
        &session.exec_cfg,
        stop,
        session.facts.kind,
    )
    .await
    {
        Ok(d) => {
            if opts.progress {
                eprintln!("{}", d.summary());
            }
            results.determinism = Some(d);
        }
        Err(e) => results
            .notes
            .push(format!("the determinism check could not run: {e:#}")),
    }
}

/// The sweep points in turn, each run's line on stderr; once the session is stopped or a point
/// fails, the points left are recorded as not run. `on_update` after each point.
pub(super) async fn run_sweep(
    session: &Session<'_>,
    engine: &EngineHandle,
    log_file: &Option<crate::e2e::bootlog::EngineLogFile>,
    stop: &StopSignal,
    results: &mut E2eResults,
    on_update: &mut (dyn FnMut(&E2eResults) + Send),
) {
    let opts = session.opts;
    if let Some(spec) = &opts.goodput_search {
        return super::search::run_search(
            session, spec, engine, log_file, stop, results, on_update,
        )
        .await;
    }
    let points = sweep(&opts.suite);
    for (i, point) in points.iter().enumerate() {
        if let Some(cause) = stop.cause() {
            for p in &points[i..] {
                results
                    .skipped
                    .push(format!("{}: not run ({})", p.label(), cause_text(&cause)));
            }
            break;
        }
        // The log as it is now: its boot and what the engine wrote during the session.
        let boot = boot_of(engine, &log_file.as_ref().map(|f| f.text_now()));
        // Plain lines on stderr, with or without a terminal (the bar needs one).
        eprintln!(
            "rigbench e2e: sweep point {}/{}: {} ({} requests)",
            i + 1,
            points.len(),
            point.label(),
            opts.suite.load.requests
        );
        match session.run_point(point, &boot).await {
            Ok(r) => {
                eprintln!("{}", one_line(&r));
                results.runs.push(r);
            }
            Err(e) => {
                // Was it the engine dying? Give its watcher a moment to say so (the message,
                // with the engine's exit and last log lines, is added below).
                let _ = engine.wait_exit(Duration::from_secs(2)).await;
                results.failure = Some(format!("{}: {e:#}", point.label()));
                for p in &points[i + 1..] {
                    results.skipped.push(format!(
                        "{}: not run (the previous point failed)",
                        p.label()
                    ));
                }
                on_update(results);
                break;
            }
        }
        on_update(results);
    }
}

/// Why the session stopped, into the results: interrupted, or the engine's failure added to
/// the failure (with the engine's exit and last log lines when its process ended).
pub(super) async fn record_stop(
    stop: &StopSignal,
    engine: &EngineHandle,
    results: &mut E2eResults,
) {
    match stop.cause() {
        Some(StopCause::Interrupted) => results.interrupted = true,
        Some(StopCause::EngineFailed(m)) => match &mut results.failure {
            // The requests may notice a dead engine (transport failures) before its watcher
            // does; the first cause wins the stop, so add the exit here when it comes.
            _ if !m.contains("the engine process") => {
                let m = match engine.wait_exit(Duration::from_secs(2)).await {
                    Some(desc) => format!(
                        "{m}; the engine process {desc} (last log lines: {})",
                        engine.log_tail(10)
                    ),
                    None => m,
                };
                match &mut results.failure {
                    Some(f) if !f.contains(&m) => f.push_str(&format!(" (engine: {m})")),
                    Some(_) => {}
                    None => results.failure = Some(m),
                }
            }
            // A point that failed because the engine died: say so, with the engine's words.
            Some(f) if !f.contains(&m) => f.push_str(&format!(" (engine: {m})")),
            Some(_) => {}
            None => results.failure = Some(m),
        },
        None => {}
    }
}

/// The engine's log: the captured one, or the `--engine-log` file when nothing was captured
/// (or only the file states a KV capacity). Each is parsed alone, so line numbers are the
/// file's own.
pub(super) fn boot_of(engine: &EngineHandle, extra: &Option<String>) -> BootLog {
    let captured = BootLog::parse(&engine.log_text());
    match extra {
        Some(x) => {
            let file = BootLog::parse(x);
            if captured.is_empty()
                || (captured.kv_capacity().is_none() && file.kv_capacity().is_some())
            {
                file
            } else {
                captured
            }
        }
        None => captured,
    }
}

pub(super) fn cause_text(c: &StopCause) -> String {
    match c {
        StopCause::Interrupted => "interrupted".into(),
        StopCause::EngineFailed(m) => format!("engine failed: {m}"),
    }
}

pub(super) fn one_line(r: &RunResult) -> String {
    let verdict = if r.validity.valid {
        "valid".to_string()
    } else {
        format!(
            "INVALID: {}",
            r.validity
                .reasons
                .iter()
                .chain(r.validity.missing_conditions.iter().map(|m| m as &String))
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let ms = |p: &Option<crate::e2e::metrics::Percentiles>| {
        p.as_ref()
            .map(|p| format!("{:.1} ms", p.p50 * 1e3))
            .unwrap_or_else(|| "n/a".into())
    };
    match r.presented_throughput() {
        Some(t) => format!(
            "{:>14}: {:.1} output tok/s, {:.2} req/s, TTFT p50 {}, TPOT p50 {} ({verdict})",
            r.label,
            t.output_tok_per_s,
            t.requests_per_s,
            ms(&r.latency.ttft),
            ms(&r.latency.tpot)
        ),
        None => format!("{:>14}: {verdict}", r.label),
    }
}
