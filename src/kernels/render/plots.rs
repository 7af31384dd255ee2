//! The kernel section's SVG plots (plotters): one per shape (time and weight bandwidth against M,
//! with the copy roofline), the fastest-format chart and the decode-step composite chart, and
//! their file names.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use super::cases::{by_shape, col_header, columns, ShapeCases};
use crate::kernels::schema::{KernelCase, KernelResults};
use crate::output::plot::PALETTE;
use crate::output::table::thousands;

/// File name of the decode-step composite chart.
pub const COMPOSITE_PLOT: &str = "kernels_composite.svg";

/// File name of a shape's plot.
pub fn plot_name(shape: &str) -> String {
    format!("kernels_{}.svg", crate::rig::slug(shape))
}

/// Write one SVG per shape (time and weight bandwidth against M, with the copy roofline) and the
/// fastest-format chart; returns the file names.
///
/// # Errors
/// A plot cannot be drawn or written (the error names the file).
pub fn write_plots(k: &KernelResults, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let shapes = by_shape(k);
    for (shape, cases) in &shapes {
        let name = plot_name(shape);
        let path = dir.join(&name);
        draw_shape(
            shape,
            cases,
            k.copy_bandwidth.as_ref().map(|c| c.bytes_per_s),
            &path,
        )
        .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;
        out.push(name);
    }
    if !shapes.is_empty() {
        let path = dir.join("kernels_fastest.svg");
        draw_fastest(&shapes, &path)
            .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;
        out.push("kernels_fastest.svg".into());
    }
    if let Some(c) = k
        .composite
        .clone()
        .or_else(|| crate::kernels::composite::compute(k))
    {
        let path = dir.join(COMPOSITE_PLOT);
        crate::kernels::composite_chart::composite_chart(&c, &path)
            .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;
        out.push(COMPOSITE_PLOT.into());
    }
    Ok(out)
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;

fn draw_shape(
    shape: &str,
    cases: &BTreeMap<(String, usize), &KernelCase>,
    copy_bw: Option<f64>,
    path: &Path,
) -> PlotResult {
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let cols = columns(cases);
    let ms: Vec<usize> = cases.keys().map(|(_, m)| *m).collect();
    let (mmin, mmax) = (
        *ms.iter().min().unwrap_or(&1) as f64,
        (*ms.iter().max().unwrap_or(&2) as f64).max(2.0),
    );
    let times: Vec<f64> = cases
        .values()
        .map(|c| c.total_s() * 1e6)
        .filter(|t| *t > 0.0)
        .collect();
    let (tmin, tmax) = (
        times
            .iter()
            .cloned()
            .fold(f64::INFINITY, f64::min)
            .max(1e-3),
        times.iter().cloned().fold(0.0, f64::max).max(1e-2),
    );
    let (n, kk) = cases.values().next().map(|c| (c.n, c.k)).unwrap_or((0, 0));
    let mut ch = ChartBuilder::on(&left)
        .caption(
            format!(
                "{shape} ({}×{}): median time",
                thousands(n as u64),
                thousands(kk as u64)
            ),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (mmin..mmax).log_scale(),
            (tmin * 0.8..tmax * 1.25).log_scale(),
        )?;
    ch.configure_mesh()
        .x_desc("M (tokens)")
        .y_desc("µs")
        .x_label_formatter(&crate::output::axis::count_tick)
        .y_label_formatter(&crate::output::axis::tick)
        .draw()?;
    for (i, col) in cols.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mut pts: Vec<(f64, f64)> = cases
            .iter()
            .filter(|((c, _), _)| c == col)
            .map(|((_, m), c)| (*m as f64, c.total_s() * 1e6))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        crate::output::plot::line_with_points(&mut ch, &pts, color, &col_header(cases, col))?;
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;

    let bws: Vec<f64> = cases
        .values()
        .map(|c| c.derived.weight_bytes_per_s / 1e12)
        .collect();
    let ymax = bws
        .iter()
        .cloned()
        .fold(copy_bw.unwrap_or(0.0) / 1e12, f64::max)
        .max(0.1)
        * 1.15;
    let mut ch = ChartBuilder::on(&right)
        .caption(
            "weight stream bandwidth (bytes of W / time)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d((mmin..mmax).log_scale(), 0.0..ymax)?;
    ch.configure_mesh()
        .x_desc("M (tokens)")
        .y_desc("TB/s")
        .x_label_formatter(&crate::output::axis::count_tick)
        .y_label_formatter(&crate::output::axis::tick)
        .draw()?;
    if let Some(bw) = copy_bw {
        let y = bw / 1e12;
        ch.draw_series(LineSeries::new(
            vec![(mmin, y), (mmax, y)],
            BLACK.stroke_width(1),
        ))?
        .label(format!("copy bandwidth {y:.2} TB/s"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLACK));
    }
    for (i, col) in cols.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mut pts: Vec<(f64, f64)> = cases
            .iter()
            .filter(|((c, _), _)| c == col)
            .map(|((_, m), c)| (*m as f64, c.derived.weight_bytes_per_s / 1e12))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        ch.draw_series(LineSeries::new(pts, color.stroke_width(2)))?;
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

fn draw_fastest(shapes: &ShapeCases<'_>, path: &Path) -> PlotResult {
    let mut all_ms: Vec<usize> = shapes
        .iter()
        .flat_map(|(_, c)| c.keys().map(|(_, m)| *m))
        .collect();
    all_ms.sort_unstable();
    all_ms.dedup();
    let mut impls: Vec<String> = Vec::new();
    let mut grid: Vec<(usize, usize, String)> = Vec::new();
    for (si, (_, cases)) in shapes.iter().enumerate() {
        for (mi, m) in all_ms.iter().enumerate() {
            if let Some((c, _)) = cases
                .iter()
                .filter(|((_, mm), _)| mm == m)
                .map(|((c, _), x)| (c.clone(), x.total_s()))
                .min_by(|a, b| a.1.total_cmp(&b.1))
            {
                if !impls.contains(&c) {
                    impls.push(c.clone());
                }
                grid.push((si, mi, c));
            }
        }
    }
    let h = 90 + 40 * shapes.len() as u32;
    let root = SVGBackend::new(path, (1200, h)).into_drawing_area();
    root.fill(&WHITE)?;
    let (chart_area, legend_area) = root.split_horizontally(960);
    let mut ch = ChartBuilder::on(&chart_area)
        .caption(
            "fastest implementation per shape and M (FP8 incl. act. quant)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(110)
        .build_cartesian_2d(
            (0..all_ms.len().saturating_sub(1)).into_segmented(),
            (0..shapes.len().saturating_sub(1)).into_segmented(),
        )?;
    let ms2 = all_ms.clone();
    let names: Vec<String> = shapes.iter().map(|(s, _)| s.clone()).collect();
    let label = |v: &SegmentValue<usize>, list: &dyn Fn(usize) -> String| match v {
        SegmentValue::CenterOf(i) => list(*i),
        _ => String::new(),
    };
    ch.configure_mesh()
        .disable_mesh()
        .x_labels(all_ms.len() + 1)
        .y_labels(shapes.len() + 1)
        .x_label_formatter(&|v| {
            label(v, &|i| {
                ms2.get(i).map(|m| thousands(*m as u64)).unwrap_or_default()
            })
        })
        .y_label_formatter(&|v| label(v, &|i| names.get(i).cloned().unwrap_or_default()))
        .x_desc("M (tokens)")
        .draw()?;
    for (idx, imp) in impls.iter().enumerate() {
        let color = PALETTE[idx % PALETTE.len()];
        ch.draw_series(grid.iter().filter(|g| &g.2 == imp).map(|(si, mi, _)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(*mi), SegmentValue::Exact(*si)),
                    (SegmentValue::Exact(mi + 1), SegmentValue::Exact(si + 1)),
                ],
                color.filled(),
            )
        }))?;
        ch.draw_series(grid.iter().filter(|g| &g.2 == imp).map(|(si, mi, _)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(*mi), SegmentValue::Exact(*si)),
                    (SegmentValue::Exact(mi + 1), SegmentValue::Exact(si + 1)),
                ],
                WHITE.stroke_width(3),
            )
        }))?;
        let y = 50 + 24 * idx as i32;
        legend_area.draw(&Rectangle::new([(10, y - 7), (24, y + 7)], color.filled()))?;
        legend_area.draw(&Text::new(imp.clone(), (32, y - 7), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}
