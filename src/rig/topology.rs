//! How the GPUs of a rig are connected: per pair the NVLink count or the PCIe path, whether CUDA
//! allows peer-to-peer access, and per GPU the NUMA node, CPU affinity and PCIe link.
//!
//! Sources, in order: NVML (`nvmlDeviceGetNvLinkState` / `GetNvLinkRemotePciInfo` for the links,
//! `nvmlDeviceGetTopologyCommonAncestor` for the PCIe path, `nvmlDeviceGetNumaNodeId`, the PCIe
//! link generation and width), and when NVML cannot be loaded the text of `nvidia-smi topo -m`
//! ([`parse_topo_matrix`]). Peer access comes from CUDA (`cuDeviceCanAccessPeer`,
//! [`crate::gpu::multi::peer_access`]), filled in by [`crate::rig::probe`]. NUMA node and CPU
//! list fall back to sysfs (`/sys/bus/pci/devices/<bus id>/numa_node`, `local_cpulist`).
//!
//! Connection codes are those of `nvidia-smi topo -m`'s legend: `NV#` (a bonded set of # NVLinks),
//! `PIX` (at most one PCIe bridge), `PXB` (several PCIe bridges, no host bridge), `PHB` (a PCIe
//! host bridge), `NODE` (between host bridges within a NUMA node), `SYS` (across the SMP
//! interconnect between NUMA nodes).

use serde::{Deserialize, Serialize};

/// How the GPUs are connected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Where the links came from: `nvml` or `nvidia-smi topo -m`.
    pub source: String,
    /// One entry per GPU, in CUDA device order.
    pub gpus: Vec<TopoGpu>,
    /// One entry per unordered pair `a < b` (CUDA device indices).
    pub links: Vec<TopoLink>,
    /// What could not be read, and other remarks.
    pub notes: Vec<String>,
}

/// Placement facts of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopoGpu {
    /// CUDA device index.
    pub index: usize,
    /// NVML index (PCI order; `GPU<n>` in `nvidia-smi topo -m`), when known.
    pub nvml_index: Option<u32>,
    /// PCI bus id, `dddd:bb:dd.f` (lower case).
    pub pci_bus_id: Option<String>,
    /// NUMA node of the GPU's PCIe root (-1: the kernel assigns none, as on one-node machines;
    /// `None`: unknown).
    pub numa_node: Option<i64>,
    /// CPUs close to the GPU (`0-31`), from sysfs `local_cpulist` or `nvidia-smi topo -m`.
    pub cpu_affinity: Option<String>,
    /// Active NVLinks (0 when the card has none).
    pub nvlinks_active: Option<u32>,
    /// PCIe link generation now / the most the link supports.
    pub pcie_gen: Option<(u32, u32)>,
    /// PCIe link width (lanes) now / the most the link supports.
    pub pcie_width: Option<(u32, u32)>,
}

/// The connection between two GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopoLink {
    /// CUDA index of the first GPU.
    pub a: usize,
    /// CUDA index of the second GPU (`a < b`).
    pub b: usize,
    /// `nvidia-smi topo -m` code: `NV18`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`, or `?`.
    pub connection: String,
    /// NVLinks joining the pair (directly, or through NVSwitch: then the smaller of the two
    /// GPUs' active link counts).
    pub nvlinks: u32,
    /// The NVLinks go through NVSwitch rather than GPU to GPU.
    #[serde(default)]
    pub via_nvswitch: bool,
    /// PCIe path when the pair has no NVLink (NVML common ancestor), as a code (`PIX` …).
    pub pcie_path: Option<String>,
    /// CUDA allows peer access both ways (`cuDeviceCanAccessPeer(a, b)` and `(b, a)`).
    pub p2p_access: Option<bool>,
}

impl Topology {
    /// The link between CUDA devices `a` and `b` (either order).
    pub fn link(&self, a: usize, b: usize) -> Option<&TopoLink> {
        let (x, y) = if a < b { (a, b) } else { (b, a) };
        self.links.iter().find(|l| l.a == x && l.b == y)
    }

