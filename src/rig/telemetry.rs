//! GPU telemetry: clocks, power, temperature, ECC, throttle reasons — through NVML
//! (`nvml-wrapper`, loaded at run time), or `nvidia-smi --query-gpu` when NVML cannot be loaded.
//!
//! Used by `rig` for the card's facts and by the kernel bench around each case (SM clock and
//! throttle reasons, the nvbench-style throttle check).

use serde::{Deserialize, Serialize};

/// One reading of the card's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// Where the reading came from: `nvml` or `nvidia-smi`.
    pub source: String,
    /// Driver version.
    pub driver_version: Option<String>,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Maximum SM clock, MHz.
    pub sm_clock_max_mhz: Option<u32>,
    /// Current memory clock, MHz.
    pub mem_clock_mhz: Option<u32>,
    /// Maximum memory clock, MHz.
    pub mem_clock_max_mhz: Option<u32>,
    /// Enforced power limit, W.
    pub power_limit_w: Option<f64>,
    /// Power draw, W.
    pub power_draw_w: Option<f64>,
    /// GPU temperature, °C.
    pub temperature_c: Option<u32>,
    /// ECC currently enabled.
    pub ecc_enabled: Option<bool>,
    /// Performance state (P0 = max).
    pub pstate: Option<String>,
    /// Active clock-throttle reasons (empty = none; `gpu_idle` alone is benign).
    pub throttle_reasons: Vec<String>,
}

impl Telemetry {
    /// Throttle reasons that lower clocks under load (everything but idle and app-clock settings).
    pub fn harmful_throttle_reasons(&self) -> Vec<String> {
        self.throttle_reasons
            .iter()
            .filter(|r| !matches!(r.as_str(), "gpu_idle" | "applications_clocks_setting"))
            .cloned()
            .collect()
    }
}

/// A handle that reads telemetry for one device; keeps NVML loaded between reads.
pub struct TelemetryReader {
    nvml: Option<nvml_wrapper::Nvml>,
    index: u32,
}

impl TelemetryReader {
    /// Load NVML (or note that it is absent; reads then fall back to `nvidia-smi`).
    pub fn new(index: u32) -> Self {
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| nvml_wrapper::Nvml::init())
            .ok();
        Self { nvml, index }
    }

    /// A reader for the GPU with this PCI bus id (any form NVML or sysfs writes), so that a CUDA
    /// device is read as itself whatever the order (NVML numbers GPUs in PCI order, CUDA after
    /// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`). Falls back to NVML index `fallback`
    /// when the bus id is unknown or not found.
    pub fn for_pci_bus_id(bus_id: Option<&str>, fallback: u32) -> Self {
        let mut r = Self::new(fallback);
        let want = bus_id.and_then(super::topology::normalize_bus_id);
        if let (Some(n), Some(want)) = (&r.nvml, want) {
            let count = n.device_count().unwrap_or(0);
            if let Some(i) = (0..count).find(|&i| {
                n.device_by_index(i)
                    .ok()
                    .and_then(|d| d.pci_info().ok())
                    .and_then(|p| super::topology::normalize_bus_id(&p.bus_id))
                    .is_some_and(|b| b == want)
            }) {
                r.index = i;
            }
        }
        r
    }

    /// Whether NVML was loaded.
    pub fn has_nvml(&self) -> bool {
        self.nvml.is_some()
    }

    /// Read the card's state now; `None` when neither NVML nor `nvidia-smi` answers.
    pub fn read(&self) -> Option<Telemetry> {
        match &self.nvml {
            Some(n) => read_nvml(n, self.index),
            None => read_nvidia_smi(self.index),
        }
    }
}

