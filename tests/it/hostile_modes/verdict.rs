//! Sessions and verdicts: one session per mode under a wall-clock bound, and its judgement.

use super::*;

pub(super) fn suite() -> Suite {
    let text = format!(
        "name = 'hostile-modes'\n[workload]\nkind = 'fixed'\ninput_tokens = 16\noutput_tokens = {OUTPUT_TOKENS}\nignore_eos = true\n[load]\nrequests = {REQUESTS}\nwarmup = 0\nconcurrency = [2]\n[sampling]\nthinking = false\n"
    );
    Suite::from_toml(&text, Path::new("hostile-modes.toml")).unwrap()
}

/// How a session ended.
pub(super) enum Ended {
    /// `run_session` returned results (rendered and serialized without a panic).
    Results(Box<E2eResults>),
    /// `run_session` returned an error.
    Error(String),
    /// Something in rigbench panicked.
    Panic(String),
    /// Not over within `SESSION_BOUND`.
    Hang,
}

pub(super) async fn run_mode(mode: Mode) -> (Ended, Arc<Stats>, Duration) {
    let stats = Arc::new(Stats::default());
    let (url, server) = start_mock(mode, stats.clone()).await;
    let mut o = E2eOptions::with_suite(suite());
    o.engine = EngineChoice::Url { url };
    o.progress = false;
    o.handle_ctrl_c = false;
    o.metrics_interval = Duration::from_millis(50);
    o.request_timeout = REQUEST_TIMEOUT;
    let t = Instant::now();
    // run_session's future is not `Send` (it holds a watch guard across an await), so each
    // session runs on a thread of its own with its own runtime, as `rigbench report` runs one
    // (`run_blocking`): a panic ends that thread, not the test; a hang is seen from here.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(async {
            tokio::time::timeout(
                SESSION_BOUND,
                run_session(&o, StopSignal::new(), &mut |_| {}),
            )
            .await
        });
        if let Ok(Ok(r)) = &r {
            // What a report does with the results must not panic either.
            assert!(!rigbench::e2e::render_markdown(r).is_empty());
            serde_json::to_string(r).expect("the results serialize");
        }
        let _ = tx.send(r);
        rt.shutdown_background();
    });
    let ended = match tokio::time::timeout(SESSION_BOUND + Duration::from_secs(10), rx).await {
        // Not even the session's own timeout fired: the thread is left behind.
        Err(_) | Ok(Ok(Err(_))) => Ended::Hang,
        Ok(Err(_)) => {
            let msg = match thread.join() {
                Err(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic without a message".into()),
                Ok(()) => "the session thread ended without a result".into(),
            };
            Ended::Panic(msg)
        }
        Ok(Ok(Ok(Err(e)))) => Ended::Error(format!("{e:#}")),
        Ok(Ok(Ok(Ok(r)))) => Ended::Results(Box::new(r)),
    };
    let took = t.elapsed();
    server.abort();
    (ended, stats, took)
}

/// Flags of a completed request that say its output is not what was asked (all 6 tokens of a
/// `Works` mode arrived, so none of them is true there).
pub(super) const OUTPUT_PROBLEMS: [&str; 4] = ["empty", "truncated", "degenerate", "no text"];

pub(super) fn short(s: &str, n: usize) -> String {
    let one_line = s.replace('\n', "\\n");
    if one_line.chars().count() <= n {
        one_line
    } else {
        format!("{}…", one_line.chars().take(n).collect::<String>())
    }
}

