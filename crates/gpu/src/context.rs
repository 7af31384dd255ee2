//! [`Gpu`]: a CUDA context on one device ([`Gpu::open`] for device 0, [`Gpu::open_device`] for
//! another; [`Gpu::open_device_stream`] with a stream of its own, for graph capture) with one
//! stream, device buffers, NVRTC modules (built through the compiled-kernel cache,
//! [`crate::kernel_cache`], with rigbench's CUDA headers on the include path,
//! [`crate::prelude`]), typed launches, event timing, CUDA graphs and the L2 flush. Opening it
//! probes the libraries first, so it returns an error (never panics) on a machine without CUDA.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};

use super::kernel_cache::{get_or_compile, CacheKey, CacheUse, KernelCache};
use super::probe::{check_driver_version, cuda_include_dir, libraries};
use super::ComputeCapability;
use crate::error::Cause;
use crate::GpuError;

/// A failed call as the [`GpuError`] variant of its library ([`Cause`]), with `context`.
fn cuda_err(context: &str, e: impl Cause) -> GpuError {
    e.at(context)
}

/// An open GPU: context, one stream, and the device facts kernels need.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Compute capability.
    pub cc: ComputeCapability,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// L2 size, bytes.
    pub l2_bytes: u64,
    /// Largest dynamic shared memory a block may opt in to, bytes.
    pub max_smem_optin: u32,
    /// Device name.
    pub name: String,
    /// CUDA include folder for NVRTC, if found.
    pub include_dir: Option<PathBuf>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({} {})", self.name, self.cc)
    }
}

/// A device allocation of `bytes` bytes (freed on drop).
pub struct DevBuf {
    _slice: CudaSlice<u8>,
    ptr: u64,
    bytes: usize,
}

impl DevBuf {
    /// The raw device pointer (valid while `self` lives).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Gpu {
    /// Open device 0. Checks the driver, NVRTC and cuBLASLt libraries and the driver's CUDA
    /// version before any other CUDA call.
    ///
    /// # Errors
    /// [`GpuError::NoGpu`] naming what is missing (driver, device, version).
    pub fn open() -> Result<Self, GpuError> {
        Self::open_device(0)
    }

    /// Open CUDA device `index` (an ordinal as the driver numbers the visible devices, i.e.
    /// after `CUDA_VISIBLE_DEVICES`), with its own context, on the context's default stream.
    /// Checks as [`Gpu::open`].
    ///
    /// # Errors
    /// [`GpuError::NoGpu`] naming what is missing (driver, device, version, or an index past the
    /// devices the driver reports).
    pub fn open_device(index: usize) -> Result<Self, GpuError> {
        Self::open_device_stream(index, false)
    }

