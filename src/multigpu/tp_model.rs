//! The tensor-parallel decode-step composite at any degree t, predicted from ONE GPU's kernel
//! rows and a stated all-reduce model (docs/multi-gpu.md, "Tensor-parallel composite from one
//! GPU"). Every figure here is predicted, not measured.
//!
//! Sharding (Megatron-LM's tensor parallelism, as vLLM and SGLang run it):
//! - column-parallel (`qkv`, `gate_up`, `in_proj_qkvz`, `in_proj_ba`): each rank holds N/t
//!   output features, `[N/t, K]`;
//! - row-parallel (`o_proj`, `out_proj`, `down`): each rank holds K/t input features, `[N, K/t]`,
//!   and the partial outputs are summed by one all-reduce of hidden × M × 2 bytes (BF16);
//! - vocabulary-parallel `lm_head`: `[N/t, K]`.
//!
//! An uneven split gives the largest rank ⌈N/t⌉ (or ⌈K/t⌉); the step waits for it.
//!
//! Sharded GEMM time, per format and M, from the same run's rows: the least-squares line
//! `T(bytes) = T0 + bytes / BW` of that implementation at that M ([`crate::kernels::fit`]),
//! anchored at the shape's measured median T:
//! `T_t = max(T · b_t / b, T − (b − b_t) / BW)` with `b`, `b_t` the weight-stream bytes of the
//! whole and the sharded weight. The fixed cost T0 does not shrink with t; the `max` keeps the
//! estimate no better than the ideal split. Without a fit (fewer than two shapes at that M, or
//! time not growing with bytes) the ideal split `T · b_t / b` is used, and the row says so: it
//! is an optimistic bound.
//!
//! All-reduce ([`AllReduceModel`], nccl-tests `doc/PERFORMANCE.md`, "AllReduce"): algbw =
//! bytes / time, busbw = algbw · 2(t−1)/t, so `time(bytes, t) = α + bytes · 2(t−1)/t / busbw`.

use serde::{Deserialize, Serialize};

use super::schema::AllReduceWorld;
use crate::kernels::composite::{CompositeRow, StepTiming};
use crate::kernels::fit::{fit_line, fit_of, median_in};
use crate::kernels::schema::{KernelCase, StepShape};
use crate::kernels::suite::ModelInfo;
use crate::kernels::KernelResults;
use crate::RigError;

/// The recorded measurement the default all-reduce model comes from: NCCL 2.28.3 all-reduce
/// (BF16 sum) over the two H200 GPUs (NV18) of the committed 2-GPU report, relative to the
/// repository root.
pub const DEFAULT_SOURCE_FILE: &str =
    "reports/nvidia-h200-sm90-x2/20261130T230415Z/report/results.json";

/// Default α, seconds: the intercept of the least-squares line ([`AllReduceModel::fit_world`])
/// through the TP = 2 decode-size all-reduces (M = 1…256, 10 KiB…2.5 MiB) of
/// [`DEFAULT_SOURCE_FILE`]. A test recomputes it from that file.
pub const DEFAULT_ALPHA_S: f64 = 10.504_877_836_182_498e-6;

/// Default bus bandwidth, bytes/s: 1 / slope of the same line (x = bytes · 2(t−1)/t).
pub const DEFAULT_BUSBW_BYTES_PER_S: f64 = 161.691_810_197_233_6e9;

/// Bounds of `--allreduce-busbw`, GB/s.
pub const BUSBW_GBS_RANGE: (f64, f64) = (0.1, 10_000.0);
/// Bounds of `--allreduce-latency`, µs.
pub const LATENCY_US_RANGE: (f64, f64) = (0.0, 10_000.0);

/// Default tensor-parallel degrees.
pub const DEFAULT_DEGREES: [usize; 3] = [2, 4, 8];

/// The words every figure of this part carries.
pub const PREDICTED: &str = "predicted, not measured";

/// The all-reduce time model: `time(bytes, t) = α + bytes · 2(t−1)/t / busbw` for t ≥ 2, 0 for
/// t = 1 (nccl-tests `doc/PERFORMANCE.md`: busbw = algbw · 2(t−1)/t, algbw = bytes / time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllReduceModel {
    /// Fixed cost of one all-reduce, seconds.
    pub alpha_s: f64,
    /// Bus bandwidth, bytes/s.
    pub busbw_bytes_per_s: f64,
    /// Where α and busbw come from.
    pub source: String,
}

