//! Shared plotting pieces (plotters, SVG backend): the line-with-markers series every rigbench
//! chart draws and the kernel charts' palette.

use plotters::prelude::*;

/// A chart over `f64 × f64` axes (linear or log) on an SVG area.
pub type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// Draw `points` as a 2-px line of `color` with 3-px markers, and register `label` in the
/// legend (a short line of the same colour).
///
/// # Errors
/// The backend fails to draw (the message names the series).
pub fn line_with_points<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    points: &[(f64, f64)],
    color: RGBColor,
    label: &str,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("cannot draw series '{label}': {e}");
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(err)?
        .label(label.to_string())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2)));
    chart
        .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
        .map_err(|e| anyhow::anyhow!("cannot draw series '{label}': {e}"))?;
    Ok(())
}

/// The colours of kernel charts, in column order (matplotlib's `tab10`).
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
