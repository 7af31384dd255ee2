//! A checkpoint opened by memory-mapping its safetensors shards: tensors are indexed from the
//! headers and read as borrowed slices of the mapping, so no full host copy is ever made (the
//! CUDA backend uploads each tensor straight from the mapping; the CPU backend builds its owned
//! [`ModelWeights`] tensor by tensor).
//!
//! Which formats and tensor conventions are accepted is decided in one place,
//! [`crate::checkpoint::runtime`], which `rigbench inspect` uses too: [`MappedCheckpoint::open`]
//! inspects the folder (metadata only) and refuses with the same finding id inspect reports.
//!
//! Safety of the mapping: the files are mapped read-only; a file truncated or rewritten by
//! another process while mapped can fault (SIGBUS) on access, as with any mmap-based loader
//! (safetensors' own `safe_open` has the same caveat).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::Dtype;

use super::{LayerWeights, Linear, ModelWeights};
use crate::checkpoint::runtime::{linear_tensors, LinearTensors, Nvfp4Convention};
use crate::formats::fp8::{Fp8Granularity, Fp8Tensor};
use crate::formats::nvfp4::{self, Nvfp4Weight, NVFP4_BLOCK};
pub use crate::model::roles::LinearRole;

#[path = "mapped_experts.rs"]
mod experts;
use crate::runtime::config::{ModelConfig, WeightFormat};
use crate::RigError;

/// An RMSNorm weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormRole {
    /// `model.layers.{i}.input_layernorm`, H.
    Input(usize),
    /// `model.layers.{i}.post_attention_layernorm`, H.
    Post(usize),
    /// Qwen3 `model.layers.{i}.self_attn.q_norm`, head_dim.
    Q(usize),
    /// Qwen3 `model.layers.{i}.self_attn.k_norm`, head_dim.
    K(usize),
    /// `model.norm`, H.
    Final,
    /// Gated-DeltaNet `model.layers.{i}.linear_attn.norm` (the gated RMSNorm), value_head_dim;
    /// used as stored (never `1 + w`).
    GdnNorm(usize),
}

/// A linear weight borrowed from the mapping, always in ModelOpt conventions (a
/// compressed-tensors NVFP4 global scale is converted to ModelOpt's `weight_scale_2`).
#[derive(Debug, Clone, PartialEq)]
pub enum LinearView<'a> {
    /// Little-endian BF16, `[n, k]` row-major (`2·n·k` bytes).
    Bf16 {
        /// Rows (output features).
        n: usize,
        /// Columns (input features).
        k: usize,
        /// The bytes.
        data: &'a [u8],
    },
    /// FP8 E4M3 `[n, k]` with its FP32 scale(s).
    Fp8 {
        /// Rows.
        n: usize,
        /// Columns.
        k: usize,
        /// E4M3 codes, row-major.
        data: &'a [u8],
        /// 1 (per tensor) or `n` (per channel) scales.
        scales: Vec<f32>,
        /// Static activation scale (`input_scale`), `None` for dynamic per-token activations.
        input_scale: Option<f32>,
    },
    /// NVFP4 (see [`crate::formats::nvfp4`]), run as W4A16.
    Nvfp4 {
        /// Rows.
        n: usize,
        /// Columns (a multiple of 16).
        k: usize,
        /// Packed E2M1, `[n, k/2]`, low nibble = even column.
        packed: &'a [u8],
        /// E4M3 block scales, `[n, k/16]`.
        block_scales: &'a [u8],
        /// FP32 per-tensor scale (ModelOpt `weight_scale_2`).
        global_scale: f32,
    },
}

impl LinearView<'_> {
    /// The format.
    pub fn format(&self) -> WeightFormat {
        match self {
            LinearView::Bf16 { .. } => WeightFormat::Bf16,
            LinearView::Fp8 { .. } => WeightFormat::Fp8,
            LinearView::Nvfp4 { .. } => WeightFormat::Nvfp4,
        }
    }

    /// `(N, K)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            LinearView::Bf16 { n, k, .. }
            | LinearView::Fp8 { n, k, .. }
            | LinearView::Nvfp4 { n, k, .. } => (*n, *k),
        }
    }

    /// Bytes read from the weight stream (elements and scales).
    pub fn stored_bytes(&self) -> u64 {
        match self {
            LinearView::Bf16 { data, .. } => data.len() as u64,
            LinearView::Fp8 { data, scales, .. } => (data.len() + 4 * scales.len()) as u64,
            LinearView::Nvfp4 {
                packed,
                block_scales,
                ..
            } => (packed.len() + block_scales.len() + 4) as u64,
        }
    }

    /// An owned copy (the CPU backend's [`Linear`]).
    pub fn to_linear(&self) -> anyhow::Result<Linear> {
        Ok(match self {
            LinearView::Bf16 { n, k, data } => Linear::Bf16 {
                n: *n,
                k: *k,
                data: data
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            },
            LinearView::Fp8 {
                n,
                k,
                data,
                scales,
                input_scale,
            } => Linear::Fp8 {
                w: Fp8Tensor {
                    rows: *n,
                    cols: *k,
                    data: data.to_vec(),
                    granularity: if scales.len() == 1 {
                        Fp8Granularity::PerTensor
                    } else {
                        Fp8Granularity::PerChannel
                    },
                    scales: scales.clone(),
                },
                input_scale: *input_scale,
            },
            LinearView::Nvfp4 {
                n,
                k,
                packed,
                block_scales,
                global_scale,
            } => Linear::Nvfp4(Nvfp4Weight::from_parts(
                *n,
                *k,
                packed.to_vec(),
                block_scales.to_vec(),
                *global_scale,
            )?),
        })
    }
}

