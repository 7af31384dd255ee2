//! Result types of the multi-GPU parts (part of the versioned results schema, see
//! [`crate::report::schema`]; every field here is optional or defaulted, so older results load).

use serde::{Deserialize, Serialize};

use crate::kernels::KernelResults;

/// Everything the multi-GPU parts measured or derived.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MultiGpuResults {
    /// CUDA indices of the devices selected (`--devices`), in order; the first one's kernel
    /// results are the report's `kernels` section.
    pub devices: Vec<usize>,
    /// Kernel results of the other selected devices, benched at the same time (one context,
    /// stream and thread per GPU).
    #[serde(default)]
    pub device_kernels: Vec<DeviceKernels>,
    /// Per-GPU comparison of the kernel rows and its findings.
    #[serde(default)]
    pub spread: Option<SpreadReport>,
    /// Peer-to-peer copy bandwidth.
    #[serde(default)]
    pub p2p: Option<P2pResults>,
    /// All-reduce through NCCL.
    #[serde(default)]
    pub allreduce: Option<AllReduceResults>,
    /// All-reduce time per decode step at each tensor-parallel degree measured.
    #[serde(default)]
    pub allreduce_per_step: Vec<AllReducePerStep>,
    /// Predicted linear-layer time per decode step with tensor parallelism.
    #[serde(default)]
    pub tp: Option<TpPrediction>,
    /// PyTorch's figures for the same transfers (`scripts/peer_multigpu.py`).
    #[serde(default)]
    pub peers: Option<MultiPeers>,
    /// Remarks about the run.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// The kernel results of one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceKernels {
    /// CUDA device index.
    pub device: usize,
    /// Device name.
    pub name: String,
    /// What was measured on it (same suite and options as the first device; no peers).
    pub kernels: Option<KernelResults>,
    /// Why it stopped or did not run, if so.
    #[serde(default)]
    pub error: Option<String>,
}

/// Summary statistics of per-operation times, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpTiming {
    /// Median.
    pub median_s: f64,
    /// 10th percentile.
    pub p10_s: f64,
    /// 90th percentile.
    pub p90_s: f64,
    /// Every sample.
    pub samples_s: Vec<f64>,
}

impl OpTiming {
    /// Summarize samples (`None` when empty or NaN).
    pub fn of(samples: Vec<f64>) -> Option<Self> {
        let s = crate::stats::Summary::of(&samples)?;
        Some(Self {
            median_s: s.median,
            p10_s: s.p10,
            p90_s: s.p90,
            samples_s: samples,
        })
    }
}

/// Peer-to-peer copies between every ordered pair of the selected GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct P2pResults {
    /// Bytes per copy.
    pub bytes: u64,
    /// How copies were made and timed.
    pub method: String,
    /// One per ordered pair (`src` → `dst`).
    pub copies: Vec<P2pCopy>,
    /// Both directions at once, one per unordered pair.
    #[serde(default)]
    pub bidirectional: Vec<P2pBidir>,
    /// Remarks (peer access refused, a pair that failed).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One directed copy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct P2pCopy {
    /// Source device (CUDA index).
    pub src: usize,
    /// Destination device.
    pub dst: usize,
    /// Peer access was enabled (a direct copy); without it the driver stages through the host.
    pub peer_access: bool,
    /// Time per copy.
    pub timing: OpTiming,
    /// Bytes copied / median time (each byte counted once), bytes/s.
    pub bytes_per_s: f64,
}

/// Copies both ways at once between two GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct P2pBidir {
    /// First device.
    pub a: usize,
    /// Second device.
    pub b: usize,
    /// Time until both copies finished.
    pub timing: OpTiming,
    /// Bytes moved in both directions together / median time, bytes/s.
    pub bytes_per_s: f64,
}

/// All-reduce measurements through NCCL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReduceResults {
    /// NCCL version (`2.28.9`).
    pub nccl_version: String,
    /// Library loaded (file name).
    pub library: String,
    /// NCCL environment in effect (`NCCL_NVLS_ENABLE=0`, and any other `NCCL_*` set).
    pub env: Vec<String>,
    /// Element type and operation (`bf16 sum`).
    pub op: String,
    /// How it was timed.
    pub method: String,
    /// One per communicator size.
    pub worlds: Vec<AllReduceWorld>,
}

/// All-reduce on one set of GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReduceWorld {
    /// CUDA indices of the ranks.
    pub devices: Vec<usize>,
    /// The correctness check that gated the timing.
    pub check: String,
    /// Whether it passed.
    pub check_passed: bool,
    /// One per message size.
    pub points: Vec<AllReducePoint>,
    /// Why it stopped, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