impl Default for AllReduceModel {
    fn default() -> Self {
        Self::recorded_default()
    }
}

impl AllReduceModel {
    /// The model fitted to the committed 2-GPU H200 report ([`DEFAULT_SOURCE_FILE`]).
    pub fn recorded_default() -> Self {
        Self {
            alpha_s: DEFAULT_ALPHA_S,
            busbw_bytes_per_s: DEFAULT_BUSBW_BYTES_PER_S,
            source: format!(
                "least-squares line through NCCL 2.28.3 all-reduces measured at TP = 2 on 2 × H200 (NV18, NCCL_NVLS_ENABLE=0) at the decode sizes 10 KiB…2.5 MiB, {DEFAULT_SOURCE_FILE}"
            ),
        }
    }

    /// The default with `--allreduce-busbw` (GB/s) and/or `--allreduce-latency` (µs) in its
    /// place; the source says which value came from where.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] naming the flag for a value outside [`BUSBW_GBS_RANGE`] /
    /// [`LATENCY_US_RANGE`] or not finite.
    pub fn with_flags(busbw_gbs: Option<f64>, latency_us: Option<f64>) -> Result<Self, RigError> {
        let mut m = Self::recorded_default();
        if busbw_gbs.is_none() && latency_us.is_none() {
            return Ok(m);
        }
        let check = |v: f64, (lo, hi): (f64, f64), flag: &str, unit: &str| {
            if v.is_finite() && v >= lo && v <= hi {
                Ok(v)
            } else {
                Err(RigError::flag(
                    flag,
                    format!("{v} {unit} is outside {lo}…{hi} {unit}; give the all-reduce figure of your interconnect (nccl-tests all_reduce_perf reports busbw in GB/s and time in µs)"),
                ))
            }
        };
        let mut parts = Vec::new();
        if let Some(b) = busbw_gbs {
            m.busbw_bytes_per_s = check(b, BUSBW_GBS_RANGE, "--allreduce-busbw", "GB/s")? * 1e9;
            parts.push(format!("busbw {b} GB/s from --allreduce-busbw"));
        }
        if let Some(l) = latency_us {
            m.alpha_s = check(l, LATENCY_US_RANGE, "--allreduce-latency", "µs")? * 1e-6;
            parts.push(format!("α {l} µs from --allreduce-latency"));
        }
        m.source = if busbw_gbs.is_some() && latency_us.is_some() {
            parts.join(", ")
        } else {
            format!(
                "{}; the other value from the {}",
                parts.join(", "),
                m.source
            )
        };
        Ok(m)
    }

    /// Time of one all-reduce of `bytes` (per rank) over `t` GPUs, seconds; 0 for t ≤ 1.
    pub fn time_s(&self, bytes: u64, t: usize) -> f64 {
        if t <= 1 {
            return 0.0;
        }
        let f = 2.0 * (t as f64 - 1.0) / t as f64;
        self.alpha_s + bytes as f64 * f / self.busbw_bytes_per_s
    }

    /// The model as one line of text, with its source.
    pub fn describe(&self) -> String {
        format!(
            "all-reduce time(bytes, t) = α + bytes · 2(t−1)/t / busbw (nccl-tests' busbw), α = {:.2} µs, busbw = {:.1} GB/s ({})",
            self.alpha_s * 1e6,
            self.busbw_bytes_per_s / 1e9,
            self.source
        )
    }

    /// α and busbw of the least-squares line through a measured communicator's decode-size
    /// points (those with an M): x = bytes · 2(n−1)/n, y = median time; α = intercept, busbw =
    /// 1 / slope. `None` with fewer than two sizes, fewer than two ranks, or a slope ≤ 0.
    pub fn fit_world(world: &AllReduceWorld) -> Option<(f64, f64)> {
        let n = world.devices.len();
        if n < 2 {
            return None;
        }
        let f = 2.0 * (n as f64 - 1.0) / n as f64;
        let pts: Vec<(f64, f64)> = world
            .points
            .iter()
            .filter(|p| p.m.is_some() && p.timing.median_s > 0.0)
            .map(|p| (p.bytes as f64 * f, p.timing.median_s))
            .collect();
        let fit = fit_line(&pts)?;
        Some((fit.t0_s, fit.bytes_per_s?))
    }
}

