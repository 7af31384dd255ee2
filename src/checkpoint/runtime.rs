//! What rigbench's built-in runtime can run: the one place that knows which checkpoint formats
//! and tensor conventions the runtime loads. `inspect` reports its verdict as a finding, and the
//! runtime's loader (`crate::runtime::weights::MappedCheckpoint::open`) refuses with the same
//! finding id:
//!
//! - an error finding that makes the tensors unloadable ([`BLOCKING_RULES`]:
//!   `metadata-tensor-mismatch`, `nvfp4-group-size`, `safetensors-truncated`, `index-mismatch`)
//!   refuses with that rule's id;
//! - anything else the runtime does not implement (another `model_type` or architecture, a RoPE
//!   type, sliding-window layers, mixture-of-experts MLPs of a family it does not run, a weight
//!   format) is [`RUNTIME_UNSUPPORTED`], an info finding in `inspect` (the checkpoint may be fine
//!   for another engine). Gated-DeltaNet hybrids of the Qwen3.5 / 3.6 family run, dense or
//!   mixture-of-experts (and Qwen3-MoE), each module in its own format (ModelOpt
//!   `MIXED_PRECISION` exports load per module); the vision tower of their multimodal wrapper is
//!   not loaded.
//!
//! Formats the runtime runs, per decoder linear layer (and lm_head): BF16 (FP16 and FP32 are
//! converted to BF16 on the CPU path); FP8 E4M3 with a per-tensor or per-channel scale, static
//! (`input_scale`) or dynamic activations (ModelOpt FP8, compressed-tensors FP8); NVFP4 with
//! group 16 in both conventions, run as W4A16 (any activation scale of a W4A4 export unused):
//!
//! | convention | packed E2M1 `[N, K/2]` | E4M3 block scales `[N, K/16]` | FP32 per-tensor scale |
//! |---|---|---|---|
//! | ModelOpt | `weight` (U8) | `weight_scale` | `weight_scale_2` = amax / (6·448) |
//! | compressed-tensors `nvfp4-pack-quantized` | `weight_packed` (U8) | `weight_scale` | `weight_global_scale` = (6·448) / amax (the reciprocal) |
//!
//! The embedding must be unquantized.

use serde::{Deserialize, Serialize};

use super::format::ModuleFormat;
use super::modules::LayerKind;
use super::{InspectReport, ModuleRow, Severity};
use crate::model::HfConfig;

/// The finding id of a checkpoint the built-in runtime cannot run (info in `inspect`).
pub const RUNTIME_UNSUPPORTED: &str = "runtime-unsupported";

/// Error findings that make a checkpoint's tensors unloadable; the runtime refuses with them.
pub const BLOCKING_RULES: &[&str] = &[
    "metadata-tensor-mismatch",
    "nvfp4-group-size",
    "safetensors-truncated",
    "index-mismatch",
];

/// Why the built-in runtime will not run a checkpoint: a finding id and the detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeRefusal {
    /// The finding id (`runtime-unsupported` or one of [`BLOCKING_RULES`]).
    pub rule: String,
    /// What was found.
    pub detail: String,
}

impl std::fmt::Display for RuntimeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the built-in runtime cannot run this checkpoint [{}]: {}",
            self.rule, self.detail
        )
    }
}

impl std::error::Error for RuntimeRefusal {}

/// What the runtime will do with a checkpoint it accepts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSupport {
    /// Notes worth printing (W4A4 run as W4A16, MTP weights not loaded, ...).
    pub notes: Vec<String>,
}

fn refuse(detail: impl Into<String>) -> RuntimeRefusal {
    RuntimeRefusal {
        rule: RUNTIME_UNSUPPORTED.into(),
        detail: detail.into(),
    }
}

/// Formats of a decoder linear layer (or lm_head) that the runtime runs, in words.
pub const SUPPORTED_LINEAR_FORMATS: &str = "BF16 (FP16/FP32 converted), FP8 E4M3 per-tensor or per-channel (static or dynamic activations), NVFP4 group 16 (ModelOpt or compressed-tensors; run as W4A16)";