    /// [`Gpu::open_device`]; with `own_stream`, work runs on a new (non-default) stream, which
    /// CUDA graph capture requires.
    ///
    /// # Errors
    /// As [`Gpu::open_device`].
    pub fn open_device_stream(index: usize, own_stream: bool) -> Result<Self, GpuError> {
        let libs = libraries();
        if !libs.driver {
            return Err(GpuError::NoGpu(
                "no CUDA driver found (libcuda.so could not be loaded)".into(),
            ));
        }
        cudarc::driver::result::init()
            .map_err(|e| GpuError::NoGpu(format!("cuInit failed: {e:?}")))?;
        check_driver_version().map_err(GpuError::NoGpu)?;
        let n = cudarc::driver::result::device::get_count().unwrap_or(0);
        if n <= 0 {
            return Err(GpuError::NoGpu("the CUDA driver reports no GPU".into()));
        }
        if index >= n as usize {
            return Err(GpuError::NoGpu(format!(
                "no CUDA device {index}: the driver reports {n} (devices 0 to {})",
                n - 1
            )));
        }
        let ctx = CudaContext::new(index)
            .map_err(|e| cuda_err(&format!("creating the CUDA context on device {index}"), e))?;
        // One stream only: rigbench orders its own work, and the timing events must not have
        // cudarc's tracking events recorded between them.
        // SAFETY: all buffers are used on this one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = if own_stream {
            ctx.new_stream()
                .map_err(|e| cuda_err("creating a stream", e))?
        } else {
            ctx.default_stream()
        };
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attr = |a| ctx.attribute(a).unwrap_or(0);
        let cc = ComputeCapability::new(
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) as u32,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) as u32,
        );
        Ok(Self {
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as u32,
            l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) as u64,
            max_smem_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) as u32,
            name: ctx.name().unwrap_or_default(),
            include_dir: cuda_include_dir(),
            cc,
            ctx,
            stream,
        })
    }

    /// Make this GPU's context current on the calling thread (the raw driver calls below need
    /// it; cudarc's own calls bind it themselves).
    ///
    /// # Errors
    /// A driver failure.
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the CUDA context to this thread", e))
    }

    /// The stream all work runs on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Free and total device memory, bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        self.ctx
            .mem_get_info()
            .map_err(|e| cuda_err("cuMemGetInfo", e))
    }

    /// Allocate `bytes` bytes (uninitialised).
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, GpuError> {
        let bytes_alloc = bytes.max(1);
        // SAFETY: the memory is written before it is read by every user of DevBuf.
        let slice = unsafe { self.stream.alloc::<u8>(bytes_alloc) }
            .map_err(|e| cuda_err(&format!("allocating {bytes} bytes"), e))?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _slice: slice,
            ptr,
            bytes,
        })
    }

    /// Allocate and copy `host` to the device.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, host: &[T]) -> Result<DevBuf, GpuError> {
        self.bind()?;
        let bytes = std::mem::size_of_val(host);
        let buf = self.alloc(bytes)?;
        if bytes > 0 {
            // SAFETY: `buf` holds at least `bytes` bytes; `host` is a valid slice of that size.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(buf.ptr, host, self.stream.cu_stream())
            }
            .map_err(|e| cuda_err("host-to-device copy", e))?;
        }
        self.sync()?;
        Ok(buf)
    }

    /// Copy `n` elements of `T` from `buf` (starting at element `offset`) to the host.
    pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        buf: &DevBuf,
        offset: usize,
        n: usize,
    ) -> Result<Vec<T>, GpuError> {
        self.bind()?;
        let sz = std::mem::size_of::<T>();
        if (offset + n) * sz > buf.bytes {
            return Err(cuda_err("download", "range past the end of the buffer"));
        }
        let mut out = vec![T::default(); n];
        if n > 0 {
            // SAFETY: range checked above; `out` has room for n elements.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut out,
                    buf.ptr + (offset * sz) as u64,
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| cuda_err("device-to-host copy", e))?;
        }
        self.sync()?;
        Ok(out)
    }

    /// Fill `buf` with `byte` (asynchronous, on the stream).
    pub fn memset(&self, buf: &DevBuf, byte: u8) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: writes exactly buf.bytes bytes of a live allocation.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                buf.ptr,
                byte,
                buf.bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| cuda_err("memset", e))
    }

    /// Device-to-device copy of `bytes` bytes (asynchronous).
    pub fn copy_d2d(&self, dst: &DevBuf, src: &DevBuf, bytes: usize) -> Result<(), GpuError> {
        if bytes > dst.bytes || bytes > src.bytes {
            return Err(cuda_err("copy", "size larger than a buffer"));
        }
        self.bind()?;
        // SAFETY: sizes checked.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.ptr,
                src.ptr,
                bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| cuda_err("device-to-device copy", e))
    }

    /// Wait for all queued work; surfaces asynchronous kernel errors.
    pub fn sync(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("stream synchronize", e))
    }

    /// Wait for this stream, then return the memory the device's stream-ordered pool holds but
    /// no buffer uses (`cuMemPoolTrimTo(pool, 0)`); only the wait on a device without memory
    /// pools. Buffers come from `cuMemAllocAsync`
    /// (cudarc's default when the device supports pools); freed ones stay reserved in the pool,
    /// and `cuMemGetInfo` counts them as used, so a capacity read after many allocate-and-free
    /// rounds (quantizing weights on the GPU) is low by what the pool kept.
    ///
    /// # Errors
    /// The synchronize or a driver call fails.
    pub fn trim_memory_pool(&self) -> Result<(), GpuError> {
        self.sync()?;
        if !self.ctx.has_async_alloc() {
            // cudarc allocates with cuMemAlloc here: no pool holds freed memory.
            return Ok(());
        }
        self.bind()?;
        let mut pool: cudarc::driver::sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: plain out-parameter of the documented type; the device handle is this
        // context's device.
        let r = unsafe { cudarc::driver::sys::cuDeviceGetMemPool(&mut pool, self.ctx.cu_device()) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_err("cuDeviceGetMemPool", r));
        }
        // SAFETY: `pool` was returned by the driver for this device just above.
        let r = unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, 0) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_err("cuMemPoolTrimTo", r));
        }
        Ok(())
    }

    /// Compile CUDA C++ `source` with NVRTC for this card and load the named kernels.
    ///
    /// # Errors
    /// NVRTC missing, the CUDA headers not found, a compile error (with NVRTC's log), or a
    /// kernel name not in the module.
    pub fn compile(&self, name: &str, source: &str, kernels: &[&str]) -> Result<Module, GpuError> {
        self.compile_with(name, source, kernels, &[])
    }

    /// [`Gpu::compile`] with extra NVRTC options (e.g. `-DW4_LOAD=1`).
    pub fn compile_with(
        &self,
        name: &str,
        source: &str,
        kernels: &[&str],
        extra: &[String],
    ) -> Result<Module, GpuError> {
        self.compile_for(name, source, kernels, &self.cc.arch_flag(), extra)
    }

    /// [`Gpu::compile_with`] for architecture `arch` instead of this card's plain `sm_XY`, e.g.
    /// `sm_90a` for the architecture-specific instructions (wgmma) only an sm_90 card runs;
    /// the caller checks that the card matches.
    pub fn compile_for(
        &self,
        name: &str,
        source: &str,
        kernels: &[&str],
        arch: &str,
        extra: &[String],
    ) -> Result<Module, GpuError> {
        let (ptx, compile_s, cache) = self.nvrtc(name, source, arch, extra)?;
        let mut m = self.load(name, ptx, kernels, arch, compile_s)?;
        m.cache = cache;
        m.source_sha256 = super::kernel_cache::sha256_hex(source.as_bytes());
        Ok(m)
    }

    /// [`Gpu::compile_for`], also returning the PTX text (for [`Gpu::load_ptx`] in another
    /// process, which then skips NVRTC).
    ///
    /// # Errors
    /// As [`Gpu::compile`].
    pub fn compile_for_ptx(
        &self,
        name: &str,
        source: &str,
        kernels: &[&str],
        arch: &str,
        extra: &[String],
    ) -> Result<(Module, String), GpuError> {
        let (ptx, compile_s, cache) = self.nvrtc(name, source, arch, extra)?;
        let text = ptx.to_src();
        let mut m = self.load(name, ptx, kernels, arch, compile_s)?;
        m.cache = cache;
        m.source_sha256 = super::kernel_cache::sha256_hex(source.as_bytes());
        Ok((m, text))
    }

    /// Load PTX text that NVRTC made for `arch` (see [`Gpu::compile_for_ptx`]) and the named
    /// kernels; the module's compile time reads 0.
    ///
    /// # Errors
    /// The driver rejects the PTX, or a kernel name is not in it.
    pub fn load_ptx(
        &self,
        name: &str,
        ptx: &str,
        kernels: &[&str],
        arch: &str,
    ) -> Result<Module, GpuError> {
        self.load(
            name,
            cudarc::nvrtc::Ptx::from_src(ptx.to_string()),
            kernels,
            arch,
            0.0,
        )
    }

    fn nvrtc(
        &self,
        name: &str,
        source: &str,
        arch: &str,
        extra: &[String],
    ) -> Result<(cudarc::nvrtc::Ptx, f64, CacheUse), GpuError> {
        if !libraries().nvrtc {
            return Err(GpuError::NoGpu(
                "NVRTC (libnvrtc.so) not found: cannot build rigbench's kernels".into(),
            ));
        }
        let include = self.include_dir.clone().ok_or_else(|| {
            GpuError::NoGpu(
                "CUDA headers (cuda_bf16.h) not found: set CUDA_HOME to the CUDA toolkit folder (or RIGBENCH_CUDA_INCLUDE to a folder holding them: scripts/fetch-nvrtc.sh)"
                    .into(),
            )
        })?;
        // The compiled-kernel cache (docs/architecture.md, "GPU layer"): a hit skips NVRTC.
        let cache = KernelCache::from_env();
        let key = CacheKey::new(name, source, arch, extra, &include, &nvrtc_version());
        let mut compile_s = 0.0;
        let (text, how, notes) = get_or_compile(cache.as_ref(), &key, || {
            let (ptx, s) = nvrtc_compile_with(name, source, arch, &include, extra)?;
            compile_s = s;
            Ok::<_, GpuError>(ptx)
        })?;
        for n in notes {
            eprintln!("note: {n}");
        }
        Ok((cudarc::nvrtc::Ptx::from_src(text), compile_s, how))
    }

    fn load(
        &self,
        name: &str,
        ptx: cudarc::nvrtc::Ptx,
        kernels: &[&str],
        arch: &str,
        compile_s: f64,
    ) -> Result<Module, GpuError> {
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| cuda_err(&format!("loading module {name}"), e))?;
        let mut funcs = HashMap::new();
        for k in kernels {
            let f = module
                .load_function(k)
                .map_err(|e| cuda_err(&format!("kernel {k} in kernels/{name}.cu"), e))?;
            funcs.insert(k.to_string(), f);
        }
        Ok(Module {
            _module: module,
            funcs,
            arch: arch.to_string(),
            compile_s,
            cache: CacheUse::Off,
            source_sha256: String::new(),
        })
    }

    /// Copy `host` into `buf` at byte offset `offset` (queued on the stream; pageable host
    /// memory makes it complete before this returns).
    ///
    /// # Errors
    /// The range past the end of the buffer, or a driver failure.
    pub fn write<T: cudarc::driver::DeviceRepr>(
        &self,
        buf: &DevBuf,
        offset: usize,
        host: &[T],
    ) -> Result<(), GpuError> {
        let bytes = std::mem::size_of_val(host);
        if offset + bytes > buf.bytes {
            return Err(cuda_err("write", "range past the end of the buffer"));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: range checked above; `host` is a valid slice of `bytes` bytes.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                buf.ptr + offset as u64,
                host,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| cuda_err("host-to-device copy", e))
    }

    /// Fill `bytes` bytes of `buf` from byte `offset` with `byte` (asynchronous).
    ///
    /// # Errors
    /// The range past the end of the buffer, or a driver failure.
    pub fn memset_range(
        &self,
        buf: &DevBuf,
        offset: usize,
        bytes: usize,
        byte: u8,
    ) -> Result<(), GpuError> {
        if offset + bytes > buf.bytes {
            return Err(cuda_err("memset", "range past the end of the buffer"));
        }
        self.bind()?;
        // SAFETY: range checked above.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                buf.ptr + offset as u64,
                byte,
                bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| cuda_err("memset", e))
    }

    /// Device-to-device copy of `bytes` bytes from byte `src_offset` of `src` to byte
    /// `dst_offset` of `dst` (asynchronous, on the stream).
    ///
    /// # Errors
    /// Either range past the end of its buffer, or a driver failure.
    pub fn copy_d2d_range(
        &self,
        dst: &DevBuf,
        dst_offset: usize,
        src: &DevBuf,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let past = |off: usize, len: usize| off.checked_add(bytes).is_none_or(|end| end > len);
        if past(dst_offset, dst.bytes) || past(src_offset, src.bytes) {
            return Err(cuda_err("copy", "range past the end of a buffer"));
        }
        self.bind()?;
        // SAFETY: both ranges checked above.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.ptr + dst_offset as u64,
                src.ptr + src_offset as u64,
                bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| cuda_err("device-to-device copy", e))
    }

    /// Start capturing this GPU's stream into a CUDA graph (the stream must not be the
    /// context's default stream: open with `own_stream`).
    ///
    /// # Errors
    /// A driver failure (e.g. capture on the legacy default stream).
    pub fn begin_capture(&self) -> Result<(), GpuError> {
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|e| cuda_err("beginning stream capture", e))
    }

    /// End the capture started by [`Gpu::begin_capture`] and instantiate the graph.
    ///
    /// # Errors
    /// A launch inside the capture that cannot be captured, or a driver failure.
    pub fn end_capture(&self) -> Result<Graph, GpuError> {
        let g = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(|e| cuda_err("ending stream capture", e))?
            .ok_or_else(|| cuda_err("ending stream capture", "the capture recorded nothing"))?;
        Ok(Graph { graph: g })
    }

    /// Create a pair of timing events (created with `CU_EVENT_DEFAULT`, so they record time).
    pub fn timer(&self) -> Result<Timer, GpuError> {
        let mk = || {
            self.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| cuda_err("creating a timing event", e))
        };
        Ok(Timer {
            start: mk()?,
            end: mk()?,
        })
    }
}

