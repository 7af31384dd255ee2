//! The decode-step composite chart (plotters, SVG backend), drawn from a [`Composite`].

use std::path::Path;

use plotters::prelude::*;

use crate::output::plot::{line_with_points, PALETTE};

use super::composite::Composite;

/// The decode-step composite chart: composite time (ms, log) against M (log) per
/// implementation, cold rows solid with markers, graph rows dashed in the same colour, and the
/// BF16, FP8 and NVFP4 byte floors as grey dashed horizontal lines. The crossover picture: where
/// two lines cross, the faster format changes.
///
/// # Errors
/// The chart cannot be drawn or the file written.
pub fn composite_chart(c: &Composite, path: &Path) -> anyhow::Result<()> {
    use super::composite::{column_rank, StepTiming};
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("composite chart: {e}");
    let mut cols: Vec<String> = c.rows.iter().map(|r| r.column()).collect();
    cols.sort_by_key(|x| column_rank(x));
    cols.dedup();
    let ms: Vec<f64> = c.rows.iter().map(|r| r.m as f64).collect();
    let (mmin, mmax) = (
        ms.iter().cloned().fold(f64::INFINITY, f64::min).max(1.0),
        ms.iter().cloned().fold(0.0, f64::max).max(2.0),
    );
    let mut ys: Vec<f64> = c.rows.iter().map(|r| r.median_s * 1e3).collect();
    ys.extend(c.floors.iter().filter_map(|f| f.floor_s.map(|s| s * 1e3)));
    ys.retain(|y| *y > 0.0 && y.is_finite());
    let (ymin, ymax) = (
        ys.iter().cloned().fold(f64::INFINITY, f64::min).max(1e-6),
        ys.iter().cloned().fold(0.0, f64::max).max(1e-5),
    );
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let caption = if c.step.complete {
        "decode-step composite: summed GEMM time of one step".to_string()
    } else {
        "decode-step composite (part of the step)".to_string()
    };
    let mut ch = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (mmin..mmax * 1.05).log_scale(),
            (ymin * 0.7..ymax * 1.4).log_scale(),
        )
        .map_err(|e| err(&e))?;
    ch.configure_mesh()
        .x_desc("M (tokens in flight)")
        .y_desc("ms per step (FP8 incl. act. quant)")
        // 10, 100, 1,000 rather than plotters' "10.0 … 10000.0".
        .x_label_formatter(&crate::output::axis::count_tick)
        .y_label_formatter(&crate::output::axis::tick)
        .draw()
        .map_err(|e| err(&e))?;
    for f in &c.floors {
        if let Some(s) = f.floor_s {
            let y = s * 1e3;
            let grey = RGBColor(120, 120, 120);
            ch.draw_series(DashedLineSeries::new(
                vec![(mmin, y), (mmax * 1.05, y)],
                6,
                4,
                grey.stroke_width(1),
            ))
            .map_err(|e| err(&e))?
            .label(format!("{} byte floor {:.2} ms", f.format, y))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], grey));
        }
    }
    for (i, col) in cols.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        for mode in [StepTiming::Cold, StepTiming::Graph] {
            let mut pts: Vec<(f64, f64)> = c
                .rows
                .iter()
                .filter(|r| &r.column() == col && r.timing == mode)
                .map(|r| (r.m as f64, r.median_s * 1e3))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            match mode {
                StepTiming::Cold => line_with_points(&mut ch, &pts, color, col)?,
                StepTiming::Graph => {
                    ch.draw_series(DashedLineSeries::new(pts, 8, 4, color.stroke_width(2)))
                        .map_err(|e| err(&e))?
                        .label(format!("{col} (graph)"))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(1))
                        });
                }
            }
        }
    }
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::kernels::composite::{Composite, CompositeRow, StepTiming};

    /// The composite chart's log axes read 1, 10, 100, 1,000 …, never `10.0` or `10000.0`.
    #[test]
    fn composite_axes_are_digit_grouped_without_spurious_decimals() {
        let mut c = Composite {
            step: Default::default(),
            copy_bytes_per_s: None,
            floors: Vec::new(),
            rows: Vec::new(),
            gaps: Vec::new(),
        };
        for (i, m) in [1usize, 16, 64, 256, 1024, 8192].into_iter().enumerate() {
            let median_s = 1e-3 * 1.5f64.powi(i as i32) * 20.0;
            c.rows.push(CompositeRow {
                provider: "rigbench".into(),
                implementation: "bf16".into(),
                format: crate::formats::GemmFormat::Bf16,
                m,
                timing: StepTiming::Cold,
                median_s,
                samples_s: vec![median_s],
                act_quant_included: false,
                act_quant_s: 0.0,
                act_quant_path: None,
                bf16_for: Vec::new(),
                weight_bytes: 1 << 30,
                floor_s: None,
                pct_of_floor: None,
                tok_per_s_bound: m as f64 / median_s,
            });
        }
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.svg");
        super::composite_chart(&c, &p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let labels: Vec<&str> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || ".,".contains(c)))
            .collect();
        assert!(labels.contains(&"1,000"), "{labels:?}");
        assert!(labels.contains(&"100"), "{labels:?}");
        for l in &labels {
            assert!(
                !l.ends_with(".0") && !l.contains("000."),
                "{l} in {labels:?}"
            );
            if l.len() > 3 && !l.contains('.') {
                assert!(l.contains(','), "{l} is not digit-grouped: {labels:?}");
            }
        }
    }
}
