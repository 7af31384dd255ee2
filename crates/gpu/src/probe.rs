//! Probe the CUDA driver, NVRTC and cuBLASLt libraries and read every device's facts, as plain
//! facts ([`DeviceProbe`]); rigbench's `rig` turns them into the rig's facts.

use super::ComputeCapability;

/// The CUDA version rigbench's bindings are built for (cudarc feature `cuda-13000`): the driver
/// must support at least this (`cuDriverGetVersion` ≥ 13000; NVIDIA driver 580 or newer).
pub const MIN_DRIVER_CUDA: (i32, i32) = (13, 0);

/// Which GPU libraries can be loaded on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibraryStatus {
    /// `libcuda.so` (the driver).
    pub driver: bool,
    /// `libnvrtc.so` (run-time compiler).
    pub nvrtc: bool,
    /// `libcublasLt.so`.
    pub cublaslt: bool,
}

/// Ask cudarc whether each library loads. Safe to call on any machine.
pub fn libraries() -> LibraryStatus {
    // SAFETY: these only try `dlopen` on candidate names; no symbol is called.
    unsafe {
        LibraryStatus {
            driver: cudarc::driver::sys::is_culib_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
            cublaslt: cudarc::cublaslt::sys::is_culib_present(),
        }
    }
}

/// The CUDA version the driver supports, as (major, minor). Requires `libraries().driver`.
pub fn driver_cuda_version() -> Result<(i32, i32), String> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the driver library was found; cuDriverGetVersion only writes the int.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion failed: {r:?}"));
    }
    Ok((v / 1000, (v % 1000) / 10))
}

/// Check that the driver is new enough for the pinned CUDA version; the error names both.
pub fn check_driver_version() -> Result<(i32, i32), String> {
    let v = driver_cuda_version()?;
    if v < MIN_DRIVER_CUDA {
        return Err(format!(
            "the CUDA driver supports CUDA {}.{}, but rigbench is built for CUDA {}.{} (cudarc feature cuda-13000): install NVIDIA driver 580 or newer",
            v.0, v.1, MIN_DRIVER_CUDA.0, MIN_DRIVER_CUDA.1
        ));
    }
    Ok(v)
}

/// NVRTC version, when the library loads.
pub fn nvrtc_version() -> Option<String> {
    if !libraries().nvrtc {
        return None;
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: library present; the call writes two ints.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then(|| format!("{a}.{b}"))
}

/// cuBLASLt version (e.g. "13.0.2"), when the library loads.
pub fn cublaslt_version() -> Option<String> {
    if !libraries().cublaslt {
        return None;
    }
    // SAFETY: library present; the call takes no arguments.
    let v = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
    Some(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

/// Find the CUDA include folder (for `cuda_bf16.h` etc.): `$RIGBENCH_CUDA_INCLUDE` (the folder
/// itself; what `scripts/fetch-nvrtc.sh` sets, since a changed `CUDA_HOME` makes cargo rebuild
/// cudarc), `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, then
/// `/usr/local/cuda-*/include`.
pub fn cuda_include_dir() -> Option<std::path::PathBuf> {
    let mut candidates: Vec<std::path::PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("RIGBENCH_CUDA_INCLUDE") {
        candidates.push(std::path::PathBuf::from(v));
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            candidates.push(std::path::PathBuf::from(v).join("include"));
        }
    }
    candidates.push("/usr/local/cuda/include".into());
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut more: Vec<_> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .map(|n| n.to_string_lossy().starts_with("cuda-"))
                    .unwrap_or(false)
            })
            .map(|p| p.join("include"))
            .collect();
        more.sort();
        more.reverse();
        candidates.extend(more);
    }
    candidates
        .into_iter()
        .find(|p| p.join("cuda_bf16.h").is_file())
}

fn attr(dev: cudarc::driver::sys::CUdevice, a: cudarc::driver::sys::CUdevice_attribute) -> i64 {
    // SAFETY: driver initialised and `dev` valid; the call writes one int.
    unsafe { cudarc::driver::result::device::get_attribute(dev, a) }
        .map(|v| v as i64)
        .unwrap_or(0)
}

