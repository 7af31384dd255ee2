//! Typed errors at the crate's boundaries and the process exit codes.
//!
//! Inside modules, `anyhow` with `.context(...)` carries the chain; at a boundary where a caller
//! must branch on the kind (bad user input vs. a missing GPU vs. a measured regression), a
//! [`RigError`] is returned. `main` prints the whole chain and maps it to an [`ExitStatus`].

use std::path::PathBuf;

/// Process exit codes, documented in the README. Usage errors use 64 (`EX_USAGE` of sysexits.h)
/// so that they never collide with `compare`'s regression code 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: success (no regression, no lint error).
    Ok,
    /// 1: an error (I/O, bad input file, engine failure).
    Error,
    /// 2: `compare` found a regression.
    Regression,
    /// 3: `compare` found no usable baseline (missing, incompatible schema or rig).
    BaselineUnusable,
    /// 4: `inspect` found lint errors in the checkpoint.
    LintErrors,
    /// 5: asked to time kernel cases and timed none (`kernels`; `report` with a GPU present).
    NothingTimed,
    /// 64: a bad command line (unknown flag, bad value).
    Usage,
}

impl ExitStatus {
    /// The numeric code.
    pub const fn code(self) -> u8 {
        match self {
            ExitStatus::Ok => 0,
            ExitStatus::Error => 1,
            ExitStatus::Regression => 2,
            ExitStatus::BaselineUnusable => 3,
            ExitStatus::LintErrors => 4,
            ExitStatus::NothingTimed => 5,
            ExitStatus::Usage => 64,
        }
    }
}

/// The exit code after a second SIGINT (128 + 2, the shell's convention): the run stops at once
/// (`crate::signals`).
pub const EXIT_SECOND_SIGINT: u8 = 130;
/// The exit code after a second SIGTERM (128 + 15).
pub const EXIT_SECOND_SIGTERM: u8 = 143;

impl From<ExitStatus> for std::process::ExitCode {
    fn from(s: ExitStatus) -> Self {
        std::process::ExitCode::from(s.code())
    }
}

/// Errors a caller may need to tell apart.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    /// A command-line value that is well-formed for clap but wrong for rigbench.
    #[error("invalid value for {flag}: {message}")]
    BadFlag {
        /// The flag, e.g. `--formats`.
        flag: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// An input file that is missing, unreadable or malformed.
    #[error("{}: {message}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The GPU stack is absent or too old for what was asked.
    #[error("GPU unavailable: {0}")]
    NoGpu(String),
    /// A CUDA driver/library call failed.
    #[error("CUDA error in {context}: {message}")]
    Cuda {
        /// What was being done.
        context: String,
        /// The driver's message.
        message: String,
    },
}

impl From<crate::gpu::GpuError> for RigError {
    /// The GPU foundation's error as rigbench's: [`RigError::NoGpu`] for a missing stack, and
    /// [`RigError::Cuda`] for a failed call of any library (driver, NVRTC, cuBLASLt, NCCL) or a
    /// refused request, with the same message (the typed cause stays in `GpuError` for the
    /// code that handles it; a command only reports it).
    fn from(e: crate::gpu::GpuError) -> Self {
        match e {
            crate::gpu::GpuError::NoGpu(why) => RigError::NoGpu(why),
            other => RigError::Cuda {
                context: other.context().unwrap_or_default().to_string(),
                message: other.message().to_string(),
            },
        }
    }
}

impl RigError {
    /// Shorthand for [`RigError::BadFlag`].
    pub fn flag(flag: impl Into<String>, message: impl Into<String>) -> Self {
        RigError::BadFlag {
            flag: flag.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`RigError::BadFile`].
    pub fn file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        RigError::BadFile {
            path: path.into(),
            message: message.into(),
        }
    }
}
