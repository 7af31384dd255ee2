//! Modules: grouping tensors into modules, reading a module's format from its tensors (the
//! evidence), the module list implied by config.json when there are no safetensors headers,
//! and the grouped per-module table.
//!
//! Tensor conventions recognized:
//! - ModelOpt NVFP4: `weight` U8 `[N, K/2]` (two E2M1 per byte) + `weight_scale` F8_E4M3
//!   `[N, K/16]` + `weight_scale_2` F32 scalar; `input_scale` F32 present for W4A4.
//! - ModelOpt / compressed-tensors FP8: `weight` F8_E4M3 + `weight_scale` (scalar: per-tensor,
//!   `[N]`/`[N, 1]`: per-channel, `[⌈N/b⌉, ⌈K/b⌉]`: block) or DeepSeek's `weight_scale_inv`;
//!   `input_scale` present for static activation scales.
//! - compressed-tensors NVFP4 (`nvfp4-pack-quantized`): `weight_packed` U8 `[N, K/2]` +
//!   `weight_scale` F8_E4M3 `[N, K/16]` + `weight_global_scale` F32 `[1]`;
//!   `input_global_scale` present for W4A4.
//! - compressed-tensors INT4 (`pack-quantized`): `weight_packed` I32 `[N, K/8]` +
//!   `weight_scale` `[N, K/g]`; GPTQ/AWQ `qweight` + `scales`.
//! - MXFP4 (gpt-oss): `<name>_blocks` U8 + `<name>_scales` U8 (E8M0 per 32).
//!
//! Expert tensors may carry a leading expert dimension (`[E, N, K/2]`); checks use the last
//! two dimensions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::config::ModelFacts;
use super::format::ModuleFormat;
use super::headers::TensorMeta;
use super::quant::ModClass;

/// Kinds of layers, for grouping the module table and for the lint rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Token embeddings.
    Embedding,
    /// Full (softmax) attention projections.
    FullAttention,
    /// Gated-DeltaNet linear-attention projections and convolution.
    LinearAttention,
    /// Dense MLP.
    Mlp,
    /// Routed MoE experts.
    MoeExperts,
    /// Shared expert(s) of an MoE layer.
    SharedExpert,
    /// MoE router gate.
    Router,
    /// Output projection to the vocabulary.
    LmHead,
    /// MTP (multi-token prediction) draft head.
    Mtp,
    /// Vision tower of a multimodal wrapper.
    Vision,
    /// Anything else.
    Other,
}

impl LayerKind {
    /// Words for tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::Embedding => "embeddings",
            Self::FullAttention => "full attention",
            Self::LinearAttention => "linear attention (Gated-DeltaNet)",
            Self::Mlp => "MLP",
            Self::MoeExperts => "MoE routed experts",
            Self::SharedExpert => "MoE shared expert",
            Self::Router => "MoE router",
            Self::LmHead => "lm_head",
            Self::Mtp => "MTP draft head",
            Self::Vision => "vision tower",
            Self::Other => "other",
        }
    }
}

/// Tensor suffixes that belong to a module (the part after the module name).
const SUFFIXES: &[&str] = &[
    "weight",
    "bias",
    "weight_scale",
    "weight_scale_2",
    "weight_scale_inv",
    "input_scale",
    "weight_packed",
    "weight_global_scale",
    "input_global_scale",
    "weight_zero_point",
    "weight_g_idx",
    "weight_shape",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
    "k_scale",
    "v_scale",
    "q_scale",
    "prob_scale",
    "pre_quant_scale",
    "output_scale",
];

/// One module: its name, what it is, and its tensors (by suffix) when headers were read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Module {
    pub name: String,
    pub kind: LayerKind,
    pub class: ModClass,
    /// Decoder (or MTP / vision block) layer index.
    pub layer: Option<u32>,
    /// suffix → tensor (empty for modules inferred from config.json).
    pub tensors: BTreeMap<String, TensorMeta>,
    /// For inferred modules: weight `[N, K]` and how many such matrices (experts).
    pub est_nk: Option<(u64, u64)>,
    pub multiplicity: u64,
    /// Parameters that are not a 2-D GEMM weight (conv, inferred only).
    pub est_params: u64,
}

/// Split a tensor name into (module, suffix).
fn split_name(name: &str) -> (String, String) {
    for s in ["_blocks", "_scales"] {
        if let Some(base) = name.strip_suffix(s) {
            if !base.ends_with('.') && base.rsplit('.').next().is_some_and(|l| l.contains("proj")) {
                return (base.to_string(), s.trim_start_matches('_').to_string());
            }
        }
    }
    match name.rsplit_once('.') {
        Some((m, s)) if SUFFIXES.contains(&s) => (m.to_string(), s.to_string()),
        // Fused expert parameters stored without a `.weight` suffix
        // (transformers v5: `mlp.experts.gate_up_proj` [E, 2I, H]).
        Some((_, last)) if last.ends_with("_proj") => (name.to_string(), "weight".to_string()),
        _ => (name.to_string(), String::new()),
    }
}