/// All-reduce of one message size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReducePoint {
    /// Message size in bytes (per rank; BF16 elements × 2).
    pub bytes: u64,
    /// The decode batch M this is the message of (hidden size × M × 2 bytes), when it is one.
    pub m: Option<usize>,
    /// All-reduces per timed sample.
    pub iters: usize,
    /// Time per all-reduce.
    pub timing: OpTiming,
    /// Algorithm bandwidth: bytes / median time, bytes/s.
    pub algbw: f64,
    /// Bus bandwidth (nccl-tests): algbw · 2(n−1)/n, bytes/s.
    pub busbw: f64,
}

/// The all-reduce cost of one decode step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReducePerStep {
    /// Tensor-parallel degree (the communicator size measured).
    pub tp: usize,
    /// Decode batch.
    pub m: usize,
    /// Message bytes (hidden size × M × 2).
    pub bytes: u64,
    /// Measured time of one all-reduce of that size (median), seconds.
    pub allreduce_s: f64,
    /// All-reduces per step (2 per layer × layers).
    pub per_step: usize,
    /// `per_step × allreduce_s`, seconds.
    pub step_s: f64,
}

/// Linear-layer time per decode step predicted at several tensor-parallel degrees.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TpPrediction {
    /// The composite the prediction starts from (what and where it was read).
    pub composite_source: String,
    /// Hidden size of the suite's model.
    pub hidden_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// All-reduces per layer.
    pub allreduces_per_layer: usize,
    /// One per (implementation, M, TP).
    pub rows: Vec<TpRow>,
    /// What the prediction does not include.
    pub leaves_out: Vec<String>,
}

/// One predicted point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TpRow {
    /// Composite label (format or implementation, as the composite names it).
    pub label: String,
    /// Decode batch.
    pub m: usize,
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Linear layers per rank: composite / TP, seconds.
    pub linear_s: f64,
    /// All-reduces of the step, seconds (0 at TP = 1).
    pub allreduce_s: f64,
    /// `linear_s + allreduce_s`.
    pub total_s: f64,
    /// TP = 1 total / this total.
    pub speedup_vs_tp1: f64,
}

/// The per-GPU comparison of kernel rows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpreadReport {
    /// One per device.
    pub devices: Vec<DeviceSummary>,
    /// One per case measured on two or more same-model devices.
    pub rows: Vec<SpreadRow>,
    /// Slow or down-clocked GPUs.
    pub findings: Vec<Finding>,
}

/// One device's place among same-model devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceSummary {
    /// CUDA index.
    pub device: usize,
    /// Name.
    pub name: String,
    /// Cases compared.
    pub cases: usize,
    /// Geometric mean over the compared cases of (this device's median / the fastest same-model
    /// device's median); 1.0 = fastest everywhere.
    pub geomean_vs_fastest: Option<f64>,
    /// Median of the SM clocks read during its cases, MHz.
    pub median_sm_clock_mhz: Option<u32>,
    /// Harmful throttle reasons seen during its cases.
    pub throttle: Vec<String>,
}

/// One case across devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpreadRow {
    /// Implementation id.
    pub implementation: String,
    /// Shape name.
    pub shape: String,
    /// M.
    pub m: usize,
    /// (device, median seconds), in device order.
    pub medians: Vec<(usize, f64)>,
    /// (slowest / fastest − 1) · 100.
    pub spread_pct: f64,
}

/// A finding about one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable id (`multigpu/slower-at-same-clocks`, `multigpu/lower-clocks`).
    pub id: String,
    /// `warning` or `info`.
    pub severity: String,
    /// The device it is about.
    pub device: usize,
    /// What was found, with the figures.
    pub message: String,
}

/// PyTorch's figures for the same transfers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MultiPeers {
    /// Whether the provider ran, its version or why not.
    pub status: Vec<crate::kernels::schema::PeerStatus>,
    /// `tensor.to(other_device)` copies.
    #[serde(default)]
    pub p2p: Vec<PeerCopy>,
    /// `torch.distributed.all_reduce` (NCCL backend, one process per GPU).
    #[serde(default)]
    pub allreduce: Vec<PeerAllReduce>,
    /// Remarks.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// A peer's directed copy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerCopy {
    /// Source device.
    pub src: usize,
    /// Destination device.
    pub dst: usize,
    /// Bytes per copy.
    pub bytes: u64,
    /// Time per copy.
    pub timing: OpTiming,
    /// bytes / median, bytes/s.
    pub bytes_per_s: f64,
}

/// A peer's all-reduce of one size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerAllReduce {
    /// Ranks' devices.
    pub devices: Vec<usize>,
    /// Message bytes.
    pub bytes: u64,
    /// Time per all-reduce.
    pub timing: OpTiming,
    /// bytes / median, bytes/s.
    pub algbw: f64,
    /// algbw · 2(n−1)/n, bytes/s.
    pub busbw: f64,
}
