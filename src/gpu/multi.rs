//! Several GPUs in one process: CUDA's peer-access verdict per pair, and peer-to-peer copy
//! bandwidth (each ordered pair, and both directions at once).
//!
//! Each device gets its own (primary) context and a non-blocking stream. Buffers come from
//! `cuMemAlloc` (not the stream-ordered pool: pool memory needs `cuMemPoolSetAccess` for peers,
//! which `cuCtxEnablePeerAccess` does not grant). Copies use `cuMemcpyPeerAsync` on the source
//! device's stream, timed with CUDA events created with timing enabled on that stream, as
//! CUDA's `p2pBandwidthLatencyTest` sample does; with peer access enabled the copy engine moves
//! the bytes directly, without it the driver stages them through host memory (recorded).
//!
//! Callers should run these functions on a thread of their own: they make each device's context
//! current in turn, which would change the current context of a thread that also drives a
//! [`super::Gpu`].

use std::sync::Arc;

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::probe::{check_driver_version, libraries};
use crate::multigpu::schema::{OpTiming, P2pBidir, P2pCopy, P2pResults};
use crate::RigError;

fn cuda_err(context: &str, e: impl std::fmt::Debug) -> RigError {
    RigError::Cuda {
        context: context.to_string(),
        message: format!("{e:?}"),
    }
}

/// Whether CUDA allows peer access between devices `a` and `b` in both directions
/// (`cuDeviceCanAccessPeer`). `None` without a driver or for an unknown device.
pub fn peer_access(a: usize, b: usize) -> Option<bool> {
    if !libraries().driver {
        return None;
    }
    cudarc::driver::result::init().ok()?;
    let da = cudarc::driver::result::device::get(a as i32).ok()?;
    let db = cudarc::driver::result::device::get(b as i32).ok()?;
    let can = |x, y| -> Option<bool> {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: the driver is initialised and both handles are valid; the call writes one int.
        unsafe { sys::cuDeviceCanAccessPeer(&mut v, x, y) }
            .result()
            .ok()?;
        Some(v != 0)
    };
    Some(can(da, db)? && can(db, da)?)
}

/// The PCI bus id (`dddd:bb:dd.0`) of CUDA device `index`; `None` without a driver or device.
pub fn pci_bus_id(index: usize) -> Option<String> {
    if !libraries().driver {
        return None;
    }
    cudarc::driver::result::init().ok()?;
    let dev = cudarc::driver::result::device::get(index as i32).ok()?;
    super::probe::pci_bus_id(dev)
}

/// Number of CUDA devices, after checking the driver (never panics).
///
/// # Errors
/// [`RigError::NoGpu`] when the driver is missing, too old or reports no device.
pub fn device_count() -> Result<usize, RigError> {
    if !libraries().driver {
        return Err(RigError::NoGpu(
            "no CUDA driver found (libcuda.so could not be loaded)".into(),
        ));
    }
    cudarc::driver::result::init().map_err(|e| RigError::NoGpu(format!("cuInit failed: {e:?}")))?;
    check_driver_version().map_err(RigError::NoGpu)?;
    let n = cudarc::driver::result::device::get_count().unwrap_or(0);
    if n <= 0 {
        return Err(RigError::NoGpu("the CUDA driver reports no GPU".into()));
    }
    Ok(n as usize)
}

/// One device of a multi-GPU measurement: its context and a non-blocking stream.
pub(crate) struct Dev {
    /// CUDA index.
    pub index: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
}

impl Dev {
    /// Open device `index`.
    pub(crate) fn open(index: usize) -> Result<Self, RigError> {
        let ctx = CudaContext::new(index)
            .map_err(|e| cuda_err(&format!("creating the context of device {index}"), e))?;
        // SAFETY: rigbench orders its own work on this one stream per device.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| cuda_err(&format!("creating a stream on device {index}"), e))?;
        Ok(Self { index, ctx, stream })
    }

