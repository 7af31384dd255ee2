//! Several GPUs in one process: CUDA's peer-access verdict per pair, one device of a multi-GPU
//! measurement ([`Dev`]: its context and stream) with `cuMemAlloc` buffers ([`RawBuf`]), and the
//! timed peer-to-peer copies (each ordered pair, and both directions at once) that
//! rigbench's `multigpu::p2p` measures with.
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
use crate::GpuError;

/// A failure found by a caller outside a CUDA call (no samples, a wrong size), as
/// [`GpuError::Usage`]: `context` and the `Debug` text of `e`.
pub fn cuda_err(context: &str, e: impl std::fmt::Debug) -> GpuError {
    GpuError::Usage {
        context: context.to_string(),
        message: format!("{e:?}"),
    }
}

/// A failed call as the [`GpuError`] variant of its library, with `context`.
fn fail(context: &str, e: impl crate::error::Cause) -> GpuError {
    e.at(context)
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
/// [`GpuError::NoGpu`] when the driver is missing, too old or reports no device.
pub fn device_count() -> Result<usize, GpuError> {
    if !libraries().driver {
        return Err(GpuError::NoGpu(
            "no CUDA driver found (libcuda.so could not be loaded)".into(),
        ));
    }
    cudarc::driver::result::init().map_err(|e| GpuError::NoGpu(format!("cuInit failed: {e:?}")))?;
    check_driver_version().map_err(GpuError::NoGpu)?;
    let n = cudarc::driver::result::device::get_count().unwrap_or(0);
    if n <= 0 {
        return Err(GpuError::NoGpu("the CUDA driver reports no GPU".into()));
    }
    Ok(n as usize)
}

/// One device of a multi-GPU measurement: its context and a non-blocking stream.
pub struct Dev {
    /// CUDA index.
    pub index: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
}

impl Dev {
    /// Open device `index`.
    pub fn open(index: usize) -> Result<Self, GpuError> {
        let ctx = CudaContext::new(index)
            .map_err(|e| fail(&format!("creating the context of device {index}"), e))?;
        // SAFETY: rigbench orders its own work on this one stream per device.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| fail(&format!("creating a stream on device {index}"), e))?;
        Ok(Self { index, ctx, stream })
    }

    /// Make this device's context current on the calling thread.
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| fail(&format!("binding device {}", self.index), e))
    }

    /// The raw stream handle.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Wait for all work of this device's context (any stream, including the legacy one that
    /// the synchronous memset and copy calls use).
    pub fn ctx_sync(&self) -> Result<(), GpuError> {
        self.ctx
            .synchronize()
            .map_err(|e| fail(&format!("synchronizing device {}", self.index), e))
    }

    /// Wait for this device's stream.
    pub fn sync(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(|e| fail(&format!("synchronizing device {}", self.index), e))
    }

    /// Free and total memory of this device, bytes (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        self.bind()?;
        self.ctx.mem_get_info().map_err(|e| fail("cuMemGetInfo", e))
    }

    fn event(&self) -> Result<CudaEvent, GpuError> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| fail("creating a timing event", e))
    }
}

/// A `cuMemAlloc` buffer on one device, freed on drop.
pub struct RawBuf {
    ctx: Arc<CudaContext>,
    /// Device pointer.
    pub(crate) ptr: sys::CUdeviceptr,
}

impl RawBuf {
    /// Allocate `bytes` on `dev` and fill it with `byte`.
    pub fn new(dev: &Dev, bytes: usize, byte: u8) -> Result<Self, GpuError> {
        dev.bind()?;
        // SAFETY: the context is current; the pointer is freed in Drop with the same context.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }.map_err(|e| {
            fail(
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
            .map_err(|e| fail("memset", e))?;
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
pub fn enable_peer(from: &Dev, to: &Dev) -> Result<bool, GpuError> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid device handles; writes one int.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.ctx.cu_device(), to.ctx.cu_device()) }
        .result()
        .map_err(|e| fail("cuDeviceCanAccessPeer", e))?;
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
        e => Err(fail(
            &format!(
                "cuCtxEnablePeerAccess from device {} to {}",
                from.index, to.index
            ),
            e,
        )),
    }
}

/// Copy `bytes` from `src` to `dst` with `cuMemcpyPeerAsync` on `on`'s stream.
fn peer_copy(
    on: &Dev,
    dst: (&Dev, &RawBuf),
    src: (&Dev, &RawBuf),
    bytes: usize,
) -> Result<(), GpuError> {
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
        fail(
            &format!("copy from device {} to {}", src.0.index, dst.0.index),
            e,
        )
    })
}

