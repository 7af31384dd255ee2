//! Load executors: closed loop (a fixed number of requests in flight) and open loop (arrivals
//! drawn from a Poisson or gamma process at a rate, independent of completions, as in vLLM's
//! `benchmark_serving`).
//!
//! Limits: the number of prepared requests (each prompt is used once, so the cold-cache salts
//! stay unique) and an optional duration after which no new request is sent; requests in flight
//! then finish. A [`StopSignal`] (Ctrl-C, or the engine process exiting) aborts requests in
//! flight by dropping their connections; everything completed before is kept.
//!
//! Open loop: every arrival's scheduled and actual send times are recorded; an arrival that had
//! to wait (the runtime was late, or `max_concurrency` was reached) is data, not a log line.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rand::SeedableRng;
use rand_distr::Distribution;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::client::{is_transport_error, EngineClient};
use super::stream::StreamOutcome;
use super::workload::{ArrivalKind, PreparedRequest};

/// Why a session was stopped from outside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cause", content = "detail", rename_all = "snake_case")]
pub enum StopCause {
    /// The user pressed Ctrl-C (or a caller asked to stop).
    Interrupted,
    /// The engine exited or became unreachable.
    EngineFailed(String),
}

/// A one-shot, cloneable stop signal; the first cause wins.
#[derive(Debug, Clone)]
pub struct StopSignal {
    tx: Arc<watch::Sender<Option<StopCause>>>,
}

impl Default for StopSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl StopSignal {
    /// Not stopped.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::channel(None).0),
        }
    }

    /// Stop with `cause` (ignored when already stopped).
    pub fn trigger(&self, cause: StopCause) {
        self.tx.send_if_modified(|c| {
            if c.is_none() {
                *c = Some(cause);
                true
            } else {
                false
            }
        });
    }

    /// The cause, once stopped.
    pub fn cause(&self) -> Option<StopCause> {
        self.tx.borrow().clone()
    }

    /// Whether stopped.
    pub fn is_stopped(&self) -> bool {
        self.tx.borrow().is_some()
    }

    /// Resolves once stopped as [`StopCause::Interrupted`] (requests in flight are then
    /// aborted; after an engine failure they end on their own, with the engine's error).
    pub fn interrupted(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            if rx
                .wait_for(|c| matches!(c, Some(StopCause::Interrupted)))
                .await
                .is_err()
            {
                futures::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once stopped.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            if rx.wait_for(|c| c.is_some()).await.is_err() {
                futures::future::pending::<()>().await;
            }
        }
    }
}

/// One point of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum LoadPoint {
    /// Closed loop.
    Closed {
        /// Requests in flight.
        concurrency: u32,
    },
    /// Open loop.
    Open {
        /// Mean arrival rate, requests per second.
        rate: f64,
        /// Arrival process.
        arrival: ArrivalKind,
        /// Gamma shape (1 = Poisson).
        burstiness: f64,
        /// Cap on requests in flight, if any.
        max_concurrency: Option<u32>,
        /// RNG seed of the arrival times.
        seed: u64,
    },
}

impl LoadPoint {
    /// Short label (`c=4`, `2.00 req/s`).
    pub fn label(&self) -> String {
        match self {
            LoadPoint::Closed { concurrency } => format!("c={concurrency}"),
            LoadPoint::Open {
                rate,
                arrival,
                burstiness,
                ..
            } => match arrival {
                ArrivalKind::Poisson => format!("{rate:.2} req/s"),
                ArrivalKind::Gamma => format!("{rate:.2} req/s γ{burstiness}"),
                ArrivalKind::Trace => format!("trace {rate:.2} req/s"),
            },
        }
    }

    /// Concurrency (closed loop) or the in-flight cap (open loop).
    pub fn concurrency(&self) -> Option<u32> {
        match self {
            LoadPoint::Closed { concurrency } => Some(*concurrency),
            LoadPoint::Open {
                max_concurrency, ..
            } => *max_concurrency,
        }
    }
}

