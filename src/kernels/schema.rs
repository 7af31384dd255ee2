//! Result types of the kernel benches (part of the versioned results schema, see
//! [`crate::report::schema`]).

use serde::{Deserialize, Serialize};

use crate::formats::GemmFormat;
use crate::stats::{StopReason, StoppingRule};

/// Everything one `rigbench kernels` run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelResults {
    /// The suite that was run.
    pub suite: SuiteInfo,
    /// How every case was timed.
    pub timing_policy: Option<TimingPolicy>,
    /// Device-to-device copy bandwidth measured in the same run (the memory roofline).
    pub copy_bandwidth: Option<CopyBandwidth>,
    /// Timed cases (rigbench's own implementations and peers).
    pub cases: Vec<KernelCase>,
    /// Cases not run, with the reason.
    pub skipped: Vec<SkippedCase>,
    /// Registers, spills and shared memory of rigbench's own kernels.
    pub kernel_facts: Vec<KernelFacts>,
    /// Bit-exactness across repeated runs (`--check-determinism`).
    pub determinism: Vec<DeterminismResult>,
    /// CPU-reference accuracy of each format on fixed seeded data (deterministic; runs without a
    /// GPU and feeds CI baselines).
    pub reference_accuracy: Vec<AccuracyCase>,
    /// Peer providers: which were available and why not.
    pub peers: Vec<PeerStatus>,
    /// Notes and warnings about the run (throttling seen, caps hit).
    pub notes: Vec<String>,
    /// The decode-step composite (summed GEMM time of one decode step per implementation and
    /// M), when the suite gives each shape's count per step; see [`super::composite`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composite: Option<super::composite::Composite>,
    /// The suite's mixture-of-experts grouped GEMM cases (suites with `[moe]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_grouped: Option<GroupedResults>,
    /// How the suite was repeated (`--repeats R` with R ≥ 2): each case's samples are the
    /// repeats' samples in repeat order, and this says how many came from each repeat. Absent
    /// for one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<SuiteRepeats>,
    /// SHA-256 (hex) of each CUDA source this run built its kernels from, by file
    /// (`kernels/w4a16.cu`), so that a result names the exact kernel code it timed (the same
    /// hash keys the compiled-kernel cache, docs/architecture.md "GPU layer"). Absent in
    /// results written before it existed and in runs that built no kernel.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kernel_sources: std::collections::BTreeMap<String, String>,
}

/// Identity of a suite.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SuiteInfo {
    /// Suite name (e.g. `qwen3.6-27b`).
    pub name: String,
    /// Where it was read from.
    pub file: String,
    /// One-line description.
    pub description: String,
    /// The decode step the suite's shapes make up (each shape's count per step), when the suite
    /// gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_step: Option<DecodeStep>,
}

/// One decode step of the suite's model as GEMM shapes with their counts (suite TOML:
/// `[decode_step]` and each shape's `per_step`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecodeStep {
    /// What the step is (e.g. `one Qwen3.6-27B decode step: ...`).
    pub description: String,
    /// Whether the shapes cover every linear layer of the step (false for a subset suite such
    /// as `smoke`, or when `--shapes` left shapes out): then the composite is a part of the
    /// step's time, and the report says so.
    pub complete: bool,
    /// The shapes, in suite order, with their counts.
    pub shapes: Vec<StepShape>,
}

/// A shape and how many times it runs in one decode step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepShape {
    /// Shape name.
    pub shape: String,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// GEMMs of this shape per decode step (e.g. 64 for an MLP projection in 64 layers).
    pub count: u32,
}

/// How cases are timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingPolicy {
    /// Warm-up launches before sampling.
    pub warmup_iters: usize,
    /// Stopping rule.
    pub stopping: StoppingRule,
    /// Bytes written to flush L2 before each sample (0 = warm L2).
    pub l2_flush_bytes: u64,
    /// Timer used: CUDA events with timing enabled around each launch.
    pub timer: String,
    /// Which timing modes ran (`--timing`).
    #[serde(default)]
    pub modes: TimingModes,
    /// How graph timing was set up, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphPolicy>,
}

