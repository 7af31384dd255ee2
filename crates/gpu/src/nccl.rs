//! NCCL, loaded at run time: the library, its environment, and a group of communicators over
//! several GPUs that runs BF16 sum all-reduces ([`AllReduceGroup`]), with which
//! rigbench's `multigpu::allreduce` measures.
//!
//! Loading: `$RIGBENCH_NCCL_LIB` when set, else `libnccl.so.2` (the name the `libnccl2` package
//! and PyTorch's `nvidia-nccl` wheel install), else `libnccl.so`. cudarc 0.19's `nccl` feature
//! is not used: its loader looks for `libnccl.so` and `libnccl.so.<CUDA major>` but not
//! `libnccl.so.2`, and panics when a symbol is missing. Here every failure is an error that says
//! what was tried ([`probe`]); rigbench binds the seven functions it calls.
//!
//! Environment: NVLink multicast (NVLS) is switched off on the machines rigbench is run on, so
//! `NCCL_NVLS_ENABLE=0` is set in this process before NCCL is loaded ([`NCCL_ENV`]), and in the
//! environment of every child rigbench starts ([`apply_child_env`]).
//!
//! As in nccl-tests (`-g N`), one process and thread drive all GPUs, and each all-reduce is one
//! `ncclGroupStart`/`ncclAllReduce` per rank/`ncclGroupEnd`.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use super::multi::{device_count, Dev, RawBuf};
use crate::GpuError;

/// The NCCL environment rigbench keeps in every environment it sets up.
pub const NCCL_ENV: &[(&str, &str)] = &[("NCCL_NVLS_ENABLE", "0")];

/// Add [`NCCL_ENV`] to a child process's environment.
pub fn apply_child_env(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for (k, v) in NCCL_ENV {
        cmd.env(k, v);
    }
    cmd
}

/// Set [`NCCL_ENV`] in this process (before NCCL reads it at communicator creation). Returns a
/// note for every value that was different before.
pub fn set_process_env() -> Vec<String> {
    let mut notes = Vec::new();
    for (k, v) in NCCL_ENV {
        match std::env::var(k) {
            Ok(old) if old == *v => {}
            Ok(old) => {
                notes.push(format!("{k} was {old}; rigbench set it to {v}"));
                std::env::set_var(k, v);
            }
            Err(_) => std::env::set_var(k, v),
        }
    }
    notes
}

/// The `NCCL_*` variables in effect in this process, as `NAME=value`, sorted.
pub fn env_in_effect() -> Vec<String> {
    let mut v: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NCCL_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    v.sort();
    v
}

type Comm = *mut c_void;
type CuStream = cudarc::driver::sys::CUstream;

/// `ncclBfloat16` in `ncclDataType_t` (NCCL ≥ 2.10).
const NCCL_BFLOAT16: c_int = 9;
/// `ncclSum` in `ncclRedOp_t`.
const NCCL_SUM: c_int = 0;

struct Api {
    _lib: libloading::Library,
    library: String,
    version: c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        CuStream,
    ) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
}

// SAFETY: the library handle and plain C function pointers may be used from any thread; NCCL's
// own thread-safety rules are kept by the callers (one thread drives a set of communicators).
unsafe impl Send for Api {}
// SAFETY: as above; nothing in Api is mutated after loading.
unsafe impl Sync for Api {}

/// The library names tried, in order.
pub fn candidates() -> Vec<String> {
    let mut v = Vec::new();
    if let Ok(p) = std::env::var("RIGBENCH_NCCL_LIB") {
        if !p.is_empty() {
            v.push(p);
        }
    }
    v.push("libnccl.so.2".into());
    v.push("libnccl.so".into());
    v
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in candidates() {
        // SAFETY: loading NCCL runs its initialisers, which only register with the CUDA runtime.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return bind(lib, name),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "NCCL not found (tried {}); install libnccl2 (NCCL ≥ 2.10) or set RIGBENCH_NCCL_LIB to the library file",
        tried.join("; ")
    ))
}

