//! Host facts through `sysinfo`.

use super::HostFacts;

/// Read host name, OS, kernel, CPU model and count, and RAM.
pub fn probe() -> HostFacts {
    use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(
        RefreshKind::nothing()
            .with_cpu(CpuRefreshKind::nothing())
            .with_memory(MemoryRefreshKind::nothing().with_ram()),
    )
    .ok();
    let cpus = sys.as_ref().map(|s| s.cpus()).unwrap_or(&[]);
    HostFacts {
        hostname: System::host_name().unwrap_or_default(),
        os: System::long_os_version().unwrap_or_else(|_| std::env::consts::OS.to_string()),
        kernel: System::kernel_version().unwrap_or_default(),
        arch: std::env::consts::ARCH.to_string(),
        cpu_model: cpus
            .first()
            .map(|c| c.brand().trim().to_string())
            .unwrap_or_default(),
        cpu_logical_cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(cpus.len()),
        ram_bytes: sys.as_ref().map(|s| s.total_memory()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_reads_something() {
        let h = super::probe();
        assert!(h.cpu_logical_cores >= 1);
        assert!(h.ram_bytes > 0);
        assert!(!h.arch.is_empty());
    }
}
