//! The rig: host facts, the card and its software stack, NVML telemetry, and the capability
//! table (what the card executes for each GEMM format).
//!
//! [`probe`] never panics: without a CUDA driver it returns host facts, `gpu: None` and the
//! reason in [`RigFacts::gpu_absent_reason`].

pub mod capability;
pub mod host;
pub mod telemetry;

use serde::{Deserialize, Serialize};

pub use capability::{Capability, ComputeCapability, Support};

/// Facts about the host machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Host name (redacted in reports by default).
    pub hostname: String,
    /// Operating system name and version.
    pub os: String,
    /// Kernel version.
    pub kernel: String,
    /// CPU architecture (`x86_64`, `aarch64`).
    pub arch: String,
    /// CPU model string.
    pub cpu_model: String,
    /// Logical CPU count.
    pub cpu_logical_cores: usize,
    /// Physical memory in bytes.
    pub ram_bytes: u64,
}

/// Facts about one GPU, read from the CUDA driver and NVML.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// CUDA device ordinal.
    pub index: usize,
    /// Device name as the driver reports it (e.g. "NVIDIA H200").
    pub name: String,
    /// Compute capability.
    pub compute_capability: Option<ComputeCapability>,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
    /// Largest shared memory a block can opt into, bytes.
    pub max_shared_mem_per_block_optin: u64,
    /// Memory bus width, bits.
    pub memory_bus_width_bits: u32,
    /// Telemetry from NVML (or `nvidia-smi`), when available.
    pub telemetry: Option<telemetry::Telemetry>,
}

/// Versions of the GPU software stack.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StackFacts {
    /// NVIDIA driver version (e.g. "580.159.04"), from NVML or `nvidia-smi`.
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports (`cuDriverGetVersion`, e.g. "13.0").
    pub driver_cuda_version: Option<String>,
    /// CUDA version rigbench's bindings were built for (the pinned cudarc feature).
    pub built_for_cuda: String,
    /// NVRTC version found at run time.
    pub nvrtc_version: Option<String>,
    /// cuBLASLt version found at run time.
    pub cublaslt_version: Option<String>,
    /// Where the CUDA headers for NVRTC were found.
    pub cuda_include_dir: Option<String>,
    /// Libraries looked for and not found, or found but unusable, with the reason.
    pub problems: Vec<String>,
}

/// Everything known about the rig.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RigFacts {
    /// The host.
    pub host: HostFacts,
    /// The GPU benched (device 0), if any.
    pub gpu: Option<GpuFacts>,
    /// Why there is no GPU (e.g. "no CUDA driver found (libcuda.so not loadable)").
    pub gpu_absent_reason: Option<String>,
    /// Other GPUs seen, by name (rigbench benches one device).
    pub other_gpus: Vec<String>,
    /// Software stack.
    pub stack: StackFacts,
    /// The capability table for this card (empty without a GPU).
    pub capabilities: Vec<Capability>,
}

impl RigFacts {
    /// The card's compute capability, if a GPU was found.
    pub fn compute_capability(&self) -> Option<ComputeCapability> {
        self.gpu.as_ref().and_then(|g| g.compute_capability)
    }

    /// A short label for folder names: `nvidia-h200-sm90`, or `cpu-x86_64` without a GPU.
    pub fn label(&self) -> String {
        match &self.gpu {
            Some(g) => {
                let cc = g
                    .compute_capability
                    .map(|c| format!("-sm{}", c.as_int()))
                    .unwrap_or_default();
                format!("{}{cc}", slug(&g.name))
            }
            None => format!("cpu-{}", slug(&self.host.arch)),
        }
    }
}

/// Lower-case, ASCII alphanumerics and single dashes only.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let t = out.trim_matches('-').to_string();
    if t.is_empty() {
        "unknown".into()
    } else {
        t
    }
}

/// Probe host, GPU 0 and the stack. Never panics; GPU problems become
/// [`RigFacts::gpu_absent_reason`] and [`StackFacts::problems`].
pub fn probe() -> RigFacts {
    let mut facts = RigFacts {
        host: host::probe(),
        ..Default::default()
    };
    crate::gpu::probe_into(&mut facts);
    if let Some(cc) = facts.compute_capability() {
        facts.capabilities = capability::table(cc);
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let mut f = RigFacts::default();
        f.host.arch = "x86_64".into();
        assert_eq!(f.label(), "cpu-x86-64");
        f.gpu = Some(GpuFacts {
            name: "NVIDIA H200".into(),
            compute_capability: Some(ComputeCapability::new(9, 0)),
            ..Default::default()
        });
        assert_eq!(f.label(), "nvidia-h200-sm90");
        assert_eq!(slug("  ##  "), "unknown");
    }
}
