//! The one error type of the GPU layer; rigbench turns it into its own `RigError` with the same
//! variants and messages.

/// What a GPU call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The GPU stack is absent or too old for what was asked (the reason says which library,
    /// driver or capability, and the fix).
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