    /// A one-line summary (`GPU0–GPU1 NV18, P2P on; one NUMA node`), for e2e conditions.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .links
            .iter()
            .map(|l| {
                format!(
                    "GPU{}–GPU{} {}{}",
                    l.a,
                    l.b,
                    l.connection,
                    match l.p2p_access {
                        Some(true) => ", P2P on",
                        Some(false) => ", P2P off",
                        None => "",
                    }
                )
            })
            .collect();
        let mut nodes: Vec<i64> = self
            .gpus
            .iter()
            .filter_map(|g| g.numa_node)
            .filter(|n| *n >= 0)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        match nodes.len() {
            0 => {}
            1 => parts.push(format!("NUMA node {}", nodes[0])),
            _ => parts.push(format!(
                "NUMA nodes {}",
                nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        parts.join("; ")
    }
}

/// Normalize a PCI bus id to `dddd:bb:dd.f` in lower case (NVML writes an 8-digit domain in
/// upper case, sysfs a 4-digit one in lower case). `None` when it is not of that form.
pub fn normalize_bus_id(s: &str) -> Option<String> {
    let s = s.trim().trim_end_matches('\0');
    let (domain, rest) = s.rsplit_once(':').and_then(|(head, func)| {
        let (dom, bus) = head.split_once(':')?;
        Some((dom, format!("{bus}:{func}")))
    })?;
    let dom = u32::from_str_radix(domain, 16).ok()?;
    let (bus_dev, function) = rest.split_once('.')?;
    let (bus, dev) = bus_dev.split_once(':')?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    let function = u32::from_str_radix(function, 16).ok()?;
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{function:x}"))
}

/// A GPU row parsed from `nvidia-smi topo -m`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopoRow {
    /// `n` of `GPUn` (an NVML index).
    pub gpu: u32,
    /// Connection code to each GPU column, in column order (`X` for itself).
    pub cells: Vec<String>,
    /// The `CPU Affinity` column.
    pub cpu_affinity: Option<String>,
    /// The `NUMA Affinity` column (`None` for `N/A`).
    pub numa_affinity: Option<i64>,
}

/// Parse the GPU rows of `nvidia-smi topo -m` (tab-separated; a header line naming `GPU0 …`,
/// NIC columns and rows and the legend are ignored).
///
/// # Errors
/// A sentence saying what is missing when the text has no GPU header or no GPU rows, or a row's
/// cell count does not match the header.
pub fn parse_topo_matrix(text: &str) -> Result<Vec<TopoRow>, String> {
    let mut header: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if header.is_some() && !rows.is_empty() {
                break; // the legend follows
            }
            continue;
        }
        let cells: Vec<String> = line.split('\t').map(|c| c.trim().to_string()).collect();
        if header.is_none() {
            // The header: its first cell is empty and it names GPU0.
            let named: Vec<String> = cells
                .iter()
                .filter(|c| !c.is_empty())
                .map(|c| strip_ansi(c))
                .collect();
            if named.first().is_some_and(|c| c == "GPU0") {
                header = Some(named);
            }
            continue;
        }
        let Some(h) = &header else { continue };
        let first = strip_ansi(&cells[0]);
        let Some(n) = first
            .strip_prefix("GPU")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue; // NIC rows
        };
        let values: Vec<String> = cells[1..].iter().map(|c| strip_ansi(c)).collect();
        // Trailing empty cells come from tab runs; keep the first len(header) values.
        let values: Vec<String> = if values.len() > h.len() {
            let mut v: Vec<String> = values.into_iter().filter(|c| !c.is_empty()).collect();
            v.truncate(h.len());
            v
        } else {
            values
        };
        if values.len() < h.iter().filter(|c| c.starts_with("GPU")).count() {
            return Err(format!(
                "row GPU{n} has {} cells but the header names {} columns",
                values.len(),
                h.len()
            ));
        }
        let col = |name: &str| {
            h.iter()
                .position(|c| c == name)
                .and_then(|i| values.get(i))
                .filter(|v| !v.is_empty() && *v != "N/A")
                .cloned()
        };
        let gpu_cols: Vec<usize> = h
            .iter()
            .enumerate()
            .filter(|(_, c)| c.starts_with("GPU") && c[3..].parse::<u32>().is_ok())
            .map(|(i, _)| i)
            .collect();
        rows.push(TopoRow {
            gpu: n,
            cells: gpu_cols
                .iter()
                .map(|&i| values.get(i).cloned().unwrap_or_default())
                .collect(),
            cpu_affinity: col("CPU Affinity"),
            numa_affinity: col("NUMA Affinity").and_then(|v| v.parse().ok()),
        });
    }
    if header.is_none() {
        return Err("no header line naming GPU0 (is this `nvidia-smi topo -m` output?)".into());
    }
    if rows.is_empty() {
        return Err("no GPU rows".into());
    }
    Ok(rows)
}

