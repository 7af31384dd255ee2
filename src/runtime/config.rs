//! Configuration of the server: [`ServeConfig`] (the fields behind `rigbench serve`'s flags),
//! the weight formats and `--quantize` recipes, the KV cache dtype, where the model comes from,
//! and the human-size parser for `--kv-cache-memory`. The model's shape ([`ModelConfig`]) and
//! its `config.json` reader live in `crate::model` (docs/architecture.md), re-exported here.

use std::path::PathBuf;

use crate::RigError;

pub use crate::model::config::{
    parse_json_root, Arch, HfConfig, ModelConfig, RopeScaling, PRESETS, SUPPORTED_ARCHITECTURES,
    SUPPORTED_MODEL_TYPES, SUPPORTED_ROPE_TYPES,
};

/// How linear-layer weights are stored (and dequantized on the fly in the matmul).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// BF16 weights, f32 activations and accumulation.
    Bf16,
    /// FP8 E4M3 weights with an FP32 per-tensor scale (ModelOpt FP8); activations quantized to
    /// E4M3 per token (dynamic) or with the checkpoint's static `input_scale` ("W8A8").
    Fp8,
    /// NVFP4 weights (ModelOpt layout: E2M1, E4M3 scale per 16 along K, FP32 per-tensor scale),
    /// f32 activations ("W4A16").
    Nvfp4,
}

impl WeightFormat {
    /// `bf16`, `fp8`, `nvfp4`.
    pub fn id(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
            Self::Nvfp4 => "nvfp4",
        }
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" => Ok(Self::Bf16),
            "fp8" | "w8a8" => Ok(Self::Fp8),
            "nvfp4" | "w4a16" => Ok(Self::Nvfp4),
            other => Err(format!(
                "unknown weight format '{other}'; expected bf16, fp8 or nvfp4"
            )),
        }
    }
}

/// What `--quantize` asks for: one format for every decoder linear, or NVIDIA's mixed recipe of
/// the Qwen3.5 / 3.6 hybrids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantRecipe {
    /// Every decoder linear in this format; the embedding, the lm_head and Gated-DeltaNet's
    /// `in_proj_a` / `in_proj_b` stay BF16 (as ModelOpt exports leave them).
    Uniform(WeightFormat),
    /// The recipe of NVIDIA's ModelOpt exports `Qwen3.6-27B-NVFP4` and `Qwen3.6-35B-A3B-NVFP4`
    /// (`quant_algo: MIXED_PRECISION`): MLP gate/up/down (dense, the routed experts and the
    /// shared expert) and the lm_head W4A16 NVFP4 (group 16); the MoE router and the shared
    /// expert's gate BF16; attention
    /// q/k/v/o and Gated-DeltaNet in_proj_qkv / in_proj_z / out_proj FP8 E4M3 (per-tensor
    /// weight scale; activations quantized per token here, as no calibration data exists for
    /// synthetic weights); Gated-DeltaNet in_proj_a / in_proj_b BF16.
    Nvfp4Mixed,
}

impl QuantRecipe {
    /// `bf16`, `fp8`, `nvfp4`, `nvfp4-mixed`.
    pub fn id(self) -> &'static str {
        match self {
            Self::Uniform(f) => f.id(),
            Self::Nvfp4Mixed => "nvfp4-mixed",
        }
    }

    /// The format of a decoder linear of `role`. Gated-DeltaNet's `in_proj_a` / `in_proj_b`,
    /// the MoE router (`mlp.gate`) and the shared expert's gate stay BF16 in every recipe (as
    /// ModelOpt exports leave them: tiny `[value_heads, H]`, `[E, H]` and `[1, H]` matrices).
    pub fn format_for(self, role: crate::model::roles::LinearRole) -> WeightFormat {
        use crate::model::roles::LinearRole as R;
        match (self, role) {
            (_, R::GdnA | R::GdnB | R::Router | R::SharedExpertGate) => WeightFormat::Bf16,
            (Self::Uniform(f), _) => f,
            (
                Self::Nvfp4Mixed,
                R::Gate
                | R::Up
                | R::Down
                | R::ExpertGate
                | R::ExpertUp
                | R::ExpertDown
                | R::SharedGate
                | R::SharedUp
                | R::SharedDown,
            ) => WeightFormat::Nvfp4,
            (Self::Nvfp4Mixed, _) => WeightFormat::Fp8,
        }
    }

    /// The format of an untied lm_head: BF16, or NVFP4 in the mixed recipe.
    pub fn lm_head_format(self) -> WeightFormat {
        match self {
            Self::Uniform(_) => WeightFormat::Bf16,
            Self::Nvfp4Mixed => WeightFormat::Nvfp4,
        }
    }
}