/// Compile CUDA C++ `source` to PTX with NVRTC for `arch` (e.g. `sm_90`), with the CUDA headers
/// in `include`. Needs only libnvrtc (no GPU). Returns the PTX text and the compile time in
/// seconds (plain text: no cudarc type crosses the crate's API).
///
/// # Errors
/// NVRTC missing, or a compile error carrying NVRTC's log.
pub fn nvrtc_compile(
    name: &str,
    source: &str,
    arch: &str,
    include: &std::path::Path,
) -> Result<(String, f64), GpuError> {
    nvrtc_compile_with(name, source, arch, include, &[])
}

/// [`nvrtc_compile`] with extra NVRTC options.
pub fn nvrtc_compile_with(
    name: &str,
    source: &str,
    arch: &str,
    include: &std::path::Path,
    extra: &[String],
) -> Result<(String, f64), GpuError> {
    if !libraries().nvrtc {
        return Err(GpuError::NoGpu("NVRTC (libnvrtc.so) not found".into()));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: [
            vec![
                format!("--gpu-architecture={arch}"),
                "--std=c++17".into(),
                "-lineinfo".into(),
            ],
            extra.to_vec(),
        ]
        .concat(),
        // rigbench's own headers (`#include "common.cuh"`) first, then the CUDA toolkit's.
        include_paths: vec![
            crate::prelude::include_dir()?.display().to_string(),
            include.display().to_string(),
        ],
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| cuda_err(&format!("NVRTC compile of kernels/{name}.cu"), e))?;
    Ok((ptx.to_src(), started.elapsed().as_secs_f64()))
}

