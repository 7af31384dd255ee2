//! What the report says about quantization: the sources found, the facts read from them (each
//! citing its file and field), and which source the per-module formats follow and why.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rules::Rules;

/// One fact read from quantization metadata, with the file (and field) it came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantFact {
    /// What (e.g. `quant_algo`, `KV cache`, `producer`).
    pub fact: String,
    /// The value as read (or summarized, for long lists).
    pub value: String,
    /// File and field, e.g. `hf_quant_config.json quantization.kv_cache_quant_algo`.
    pub source: String,
}

/// A compressed-tensors style config group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantGroup {
    /// Group name (`group_0`).
    pub name: String,
    /// The format it declares, in words.
    pub format: String,
    /// The compressed-tensors `format` string, when given (`nvfp4-pack-quantized`).
    pub ct_format: Option<String>,
    /// How many targets.
    pub targets: usize,
    /// The first few targets.
    pub sample_targets: Vec<String>,
}

/// One quantization metadata source (a file, or config.json's `quantization_config`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuantSource {
    /// `hf_quant_config.json` or `config.json` (its `quantization_config`).
    pub file: String,
    /// Where the fields live in the file: `quantization.` (hf_quant_config.json),
    /// `quantization_config.`, `text_config.quantization_config.` or `compression_config.`.
    pub prefix: String,
    /// The keys present in that object (so that a fact cites only a key that exists).
    pub keys: Vec<String>,
    /// `modelopt`, `compressed-tensors`, or the `quant_method` as written; when the object has
    /// no `quant_method` key, the method its other keys imply (see `quant_method_evidence`).
    pub quant_method: String,
    /// Where `quant_method` came from: the key, or the keys it was inferred from.
    pub quant_method_evidence: String,
    /// Producer and version (`modelopt 0.44.0`; compressed-tensors `version`).
    pub producer: Option<String>,
    /// `quant_algo` (ModelOpt).
    pub quant_algo: Option<String>,
    /// compressed-tensors top-level `format`.
    pub format: Option<String>,
    /// `group_size`, when given at the top level.
    pub group_size: Option<u64>,
    /// KV-cache quantization declared (`FP8`), `None` when none is declared.
    pub kv_cache: Option<String>,
    /// Exclude/ignore entries as written.
    pub exclude: Vec<String>,
    /// `quantized_layers` entries per algorithm (MIXED_PRECISION).
    pub quantized_layers: BTreeMap<String, usize>,
    /// `config_groups`.
    pub groups: Vec<QuantGroup>,
}

/// Everything found about quantization, and which source engines follow.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantSummary {
    /// Sources found (none for an unquantized checkpoint).
    pub sources: Vec<QuantSource>,
    /// Facts, each with its source file.
    pub facts: Vec<QuantFact>,
    /// The source the per-module formats follow (what vLLM reads), when any.
    pub followed: Option<String>,
    /// Why that source, with the engines' rules and where they are in their code.
    pub followed_why: String,
}