fn read_nvml(nvml: &nvml_wrapper::Nvml, index: u32) -> Option<Telemetry> {
    use nvml_wrapper::bitmasks::device::ThrottleReasons;
    use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
    let d = nvml.device_by_index(index).ok()?;
    let names: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    let throttle = d
        .current_throttle_reasons()
        .map(|r| {
            names
                .iter()
                .filter(|(f, _)| r.contains(*f))
                .map(|(_, n)| n.to_string())
                .collect()
        })
        .unwrap_or_default();
    Some(Telemetry {
        source: "nvml".into(),
        driver_version: nvml.sys_driver_version().ok(),
        sm_clock_mhz: d.clock_info(Clock::SM).ok(),
        sm_clock_max_mhz: d.max_clock_info(Clock::SM).ok(),
        mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
        mem_clock_max_mhz: d.max_clock_info(Clock::Memory).ok(),
        power_limit_w: d.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
        power_draw_w: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
        temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
        ecc_enabled: d.is_ecc_enabled().ok().map(|e| e.currently_enabled),
        pstate: d.performance_state().ok().map(|p| format!("{p:?}")),
        throttle_reasons: throttle,
    })
}

/// Query `nvidia-smi` (used when NVML cannot be loaded).
fn read_nvidia_smi(index: u32) -> Option<Telemetry> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,power.draw,temperature.gpu,ecc.mode.current,pstate,clocks_throttle_reasons.active",
            "--format=csv,noheader,nounits",
            &format!("--id={index}"),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_nvidia_smi_line(String::from_utf8_lossy(&out.stdout).lines().next()?)
}

/// Parse one line of the `nvidia-smi --query-gpu` output above.
pub fn parse_nvidia_smi_line(line: &str) -> Option<Telemetry> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 11 {
        return None;
    }
    let num = |s: &str| s.parse::<f64>().ok();
    let int = |s: &str| s.parse::<f64>().ok().map(|v| v as u32);
    let mask = u64::from_str_radix(f[10].trim_start_matches("0x"), 16).ok();
    let mut throttle = Vec::new();
    if let Some(m) = mask {
        for (bit, name) in [
            (0x1, "gpu_idle"),
            (0x2, "applications_clocks_setting"),
            (0x4, "sw_power_cap"),
            (0x8, "hw_slowdown"),
            (0x10, "sync_boost"),
            (0x20, "sw_thermal_slowdown"),
            (0x40, "hw_thermal_slowdown"),
            (0x80, "hw_power_brake_slowdown"),
            (0x100, "display_clock_setting"),
        ] {
            if m & bit != 0 {
                throttle.push(name.to_string());
            }
        }
    }
    Some(Telemetry {
        source: "nvidia-smi".into(),
        driver_version: Some(f[0].to_string()).filter(|s| !s.is_empty()),
        sm_clock_mhz: int(f[1]),
        sm_clock_max_mhz: int(f[2]),
        mem_clock_mhz: int(f[3]),
        mem_clock_max_mhz: int(f[4]),
        power_limit_w: num(f[5]),
        power_draw_w: num(f[6]),
        temperature_c: int(f[7]),
        ecc_enabled: match f[8] {
            "Enabled" => Some(true),
            "Disabled" => Some(false),
            _ => None,
        },
        pstate: Some(f[9].to_string()),
        throttle_reasons: throttle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvidia_smi() {
        let t = parse_nvidia_smi_line(
            "580.159.04, 1980, 1980, 3201, 3201, 700.00, 123.45, 41, Enabled, P0, 0x0000000000000004",
        )
        .unwrap();
        assert_eq!(t.sm_clock_mhz, Some(1980));
        assert_eq!(t.power_limit_w, Some(700.0));
        assert_eq!(t.ecc_enabled, Some(true));
        assert_eq!(t.throttle_reasons, vec!["sw_power_cap"]);
        assert_eq!(t.harmful_throttle_reasons(), vec!["sw_power_cap"]);
        assert!(parse_nvidia_smi_line("garbage").is_none());
        let t = parse_nvidia_smi_line("x, [N/A], 1, 2, 3, [N/A], 4, 5, [N/A], P8, 0x1").unwrap();
        assert_eq!(t.sm_clock_mhz, None);
        assert_eq!(t.ecc_enabled, None);
        assert!(t.harmful_throttle_reasons().is_empty());
    }

    #[test]
    fn reader_without_a_gpu_does_not_panic() {
        let r = TelemetryReader::new(0);
        let _ = r.read();
    }
}