/// Arrival offsets from the start, seconds: `n` arrivals, the first at 0, inter-arrival times
/// exponential with mean 1/rate (Poisson) or gamma with shape `burstiness` and the same mean.
pub fn arrival_offsets(
    n: usize,
    rate: f64,
    kind: ArrivalKind,
    burstiness: f64,
    seed: u64,
) -> Vec<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut t = 0.0;
    let mut out = Vec::with_capacity(n);
    let exp = rand_distr::Exp::new(rate).ok();
    let gamma = rand_distr::Gamma::new(burstiness, 1.0 / (rate * burstiness)).ok();
    for i in 0..n {
        if i > 0 {
            let dt = match kind {
                ArrivalKind::Poisson => exp.map(|d| d.sample(&mut rng)),
                ArrivalKind::Gamma => gamma.map(|d| d.sample(&mut rng)),
                // A trace's own times are sent by `trace_replay`; evenly spaced here.
                ArrivalKind::Trace => None,
            };
            t += dt.unwrap_or(1.0 / rate);
        }
        out.push(t);
    }
    out
}

/// One request as the executor saw it.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// Index into the prepared requests.
    pub index: usize,
    /// Scheduled send time since the start (open loop).
    pub scheduled: Option<Duration>,
    /// Actual send time since the start.
    pub sent: Duration,
    /// What came back.
    pub outcome: StreamOutcome,
}

/// How a sweep point ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", content = "detail", rename_all = "snake_case")]
pub enum ExecStop {
    /// Every prepared request was sent and finished.
    Completed,
    /// The duration limit stopped new sends; requests in flight finished.
    DurationLimit,
    /// Ctrl-C: requests in flight were aborted.
    Interrupted,
    /// The engine exited or became unreachable.
    EngineFailed(String),
}

/// Executor settings.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// No new request after this long.
    pub duration: Option<Duration>,
    /// Consecutive transport failures after which `GET /health` is asked; the engine counts as
    /// gone (unreachable) only when that fails too.
    pub connect_failure_limit: usize,
}

/// The records of a sweep point.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    /// Records in completion order.
    pub records: Vec<RawRecord>,
    /// From the start to the last completion.
    pub duration: Duration,
    /// How it ended.
    pub stop: ExecStop,
    /// Times the consecutive-transport-failure limit was reached while `GET /health` still
    /// answered (the engine was not declared unreachable).
    pub healthy_after_failures: usize,
}

struct Shared {
    client: EngineClient,
    reqs: Arc<Vec<PreparedRequest>>,
    records: Mutex<Vec<RawRecord>>,
    conn_failures: AtomicUsize,
    healthy_after_failures: AtomicUsize,
    cfg: ExecConfig,
    stop: StopSignal,
    t0: Instant,
    progress: ProgressBar,
}

impl Shared {
    async fn send(&self, index: usize, scheduled: Option<Duration>) {
        let req = &self.reqs[index].req;
        let (sent, outcome) = self
            .client
            .stream(req, self.cfg.request_timeout, self.stop.interrupted())
            .await;
        match &outcome.error {
            Some(e) if is_transport_error(e) => {
                let n = self.conn_failures.fetch_add(1, Ordering::SeqCst) + 1;
                if n >= self.cfg.connect_failure_limit && !self.stop.is_stopped() {
                    // "Unreachable" only when the engine does not answer its health check either:
                    // a healthy server that closed connections under us is not gone.
                    if super::engines::healthy(&self.client, Duration::from_secs(5)).await {
                        self.conn_failures.store(0, Ordering::SeqCst);
                        self.healthy_after_failures.fetch_add(1, Ordering::SeqCst);
                    } else {
                        self.stop.trigger(StopCause::EngineFailed(format!(
                            "engine unreachable: {n} consecutive transport failures (last: {e}), and GET /health (then GET /v1/models) failed too"
                        )));
                    }
                }
            }
            None => self.conn_failures.store(0, Ordering::SeqCst),
            _ => {}
        }
        self.progress.inc(1);
        if let Ok(mut r) = self.records.lock() {
            r.push(RawRecord {
                index,
                scheduled,
                sent: sent.saturating_duration_since(self.t0),
                outcome,
            });
        }
    }
}