/// A loaded NVRTC module and its kernels.
pub struct Module {
    _module: Arc<CudaModule>,
    funcs: HashMap<String, CudaFunction>,
    /// Architecture compiled for.
    pub arch: String,
    /// NVRTC compile time, seconds (0 when the PTX came from the compiled-kernel cache or
    /// from [`Gpu::load_ptx`]).
    pub compile_s: f64,
    /// Whether the PTX came from the compiled-kernel cache ([`CacheUse::Off`] for
    /// [`Gpu::load_ptx`]).
    pub cache: CacheUse,
    /// SHA-256 of the CUDA source compiled (empty for [`Gpu::load_ptx`]).
    pub source_sha256: String,
}

impl Module {
    /// How the module's PTX was obtained, for a note: `compiled by NVRTC in 12.90 s`, `loaded
    /// from the compiled-kernel cache`.
    pub fn how_built(&self) -> String {
        match self.cache {
            CacheUse::Hit => "loaded from the compiled-kernel cache (NVRTC not run)".to_string(),
            CacheUse::Miss | CacheUse::Rebuilt => format!(
                "compiled by NVRTC in {:.2} s (written to the compiled-kernel cache)",
                self.compile_s
            ),
            CacheUse::Off => format!("compiled by NVRTC in {:.2} s", self.compile_s),
        }
    }
}