/// Whether the runtime runs a linear layer stored as `f`.
pub fn linear_format_supported(f: &ModuleFormat) -> bool {
    match f {
        ModuleFormat::Bf16 | ModuleFormat::F16 | ModuleFormat::F32 => true,
        ModuleFormat::Fp8 { scaling, .. } => scaling == "per-tensor" || scaling == "per-channel",
        ModuleFormat::Nvfp4 { group_size, .. } => *group_size == 16,
        _ => false,
    }
}

/// The support verdict from the runtime's reading of config.json
/// ([`crate::model::ConfigFile::runtime`]) and the module table (no lint findings).
///
/// # Errors
/// [`RUNTIME_UNSUPPORTED`] with the reason: the runtime's own config.json reader refuses the
/// config (model_type, architecture, RoPE, attention kind), or a module's format is outside
/// [`SUPPORTED_LINEAR_FORMATS`], or the embedding is quantized.
pub fn support(
    config: &Result<HfConfig, String>,
    modules: &[ModuleRow],
) -> Result<RuntimeSupport, RuntimeRefusal> {
    let mut s = RuntimeSupport::default();
    let hf = config
        .as_ref()
        .map_err(|e| refuse(format!("config.json: {e}")))?;
    // Whether config.json describes Gated-DeltaNet layers.
    let hybrid = Some(hf.config.is_hybrid());
    s.notes
        .extend(hf.warnings.iter().map(|w| format!("config.json: {w}")));
    for row in modules {
        match row.kind {
            LayerKind::LinearAttention if hybrid == Some(false) => {
                return Err(refuse(format!(
                    "{} ({}): config.json describes no Gated-DeltaNet layers",
                    row.module,
                    row.kind.label()
                )))
            }
            LayerKind::FullAttention
            | LayerKind::Mlp
            | LayerKind::LmHead
            | LayerKind::LinearAttention => {
                if !linear_format_supported(&row.format) {
                    return Err(refuse(format!(
                        "{} is {}; the runtime runs {SUPPORTED_LINEAR_FORMATS}",
                        row.module, row.format
                    )));
                }
                if let ModuleFormat::Nvfp4 {
                    activations_4bit: true,
                    ..
                } = row.format
                {
                    let note = "W4A4 NVFP4 modules run as W4A16 (activations stay BF16; the activation scales are not used)".to_string();
                    if !s.notes.contains(&note) {
                        s.notes.push(note);
                    }
                }
            }
            LayerKind::Embedding => {
                if row.format.is_quantized() {
                    return Err(refuse(format!(
                        "the embedding {} is {}; the runtime needs it unquantized (BF16, FP16 or FP32)",
                        row.module, row.format
                    )));
                }
            }
            LayerKind::Mtp => {
                let note =
                    "MTP draft-head weights are not loaded (the runtime drafts with n-grams)"
                        .to_string();
                if !s.notes.contains(&note) {
                    s.notes.push(note);
                }
            }
            // The text part of a Qwen3.5 / 3.6 wrapper runs; its vision tower is not loaded
            // (the config reader's note names it).
            LayerKind::Vision if hybrid != Some(false) => {}
            LayerKind::Vision => {
                return Err(refuse(format!(
                    "{}: vision towers are not supported (text decoders only)",
                    row.module
                )))
            }
            // Mixture-of-experts modules of a config the runtime reads as MoE (Qwen3-MoE,
            // Qwen3.5 / 3.6-MoE): each linear in a format it runs.
            LayerKind::MoeExperts | LayerKind::SharedExpert | LayerKind::Router
                if hf.config.is_moe() =>
            {
                if !linear_format_supported(&row.format) {
                    return Err(refuse(format!(
                        "{} is {}; the runtime runs {SUPPORTED_LINEAR_FORMATS}",
                        row.module, row.format
                    )));
                }
            }
            LayerKind::MoeExperts | LayerKind::SharedExpert | LayerKind::Router => {
                return Err(refuse(format!(
                    "{} ({}): config.json describes no mixture-of-experts MLP the runtime runs (it runs Qwen3-MoE and Qwen3.5 / 3.6-MoE sparse blocks)",
                    row.module,
                    row.kind.label()
                )))
            }
            LayerKind::Other => {}
        }
    }
    Ok(s)
}