fn bind(lib: libloading::Library, library: String) -> Result<Api, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the types match nccl.h for NCCL ≥ 2.10.
            *unsafe { lib.get($name) }.map_err(|e| format!("{library} lacks {}: {e}", $name))?
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = sym!("ncclGetVersion");
    let get_error_string = sym!("ncclGetErrorString");
    let comm_init_all = sym!("ncclCommInitAll");
    let comm_destroy = sym!("ncclCommDestroy");
    let all_reduce = sym!("ncclAllReduce");
    let group_start = sym!("ncclGroupStart");
    let group_end = sym!("ncclGroupEnd");
    let mut version: c_int = 0;
    // SAFETY: writes one int.
    let r = unsafe { get_version(&mut version) };
    if r != 0 {
        return Err(format!("ncclGetVersion failed ({r})"));
    }
    let api = Api {
        get_error_string,
        comm_init_all,
        comm_destroy,
        all_reduce,
        group_start,
        group_end,
        version,
        library,
        _lib: lib,
    };
    if api.version < 21000 {
        return Err(format!(
            "{} is NCCL {}; rigbench needs NCCL ≥ 2.10 (BF16 all-reduce)",
            api.library,
            version_string(api.version)
        ));
    }
    Ok(api)
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        set_process_env();
        load()
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `NCCL_VERSION_CODE` as text: `22809` → `2.28.9` (codes before 2.9 were `major·1000 +
/// minor·100 + patch`).
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// NCCL's version and the library loaded, or why it cannot be used. Loads NCCL on first call
/// (after setting [`NCCL_ENV`]); never panics.
pub fn probe() -> Result<(String, String), String> {
    let a = api()?;
    Ok((version_string(a.version), a.library.clone()))
}

fn check(a: &Api, what: &str, r: c_int) -> Result<(), GpuError> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for every result code.
    let msg = unsafe {
        let p = (a.get_error_string)(r);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(GpuError::Nccl {
        context: format!("NCCL {what}"),
        code: r as i64,
        message: format!("error {r}: {msg}"),
    })
}

struct Comms<'a> {
    api: &'a Api,
    comms: Vec<Comm>,
}

impl Drop for Comms<'_> {
    fn drop(&mut self) {
        for c in &self.comms {
            if !c.is_null() {
                // SAFETY: created by ncclCommInitAll and destroyed once.
                let _ = unsafe { (self.api.comm_destroy)(*c) };
            }
        }
    }
}

/// One all-reduce of `count` BF16 elements on every rank (a group of one call per rank).
fn all_reduce_once(
    a: &Api,
    comms: &Comms,
    devs: &[Dev],
    bufs: &[(RawBuf, RawBuf)],
    count: usize,
) -> Result<(), GpuError> {
    // SAFETY: group calls are balanced; buffers hold ≥ count BF16 elements and outlive the work.
    unsafe {
        check(a, "ncclGroupStart", (a.group_start)())?;
        let mut first_err = Ok(());
        for (r, d) in devs.iter().enumerate() {
            let rc = (a.all_reduce)(
                bufs[r].0.ptr as *const c_void,
                bufs[r].1.ptr as *mut c_void,
                count,
                NCCL_BFLOAT16,
                NCCL_SUM,
                comms.comms[r],
                d.cu_stream(),
            );
            if first_err.is_ok() {
                first_err = check(a, "ncclAllReduce", rc);
            }
        }
        check(a, "ncclGroupEnd", (a.group_end)())?;
        first_err
    }
}

fn sync_all(devs: &[Dev]) -> Result<(), GpuError> {
    for d in devs {
        d.sync()?;
    }
    Ok(())
}

/// One communicator over several GPUs (one rank per GPU) with a send and a receive buffer of
/// `max_bytes` on each, for BF16 sum all-reduces. Dropped in order: buffers, communicators,
/// devices.
pub struct AllReduceGroup {
    bufs: Vec<(RawBuf, RawBuf)>,
    comms: Comms<'static>,
    devs: Vec<Dev>,
    api: &'static Api,
}

impl AllReduceGroup {
    /// Load NCCL, open `devices` (two or more, each below the driver's count), create their
    /// communicator (`ncclCommInitAll`) and allocate the buffers.
    ///
    /// # Errors
    /// NCCL missing ([`GpuError::NoGpu`] with [`probe`]'s reason), no GPU, fewer than two
    /// devices, an unknown device, or an NCCL or CUDA failure.
    pub fn open(devices: &[usize], max_bytes: usize) -> Result<Self, GpuError> {
        let a = api().map_err(GpuError::NoGpu)?;
        let n = device_count()?;
        if devices.len() < 2 {
            return Err(GpuError::NoGpu("all-reduce needs two or more GPUs".into()));
        }
        if let Some(d) = devices.iter().find(|d| **d >= n) {
            return Err(GpuError::NoGpu(format!(
                "no CUDA device {d} (the driver reports {n})"
            )));
        }
        let devs: Vec<Dev> = devices
            .iter()
            .map(|&i| Dev::open(i))
            .collect::<Result<_, _>>()?;
        let ranks = devs.len();
        let list: Vec<c_int> = devices.iter().map(|&d| d as c_int).collect();
        let mut comms = Comms {
            api: a,
            comms: vec![std::ptr::null_mut(); ranks],
        };
        // SAFETY: `comms` has room for `ranks` handles; `list` names valid devices.
        check(a, "ncclCommInitAll", unsafe {
            (a.comm_init_all)(comms.comms.as_mut_ptr(), ranks as c_int, list.as_ptr())
        })?;
        let bufs: Vec<(RawBuf, RawBuf)> = devs
            .iter()
            .map(|d| Ok((RawBuf::new(d, max_bytes, 0)?, RawBuf::new(d, max_bytes, 0)?)))
            .collect::<Result<_, GpuError>>()?;
        Ok(Self {
            bufs,
            comms,
            devs,
            api: a,
        })
    }

