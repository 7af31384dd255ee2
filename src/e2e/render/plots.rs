//! The e2e plots (plotters' SVG backend): latency percentiles against concurrency or rate, and
//! acceptance by draft position; with the names of those a report has.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::cells::min_n_for;
use crate::e2e::driver::RunResult;
use crate::e2e::executor::LoadPoint;
use crate::e2e::metrics::Percentiles;
use crate::e2e::E2eResults;
use crate::output::write::atomic_write;

const LATENCY_PLOT: &str = "e2e_latency.svg";
const ACCEPTANCE_PLOT: &str = "e2e_acceptance_by_position.svg";

/// `(x, run)` pairs of valid runs for the latency plot, and the x-axis name.
fn latency_points(res: &E2eResults) -> (Vec<(f64, &RunResult)>, &'static str) {
    let mut closed: Vec<(f64, &RunResult)> = Vec::new();
    let mut open: Vec<(f64, &RunResult)> = Vec::new();
    for r in res.runs.iter().filter(|r| r.validity.valid) {
        match &r.load {
            LoadPoint::Closed { concurrency } => closed.push((f64::from(*concurrency), r)),
            LoadPoint::Open { rate, .. } => open.push((*rate, r)),
        }
    }
    let (mut v, name) = if closed.len() >= open.len() {
        (closed, "concurrency (requests in flight)")
    } else {
        (open, "arrival rate (requests/s)")
    };
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    (v, name)
}

pub(super) fn plot_names(res: &E2eResults) -> Vec<&'static str> {
    let mut v = Vec::new();
    if !latency_points(res).0.is_empty() {
        v.push(LATENCY_PLOT);
    }
    if res
        .runs
        .iter()
        .any(|r| r.validity.valid && !r.conditions.spec.per_position.is_empty())
    {
        v.push(ACCEPTANCE_PLOT);
    }
    v
}

fn perr<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot drawing failed: {e}")
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Write the plots into `dir`; returns the file names written. Only valid runs are plotted.
///
/// # Errors
/// Drawing or writing failed (the error names the file).
pub fn write_plots(res: &E2eResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut written = Vec::new();
    written.extend(write_latency_plot(res, dir)?);
    written.extend(write_acceptance_plot(res, dir)?);
    written.extend(crate::e2e::render_serving::write_pareto(res, dir)?);
    Ok(written)
}

