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
    /// SM clock read after the case, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Harmful throttle reasons active after the case.
    pub throttle: Vec<String>,
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
    /// bf16 median / this median, for the same provider's bf16 case at the same shape and M.
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