    /// Make this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), RigError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err(&format!("binding device {}", self.index), e))
    }

    /// The raw stream handle.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Wait for all work of this device's context (any stream, including the legacy one that
    /// the synchronous memset and copy calls use).
    pub(crate) fn ctx_sync(&self) -> Result<(), RigError> {
        self.ctx
            .synchronize()
            .map_err(|e| cuda_err(&format!("synchronizing device {}", self.index), e))
    }

    /// Wait for this device's stream.
    pub(crate) fn sync(&self) -> Result<(), RigError> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_err(&format!("synchronizing device {}", self.index), e))
    }

    fn event(&self) -> Result<CudaEvent, RigError> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| cuda_err("creating a timing event", e))
    }
}

/// A `cuMemAlloc` buffer on one device, freed on drop.
pub(crate) struct RawBuf {
    ctx: Arc<CudaContext>,
    /// Device pointer.
    pub ptr: sys::CUdeviceptr,
}

impl RawBuf {
    /// Allocate `bytes` on `dev` and fill it with `byte`.
    pub(crate) fn new(dev: &Dev, bytes: usize, byte: u8) -> Result<Self, RigError> {
        dev.bind()?;
        // SAFETY: the context is current; the pointer is freed in Drop with the same context.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }.map_err(|e| {
            cuda_err(
                &format!("allocating {bytes} bytes on device {}", dev.index),
                e,
            )
        })?;
        let b = Self {
            ctx: dev.ctx.clone(),
            ptr,
        };
        // SAFETY: writes exactly the allocation.
        unsafe { cudarc::driver::result::memset_d8_sync(ptr, byte, bytes.max(1)) }
            .map_err(|e| cuda_err("memset", e))?;
        // cuMemsetD8 on device memory may return before it is done, on the legacy stream, which
        // rigbench's non-blocking streams do not wait for.
        dev.ctx_sync()?;
        Ok(b)
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context and not freed before.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
    }
}

/// Let `from`'s context access `to`'s memory. Returns whether peer access is on.
fn enable_peer(from: &Dev, to: &Dev) -> Result<bool, RigError> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid device handles; writes one int.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.ctx.cu_device(), to.ctx.cu_device()) }
        .result()
        .map_err(|e| cuda_err("cuDeviceCanAccessPeer", e))?;
    if can == 0 {
        return Ok(false);
    }
    from.bind()?;
    // SAFETY: `from`'s context is current and `to`'s context is alive.
    let r = unsafe { sys::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0) };
    match r {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(true)
        }
        e => Err(cuda_err(
            &format!(
                "cuCtxEnablePeerAccess from device {} to {}",
                from.index, to.index
            ),
            e,
        )),
    }
}

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