/// Where one tensor lives.
#[derive(Debug, Clone)]
struct TensorLoc {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the shard file.
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    map: memmap2::Mmap,
}

/// All shards of a checkpoint memory-mapped, tensors indexed (see the module docs).
pub struct MappedCheckpoint {
    dir: PathBuf,
    config: ModelConfig,
    shards: Vec<Shard>,
    tensors: HashMap<String, TensorLoc>,
    /// Prefix of the language model's tensors: `model.` or, for multimodal wrappers
    /// (`Qwen3_5ForConditionalGeneration`), `model.language_model.`.
    prefix: String,
    layouts: Vec<Vec<(LinearRole, LinearTensors)>>,
    /// Per layer, how a sparse layer's routed experts are stored (`None` for dense MLPs).
    experts: Vec<Option<experts::ExpertLayout>>,
    lm_head: Option<LinearTensors>,
    format: WeightFormat,
    formats: Vec<WeightFormat>,
    hash: String,
    notes: Vec<String>,
}

impl std::fmt::Debug for MappedCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedCheckpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .field("format", &self.format)
            .finish()
    }
}

/// FNV-1a, 64 bit (Fowler, Noll, Vo): a fast non-cryptographic hash.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

impl MappedCheckpoint {
    /// Map the checkpoint in `dir` for `config` (its first `config.num_layers` layers).
    ///
    /// Inspects the folder first (config.json, quantization metadata, safetensors headers; the
    /// same code as `rigbench inspect`) and refuses, with the finding id inspect reports, a
    /// checkpoint the runtime cannot run ([`crate::checkpoint::runtime::verdict`]). Then maps
    /// every shard and resolves each linear layer's tensors.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the folder, file or tensor: the refusal (`[rule] detail`),
    /// no safetensors files, a shard that cannot be mapped, a tensor missing or of the wrong
    /// shape or dtype, a non-positive scale.
    pub fn open(dir: &Path, config: &ModelConfig) -> anyhow::Result<Self> {
        Self::open_parsed(dir, config, &crate::model::ConfigFile::read(dir)?)
    }

