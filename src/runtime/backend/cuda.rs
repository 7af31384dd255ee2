//! The CUDA backend: the decoder on one GPU, with rigbench's own kernels (kernels/runtime.cu)
//! for everything but the linear layers, and the same GEMM code the kernel benches time for the
//! linear layers (cuBLASLt BF16, cuBLASLt FP8 with activation quantization on the GPU, and
//! rigbench's W4A16 NVFP4 kernel).
//!
//! (Work in progress: [`CudaBackend::load`] is being built; until then it returns an error.)

use std::path::PathBuf;

use super::{Backend, DeviceMemory, ForwardBatch, KvCacheSpec, Logits};
use crate::runtime::config::{KvCacheDtype, ModelConfig, WeightFormat};
use crate::runtime::weights::ModelWeights;

/// Where the CUDA backend's weights come from.
#[derive(Debug)]
pub enum WeightSource {
    /// Seeded synthetic weights at a preset's shape, generated on the GPU, bit-identical to
    /// [`crate::runtime::weights::synthesize`] for the same config and seed.
    Synthetic {
        /// The shape (after `--num-layers`).
        config: ModelConfig,
        /// Seed.
        seed: u64,
    },
    /// A local checkpoint directory, memory-mapped and uploaded tensor by tensor.
    Checkpoint {
        /// The directory.
        dir: PathBuf,
        /// Its parsed config.json.
        config: ModelConfig,
    },
    /// Weights already on the host (tests and parity checks: identical weights on both
    /// backends).
    Host(Box<ModelWeights>),
}

/// Everything [`CudaBackend::load`] needs.
#[derive(Debug)]
pub struct CudaLoadSpec {
    /// CUDA device ordinal.
    pub device: usize,
    /// The weights.
    pub weights: WeightSource,
    /// Quantize BF16 weights on the GPU at load (`--quantize`).
    pub quantize: Option<WeightFormat>,
    /// Largest number of tokens in one forward pass (activation buffers are sized for it).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt + output).
    pub max_model_len: usize,
    /// KV cache element type (the per-layer FP8 scales come from the weights).
    pub kv_dtype: KvCacheDtype,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// The CUDA backend.
pub struct CudaBackend {
    config: ModelConfig,
    format: WeightFormat,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.format.id())
    }
}

impl CudaBackend {
    /// Open device `spec.device`, load the weights and allocate activation buffers.
    ///
    /// # Errors
    /// No GPU or CUDA libraries ([`crate::RigError::NoGpu`]), weights that do not fit the free
    /// memory (both sizes named), or a device failure.
    pub fn load(spec: CudaLoadSpec) -> anyhow::Result<Self> {
        let _ = spec;
        anyhow::bail!("the CUDA backend is not built yet")
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn weight_format(&self) -> WeightFormat {
        self.format
    }
    fn weight_bytes(&self) -> u64 {
        0
    }
    fn device_memory(&self) -> Option<DeviceMemory> {
        None
    }
    fn init_kv_cache(&mut self, _spec: KvCacheSpec) -> anyhow::Result<()> {
        anyhow::bail!("the CUDA backend is not built yet")
    }
    fn forward(&mut self, _batch: &ForwardBatch) -> anyhow::Result<Logits> {
        anyhow::bail!("the CUDA backend is not built yet")
    }
}
