//! Peer-to-peer copy bandwidth between the selected GPUs: each ordered pair, and both directions
//! at once for each unordered pair, with CUDA's peer access enabled where the driver allows it.
//! The device work (contexts, `cuMemAlloc` buffers, `cuMemcpyPeerAsync` timed between CUDA
//! events, as CUDA's `p2pBandwidthLatencyTest` sample does) is [`crate::gpu::multi`]'s; this
//! module chooses the sizes, runs every pair and records [`P2pResults`].
//!
//! Callers should run [`measure_p2p`] on a thread of its own: it makes each device's context
//! current in turn, which would change the current context of a thread that also drives a
//! [`crate::gpu::Gpu`].

use super::schema::{OpTiming, P2pBidir, P2pCopy, P2pResults};
use crate::gpu::multi::{cuda_err, device_count, enable_peer, time_bidir, time_copy, Dev, RawBuf};
use crate::RigError;

/// How the peer-to-peer copies are measured.
#[derive(Debug, Clone)]
pub struct P2pOptions {
    /// Bytes per copy (capped at a quarter of the smallest free memory).
    pub bytes: usize,
    /// Untimed copies first.
    pub warmup: usize,
    /// Timed copies.
    pub samples: usize,
}

impl Default for P2pOptions {
    fn default() -> Self {
        Self {
            bytes: 256 << 20,
            warmup: 3,
            samples: 20,
        }
    }
}

/// Measure peer-to-peer copies between every ordered pair of `devices`, and both directions at
/// once for every unordered pair.
///
/// # Errors
/// No GPU, fewer than two devices, or a device that cannot be opened. A pair that fails is
/// recorded in [`P2pResults::notes`] and the others still run.
pub fn measure_p2p(devices: &[usize], opts: &P2pOptions) -> Result<P2pResults, RigError> {
    let n = device_count()?;
    if devices.len() < 2 {
        return Err(RigError::NoGpu(
            "peer-to-peer copies need two or more GPUs".into(),
        ));
    }
    if let Some(d) = devices.iter().find(|d| **d >= n) {
        return Err(RigError::NoGpu(format!(
            "no CUDA device {d} (the driver reports {n})"
        )));
    }
    let devs: Vec<Dev> = devices
        .iter()
        .map(|&i| Dev::open(i))
        .collect::<Result<_, _>>()?;
    let mut free_min = usize::MAX;
    for d in &devs {
        let (free, _) = d.mem_info()?;
        free_min = free_min.min(free);
    }
    let bytes = opts.bytes.min(free_min / 4).max(1 << 20);
    let mut res = P2pResults {
        bytes: bytes as u64,
        method: format!(
            "cuMemcpyPeerAsync of {} MiB on the source GPU's stream, checked once (the first and last 4 KiB of the destination must hold the source's bytes), {} warm-up copies, then {} copies each between CUDA events (timing enabled) on that stream; bandwidth = bytes / median time (each byte counted once). Both-ways figure: the two copies started together (the second stream waits on the first's start event) and timed until both finished; bandwidth = 2 × bytes / median time",
            bytes >> 20,
            opts.warmup,
            opts.samples
        ),
        ..Default::default()
    };
    // Peer access both ways for every pair, before any buffer is made.
    let mut access = vec![vec![false; devs.len()]; devs.len()];
    for (i, a) in devs.iter().enumerate() {
        for (j, b) in devs.iter().enumerate() {
            if i != j {
                match enable_peer(a, b) {
                    Ok(on) => access[i][j] = on,
                    Err(e) => res.notes.push(format!("{e}")),
                }
            }
        }
    }
    let bufs: Vec<(RawBuf, RawBuf)> = devs
        .iter()
        .map(|d| Ok((RawBuf::new(d, bytes, 0x5A)?, RawBuf::new(d, bytes, 0)?)))
        .collect::<Result<_, RigError>>()?;
    for (i, a) in devs.iter().enumerate() {
        for (j, b) in devs.iter().enumerate() {
            if i == j {
                continue;
            }
            let timed = time_copy(
                a,
                &bufs[i].0,
                b,
                &bufs[j].1,
                bytes,
                opts.warmup,
                opts.samples,
            )
            .map_err(RigError::from)
            .and_then(timing_of);
            match timed {
                Ok(t) => {
                    let bw = bytes as f64 / t.median_s;
                    res.copies.push(P2pCopy {
                        src: a.index,
                        dst: b.index,
                        peer_access: access[i][j] && access[j][i],
                        timing: t,
                        bytes_per_s: bw,
                    });
                }
                Err(e) => res
                    .notes
                    .push(format!("copy GPU{} → GPU{} failed: {e}", a.index, b.index)),
            }
        }
    }
    for i in 0..devs.len() {
        for j in i + 1..devs.len() {
            let timed = time_bidir(
                &devs[i],
                &bufs[i],
                &devs[j],
                &bufs[j],
                bytes,
                opts.warmup,
                opts.samples,
            )
            .map_err(RigError::from)
            .and_then(timing_of);
            match timed {
                Ok(t) => {
                    let bw = 2.0 * bytes as f64 / t.median_s;
                    res.bidirectional.push(P2pBidir {
                        a: devs[i].index,
                        b: devs[j].index,
                        timing: t,
                        bytes_per_s: bw,
                    });
                }
                Err(e) => res.notes.push(format!(
                    "both-ways copy GPU{} ⇄ GPU{} failed: {e}",
                    devs[i].index, devs[j].index
                )),
            }
        }
    }
    for d in &devs {
        d.sync()?;
    }
    Ok(res)
}

/// Summary of the sample times (seconds); no usable sample is a CUDA timing error.
fn timing_of(samples: Vec<f64>) -> Result<OpTiming, RigError> {
    OpTiming::of(samples).ok_or_else(|| cuda_err("timing", "no samples").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_are_errors_not_panics() {
        let e = measure_p2p(&[0], &P2pOptions::default())
            .unwrap_err()
            .to_string();
        if crate::gpu::libraries().driver {
            assert!(e.contains("two or more") || e.contains("no GPU"), "{e}");
        } else {
            assert!(e.contains("no CUDA driver"), "{e}");
            assert!(device_count().is_err());
        }
    }
}