/// How a linear layer is split over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Output features split: `[N/t, K]`.
    Column,
    /// Input features split: `[N, K/t]`; its output is all-reduced.
    Row,
    /// The LM head's vocabulary split: `[N/t, K]`.
    Vocab,
}

impl Split {
    /// `column`, `row`, `vocab`.
    pub fn id(self) -> &'static str {
        match self {
            Self::Column => "column",
            Self::Row => "row",
            Self::Vocab => "vocab",
        }
    }
}

/// The split of a Qwen3.6 linear layer by its suite shape name; `None` for a name this model
/// does not know (that shape then takes the ideal split, and the row says so).
pub fn split_of(shape: &str) -> Option<Split> {
    match shape {
        "qkv" | "gate_up" | "in_proj_qkvz" | "in_proj_ba" => Some(Split::Column),
        "o_proj" | "out_proj" | "down" => Some(Split::Row),
        "lm_head" => Some(Split::Vocab),
        _ => None,
    }
}

/// The largest rank's `[N, K]` of an `[n, k]` weight split `split` over `t` ranks.
pub fn sharded(n: usize, k: usize, t: usize, split: Split) -> (usize, usize) {
    let t = t.max(1);
    match split {
        Split::Column | Split::Vocab => (n.div_ceil(t), k),
        Split::Row => (n, k.div_ceil(t)),
    }
}

/// How one sharded GEMM was estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimate {
    /// The format's fitted line at that M, anchored at the shape's measured time.
    Fit,
    /// The ideal split (time × sharded bytes / bytes): optimistic.
    IdealSplit,
}

/// One shape of one predicted row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRow {
    /// Shape name.
    pub shape: String,
    /// Its split (`None`: a name the model does not know; ideal split used).
    pub split: Option<Split>,
    /// The largest rank's N and K.
    pub n: usize,
    /// See `n`.
    pub k: usize,
    /// GEMMs of it per step.
    pub count: u32,
    /// Measured one-GPU median of the whole shape, seconds.
    pub one_gpu_s: f64,
    /// Estimated median of the sharded GEMM, seconds (predicted).
    pub sharded_s: f64,
    /// Which estimate.
    pub estimate: Estimate,
}

/// One predicted point: an implementation at one M and one TP degree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpModelRow {
    /// Implementation (as the composite names it).
    pub implementation: String,
    /// Decode batch M.
    pub m: usize,
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Σ count × sharded GEMM time, seconds (predicted).
    pub gemm_s: f64,
    /// FP8's activation quantization, kept at its one-GPU time, seconds.
    pub act_quant_s: f64,
    /// All-reduces of the step from the model, seconds (0 at TP = 1).
    pub allreduce_s: f64,
    /// `gemm_s + act_quant_s + allreduce_s`.
    pub total_s: f64,
    /// The ideal-split bound: one-GPU composite / t + all-reduces (what the 2-GPU report's
    /// prediction computed with a measured all-reduce).
    pub ideal_total_s: f64,
    /// TP = 1 total / this total.
    pub speedup_vs_tp1: f64,
    /// Per shape, the sharded estimate.
    pub shards: Vec<ShardRow>,
}

impl TpModelRow {
    /// `fit for all 8 shapes` or `fit 7, ideal split 1 (in_proj_ba: no fit at this M)`.
    pub fn estimate_summary(&self) -> String {
        let fit = self
            .shards
            .iter()
            .filter(|s| s.estimate == Estimate::Fit)
            .count();
        let ideal: Vec<&str> = self
            .shards
            .iter()
            .filter(|s| s.estimate == Estimate::IdealSplit)
            .map(|s| s.shape.as_str())
            .collect();
        if self.tp == 1 {
            return "measured rows (the one-GPU composite)".into();
        }
        if ideal.is_empty() {
            format!("fitted line for all {fit} shapes")
        } else {
            format!(
                "fitted line {fit}, ideal split (optimistic) {}: {}",
                ideal.len(),
                ideal.join(", ")
            )
        }
    }
}