    /// Ranks (GPUs) in the group.
    pub fn ranks(&self) -> usize {
        self.devs.len()
    }

    /// Queue one all-reduce of `count` BF16 elements on every rank (`count · 2` ≤ the buffers'
    /// bytes).
    ///
    /// # Errors
    /// An NCCL failure.
    pub fn all_reduce(&self, count: usize) -> Result<(), GpuError> {
        all_reduce_once(self.api, &self.comms, &self.devs, &self.bufs, count)
    }

    /// Wait for every rank's stream.
    ///
    /// # Errors
    /// A CUDA failure.
    pub fn sync(&self) -> Result<(), GpuError> {
        sync_all(&self.devs)
    }

    /// The check before timing: rank r sends `count` BF16 elements of value r + 1, one all-reduce
    /// runs, and every output element of every rank is compared with n(n+1)/2. Returns how many
    /// were not equal to it, and the value.
    ///
    /// # Errors
    /// A CUDA or NCCL failure.
    pub fn check_sum(&self, count: usize) -> Result<(usize, f32), GpuError> {
        let (devs, bufs) = (&self.devs, &self.bufs);
        for (r, d) in devs.iter().enumerate() {
            let v = vec![half::bf16::from_f32((r + 1) as f32).to_bits(); count];
            d.bind()?;
            // SAFETY: the buffer holds ≥ 2 · count bytes.
            unsafe { cudarc::driver::result::memcpy_htod_sync(bufs[r].0.ptr, &v) }
                .map_err(|e| crate::error::Cause::at(e, "upload"))?;
            // The DMA of a pageable upload may still run after the call returns.
            d.ctx_sync()?;
        }
        self.all_reduce(count)?;
        self.sync()?;
        let ranks = devs.len();
        let want = (ranks * (ranks + 1) / 2) as f32;
        let mut wrong = 0usize;
        for (r, d) in devs.iter().enumerate() {
            let mut out = vec![0u16; count];
            d.bind()?;
            // SAFETY: reads 2 · count bytes of a live buffer.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, bufs[r].1.ptr) }
                .map_err(|e| crate::error::Cause::at(e, "download"))?;
            wrong += out
                .iter()
                .filter(|b| half::bf16::from_bits(**b).to_f32() != want)
                .count();
        }
        Ok((wrong, want))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_both_schemes() {
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(21003), "2.10.3");
        assert_eq!(version_string(2708), "2.7.8");
    }

    #[test]
    fn children_get_nvls_off() {
        let mut c = std::process::Command::new("true");
        apply_child_env(&mut c);
        let envs: Vec<_> = c.get_envs().collect();
        assert!(envs
            .iter()
            .any(|(k, v)| *k == "NCCL_NVLS_ENABLE" && *v == Some(std::ffi::OsStr::new("0"))));
    }

    #[test]
    fn missing_nccl_is_a_reason_not_a_panic() {
        // With RIGBENCH_NCCL_LIB naming a real library, loading and binding must succeed (no GPU
        // is needed for that); e.g. libnccl.so.2 from the nvidia-nccl-cu13 wheel.
        if let Ok(p) = std::env::var("RIGBENCH_NCCL_LIB") {
            if std::path::Path::new(&p).is_file() {
                let (v, lib) = probe().expect("the library named by RIGBENCH_NCCL_LIB loads");
                assert_eq!(lib, p);
                eprintln!("NCCL {v} from {lib}");
            }
        }
        match probe() {
            Ok((v, lib)) => {
                assert!(v.starts_with("2."), "{v}");
                assert!(!lib.is_empty());
            }
            Err(e) => assert!(e.contains("NCCL"), "{e}"),
        }
        // Loading sets NVLS off in this process either way.
        assert_eq!(std::env::var("NCCL_NVLS_ENABLE").as_deref(), Ok("0"));
        let e = AllReduceGroup::open(&[0], 4096)
            .err()
            .expect("one GPU is not a group");
        assert!(!e.to_string().is_empty());
    }
}