/// NVRTC's version as `major.minor` (`"unknown"` when it cannot be asked), part of the
/// compiled-kernel cache key.
pub fn nvrtc_version() -> String {
    if !libraries().nvrtc {
        return "unknown".into();
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters of the documented types; libnvrtc is present (checked
    // above, so cudarc's loader does not panic).
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        "unknown".into()
    }
}

/// Resource use of one kernel (`cuFuncGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuncAttrs {
    /// Registers per thread.
    pub registers: u32,
    /// Local memory per thread, bytes.
    pub local_bytes: u32,
    /// Static shared memory, bytes.
    pub static_shared_bytes: u32,
    /// Max threads per block.
    pub max_threads_per_block: u32,
}

impl Module {
    /// A kernel by name.
    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction, GpuError> {
        self.funcs
            .get(name)
            .ok_or_else(|| cuda_err("kernel lookup", format!("no kernel named {name}")))
    }

    /// Resource use of a kernel.
    pub fn attrs(&self, name: &str) -> Result<FuncAttrs, GpuError> {
        let f = self.func(name)?;
        let get = |a| f.get_attribute(a).map(|v| v as u32).unwrap_or(0);
        Ok(FuncAttrs {
            registers: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS),
            local_bytes: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            static_shared_bytes: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            max_threads_per_block: get(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            ),
        })
    }

    /// Allow kernel `name` up to `bytes` of dynamic shared memory (above the 48 KiB default).
    ///
    /// # Errors
    /// An unknown kernel or a driver failure (more than the device allows).
    pub fn set_max_dynamic_smem(&self, name: &str, bytes: u32) -> Result<(), GpuError> {
        self.func(name)?
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| cuda_err(&format!("dynamic shared memory of {name}"), e))
    }

    /// Resident blocks per SM for kernel `name` at `block` threads and `smem` bytes of dynamic
    /// shared memory (raising the kernel's dynamic shared-memory limit to `smem` first).
    ///
    /// # Errors
    /// An unknown kernel or a driver failure.
    pub fn occupancy_smem(&self, name: &str, block: u32, smem: u32) -> Result<u32, GpuError> {
        if smem > 48 << 10 {
            self.set_max_dynamic_smem(name, smem)?;
        }
        self.func(name)?
            .occupancy_max_active_blocks_per_multiprocessor(block, smem as usize, None)
            .map_err(|e| cuda_err(&format!("occupancy of {name}"), e))
    }

    /// Resident blocks per SM for kernel `name` at `block` threads and no dynamic shared memory
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub fn occupancy(&self, name: &str, block: u32) -> Result<u32, GpuError> {
        self.func(name)?
            .occupancy_max_active_blocks_per_multiprocessor(block, 0, None)
            .map_err(|e| cuda_err(&format!("occupancy of {name}"), e))
    }

    /// Launch kernel `name` on `gpu`'s stream with `args` (raw values: device pointers as u64,
    /// ints, floats). Launch sites call the typed launchers that
    /// [`kernel_launchers!`](crate::kernel_launchers) declares instead (see [`super::launch`]).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in `kernels/*.cu` in number, order and
    /// type, and every pointer must address live device memory of the size the kernel reads
    /// and writes; a mismatch is undefined behaviour on the device.
    #[doc(hidden)]
    pub unsafe fn launch_raw(
        &self,
        gpu: &Gpu,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: &[KArg],
    ) -> Result<(), GpuError> {
        let f = self.func(name)?;
        let mut b = gpu.stream.launch_builder(f);
        for a in args {
            match a {
                KArg::Ptr(p) => b.arg(p),
                KArg::I32(v) => b.arg(v),
                KArg::U32(v) => b.arg(v),
                KArg::F32(v) => b.arg(v),
                KArg::U64(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: shared_bytes,
        };
        // SAFETY: the caller upholds this function's contract (arguments match the kernel's
        // signature; pointers are live).
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(&format!("launching {name}"), e))?;
        Ok(())
    }
}

