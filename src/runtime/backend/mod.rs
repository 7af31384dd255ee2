//! The backend interface: what the runtime core asks of a device. The core (scheduler, block
//! tables, sampling, speculation, server) is device-independent; a backend owns the weights
//! and the KV cache memory and runs one forward pass over a batch of sequence segments.
//!
//! The contract is deliberately small, so that a CUDA backend fits it next to [`cpu`]:
//! 1. [`Backend::kv_bytes_per_block`] tells the core what one KV block costs, and the core
//!    sizes the cache from its memory budget;
//! 2. [`Backend::init_kv_cache`] allocates that many blocks;
//! 3. [`Backend::forward`] runs the decoder over [`ForwardBatch`] (token ids, positions, block
//!    tables), writes every token's K/V into its slot, and returns the logits asked for.
//!
//! The runtime core never imports cudarc.

pub mod cpu;

use super::config::{KvCacheDtype, ModelConfig, WeightFormat};

/// The KV cache a backend must allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Physical blocks.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// Element type.
    pub dtype: KvCacheDtype,
}

/// One sequence's part of a batch: `len` consecutive tokens starting at flat index `start` of
/// [`ForwardBatch::token_ids`], at positions `first_pos .. first_pos + len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSegment {
    /// Index of the first token in the flat batch.
    pub start: usize,
    /// Tokens of this sequence in the batch.
    pub len: usize,
    /// Position of the first of them (tokens before it are already in the KV cache).
    pub first_pos: usize,
    /// Physical block of each logical block; must cover positions `0 .. first_pos + len`.
    pub block_table: Vec<u32>,
    /// Logits wanted for the last `num_logits` tokens of the segment (0 for a prefill chunk that
    /// does not reach the end of the prompt; 1 + drafts when verifying drafts).
    pub num_logits: usize,
}

/// A batch of segments (prefill chunks, decode tokens and draft tokens alike).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// All tokens, segment after segment.
    pub token_ids: Vec<u32>,
    /// The segments.
    pub seqs: Vec<SeqSegment>,
}

impl ForwardBatch {
    /// Logit rows the batch produces.
    pub fn num_logits(&self) -> usize {
        self.seqs.iter().map(|s| s.num_logits).sum()
    }
}

/// Logits, `[rows, vocab]` row-major, rows in segment order (each segment's last `num_logits`
/// tokens in position order).
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    /// Vocabulary size (row length).
    pub vocab: usize,
    /// The values.
    pub data: Vec<f32>,
}

impl Logits {
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.vocab).unwrap_or(0)
    }
}

/// A device that runs the decoder.
pub trait Backend: Send {
    /// Short name for logs and `/version` (`"cpu"`, `"cuda"`).
    fn name(&self) -> &str;
    /// The model's shape.
    fn config(&self) -> &ModelConfig;
    /// Format of the decoder's linear layers.
    fn weight_format(&self) -> WeightFormat;
    /// Bytes the weights take on the device.
    fn weight_bytes(&self) -> u64;
    /// Bytes one KV block takes for `block_size` and `dtype` (K and V, all layers).
    fn kv_bytes_per_block(&self, block_size: usize, dtype: KvCacheDtype) -> u64 {
        super::kv_cache::kv_bytes_per_block(self.config(), block_size, dtype)
    }
    /// Allocate the KV cache (replacing any previous one).
    ///
    /// # Errors
    /// When the memory cannot be allocated.
    fn init_kv_cache(&mut self, spec: KvCacheSpec) -> anyhow::Result<()>;
    /// Run the decoder over `batch`: write K/V of every token into its slot, return logits.
    ///
    /// # Errors
    /// On an inconsistent batch (tokens out of the vocabulary, block tables that do not cover
    /// the positions, no KV cache) or a device failure.
    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits>;
}