    /// [`Self::open`] with `config.json` already read and decoded (the engine's load reads it
    /// once: [`crate::model::ConfigFile::read_for_runtime`]).
    ///
    /// # Errors
    /// As [`Self::open`].
    pub fn open_parsed(
        dir: &Path,
        config: &ModelConfig,
        file: &crate::model::ConfigFile,
    ) -> anyhow::Result<Self> {
        let opts = crate::checkpoint::InspectOptions::default();
        let report = crate::checkpoint::inspect_parsed(dir, file, &opts)?;
        let support = crate::checkpoint::runtime::verdict(&report, &file.runtime).map_err(|r| {
            RigError::file(
                dir,
                format!("{r} (`rigbench inspect` reports the same finding id)"),
            )
        })?;
        if report.tensors.files.is_empty() {
            return Err(
                RigError::file(dir, "no *.safetensors files in the checkpoint directory").into(),
            );
        }
        let mut shards = Vec::new();
        let mut tensors = HashMap::new();
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for info in &report.tensors.files {
            let path = dir.join(&info.file);
            let file = std::fs::File::open(&path)
                .map_err(|e| RigError::file(&path, format!("cannot open: {e}")))?;
            // SAFETY: the mapping is read-only and never outlives `self`; see the module docs
            // for files changed by another process while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| RigError::file(&path, format!("cannot memory-map: {e}")))?;
            let (n, md) = safetensors::SafeTensors::read_metadata(&map)
                .map_err(|e| RigError::file(&path, format!("not a valid safetensors file: {e}")))?;
            let base = 8 + n;
            hash = fnv1a(hash, info.file.as_bytes());
            hash = fnv1a(hash, &(map.len() as u64).to_le_bytes());
            hash = fnv1a(hash, &map[..base]);
            for (name, ti) in md.tensors() {
                tensors.insert(
                    name,
                    TensorLoc {
                        shard: shards.len(),
                        dtype: ti.dtype,
                        shape: ti.shape.clone(),
                        start: base + ti.data_offsets.0,
                        end: base + ti.data_offsets.1,
                    },
                );
            }
            shards.push(Shard { path, map });
        }
        let dtype_of = |name: &str| tensors.get(name).map(|t: &TensorLoc| t.dtype.to_string());
        let prefix = lm_prefix(&|n: &str| tensors.contains_key(n));
        let mut layouts = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let mut v = Vec::with_capacity(8);
            for &role in LinearRole::of_layer(config, i) {
                let name = format!("{prefix}layers.{i}.{}", role.module());
                v.push((
                    role,
                    linear_tensors(&name, &dtype_of).map_err(|e| RigError::file(dir, e))?,
                ));
            }
            layouts.push(v);
        }
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            if !tensors.contains_key("lm_head.weight")
                && !tensors.contains_key("lm_head.weight_packed")
            {
                return Err(RigError::file(
                    dir,
                    "tensor 'lm_head.weight' is missing and tie_word_embeddings is not true in config.json; an untied model needs its lm_head",
                )
                .into());
            }
            Some(linear_tensors("lm_head", &dtype_of).map_err(|e| RigError::file(dir, e))?)
        };
        let mut m = MappedCheckpoint {
            dir: dir.to_path_buf(),
            config: config.clone(),
            shards,
            tensors,
            prefix,
            layouts,
            experts: Vec::new(),
            lm_head,
            format: WeightFormat::Bf16,
            formats: Vec::new(),
            hash: format!("fnv1a64:{hash:016x}"),
            notes: support.notes,
        };
        m.experts = (0..config.num_layers)
            .map(|i| m.resolve_experts(i))
            .collect::<anyhow::Result<_>>()?;
        // Check every linear once (shapes, dtypes, scales) and take the majority format.
        let mut counts: HashMap<WeightFormat, usize> = HashMap::new();
        for i in 0..config.num_layers {
            for &role in LinearRole::of_layer(config, i) {
                let v = m.linear_any(i, role)?;
                *counts.entry(v.format()).or_insert(0) += 1;
            }
            m.count_expert_formats(i, &mut counts)?;
            if config.layer_type(i) == crate::runtime::hybrid::LayerType::Gdn {
                m.gdn_params(i)?;
            } else {
                m.kv_scales_checked(i)?;
            }
        }
        let first = m
            .layouts
            .first()
            .and_then(|l| l.first())
            .map(|(_, t)| m.format_of(t));
        m.format = counts
            .iter()
            .max_by_key(|(f, c)| (**c, Some(**f) == first))
            .map(|(f, _)| *f)
            .unwrap_or(WeightFormat::Bf16);
        m.formats = counts.keys().copied().collect();
        m.formats.sort_by_key(|f| f.id());
        if counts.len() > 1 {
            let mut parts: Vec<String> = counts
                .iter()
                .map(|(f, c)| format!("{c} {}", f.id()))
                .collect();
            parts.sort();
            m.notes.push(format!(
                "mixed formats among the decoder linears ({}); each layer runs in its own format",
                parts.join(", ")
            ));
        }
        m.embed_checked()?;
        m.lm_head_any()?;
        Ok(m)
    }

    fn format_of(&self, t: &LinearTensors) -> WeightFormat {
        match t {
            LinearTensors::Plain { .. } => WeightFormat::Bf16,
            LinearTensors::Fp8 { .. } => WeightFormat::Fp8,
            LinearTensors::Nvfp4 { .. } => WeightFormat::Nvfp4,
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shape it was opened for.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Notes of the resolver (W4A4 run as W4A16, mixed formats, config defaults).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Every format among the decoder linears (a ModelOpt `MIXED_PRECISION` export has several).
    pub fn formats(&self) -> &[WeightFormat] {
        &self.formats
    }

    /// Format of the decoder linears: the majority format (ties: the first layer's q_proj's);
    /// [`Self::notes`] says when they are mixed, and each [`LinearView`] carries its own.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Bytes of every tensor the runtime reads (linears with their scales, embedding, lm_head,
    /// norms), as stored.
    pub fn weight_bytes(&self) -> u64 {
        let mut b = 0u64;
        for i in 0..self.config.num_layers {
            for &role in LinearRole::of_layer(&self.config, i) {
                b += self.linear_any(i, role).map_or(0, |v| v.stored_bytes());
            }
        }
        b += self.embed_loc().map_or(0, |t| (t.end - t.start) as u64);
        if let Ok(Some(h)) = self.lm_head_any() {
            b += h.stored_bytes();
        }
        b
    }

    /// Provenance: `fnv1a64:<16 hex digits>`, an FNV-1a hash over each shard's file name, file
    /// size and header (the 8-byte length and the JSON: every tensor's name, dtype, shape and
    /// offsets), in shard order. Cheap (no tensor data is read) and stable across copies of the
    /// same files; it does not cover tensor values (two checkpoints differing only in values of
    /// equal-shaped tensors hash alike) and is not a cryptographic hash.
    pub fn content_hash(&self) -> String {
        self.hash.clone()
    }

    fn loc(&self, name: &str) -> anyhow::Result<&TensorLoc> {
        self.tensors.get(name).ok_or_else(|| {
            RigError::file(
                &self.dir,
                format!("tensor '{name}' is missing from the checkpoint's safetensors files"),
            )
            .into()
        })
    }

    fn bytes(&self, t: &TensorLoc) -> &[u8] {
        &self.shards[t.shard].map[t.start..t.end]
    }

    fn bad(&self, t: &TensorLoc, name: &str, msg: String) -> anyhow::Error {
        RigError::file(
            &self.shards[t.shard].path,
            format!("tensor '{name}': {msg}"),
        )
        .into()
    }

    /// A float tensor (BF16, F16, F32) of `len` elements as f32.
    fn floats(&self, name: &str, len: usize) -> anyhow::Result<Vec<f32>> {
        let t = self.loc(name)?;
        let n: usize = t.shape.iter().product();
        if n != len {
            return Err(self.bad(
                t,
                name,
                format!("shape {:?} has {n} elements; expected {len}", t.shape),
            ));
        }
        let d = self.bytes(t);
        Ok(match t.dtype {
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            other => {
                return Err(self.bad(
                    t,
                    name,
                    format!("dtype {other} where BF16/F16/F32 was expected"),
                ))
            }
        })
    }

    fn positive_scalar(&self, name: &str) -> anyhow::Result<f32> {
        let s = self.floats(name, 1)?[0];
        if !(s > 0.0 && s.is_finite()) {
            return Err(RigError::file(
                &self.dir,
                format!("scale '{name}' = {s}; expected a positive finite value"),
            )
            .into());
        }
        Ok(s)
    }

    fn nk_tensor(&self, name: &str, n: usize, k: usize, what: &str) -> anyhow::Result<&TensorLoc> {
        let t = self.loc(name)?;
        if t.shape != [n, k] {
            return Err(self.bad(
                t,
                name,
                format!("{what}shape {:?}; expected [{n}, {k}]", t.shape),
            ));
        }
        Ok(t)
    }

    /// A view of whichever format `tensors` resolved to; unquantized F16/F32 come back as an
    /// error (the caller converts).
    fn view(&self, t: &LinearTensors, n: usize, k: usize) -> anyhow::Result<LinearView<'_>> {
        match t {
            LinearTensors::Plain { weight } => {
                let loc = self.nk_tensor(weight, n, k, "")?;
                if loc.dtype != Dtype::BF16 {
                    return Err(self.bad(
                        loc,
                        weight,
                        format!(
                            "is {}; the GPU path reads BF16 weights only (the CPU path converts FP16/FP32 to BF16 at load)",
                            loc.dtype
                        ),
                    ));
                }
                Ok(LinearView::Bf16 {
                    n,
                    k,
                    data: self.bytes(loc),
                })
            }
            LinearTensors::Fp8 {
                weight,
                weight_scale,
                input_scale,
            } => {
                let loc = self.nk_tensor(weight, n, k, "FP8 ")?;
                let st = self.loc(weight_scale)?;
                let count: usize = st.shape.iter().product();
                if count != 1 && count != n {
                    return Err(self.bad(
                        st,
                        weight_scale,
                        format!("{count} scales; FP8 needs 1 (per tensor) or {n} (per channel). Block-wise FP8 is not supported by the built-in runtime"),
                    ));
                }
                let scales = self.floats(weight_scale, count)?;
                if scales.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
                    return Err(RigError::file(
                        &self.dir,
                        format!("'{weight_scale}' has a non-positive or non-finite scale"),
                    )
                    .into());
                }
                let input_scale = match input_scale {
                    Some(s) => Some(self.positive_scalar(s)?),
                    None => None,
                };
                Ok(LinearView::Fp8 {
                    n,
                    k,
                    data: self.bytes(loc),
                    scales,
                    input_scale,
                })
            }
            LinearTensors::Nvfp4 {
                packed,
                block_scales,
                global_scale,
                convention,
            } => {
                if k % NVFP4_BLOCK != 0 {
                    return Err(RigError::file(
                        &self.dir,
                        format!("{packed}: K = {k} is not a multiple of 16; NVFP4 needs it"),
                    )
                    .into());
                }
                let p = self.loc(packed)?;
                if p.dtype != Dtype::U8 || p.shape != [n, k / 2] {
                    return Err(self.bad(
                        p,
                        packed,
                        format!(
                            "NVFP4 packed {} {:?}; expected U8 [{n}, {}]",
                            p.dtype,
                            p.shape,
                            k / 2
                        ),
                    ));
                }
                let s = self.loc(block_scales)?;
                if s.dtype != Dtype::F8_E4M3 || s.shape != [n, k / NVFP4_BLOCK] {
                    return Err(self.bad(
                        s,
                        block_scales,
                        format!(
                            "{} {:?}; NVFP4 needs F8_E4M3 [{n}, {}]",
                            s.dtype,
                            s.shape,
                            k / NVFP4_BLOCK
                        ),
                    ));
                }
                let g = self.positive_scalar(global_scale)?;
                let global_scale = match convention {
                    Nvfp4Convention::ModelOpt => g,
                    Nvfp4Convention::CompressedTensors => {
                        nvfp4::global_scale_from_compressed_tensors(g).map_err(|e| {
                            RigError::file(&self.dir, format!("{global_scale}: {e}"))
                        })?
                    }
                };
                Ok(LinearView::Nvfp4 {
                    n,
                    k,
                    packed: self.bytes(p),
                    block_scales: self.bytes(s),
                    global_scale,
                })
            }
        }
    }

    /// The view, with F16/F32 weights accepted (as a zero-copy BF16 view is impossible, those
    /// are only checked here and converted by [`Self::linear_owned`]).
    fn linear_any(&self, layer: usize, role: LinearRole) -> anyhow::Result<LinearView<'_>> {
        let (n, k) = role.shape(&self.config);
        let t = self.layout(layer, role)?;
        if let LinearTensors::Plain { weight } = t {
            let loc = self.nk_tensor(weight, n, k, "")?;
            if matches!(loc.dtype, Dtype::F16 | Dtype::F32) {
                return Ok(LinearView::Bf16 { n, k, data: &[] });
            }
        }
        self.view(t, n, k)
    }

    fn layout(&self, layer: usize, role: LinearRole) -> anyhow::Result<&LinearTensors> {
        let l = self
            .layouts
            .get(layer)
            .ok_or_else(|| anyhow::anyhow!("layer {layer} of {}", self.config.num_layers))?;
        l.iter()
            .find(|(r, _)| *r == role)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "layer {layer} is a {:?} layer and has no {}",
                    self.config.layer_type(layer),
                    role.module()
                )
            })
    }

    /// Layer `layer`'s linear `role`, borrowed from the mapping.
    ///
    /// # Errors
    /// A layer beyond `num_layers`; a weight stored as FP16/FP32 (the message says the GPU path
    /// reads BF16 only; the CPU path converts through [`Self::linear_owned`]); shape or scale
    /// errors naming the tensor.
    pub fn linear(&self, layer: usize, role: LinearRole) -> anyhow::Result<LinearView<'_>> {
        let (n, k) = role.shape(&self.config);
        self.view(self.layout(layer, role)?, n, k)
    }

    /// Layer `layer`'s linear `role` as an owned [`Linear`] (FP16/FP32 converted to BF16, round
    /// to nearest even): the CPU backend's path.
    ///
    /// # Errors
    /// As [`Self::linear`], less the FP16/FP32 refusal.
    pub fn linear_owned(&self, layer: usize, role: LinearRole) -> anyhow::Result<Linear> {
        let (n, k) = role.shape(&self.config);
        let t = self.layout(layer, role)?;
        self.owned(t, n, k)
    }

    fn owned(&self, t: &LinearTensors, n: usize, k: usize) -> anyhow::Result<Linear> {
        if let LinearTensors::Plain { weight } = t {
            let loc = self.nk_tensor(weight, n, k, "")?;
            if loc.dtype != Dtype::BF16 {
                let v = self.floats(weight, n * k)?;
                return Ok(Linear::bf16_from_f32(n, k, &v));
            }
        }
        self.view(t, n, k)?.to_linear()
    }

    fn embed_name(&self) -> String {
        format!("{}embed_tokens.weight", self.prefix)
    }

    fn embed_loc(&self) -> anyhow::Result<&TensorLoc> {
        self.nk_tensor(
            &self.embed_name(),
            self.config.vocab_size,
            self.config.hidden_size,
            "",
        )
    }

    fn embed_checked(&self) -> anyhow::Result<()> {
        let t = self.embed_loc()?;
        if !matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            return Err(self.bad(
                t,
                &self.embed_name(),
                format!("is {}; the runtime needs a BF16/F16/F32 embedding", t.dtype),
            ));
        }
        Ok(())
    }

    /// The token embedding, BF16 `[vocab, H]`.
    ///
    /// # Errors
    /// Missing, of the wrong shape, or not BF16 (an FP16/FP32 embedding: the message says the
    /// GPU path reads BF16 only; [`Self::to_weights`] converts it on the CPU path).
    pub fn embed(&self) -> anyhow::Result<LinearView<'_>> {
        self.view(
            &LinearTensors::Plain {
                weight: self.embed_name(),
            },
            self.config.vocab_size,
            self.config.hidden_size,
        )
    }

    fn lm_head_any(&self) -> anyhow::Result<Option<LinearView<'_>>> {
        match &self.lm_head {
            None => Ok(None),
            Some(t) => {
                let (n, k) = (self.config.vocab_size, self.config.hidden_size);
                if let LinearTensors::Plain { weight } = t {
                    let loc = self.nk_tensor(weight, n, k, "")?;
                    if loc.dtype != Dtype::BF16 {
                        return Ok(Some(LinearView::Bf16 { n, k, data: &[] }));
                    }
                }
                self.view(t, n, k).map(Some)
            }
        }
    }

    /// The lm_head `[vocab, H]`; `None` when tied to the embedding (`tie_word_embeddings`).
    ///
    /// # Errors
    /// As [`Self::linear`].
    pub fn lm_head(&self) -> anyhow::Result<Option<LinearView<'_>>> {
        match &self.lm_head {
            None => Ok(None),
            Some(t) => self
                .view(t, self.config.vocab_size, self.config.hidden_size)
                .map(Some),
        }
    }

    /// An RMSNorm weight as f32 (BF16, F16 or F32 stored). The zero-centred norms of the
    /// Qwen3.5 family (`Qwen3_5RMSNorm`: `norm(x) · (1 + w)`) come back as `1 + w`, so every
    /// backend multiplies by the weight it gets; the gated norm ([`NormRole::GdnNorm`]) as
    /// stored.
    ///
    /// # Errors
    /// Missing, of the wrong size or dtype; a q/k norm asked of a Llama model.
    pub fn norm(&self, which: NormRole) -> anyhow::Result<Vec<f32>> {
        let c = &self.config;
        let p = &self.prefix;
        let (name, len) = match which {
            NormRole::Input(i) => (
                format!("{p}layers.{i}.input_layernorm.weight"),
                c.hidden_size,
            ),
            NormRole::Post(i) => (
                format!("{p}layers.{i}.post_attention_layernorm.weight"),
                c.hidden_size,
            ),
            NormRole::Q(i) | NormRole::K(i) if !c.has_qk_norm() => {
                anyhow::bail!("layer {i}: {:?} has no q/k norm", c.arch)
            }
            NormRole::Q(i) => (format!("{p}layers.{i}.self_attn.q_norm.weight"), c.head_dim),
            NormRole::K(i) => (format!("{p}layers.{i}.self_attn.k_norm.weight"), c.head_dim),
            NormRole::Final => (format!("{p}norm.weight"), c.hidden_size),
            NormRole::GdnNorm(i) => {
                let dv = c.hybrid.as_ref().map_or(0, |h| h.value_head_dim);
                return self.floats(&format!("{p}layers.{i}.linear_attn.norm.weight"), dv);
            }
        };
        let mut v = self.floats(&name, len)?;
        if c.arch == crate::runtime::config::Arch::Qwen35 {
            v.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(v)
    }

    /// The Gated-DeltaNet parameters of layer `layer` other than its linears, as f32:
    /// `conv1d.weight` (`[conv_dim, 1, K]` read as `[conv_dim][K]`), `A_log` and `dt_bias`
    /// (one per value head).
    ///
    /// # Errors
    /// Missing, of the wrong size or dtype; a layer that is not Gated-DeltaNet.
    pub fn gdn_params(&self, layer: usize) -> anyhow::Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let h = self
            .config
            .hybrid
            .as_ref()
            .filter(|_| self.config.layer_type(layer) == crate::runtime::hybrid::LayerType::Gdn)
            .ok_or_else(|| anyhow::anyhow!("layer {layer} is not a Gated-DeltaNet layer"))?;
        let p = format!("{}layers.{layer}.linear_attn", self.prefix);
        let conv_name = format!("{p}.conv1d.weight");
        let t = self.loc(&conv_name)?;
        let want = [h.conv_dim(), 1, h.conv_kernel];
        if t.shape != want && t.shape != [h.conv_dim(), h.conv_kernel] {
            return Err(self.bad(
                t,
                &conv_name,
                format!("shape {:?}; expected {want:?}", t.shape),
            ));
        }
        Ok((
            self.floats(&conv_name, h.conv_dim() * h.conv_kernel)?,
            self.floats(&format!("{p}.A_log"), h.num_value_heads)?,
            self.floats(&format!("{p}.dt_bias"), h.num_value_heads)?,
        ))
    }

    fn kv_scales_checked(&self, layer: usize) -> anyhow::Result<(Option<f32>, Option<f32>)> {
        let p = format!("{}layers.{layer}", self.prefix);
        let first = |names: [String; 3]| -> anyhow::Result<Option<f32>> {
            for n in names {
                if self.tensors.contains_key(&n) {
                    return self.positive_scalar(&n).map(Some);
                }
            }
            Ok(None)
        };
        Ok((
            first([
                format!("{p}.self_attn.k_proj.k_scale"),
                format!("{p}.self_attn.k_scale"),
                format!("{p}.self_attn.attn.k_scale"),
            ])?,
            first([
                format!("{p}.self_attn.v_proj.v_scale"),
                format!("{p}.self_attn.v_scale"),
                format!("{p}.self_attn.attn.v_scale"),
            ])?,
        ))
    }

    /// FP8 KV-cache scales of layer `layer` (K, V): ModelOpt's `self_attn.k_proj.k_scale`, or
    /// vLLM / compressed-tensors' `self_attn.k_scale` / `self_attn.attn.k_scale`; `None` where
    /// absent (checked positive and finite at [`Self::open`]).
    pub fn kv_scales(&self, layer: usize) -> (Option<f32>, Option<f32>) {
        self.kv_scales_checked(layer).unwrap_or((None, None))
    }

    /// The CPU backend's owned weights, built tensor by tensor from the mapping.
    ///
    /// # Errors
    /// As [`Self::linear`] and [`Self::norm`].
    pub fn to_weights(&self) -> anyhow::Result<ModelWeights> {
        let c = &self.config;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let lin = |r: LinearRole| self.linear_owned(i, r);
            if c.layer_type(i) == crate::runtime::hybrid::LayerType::Gdn {
                let (conv_w, a_log, dt_bias) = self.gdn_params(i)?;
                let gdn = super::GdnWeights {
                    qkv: lin(LinearRole::GdnQkv)?,
                    z: lin(LinearRole::GdnZ)?,
                    a: lin(LinearRole::GdnA)?,
                    b: lin(LinearRole::GdnB)?,
                    out: lin(LinearRole::GdnOut)?,
                    conv_w,
                    a_log,
                    dt_bias,
                    norm: self.norm(NormRole::GdnNorm(i))?,
                };
                let layer = LayerWeights::gdn_layer(
                    self.norm(NormRole::Input(i))?,
                    gdn,
                    self.norm(NormRole::Post(i))?,
                    self.dense_mlp(i)?,
                );
                layers.push(self.with_experts(i, layer)?);
                continue;
            }
            let [gate, up, down] = self.dense_mlp(i)?;
            let (k_scale, v_scale) = self.kv_scales(i);
            layers.push(LayerWeights {
                input_norm: self.norm(NormRole::Input(i))?,
                q: lin(LinearRole::Q)?,
                k: lin(LinearRole::K)?,
                v: lin(LinearRole::V)?,
                o: lin(LinearRole::O)?,
                q_norm: if c.has_qk_norm() {
                    Some(self.norm(NormRole::Q(i))?)
                } else {
                    None
                },
                k_norm: if c.has_qk_norm() {
                    Some(self.norm(NormRole::K(i))?)
                } else {
                    None
                },
                post_norm: self.norm(NormRole::Post(i))?,
                gate,
                up,
                down,
                k_scale,
                v_scale,
                gdn: None,
                moe: None,
            });
            let last = layers.pop().expect("pushed above");
            layers.push(self.with_experts(i, last)?);
        }
        let embed = self.owned(
            &LinearTensors::Plain {
                weight: self.embed_name(),
            },
            c.vocab_size,
            c.hidden_size,
        )?;
        let lm_head = match &self.lm_head {
            None => None,
            Some(t) => Some(self.owned(t, c.vocab_size, c.hidden_size)?),
        };
        Ok(ModelWeights {
            config: c.clone(),
            embed,
            layers,
            norm: self.norm(NormRole::Final)?,
            lm_head,
        })
    }
}

