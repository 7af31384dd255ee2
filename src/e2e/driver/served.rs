//! What a sweep point served, beyond latency and throughput: the trace it replays (its prompts
//! planned before the load), and the energy sampled across its measured window
//! (docs/traces.md, docs/energy.md).

use super::point::PowerWindow;
use super::*;
use crate::e2e::energy::{Energy, PowerSampler};
use crate::e2e::trace_replay::{plan, ReplayPlan, RequestTemplate, TraceSpec};

impl Session<'_> {
    /// Synthesise the prompts of the trace's window for this point (`nonce` keeps its blocks
    /// apart from other points').
    ///
    /// # Errors
    /// The window holds no session, or the tokenizer failed.
    pub(super) async fn plan_trace(
        &self,
        spec: &TraceSpec,
        model: &str,
        nonce: &str,
    ) -> anyhow::Result<ReplayPlan> {
        let sessions = spec.trace.windowed(&spec.window);
        if sessions.is_empty() {
            anyhow::bail!(crate::RigError::flag(
                "--trace-start/--trace-duration",
                format!(
                    "the window holds no session of {} (its sessions start between {:.3} s and {:.3} s)",
                    spec.trace.origin.display(),
                    spec.trace.sessions.first().map_or(0.0, |s| s.start_s),
                    spec.trace.sessions.last().map_or(0.0, |s| s.start_s)
                )
            ));
        }
        let suite = &self.opts.suite;
        let tpl = RequestTemplate {
            api: suite.workload.api,
            model: model.to_string(),
            temperature: suite.sampling.temperature,
            seed: suite.sampling.seed,
            thinking: suite.sampling.thinking,
        };
        plan(
            &sessions,
            spec.trace.block_tokens,
            &self.counter,
            &tpl,
            nonce,
        )
        .await
    }

    /// Start sampling power, when the session has a source.
    pub(super) fn start_power(&self) -> Option<PowerSampler> {
        let src = self.power.lock().ok()?.take()?;
        Some(PowerSampler::start(
            src,
            crate::e2e::energy::DEFAULT_INTERVAL,
        ))
    }

    /// Stop sampling; the source is kept for the next window.
    pub(super) fn finish_power(&self, s: PowerSampler) -> PowerWindow {
        let source = s.describe().to_string();
        let (samples, window_s, error, src) = s.finish();
        if let (Some(src), Ok(mut slot)) = (src, self.power.lock()) {
            *slot = Some(src);
        }
        PowerWindow {
            samples,
            window_s,
            error,
            source,
        }
    }

    /// What the point served beyond latency and throughput: its SLO attainment, its energy
    /// (or why there is none), its trace summary, the other tools' TPOT and ITL, and its label.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn served(
        &self,
        point: &LoadPoint,
        requests: &[RequestRecord],
        measured: Option<&Throughput>,
        power: Option<PowerWindow>,
        replay: Option<(&ReplayPlan, &[crate::e2e::trace_replay::HashedPrompt])>,
        metrics_cache_hits: Option<u64>,
        duration_s: f64,
    ) -> Served {
        let (energy, energy_unknown) = self.energy(requests, measured, power);
        let trace = match (&self.opts.trace, replay) {
            (Some(spec), Some((plan, blocks))) => Some(crate::e2e::trace_replay::TraceSummary::of(
                spec,
                plan,
                blocks,
                requests,
                metrics_cache_hits,
            )),
            _ => None,
        };
        Served {
            goodput: self.opts.slo.as_ref().and_then(|slo| {
                crate::e2e::goodput::Goodput::of(
                    slo,
                    requests,
                    Some(duration_s),
                    self.opts.goodput_search.map_or(0.95, |s| s.confidence),
                )
            }),
            energy,
            energy_unknown,
            trace,
            other_tools: crate::e2e::definitions::other_tools(requests),
            label: match &self.opts.trace {
                Some(spec) => format!("trace ×{}", spec.window.speed),
                None => point.label(),
            },
        }
    }

    /// The point's energy, or why there is none.
    fn energy(
        &self,
        requests: &[RequestRecord],
        measured: Option<&Throughput>,
        power: Option<PowerWindow>,
    ) -> (Option<Energy>, Option<String>) {
        let Some(w) = power else {
            return (
                None,
                Some(
                    self.energy_unknown
                        .clone()
                        .unwrap_or_else(|| "no power source".into()),
                ),
            );
        };
        let output: u64 = requests
            .iter()
            .filter(|r| r.ok)
            .filter_map(|r| r.output_tokens)
            .sum();
        let total = measured.and_then(|t| t.input_tokens).map(|i| i + output);
        match Energy::of(&w.samples, w.window_s, output, total, &w.source) {
            Some(e) => (Some(e), None),
            None => (
                None,
                Some(match w.error {
                    Some(e) => format!("power could not be read: {e}"),
                    None => format!(
                        "{} power sample{} in a {:.3} s window: too short to integrate",
                        w.samples.len(),
                        if w.samples.len() == 1 { "" } else { "s" },
                        w.window_s
                    ),
                }),
            ),
        }
    }
}

/// What a sweep point served beyond latency and throughput (fields of [`RunResult`]).
pub(super) struct Served {
    pub(super) goodput: Option<crate::e2e::goodput::Goodput>,
    pub(super) energy: Option<Energy>,
    pub(super) energy_unknown: Option<String>,
    pub(super) trace: Option<crate::e2e::trace_replay::TraceSummary>,
    pub(super) other_tools: Vec<crate::e2e::definitions::ToolMetrics>,
    pub(super) label: String,
}