impl From<WeightFormat> for QuantRecipe {
    fn from(f: WeightFormat) -> Self {
        Self::Uniform(f)
    }
}

impl std::str::FromStr for QuantRecipe {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvfp4-mixed" | "nvfp4_mixed" | "mixed" => Ok(Self::Nvfp4Mixed),
            other => other.parse::<WeightFormat>().map(Self::Uniform).map_err(|_| {
                format!(
                    "unknown quantization '{other}'; expected bf16, fp8, nvfp4 or nvfp4-mixed (NVIDIA's Qwen3.6-NVFP4 recipe: NVFP4 MLP, experts, shared expert and lm_head, FP8 attention and Gated-DeltaNet projections, BF16 in_proj_a/in_proj_b, router and shared-expert gate)"
                )
            }),
        }
    }
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// BF16, 2 bytes per element.
    Bf16,
    /// FP8 E4M3 with one FP32 scale per layer for K and one for V (vLLM's `fp8_e4m3` KV cache:
    /// stored = e4m3(x / scale); scales from the checkpoint's `k_scale`/`v_scale`, else 1.0).
    Fp8,
}

impl KvCacheDtype {
    /// Bytes per element: 2 or 1.
    pub fn bytes(self) -> usize {
        match self {
            Self::Bf16 => 2,
            Self::Fp8 => 1,
        }
    }

    /// vLLM's `cache_dtype` label: `bfloat16` (vLLM says `auto` for the model dtype) or
    /// `fp8_e4m3`.
    pub fn vllm_name(self) -> &'static str {
        match self {
            Self::Bf16 => "bfloat16",
            Self::Fp8 => "fp8_e4m3",
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" | "auto" => Ok(Self::Bf16),
            "fp8" | "fp8_e4m3" | "e4m3" => Ok(Self::Fp8),
            other => Err(format!(
                "unknown KV cache dtype '{other}'; expected bf16 or fp8"
            )),
        }
    }
}

/// Speculative decoding settings (off when [`ServeConfig::speculative`] is `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfig {
    /// k: draft tokens proposed per step (≥ 1).
    pub num_speculative_tokens: usize,
    /// Shortest n-gram the prompt-lookup drafter matches (vLLM `prompt_lookup_min`).
    pub prompt_lookup_min: usize,
    /// Longest n-gram it tries first (vLLM `prompt_lookup_max`).
    pub prompt_lookup_max: usize,
}

/// Everything `rigbench serve` needs; build it in code with [`ServeConfig::tiny`] and adjust
/// fields, or from the command line through `crate::cli::serve::ServeArgs`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// `synthetic:NAME` for a preset of [`PRESETS`] (`tiny`, `qwen3-8b`, `qwen3-32b`,
    /// `tiny-hybrid`, `qwen3.6-27b`, `tiny-moe`, `qwen3.6-35b-a3b`, `qwen3-30b-a3b`), or a
    /// checkpoint directory
    /// (with `config.json`, `*.safetensors`, optionally `tokenizer.json`,
    /// `tokenizer_config.json`, `generation_config.json`).
    pub model: String,
    /// Name served in `/v1/models` and accepted in requests (default: `model`).
    pub served_model_name: Option<String>,
    /// Address to bind.
    pub host: String,
    /// Port to bind; 0 picks a free port.
    pub port: u16,
    /// Quantize BF16 (or synthesized) weights at load; `None` keeps the stored format.
    pub quantize: Option<QuantRecipe>,
    /// Seed of synthesized weights and of requests without their own seed.
    pub seed: u64,
    /// Keep only the first N decoder layers.
    pub num_layers: Option<usize>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Where the runtime runs (`--device`; resolved: see `crate::runtime::device`).
    pub device: super::backend::Device,
    /// Fraction of GPU memory the engine may use (`--gpu-memory-utilization`, (0, 1]); `None`
    /// = 0.9. The KV cache gets what is left of it after weights, activations and workspace.
    pub gpu_memory_utilization: Option<f64>,
    /// Explicit KV cache budget in bytes (`--kv-cache-memory`; wins over the utilization); `None`
    /// = from the utilization on a GPU, 512 MiB on the CPU.
    pub kv_cache_memory: Option<u64>,
    /// KV cache element type.
    pub kv_cache_dtype: KvCacheDtype,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks and decode tokens together).
    pub max_num_batched_tokens: usize,
    /// Longest prompt + output; `None` = the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// n-gram speculative decoding; `None` = off.
    pub speculative: Option<SpecConfig>,
    /// Reuse KV blocks of identical prefixes.
    pub enable_prefix_caching: bool,
    /// CPU threads of the matmul; `None` = all available cores.
    pub num_threads: Option<usize>,
    /// Connection limit, timeouts and the chat message limit of the HTTP server.
    pub limits: super::serve_guard::ServeLimits,
    /// The key every request must carry (`--api-key`, `VLLM_API_KEY`); `None` = open.
    pub api_key: Option<super::serve_guard::ApiKey>,
}