/// The latency plot ([`LATENCY_PLOT`]): TTFT, and TPOT and ITL, p50 and p99 against load, on
/// two panels; `None` when no valid run has latencies.
fn write_latency_plot(res: &E2eResults, dir: &Path) -> anyhow::Result<Option<String>> {
    let (pts, xname) = latency_points(res);
    if !pts.is_empty() {
        type Getter = fn(&RunResult) -> Option<&Percentiles>;
        type Pick = fn(&Percentiles) -> f64;
        let series: [(&str, Getter, Pick); 6] = [
            ("TTFT p50", |r| r.latency.ttft.as_ref(), |p| p.p50),
            ("TTFT p99", |r| r.latency.ttft.as_ref(), |p| p.p99),
            ("TPOT p50", |r| r.latency.tpot.as_ref(), |p| p.p50),
            ("TPOT p99", |r| r.latency.tpot.as_ref(), |p| p.p99),
            ("ITL p50", |r| r.latency.itl.as_ref(), |p| p.p50),
            ("ITL p99", |r| r.latency.itl.as_ref(), |p| p.p99),
        ];
        // p99 points only where n holds a p99 (see `min_n_for`).
        let data: Vec<(&str, Vec<(f64, f64)>)> = series
            .iter()
            .map(|(name, get, pick)| {
                let need = if name.ends_with("p99") {
                    min_n_for(0.99)
                } else {
                    0
                };
                (
                    *name,
                    pts.iter()
                        .filter_map(|(x, r)| {
                            get(r).filter(|p| p.n >= need).map(|p| (*x, pick(p) * 1e3))
                        })
                        .collect(),
                )
            })
            .collect();
        let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max) * 1.1 + 0.1;
        // TTFT (hundreds of ms under load) and the per-token gaps (ms) on separate axes, so
        // neither flattens the other.
        let closed = xname.starts_with("concurrency");
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1100, 480)).into_drawing_area();
            root.fill(&WHITE).map_err(perr)?;
            let (left, right) = root.split_horizontally(550);
            for (area, title, range) in [
                (&left, "Time to first token (valid runs)", 0..2),
                (&right, "Per-token latency: TPOT and ITL (valid runs)", 2..6),
            ] {
                let panel = &data[range.clone()];
                let ymax = panel
                    .iter()
                    .flat_map(|(_, v)| v.iter().map(|p| p.1))
                    .fold(0.0, f64::max)
                    * 1.15
                    + 1e-3;
                let mut chart = ChartBuilder::on(area)
                    .caption(title, ("sans-serif", 16))
                    .margin(12)
                    .x_label_area_size(45)
                    .y_label_area_size(70)
                    .build_cartesian_2d(0.0..xmax, 0.0..ymax)
                    .map_err(perr)?;
                let xfmt: &dyn Fn(&f64) -> String = if closed {
                    &crate::output::axis::count_tick
                } else {
                    &crate::output::axis::tick
                };
                chart
                    .configure_mesh()
                    .x_desc(xname)
                    .y_desc("milliseconds")
                    .x_label_formatter(xfmt)
                    .y_label_formatter(&crate::output::axis::tick)
                    .draw()
                    .map_err(perr)?;
                for (i, (name, v)) in panel.iter().enumerate() {
                    if v.is_empty() {
                        continue;
                    }
                    let color = COLORS[(i + range.start) % COLORS.len()];
                    crate::output::plot::line_with_points(&mut chart, v, color, name)?;
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(perr)?;
            }
            root.present().map_err(perr)?;
        }
        let p = dir.join(LATENCY_PLOT);
        atomic_write(&p, svg.as_bytes())
            .with_context(|| format!("cannot write {}", p.display()))?;
        return Ok(Some(LATENCY_PLOT.to_string()));
    }
    Ok(None)
}

/// The speculative acceptance plot ([`ACCEPTANCE_PLOT`]): accepted / drafts by draft
/// position, one line per valid run that has them; `None` when none has.
fn write_acceptance_plot(res: &E2eResults, dir: &Path) -> anyhow::Result<Option<String>> {
    let spec: Vec<&RunResult> = res
        .runs
        .iter()
        .filter(|r| r.validity.valid && !r.conditions.spec.per_position.is_empty())
        .collect();
    if !spec.is_empty() {
        let k = spec
            .iter()
            .map(|r| r.conditions.spec.per_position.len())
            .max()
            .unwrap_or(1);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (860, 500)).into_drawing_area();
            root.fill(&WHITE).map_err(perr)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    "Speculative acceptance by draft position",
                    ("sans-serif", 20),
                )
                .margin(12)
                .x_label_area_size(45)
                .y_label_area_size(65)
                .build_cartesian_2d(0.5..(k as f64 + 0.5), 0.0..1.05)
                .map_err(perr)?;
            chart
                .configure_mesh()
                .x_desc("draft position")
                .y_desc("accepted / drafts")
                .x_labels(k.min(16))
                .draw()
                .map_err(perr)?;
            for (i, r) in spec.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let v: Vec<(f64, f64)> = r
                    .conditions
                    .spec
                    .per_position
                    .iter()
                    .enumerate()
                    .map(|(j, a)| ((j + 1) as f64, *a))
                    .collect();
                crate::output::plot::line_with_points(&mut chart, &v, color, &r.label)?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(perr)?;
            root.present().map_err(perr)?;
        }
        let p = dir.join(ACCEPTANCE_PLOT);
        atomic_write(&p, svg.as_bytes())
            .with_context(|| format!("cannot write {}", p.display()))?;
        return Ok(Some(ACCEPTANCE_PLOT.to_string()));
    }
    Ok(None)
}