/// The prefix of the language model's tensors, from which embedding is present:
/// `model.language_model.` (transformers 5's multimodal wrappers), `language_model.model.`
/// (older wrappers), else `model.`.
fn lm_prefix(has: &dyn Fn(&str) -> bool) -> String {
    for p in ["model.language_model.", "language_model.model."] {
        if has(&format!("{p}embed_tokens.weight")) {
            return p.to_string();
        }
    }
    "model.".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::cpu::CpuBackend;
    use crate::runtime::direct::DirectSession;
    use crate::runtime::weights::synthesize;
    use crate::runtime::weights::tests::write_checkpoint;
    use crate::runtime::KvCacheDtype;

    /// What `inspect` and the loader pass (the runtime's config.json reading is always
    /// consulted).
    fn with_runtime_reader() -> crate::checkpoint::InspectOptions {
        crate::checkpoint::InspectOptions::default()
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/checkpoints")
            .join(name)
    }

    fn open(dir: &Path) -> anyhow::Result<MappedCheckpoint> {
        let c = ModelConfig::read_hf_config(&dir.join("config.json"))?.config;
        MappedCheckpoint::open(dir, &c)
    }

    #[test]
    fn committed_checkpoints_of_every_convention_load_and_run() {
        for (name, fmt, tied) in [
            ("llama-bf16", WeightFormat::Bf16, true),
            ("llama-fp8-kv-no-scales", WeightFormat::Fp8, false),
            ("llama-ct-nvfp4", WeightFormat::Nvfp4, false),
        ] {
            let m = open(&fixture(name)).unwrap();
            assert_eq!(m.format(), fmt, "{name}");
            assert_eq!(m.lm_head().unwrap().is_none(), tied, "{name}");
            assert!(m.content_hash().starts_with("fnv1a64:") && m.content_hash().len() == 24);
            assert!(m.weight_bytes() > 0);
            let w = m.to_weights().unwrap();
            let mut b = CpuBackend::new(w, 1);
            let g = DirectSession::new(&mut b, 1, 16, 4, KvCacheDtype::Bf16, 64)
                .unwrap()
                .greedy(&[vec![1, 2, 3]], 4, false)
                .unwrap();
            assert_eq!(g[0].tokens.len(), 4);
        }
        // compressed-tensors stores the reciprocal of ModelOpt's per-tensor scale; the view is
        // always in ModelOpt's convention. W4A4 runs as W4A16, and says so.
        let dir = fixture("llama-ct-nvfp4");
        let m = open(&dir).unwrap();
        let LinearView::Nvfp4 {
            global_scale,
            n,
            k,
            packed,
            block_scales,
        } = m.linear(1, LinearRole::Down).unwrap()
        else {
            panic!("NVFP4 view expected")
        };
        let stored = m
            .floats("model.layers.1.mlp.down_proj.weight_global_scale", 1)
            .unwrap()[0];
        assert_eq!(global_scale, 1.0 / stored);
        assert_eq!((n, k, packed.len(), block_scales.len()), (16, 32, 256, 32));
        assert!(
            m.notes().iter().any(|n| n.contains("W4A16")),
            "{:?}",
            m.notes()
        );
    }

    #[test]
    fn views_borrow_the_mapping() {
        let m = open(&fixture("llama-bf16")).unwrap();
        let inside = |b: &[u8]| {
            m.shards.iter().any(|s| {
                let r = s.map.as_ptr_range();
                r.contains(&b.as_ptr()) && b.as_ptr_range().end <= r.end
            })
        };
        let LinearView::Bf16 { data, n, k } = m.linear(0, LinearRole::Q).unwrap() else {
            panic!()
        };
        assert_eq!(data.len(), 2 * n * k);
        assert!(inside(data), "the view is a slice of the mmap, not a copy");
        let LinearView::Bf16 { data, .. } = m.embed().unwrap() else {
            panic!()
        };
        assert!(inside(data));
        assert_eq!(m.kv_scales(0), (None, None));
    }

    #[test]
    fn refusals_carry_the_finding_id_inspect_gives() {
        // The hybrid MoE of NVIDIA's mixed recipe (NVFP4 experts and shared expert, FP8
        // attention and Gated-DeltaNet projections) loads and runs on the CPU backend.
        let dir = fixture("qwen36-mixed-clean");
        let m = open(&dir).unwrap();
        assert!(m.config().is_moe());
        let w = m.to_weights().unwrap();
        let e = &w.layers[0].moe.as_ref().unwrap().experts[0];
        assert_eq!(e.gate.format(), WeightFormat::Nvfp4);
        let mut cpu = CpuBackend::new(w, 1);
        let mut s = DirectSession::new(&mut cpu, 1, 16, 16, KvCacheDtype::Bf16, 16).unwrap();
        let rows = s.teacher_forced(0, &[1, 2, 3], &[4]).unwrap();
        assert!(rows.iter().flatten().all(|x| x.is_finite()));
        let r = crate::checkpoint::inspect(&dir, &with_runtime_reader()).unwrap();
        assert!(r.findings_of("runtime-unsupported").is_empty());
        // The same with an activation the runtime does not implement: runtime-unsupported,
        // the same id inspect reports (as info).
        let bad = tempfile::tempdir().unwrap();
        for f in ["hf_quant_config.json", "model.safetensors"] {
            std::fs::copy(dir.join(f), bad.path().join(f)).unwrap();
        }
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        cfg["text_config"]["hidden_act"] = serde_json::json!("gelu");
        std::fs::write(bad.path().join("config.json"), cfg.to_string()).unwrap();
        let e = format!(
            "{:#}",
            MappedCheckpoint::open(bad.path(), &ModelConfig::tiny()).unwrap_err()
        );
        assert!(
            e.contains("[runtime-unsupported]") && e.contains("gelu"),
            "{e}"
        );
        let r = crate::checkpoint::inspect(bad.path(), &with_runtime_reader()).unwrap();
        assert_eq!(r.findings_of("runtime-unsupported").len(), 1);
        // Quantized tensors without quantization metadata: inspect's metadata-tensor-mismatch.
        let mut w = synthesize(&ModelConfig::tiny(), 2);
        w.quantize(WeightFormat::Fp8).unwrap();
        let d = tempfile::tempdir().unwrap();
        write_checkpoint(d.path(), &w);
        std::fs::remove_file(d.path().join("hf_quant_config.json")).unwrap();
        let e = format!("{:#}", open(d.path()).unwrap_err());
        assert!(e.contains("[metadata-tensor-mismatch]"), "{e}");
        let r = crate::checkpoint::inspect(d.path(), &with_runtime_reader()).unwrap();
        assert!(!r.findings_of("metadata-tensor-mismatch").is_empty());
        assert!(r.findings_of("runtime-unsupported").is_empty());
        // An architecture the runtime does not run: named, with the supported ones listed.
        write_checkpoint(d.path(), &w);
        let cfg = std::fs::read_to_string(d.path().join("config.json")).unwrap();
        std::fs::write(
            d.path().join("config.json"),
            cfg.replace("\"qwen3\"", "\"mistral\""),
        )
        .unwrap();
        let e = format!(
            "{:#}",
            MappedCheckpoint::open(d.path(), &ModelConfig::tiny()).unwrap_err()
        );
        assert!(e.contains("mistral") && e.contains("qwen3, llama"), "{e}");
    }

    #[test]
    fn fp16_weights_convert_on_the_cpu_path_only_and_hash_covers_headers() {
        let w = synthesize(&ModelConfig::tiny(), 3);
        let d = tempfile::tempdir().unwrap();
        write_checkpoint(d.path(), &w);
        let bf16 = open(d.path()).unwrap();
        // A copy of the same files hashes alike.
        let d2 = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(d.path().join(f), d2.path().join(f)).unwrap();
        }
        assert_eq!(open(d2.path()).unwrap().content_hash(), bf16.content_hash());
        // Rewrite up_proj of layer 0 as FP16.
        let bytes = std::fs::read(d.path().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let target = "model.layers.0.mlp.up_proj.weight";
        let f16: Vec<u8> = st
            .tensor(target)
            .unwrap()
            .data()
            .chunks_exact(2)
            .flat_map(|b| {
                half::f16::from_f32(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).to_le_bytes()
            })
            .collect();
        let mut views: Vec<(String, safetensors::tensor::TensorView)> = Vec::new();
        for (name, v) in st.tensors() {
            if name == target {
                views.push((
                    name,
                    safetensors::tensor::TensorView::new(Dtype::F16, v.shape().to_vec(), &f16)
                        .unwrap(),
                ));
            } else {
                views.push((name, v));
            }
        }
        let out = safetensors::serialize(views, None).unwrap();
        std::fs::write(d2.path().join("model.safetensors"), out).unwrap();
        let m = open(d2.path()).unwrap();
        assert_ne!(
            m.content_hash(),
            bf16.content_hash(),
            "a dtype change is in the headers"
        );
        let e = m.linear(0, LinearRole::Up).unwrap_err().to_string();
        assert!(e.contains("F16") && e.contains("BF16 weights only"), "{e}");
        // Converted to BF16 (round to nearest even) from the FP16 values.
        let want: Vec<f32> = f16
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let want = Linear::bf16_from_f32(192, 64, &want);
        assert!(m.linear_owned(0, LinearRole::Up).unwrap() == want);
        assert!(m.to_weights().unwrap().layers[0].up == want);
        assert!(m.to_weights().unwrap().layers[0].gate == w.layers[0].gate);
    }
}
