//! One sweep point: warm-up, unique prompts, the cache temperature, the load between two
//! `/metrics` scrapes, and its result with conditions and validity.

use super::*;

pub(super) struct Session<'a> {
    pub(super) opts: &'a E2eOptions,
    pub(super) client: EngineClient,
    pub(super) facts: EngineFacts,
    pub(super) probe: EngineProbe,
    pub(super) counter: TokenCounter,
    pub(super) stop: StopSignal,
    pub(super) exec_cfg: ExecConfig,
    /// The prefix-cache reset was reported (once per session).
    pub(super) reset_told: std::sync::atomic::AtomicBool,
    /// The power source sampled across each measured window (docs/energy.md), between windows.
    pub(super) power: std::sync::Mutex<Option<Box<dyn crate::e2e::energy::PowerSource>>>,
    /// Why there is no power source.
    pub(super) energy_unknown: Option<String>,
}

/// What rigbench did to the engine's prefix cache, said once, after the first sweep point's
/// `POST /reset_prefix_cache` answered: emptied (2xx), refused, or not offered (404/405/501: then
/// nothing was emptied, and cold runs rest on the salted prompts).
pub fn reset_message(
    url: &str,
    path: &str,
    reset: Option<bool>,
    points: usize,
    cache: CacheTemp,
) -> String {
    let points = crate::output::table::plural(points as u64, "sweep point", "sweep points");
    match reset {
        Some(true) => format!(
            "POST {url}{path} emptied the engine's prefix cache; rigbench empties it before each of the {points}{}",
            if cache == CacheTemp::Warm {
                " (warm runs then prime it again)"
            } else {
                " (cold runs then check the hit counters)"
            }
        ),
        Some(false) => format!(
            "POST {url}{path} was refused: the engine's prefix cache was NOT emptied; cold runs rest on prompts salted per run and on the hit counters"
        ),
        None => format!(
            "the engine offers no POST {url}{path}: its prefix cache is not emptied; cold runs rest on prompts salted per run (and on the hit counters, where the engine has them)"
        ),
    }
}

/// A sweep point made ready to measure ([`Session::set_up_point`]).
struct PointSetup {
    /// Warm-up requests sent.
    warm_n: usize,
    /// The trace replay's plan, when the point replays a trace.
    trace_plan: Option<crate::e2e::trace_replay::ReplayPlan>,
    /// The unique prompts (empty for a trace replay).
    prepared: Arc<Vec<PreparedRequest>>,
    /// What `POST /reset_prefix_cache` did ([`reset_message`]).
    reset: Option<bool>,
}

