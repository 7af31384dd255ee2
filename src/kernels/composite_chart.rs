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