/// What the CUDA libraries and the driver say about this machine: library versions, what is
/// missing or unusable, and every device the driver reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceProbe {
    /// The CUDA version rigbench's bindings are built for, `major.minor` ([`MIN_DRIVER_CUDA`]).
    pub built_for_cuda: String,
    /// NVRTC version found at run time.
    pub nvrtc_version: Option<String>,
    /// cuBLASLt version found at run time.
    pub cublaslt_version: Option<String>,
    /// Where the CUDA headers for NVRTC were found.
    pub cuda_include_dir: Option<String>,
    /// Highest CUDA version the driver supports (`cuDriverGetVersion`, e.g. "13.0").
    pub driver_cuda_version: Option<String>,
    /// Libraries not found, or found but unusable, with the reason, in the order found.
    pub problems: Vec<String>,
    /// Why no device can be used (no driver, driver failed to initialise, no GPU), if so.
    pub absent_reason: Option<String>,
    /// Every device the driver reports, in CUDA order.
    pub devices: Vec<DeviceFacts>,
}

/// One CUDA device's facts, from driver attributes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFacts {
    /// CUDA device ordinal.
    pub index: usize,
    /// Device name as the driver reports it.
    pub name: String,
    /// Compute capability (`None` when the driver reports 0).
    pub compute_capability: Option<ComputeCapability>,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
    /// Opt-in shared memory per block, bytes.
    pub max_shared_mem_per_block_optin: u64,
    /// Memory bus width, bits.
    pub memory_bus_width_bits: u32,
    /// PCI bus id `dddd:bb:dd.0`, when the driver reports one.
    pub pci_bus_id: Option<String>,
}

/// Probe the libraries, the driver and every device. Never panics: a missing library or driver
/// becomes a [`DeviceProbe::problems`] entry or [`DeviceProbe::absent_reason`].
pub fn probe_devices() -> DeviceProbe {
    let libs = libraries();
    let mut p = DeviceProbe {
        built_for_cuda: format!("{}.{}", MIN_DRIVER_CUDA.0, MIN_DRIVER_CUDA.1),
        nvrtc_version: nvrtc_version(),
        cublaslt_version: cublaslt_version(),
        cuda_include_dir: cuda_include_dir().map(|p| p.display().to_string()),
        ..Default::default()
    };
    if !libs.nvrtc {
        p.problems
            .push("NVRTC (libnvrtc.so) not found: rigbench's own kernels cannot be built".into());
    }
    if !libs.cublaslt {
        p.problems.push(
            "cuBLASLt (libcublasLt.so) not found: the bf16 and fp8 benches cannot run".into(),
        );
    }
    if !libs.driver {
        p.absent_reason = Some("no CUDA driver found (libcuda.so could not be loaded)".into());
        return p;
    }
    if let Err(e) = cudarc::driver::result::init() {
        p.absent_reason = Some(format!("the CUDA driver failed to initialise: {e:?}"));
        return p;
    }
    match driver_cuda_version() {
        Ok(v) => p.driver_cuda_version = Some(format!("{}.{}", v.0, v.1)),
        Err(e) => p.problems.push(e),
    }
    if let Err(e) = check_driver_version() {
        p.problems.push(e);
    }
    let count = cudarc::driver::result::device::get_count().unwrap_or(0);
    if count <= 0 {
        p.absent_reason = Some("the CUDA driver loaded but reports no GPU".into());
        return p;
    }
    use cudarc::driver::sys::CUdevice_attribute as A;
    for i in 0..count {
        let Ok(dev) = cudarc::driver::result::device::get(i) else {
            continue;
        };
        let name = cudarc::driver::result::device::get_name(dev).unwrap_or_default();
        let major = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) as u32;
        let minor = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) as u32;
        // SAFETY: driver initialised, `dev` valid.
        let mem = unsafe { cudarc::driver::result::device::total_mem(dev) }.unwrap_or(0);
        p.devices.push(DeviceFacts {
            index: i as usize,
            name,
            compute_capability: (major > 0).then(|| ComputeCapability::new(major, minor)),
            sm_count: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as u32,
            memory_bytes: mem as u64,
            l2_bytes: attr(dev, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) as u64,
            max_shared_mem_per_block_optin: attr(
                dev,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            ) as u64,
            memory_bus_width_bits: attr(dev, A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) as u32,
            pci_bus_id: pci_bus_id(dev),
        });
    }
    p
}

/// The PCI bus id of a device as `dddd:bb:dd.0` (lower case; the form sysfs uses), from the
/// driver's PCI domain, bus and device attributes.
pub(crate) fn pci_bus_id(dev: cudarc::driver::sys::CUdevice) -> Option<String> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let bus = attr(dev, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    let device = attr(dev, A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    let domain = attr(dev, A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    (bus > 0 || device > 0 || domain > 0).then(|| format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_explains_absence() {
        let p = probe_devices();
        if p.devices.is_empty() {
            assert!(
                p.absent_reason.is_some(),
                "a missing GPU must carry a reason"
            );
        }
        assert_eq!(p.built_for_cuda, "13.0");
    }
}