impl ServeConfig {
    /// `synthetic:tiny` on the CPU, 127.0.0.1 with a free port, seed 0, block 16, 64 MiB of BF16 KV,
    /// 16 sequences, 512 batched tokens, max_model_len 2048, prefix caching on, no speculation.
    pub fn tiny() -> Self {
        ServeConfig {
            model: "synthetic:tiny".into(),
            served_model_name: None,
            host: "127.0.0.1".into(),
            port: 0,
            quantize: None,
            seed: 0,
            num_layers: None,
            block_size: 16,
            device: super::backend::Device::Cpu,
            gpu_memory_utilization: None,
            kv_cache_memory: Some(64 << 20),
            kv_cache_dtype: KvCacheDtype::Bf16,
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_model_len: Some(2048),
            speculative: None,
            enable_prefix_caching: true,
            num_threads: None,
            limits: Default::default(),
            api_key: None,
        }
    }

    /// The name clients use: `served_model_name` or `model`.
    pub fn served_name(&self) -> &str {
        self.served_model_name.as_deref().unwrap_or(&self.model)
    }

    /// Check values that clap cannot (ranges, combinations).
    ///
    /// # Errors
    /// [`RigError::BadFlag`] naming the flag and the fix.
    pub fn validate(&self) -> Result<(), RigError> {
        if self.block_size == 0 || self.block_size > 1024 {
            return Err(RigError::flag(
                "--block-size",
                format!("{} is out of range 1..=1024", self.block_size),
            ));
        }
        if self.max_num_seqs == 0 {
            return Err(RigError::flag("--max-num-seqs", "must be at least 1"));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(RigError::flag(
                "--max-num-batched-tokens",
                "must be at least 1",
            ));
        }
        if self.max_model_len == Some(0) {
            return Err(RigError::flag("--max-model-len", "must be at least 1"));
        }
        if self.num_layers == Some(0) {
            return Err(RigError::flag("--num-layers", "must be at least 1"));
        }
        if let Some(u) = self.gpu_memory_utilization {
            if !(u > 0.0 && u <= 1.0) {
                return Err(RigError::flag(
                    "--gpu-memory-utilization",
                    format!("{u} is not in (0, 1]"),
                ));
            }
        }
        if self.num_threads == Some(0) {
            return Err(RigError::flag("--threads", "must be at least 1"));
        }
        if let Some(s) = &self.speculative {
            if s.num_speculative_tokens == 0 || s.num_speculative_tokens > 64 {
                return Err(RigError::flag(
                    "--spec-k",
                    format!("{} is out of range 1..=64", s.num_speculative_tokens),
                ));
            }
            if s.prompt_lookup_min == 0 || s.prompt_lookup_min > s.prompt_lookup_max {
                return Err(RigError::flag(
                    "--prompt-lookup-min",
                    format!(
                        "need 1 <= prompt_lookup_min ({}) <= prompt_lookup_max ({})",
                        s.prompt_lookup_min, s.prompt_lookup_max
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Where the model comes from.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] for an unknown preset; [`RigError::BadFile`] for a directory that
    /// does not exist or has no `config.json`.
    pub fn source(&self) -> Result<ModelSource, RigError> {
        if let Some(name) = self.model.strip_prefix("synthetic:") {
            return match ModelConfig::preset(name) {
                Some(_) => Ok(ModelSource::Synthetic(name.to_string())),
                None => Err(RigError::flag(
                    "--model",
                    format!(
                        "unknown preset 'synthetic:{name}'; choose one of synthetic:{}",
                        PRESETS.join(", synthetic:")
                    ),
                )),
            };
        }
        let dir = PathBuf::from(&self.model);
        if crate::checkpoint::gguf::is_gguf_path(&dir) {
            return Ok(ModelSource::Gguf(dir));
        }
        if !dir.is_dir() {
            return Err(RigError::file(
                &dir,
                format!(
                    "not a checkpoint (expected a folder with config.json and *.safetensors, a .gguf file, or synthetic:{})",
                    PRESETS.join("|")
                ),
            ));
        }
        if !dir.join("config.json").is_file() {
            return Err(RigError::file(
                dir.join("config.json"),
                "missing; a checkpoint directory needs its Hugging Face config.json",
            ));
        }
        Ok(ModelSource::Dir(dir))
    }
}

/// Where a running model's weights came from: a condition of every figure measured on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelProvenance {
    /// Seeded synthetic weights ([`crate::runtime::weights::synthesize`]).
    Synthetic {
        /// The preset (`qwen3-8b`, ...).
        preset: String,
        /// The seed.
        seed: u64,
        /// Decoder layers kept (`--num-layers`).
        num_layers: usize,
    },
    /// A checkpoint directory.
    Checkpoint {
        /// The directory as given.
        path: String,
        /// `MappedCheckpoint::content_hash` (a hash of the shard headers and sizes).
        content_hash: String,
    },
}

impl ModelProvenance {
    /// One line: `synthetic:qwen3-8b seed 0 (36 layers)` or `checkpoint DIR (fnv1a64:...)`.
    pub fn describe(&self) -> String {
        match self {
            ModelProvenance::Synthetic {
                preset,
                seed,
                num_layers,
            } => format!("synthetic:{preset} seed {seed} ({num_layers} layers)"),
            ModelProvenance::Checkpoint { path, content_hash } => {
                format!("checkpoint {path} ({content_hash})")
            }
        }
    }
}

/// Where weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// Synthesized from the seed at a preset shape.
    Synthetic(String),
    /// A local checkpoint directory.
    Dir(PathBuf),
    /// A GGUF file, or a folder holding one and no config.json (see
    /// `crate::runtime::gguf_model`).
    Gguf(PathBuf),
}

/// Parse a human size: a number (decimal point allowed) with an optional unit. `B`; decimal
/// `KB`, `MB`, `GB`, `TB` (powers of 1000); binary `KiB`, `MiB`, `GiB`, `TiB` and the bare
/// `K`, `M`, `G`, `T` (powers of 1024). Case-insensitive; spaces and `_`/`,` separators allowed.
///
/// # Errors
/// A message naming the bad text and the accepted forms.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t: String = text
        .chars()
        .filter(|c| !matches!(c, ' ' | '_' | ','))
        .collect();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("'{text}' is not a size; use e.g. 268435456, 256MiB, 1.5GiB or 512MB");
    let value: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("256 mib").unwrap(), 256 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        for bad in ["", "MiB", "12 parsecs", "-5MiB", "1.2.3GiB", "1e400"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("256MiB"), "{bad}: {e}");
        }
    }

    #[test]
    fn serve_config_validation() {
        let mut c = ServeConfig::tiny();
        assert!(c.validate().is_ok());
        c.block_size = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--block-size"));
        let mut c = ServeConfig::tiny();
        c.model = "synthetic:huge".into();
        assert!(c
            .source()
            .unwrap_err()
            .to_string()
            .contains("synthetic:tiny"));
        c.model = "/definitely/not/here".into();
        assert!(c
            .source()
            .unwrap_err()
            .to_string()
            .contains("/definitely/not/here"));
    }
}
