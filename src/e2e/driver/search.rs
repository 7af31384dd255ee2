//! `--goodput-search`: probes chosen by [`crate::e2e::goodput::next_probe`] (doubling, then
//! bisection), each a sweep point of its own, kept in `runs` like any other, until the Wilson
//! interval decides or the probe budget is spent (docs/goodput.md).

use super::session::{boot_of, cause_text, one_line};
use super::*;
use crate::e2e::goodput::{answer, next_probe, Probe, SearchAxis, SearchResult, SearchSpec};

/// The load point of a probe at `load`.
fn point_at(suite: &Suite, axis: SearchAxis, load: f64, n: usize) -> LoadPoint {
    let l = &suite.load;
    match axis {
        SearchAxis::Concurrency => LoadPoint::Closed {
            concurrency: load.round().max(1.0) as u32,
        },
        SearchAxis::Rate => LoadPoint::Open {
            rate: load,
            arrival: l.arrival,
            burstiness: l.burstiness,
            max_concurrency: l.max_concurrency,
            seed: suite.sampling.seed.unwrap_or(0).wrapping_add(n as u64),
        },
    }
}

/// Run the search in place of the sweep; every probe's run goes into `results.runs`, the search
/// into `results.goodput_search` (both after each probe).
pub(super) async fn run_search(
    session: &Session<'_>,
    spec: &SearchSpec,
    engine: &EngineHandle,
    log_file: &Option<crate::e2e::bootlog::EngineLogFile>,
    stop: &StopSignal,
    results: &mut E2eResults,
    on_update: &mut (dyn FnMut(&E2eResults) + Send),
) {
    let opts = session.opts;
    let slo = opts.slo.unwrap_or_default();
    let mut search = SearchResult {
        spec: *spec,
        slo,
        probes: Vec::new(),
        answer: None,
        lowest_fail: None,
        stopped: String::new(),
    };
    loop {
        let load = match next_probe(spec, &search.probes) {
            Ok(l) => l,
            Err(why) => {
                search.stopped = why;
                break;
            }
        };
        if let Some(cause) = stop.cause() {
            search.stopped = format!("the session stopped ({})", cause_text(&cause));
            break;
        }
        let point = point_at(&opts.suite, spec.axis, load, search.probes.len());
        eprintln!(
            "rigbench e2e: goodput probe {}/{}: {} ({} requests)",
            search.probes.len() + 1,
            spec.max_probes,
            point.label(),
            opts.suite.load.requests
        );
        // The log as it is now, as each sweep point reads it.
        let boot = boot_of(engine, &log_file.as_ref().map(|f| f.text_now()));
        match session.run_point(&point, &boot).await {
            Ok(r) => {
                eprintln!("{}", one_line(&r));
                let Some(g) = r.goodput.clone() else {
                    search.stopped = format!("{}: no request could be judged", r.label);
                    results.runs.push(r);
                    break;
                };
                let gpus = f64::from(opts.gpus.max(1));
                search.probes.push(Probe {
                    load,
                    label: r.label.clone(),
                    attainment: g.attainment,
                    wilson_low: g.wilson_low,
                    wilson_high: g.wilson_high,
                    requests: g.requests,
                    verdict: g.verdict(spec.target),
                    output_tok_per_s_per_gpu: r
                        .presented_throughput()
                        .map(|t| t.output_tok_per_s / gpus),
                    tok_per_s_per_user: r
                        .latency
                        .tpot
                        .as_ref()
                        .filter(|p| p.p50 > 0.0)
                        .map(|p| 1.0 / p.p50),
                });
                results.runs.push(r);
            }
            Err(e) => {
                let _ = engine.wait_exit(Duration::from_secs(2)).await;
                results.failure = Some(format!("{}: {e:#}", point.label()));
                search.stopped = "a probe failed".into();
                break;
            }
        }
        (search.answer, search.lowest_fail) = answer(&search.probes);
        results.goodput_search = Some(search.clone());
        on_update(results);
    }
    (search.answer, search.lowest_fail) = answer(&search.probes);
    results.goodput_search = Some(search);
    on_update(results);
}