/// The layer index in a name: the first all-digit component after `layers`, `h`, `blocks`
/// or `layer`.
pub(crate) fn layer_index(name: &str) -> Option<u32> {
    let parts: Vec<&str> = name.split('.').collect();
    for w in parts.windows(2) {
        if matches!(w[0], "layers" | "h" | "blocks" | "layer") {
            if let Ok(i) = w[1].parse::<u32>() {
                return Some(i);
            }
        }
    }
    None
}

/// The name with every all-digit component replaced by `*`.
pub(crate) fn name_pattern(name: &str) -> String {
    name.split('.')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Classify a module by its name (and the model's MTP convention).
pub(crate) fn classify(name: &str, facts: &ModelFacts) -> (LayerKind, ModClass) {
    let last = name.rsplit('.').next().unwrap_or(name);
    let kind = if name.contains("visual") || name.contains("vision") || name.starts_with("vit.") {
        LayerKind::Vision
    } else if name.starts_with("mtp.")
        || name.contains(".mtp.")
        || name.starts_with("mtp_")
        || is_deepseek_mtp(name, facts)
    {
        LayerKind::Mtp
    } else if last == "lm_head" || name.ends_with(".lm_head") {
        LayerKind::LmHead
    } else if name.contains("embed_tokens") || last == "wte" || name.contains("word_embeddings") {
        LayerKind::Embedding
    } else if name.contains(".linear_attn.") {
        LayerKind::LinearAttention
    } else if name.contains(".shared_expert") {
        LayerKind::SharedExpert
    } else if name.contains(".experts.") || name.ends_with(".experts") {
        LayerKind::MoeExperts
    } else if name.ends_with(".mlp.gate") || name.ends_with(".router") || name.contains(".router.")
    {
        LayerKind::Router
    } else if name.contains(".self_attn.")
        || name.contains(".attn.")
        || name.contains(".attention.")
    {
        LayerKind::FullAttention
    } else if name.contains(".mlp.") || name.contains(".ffn.") || name.contains(".feed_forward.") {
        LayerKind::Mlp
    } else {
        LayerKind::Other
    };
    let class =
        if kind == LayerKind::Embedding || (last.contains("embed") && !last.contains("norm")) {
            ModClass::Embedding
        } else if kind == LayerKind::Router || name.ends_with(".mlp.gate") {
            ModClass::Router
        } else if last.contains("conv") || last.contains("norm") {
            ModClass::Other
        } else {
            ModClass::Linear
        };
    (kind, class)
}

/// DeepSeek V3 convention: MTP layers are `model.layers.{num_hidden_layers + i}`.
fn is_deepseek_mtp(name: &str, facts: &ModelFacts) -> bool {
    match (
        facts.mtp_field.as_deref(),
        facts.num_hidden_layers,
        layer_index(name),
    ) {
        (Some("num_nextn_predict_layers"), Some(n), Some(i)) => {
            (i as u64) >= n && name.contains("layers.")
        }
        _ => false,
    }
}

/// Group header tensors into modules. Tensors that are not a module's weight (norm weights,
/// `A_log`, biases without a GEMM weight) become modules too; [`Module::is_gemm_like`] tells
/// them apart.
pub(crate) fn modules_from_tensors(tensors: &[TensorMeta], facts: &ModelFacts) -> Vec<Module> {
    let mut map: BTreeMap<String, BTreeMap<String, TensorMeta>> = BTreeMap::new();
    for t in tensors {
        let (m, s) = split_name(&t.name);
        map.entry(m).or_default().insert(s, t.clone());
    }
    map.into_iter()
        .map(|(name, tensors)| {
            let (kind, class) = classify(&name, facts);
            Module {
                layer: layer_index(&name),
                name,
                kind,
                class,
                tensors,
                est_nk: None,
                multiplicity: 1,
                est_params: 0,
            }
        })
        .collect()
}

impl Module {
    /// A module shown in the table: a GEMM weight (≥ 2-D or packed), an embedding, or a conv.
    pub fn is_gemm_like(&self) -> bool {
        if self.tensors.is_empty() {
            return self.est_nk.is_some() || self.est_params > 0;
        }
        let w = self
            .tensors
            .get("weight")
            .or_else(|| self.tensors.get("weight_packed"))
            .or_else(|| self.tensors.get("qweight"))
            .or_else(|| self.tensors.get("blocks"));
        match w {
            Some(t) if t.dtype == super::headers::UNKNOWN_DTYPE => self.class != ModClass::Other,
            Some(t) => t.shape.len() >= 2,
            None => false,
        }
    }

    /// Bytes of all tensors of this module.
    pub fn bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.bytes).sum()
    }
}

/// What the tensors of a module say: its format, the evidence in words, and problems
/// (missing or mis-shaped scales) that make metadata and tensors disagree.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorEvidence {
    pub format: ModuleFormat,
    pub evidence: String,
    pub problems: Vec<String>,
    /// Group size read from shapes, for NVFP4/INT4.
    pub group_size: Option<u64>,
}