/// An instantiated CUDA graph (captured from a [`Gpu`]'s stream); replays on that stream.
pub struct Graph {
    graph: cudarc::driver::CudaGraph,
}

// SAFETY: a Graph is only ever used by one thread at a time (it moves with its owner, e.g. a
// runtime backend handed to the engine thread); CUDA requires external serialization of graph
// calls, not thread affinity.
unsafe impl Send for Graph {}

impl Graph {
    /// Replay the graph on its stream.
    ///
    /// # Errors
    /// A driver failure.
    pub fn launch(&self) -> Result<(), GpuError> {
        self.graph
            .launch()
            .map_err(|e| cuda_err("launching a CUDA graph", e))
    }
}

/// A kernel argument.
#[derive(Debug, Clone, Copy)]
pub enum KArg {
    /// Device pointer.
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `unsigned`.
    U32(u32),
    /// `float`.
    F32(f32),
    /// `unsigned long long`.
    U64(u64),
}

/// Two CUDA events around a region of work on the stream.
pub struct Timer {
    start: CudaEvent,
    end: CudaEvent,
}

impl Timer {
    /// Record the start event.
    pub fn start(&self, gpu: &Gpu) -> Result<(), GpuError> {
        self.start
            .record(&gpu.stream)
            .map_err(|e| cuda_err("event record", e))
    }