/// The runtime's verdict on an inspected checkpoint: refused with the id of a blocking error
/// finding, else [`support`]'s verdict (which `inspect` also records as a
/// [`RUNTIME_UNSUPPORTED`] finding).
///
/// # Errors
/// The [`RuntimeRefusal`].
pub fn verdict(
    report: &InspectReport,
    config: &Result<HfConfig, String>,
) -> Result<RuntimeSupport, RuntimeRefusal> {
    if let Some(f) = report
        .findings
        .iter()
        .find(|f| f.severity == Severity::Error && BLOCKING_RULES.contains(&f.rule.as_str()))
    {
        let modules = if f.modules.is_empty() {
            String::new()
        } else {
            format!(" ({})", f.modules.join(", "))
        };
        return Err(RuntimeRefusal {
            rule: f.rule.clone(),
            detail: format!("{}{modules}; {}", f.detail, f.why),
        });
    }
    support(config, &report.modules)
}

/// How one NVFP4 weight stores its per-tensor scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Nvfp4Convention {
    /// ModelOpt: `weight` / `weight_scale` / `weight_scale_2` (amax / (6·448)).
    ModelOpt,
    /// compressed-tensors: `weight_packed` / `weight_scale` / `weight_global_scale`
    /// ((6·448) / amax, the reciprocal).
    CompressedTensors,
}

/// The tensors of one linear layer, by full name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinearTensors {
    /// Unquantized `weight` (BF16, F16 or F32).
    Plain {
        /// `{prefix}.weight`.
        weight: String,
    },
    /// FP8 E4M3 weight with 1 (per tensor) or N (per channel) FP32 scales.
    Fp8 {
        /// `{prefix}.weight` (F8_E4M3).
        weight: String,
        /// `{prefix}.weight_scale`.
        weight_scale: String,
        /// `{prefix}.input_scale`, when the checkpoint has a static activation scale.
        input_scale: Option<String>,
    },
    /// NVFP4 weight (either convention).
    Nvfp4 {
        /// Packed E2M1 codes, U8 `[N, K/2]`.
        packed: String,
        /// E4M3 block scales `[N, K/16]`.
        block_scales: String,
        /// The FP32 per-tensor scale.
        global_scale: String,
        /// Which convention (and so whether `global_scale` is a reciprocal).
        convention: Nvfp4Convention,
    },
}

