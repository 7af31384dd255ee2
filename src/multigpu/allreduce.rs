//! All-reduce bandwidth through NCCL over the selected GPUs, at the message sizes of a
//! tensor-parallel decode step and at large sizes. The device work (NCCL, communicators,
//! buffers) is [`crate::gpu::nccl`]'s; this module checks the result, times and records
//! [`AllReduceWorld`].
//!
//! Timing follows nccl-tests (`-g N`: one process and thread drive all GPUs, each all-reduce is
//! one `ncclGroupStart`/`ncclAllReduce` per rank/`ncclGroupEnd`): warm-up, then per sample a run
//! of back-to-back all-reduces between stream synchronizations on every GPU, timed on the host
//! clock and divided by the count. Bus bandwidth per nccl-tests' `doc/PERFORMANCE.md`: algbw =
//! bytes / time, busbw = algbw · 2(n−1)/n for all-reduce.

use std::time::Instant;

use super::schema::{AllReducePoint, AllReduceWorld, OpTiming};
use crate::gpu::nccl::AllReduceGroup;
use crate::RigError;

/// Bus bandwidth of an all-reduce over `ranks` GPUs from its algorithm bandwidth: busbw =
/// algbw · 2(n−1)/n (nccl-tests, `doc/PERFORMANCE.md`, "AllReduce").
pub fn allreduce_busbw(algbw: f64, ranks: usize) -> f64 {
    if ranks == 0 {
        return 0.0;
    }
    algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64
}

/// How the all-reduces are measured.
#[derive(Debug, Clone)]
pub struct AllReduceOptions {
    /// Message sizes in bytes (per rank, BF16), each with the decode M it stands for, if any.
    pub sizes: Vec<(u64, Option<usize>)>,
    /// Untimed all-reduces per size.
    pub warmup: usize,
    /// Timed samples per size.
    pub samples: usize,
    /// Aim for samples of about this long, seconds (sets all-reduces per sample).
    pub target_sample_s: f64,
    /// Bounds on all-reduces per sample.
    pub iters: (usize, usize),
}

impl Default for AllReduceOptions {
    fn default() -> Self {
        Self {
            sizes: Vec::new(),
            warmup: 5,
            samples: 10,
            target_sample_s: 2e-3,
            iters: (5, 200),
        }
    }
}

/// Measure BF16 sum all-reduces over `devices` (one communicator, one rank per GPU) at each size
/// of `opts`. Checks the result once on small data first (rank r sends r + 1 everywhere; every
/// output must equal n(n+1)/2 exactly).
///
/// # Errors
/// NCCL missing ([`RigError::NoGpu`] with [`crate::gpu::nccl::probe`]'s reason), no GPU, fewer
/// than two devices, or an NCCL or CUDA failure (sizes measured before it are lost only in that
/// case; the caller records the error).
pub fn measure_allreduce(
    devices: &[usize],
    opts: &AllReduceOptions,
) -> Result<AllReduceWorld, RigError> {
    let max_bytes = opts.sizes.iter().map(|s| s.0).max().unwrap_or(0).max(4096) as usize;
    let group = AllReduceGroup::open(devices, max_bytes)?;
    let ranks = group.ranks();

    // The check.
    let count = 1024usize;
    let (wrong, want) = group.check_sum(count)?;
    let mut world = AllReduceWorld {
        devices: devices.to_vec(),
        check: format!(
            "BF16 sum of {count} elements, rank r sending r + 1: every output of every rank must be {want} exactly; {wrong} were not"
        ),
        check_passed: wrong == 0,
        ..Default::default()
    };
    if wrong > 0 {
        world.error = Some("the all-reduce result was wrong: not timed".into());
        return Ok(world);
    }

    for &(bytes, m) in &opts.sizes {
        let count = (bytes / 2) as usize;
        for _ in 0..opts.warmup {
            group.all_reduce(count)?;
        }
        group.sync()?;
        // Estimate the time of one to choose the count per sample.
        let t0 = Instant::now();
        let probe_n = 3;
        for _ in 0..probe_n {
            group.all_reduce(count)?;
        }
        group.sync()?;
        let est = t0.elapsed().as_secs_f64() / probe_n as f64;
        let iters = ((opts.target_sample_s / est.max(1e-7)).ceil() as usize)
            .clamp(opts.iters.0.max(1), opts.iters.1.max(opts.iters.0.max(1)));
        let mut samples = Vec::with_capacity(opts.samples);
        for _ in 0..opts.samples.max(1) {
            group.sync()?;
            let t = Instant::now();
            for _ in 0..iters {
                group.all_reduce(count)?;
            }
            group.sync()?;
            samples.push(t.elapsed().as_secs_f64() / iters as f64);
        }
        let timing = OpTiming::of(samples).ok_or_else(|| RigError::Cuda {
            context: "all-reduce timing".into(),
            message: "no samples".into(),
        })?;
        let algbw = bytes as f64 / timing.median_s;
        world.points.push(AllReducePoint {
            bytes,
            m,
            iters,
            busbw: allreduce_busbw(algbw, ranks),
            algbw,
            timing,
        });
    }
    Ok(world)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        // nccl-tests PERFORMANCE.md: busbw = algbw · 2(n−1)/n; n = 2 → ×1, n = 8 → ×1.75.
        assert_eq!(allreduce_busbw(100.0, 2), 100.0);
        assert_eq!(allreduce_busbw(100.0, 8), 175.0);
        assert_eq!(allreduce_busbw(100.0, 4), 150.0);
        assert_eq!(allreduce_busbw(100.0, 1), 0.0);
        assert_eq!(allreduce_busbw(100.0, 0), 0.0);
    }

    #[test]
    fn one_gpu_or_no_nccl_is_an_error_not_a_panic() {
        let e = measure_allreduce(&[0], &AllReduceOptions::default()).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
}
