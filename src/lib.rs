//! rigbench: a benchmark and validation harness for quantized LLM inference on NVIDIA GPUs.
//!
//! It answers, for one card ("rig") and one checkpoint: what the card executes for BF16, FP8 W8A8,
//! W4A16 NVFP4 and W4A4 NVFP4, how fast, next to the card's limits; whether a checkpoint is
//! quantized safely and how much KV cache it leaves; what an engine reaches end to end under
//! stated conditions; and whether anything regressed against a committed baseline.
//!
//! Layout: see docs/architecture.md (the tiers, and where a new line belongs). Only [`gpu`]
//! (its own crate) touches CUDA; every command runs without a GPU and says what it skipped and why.

#![warn(missing_docs)]

/// `eprintln!` that never panics: every diagnostic line of rigbench goes through this one
/// (declared before the modules, so it shadows the standard macro in all of them). The
/// standard `eprintln!` panics when standard error cannot be written (a dropped ssh session
/// leaves it a hung-up terminal, `2>&-` or a closed pipe): the panic used to end `e2e`, `serve`,
/// `compare` and `report --render` with status 101, and to kill the signal thread on the
/// SIGHUP that follows, so later signals were ignored and nothing was saved
/// (docs/reliability.md). A line that cannot be written is dropped; the work and the exit
/// status go on as they would have.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics (see `eprintln!` above).
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

pub mod board;
pub mod checkpoint;
pub mod cli;
pub mod compare;
pub mod diagnose;
pub mod e2e;
pub mod error;
pub mod formats;
pub mod fuzz_harness;
pub mod gemm;
/// The GPU foundation (the `rigbench-gpu` crate of this workspace, `crates/gpu`).
pub use rigbench_gpu as gpu;
pub use rigbench_gpu::kernel_launchers;
pub mod kernels;
pub mod model;
pub mod multigpu;
pub mod output;
pub mod quality;
pub mod report;
pub mod rig;
pub mod runtime;
pub mod runtime_eval;
pub mod signals;
pub mod stats;

pub use error::{ExitStatus, RigError};

/// Test-only: the path of the real-world fixture `rel` (e.g. `"logs"`,
/// `"models/tiny-qwen3-transformers5"`) inside the checkout's `tests/fixtures/real/`, a byte copy
/// of the project's shared fixture channel with its provenance
/// (`tests/fixtures/real/PROVENANCE.md`, `SHA256SUMS`). Panics, naming the path,
/// when it is absent: the fixtures are part of the repository, so a missing one is a broken
/// checkout, never a reason to skip.
#[cfg(test)]
pub(crate) fn real_fixture(rel: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real")
        .join(rel);
    assert!(
        p.exists(),
        "fixture {} is missing: it is committed in the repository (tests/fixtures/real/, \
         checked by tests/it/fixtures_provenance.rs); restore it with `git checkout -- tests/fixtures/real`",
        p.display()
    );
    p
}