/// One copy of `bytes` from `sbuf` on `src` to `dbuf` on `dst`, checked (the first and last
/// 4 KiB of the destination must then hold the source's 0x5A bytes), then `warmup` untimed
/// copies and `samples` (at least one) copies each between CUDA events on the source's stream.
/// Returns each sample's time in seconds.
///
/// # Errors
/// The check fails (the copy is not timed) or a CUDA call fails.
pub fn time_copy(
    src: &Dev,
    sbuf: &RawBuf,
    dst: &Dev,
    dbuf: &RawBuf,
    bytes: usize,
    warmup: usize,
    samples: usize,
) -> Result<Vec<f64>, GpuError> {
    // The check: the destination must hold the source's bytes (0x5A) after one copy.
    dst.bind()?;
    // SAFETY: writes exactly the first `bytes` bytes of the destination buffer.
    unsafe { cudarc::driver::result::memset_d8_sync(dbuf.ptr, 0, bytes) }
        .map_err(|e| fail("memset", e))?;
    dst.ctx_sync()?;
    peer_copy(src, (dst, dbuf), (src, sbuf), bytes)?;
    src.sync()?;
    let probe = 4096.min(bytes);
    for at in [0, bytes - probe] {
        let mut got = vec![0u8; probe];
        dst.bind()?;
        // SAFETY: reads `probe` bytes inside the buffer.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut got, dbuf.ptr + at as u64) }
            .map_err(|e| fail("reading back a copy", e))?;
        if let Some(i) = got.iter().position(|b| *b != 0x5A) {
            return Err(fail(
                &format!("check of the copy GPU{} → GPU{}", src.index, dst.index),
                format!(
                    "byte {} is {:#04x}, expected 0x5a: not timed",
                    at + i,
                    got[i]
                ),
            ));
        }
    }
    for _ in 0..warmup {
        peer_copy(src, (dst, dbuf), (src, sbuf), bytes)?;
    }
    src.sync()?;
    let (start, end) = (src.event()?, src.event()?);
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        start
            .record(&src.stream)
            .map_err(|e| fail("event record", e))?;
        peer_copy(src, (dst, dbuf), (src, sbuf), bytes)?;
        end.record(&src.stream)
            .map_err(|e| fail("event record", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| fail("event elapsed time", e))?;
        times.push(ms as f64 * 1e-3);
    }
    Ok(times)
}

/// Both directions at once between `a` and `b` (buffers: (source, destination) on each): the
/// second device's stream waits on the first's start event, both copies run, and the time is
/// taken until both finished; `warmup` untimed rounds, then `samples` (at least one) timed.
/// Returns each sample's time in seconds.
///
/// # Errors
/// A CUDA call fails.
pub fn time_bidir(
    a: &Dev,
    abuf: &(RawBuf, RawBuf),
    b: &Dev,
    bbuf: &(RawBuf, RawBuf),
    bytes: usize,
    warmup: usize,
    samples: usize,
) -> Result<Vec<f64>, GpuError> {
    let (start, end) = (a.event()?, a.event()?);
    let b_done = b.event()?;
    let mut times = Vec::new();
    for s in 0..warmup + samples.max(1) {
        a.bind()?;
        start
            .record(&a.stream)
            .map_err(|e| fail("event record", e))?;
        b.bind()?;
        // SAFETY: valid stream and event; a stream may wait on another context's event.
        unsafe { sys::cuStreamWaitEvent(b.cu_stream(), start.cu_event(), 0) }
            .result()
            .map_err(|e| fail("cuStreamWaitEvent", e))?;
        peer_copy(a, (b, &bbuf.1), (a, &abuf.0), bytes)?;
        peer_copy(b, (a, &abuf.1), (b, &bbuf.0), bytes)?;
        b_done
            .record(&b.stream)
            .map_err(|e| fail("event record", e))?;
        a.bind()?;
        // SAFETY: as above.
        unsafe { sys::cuStreamWaitEvent(a.cu_stream(), b_done.cu_event(), 0) }
            .result()
            .map_err(|e| fail("cuStreamWaitEvent", e))?;
        end.record(&a.stream).map_err(|e| fail("event record", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| fail("event elapsed time", e))?;
        if s >= warmup {
            times.push(ms as f64 * 1e-3);
        }
    }
    b.sync()?;
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_are_errors_not_panics() {
        assert_eq!(peer_access(0, 1 << 20), None, "no machine has that device");
        if !libraries().driver {
            assert!(device_count().is_err());
        }
    }
}