/// nvidia-smi colours cells on a terminal; drop ANSI escape sequences.
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out.trim().to_string()
}

/// NVLink count in a connection code (`NV18` → 18; `PIX` → 0).
pub fn nvlinks_of(code: &str) -> u32 {
    code.strip_prefix("NV")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Build a topology from parsed `nvidia-smi topo -m` rows for `n` CUDA devices, assuming CUDA
/// index `i` is `GPUi` (true without `CUDA_VISIBLE_DEVICES` and with `CUDA_DEVICE_ORDER` at its
/// default on same-model GPUs; the result carries a note saying so).
pub fn from_topo_rows(rows: &[TopoRow], n: usize) -> Topology {
    let mut t = Topology {
        source: "nvidia-smi topo -m".into(),
        notes: vec!["NVML was not available: links read from `nvidia-smi topo -m`, whose GPU<n> are NVML (PCI-order) indices, taken to be CUDA indices".into()],
        ..Default::default()
    };
    for i in 0..n {
        let row = rows.iter().find(|r| r.gpu as usize == i);
        t.gpus.push(TopoGpu {
            index: i,
            nvml_index: row.map(|r| r.gpu),
            numa_node: row.and_then(|r| r.numa_affinity),
            cpu_affinity: row.and_then(|r| r.cpu_affinity.clone()),
            ..Default::default()
        });
    }
    for a in 0..n {
        for b in a + 1..n {
            let code = rows
                .iter()
                .find(|r| r.gpu as usize == a)
                .and_then(|r| r.cells.get(b))
                .cloned()
                .unwrap_or_else(|| "?".into());
            let nv = nvlinks_of(&code);
            t.links.push(TopoLink {
                a,
                b,
                pcie_path: (nv == 0 && code != "?").then(|| code.clone()),
                connection: code,
                nvlinks: nv,
                ..Default::default()
            });
        }
    }
    t
}

/// Read the topology through NVML for GPUs with these PCI bus ids (CUDA order). `None` when
/// NVML cannot be loaded.
pub fn probe_nvml(bus_ids: &[Option<String>]) -> Option<Topology> {
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| nvml_wrapper::Nvml::init())
        .ok()?;
    let mut t = Topology {
        source: "nvml".into(),
        ..Default::default()
    };
    let count = nvml.device_count().unwrap_or(0);
    // NVML's handles and bus ids, by NVML index.
    let mut nvml_bus: Vec<(u32, String)> = Vec::new();
    for i in 0..count {
        if let Ok(d) = nvml.device_by_index(i) {
            if let Some(b) = d.pci_info().ok().and_then(|p| normalize_bus_id(&p.bus_id)) {
                nvml_bus.push((i, b));
            }
        }
    }
    let nvml_index_of = |bus: &Option<String>| -> Option<u32> {
        let b = bus.as_ref()?;
        nvml_bus.iter().find(|(_, x)| x == b).map(|(i, _)| *i)
    };
    // Per GPU: the active links and where each goes (normalized remote bus id).
    let mut remotes: Vec<Vec<String>> = Vec::new();
    for (i, bus) in bus_ids.iter().enumerate() {
        let idx = nvml_index_of(bus);
        let dev = idx.and_then(|k| nvml.device_by_index(k).ok());
        let mut g = TopoGpu {
            index: i,
            nvml_index: idx,
            pci_bus_id: bus.clone(),
            ..Default::default()
        };
        let mut rem = Vec::new();
        if let Some(d) = &dev {
            g.numa_node = d.numa_node_id().ok().map(|v| v as i64);
            g.pcie_gen = d
                .current_pcie_link_gen()
                .ok()
                .zip(d.max_pcie_link_gen().ok());
            g.pcie_width = d
                .current_pcie_link_width()
                .ok()
                .zip(d.max_pcie_link_width().ok());
            let mut active = 0u32;
            for l in 0..NVML_NVLINK_MAX_LINKS {
                let link = d.link_wrapper_for(l);
                if link.is_active().unwrap_or(false) {
                    active += 1;
                    if let Some(r) = link
                        .remote_pci_info()
                        .ok()
                        .and_then(|p| normalize_bus_id(&p.bus_id))
                    {
                        rem.push(r);
                    }
                }
            }
            g.nvlinks_active = Some(active);
        } else {
            t.notes.push(format!(
                "GPU{i}: no NVML device with PCI bus id {}",
                bus.clone().unwrap_or_else(|| "(unknown)".into())
            ));
        }
        if let Some(b) = bus {
            let (numa, cpus) = sysfs_numa(b);
            if g.numa_node.is_none() {
                g.numa_node = numa;
            }
            g.cpu_affinity = cpus;
        }
        remotes.push(rem);
        t.gpus.push(g);
    }
    let gpu_buses: Vec<Option<String>> = bus_ids.to_vec();
    for a in 0..bus_ids.len() {
        for b in a + 1..bus_ids.len() {
            let direct = gpu_buses[b]
                .as_ref()
                .map(|bb| remotes[a].iter().filter(|r| *r == bb).count() as u32)
                .unwrap_or(0);
            // Links to something that is not one of the GPUs: NVSwitch (or a GPU not visible).
            let to_switch = |k: usize| {
                remotes[k]
                    .iter()
                    .filter(|r| !gpu_buses.iter().any(|g| g.as_ref() == Some(*r)))
                    .count() as u32
            };
            let (sa, sb) = (to_switch(a), to_switch(b));
            let dev = |k: usize| {
                t.gpus[k]
                    .nvml_index
                    .and_then(|i| nvml.device_by_index(i).ok())
            };
            let nvlink_p2p = match (dev(a), dev(b)) {
                (Some(da), Some(db)) => da
                    .p2p_status(
                        &db,
                        nvml_wrapper::enum_wrappers::device::P2pCapabilitiesIndex::NvLink,
                    )
                    .ok()
                    .map(|s| s == nvml_wrapper::enum_wrappers::device::P2pStatus::Ok),
                _ => None,
            };
            let pcie = match (dev(a), dev(b)) {
                (Some(da), Some(db)) => da.topology_common_ancestor(db).ok().map(|l| {
                    match l {
                        TopologyLevel::Internal => "internal (same board)",
                        TopologyLevel::Single => "PIX",
                        TopologyLevel::Multiple => "PXB",
                        TopologyLevel::HostBridge => "PHB",
                        TopologyLevel::Node => "NODE",
                        TopologyLevel::System => "SYS",
                    }
                    .to_string()
                }),
                _ => None,
            };
            let (nvlinks, via_switch) = if direct > 0 {
                (direct, false)
            } else if sa > 0 && sb > 0 && nvlink_p2p != Some(false) {
                (sa.min(sb), true)
            } else {
                (0, false)
            };
            let connection = if nvlinks > 0 {
                format!("NV{nvlinks}")
            } else {
                pcie.clone().unwrap_or_else(|| "?".into())
            };
            t.links.push(TopoLink {
                a,
                b,
                connection,
                nvlinks,
                via_nvswitch: via_switch,
                pcie_path: pcie,
                p2p_access: None,
            });
        }
    }
    Some(t)
}

