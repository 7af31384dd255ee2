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
pub mod cuda;

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
    /// The recurrent-state slot of the sequence (Gated-DeltaNet hybrids; ignored by dense
    /// decoders): every running sequence owns one of the slots allocated by
    /// [`Backend::init_state_slots`]. A segment at `first_pos` 0 starts the slot afresh; a
    /// later one continues it from where the slot's previous segment ended, or from a shorter
    /// position inside the previous segment when that one verified drafts (rollback of rejected
    /// drafts; see [`Backend::supports_state_rollback`]).
    pub state_slot: u32,
}

/// One sequence's recurrent state as a backend saved it ([`Backend::snapshot_state`]): the
/// position it has reached and the state's bytes, in the backend's own layout.
pub struct StateSnapshot {
    /// Tokens the state has absorbed: the next segment continues at this position. A caller may
    /// change it to place the state elsewhere (the decode profile does, where only the work of
    /// a step matters, not its values: docs/runtime.md, "State snapshots").
    pub position: usize,
    /// Bytes of the saved state.
    pub bytes: u64,
    /// The backend's copy (host vectors for the CPU, device buffers for CUDA).
    pub data: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for StateSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateSnapshot")
            .field("position", &self.position)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
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

/// Where the built-in runtime runs (`rigbench serve --device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host CPU (the reference backend; on a GPU rig, a harness self-test).
    Cpu,
    /// CUDA device `N` (ordinal as the driver numbers them).
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if t == "cpu" {
            return Ok(Device::Cpu);
        }
        if t == "cuda" {
            return Ok(Device::Cuda(0));
        }
        if let Some(n) = t.strip_prefix("cuda:") {
            return n.parse::<usize>().map(Device::Cuda).map_err(|_| {
                format!("'{s}': the device ordinal after 'cuda:' must be a number (e.g. cuda:0)")
            });
        }
        Err(format!("'{s}' is not a device; use cpu, cuda or cuda:N"))
    }
}

/// Device memory of a GPU backend once its weights, activation buffers and workspace are
/// resident, before the KV cache is allocated (bytes, from `cuMemGetInfo` and the backend's own
/// allocations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Total device memory.
    pub total: u64,
    /// Free memory when the backend started loading (other processes' use already excluded).
    pub free_before_load: u64,
    /// Free memory now (after weights, activations and workspace).
    pub free_after_load: u64,
    /// Bytes of the resident weights.
    pub weights: u64,
    /// Bytes of the activation buffers (sized for `max_num_batched_tokens`).
    pub activations: u64,
    /// Bytes of library workspaces (cuBLASLt) and CUDA graphs' private memory.
    pub workspace: u64,
}

/// Per-row sampling settings for [`Backend::forward_sampled`] (vLLM's semantics, as
/// [`crate::runtime::sampler::SamplingParams`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// Temperature (< 1e-5 is greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: i32,
    /// Seed of the request.
    pub seed: u64,
    /// Index of this draw in the request (so a seed gives a reproducible sequence).
    pub draw: u64,
}

/// A device that runs the decoder.
pub trait Backend: Send {
    /// Short name for logs and `/version` (`"cpu"`, `"cuda"`).
    fn name(&self) -> &str;
    /// The device it runs on, for conditions (`cpu`, `cuda:0 (NVIDIA H200, sm_90)`).
    fn device_label(&self) -> String {
        self.name().to_string()
    }
    /// Device memory facts (GPU backends only).
    fn device_memory(&self) -> Option<DeviceMemory> {
        None
    }
    /// The SHA-256 of every kernel source the backend built its kernels from, by path
    /// (`kernels/runtime.cu`, …; GPU backends only): what its figures timed.
    fn kernel_sources(&self) -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::new()
    }
    /// The backend's notes from its load: choices made by measurement (the tuner's), fallbacks
    /// taken, how its kernels were built (GPU backends only).
    fn load_notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Mixtures of experts: the routed experts each sparse layer's last forward pass touched
    /// (the union over its tokens), in layer order; `None` where the backend does not record
    /// them (the CPU backend, dense models). Synchronizes a GPU backend.
    fn moe_touched_experts(&self) -> Option<Vec<usize>> {
        None
    }
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
    /// Bytes of one sequence's recurrent state (the Gated-DeltaNet layers' convolution and
    /// delta-rule states of a hybrid, as this backend stores them; 0 for dense decoders).
    fn state_bytes_per_slot(&self) -> u64 {
        self.config()
            .gdn_state_bytes(super::hybrid::CONV_STATE_ELEM_BYTES)
    }
    /// Allocate `n` recurrent-state slots (replacing any previous ones), one per sequence that
    /// may run at once ([`SeqSegment::state_slot`]); a no-op for dense decoders.
    ///
    /// # Errors
    /// When the memory cannot be allocated, or the backend runs no hybrid (while the model is
    /// one).
    fn init_state_slots(&mut self, n: usize) -> anyhow::Result<()> {
        let _ = n;
        anyhow::ensure!(
            !self.config().is_hybrid(),
            "the {} backend does not run Gated-DeltaNet hybrids",
            self.name()
        );
        Ok(())
    }
    /// Whether a sequence's recurrent state can go back to a position inside its previous
    /// segment (needed by speculative decoding to drop rejected drafts). Dense decoders have no
    /// such state, so `true` for them.
    fn supports_state_rollback(&self) -> bool {
        !self.config().is_hybrid()
    }
    /// Save state slot `slot`'s recurrent state (every Gated-DeltaNet layer's convolution and
    /// delta-rule state) and the position it has reached, so that [`Backend::restore_state`]
    /// can continue the sequence from there (docs/runtime.md, "State snapshots").
    ///
    /// # Errors
    /// A slot out of range, a backend that keeps no snapshots, or a device failure.
    fn snapshot_state(&mut self, slot: u32) -> anyhow::Result<StateSnapshot> {
        let _ = slot;
        anyhow::bail!(
            "the {} backend keeps no recurrent-state snapshots",
            self.name()
        )
    }
    /// Put `snap` back into slot `slot`: the next segment of that slot starts at
    /// `snap.position` (or at 0, which resets it). The KV cache is not touched: positions
    /// from `snap.position` on are written again by the segments that follow.
    ///
    /// # Errors
    /// A slot out of range, a snapshot of another backend or model, or a device failure.
    fn restore_state(&mut self, slot: u32, snap: &StateSnapshot) -> anyhow::Result<()> {
        let _ = (slot, snap);
        anyhow::bail!(
            "the {} backend keeps no recurrent-state snapshots",
            self.name()
        )
    }
    /// Run the decoder over `batch`: write K/V of every token into its slot, return logits.
    ///
    /// # Errors
    /// On an inconsistent batch (tokens out of the vocabulary, block tables that do not cover
    /// the positions, no KV cache) or a device failure.
    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits>;
    /// Whether [`Backend::forward_sampled`] samples on the device (so only token ids, not
    /// logits, cross to the host).
    fn samples_on_device(&self) -> bool {
        false
    }
    /// Run the decoder over `batch` and sample one token per logit row on the device, with the
    /// settings of that row (`rows.len()` = the batch's logit rows, in order).
    ///
    /// # Errors
    /// As [`Backend::forward`]; backends that do not sample on the device refuse.
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> anyhow::Result<Vec<u32>> {
        let _ = (batch, rows);
        anyhow::bail!("the {} backend does not sample on the device", self.name())
    }
}