/// The observed outcome in words, and what is wrong with it for `case` (empty: as expected).
pub(super) fn judge(case: &Case, ended: &Ended, stats: &Stats) -> (String, Vec<String>) {
    let mut bad = Vec::new();
    let r = match ended {
        Ended::Results(r) => r,
        Ended::Error(e) => {
            return (
                format!("session error: {}", short(e, 110)),
                vec![format!(
                    "run_session returned an error, no per-request records: {e}"
                )],
            )
        }
        Ended::Panic(m) => {
            return (
                format!("PANIC: {}", short(m, 110)),
                vec![format!("panic: {m}")],
            )
        }
        Ended::Hang => {
            return (
                "HANG".into(),
                vec![format!("the session did not end within {SESSION_BOUND:?}")],
            )
        }
    };
    let streams = stats.streams.load(Ordering::SeqCst);
    if streams < REQUESTS {
        bad.push(format!(
            "the mock answered {streams} streamed requests, fewer than the {REQUESTS} sent: the fault was not exercised"
        ));
    }
    if r.runs.len() != 1 {
        bad.push(format!(
            "{} runs (failure: {:?}, skipped: {:?})",
            r.runs.len(),
            r.failure,
            r.skipped
        ));
        return (format!("{} runs: {:?}", r.runs.len(), r.failure), bad);
    }
    let run = &r.runs[0];
    let reqs = &run.requests;
    if reqs.len() != REQUESTS {
        bad.push(format!("{} request records, not {REQUESTS}", reqs.len()));
    }
    // Never a throughput figure for an invalid run, whatever the mode.
    if !run.validity.valid && (run.throughput.is_some() || run.presented_throughput().is_some()) {
        bad.push("an invalid run carries a presented throughput".into());
    }
    for q in reqs {
        if let Some(e) = &q.error {
            if e.len() > 4096 {
                bad.push(format!(
                    "request {}: a {}-byte reason (unbounded engine text)",
                    q.index,
                    e.len()
                ));
            }
        }
    }
    let ok = reqs.iter().filter(|q| q.ok).count();
    let first_err = reqs.iter().find_map(|q| q.error.as_deref()).unwrap_or("");
    let observed = match case.expect {
        Works => {
            let tokens: Vec<String> = reqs
                .iter()
                .map(|q| q.output_tokens.map_or("-".into(), |n| n.to_string()))
                .collect();
            let flags: Vec<&String> = reqs.iter().flat_map(|q| q.flags.iter()).collect();
            let problem_flags: Vec<&&String> = flags
                .iter()
                .filter(|f| OUTPUT_PROBLEMS.iter().any(|p| f.starts_with(p)))
                .collect();
            for q in reqs {
                if !q.ok {
                    bad.push(format!(
                        "request {} failed: {}",
                        q.index,
                        q.error.as_deref().unwrap_or("(no reason)")
                    ));
                } else if q.output_tokens != Some(OUTPUT_TOKENS as u64) {
                    bad.push(format!(
                        "request {}: {:?} output tokens, not {OUTPUT_TOKENS}",
                        q.index, q.output_tokens
                    ));
                }
            }
            if let Some(f) = problem_flags.first() {
                bad.push(format!(
                    "{} output problem flag(s), e.g. '{f}'",
                    problem_flags.len()
                ));
            }
            // The run may carry notes, or even a reason that names something odd but harmless
            // (an unknown finish_reason); it must not call complete outputs failed, empty,
            // truncated or shorter than asked.
            for reason in &run.validity.reasons {
                let l = reason.to_lowercase();
                if [
                    "failed",
                    "empty",
                    "truncated",
                    "shorter",
                    "degenerate",
                    "no visible text",
                ]
                .iter()
                .any(|w| l.contains(w))
                {
                    bad.push(format!("the run is judged invalid for: {reason}"));
                }
            }
            let mut s = format!("{ok}/{} ok, tokens [{}]", reqs.len(), tokens.join(","));
            if let Some(f) = problem_flags.first() {
                s.push_str(&format!("; flag '{}'", short(f, 70)));
            } else if !first_err.is_empty() {
                s.push_str(&format!("; '{}'", short(first_err, 80)));
            }
            s
        }
        Fails(needle) => {
            for q in reqs {
                let e = q.error.as_deref().unwrap_or("");
                if q.ok {
                    let flags = q.flags.join("; ");
                    bad.push(format!(
                        "request {} recorded ok ({:?} tokens, flags: [{flags}]); expected failed with '{needle}'",
                        q.index, q.output_tokens
                    ));
                } else if e.trim().is_empty() {
                    bad.push(format!("request {} failed without a reason", q.index));
                } else if !e.to_lowercase().contains(needle) {
                    bad.push(format!(
                        "request {}: reason '{}' lacks '{needle}'",
                        q.index,
                        short(e, 300)
                    ));
                }
            }
            if run.validity.valid || run.presented_throughput().is_some() {
                bad.push("the run is presented as valid throughput".into());
            }
            if ok < reqs.len()
                && !run
                    .validity
                    .reasons
                    .iter()
                    .any(|x| x.contains("requests failed"))
            {
                bad.push(format!(
                    "the run's reasons do not count the failed requests: {:?}",
                    run.validity.reasons
                ));
            }
            if ok > 0 {
                let q = reqs.iter().find(|q| q.ok).unwrap();
                let verdict = match run.validity.reasons.first() {
                    Some(reason) => format!("run invalid: '{}'", short(reason, 70)),
                    None if run.validity.valid => "run VALID, throughput presented".to_string(),
                    None => "run invalid for missing conditions only".to_string(),
                };
                format!(
                    "{ok}/{} recorded ok ({:?} tokens from {:?}; flags [{}]); {verdict}",
                    reqs.len(),
                    q.output_tokens,
                    q.token_source,
                    short(&q.flags.join("; "), 70)
                )
            } else {
                format!(
                    "{}/{} failed: '{}'",
                    reqs.len(),
                    reqs.len(),
                    short(first_err, 100)
                )
            }
        }
    };
    let mut observed = observed;
    if let HugeErrorBody = case.mode {
        let sent = stats.max_body_written.load(Ordering::SeqCst);
        observed.push_str(&format!(
            "; the mock wrote at most {:.1} MiB of its 1 GiB body",
            sent as f64 / f64::from(1 << 20)
        ));
        if sent >= 64 << 20 {
            bad.push(format!(
                "the mock wrote {sent} bytes of the 1 GiB error body: not cut off at rigbench's 64 KiB limit"
            ));
        }
    }
    (observed, bad)
}