impl Session<'_> {
    /// Say what the first reset did (engines rigbench did not build: `--engine-cmd`, `--url`).
    pub(super) fn tell_reset(&self, reset: Option<bool>) {
        if self
            .reset_told
            .swap(true, std::sync::atomic::Ordering::SeqCst)
            || matches!(self.opts.engine, EngineChoice::Builtin { .. })
        {
            return;
        }
        let l = &self.opts.suite.load;
        let points = match l.mode {
            crate::e2e::workload::LoadMode::Closed => l.concurrency.len(),
            crate::e2e::workload::LoadMode::Open => l.rates.len(),
        };
        eprintln!(
            "rigbench e2e: {}",
            crate::output::redact::Redactor::for_this_host(true).secrets_only(&reset_message(
                self.client.base(),
                self.facts.kind.reset_path(),
                reset,
                points,
                l.cache
            ))
        );
    }

    pub(super) fn model(&self) -> String {
        self.facts
            .model
            .as_ref()
            .map(|m| m.value.clone())
            .unwrap_or_else(|| "default".into())
    }

    pub(super) async fn run_point(
        &self,
        point: &LoadPoint,
        boot: &BootLog,
    ) -> anyhow::Result<RunResult> {
        let suite = &self.opts.suite;
        let model = self.model();
        let PointSetup {
            warm_n,
            trace_plan,
            prepared,
            reset,
        } = self.set_up_point(point, &model).await?;
        let PointRun {
            outcome:
                ExecOutcome {
                    records,
                    duration,
                    stop,
                    healthy_after_failures,
                },
            polls,
            before,
            after,
            peaks_reset,
            replayed,
            power,
        } = self.measure(point, &prepared, trace_plan.as_ref()).await;
        let (prepared, blocks) = match replayed {
            Some((p, b)) => (Arc::new(p), b),
            None => (prepared, Vec::new()),
        };
        let judge_repetition = !model.starts_with("synthetic:");
        // llama.cpp's /slots again: a slot shows a request's speculative parameters once it
        // served one (the reading before the first request can miss the method and k).
        let probe_after = if self.probe.slot_ctx.is_empty() {
            None
        } else {
            Some(crate::e2e::engines::probe(&self.client).await)
        };
        let raw_texts: std::collections::BTreeMap<usize, String> = records
            .iter()
            .map(|r| {
                (
                    r.index,
                    format!("{}{}", r.outcome.reasoning, r.outcome.content),
                )
            })
            .collect();
        let output_samples: Vec<String> = raw_texts
            .values()
            .take(OUTPUT_SAMPLES)
            .map(|t| t.chars().take(OUTPUT_SAMPLE_CHARS).collect())
            .collect();
        let (mut requests, texts) = finish_records(
            records,
            &prepared,
            &self.counter,
            suite.output_fixed(),
            judge_repetition,
        )
        .await;
        let wave_note = crate::e2e::checks::mark_opening_wave(point, &mut requests);
        let token_check = crate::e2e::checks::cross_check_tokens(
            &mut requests,
            &raw_texts,
            &self.counter,
            (!judge_repetition).then_some(
                "synthetic weights (their random tokens do not survive a decode/encode round trip)",
            ),
        )
        .await;

        let hits_allowed = hits_allowed(suite, &requests, trace_plan.is_some());
        let kv = self.kv_condition(before.as_ref(), after.as_ref(), boot, &polls, peaks_reset);
        let evidence = PointEvidence {
            before: before.as_ref(),
            after: after.as_ref(),
            boot,
            reset,
            hits_allowed,
            judge_repetition,
            probe: crate::e2e::engines::with_after(self.probe.clone(), probe_after.as_ref()),
        };
        let conditions = self.conditions(&requests, &texts, &evidence, kv, token_check);
        let validity = self.validity(
            &requests,
            &conditions,
            &stop,
            wave_note,
            healthy_after_failures,
            judge_repetition,
        );
        let measured = Throughput::of(&requests, duration.as_secs_f64());
        let served = self.served(
            point,
            &requests,
            measured.as_ref(),
            power,
            trace_plan.as_ref().map(|p| (p, blocks.as_slice())),
            conditions.cache.hits,
            duration.as_secs_f64(),
        );
        let (throughput, throughput_invalid) = if validity.valid {
            (measured, None)
        } else {
            (None, measured)
        };
        Ok(RunResult {
            goodput: served.goodput,
            energy: served.energy,
            energy_unknown: served.energy_unknown,
            trace: served.trace,
            other_tools: served.other_tools,
            label: served.label,
            load: point.clone(),
            latency: LatencySummary::of(&requests),
            lateness: Lateness::of(&requests, self.opts.lateness_tolerance.as_secs_f64()),
            conditions,
            validity,
            throughput,
            throughput_invalid,
            stop,
            warmup_requests: warm_n,
            polls,
            requests,
            output_samples,
        })
    }

    /// Before a point is measured: its warm-up, its trace plan or unique prompts, and the
    /// cache temperature (the prefix cache emptied, then primed for a warm run).
    async fn set_up_point(&self, point: &LoadPoint, model: &str) -> anyhow::Result<PointSetup> {
        let suite = &self.opts.suite;
        let nonce: String = {
            let mut rng = rand::rng();
            (0..8)
                .map(|_| format!("{:x}", rng.random_range(0..16u8)))
                .collect()
        };
        let conc = point.concurrency().unwrap_or(1).max(1);
        // Warm-up: its own prompts, never measured.
        let warm_n = suite.load.warmup as usize;
        if warm_n > 0 {
            self.warm_up(model, &nonce, warm_n, conc).await?;
        }
        let trace_plan = match &self.opts.trace {
            Some(spec) => Some(self.plan_trace(spec, model, &nonce).await?),
            None => None,
        };
        let prepared = Arc::new(if trace_plan.is_some() {
            Vec::new()
        } else {
            prepare(
                suite,
                &self.counter,
                model,
                &nonce,
                suite.load.requests as usize,
                self.facts.max_model_len,
            )
            .await?
        });
        // Cache temperature.
        let reset = self
            .client
            .reset_prefix_cache_at(self.facts.kind.reset_path())
            .await
            .unwrap_or(None);
        self.tell_reset(reset);
        if suite.load.cache == CacheTemp::Warm && trace_plan.is_none() {
            self.prime_cache(&prepared, conc).await;
        }
        Ok(PointSetup {
            warm_n,
            trace_plan,
            prepared,
            reset,
        })
    }

    /// The unmeasured warm-up of a sweep point: `warm_n` prompts of its own; an error when
    /// every one of them failed (and the session was not stopped).
    pub(super) async fn warm_up(
        &self,
        model: &str,
        nonce: &str,
        warm_n: usize,
        conc: u32,
    ) -> anyhow::Result<()> {
        let w = prepare(
            &self.opts.suite,
            &self.counter,
            model,
            &format!("w{nonce}"),
            warm_n,
            self.facts.max_model_len,
        )
        .await?;
        let out = execute(
            &self.client,
            &LoadPoint::Closed {
                concurrency: conc.min(warm_n as u32),
            },
            Arc::new(w),
            &self.exec_cfg,
            &self.stop,
            ProgressBar::hidden(),
        )
        .await;
        let errs: Vec<&str> = out
            .records
            .iter()
            .filter_map(|r| r.outcome.error.as_deref())
            .collect();
        if !errs.is_empty() && errs.len() == out.records.len() && !self.stop.is_stopped() {
            anyhow::bail!("every warm-up request failed (first: {})", errs[0]);
        }
        Ok(())
    }

    /// A warm cache: each prompt sent once, unmeasured, with one output token.
    pub(super) async fn prime_cache(&self, prepared: &[PreparedRequest], conc: u32) {
        let primed: Vec<PreparedRequest> = prepared
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p.req.max_tokens = 1;
                p.req.ignore_eos = false;
                p
            })
            .collect();
        let _ = execute(
            &self.client,
            &LoadPoint::Closed { concurrency: conc },
            Arc::new(primed),
            &self.exec_cfg,
            &self.stop,
            ProgressBar::hidden(),
        )
        .await;
    }

    /// The measured load of a sweep point: the engine's high-water marks reset, `/metrics`
    /// scraped before and after, its gauges sampled while the requests run.
    pub(super) async fn measure(
        &self,
        point: &LoadPoint,
        prepared: &Arc<Vec<PreparedRequest>>,
        trace: Option<&crate::e2e::trace_replay::ReplayPlan>,
    ) -> PointRun {
        // The engine's high-water marks (rigbench serve) restart here.
        let peaks_reset = self.client.reset_peaks().await.ok().flatten() == Some(true);
        let mut polls = PollStats {
            min_interval_s: Some(self.opts.metrics_interval.as_secs_f64()),
            ..Default::default()
        };
        let before = timed_scrape(&self.client, &mut polls).await;
        // Sample gauges while the run goes: at most every 1–2 s (see `next_scrape_interval`).
        let (poll_stop_tx, mut poll_stop_rx) = tokio::sync::oneshot::channel::<()>();
        let poll_client = self.client.clone();
        let min_interval = self.opts.metrics_interval;
        let poller = tokio::spawn(async move {
            let mut stats = PollStats::default();
            let mut wait = min_interval;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = &mut poll_stop_rx => break,
                }
                let t = std::time::Instant::now();
                if let Some(e) = scrape_into(&poll_client, &mut stats).await {
                    stats.add(&e);
                }
                let took = t.elapsed();
                stats.timed(took);
                wait = crate::e2e::conditions::next_scrape_interval(took, min_interval);
            }
            stats
        });
        let total = trace.map_or(prepared.len(), |t| t.requests);
        let pb = progress_bar(self.opts.progress, total, &point.label());
        let sampler = self.start_power();
        let (outcome, replayed) = match trace {
            Some(plan) => {
                let r = crate::e2e::trace_replay::replay(
                    &self.client,
                    plan,
                    &self.exec_cfg,
                    &self.stop,
                    pb.clone(),
                )
                .await;
                (r.exec, Some((r.prepared, r.blocks)))
            }
            None => (
                execute(
                    &self.client,
                    point,
                    prepared.clone(),
                    &self.exec_cfg,
                    &self.stop,
                    pb.clone(),
                )
                .await,
                None,
            ),
        };
        let power = sampler.map(|s| self.finish_power(s));
        pb.finish_and_clear();
        let _ = poll_stop_tx.send(());
        let during = poller.await.unwrap_or_default();
        polls.merge(&during);
        let after = timed_scrape(&self.client, &mut polls).await;
        PointRun {
            outcome,
            polls,
            before,
            after,
            peaks_reset,
            replayed,
            power,
        }
    }

    /// KV capacity: /metrics, then the engine's own endpoint (llama.cpp /slots, SGLang
    /// /get_server_info), then its log, then the user's statement. The live endpoint wins
    /// over the log: llama.cpp's `llama_kv_cache` line gives cells per sequence. With the
    /// run's peak usage, queue depths and preemptions.
    pub(super) fn kv_condition(
        &self,
        before: Option<&Exposition>,
        after: Option<&Exposition>,
        boot: &BootLog,
        polls: &PollStats,
        peaks_reset: bool,
    ) -> KvCondition {
        let mut kv = kv_capacity(after.or(before), Some(boot));
        let from_metrics = kv
            .capacity_tokens
            .as_ref()
            .is_some_and(|c| c.source.starts_with("/metrics"));
        if let (false, Some(p)) = (from_metrics, &self.probe.kv_capacity) {
            if let Some(log) = kv.capacity_tokens.take().filter(|l| l.value != p.value) {
                kv.capacity_note = Some(format!(
                    "the engine log gives {} tokens ({}); the engine's own endpoint is used",
                    crate::output::table::thousands(log.value),
                    log.source
                ));
            }
            kv.capacity_tokens = Some(p.clone());
        }
        if kv.capacity_tokens.is_none() {
            kv.capacity_tokens = self
                .opts
                .stated
                .kv_capacity
                .map(|t| Sourced::new(t, stated("--kv-capacity")));
        }
        if let (None, Some(why)) = (&kv.capacity_tokens, &self.probe.kv_capacity_unknown) {
            // Why the engine's own slots do not settle it (llama.cpp: shared or per-slot cache),
            // after what the scrape said (a rejected /metrics label is kept).
            kv.capacity_note = Some(match kv.capacity_note.take() {
                Some(n) => format!("{n}; {why}"),
                None => why.clone(),
            });
        }
        kv.peak_usage = polls.peak_kv_usage;
        let mark = after
            .filter(|_| peaks_reset)
            .and_then(|a| a.max("rigbench:kv_cache_usage_peak_perc"));
        kv.peak_usage_source = match (mark, polls.peak_kv_usage) {
            (Some(m), _) => {
                kv.peak_usage = Some(m);
                Some("high-water mark kept by the engine (rigbench:kv_cache_usage_peak_perc)".into())
            }
            (None, Some(_)) => Some(format!(
                "sampled: the largest of {} /metrics scrapes (at the start, at the end, and every {}–{} s in between; peaks between scrapes are missed)",
                polls.polls,
                self.opts.metrics_interval.as_secs_f64(),
                2.0 * self.opts.metrics_interval.as_secs_f64()
            )),
            (None, None) => None,
        };
        kv.max_running = polls.max_running;
        kv.max_waiting = polls.max_waiting;
        kv.preemptions = crate::e2e::conditions::delta(before, after, "vllm:num_preemptions")
            .map(|x| x.round() as u64);
        kv
    }

    /// The run's conditions (engine, sampling, thinking, speculation, cache, KV, lengths,
    /// token sources), from its requests and the evidence around them.
    pub(super) fn conditions(
        &self,
        requests: &[RequestRecord],
        texts: &[(String, String)],
        ev: &PointEvidence<'_>,
        kv: KvCondition,
        token_check: Option<TokenCheck>,
    ) -> Conditions {
        let suite = &self.opts.suite;
        let mut token_sources: Vec<TokenSource> =
            requests.iter().filter_map(|r| r.token_source).collect();
        token_sources.sort_by_key(|s| *s as u8);
        token_sources.dedup();
        let mut chunk_splits: Vec<_> = requests.iter().filter_map(|r| r.chunk_split).collect();
        chunk_splits.sort_by_key(|s| *s as u8);
        chunk_splits.dedup();
        let conditions = Conditions {
            engine: self.facts.name.clone(),
            engine_version: self.facts.version.clone(),
            model: self.facts.model.clone(),
            workload: suite.workload.kind,
            temperature: suite.sampling.temperature,
            thinking: thinking_condition(
                suite.workload.api,
                if suite.workload.api == Api::Chat {
                    suite.sampling.thinking
                } else {
                    None
                },
                requests,
                texts,
                ev.judge_repetition,
            ),
            spec: fill_spec(
                spec_condition(ev.before, ev.after, &self.facts),
                requests,
                &ev.probe,
                Some(ev.boot),
                self.opts.stated.spec,
            ),
            cache: crate::e2e::checks::warm_per_request(
                crate::e2e::conditions::cache_condition_with_usage(
                    cache_condition(
                        ev.before,
                        ev.after,
                        CacheExpectation {
                            temperature: suite.load.cache,
                            reset: ev.reset,
                            hits_allowed: ev.hits_allowed,
                        },
                    ),
                    requests,
                ),
                requests,
                suite
                    .workload
                    .shared_prefix_tokens
                    .filter(|_| suite.workload.kind == WorkloadKind::SharedPrefix)
                    .map_or(0, u64::from),
            ),
            kv,
            lengths: length_condition(
                requests,
                suite.workload.output_tokens,
                suite.output_fixed(),
                suite
                    .workload
                    .input_tokens
                    .filter(|_| suite.workload.kind != WorkloadKind::Prompts)
                    .map(u64::from),
            ),
            token_sources,
            chunk_splits,
            token_check,
        };
        let mut conditions = conditions;
        conditions.lengths.prompt_check = crate::e2e::conditions::check_prompt_lengths(
            requests,
            self.facts.prompt_overhead.as_ref(),
        );
        conditions
    }

    /// The run's verdict, with notes on its opening wave, on transport failures reached while
    /// the engine still answered, and on output text not judged (synthetic weights).
    pub(super) fn validity(
        &self,
        requests: &[RequestRecord],
        conditions: &Conditions,
        stop: &ExecStop,
        wave_note: Option<String>,
        healthy_after_failures: usize,
        judge_repetition: bool,
    ) -> Validity {
        let mut validity = assess(requests, conditions, stop);
        if self.opts.engine_log.is_some() {
            for m in validity.missing_conditions.iter_mut() {
                *m = crate::e2e::validity::with_log_given(m);
            }
        }
        validity.notes.extend(wave_note);
        if healthy_after_failures > 0 {
            validity.notes.push(format!(
                "{} consecutive transport failures {} reached while GET /health still answered: the engine was not declared unreachable",
                self.exec_cfg.connect_failure_limit,
                if healthy_after_failures == 1 { "once".to_string() } else { format!("{healthy_after_failures} times") }
            ));
        }
        if !judge_repetition {
            validity.notes.push(
                "output text not judged for repetition or <think> tags: the model has synthetic (random) weights".into(),
            );
        }
        validity
    }
}