/// Resolve the tensors of the linear layer `prefix` (e.g. `model.layers.0.self_attn.q_proj`)
/// from the dtypes of the tensors present (`dtype(name)` returns the safetensors dtype name of a
/// tensor, or `None` when absent), in the conventions of the table in the module docs.
///
/// # Errors
/// A message naming the tensor: no weight, a packed INT4 weight, block-wise FP8
/// (`weight_scale_inv`), a missing scale, or a dtype that is no supported format.
pub fn linear_tensors(
    prefix: &str,
    dtype: &dyn Fn(&str) -> Option<String>,
) -> Result<LinearTensors, String> {
    let name = |s: &str| format!("{prefix}.{s}");
    let need = |s: &str| -> Result<String, String> {
        let n = name(s);
        match dtype(&n) {
            Some(_) => Ok(n),
            None => Err(format!(
                "tensor '{n}' is missing from the checkpoint's safetensors files"
            )),
        }
    };
    if let Some(d) = dtype(&name("weight_packed")) {
        if d != "U8" {
            return Err(format!(
                "tensor '{}' is {d}: a packed INT4 weight (compressed-tensors pack-quantized); the runtime runs {SUPPORTED_LINEAR_FORMATS}",
                name("weight_packed")
            ));
        }
        return Ok(LinearTensors::Nvfp4 {
            packed: name("weight_packed"),
            block_scales: need("weight_scale")?,
            global_scale: need("weight_global_scale")?,
            convention: Nvfp4Convention::CompressedTensors,
        });
    }
    let w = name("weight");
    match dtype(&w).as_deref() {
        None => Err(format!(
            "tensor '{w}' is missing from the checkpoint's safetensors files"
        )),
        Some("BF16" | "F16" | "F32") => Ok(LinearTensors::Plain { weight: w }),
        Some("U8") => Ok(LinearTensors::Nvfp4 {
            packed: w,
            block_scales: need("weight_scale")?,
            global_scale: need("weight_scale_2")?,
            convention: Nvfp4Convention::ModelOpt,
        }),
        Some("F8_E4M3") => {
            if dtype(&name("weight_scale")).is_none() && dtype(&name("weight_scale_inv")).is_some()
            {
                return Err(format!(
                    "'{}' has a block-wise scale (weight_scale_inv); block-wise FP8 is not supported by the built-in runtime",
                    w
                ));
            }
            Ok(LinearTensors::Fp8 {
                weight: w,
                weight_scale: need("weight_scale")?,
                input_scale: dtype(&name("input_scale")).map(|_| name("input_scale")),
            })
        }
        Some(other) => Err(format!(
            "tensor '{w}' is {other}; the runtime runs {SUPPORTED_LINEAR_FORMATS}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup<'a>(m: &'a HashMap<&str, &str>) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| m.get(n).map(|s| s.to_string())
    }

    #[test]
    fn both_nvfp4_conventions_and_fp8_and_plain() {
        let mo = HashMap::from([
            ("l.weight", "U8"),
            ("l.weight_scale", "F8_E4M3"),
            ("l.weight_scale_2", "F32"),
            ("l.input_scale", "F32"),
        ]);
        assert!(matches!(
            linear_tensors("l", &lookup(&mo)).unwrap(),
            LinearTensors::Nvfp4 { convention: Nvfp4Convention::ModelOpt, ref global_scale, .. } if global_scale == "l.weight_scale_2"
        ));
        let ct = HashMap::from([
            ("l.weight_packed", "U8"),
            ("l.weight_scale", "F8_E4M3"),
            ("l.weight_global_scale", "F32"),
        ]);
        assert!(matches!(
            linear_tensors("l", &lookup(&ct)).unwrap(),
            LinearTensors::Nvfp4 { convention: Nvfp4Convention::CompressedTensors, ref global_scale, .. } if global_scale == "l.weight_global_scale"
        ));
        let f8 = HashMap::from([("l.weight", "F8_E4M3"), ("l.weight_scale", "F32")]);
        assert_eq!(
            linear_tensors("l", &lookup(&f8)).unwrap(),
            LinearTensors::Fp8 {
                weight: "l.weight".into(),
                weight_scale: "l.weight_scale".into(),
                input_scale: None
            }
        );
        let bf = HashMap::from([("l.weight", "BF16")]);
        assert!(matches!(
            linear_tensors("l", &lookup(&bf)).unwrap(),
            LinearTensors::Plain { .. }
        ));
        // Refusals name the tensor.
        for (m, want) in [
            (
                HashMap::from([("l.weight_packed", "I32"), ("l.weight_scale", "BF16")]),
                "INT4",
            ),
            (
                HashMap::from([("l.weight", "F8_E4M3"), ("l.weight_scale_inv", "F32")]),
                "block-wise",
            ),
            (
                HashMap::from([("l.weight", "U8"), ("l.weight_scale", "F8_E4M3")]),
                "l.weight_scale_2",
            ),
            (HashMap::from([("l.weight", "I8")]), "I8"),
            (HashMap::new(), "l.weight"),
        ] {
            let e = linear_tensors("l", &lookup(&m)).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
