//! The kernel cases as the tables and plots index them: per shape in suite order, keyed by
//! (column, M), the columns in rank order; and the flags read off a case or a column (noisy, a
//! separately timed activation quantization).

use std::collections::BTreeMap;

use crate::kernels::schema::{KernelCase, KernelResults};

/// Column key of a case: `bf16`, or `torch:torch.matmul` for peers.
fn col_key(c: &KernelCase) -> String {
    if c.provider == "rigbench" {
        c.implementation.clone()
    } else {
        format!("{}:{}", c.provider, c.implementation)
    }
}

/// Shapes in suite order with their cases indexed by (column, M).
pub(super) type ShapeCases<'a> = Vec<(String, BTreeMap<(String, usize), &'a KernelCase>)>;

pub(super) fn by_shape(k: &KernelResults) -> ShapeCases<'_> {
    let mut order: Vec<String> = Vec::new();
    let mut map: BTreeMap<String, BTreeMap<(String, usize), &KernelCase>> = BTreeMap::new();
    for c in &k.cases {
        if !order.contains(&c.shape) {
            order.push(c.shape.clone());
        }
        map.entry(c.shape.clone())
            .or_default()
            .insert((col_key(c), c.m), c);
    }
    order
        .into_iter()
        .map(|s| {
            let m = map.remove(&s).unwrap_or_default();
            (s, m)
        })
        .collect()
}

pub(super) fn columns(cases: &BTreeMap<(String, usize), &KernelCase>) -> Vec<String> {
    let mut cols: Vec<String> = cases.keys().map(|(c, _)| c.clone()).collect();
    cols.sort_by_key(|c| crate::kernels::composite::column_rank(c));
    cols.dedup();
    cols
}

/// A row is flagged as noisy when its σ/mean exceeds this many times the stopping target.
pub const NOISY_FACTOR: f64 = 3.0;

/// Whether `c`'s spread is far above the stopping target `target_rel_std`.
pub fn noisy(c: &KernelCase, target_rel_std: f64) -> bool {
    c.timing.rel_std > NOISY_FACTOR * target_rel_std.max(1e-6)
}

/// Whether a column's cases include a separately timed activation quantization.
pub(super) fn has_quant(cases: &BTreeMap<(String, usize), &KernelCase>, col: &str) -> bool {
    cases
        .iter()
        .any(|((c, _), x)| c == col && KernelCase::act_quant(&x.extra).is_some())
}

/// The column header: FP8 columns with a timed activation quantization say they include it.
pub(super) fn col_header(cases: &BTreeMap<(String, usize), &KernelCase>, col: &str) -> String {
    let fp8 = cases
        .iter()
        .any(|((c, _), x)| c == col && x.format == crate::formats::GemmFormat::Fp8);
    if has_quant(cases, col) {
        format!("{col} (+ act. quant)")
    } else if fp8 {
        format!("{col} (GEMM only: act. quant not timed)")
    } else {
        col.to_string()
    }
}