/// The timing modes of a run (`--timing`; docs/architecture.md, "Terms").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TimingModes {
    /// One launch between CUDA events after an L2 flush (unless `--warm-l2`).
    #[default]
    Cold,
    /// Back-to-back launches over rotating weight copies larger than L2, captured in a CUDA
    /// graph; per-GEMM time = graph time / launches.
    Graph,
    /// Both: cold is the primary timing, graph is reported beside it.
    Both,
}

impl TimingModes {
    /// Whether cold (event) timing runs.
    pub fn cold(self) -> bool {
        matches!(self, Self::Cold | Self::Both)
    }
    /// Whether graph timing runs.
    pub fn graph(self) -> bool {
        matches!(self, Self::Graph | Self::Both)
    }
}

/// How graph timing is set up (the same rule for rigbench's implementations and peers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphPolicy {
    /// The weight copies of one case total more than this many bytes (4 × L2).
    pub min_total_weight_bytes: u64,
    /// At least this many GEMM launches per graph (a multiple of the copy count).
    pub min_launches: usize,
    /// In words.
    pub description: String,
}

/// The set-up of one graph timing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphSetup {
    /// GEMM launches captured in the graph (each sample is the graph's time / this).
    pub launches: usize,
    /// Weight copies the launches rotate over.
    pub weight_copies: usize,
    /// Bytes of all the copies together.
    pub weight_bytes_total: u64,
}

/// Graph timings of a case timed in both modes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphTimings {
    /// The GEMM, per launch.
    pub timing: Timing,
    /// Extra parts (e.g. FP8 activation quantization), back to back in their own graph.
    #[serde(default)]
    pub extra: Vec<NamedTiming>,
}

/// SM clock and throttle reasons polled (NVML) while a case was sampled.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockStats {
    /// Readings taken in the case's window.
    pub readings: usize,
    /// Lowest SM clock read, MHz.
    pub min_mhz: Option<u32>,
    /// Median SM clock read, MHz.
    pub median_mhz: Option<u32>,
    /// Highest SM clock read, MHz.
    pub max_mhz: Option<u32>,
    /// Every harmful throttle reason seen in any reading (sorted, no repeats).
    pub throttle_seen: Vec<String>,
    /// Where the readings came from and how often (e.g. `nvml every 20 ms`).
    pub source: String,
}

/// Device-to-device copy bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyBandwidth {
    /// Bytes copied per launch (each counted once read and once written in `bytes_per_s`).
    pub bytes: u64,
    /// Median time, seconds.
    pub median_s: f64,
    /// (read + written bytes) / median time.
    pub bytes_per_s: f64,
    /// Samples taken.
    pub samples: usize,
}

/// One timed GEMM case: `C[M, N] = A[M, K] · W[N, K]ᵀ`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelCase {
    /// Who provides the implementation: `rigbench`, or a peer such as `torch`.
    pub provider: String,
    /// Implementation id (`bf16`, `fp8`, `w4a16`; peers: `torch.matmul`, ...).
    pub implementation: String,
    /// The format it computes.
    pub format: GemmFormat,
    /// Shape name from the suite (e.g. `gate_up`).
    pub shape: String,
    /// Tokens (rows of activations).
    pub m: usize,
    /// Output features (rows of the weight).
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// What actually ran (library and algorithm, or kernel variant and launch shape).
    pub path: String,
    /// The correctness check that gated the timing.
    pub check: Option<CheckResult>,
    /// Timing of the GEMM itself.
    pub timing: Timing,
    /// Other timed parts reported separately (e.g. FP8 activation quantization).
    pub extra: Vec<NamedTiming>,
    /// Figures derived from the timing.
    pub derived: Derived,
    /// SM clock while the case was sampled, MHz (the median of [`KernelCase::clocks`]; in
    /// results written before per-case polling, one read after the case's (shape, M) group).
    pub sm_clock_mhz: Option<u32>,
    /// Harmful throttle reasons seen while the case was sampled.
    pub throttle: Vec<String>,
    /// Graph timing beside the primary one (`--timing both`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphTimings>,
    /// Why graph timing did not run for this case, when it was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_skip: Option<String>,
    /// SM clock and throttle reasons polled while the case was sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clocks: Option<ClockStats>,
}