/// Links per GPU that NVML numbers (`NVML_NVLINK_MAX_LINKS` in nvml.h).
const NVML_NVLINK_MAX_LINKS: u32 = 18;

/// NUMA node and local CPU list of a PCI device from sysfs (`numa_node` is -1 when the kernel
/// assigns none, as on one-node machines).
fn sysfs_numa(bus_id: &str) -> (Option<i64>, Option<String>) {
    let dir = std::path::Path::new("/sys/bus/pci/devices").join(bus_id);
    let numa = std::fs::read_to_string(dir.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok());
    let cpus = std::fs::read_to_string(dir.join("local_cpulist"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    (numa, cpus)
}

/// Run `nvidia-smi topo -m` and parse it (the fallback when NVML is missing).
pub fn probe_nvidia_smi(n: usize) -> Option<Topology> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["topo", "-m"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let rows = parse_topo_matrix(&String::from_utf8_lossy(&out.stdout)).ok()?;
    Some(from_topo_rows(&rows, n))
}

/// The topology section of `rig`: the connection matrix (as `nvidia-smi topo -m` writes it, with
/// CUDA indices), P2P access, and per GPU its NUMA node, CPUs, PCIe link and NVLinks.
pub fn render(t: &Topology) -> String {
    use crate::output::table::markdown_table;
    let n = t.gpus.len();
    let mut out = String::new();
    out.push_str(&format!(
        "Source: {}. Cells: `NV#` = # bonded NVLinks{}, `PIX`/`PXB`/`PHB`/`NODE`/`SYS` = the PCIe path (legend of `nvidia-smi topo -m`); P2P = CUDA peer access both ways.\n\n",
        t.source,
        if t.links.iter().any(|l| l.via_nvswitch) { " (through NVSwitch where marked `*`)" } else { "" }
    ));
    let mut headers: Vec<String> = vec![String::new()];
    headers.extend((0..n).map(|i| format!("GPU{i}")));
    headers.extend(["NUMA", "CPUs", "PCIe (now / max)", "NVLinks"].map(String::from));
    let mut rows = Vec::new();
    for (i, g) in t.gpus.iter().enumerate() {
        let mut r = vec![format!("GPU{i}")];
        for j in 0..n {
            r.push(if i == j {
                "X".into()
            } else {
                match t.link(i, j) {
                    Some(l) => {
                        let p2p = match l.p2p_access {
                            Some(true) => ", P2P",
                            Some(false) => ", no P2P",
                            None => "",
                        };
                        format!(
                            "{}{}{p2p}",
                            l.connection,
                            if l.via_nvswitch { "*" } else { "" }
                        )
                    }
                    None => "?".into(),
                }
            });
        }
        r.push(match g.numa_node {
            Some(v) if v >= 0 => v.to_string(),
            Some(_) => "none".into(),
            None => "n/a".into(),
        });
        r.push(g.cpu_affinity.clone().unwrap_or_else(|| "n/a".into()));
        r.push(match (g.pcie_gen, g.pcie_width) {
            (Some((gc, gm)), Some((wc, wm))) => format!("Gen{gc} x{wc} / Gen{gm} x{wm}"),
            (Some((gc, gm)), None) => format!("Gen{gc} / Gen{gm}"),
            _ => "n/a".into(),
        });
        r.push(
            g.nvlinks_active
                .map(|v| v.to_string())
                .unwrap_or_else(|| "n/a".into()),
        );
        rows.push(r);
    }
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    out.push_str(&markdown_table(&h, &rows));
    for note in &t.notes {
        out.push_str(&format!("\n- {note}"));
    }
    if !t.notes.is_empty() {
        out.push('\n');
    }
    out
}

/// One row per GPU: the facts `rig` shows for the first GPU, side by side (two or more GPUs).
pub fn render_gpus(gpus: &[super::GpuFacts]) -> String {
    use crate::output::table::{human_bytes, markdown_table};
    let na = || "n/a".to_string();
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            let t = g.telemetry.as_ref();
            let mhz = |cur: Option<u32>, max: Option<u32>| match (cur, max) {
                (Some(c), Some(m)) => format!("{c} / {m} MHz"),
                (Some(c), None) => format!("{c} MHz"),
                _ => "n/a".into(),
            };
            vec![
                format!("GPU{}", g.index),
                g.name.clone(),
                g.compute_capability
                    .map(|c| c.to_string())
                    .unwrap_or_else(na),
                g.sm_count.to_string(),
                human_bytes(g.memory_bytes),
                g.pci_bus_id.clone().unwrap_or_else(na),
                t.map(|t| mhz(t.sm_clock_mhz, t.sm_clock_max_mhz))
                    .unwrap_or_else(na),
                t.map(|t| mhz(t.mem_clock_mhz, t.mem_clock_max_mhz))
                    .unwrap_or_else(na),
                t.map(|t| {
                    let w = |v: Option<f64>| v.map(|x| format!("{x:.0} W")).unwrap_or_else(na);
                    format!("{} / {}", w(t.power_draw_w), w(t.power_limit_w))
                })
                .unwrap_or_else(na),
                t.and_then(|t| t.temperature_c)
                    .map(|c| format!("{c} °C"))
                    .unwrap_or_else(na),
                t.and_then(|t| t.ecc_enabled)
                    .map(|e| if e { "on" } else { "off" }.to_string())
                    .unwrap_or_else(na),
                t.map(|t| {
                    if t.throttle_reasons.is_empty() {
                        "none".to_string()
                    } else {
                        t.throttle_reasons.join(", ")
                    }
                })
                .unwrap_or_else(na),
            ]
        })
        .collect();
    markdown_table(
        &[
            "GPU",
            "name",
            "cc",
            "SMs",
            "memory",
            "PCI bus",
            "SM clock (now / max)",
            "memory clock (now / max)",
            "power (draw / limit)",
            "temp",
            "ECC",
            "throttle reasons",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Synthetic: written from the public format of `nvidia-smi topo -m` (tab-separated, legend
    /// below), for two GPUs joined by 18 NVLinks, as on a 2×H200 machine.
    const TWO_NV18: &str = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n  NV#  = Connection traversing a bonded set of # NVLinks\n";

    /// Synthetic: four PCIe GPUs on two NUMA nodes with a NIC column and row, older format
    /// (no `GPU NUMA ID`), as on a workstation with two CPUs.
    const FOUR_PCIE_NIC: &str = "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPIX\tSYS\tSYS\tNODE\t0-15,32-47\t0\nGPU1\tPIX\t X \tSYS\tSYS\tNODE\t0-15,32-47\t0\nGPU2\tSYS\tSYS\t X \tPHB\tSYS\t16-31,48-63\t1\nGPU3\tSYS\tSYS\tPHB\t X \tSYS\t16-31,48-63\t1\nNIC0\tNODE\tNODE\tSYS\tSYS\t X \t\t\n\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n";

    #[test]
    fn parses_two_gpus_with_nvlink() {
        let rows = parse_topo_matrix(TWO_NV18).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].cells, vec!["X", "NV18"]);
        assert_eq!(rows[1].cells, vec!["NV18", "X"]);
        assert_eq!(rows[0].cpu_affinity.as_deref(), Some("0-31"));
        assert_eq!(rows[0].numa_affinity, Some(0));
        let t = from_topo_rows(&rows, 2);
        assert_eq!(t.links.len(), 1);
        assert_eq!(t.links[0].connection, "NV18");
        assert_eq!(t.links[0].nvlinks, 18);
        assert_eq!(t.links[0].pcie_path, None);
        assert!(t.summary().starts_with("GPU0–GPU1 NV18"), "{}", t.summary());
        let md = render(&t);
        assert!(md.contains("| GPU0 | X    | NV18"), "{md}");
    }

    #[test]
    fn parses_pcie_paths_nics_and_numa_nodes() {
        let rows = parse_topo_matrix(FOUR_PCIE_NIC).unwrap();
        assert_eq!(rows.len(), 4, "the NIC row is not a GPU");
        assert_eq!(rows[2].cells, vec!["SYS", "SYS", "X", "PHB"]);
        assert_eq!(rows[3].numa_affinity, Some(1));
        assert_eq!(rows[2].cpu_affinity.as_deref(), Some("16-31,48-63"));
        let t = from_topo_rows(&rows, 4);
        assert_eq!(t.links.len(), 6);
        let l = t.link(3, 2).unwrap();
        assert_eq!((l.connection.as_str(), l.nvlinks), ("PHB", 0));
        assert_eq!(l.pcie_path.as_deref(), Some("PHB"));
        assert_eq!(t.link(0, 1).unwrap().connection, "PIX");
        assert!(t.summary().contains("NUMA nodes 0, 1"), "{}", t.summary());
    }

    #[test]
    fn colour_codes_and_missing_parts_are_handled() {
        let coloured = TWO_NV18.replace("NV18", "\u{1b}[32mNV18\u{1b}[0m");
        let rows = parse_topo_matrix(&coloured).unwrap();
        assert_eq!(rows[0].cells[1], "NV18");
        assert!(parse_topo_matrix("GPU 0: NVIDIA H200").is_err());
        assert!(parse_topo_matrix("\tGPU0\tGPU1\n\n").is_err());
        // Fewer GPUs in the text than CUDA reports: unknown links, not a panic.
        let t = from_topo_rows(&parse_topo_matrix(TWO_NV18).unwrap(), 3);
        assert_eq!(t.link(1, 2).unwrap().connection, "?");
    }

    #[test]
    fn every_gpu_gets_a_row() {
        let g = |i: usize, name: &str| super::super::GpuFacts {
            index: i,
            name: name.into(),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x18 + i)),
            ..Default::default()
        };
        let md = render_gpus(&[g(0, "NVIDIA H200"), g(1, "NVIDIA H200")]);
        assert_eq!(md.lines().count(), 4, "{md}");
        assert!(
            md.contains("| GPU1 | NVIDIA H200") && md.contains("0000:19:00.0"),
            "{md}"
        );
    }

    #[test]
    fn bus_ids_normalize() {
        assert_eq!(
            normalize_bus_id("00000000:18:00.0").as_deref(),
            Some("0000:18:00.0")
        );
        assert_eq!(
            normalize_bus_id("0000:9A:00.0\0").as_deref(),
            Some("0000:9a:00.0")
        );
        assert_eq!(normalize_bus_id("garbage"), None);
        assert_eq!(nvlinks_of("NV4"), 4);
        assert_eq!(nvlinks_of("SYS"), 0);
    }
}