/// Run one sweep point over `reqs` (each sent at most once).
pub async fn execute(
    client: &EngineClient,
    point: &LoadPoint,
    reqs: Arc<Vec<PreparedRequest>>,
    cfg: &ExecConfig,
    stop: &StopSignal,
    progress: ProgressBar,
) -> ExecOutcome {
    let n = reqs.len();
    let t0 = Instant::now();
    let deadline = cfg.duration.map(|d| t0 + d);
    let shared = Arc::new(Shared {
        client: client.clone(),
        reqs,
        records: Mutex::new(Vec::with_capacity(n)),
        conn_failures: AtomicUsize::new(0),
        healthy_after_failures: AtomicUsize::new(0),
        cfg: cfg.clone(),
        stop: stop.clone(),
        t0,
        progress,
    });
    let mut deadline_hit = false;
    let mut tasks = tokio::task::JoinSet::new();
    match point {
        LoadPoint::Closed { concurrency } => {
            let next = Arc::new(AtomicUsize::new(0));
            let hit = Arc::new(AtomicUsize::new(0));
            for _ in 0..(*concurrency as usize).min(n.max(1)) {
                let sh = shared.clone();
                let next = next.clone();
                let hit = hit.clone();
                tasks.spawn(async move {
                    loop {
                        if sh.stop.is_stopped() {
                            break;
                        }
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            hit.store(1, Ordering::SeqCst);
                            break;
                        }
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= sh.reqs.len() {
                            break;
                        }
                        sh.send(i, None).await;
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
            deadline_hit = hit.load(Ordering::SeqCst) == 1 && next.load(Ordering::SeqCst) < n;
        }
        LoadPoint::Open {
            rate,
            arrival,
            burstiness,
            max_concurrency,
            seed,
        } => {
            let offsets = arrival_offsets(n, *rate, *arrival, *burstiness, *seed);
            let sem = max_concurrency.map(|m| Arc::new(tokio::sync::Semaphore::new(m as usize)));
            for (i, off) in offsets.iter().enumerate() {
                let at = t0 + Duration::from_secs_f64(*off);
                if deadline.is_some_and(|d| at >= d) {
                    deadline_hit = true;
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(at.into()) => {}
                    _ = stop.stopped() => break,
                }
                let permit = match &sem {
                    Some(s) => tokio::select! {
                        p = s.clone().acquire_owned() => p.ok(),
                        _ = stop.stopped() => break,
                    },
                    None => None,
                };
                let sh = shared.clone();
                let scheduled = Some(Duration::from_secs_f64(*off));
                tasks.spawn(async move {
                    sh.send(i, scheduled).await;
                    drop(permit);
                });
            }
            while tasks.join_next().await.is_some() {}
        }
    }
    let records = shared
        .records
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    let end = records
        .iter()
        .map(|r| r.sent + r.outcome.end)
        .max()
        .unwrap_or_default();
    let stop_kind = match stop.cause() {
        Some(StopCause::Interrupted) => ExecStop::Interrupted,
        Some(StopCause::EngineFailed(m)) => ExecStop::EngineFailed(m),
        None if deadline_hit => ExecStop::DurationLimit,
        None => ExecStop::Completed,
    };
    ExecOutcome {
        records,
        duration: end,
        stop: stop_kind,
        healthy_after_failures: shared.healthy_after_failures.load(Ordering::SeqCst),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_have_the_requested_mean_rate() {
        for kind in [ArrivalKind::Poisson, ArrivalKind::Gamma] {
            let o = arrival_offsets(4001, 8.0, kind, 0.5, 7);
            assert_eq!(o[0], 0.0);
            assert!(o.windows(2).all(|w| w[1] >= w[0]));
            let mean_gap = o[4000] / 4000.0;
            assert!((mean_gap - 0.125).abs() < 0.01, "{kind:?}: {mean_gap}");
        }
        // Seeded: reproducible.
        assert_eq!(
            arrival_offsets(10, 2.0, ArrivalKind::Poisson, 1.0, 3),
            arrival_offsets(10, 2.0, ArrivalKind::Poisson, 1.0, 3)
        );
    }

    #[tokio::test]
    async fn stop_signal_first_cause_wins() {
        let s = StopSignal::new();
        assert!(!s.is_stopped());
        let f = s.stopped();
        s.trigger(StopCause::EngineFailed("x".into()));
        s.trigger(StopCause::Interrupted);
        f.await;
        assert_eq!(s.cause(), Some(StopCause::EngineFailed("x".into())));
    }
}
