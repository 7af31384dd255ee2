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
        plan(&sessions, spec.trace.block_tokens, &self.counter, &tpl, nonce).await
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

    /// The point's energy, or why there is none.
    pub(super) fn served(
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
