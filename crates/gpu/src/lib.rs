//! rigbench's GPU foundation, a crate of its own: the only code that imports cudarc, and it
//! imports nothing of rigbench (the compiler enforces both: rigbench depends on this crate, never
//! the reverse; docs/architecture.md, "The tiers"). Library probing (never a panic without
//! CUDA), context and stream, NVRTC builds of `kernels/*.cu` with the compiled-kernel cache,
//! typed kernel launches, event timing, the L2 flush, cuBLASLt, several GPUs in one process
//! ([`multi`]: peer access and copies) and NCCL ([`nccl`], loaded at run time). rigbench
//! re-exports it as `rigbench::gpu`.
//!
//! Rule: call [`libraries`] (which asks cudarc's `is_culib_present()` for each library) before
//! any other cudarc call: cudarc's dynamic loading panics when a library is missing.

#![warn(missing_docs)]

mod error;
pub use error::GpuError;

pub mod probe;

pub use probe::{libraries, LibraryStatus, MIN_DRIVER_CUDA};
pub mod compute_capability;
pub mod context;
pub mod cublaslt;
pub mod graph;
pub mod kernel_cache;
pub mod launch;
pub mod multi;
pub mod nccl;
pub mod prelude;
pub mod util_kernels;

pub use compute_capability::ComputeCapability;
pub use context::{DevBuf, FlushMethod, FuncAttrs, Gpu, Graph, KArg, L2Flusher, Module, Timer};
pub use launch::{dim, Bf16, DevPtr, I32x4, U32x4, Void};