/// Name of the FP8 activation-quantization part in [`KernelCase::extra`].
pub const ACT_QUANT: &str = "activation_quant";

impl KernelCase {
    /// The cold (event) timing, if this case has one.
    pub fn cold_timing(&self) -> Option<&Timing> {
        self.timing.graph.is_none().then_some(&self.timing)
    }

    /// The graph timing and its extra parts, if this case has one.
    pub fn graph_timings(&self) -> Option<(&Timing, &[NamedTiming])> {
        if self.timing.graph.is_some() {
            Some((&self.timing, &self.extra))
        } else {
            self.graph.as_ref().map(|g| (&g.timing, g.extra.as_slice()))
        }
    }

    /// The activation-quantization part of `extra`, if timed.
    pub fn act_quant(extra: &[NamedTiming]) -> Option<&Timing> {
        extra
            .iter()
            .find(|e| e.name == ACT_QUANT)
            .map(|e| &e.timing)
    }

    /// What one GEMM of this implementation costs in the primary timing, seconds: the GEMM's
    /// median plus the median of its activation quantization when that is timed separately
    /// (FP8). This is the time the "fastest" column, crossovers and the composite use.
    pub fn total_s(&self) -> f64 {
        self.timing.median_s + Self::act_quant(&self.extra).map_or(0.0, |t| t.median_s)
    }

    /// [`KernelCase::total_s`] under graph timing.
    pub fn graph_total_s(&self) -> Option<f64> {
        let (t, extra) = self.graph_timings()?;
        Some(t.median_s + Self::act_quant(extra).map_or(0.0, |q| q.median_s))
    }
}

/// A correctness check against a reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// What the output was compared with (e.g. `cpu-f64 of dequantized operands`).
    pub reference: String,
    /// Error metric (`rel_l2` = ‖out − ref‖₂ / ‖ref‖₂).
    pub metric: String,
    /// Measured error.
    pub value: f64,
    /// Name of the tolerance applied (e.g. `BF16_OUTPUT_REL_L2`).
    pub tolerance_name: String,
    /// The tolerance.
    pub tolerance: f64,
    /// `value <= tolerance` and no NaN and every output written.
    pub passed: bool,
}

/// Samples and their summary, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Every sample, seconds.
    pub samples_s: Vec<f64>,
    /// Median, seconds.
    pub median_s: f64,
    /// 10th percentile, seconds.
    pub p10_s: f64,
    /// 90th percentile, seconds.
    pub p90_s: f64,
    /// σ/mean of the samples.
    pub rel_std: f64,
    /// Why sampling stopped.
    pub stop_reason: Option<StopReason>,
    /// Whether L2 was flushed before each sample.
    pub cold_l2: bool,
    /// Set when this is a graph timing (then `cold_l2` is false and each sample is one graph
    /// launch's time divided by its GEMM launches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphSetup>,
}

/// A named timing (e.g. `activation_quant`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedTiming {
    /// What was timed.
    pub name: String,
    /// Its timing.
    pub timing: Timing,
}

/// Figures derived from a case's median time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Derived {
    /// 2·M·N·K / median time, in TFLOP/s.
    pub tflops: f64,
    /// Bytes of the weight stream (elements + scales).
    pub weight_bytes: u64,
    /// Weight bytes / median time.
    pub weight_bytes_per_s: f64,
    /// `weight_bytes_per_s` as a percentage of the measured copy bandwidth.
    pub pct_copy_bw: Option<f64>,
    /// rigbench's `bf16` median / this median at the same shape and M (one denominator for
    /// every provider; results written before it was so used the same provider's bf16 row for
    /// peers, which is why the report recomputes speedups from the medians).
    pub speedup_vs_bf16: Option<f64>,
}