/// Build the summary (sources, facts, followed source) from what was found.
pub(crate) fn summarize(
    cfg: Option<&(Rules, QuantSource)>,
    hf: Option<&(Rules, QuantSource)>,
) -> QuantSummary {
    let mut s = QuantSummary::default();
    for (_, src) in [hf, cfg].into_iter().flatten() {
        s.sources.push(src.clone());
        let file = src.file.as_str();
        // A fact cites `file prefix.key` only when the key exists; otherwise it says which
        // key is missing.
        let has = |k: &str| src.keys.is_empty() || src.keys.iter().any(|x| x == k);
        let field = |f: &str| -> String {
            if has(f.split('.').next().unwrap_or(f)) {
                format!("{file} {}{f}", src.prefix)
            } else {
                format!("{file} {}(no {f} key)", src.prefix)
            }
        };
        let mut push = |fact: &str, value: String, source: String| {
            s.facts.push(QuantFact {
                fact: fact.into(),
                value,
                source,
            })
        };
        if file != "hf_quant_config.json" {
            push(
                "quant_method",
                src.quant_method.clone(),
                src.quant_method_evidence.clone(),
            );
        }
        if let Some(p) = &src.producer {
            push(
                "producer",
                p.clone(),
                if file == "hf_quant_config.json" {
                    format!("{file} producer")
                } else if src.quant_method == "compressed-tensors" {
                    field("version")
                } else {
                    field("producer")
                },
            );
        }
        if let Some(a) = &src.quant_algo {
            push("quant_algo", a.clone(), field("quant_algo"));
        }
        if let Some(f) = &src.format {
            push("format", f.clone(), field("format"));
        }
        if let Some(g) = src.group_size {
            push("group_size", g.to_string(), field("group_size"));
        }
        let kv_key = if file == "hf_quant_config.json" {
            "kv_cache_quant_algo"
        } else if has("kv_cache_scheme") || !has("kv_cache_quant_algo") {
            "kv_cache_scheme"
        } else {
            "kv_cache_quant_algo"
        };
        push(
            "KV cache",
            src.kv_cache
                .clone()
                .unwrap_or_else(|| "none declared".into()),
            field(kv_key),
        );
        let list = if file == "hf_quant_config.json" {
            "exclude_modules"
        } else if has("ignore") || !(has("modules_to_not_convert") || has("ignored_layers")) {
            "ignore"
        } else if has("modules_to_not_convert") {
            "modules_to_not_convert"
        } else {
            "ignored_layers"
        };
        push(
            "excluded modules",
            summarize_list(&src.exclude),
            field(list),
        );
        if !src.quantized_layers.is_empty() {
            let v: Vec<String> = src
                .quantized_layers
                .iter()
                .map(|(a, n)| format!("{n} × {a}"))
                .collect();
            push("quantized_layers", v.join(", "), field("quantized_layers"));
        }
        for g in &src.groups {
            push(
                &format!("config group {}", g.name),
                format!(
                    "{}{} on {} target(s), e.g. {}",
                    g.format,
                    g.ct_format
                        .as_deref()
                        .map(|f| format!(" [{f}]"))
                        .unwrap_or_default(),
                    g.targets,
                    g.sample_targets.join(", ")
                ),
                field(&format!("config_groups.{}", g.name)),
            );
        }
    }
    let vllm = "vLLM reads config.json's quantization_config and opens hf_quant_config.json only when config.json has none (vllm/transformers_utils/config.py, get_config)";
    let trt = "TensorRT-LLM reads hf_quant_config.json first when it exists (tensorrt_llm/_torch/model_config.py, ModelConfig.from_pretrained)";
    match (cfg, hf) {
        (Some(_), Some(_)) => {
            s.followed = Some("config.json".into());
            s.followed_why = format!(
                "both files present: {vllm}; {trt}. Formats below follow config.json, as vLLM does."
            );
        }
        (None, Some(_)) => {
            s.followed = Some("hf_quant_config.json".into());
            s.followed_why = format!(
                "hf_quant_config.json is the only quantization metadata (config.json has no quantization_config); vLLM and TensorRT-LLM both read it ({vllm})."
            );
        }
        (Some(_), None) => {
            s.followed = Some("config.json".into());
            s.followed_why =
                "config.json quantization_config is the only quantization metadata.".into();
        }
        (None, None) => {
            s.followed = None;
            s.followed_why = "no quantization metadata (no config.json quantization_config, no hf_quant_config.json): every module is read as the model dtype.".into();
        }
    }
    s
}

/// A long list in a few words: count and the first entries.
pub(crate) fn summarize_list(v: &[String]) -> String {
    match v.len() {
        0 => "none".into(),
        n if n <= 4 => v.join(", "),
        n => {
            // Prefer showing the non-per-layer entries (they say the most).
            let mut shown: Vec<&String> = v.iter().filter(|e| !e.contains(".layers.")).collect();
            shown.truncate(4);
            if shown.is_empty() {
                shown = v.iter().take(3).collect();
            }
            format!(
                "{n} entries, e.g. {}",
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }
}