    /// Record the end event without waiting (read it later with [`Timer::elapsed`]).
    pub fn mark_end(&self, gpu: &Gpu) -> Result<(), GpuError> {
        self.end
            .record(&gpu.stream)
            .map_err(|e| cuda_err("event record", e))
    }

    /// Seconds between the recorded start and end events (waits for the end event).
    pub fn elapsed(&self) -> Result<f64, GpuError> {
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| cuda_err("event elapsed time (a kernel may have failed)", e))?;
        Ok(ms as f64 * 1e-3)
    }

    /// Record the end event, wait for it, and return the elapsed time in seconds.
    pub fn stop(&self, gpu: &Gpu) -> Result<f64, GpuError> {
        self.end
            .record(&gpu.stream)
            .map_err(|e| cuda_err("event record", e))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| cuda_err("event elapsed time (a kernel may have failed)", e))?;
        Ok(ms as f64 * 1e-3)
    }
}

/// How L2 is flushed before a cold sample.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FlushMethod {
    /// Read a buffer of at least twice the L2 size (`l2_flush_read` in kernels/util.cu): L2 ends
    /// up holding clean lines only.
    Read,
    /// Write it with `cudaMemsetAsync`, as nvbench does: L2 ends up full of dirty lines, whose
    /// write-back lands inside the next (timed) kernel.
    Write,
}

/// Evicts L2 before a cold sample with a buffer of at least twice the L2 size, by
/// [`FlushMethod`].
pub struct L2Flusher {
    buf: DevBuf,
    sink: DevBuf,
    method: FlushMethod,
}

impl L2Flusher {
    /// Allocate a flush buffer of `max(2·L2, 64 MiB)` bytes.
    pub fn new(gpu: &Gpu, method: FlushMethod) -> Result<Self, GpuError> {
        let bytes = ((2 * gpu.l2_bytes as usize).max(64 << 20) / 16) * 16;
        let buf = gpu.alloc(bytes)?;
        gpu.memset(&buf, 0x11)?;
        Ok(Self {
            buf,
            sink: gpu.alloc(4)?,
            method,
        })
    }

    /// Bytes written per flush.
    pub fn bytes(&self) -> u64 {
        self.buf.bytes() as u64
    }

    /// Queue the flush on the stream (`util` is the module of kernels/util.cu).
    pub fn flush(&self, gpu: &Gpu, util: &Module) -> Result<(), GpuError> {
        if self.method == FlushMethod::Write {
            return gpu.memset(&self.buf, 0);
        }
        let n16 = self.buf.bytes() / 16;
        let blocks = (gpu.sm_count.max(1) * 4).max(1);
        super::util_kernels::l2_flush_read(
            util,
            gpu,
            (blocks, 1, 1),
            (512, 1, 1),
            0,
            &self.buf,
            n16,
            &self.sink,
        )
    }
}

impl Gpu {
    /// The same device and context with its work on a new non-blocking stream (CUDA graph
    /// capture, [`super::graph`], cannot run on the legacy default stream this `Gpu` uses).
    /// Work on the two streams is not ordered: call [`Gpu::sync`] on the one that queued work
    /// before the other uses its results.
    ///
    /// # Errors
    /// The driver cannot create a stream.
    pub fn on_new_stream(&self) -> Result<Gpu, GpuError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| cuda_err("creating a stream", e))?;
        Ok(Gpu {
            ctx: self.ctx.clone(),
            stream,
            cc: self.cc,
            sm_count: self.sm_count,
            l2_bytes: self.l2_bytes,
            max_smem_optin: self.max_smem_optin,
            name: self.name.clone(),
            include_dir: self.include_dir.clone(),
        })
    }
}