/// A case not run, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedCase {
    /// Provider.
    pub provider: String,
    /// Implementation id.
    pub implementation: String,
    /// Shape name, or `*` for all.
    pub shape: String,
    /// M, or `None` for all.
    pub m: Option<usize>,
    /// Why.
    pub reason: String,
}

/// Resource use of one compiled kernel (`cuFuncGetAttribute`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelFacts {
    /// Kernel (function) name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Local memory per thread, bytes (non-zero = spills or local arrays).
    pub local_bytes: u32,
    /// Static shared memory per block, bytes.
    pub static_shared_bytes: u32,
    /// Dynamic shared memory requested per block, bytes.
    pub dynamic_shared_bytes: u32,
    /// Threads per block launched.
    pub threads_per_block: u32,
    /// Max threads per block the function allows.
    pub max_threads_per_block: u32,
    /// Architecture compiled for.
    pub arch: String,
}

/// Outcome of running one implementation several times on the same inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeterminismResult {
    /// Provider.
    pub provider: String,
    /// Implementation id.
    pub implementation: String,
    /// What ran (library and algorithm, or kernel variant).
    #[serde(default)]
    pub path: String,
    /// Shape name.
    pub shape: String,
    /// M.
    pub m: usize,
    /// Runs compared.
    pub runs: usize,
    /// Whether every run's output was bit-identical to the first.
    pub bit_exact: bool,
    /// Output elements that differed in the worst run.
    pub differing_elements: usize,
}

/// Accuracy of a format's arithmetic against an exact reference, on fixed seeded data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccuracyCase {
    /// Format.
    pub format: GemmFormat,
    /// `m×n×k` of the test GEMM.
    pub shape: String,
    /// Data distribution and seed (e.g. `normal(0,1) seed 1`).
    pub data: String,
    /// Short stable id of the data set (`plain`, `outliers`), used in metric ids
    /// (`kernels/reference_accuracy/<format>/<shape>/<data_id>/rel_l2_vs_exact`); empty in
    /// results written before it existed.
    #[serde(default)]
    pub data_id: String,
    /// ‖C_format − C_exact‖₂ / ‖C_exact‖₂ where C_exact uses the unquantized f64 operands.
    pub rel_l2_vs_exact: f64,
    /// The same error over the non-outlier channels only (the GEMM summed over the K indices
    /// that are not outliers), for data sets with outlier channels; `None` otherwise and in
    /// results written before it existed. The outlier channels dominate ‖C_exact‖₂ and are
    /// represented almost exactly (each is its block's maximum), so the overall error hides
    /// what they cost the other channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel_l2_non_outlier: Option<f64>,
    /// The tolerance a kernel of this format is held to against its own dequantized reference
    /// (`None` for formats with no kernel on this build, e.g. emulated W4A4).
    pub kernel_tolerance: Option<f64>,
    /// Name of that tolerance.
    pub kernel_tolerance_name: String,
}

/// Whether a peer provider ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Provider (e.g. `torch`, `vllm`).
    pub provider: String,
    /// Implementations it offered.
    pub implementations: Vec<String>,
    /// Whether it ran.
    pub available: bool,
    /// Version or the reason it was not available.
    pub detail: String,
}

/// How a suite was repeated (`--repeats R`): see [`crate::kernels::repeats`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SuiteRepeats {
    /// Repeats run.
    pub count: usize,
    /// The implementation order of each repeat (rotated from one repeat to the next, so that no
    /// implementation always runs first after a shape's weights are prepared).
    pub order: Vec<Vec<String>>,
    /// Samples per repeat of every timed case and extra part.
    pub cases: Vec<CaseRepeats>,
}

