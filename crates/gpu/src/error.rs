//! The one error type of the GPU layer, with the library that failed as its variant (the CUDA
//! driver, NVRTC, cuBLASLt, NCCL) and the library's own code where it gives one, so a caller can
//! tell an out-of-memory from a compile error without reading a sentence. rigbench turns it into
//! its own `RigError` (`From`), with the same messages as before the variants were split.

/// What a GPU call can fail with. Every variant but [`GpuError::NoGpu`] displays as
/// `CUDA error in {context}: {message}`.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The GPU stack is absent or too old for what was asked (the reason says which library,
    /// driver or capability, and the fix).
    #[error("GPU unavailable: {0}")]
    NoGpu(String),
    /// A CUDA driver call failed.
    #[error("CUDA error in {context}: {message}")]
    Driver {
        /// What was being done.
        context: String,
        /// The driver's `CUresult` name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        code: String,
        /// The driver's message (cudarc's rendering of the error).
        message: String,
    },
    /// NVRTC could not build a source.
    #[error("CUDA error in {context}: {message}")]
    Nvrtc {
        /// What was being built (`NVRTC compile of kernels/NAME.cu`).
        context: String,
        /// NVRTC's result and log.
        message: String,
    },
    /// A cuBLASLt call failed.
    #[error("CUDA error in {context}: {message}")]
    CublasLt {
        /// What was being done (`cuBLASLt matmul`, …).
        context: String,
        /// The `cublasStatus_t` name, e.g. `CUBLAS_STATUS_NOT_SUPPORTED`.
        status: String,
        /// cuBLASLt's error as cudarc renders it.
        message: String,
    },
    /// An NCCL call failed.
    #[error("CUDA error in {context}: {message}")]
    Nccl {
        /// What was being done (`NCCL …`).
        context: String,
        /// The `ncclResult_t` value.
        code: i64,
        /// NCCL's message.
        message: String,
    },
    /// A request this crate refused before calling CUDA: a range past a buffer's end, an
    /// argument or extent that does not fit the kernel's parameter, a kernel name not in its
    /// module or launcher family.
    #[error("CUDA error in {context}: {message}")]
    Usage {
        /// What was being done.
        context: String,
        /// What was wrong with the request.
        message: String,
    },
}

impl GpuError {
    /// What was being done when the call failed (`None` for [`GpuError::NoGpu`]).
    pub fn context(&self) -> Option<&str> {
        match self {
            GpuError::NoGpu(_) => None,
            GpuError::Driver { context, .. }
            | GpuError::Nvrtc { context, .. }
            | GpuError::CublasLt { context, .. }
            | GpuError::Nccl { context, .. }
            | GpuError::Usage { context, .. } => Some(context),
        }
    }

    /// The message after the context (the reason, for [`GpuError::NoGpu`]).
    pub fn message(&self) -> &str {
        match self {
            GpuError::NoGpu(why) => why,
            GpuError::Driver { message, .. }
            | GpuError::Nvrtc { message, .. }
            | GpuError::CublasLt { message, .. }
            | GpuError::Nccl { message, .. }
            | GpuError::Usage { message, .. } => message,
        }
    }

    /// Whether the device ran out of memory (the driver's `CUDA_ERROR_OUT_OF_MEMORY`, or
    /// cuBLASLt's `CUBLAS_STATUS_ALLOC_FAILED`).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            GpuError::Driver { code, .. } => code == "CUDA_ERROR_OUT_OF_MEMORY",
            GpuError::CublasLt { status, .. } => status == "CUBLAS_STATUS_ALLOC_FAILED",
            _ => false,
        }
    }
}

/// A failure of some library call, turned into the [`GpuError`] variant of its library with
/// `context` (what was being done).
pub(crate) trait Cause {
    /// The error, with `context`.
    fn at(self, context: &str) -> GpuError;
}

impl Cause for cudarc::driver::DriverError {
    fn at(self, context: &str) -> GpuError {
        GpuError::Driver {
            context: context.to_string(),
            code: format!("{:?}", self.0),
            message: format!("{self:?}"),
        }
    }
}

impl Cause for cudarc::driver::sys::CUresult {
    fn at(self, context: &str) -> GpuError {
        GpuError::Driver {
            context: context.to_string(),
            code: format!("{self:?}"),
            message: format!("{self:?}"),
        }
    }
}

impl Cause for cudarc::nvrtc::CompileError {
    fn at(self, context: &str) -> GpuError {
        GpuError::Nvrtc {
            context: context.to_string(),
            message: format!("{self:?}"),
        }
    }
}

impl Cause for cudarc::cublaslt::result::CublasError {
    fn at(self, context: &str) -> GpuError {
        GpuError::CublasLt {
            context: context.to_string(),
            status: format!("{:?}", self.0),
            message: format!("{self:?}"),
        }
    }
}

impl Cause for &str {
    fn at(self, context: &str) -> GpuError {
        GpuError::Usage {
            context: context.to_string(),
            message: format!("{self:?}"),
        }
    }
}

impl Cause for String {
    fn at(self, context: &str) -> GpuError {
        GpuError::Usage {
            context: context.to_string(),
            message: format!("{self:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;

    #[test]
    fn each_library_is_its_own_variant_with_the_old_message() {
        // A raw CUresult (a `DriverError`'s Debug text asks the driver for its string, which
        // needs libcuda; this test runs without it).
        let e = CUresult::CUDA_ERROR_OUT_OF_MEMORY.at("allocating 8 bytes");
        assert!(matches!(&e, GpuError::Driver { code, .. } if code == "CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(e.is_out_of_memory());
        assert_eq!(e.context(), Some("allocating 8 bytes"));
        assert_eq!(
            e.to_string(),
            "CUDA error in allocating 8 bytes: CUDA_ERROR_OUT_OF_MEMORY"
        );

        let status = cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED;
        let e = cudarc::cublaslt::result::CublasError(status).at("cuBLASLt matmul");
        assert!(
            matches!(&e, GpuError::CublasLt { status, .. } if status == "CUBLAS_STATUS_NOT_SUPPORTED")
        );
        assert!(!e.is_out_of_memory());
        assert_eq!(
            e.to_string(),
            "CUDA error in cuBLASLt matmul: CublasError(CUBLAS_STATUS_NOT_SUPPORTED)"
        );

        // A refused request keeps the quoted text it always had.
        let e = "range past the end of the buffer".at("download");
        assert!(matches!(e, GpuError::Usage { .. }));
        assert_eq!(
            e.to_string(),
            "CUDA error in download: \"range past the end of the buffer\""
        );
        assert_eq!(GpuError::NoGpu("x".into()).context(), None);
        assert_eq!(GpuError::NoGpu("x".into()).message(), "x");
    }
}