/// What one sweep point's load returned, with the `/metrics` scrapes around it.
pub(super) struct PointRun {
    pub(super) outcome: ExecOutcome,
    pub(super) polls: PollStats,
    pub(super) before: Option<Exposition>,
    pub(super) after: Option<Exposition>,
    /// The engine's high-water marks were reset before the run (rigbench serve).
    pub(super) peaks_reset: bool,
    /// A replayed trace's requests as sent, and their hash ids and prompt lengths.
    pub(super) replayed: Option<(
        Vec<PreparedRequest>,
        Vec<crate::e2e::trace_replay::HashedPrompt>,
    )>,
    /// Power samples across the load: samples, window (s), first reading error, source.
    pub(super) power: Option<PowerWindow>,
}

/// Power samples across a measured window.
pub(super) struct PowerWindow {
    pub(super) samples: Vec<crate::e2e::energy::Sample>,
    pub(super) window_s: f64,
    pub(super) error: Option<String>,
    pub(super) source: String,
}

/// What a sweep point's conditions are judged from, besides its requests.
pub(super) struct PointEvidence<'a> {
    pub(super) before: Option<&'a Exposition>,
    pub(super) after: Option<&'a Exposition>,
    pub(super) boot: &'a BootLog,
    /// What the prefix-cache reset before the run answered.
    pub(super) reset: Option<bool>,
    /// Prefix-cache hits the workload itself explains ([`hits_allowed`]).
    pub(super) hits_allowed: u64,
    /// Whether output text is judged (not for synthetic weights).
    pub(super) judge_repetition: bool,
    /// The engine's endpoints, completed by a reading after the run
    /// ([`crate::e2e::engines::with_after`]).
    pub(super) probe: EngineProbe,
}

/// Hits the workload itself explains: the shared prefix within the run (every request's, in a
/// warm run, whose priming precedes the first; all but the first's in a cold run), and for chat
/// the template tokens around the user message (prompt tokens reported − tokens counted in the
/// message), which may precede the salt.
pub(super) fn hits_allowed(suite: &Suite, requests: &[RequestRecord], replay: bool) -> u64 {
    if replay {
        // A replayed trace reuses prefixes by design: any hit up to its prompts is explained.
        return requests
            .iter()
            .map(|r| r.prompt_tokens.or(r.input_tokens_counted).unwrap_or(0))
            .sum();
    }
    let sharing = match suite.load.cache {
        CacheTemp::Warm => requests.len(),
        CacheTemp::Cold => requests.len().saturating_sub(1),
    };
    let shared = match (suite.workload.kind, suite.workload.shared_prefix_tokens) {
        (WorkloadKind::SharedPrefix, Some(p)) => u64::from(p) * sharing as u64,
        _ => 0,
    };
    let template: u64 = if suite.workload.api == Api::Chat {
        requests
            .iter()
            .filter_map(|r| Some(r.prompt_tokens?.saturating_sub(r.input_tokens_counted?)))
            .sum()
    } else {
        0
    };
    shared + template
}