/// The repeats of one timed case (or one extra timed part of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseRepeats {
    /// Provider.
    pub provider: String,
    /// Implementation id.
    pub implementation: String,
    /// Shape name.
    pub shape: String,
    /// M.
    pub m: usize,
    /// The extra part (`activation_quant`), or `None` for the GEMM itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// Samples taken in each repeat that timed the case, in repeat order (they add up to the
    /// case's `samples_s`).
    pub sizes: Vec<usize>,
}

impl SuiteRepeats {
    /// The sizes recorded for `case` (and `part`), if any.
    pub fn sizes_of(&self, case: &KernelCase, part: Option<&str>) -> Option<Vec<usize>> {
        self.cases
            .iter()
            .find(|r| {
                r.provider == case.provider
                    && r.implementation == case.implementation
                    && r.shape == case.shape
                    && r.m == case.m
                    && r.part.as_deref() == part
            })
            .map(|r| r.sizes.clone())
    }
}

/// One timed grouped expert GEMM case of a suite's `[moe]` table
/// ([`crate::kernels::moe_grouped`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupedCase {
    /// The linear's name.
    pub linear: String,
    /// Weight format id (`bf16`, `fp8`, `w4a16`).
    pub format: String,
    /// One expert's N.
    pub n: usize,
    /// K.
    pub k: usize,
    /// E.
    pub experts: usize,
    /// k.
    pub top_k: usize,
    /// Tokens B.
    pub batch: usize,
    /// The routing's name.
    pub distribution: String,
    /// Routed pairs B·k.
    pub pairs: usize,
    /// Distinct experts the cold launch touched.
    pub touched: usize,
    /// The cold launch's byte floor ([`floor_bytes`]).
    pub floor_bytes: u64,
    /// Cold timing (L2 flushed before each sample).
    pub cold: Option<Timing>,
    /// Per-launch graph timing, each launch its own routing.
    pub graph: Option<Timing>,
    /// The graph's mean byte floor per launch.
    pub graph_floor_bytes: f64,
    /// Relative L2 error of the sampled pairs against the CPU reference.
    pub rel_l2: Option<f64>,
    /// Why a part did not run, when one did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl GroupedCase {
    /// Measured time over the floor's time at `copy_bytes_per_s` (≥ 1: how far from the floor),
    /// cold and in the graph.
    pub fn over_floor(&self, copy_bytes_per_s: f64) -> (Option<f64>, Option<f64>) {
        let floor = |b: f64| b / copy_bytes_per_s.max(1.0);
        (
            self.cold
                .as_ref()
                .map(|t| t.median_s / floor(self.floor_bytes as f64)),
            self.graph
                .as_ref()
                .map(|t| t.median_s / floor(self.graph_floor_bytes)),
        )
    }
}

/// The grouped cases of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupedResults {
    /// The cases.
    pub cases: Vec<GroupedCase>,
    /// The copy bandwidth the floors are divided by (bytes/s; the run's own measurement).
    pub copy_bytes_per_s: f64,
    /// What did not run and why, and how the cases were set up.
    pub notes: Vec<String>,
    /// The `[moe]` table the cases ran from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<super::suite::MoeSpec>,
}

/// One row of the MoE decode-step composite: at batch B and one routing, the dense linears of
/// the suite's step (every `[[shapes]]` row with its `per_step`, less the single-expert rows
/// named like the grouped linears) timed at M = B plus `sparse_layers` × every grouped linear,
/// in graph timing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeStepRow {
    /// Format id.
    pub format: String,
    /// Batch B.
    pub batch: usize,
    /// Routing.
    pub distribution: String,
    /// Seconds of the dense linears of one step.
    pub dense_s: f64,
    /// Seconds of the grouped expert GEMMs of one step.
    pub experts_s: f64,
    /// Byte floor of the expert GEMMs of one step (the touched experts, per layer as timed).
    pub experts_floor_bytes: f64,
}

impl MoeStepRow {
    /// The linear layers' decode tok/s bound: B ÷ (dense + experts).
    pub fn tok_per_s(&self) -> f64 {
        self.batch as f64 / (self.dense_s + self.experts_s).max(1e-12)
    }
}
