//! Which device the runtime runs on (`--device cuda[:N]|cpu`): the default is `cuda:0` when a
//! GPU is present, `cpu` otherwise. The probe asks [`crate::gpu::libraries`] first and goes
//! through [`crate::rig::probe`] (the only place that calls the driver), so it never panics
//! without CUDA.

use super::backend::Device;
use crate::RigError;

/// The GPUs this machine has, as the probe saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuPresence {
    /// GPUs the driver reports.
    pub count: usize,
    /// `index: name` of each.
    pub names: Vec<String>,
    /// Why there is none, when `count` is 0.
    pub absent_reason: Option<String>,
}

/// Probe the GPUs (never panics; without a driver the count is 0 with the reason).
pub fn probe_gpus() -> GpuPresence {
    let libs = crate::gpu::libraries();
    if !libs.driver {
        return GpuPresence {
            count: 0,
            names: Vec::new(),
            absent_reason: Some("no CUDA driver found (libcuda.so could not be loaded)".into()),
        };
    }
    let rig = crate::rig::probe();
    match &rig.gpu {
        Some(g) => {
            let mut names = vec![format!("0: {}", g.name)];
            names.extend(rig.other_gpus.iter().cloned());
            GpuPresence {
                count: names.len(),
                names,
                absent_reason: None,
            }
        }
        None => GpuPresence {
            count: 0,
            names: Vec::new(),
            absent_reason: Some(
                rig.gpu_absent_reason
                    .unwrap_or_else(|| "the CUDA driver reports no GPU".into()),
            ),
        },
    }
}

/// The device to use: `requested` (from `--device`) checked against `gpus`, or the default
/// (`cuda:0` with a GPU, else `cpu`).
///
/// # Errors
/// [`RigError::BadFlag`] for `--device` (exit 64): a CUDA device asked for with no GPU (with
/// the probe's reason), or an ordinal beyond the GPUs present.
pub fn resolve_device(requested: Option<Device>, gpus: &GpuPresence) -> Result<Device, RigError> {
    match requested {
        None => Ok(if gpus.count > 0 {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }),
        Some(Device::Cpu) => Ok(Device::Cpu),
        Some(Device::Cuda(i)) if gpus.count == 0 => Err(RigError::flag(
            "--device",
            format!(
                "cuda:{i} asked for, but this machine has no usable GPU: {}; use --device cpu",
                gpus.absent_reason
                    .as_deref()
                    .unwrap_or("the driver reports none")
            ),
        )),
        Some(Device::Cuda(i)) if i >= gpus.count => Err(RigError::flag(
            "--device",
            format!(
                "cuda:{i} asked for, but the driver reports {} GPU(s) ({}); use cuda:0..cuda:{}",
                gpus.count,
                gpus.names.join(", "),
                gpus.count - 1
            ),
        )),
        Some(d) => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_and_refusals() {
        let none = GpuPresence {
            count: 0,
            names: vec![],
            absent_reason: Some("no CUDA driver found".into()),
        };
        let two = GpuPresence {
            count: 2,
            names: vec!["0: NVIDIA H200".into(), "1: NVIDIA H200".into()],
            absent_reason: None,
        };
        assert_eq!(resolve_device(None, &none).unwrap(), Device::Cpu);
        assert_eq!(resolve_device(None, &two).unwrap(), Device::Cuda(0));
        assert_eq!(
            resolve_device(Some(Device::Cpu), &two).unwrap(),
            Device::Cpu
        );
        assert_eq!(
            resolve_device(Some(Device::Cuda(1)), &two).unwrap(),
            Device::Cuda(1)
        );
        let e = resolve_device(Some(Device::Cuda(0)), &none).unwrap_err();
        assert!(matches!(e, RigError::BadFlag { .. }));
        let m = e.to_string();
        assert!(
            m.contains("--device") && m.contains("no CUDA driver found"),
            "{m}"
        );
        let m = resolve_device(Some(Device::Cuda(2)), &two)
            .unwrap_err()
            .to_string();
        assert!(m.contains("2 GPU(s)") && m.contains("cuda:1"), "{m}");
    }

    #[test]
    fn probe_never_panics() {
        let g = probe_gpus();
        assert_eq!(g.count == 0, g.absent_reason.is_some());
    }
}