/// The NVFP4 verdict once the weight's evidence is collected: W4A4 when the activation scale
/// tensor `act_scale` (ModelOpt `input_scale`, compressed-tensors `input_global_scale`) is present,
/// W4A16 otherwise.
fn nvfp4_evidence(
    a4: bool,
    act_scale: &str,
    mut parts: Vec<String>,
    problems: Vec<String>,
    gs: Option<u64>,
) -> TensorEvidence {
    parts.push(if a4 {
        format!("{act_scale} present")
    } else {
        format!("no {act_scale}")
    });
    TensorEvidence {
        format: ModuleFormat::Nvfp4 {
            activations_4bit: a4,
            group_size: gs.unwrap_or(16).min(u32::MAX as u64) as u32,
        },
        evidence: parts.join(" + "),
        problems,
        group_size: gs,
    }
}

fn shape_str(s: &[u64]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn desc(suffix: &str, t: &TensorMeta) -> String {
    format!("{suffix} {} {}", t.dtype, shape_str(&t.shape))
}

/// Last two dims `[rows, cols]` of a ≥2-D tensor.
fn last2(t: &TensorMeta) -> Option<(u64, u64)> {
    let n = t.shape.len();
    (n >= 2).then(|| (t.shape[n - 2], t.shape[n - 1]))
}

fn lead(t: &TensorMeta) -> &[u64] {
    let n = t.shape.len();
    &t.shape[..n.saturating_sub(2)]
}

fn numel(t: &TensorMeta) -> u64 {
    t.shape.iter().product()
}

/// A module's format from its tensor names alone (index without shards): which scale tensors
/// exist. ModelOpt NVFP4: `weight_scale` + `weight_scale_2` (W4A4 with `input_scale`);
/// compressed-tensors NVFP4: `weight_packed` + `weight_global_scale` (W4A4 with
/// `input_global_scale`); a `weight_scale` alone: FP8; no scale at all: unquantized (16-bit
/// assumed; the dtype is unknown without the shard headers).
fn names_only_evidence(m: &Module) -> Option<TensorEvidence> {
    let t = &m.tensors;
    let has = |s: &str| t.contains_key(s);
    let names: Vec<&str> = t.keys().map(String::as_str).collect();
    let evidence = format!(
        "{} (names from the index; dtypes unknown without the shard headers)",
        names.join(" + ")
    );
    let format = if has("blocks") {
        ModuleFormat::Mxfp4
    } else if has("weight_packed") && has("weight_global_scale") {
        ModuleFormat::Nvfp4 {
            activations_4bit: has("input_global_scale"),
            group_size: 16,
        }
    } else if has("weight_packed") || has("qweight") {
        ModuleFormat::Int4 { group_size: None }
    } else if has("weight") && has("weight_scale") && has("weight_scale_2") {
        ModuleFormat::Nvfp4 {
            activations_4bit: has("input_scale"),
            group_size: 16,
        }
    } else if has("weight") && (has("weight_scale") || has("weight_scale_inv")) {
        ModuleFormat::Fp8 {
            scaling: "unknown".into(),
            activations: if has("input_scale") {
                "static".into()
            } else {
                "dynamic or weight-only".into()
            },
        }
    } else if has("weight") {
        ModuleFormat::Bf16
    } else {
        return None;
    };
    Some(TensorEvidence {
        format,
        evidence,
        problems: Vec::new(),
        group_size: None,
    })
}

/// Read a module's format from its tensors. `None` when the module has no weight tensor.
pub(crate) fn evidence(m: &Module) -> Option<TensorEvidence> {
    let t = &m.tensors;
    if !t.is_empty() && t.values().all(|x| x.dtype == super::headers::UNKNOWN_DTYPE) {
        return names_only_evidence(m);
    }
    let mut problems = Vec::new();
    let has = |s: &str| t.contains_key(s);
    let mut parts: Vec<String> = Vec::new();

    // MXFP4 (gpt-oss style).
    if let Some(b) = t.get("blocks") {
        parts.push(desc("blocks", b));
        match t.get("scales") {
            Some(s) => parts.push(desc("scales", s)),
            None => problems.push("MXFP4 blocks without their _scales tensor".into()),
        }
        return Some(TensorEvidence {
            format: ModuleFormat::Mxfp4,
            evidence: parts.join(" + "),
            problems,
            group_size: Some(32),
        });
    }

    // compressed-tensors packed weights.
    if let Some(p) = t.get("weight_packed") {
        return Some(packed_evidence(t, p, parts, problems));
    }

    // GPTQ / AWQ.
    if let Some(q) = t.get("qweight") {
        parts.push(desc("qweight", q));
        if let Some(s) = t.get("scales") {
            parts.push(desc("scales", s));
        } else {
            problems.push("qweight without scales".into());
        }
        return Some(TensorEvidence {
            format: ModuleFormat::Int4 { group_size: None },
            evidence: parts.join(" + "),
            problems,
            group_size: None,
        });
    }

    let w = t.get("weight")?;
    parts.push(desc("weight", w));
    let format = match w.dtype.as_str() {
        "BF16" => ModuleFormat::Bf16,
        "F16" => ModuleFormat::F16,
        "F32" => ModuleFormat::F32,
        "U8" => {
            // ModelOpt NVFP4.
            let gs = modelopt_nvfp4_scales(t, w, &mut parts, &mut problems);
            return Some(nvfp4_evidence(
                has("input_scale"),
                "input_scale",
                parts,
                problems,
                gs,
            ));
        }
        "F8_E4M3" | "F8_E5M2" | "F8_E4M3FNUZ" => fp8_format(t, w, &mut parts, &mut problems),
        "I8" => ModuleFormat::Int8,
        other => ModuleFormat::Other {
            name: format!("{other} weights"),
        },
    };
    Some(TensorEvidence {
        format,
        evidence: parts.join(" + "),
        problems,
        group_size: None,
    })
}

/// compressed-tensors packed weights (`weight_packed`, `p`): NVFP4 (U8, E4M3 block scales and
/// a global scale), MXFP4 (U8 with E8M0 scales), or INT4 (I32 words of 8 nibbles).
fn packed_evidence(
    t: &BTreeMap<String, TensorMeta>,
    p: &TensorMeta,
    mut parts: Vec<String>,
    mut problems: Vec<String>,
) -> TensorEvidence {
    let has = |s: &str| t.contains_key(s);
    parts.push(desc("weight_packed", p));
    let scale = t.get("weight_scale");
    if let Some(s) = scale {
        parts.push(desc("weight_scale", s));
    }
    if p.dtype == "U8" {
        // NVFP4 (or MXFP4 with E8M0 scales).
        let mxfp4 = scale.is_some_and(|s| s.dtype == "U8" || s.dtype == "F8_E8M0");
        let mut gs = None;
        match (scale, last2(p)) {
            (None, _) => problems.push("packed 4-bit weight without weight_scale".into()),
            (Some(s), Some((n, half_k))) => {
                if !mxfp4 && s.dtype != "F8_E4M3" {
                    problems.push(format!(
                        "weight_scale is {}, NVFP4 block scales are F8_E4M3",
                        s.dtype
                    ));
                }
                match last2(s) {
                    Some((sn, sk)) => {
                        if sn != n {
                            problems.push(format!("weight_scale rows {sn} ≠ weight rows {n}"));
                        }
                        if sk > 0 && (half_k * 2) % sk == 0 {
                            gs = Some(half_k * 2 / sk);
                        } else {
                            problems.push(format!(
                                "weight_scale {} does not divide K = {} into equal groups",
                                shape_str(&s.shape),
                                half_k * 2
                            ));
                        }
                    }
                    None => problems.push(format!(
                        "weight_scale {} is not [N, K/16]",
                        shape_str(&s.shape)
                    )),
                }
            }
            (Some(_), None) => problems.push(format!(
                "weight_packed {} is not [N, K/2]",
                shape_str(&p.shape)
            )),
        }
        if mxfp4 {
            return TensorEvidence {
                format: ModuleFormat::Mxfp4,
                evidence: parts.join(" + "),
                problems,
                group_size: gs,
            };
        }
        match t.get("weight_global_scale") {
            Some(g) => parts.push(desc("weight_global_scale", g)),
            None => problems.push("NVFP4 weight without weight_global_scale".into()),
        }
        return nvfp4_evidence(
            has("input_global_scale"),
            "input_global_scale",
            parts,
            problems,
            gs,
        );
    }
    // INT4 pack-quantized: I32 words of 8 nibbles.
    let gs = match (scale.and_then(last2), last2(p)) {
        (Some((_, sk)), Some((_, pk))) if sk > 0 && (pk * 8) % sk == 0 => Some(pk * 8 / sk),
        _ => None,
    };
    if scale.is_none() {
        problems.push("packed INT4 weight without weight_scale".into());
    }
    TensorEvidence {
        format: ModuleFormat::Int4 {
            group_size: gs.map(|g| g.min(u32::MAX as u64) as u32),
        },
        evidence: parts.join(" + "),
        problems,
        group_size: gs,
    }
}

/// The scales of a ModelOpt NVFP4 weight `w` (U8 `[N, K/2]`): `weight_scale` (E4M3
/// `[N, K/16]`) and `weight_scale_2` (an F32 scalar) described and checked; returns the group
/// size the block scales imply.
fn modelopt_nvfp4_scales(
    t: &BTreeMap<String, TensorMeta>,
    w: &TensorMeta,
    parts: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Option<u64> {
    let mut gs = None;
    match t.get("weight_scale") {
        None => problems.push("packed 4-bit weight (U8) without weight_scale".into()),
        Some(s) => {
            parts.push(desc("weight_scale", s));
            if s.dtype != "F8_E4M3" {
                problems.push(format!(
                    "weight_scale is {}, NVFP4 block scales are F8_E4M3",
                    s.dtype
                ));
            }
            match (last2(w), last2(s)) {
                (Some((n, half_k)), Some((sn, sk))) => {
                    if lead(w) != lead(s) {
                        problems.push(format!(
                            "weight {} and weight_scale {} disagree on the expert dimension",
                            shape_str(&w.shape),
                            shape_str(&s.shape)
                        ));
                    }
                    if sn != n {
                        problems.push(format!(
                            "weight_scale rows {sn} ≠ weight rows {n}; expected [N, K/16] = [{n}, {}]",
                            half_k * 2 / 16
                        ));
                    }
                    if sk > 0 && (half_k * 2) % sk == 0 {
                        gs = Some(half_k * 2 / sk);
                    } else {
                        problems.push(format!(
                            "weight_scale {} does not split K = {} (from weight [N, K/2]) into equal groups",
                            shape_str(&s.shape),
                            half_k * 2
                        ));
                    }
                }
                _ => problems.push(format!(
                    "weight {} / weight_scale {} are not [N, K/2] / [N, K/16]",
                    shape_str(&w.shape),
                    shape_str(&s.shape)
                )),
            }
        }
    }
    match t.get("weight_scale_2") {
        Some(s2) => {
            parts.push(desc("weight_scale_2", s2));
            if s2.dtype != "F32" || numel(s2) != 1 && lead(w).is_empty() {
                problems.push(format!(
                    "weight_scale_2 is {} {}, expected an F32 scalar",
                    s2.dtype,
                    shape_str(&s2.shape)
                ));
            }
        }
        None => problems.push("NVFP4 weight without weight_scale_2 (per-tensor scale)".into()),
    }
    gs
}

/// An FP8 weight `w`: its scaling (per-tensor, per-channel, block, from `weight_scale` or
/// `weight_scale_inv`) and activations (static with an `input_scale`).
fn fp8_format(
    t: &BTreeMap<String, TensorMeta>,
    w: &TensorMeta,
    parts: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> ModuleFormat {
    let has = |s: &str| t.contains_key(s);
    let scale = t
        .get("weight_scale")
        .map(|s| ("weight_scale", s))
        .or_else(|| t.get("weight_scale_inv").map(|s| ("weight_scale_inv", s)));
    let scaling = match scale {
        None => {
            problems.push("FP8 weight without weight_scale (would run at scale 1.0)".into());
            "no scale".to_string()
        }
        Some((sname, s)) => {
            parts.push(desc(sname, s));
            let (n, k) = last2(w).unwrap_or((0, 0));
            match (numel(s), last2(s)) {
                (1, _) => "per-tensor".to_string(),
                (_, Some((sn, 1))) if sn == n => "per-channel".to_string(),
                (c, None) if c == n => "per-channel".to_string(),
                (_, Some((sn, sk))) if sn > 0 && sk > 0 && n > 0 && k > 0 => {
                    let bn = n.div_ceil(sn);
                    let bk = k.div_ceil(sk);
                    if n.div_ceil(bn) == sn && k.div_ceil(bk) == sk {
                        format!("block {bn}x{bk}")
                    } else {
                        problems.push(format!(
                            "{sname} {} fits no per-tensor, per-channel or block layout of weight {}",
                            shape_str(&s.shape),
                            shape_str(&w.shape)
                        ));
                        "unknown".to_string()
                    }
                }
                _ => "unknown".to_string(),
            }
        }
    };
    let activations = if has("input_scale") {
        parts.push("input_scale present".into());
        "static"
    } else {
        parts.push("no input_scale".into());
        "dynamic or weight-only"
    };
    ModuleFormat::Fp8 {
        scaling,
        activations: activations.into(),
    }
}

/// The module list config.json implies, for checkpoints without safetensors headers, with
/// weight shapes for the footprint estimate. `Err(reason)` for architectures whose module
/// names rigbench does not model.
///
/// Shapes follow Hugging Face `transformers` modeling code: Llama/Qwen2/Qwen3 attention and
/// MLP; Qwen2/3-MoE experts and shared expert; Qwen3-Next (fused `in_proj_qkvz`,
/// `in_proj_ba`) and Qwen3.5/3.6 (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`)
/// Gated-DeltaNet; Qwen3.5 `attn_output_gate` doubles q_proj's rows; MTP as one decoder
/// layer plus `mtp.fc` `[H, 2H]`; the vision tower as `depth` blocks of qkv/proj/fc1/fc2.
pub(crate) fn modules_from_config(facts: &ModelFacts, prefix: &str) -> Result<Vec<Module>, String> {
    let mt = facts.lm_model_type().unwrap_or("unknown").to_string();
    check_modelled(&mt)?;
    let need = |v: Option<u64>, what: &str| v.ok_or_else(|| format!("config.json lacks {what}"));
    let h = need(facts.hidden_size, "hidden_size")?;
    let layers = need(facts.num_hidden_layers, "num_hidden_layers")?;
    let heads = need(facts.num_attention_heads, "num_attention_heads")?;
    let kv = need(facts.num_key_value_heads, "num_key_value_heads")?;
    let hd = need(facts.head_dim, "head_dim")?;
    let vocab = need(facts.vocab_size, "vocab_size")?;
    let moe = facts.num_experts.unwrap_or(0) > 0 && facts.moe_intermediate_size.is_some();
    if !moe && facts.intermediate_size.is_none() {
        return Err("config.json lacks intermediate_size".into());
    }
    let q_rows = heads
        * hd
        * if facts.attn_output_gate == Some(true) {
            2
        } else {
            1
        };
    let mut out = Vec::new();
    let mut push = |name: String, nk: Option<(u64, u64)>, mult: u64, params: u64| {
        let (kind, class) = classify(&name, facts);
        out.push(Module {
            layer: layer_index(&name),
            name,
            kind,
            class,
            tensors: BTreeMap::new(),
            est_nk: nk,
            multiplicity: mult,
            est_params: params,
        });
    };
    let fused_gdn = mt.starts_with("qwen3_next");
    let attn = |p: &str, push: &mut dyn FnMut(String, Option<(u64, u64)>, u64, u64)| {
        push(format!("{p}.self_attn.q_proj"), Some((q_rows, h)), 1, 0);
        push(
            format!("{p}.self_attn.k_proj"),
            Some((kv.saturating_mul(hd), h)),
            1,
            0,
        );
        push(
            format!("{p}.self_attn.v_proj"),
            Some((kv.saturating_mul(hd), h)),
            1,
            0,
        );
        push(
            format!("{p}.self_attn.o_proj"),
            Some((h, heads.saturating_mul(hd))),
            1,
            0,
        );
    };
    let mlp = |p: &str, push: &mut dyn FnMut(String, Option<(u64, u64)>, u64, u64)| {
        if moe {
            let e = facts.num_experts.unwrap_or(0);
            let mi = facts.moe_intermediate_size.unwrap_or(0);
            push(format!("{p}.mlp.gate"), Some((e, h)), 1, 0);
            for proj in ["gate_proj", "up_proj"] {
                push(format!("{p}.mlp.experts.0.{proj}"), Some((mi, h)), e, 0);
            }
            push(format!("{p}.mlp.experts.0.down_proj"), Some((h, mi)), e, 0);
            if let Some(si) = facts.shared_expert_intermediate_size.filter(|s| *s > 0) {
                push(
                    format!("{p}.mlp.shared_expert.gate_proj"),
                    Some((si, h)),
                    1,
                    0,
                );
                push(
                    format!("{p}.mlp.shared_expert.up_proj"),
                    Some((si, h)),
                    1,
                    0,
                );
                push(
                    format!("{p}.mlp.shared_expert.down_proj"),
                    Some((h, si)),
                    1,
                    0,
                );
                push(format!("{p}.mlp.shared_expert_gate"), Some((1, h)), 1, 0);
            }
        } else {
            let i = facts.intermediate_size.unwrap_or(0);
            push(format!("{p}.mlp.gate_proj"), Some((i, h)), 1, 0);
            push(format!("{p}.mlp.up_proj"), Some((i, h)), 1, 0);
            push(format!("{p}.mlp.down_proj"), Some((h, i)), 1, 0);
        }
    };
    push(format!("{prefix}embed_tokens"), Some((vocab, h)), 1, 0);
    for i in 0..layers {
        let p = format!("{prefix}layers.{i}");
        if facts.layer_type(i) == "linear_attention" {
            push_linear_attention(facts, &p, h, fused_gdn, &mut push)?;
        } else {
            attn(&p, &mut push);
        }
        mlp(&p, &mut push);
    }
    if facts.tie_word_embeddings != Some(true) {
        push("lm_head".into(), Some((vocab, h)), 1, 0);
    }
    if let Some(n) = facts.mtp_layers.filter(|n| *n > 0) {
        if facts.mtp_field.as_deref() == Some("mtp_num_hidden_layers") {
            push("mtp.fc".into(), Some((h, h.saturating_mul(2))), 1, 0);
            for i in 0..n {
                let p = format!("mtp.layers.{i}");
                attn(&p, &mut push);
                mlp(&p, &mut push);
            }
        }
    }
    push_vision(facts, &mut push);
    Ok(out)
}

/// `Err(reason)` for a `model_type` whose module names rigbench does not model.
fn check_modelled(mt: &str) -> Result<(), String> {
    let modelled = [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "gemma",
        "gemma2",
        "phi3",
        "granite",
        "olmo2",
        "mixtral",
    ];
    if !modelled.contains(&mt) {
        return Err(format!(
            "module names of model_type '{mt}' are not modelled by rigbench; they come only from safetensors headers"
        ));
    }
    Ok(())
}

/// The Gated-DeltaNet mixer of layer `p` (hidden size `h`): Qwen3-Next's fused `in_proj_qkvz`
/// and `in_proj_ba` (`fused_gdn`), else Qwen3.5/3.6's four input projections; conv1d and
/// out_proj.
fn push_linear_attention(
    facts: &ModelFacts,
    p: &str,
    h: u64,
    fused_gdn: bool,
    push: &mut dyn FnMut(String, Option<(u64, u64)>, u64, u64),
) -> Result<(), String> {
    let need = |v: Option<u64>, what: &str| v.ok_or_else(|| format!("config.json lacks {what}"));
    let la = facts
        .linear_attention
        .clone()
        .ok_or("config.json has linear_attention layers but no linear_* dimensions")?;
    let nk = need(la.num_key_heads, "linear_num_key_heads")?;
    let nv = need(la.num_value_heads, "linear_num_value_heads")?;
    let dk = need(la.key_head_dim, "linear_key_head_dim")?;
    let dv = need(la.value_head_dim, "linear_value_head_dim")?;
    let ck = la.conv_kernel.unwrap_or(4);
    let key_dim = nk.saturating_mul(dk);
    let value_dim = nv.saturating_mul(dv);
    if fused_gdn {
        push(
            format!("{p}.linear_attn.in_proj_qkvz"),
            Some((key_dim.saturating_add(value_dim).saturating_mul(2), h)),
            1,
            0,
        );
        push(
            format!("{p}.linear_attn.in_proj_ba"),
            Some((2 * nv, h)),
            1,
            0,
        );
    } else {
        push(
            format!("{p}.linear_attn.in_proj_qkv"),
            Some((key_dim.saturating_mul(2).saturating_add(value_dim), h)),
            1,
            0,
        );
        push(
            format!("{p}.linear_attn.in_proj_z"),
            Some((value_dim, h)),
            1,
            0,
        );
        push(format!("{p}.linear_attn.in_proj_b"), Some((nv, h)), 1, 0);
        push(format!("{p}.linear_attn.in_proj_a"), Some((nv, h)), 1, 0);
    }
    push(
        format!("{p}.linear_attn.conv1d"),
        None,
        1,
        key_dim
            .saturating_mul(2)
            .saturating_add(value_dim)
            .saturating_mul(ck),
    );
    push(
        format!("{p}.linear_attn.out_proj"),
        Some((h, value_dim)),
        1,
        0,
    );
    Ok(())
}

/// The vision tower's blocks (qkv, proj, fc1, fc2), when config.json gives its depth and sizes.
fn push_vision(facts: &ModelFacts, push: &mut dyn FnMut(String, Option<(u64, u64)>, u64, u64)) {
    if let Some(v) = &facts.vision {
        if let (Some(d), Some(vh), Some(vi)) = (v.depth, v.hidden_size, v.intermediate_size) {
            for b in 0..d {
                let p = format!("model.visual.blocks.{b}");
                push(
                    format!("{p}.attn.qkv"),
                    Some((vh.saturating_mul(3), vh)),
                    1,
                    0,
                );
                push(format!("{p}.attn.proj"), Some((vh, vh)), 1, 0);
                push(format!("{p}.mlp.linear_fc1"), Some((vi, vh)), 1, 0);
                push(format!("{p}.mlp.linear_fc2"), Some((vh, vi)), 1, 0);
            }
        }
    }
}

/// The module-name prefix of the language model: what the metadata uses if it says, else
/// `model.language_model.` for multimodal wrappers and `model.` otherwise.
pub(crate) fn lm_prefix(facts: &ModelFacts, names_in_metadata: &[&str]) -> String {
    for cand in ["model.language_model.", "language_model.model.", "model."] {
        if names_in_metadata
            .iter()
            .any(|n| n.starts_with(&format!("{cand}layers.")))
        {
            return cand.to_string();
        }
    }
    if facts.from_text_config {
        "model.language_model.".into()
    } else {
        "model.".into()
    }
}

/// Compress a set of indices into ranges: `0-2, 4-6, 8`.
pub(crate) fn ranges(set: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = set.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if out.len() > 6 {
        let n = out.len();
        format!("{}, …, {}", out[..3].join(", "), out[n - 2..].join(", "))
    } else {
        out.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dtype: &str, shape: &[u64]) -> TensorMeta {
        TensorMeta {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            bytes: 0,
            file: "m".into(),
        }
    }

    fn module(ts: Vec<TensorMeta>) -> Module {
        modules_from_tensors(&ts, &ModelFacts::default())
            .into_iter()
            .next()
            .unwrap()
    }

    #[test]
    fn names_and_patterns() {
        assert_eq!(
            split_name("model.layers.3.mlp.down_proj.weight_scale_2"),
            (
                "model.layers.3.mlp.down_proj".into(),
                "weight_scale_2".into()
            )
        );
        assert_eq!(
            split_name("model.layers.0.mlp.experts.gate_up_proj_blocks"),
            (
                "model.layers.0.mlp.experts.gate_up_proj".into(),
                "blocks".into()
            )
        );
        assert_eq!(split_name("model.layers.0.linear_attn.A_log").1, "");
        assert_eq!(
            layer_index("model.language_model.layers.12.mlp.experts.3.up_proj"),
            Some(12)
        );
        assert_eq!(
            name_pattern("model.layers.12.mlp.experts.3.up_proj"),
            "model.layers.*.mlp.experts.*.up_proj"
        );
        let mut s = BTreeSet::new();
        s.extend([0, 1, 2, 4, 5, 6, 9]);
        assert_eq!(ranges(&s), "0-2, 4-6, 9");
    }

    #[test]
    fn classifies_kinds() {
        let f = ModelFacts::default();
        assert_eq!(
            classify("model.layers.0.linear_attn.in_proj_a", &f).0,
            LayerKind::LinearAttention
        );
        assert_eq!(
            classify("model.layers.0.linear_attn.conv1d", &f).1,
            ModClass::Other
        );
        assert_eq!(
            classify("mtp.layers.0.mlp.experts.1.up_proj", &f).0,
            LayerKind::Mtp
        );
        assert_eq!(
            classify("model.visual.blocks.0.attn.qkv", &f).0,
            LayerKind::Vision
        );
        assert_eq!(
            classify("model.layers.0.mlp.gate", &f),
            (LayerKind::Router, ModClass::Router)
        );
        assert_eq!(classify("model.embed_tokens", &f).1, ModClass::Embedding);
        assert_eq!(classify("lm_head", &f).0, LayerKind::LmHead);
        let ds = ModelFacts {
            num_hidden_layers: Some(2),
            mtp_layers: Some(1),
            mtp_field: Some("num_nextn_predict_layers".into()),
            ..Default::default()
        };
        assert_eq!(
            classify("model.layers.2.mlp.down_proj", &ds).0,
            LayerKind::Mtp
        );
        assert_eq!(
            classify("model.layers.1.mlp.down_proj", &ds).0,
            LayerKind::Mlp
        );
    }

    #[test]
    fn modelopt_nvfp4_evidence() {
        let m = module(vec![
            t("l.weight", "U8", &[64, 32]),
            t("l.weight_scale", "F8_E4M3", &[64, 4]),
            t("l.weight_scale_2", "F32", &[]),
        ]);
        let e = evidence(&m).unwrap();
        assert_eq!(
            e.format,
            ModuleFormat::Nvfp4 {
                activations_4bit: false,
                group_size: 16
            }
        );
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        assert!(e.evidence.contains("weight U8 [64, 32]"));
        // Group 32 and a wrong scale dtype are problems the lint turns into errors.
        let m = module(vec![
            t("l.weight", "U8", &[64, 32]),
            t("l.weight_scale", "F32", &[64, 2]),
            t("l.input_scale", "F32", &[]),
        ]);
        let e = evidence(&m).unwrap();
        assert_eq!(e.group_size, Some(32));
        assert!(e.problems.iter().any(|p| p.contains("F8_E4M3")));
        assert!(e.problems.iter().any(|p| p.contains("weight_scale_2")));
        assert!(matches!(
            e.format,
            ModuleFormat::Nvfp4 {
                activations_4bit: true,
                ..
            }
        ));
    }

    #[test]
    fn degenerate_shapes_do_not_panic() {
        for (w, sc) in [
            (
                t("l.weight", "F8_E4M3", &[0, 0]),
                t("l.weight_scale", "F32", &[0, 0]),
            ),
            (
                t("l.weight", "F8_E4M3", &[4]),
                t("l.weight_scale", "F32", &[3, 2]),
            ),
            (
                t("l.weight", "U8", &[0, 0]),
                t("l.weight_scale", "F8_E4M3", &[0, 0]),
            ),
            (
                t("l.weight", "U8", &[5]),
                t("l.weight_scale", "F8_E4M3", &[]),
            ),
        ] {
            let m = module(vec![w, sc]);
            let _ = evidence(&m);
        }
        let m = module(vec![
            t("l.weight_packed", "U8", &[0, 0]),
            t("l.weight_scale", "F8_E4M3", &[0, 0]),
        ]);
        let _ = evidence(&m);
        let m = module(vec![
            t("l.weight_packed", "I32", &[4]),
            t("l.weight_scale", "BF16", &[]),
        ]);
        let _ = evidence(&m);
        assert_eq!(
            split_name("model.layers.0.mlp.experts.gate_up_proj"),
            (
                "model.layers.0.mlp.experts.gate_up_proj".into(),
                "weight".into()
            )
        );
    }

    #[test]
    fn fp8_and_compressed_tensors_evidence() {
        let m = module(vec![
            t("l.weight", "F8_E4M3", &[256, 512]),
            t("l.weight_scale_inv", "F32", &[2, 4]),
        ]);
        let e = evidence(&m).unwrap();
        assert_eq!(
            e.format,
            ModuleFormat::Fp8 {
                scaling: "block 128x128".into(),
                activations: "dynamic or weight-only".into()
            }
        );
        let m = module(vec![t("l.weight", "F8_E4M3", &[16, 16])]);
        assert!(!evidence(&m).unwrap().problems.is_empty());
        let m = module(vec![
            t("l.weight_packed", "U8", &[32, 32]),
            t("l.weight_scale", "F8_E4M3", &[32, 4]),
            t("l.weight_global_scale", "F32", &[1]),
            t("l.input_global_scale", "F32", &[1]),
        ]);
        let e = evidence(&m).unwrap();
        assert_eq!(
            e.format,
            ModuleFormat::Nvfp4 {
                activations_4bit: true,
                group_size: 16
            }
        );
        assert!(e.problems.is_empty(), "{:?}", e.problems);
    }
}