/// Copy `bytes` from `src` to `dst` with `cuMemcpyPeerAsync` on `on`'s stream.
fn peer_copy(
    on: &Dev,
    dst: (&Dev, &RawBuf),
    src: (&Dev, &RawBuf),
    bytes: usize,
) -> Result<(), RigError> {
    on.bind()?;
    // SAFETY: both buffers hold at least `bytes` bytes and live until the stream is synchronized.
    unsafe {
        cudarc::driver::result::memcpy_peer_async(
            dst.0.ctx.cu_ctx(),
            dst.1.ptr,
            src.0.ctx.cu_ctx(),
            src.1.ptr,
            bytes,
            on.cu_stream(),
        )
    }
    .map_err(|e| {
        cuda_err(
            &format!("copy from device {} to {}", src.0.index, dst.0.index),
            e,
        )
    })
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
        d.bind()?;
        let (free, _) = d
            .ctx
            .mem_get_info()
            .map_err(|e| cuda_err("cuMemGetInfo", e))?;
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
            match time_copy(a, &bufs[i].0, b, &bufs[j].1, bytes, opts) {
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
            match time_bidir(&devs[i], &bufs[i], &devs[j], &bufs[j], bytes, opts) {
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

fn time_copy(
    src: &Dev,
    sbuf: &RawBuf,
    dst: &Dev,
    dbuf: &RawBuf,
    bytes: usize,
    opts: &P2pOptions,
) -> Result<OpTiming, RigError> {
    // The check: the destination must hold the source's bytes (0x5A) after one copy.
    dst.bind()?;
    // SAFETY: writes exactly the first `bytes` bytes of the destination buffer.
    unsafe { cudarc::driver::result::memset_d8_sync(dbuf.ptr, 0, bytes) }
        .map_err(|e| cuda_err("memset", e))?;
    dst.ctx_sync()?;
    peer_copy(src, (dst, dbuf), (src, sbuf), bytes)?;
    src.sync()?;
    let probe = 4096.min(bytes);
    for at in [0, bytes - probe] {
        let mut got = vec![0u8; probe];
        dst.bind()?;
        // SAFETY: reads `probe` bytes inside the buffer.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut got, dbuf.ptr + at as u64) }
            .map_err(|e| cuda_err("reading back a copy", e))?;
        if let Some(i) = got.iter().position(|b| *b != 0x5A) {
            return Err(cuda_err(
                &format!("check of the copy GPU{} → GPU{}", src.index, dst.index),
                format!(
                    "byte {} is {:#04x}, expected 0x5a: not timed",
                    at + i,
                    got[i]
                ),
            ));
        }
    }
    for _ in 0..opts.warmup {
        peer_copy(src, (dst, dbuf), (src, sbuf), bytes)?;
    }
    src.sync()?;
    let (start, end) = (src.event()?, src.event()?);
    let mut samples = Vec::with_capacity(opts.samples);
    for _ in 0..opts.samples.max(1) {
        start
            .record(&src.stream)
            .map_err(|e| cuda_err("event record", e))?;
        peer_copy(src, (dst, dbuf), (src, sbuf), bytes)?;
        end.record(&src.stream)
            .map_err(|e| cuda_err("event record", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| cuda_err("event elapsed time", e))?;
        samples.push(ms as f64 * 1e-3);
    }
    OpTiming::of(samples).ok_or_else(|| cuda_err("timing", "no samples"))
}

fn time_bidir(
    a: &Dev,
    abuf: &(RawBuf, RawBuf),
    b: &Dev,
    bbuf: &(RawBuf, RawBuf),
    bytes: usize,
    opts: &P2pOptions,
) -> Result<OpTiming, RigError> {
    let (start, end) = (a.event()?, a.event()?);
    let b_done = b.event()?;
    let mut samples = Vec::new();
    for s in 0..opts.warmup + opts.samples.max(1) {
        a.bind()?;
        start
            .record(&a.stream)
            .map_err(|e| cuda_err("event record", e))?;
        b.bind()?;
        // SAFETY: valid stream and event; a stream may wait on another context's event.
        unsafe { sys::cuStreamWaitEvent(b.cu_stream(), start.cu_event(), 0) }
            .result()
            .map_err(|e| cuda_err("cuStreamWaitEvent", e))?;
        peer_copy(a, (b, &bbuf.1), (a, &abuf.0), bytes)?;
        peer_copy(b, (a, &abuf.1), (b, &bbuf.0), bytes)?;
        b_done
            .record(&b.stream)
            .map_err(|e| cuda_err("event record", e))?;
        a.bind()?;
        // SAFETY: as above.
        unsafe { sys::cuStreamWaitEvent(a.cu_stream(), b_done.cu_event(), 0) }
            .result()
            .map_err(|e| cuda_err("cuStreamWaitEvent", e))?;
        end.record(&a.stream)
            .map_err(|e| cuda_err("event record", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| cuda_err("event elapsed time", e))?;
        if s >= opts.warmup {
            samples.push(ms as f64 * 1e-3);
        }
    }
    b.sync()?;
    OpTiming::of(samples).ok_or_else(|| cuda_err("timing", "no samples"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_are_errors_not_panics() {
        assert_eq!(peer_access(0, 1 << 20), None, "no machine has that device");
        let e = measure_p2p(&[0], &P2pOptions::default())
            .unwrap_err()
            .to_string();
        if libraries().driver {
            assert!(e.contains("two or more") || e.contains("no GPU"), "{e}");
        } else {
            assert!(e.contains("no CUDA driver"), "{e}");
            assert!(device_count().is_err());
        }
    }
}