/// The tensor-parallel composite predicted from one GPU's rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpModel {
    /// Always [`PREDICTED`].
    pub status: String,
    /// One line: what the figures are, from what, under which models.
    pub conditions: String,
    /// The all-reduce model.
    pub allreduce: AllReduceModel,
    /// Hidden size of the suite's model.
    pub hidden_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// All-reduces per layer.
    pub allreduces_per_layer: usize,
    /// Timing mode of the rows used (`cold` or `graph`).
    pub timing: StepTiming,
    /// Whether the suite's shapes cover the whole decode step.
    pub step_complete: bool,
    /// Rows, per implementation, M and TP (ascending; TP = 1 first).
    pub rows: Vec<TpModelRow>,
    /// What the prediction leaves out.
    pub leaves_out: Vec<String>,
}

/// What this prediction leaves out (printed with it).
pub const LEAVES_OUT: &[&str] = &[
    "it is predicted from one GPU's GEMM rows and an all-reduce model, not measured on several GPUs",
    "the sharded GEMM is estimated from the same format's fitted line at that M (or the ideal split where there is no fit): a kernel may pick another tile or split-K for the smaller shape",
    "FP8's activation quantization is kept at its one-GPU time (its input is not smaller for column-parallel layers; at decode M it is a fixed-cost kernel)",
    "attention and Gated-DeltaNet kernels (whose heads split over the ranks), norms, activations, embeddings, sampling and launch gaps are not included",
    "all-reduces follow the α + bytes · 2(t−1)/t / busbw model; engines may use their own all-reduce for small messages (vLLM's custom all-reduce), fuse it with the norm, or overlap it with compute; NVLink topology beyond the measured pair (NVSwitch at 4 and 8 GPUs) is assumed to give the same busbw",
    "the vocabulary-parallel lm_head's gather of the logits is not included",
];

fn column_of(c: &KernelCase) -> bool {
    c.provider == "rigbench"
}

/// The case of `implementation` (or rigbench's `bf16` when the composite counts it there) for
/// `shape` at `m` with a median in `mode`.
fn case_for<'a>(
    k: &'a KernelResults,
    row: &CompositeRow,
    shape: &str,
    mode: StepTiming,
) -> Option<(&'a KernelCase, f64)> {
    let imp = if row.bf16_for.iter().any(|s| s == shape) {
        "bf16"
    } else {
        row.implementation.as_str()
    };
    k.cases
        .iter()
        .filter(|c| column_of(c) && c.implementation == imp && c.shape == shape && c.m == row.m)
        .find_map(|c| Some((c, median_in(c, mode)?)))
}

