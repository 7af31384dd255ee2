//! The rig: host facts, the card and its software stack, NVML telemetry, and the capability
//! table (what the card executes for each GEMM format).
//!
//! [`probe`] never panics: without a CUDA driver it returns host facts, `gpu: None` and the
//! reason in [`RigFacts::gpu_absent_reason`].

pub mod capability;
pub mod host;
pub mod render;
pub mod telemetry;
pub mod topology;

use serde::{Deserialize, Serialize};

pub use capability::{Capability, Support};

use crate::gpu::ComputeCapability;

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
    /// PCI bus id, `dddd:bb:dd.f` (lower case), from the CUDA driver.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
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
    /// Other GPUs seen, as `index: name` (kept for readers of older results; [`RigFacts::gpus`]
    /// describes every GPU).
    pub other_gpus: Vec<String>,
    /// Every GPU the CUDA driver reports, in device order (`gpus[0]` is [`RigFacts::gpu`]).
    #[serde(default)]
    pub gpus: Vec<GpuFacts>,
    /// How the GPUs are connected (two or more GPUs only).
    #[serde(default)]
    pub topology: Option<topology::Topology>,
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

    /// A short label for folder names: `nvidia-h200-sm90`, `nvidia-h200-sm90-x2` for a machine
    /// of two GPUs (named after GPU 0), or `cpu-x86_64` without a GPU.
    pub fn label(&self) -> String {
        match &self.gpu {
            Some(g) => {
                let cc = g
                    .compute_capability
                    .map(|c| format!("-sm{}", c.as_int()))
                    .unwrap_or_default();
                let count = if self.gpus.len() > 1 {
                    format!("-x{}", self.gpus.len())
                } else {
                    String::new()
                };
                format!("{}{cc}{count}", slug(&g.name))
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

/// Probe host, every GPU, how they are connected (two or more), and the stack. Never panics; GPU
/// problems become [`RigFacts::gpu_absent_reason`] and [`StackFacts::problems`].
pub fn probe() -> RigFacts {
    let mut facts = RigFacts {
        host: host::probe(),
        ..Default::default()
    };
    gpus_into(&mut facts);
    if let Some(cc) = facts.compute_capability() {
        facts.capabilities = capability::table(cc);
    }
    if facts.gpus.len() > 1 {
        facts.topology = Some(probe_topology(&facts.gpus));
    }
    facts
}

/// Fill `facts.gpus` (every device, with its NVML telemetry), `facts.gpu` (device 0) and
/// `facts.stack` (or `facts.gpu_absent_reason`) from the CUDA probe ([`crate::gpu::probe`]).
/// Never panics.
fn gpus_into(facts: &mut RigFacts) {
    let p = crate::gpu::probe::probe_devices();
    facts.stack.built_for_cuda = p.built_for_cuda;
    facts.stack.nvrtc_version = p.nvrtc_version;
    facts.stack.cublaslt_version = p.cublaslt_version;
    facts.stack.cuda_include_dir = p.cuda_include_dir;
    facts.stack.driver_cuda_version = p.driver_cuda_version;
    facts.stack.problems.extend(p.problems);
    let telemetry = telemetry::TelemetryReader::new(0).read();
    facts.stack.driver_version = telemetry.as_ref().and_then(|t| t.driver_version.clone());
    if let Some(why) = p.absent_reason {
        facts.gpu_absent_reason = Some(why);
        return;
    }
    for d in p.devices {
        let i = d.index;
        if i > 0 {
            facts.other_gpus.push(format!("{i}: {}", d.name));
        }
        // NVML numbers GPUs in PCI order, CUDA by its own rules and after CUDA_VISIBLE_DEVICES:
        // match them by bus id.
        let telemetry = if i == 0 && d.pci_bus_id.is_none() {
            telemetry.clone()
        } else {
            telemetry::TelemetryReader::for_pci_bus_id(d.pci_bus_id.as_deref(), i as u32).read()
        };
        facts.gpus.push(GpuFacts {
            index: i,
            name: d.name,
            compute_capability: d.compute_capability,
            sm_count: d.sm_count,
            memory_bytes: d.memory_bytes,
            l2_bytes: d.l2_bytes,
            max_shared_mem_per_block_optin: d.max_shared_mem_per_block_optin,
            memory_bus_width_bits: d.memory_bus_width_bits,
            telemetry,
            pci_bus_id: d.pci_bus_id,
        });
    }
    facts.gpu = facts.gpus.first().cloned();
}

/// The topology of `gpus`: NVML, else `nvidia-smi topo -m`, with CUDA's peer-access verdict
/// per pair.
fn probe_topology(gpus: &[GpuFacts]) -> topology::Topology {
    let buses: Vec<Option<String>> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let mut t = topology::probe_nvml(&buses)
        .or_else(|| topology::probe_nvidia_smi(gpus.len()))
        .unwrap_or_else(|| topology::Topology {
            source: "none".into(),
            gpus: (0..gpus.len())
                .map(|i| topology::TopoGpu {
                    index: i,
                    ..Default::default()
                })
                .collect(),
            links: (0..gpus.len())
                .flat_map(|a| {
                    (a + 1..gpus.len()).map(move |b| topology::TopoLink {
                        a,
                        b,
                        connection: "?".into(),
                        ..Default::default()
                    })
                })
                .collect(),
            notes: vec!["neither NVML nor `nvidia-smi topo -m` answered: links unknown".into()],
        });
    for (g, facts) in t.gpus.iter_mut().zip(gpus) {
        if g.pci_bus_id.is_none() {
            g.pci_bus_id = facts.pci_bus_id.clone();
        }
    }
    for l in &mut t.links {
        l.p2p_access = crate::gpu::multi::peer_access(l.a, l.b);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_explains_absence() {
        let f = probe();
        if f.gpu.is_none() {
            assert!(
                f.gpu_absent_reason.is_some(),
                "a missing GPU must carry a reason"
            );
        }
        assert_eq!(f.stack.built_for_cuda, "13.0");
    }

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
        f.gpus = vec![f.gpu.clone().unwrap(), f.gpu.clone().unwrap()];
        assert_eq!(f.label(), "nvidia-h200-sm90-x2");
        assert_eq!(slug("  ##  "), "unknown");
    }
}