/// Predict the TP composite at TP = 1 and every degree in `degrees` for each of rigbench's own
/// composite rows (cold timing when there is any, else graph), from `k`'s cases and `ar`.
///
/// # Errors
/// A sentence naming what is missing: no composite, no rigbench row, or a composite shape
/// without its case.
pub fn predict(
    k: &KernelResults,
    model: &ModelInfo,
    ar: &AllReduceModel,
    degrees: &[usize],
) -> Result<TpModel, String> {
    let comp = k.composite.as_ref().ok_or(super::tp::NO_COMPOSITE)?;
    let own: Vec<&CompositeRow> = comp
        .rows
        .iter()
        .filter(|r| r.provider == "rigbench")
        .collect();
    let mode = if own.iter().any(|r| r.timing == StepTiming::Cold) {
        StepTiming::Cold
    } else {
        StepTiming::Graph
    };
    let own: Vec<&CompositeRow> = own.into_iter().filter(|r| r.timing == mode).collect();
    if own.is_empty() {
        return Err("the composite has no rows of rigbench's own implementations".into());
    }
    let mut tps: Vec<usize> = std::iter::once(1)
        .chain(degrees.iter().copied().filter(|t| *t >= 1))
        .collect();
    tps.sort_unstable();
    tps.dedup();
    let mut rows = Vec::new();
    for r in own {
        let cases: Vec<(&StepShape, &KernelCase, f64)> = comp
            .step
            .shapes
            .iter()
            .map(|s| {
                case_for(k, r, &s.shape, mode)
                    .map(|(c, t)| (s, c, t))
                    .ok_or_else(|| {
                        format!(
                            "{} at M = {} has no {} case for shape {}",
                            r.implementation,
                            r.m,
                            mode.id(),
                            s.shape
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        let bytes = super::decode_message_bytes(model.hidden_size, r.m);
        let per_step = model.allreduces_per_layer * model.layers;
        let mut tp1_total = None;
        for &t in &tps {
            let shards: Vec<ShardRow> = cases
                .iter()
                .map(|(s, c, time)| shard(k, s, c, *time, t, mode))
                .collect();
            let gemm: f64 = shards.iter().map(|s| s.count as f64 * s.sharded_s).sum();
            let one_gpu: f64 = shards.iter().map(|s| s.count as f64 * s.one_gpu_s).sum();
            let allreduce = per_step as f64 * ar.time_s(bytes, t);
            let total = gemm + r.act_quant_s + allreduce;
            let tp1 = *tp1_total.get_or_insert(total);
            rows.push(TpModelRow {
                implementation: r.implementation.clone(),
                m: r.m,
                tp: t,
                gemm_s: gemm,
                act_quant_s: r.act_quant_s,
                allreduce_s: allreduce,
                total_s: total,
                ideal_total_s: one_gpu / t as f64 + r.act_quant_s + allreduce,
                speedup_vs_tp1: tp1 / total,
                shards,
            });
        }
    }
    let conditions = format!(
        "{PREDICTED}: tensor-parallel decode-step composite from this GPU's {} rows ({}{}), sharded per Megatron-LM (column-parallel N/t, row-parallel K/t, vocabulary-parallel lm_head N/t), each sharded GEMM from its format's fitted T0 + bytes/BW at that M anchored at the shape's measured time (else the ideal split, optimistic), plus {} × {} layers all-reduces of hidden {} × M × 2 bytes with the {}",
        mode.id(),
        comp.step.description,
        if comp.step.complete { "" } else { "; PART of the step only" },
        model.allreduces_per_layer,
        model.layers,
        model.hidden_size,
        ar.describe()
    );
    Ok(TpModel {
        status: PREDICTED.into(),
        conditions,
        allreduce: ar.clone(),
        hidden_size: model.hidden_size,
        layers: model.layers,
        allreduces_per_layer: model.allreduces_per_layer,
        timing: mode,
        step_complete: comp.step.complete,
        rows,
        leaves_out: LEAVES_OUT.iter().map(|s| s.to_string()).collect(),
    })
}

fn shard(
    k: &KernelResults,
    s: &StepShape,
    c: &KernelCase,
    time: f64,
    t: usize,
    mode: StepTiming,
) -> ShardRow {
    let split = split_of(&s.shape);
    let (n, kk) = sharded(s.n, s.k, t, split.unwrap_or(Split::Column));
    let b = c.format.weight_stream_bytes(s.n, s.k) as f64;
    let bt = c.format.weight_stream_bytes(n, kk) as f64;
    let ideal = if b > 0.0 {
        time * bt / b
    } else {
        time / t as f64
    };
    let fit = split
        .and_then(|_| fit_of(k, &c.implementation, c.m, mode))
        .and_then(|f| f.bytes_per_s);
    let (sharded_s, estimate) = match fit {
        _ if t <= 1 => (time, Estimate::Fit),
        Some(bw) if bw > 0.0 => ((time - (b - bt) / bw).max(ideal), Estimate::Fit),
        _ => (ideal, Estimate::IdealSplit),
    };
    ShardRow {
        shape: s.shape.clone(),
        split,
        n,
        k: kk,
        count: s.count,
        one_gpu_s: time,
        sharded_s,
        estimate,
    }
}

/// Render the section (`## Tensor-parallel composite (predicted, not measured)`): the
/// conditions line, one row per implementation, M and TP with the estimate it used, and what
/// the prediction leaves out.
pub fn markdown(tp: &TpModel) -> String {
    use crate::output::table::{human_seconds, markdown_table};
    let mut o = format!("## Tensor-parallel composite ({PREDICTED})\n\n");
    o.push_str(&format!("Conditions: {}.\n\n", tp.conditions));
    if !tp.step_complete {
        o.push_str("The suite covers only PART of the decode step's linear layers: the figures are of that part.\n\n");
    }
    let rows: Vec<Vec<String>> = tp
        .rows
        .iter()
        .map(|r| {
            vec![
                r.implementation.clone(),
                r.m.to_string(),
                r.tp.to_string(),
                human_seconds(r.gemm_s),
                if r.act_quant_s > 0.0 {
                    human_seconds(r.act_quant_s)
                } else {
                    "—".into()
                },
                human_seconds(r.allreduce_s),
                human_seconds(r.total_s),
                human_seconds(r.ideal_total_s),
                format!("{:.2}×", r.speedup_vs_tp1),
                r.estimate_summary(),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "Implementation",
            "M",
            "TP",
            "GEMMs per rank (predicted)",
            "FP8 act. quant",
            "All-reduces (model)",
            "Step total (predicted)",
            "Ideal split C/t + all-reduces",
            "Speedup vs TP=1",
            "Sharded GEMMs estimated by",
        ],
        &rows,
    ));
    o.push_str("\nWhat it leaves out:\n\n");
    for l in &tp.leaves_out {
        o.push_str(&format!("- {l}\n"));
    }
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allreduce_model_follows_nccl_tests() {
        let m = AllReduceModel {
            alpha_s: 10e-6,
            busbw_bytes_per_s: 100e9,
            source: "test".into(),
        };
        assert_eq!(m.time_s(1 << 20, 1), 0.0);
        // t = 2: factor 1 → 10 µs + 1 MB / 100 GB/s = 20 µs.
        assert!((m.time_s(1_000_000, 2) - 20e-6).abs() < 1e-15);
        // t = 8: factor 1.75 → 10 + 17.5 µs.
        assert!((m.time_s(1_000_000, 8) - 27.5e-6).abs() < 1e-15);
        // Monotone in t at fixed bytes, for several sizes.
        for bytes in [0u64, 10_240, 2_621_440, 512 << 20] {
            let ts: Vec<f64> = (1..=16).map(|t| m.time_s(bytes, t)).collect();
            assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{bytes}: {ts:?}");
        }
        // busbw from a time at t reproduces nccl-tests' busbw definition.
        let t = m.time_s(1 << 30, 4) - m.alpha_s;
        let algbw = (1u64 << 30) as f64 / t;
        assert!(
            (crate::multigpu::allreduce::allreduce_busbw(algbw, 4) / 100e9 - 1.0).abs() < 1e-12
        );
    }

    #[test]
    fn flags_are_bounded_and_named() {
        let d = AllReduceModel::with_flags(None, None).unwrap();
        assert_eq!(d, AllReduceModel::recorded_default());
        assert!(d.source.contains(DEFAULT_SOURCE_FILE));
        let m = AllReduceModel::with_flags(Some(400.0), None).unwrap();
        assert_eq!(m.busbw_bytes_per_s, 400e9);
        assert_eq!(m.alpha_s, DEFAULT_ALPHA_S);
        assert!(m.source.contains("--allreduce-busbw") && m.source.contains(DEFAULT_SOURCE_FILE));
        let m = AllReduceModel::with_flags(Some(300.0), Some(5.0)).unwrap();
        assert_eq!(m.busbw_bytes_per_s, 300e9);
        assert!((m.alpha_s - 5e-6).abs() < 1e-18, "{}", m.alpha_s);
        assert!(!m.source.contains(DEFAULT_SOURCE_FILE));
        for (b, l, flag) in [
            (Some(0.0), None, "--allreduce-busbw"),
            (Some(f64::NAN), None, "--allreduce-busbw"),
            (Some(1e6), None, "--allreduce-busbw"),
            (None, Some(-1.0), "--allreduce-latency"),
            (None, Some(f64::INFINITY), "--allreduce-latency"),
        ] {
            let e = AllReduceModel::with_flags(b, l).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn shards_follow_megatron() {
        assert_eq!(split_of("qkv"), Some(Split::Column));
        assert_eq!(split_of("down"), Some(Split::Row));
        assert_eq!(split_of("lm_head"), Some(Split::Vocab));
        assert_eq!(split_of("mystery"), None);
        assert_eq!(sharded(34816, 5120, 4, Split::Column), (8704, 5120));
        assert_eq!(sharded(5120, 17408, 8, Split::Row), (5120, 2176));
        assert_eq!(sharded(248320, 5120, 8, Split::Vocab), (31040, 5120));
        // Uneven: the largest rank.
        assert_eq!(sharded(96, 5120, 5, Split::Column), (20, 5120));
        assert_eq!(sharded(10, 10, 1, Split::Row), (10, 10));
    }
}
