//! Quantization metadata in the forms in use, and the rule that says which format a module is
//! declared in.
//!
//! Forms read:
//! - ModelOpt `hf_quant_config.json`: `{"producer": {...}, "quantization": {"quant_algo",
//!   "kv_cache_quant_algo", "group_size", "exclude_modules", "quantized_layers"}}`
//!   (`quant_algo: MIXED_PRECISION` with per-module `quantized_layers`).
//! - config.json `quantization_config` with `quant_method: modelopt` (ModelOpt ≥ 0.31 "flat"
//!   form: `quant_algo`, `kv_cache_scheme`, `ignore`, `quantized_layers`, `config_groups`).
//! - config.json `quantization_config` with `quant_method: compressed-tensors` (`config_groups`
//!   with `targets`, `weights`, `input_activations`, `format`; `ignore`; `kv_cache_scheme`).
//! - Other `quant_method`s (`fp8`, `mxfp4`, `gptq`, `awq`, ...) as one format for every Linear
//!   layer minus `modules_to_not_convert` / `ignored_layers`.
//!
//! Matching follows the engines: ModelOpt exclude entries match by equality, substring or
//! `fnmatch` wildcard (vLLM `ModelOptQuantConfigBase.is_layer_excluded`); `quantized_layers`
//! keys match the module or one of its parents (vLLM `ModelOptMixedPrecisionConfig.
//! _resolve_quant_algo`); compressed-tensors targets match by exact name, `re:` regex with
//! Python `re.match` semantics (anchored at the start), or a class name such as `Linear`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::config::{json_kind, opt_u64};
use super::format::ModuleFormat;
use crate::RigError;

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

/// How a source decides formats.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Method {
    ModelOpt,
    CompressedTensors,
    Generic(String),
}

/// A name pattern from metadata.
#[derive(Debug, Clone)]
pub(crate) enum Pattern {
    /// ModelOpt exclude entry: equality, substring, or fnmatch wildcard.
    ModelOpt { raw: String, glob: Option<Regex> },
    /// compressed-tensors `re:` entry (Python `re.match`: anchored at the start).
    Regex { raw: String, re: Regex },
    /// A class name (`Linear`, `Embedding`).
    Class(String),
    /// An exact module name.
    Exact(String),
    /// A pattern that could not be compiled (never matches; reported by lint).
    Invalid { raw: String, error: String },
}

/// What kind of layer a module is, as far as quantization cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModClass {
    /// A GEMM weight built with the quantization config (nn.Linear / vLLM LinearBase).
    Linear,
    /// Token embeddings.
    Embedding,
    /// MoE router gate (vLLM builds it with `quant_config=None`).
    Router,
    /// Anything else (conv1d, norms).
    Other,
}

impl Pattern {
    fn modelopt(raw: &str) -> Self {
        let glob = if raw.contains(['*', '?', '[']) {
            Regex::new(&glob_to_regex(raw)).ok()
        } else {
            None
        };
        Pattern::ModelOpt {
            raw: raw.to_string(),
            glob,
        }
    }

    fn compressed_tensors(raw: &str) -> Self {
        if let Some(re) = raw.strip_prefix("re:") {
            match Regex::new(&format!("^(?:{re})")) {
                Ok(r) => Pattern::Regex {
                    raw: raw.to_string(),
                    re: r,
                },
                Err(e) => Pattern::Invalid {
                    raw: raw.to_string(),
                    error: e.to_string(),
                },
            }
        } else if !raw.contains('.') && raw.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
            Pattern::Class(raw.to_string())
        } else {
            Pattern::Exact(raw.to_string())
        }
    }

    /// The pattern as written.
    pub fn raw(&self) -> &str {
        match self {
            Pattern::ModelOpt { raw, .. }
            | Pattern::Regex { raw, .. }
            | Pattern::Invalid { raw, .. } => raw,
            Pattern::Class(s) | Pattern::Exact(s) => s,
        }
    }

    /// Does `name` (a module of class `class`) match?
    pub fn matches(&self, name: &str, class: ModClass) -> bool {
        match self {
            Pattern::ModelOpt { raw, glob } => {
                name == raw
                    || (!raw.is_empty() && name.contains(raw.as_str()))
                    || glob.as_ref().is_some_and(|g| g.is_match(name))
            }
            Pattern::Regex { re, .. } => re.is_match(name),
            Pattern::Class(c) => match c.as_str() {
                "Linear" => class == ModClass::Linear,
                "Embedding" => class == ModClass::Embedding,
                _ => false,
            },
            Pattern::Exact(s) => name == s,
            Pattern::Invalid { .. } => false,
        }
    }

    /// Could this pattern match an MTP module (names starting `mtp.` or containing `.mtp.`)?
    /// Used when module names are unknown.
    pub fn mentions_mtp(&self) -> bool {
        let r = self.raw();
        r.contains("mtp") || r.contains("nextn")
    }
}

/// fnmatch-style wildcard → anchored regex (`*` any run of characters, dots included; `?` one
/// character; `[...]` a class), as Python's `fnmatch.translate`.
pub(crate) fn glob_to_regex(glob: &str) -> String {
    let mut out = String::from("^");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '[' => {
                let mut class = String::new();
                let mut closed = false;
                for d in chars.by_ref() {
                    if d == ']' {
                        closed = true;
                        break;
                    }
                    class.push(d);
                }
                if closed {
                    let class = class.replacen('!', "^", 1).replace('\\', "\\\\");
                    out.push('[');
                    out.push_str(&class);
                    out.push(']');
                } else {
                    out.push_str(&regex::escape(&format!("[{class}")));
                }
            }
            other => out.push_str(&regex::escape(&other.to_string())),
        }
    }
    out.push('$');
    out
}

/// `quantized_layers` entries: module name → (format, algo as written, group size as written).
pub(crate) type LayerMap = HashMap<String, LayerEntry>;

/// One `quantized_layers` entry: (format, algo as written, group size as written).
pub(crate) type LayerEntry = (ModuleFormat, String, Option<u64>);

/// A config group rule.
#[derive(Debug, Clone)]
pub(crate) struct GroupRule {
    pub name: String,
    pub format: ModuleFormat,
    pub targets: Vec<Pattern>,
}

/// The rules of one source, ready to resolve module names.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub file: String,
    pub method: Method,
    /// Format of every Linear layer not excluded (non-mixed ModelOpt, generic methods).
    pub global: Option<ModuleFormat>,
    pub algo: Option<String>,
    /// `quantized_layers`: name → (format, algo as written, group size as written).
    pub layers: LayerMap,
    pub groups: Vec<GroupRule>,
    pub exclude: Vec<Pattern>,
    pub kv: Option<String>,
    pub producer: Option<String>,
}

/// A declared format and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Declared {
    pub format: ModuleFormat,
    /// One line: the rule that decided it, naming the file.
    pub why: String,
    /// True when an explicit exclude/ignore entry decided it.
    pub excluded: bool,
}

impl Rules {
    /// Resolve a module name to its declared format.
    pub fn resolve(&self, name: &str, class: ModClass) -> Declared {
        let unq = |why: String, excluded: bool| Declared {
            format: ModuleFormat::Bf16,
            why,
            excluded,
        };
        let list = match self.method {
            Method::ModelOpt if self.file == "hf_quant_config.json" => "exclude_modules",
            Method::ModelOpt | Method::CompressedTensors => "ignore",
            Method::Generic(_) => "modules_to_not_convert",
        };
        if let Some(p) = self.exclude.iter().find(|p| p.matches(name, class)) {
            return unq(format!("{} {list} '{}'", self.file, p.raw()), true);
        }
        if class == ModClass::Router {
            return unq(
                "MoE router gate: engines build it unquantized".into(),
                false,
            );
        }
        match &self.method {
            Method::ModelOpt => {
                if let Some((key, (fmt, algo, _))) = self.lookup_layer(name) {
                    return Declared {
                        format: fmt.clone(),
                        why: format!("{} quantized_layers['{key}']: {algo}", self.file),
                        excluded: false,
                    };
                }
                if class != ModClass::Linear {
                    return unq(
                        "not a Linear layer (ModelOpt quantizes Linear layers)".into(),
                        false,
                    );
                }
                match &self.global {
                    Some(g) => Declared {
                        format: g.clone(),
                        why: format!(
                            "{} quant_algo {} (every Linear layer not excluded)",
                            self.file,
                            self.algo.as_deref().unwrap_or("?")
                        ),
                        excluded: false,
                    },
                    None => unq(format!("{}: not in quantized_layers", self.file), false),
                }
            }
            Method::CompressedTensors => {
                for g in &self.groups {
                    if let Some(t) = g.targets.iter().find(|t| t.matches(name, class)) {
                        return Declared {
                            format: g.format.clone(),
                            why: format!(
                                "{} config_groups.{} target '{}'",
                                self.file,
                                g.name,
                                t.raw()
                            ),
                            excluded: false,
                        };
                    }
                }
                unq(format!("{}: no config group targets it", self.file), false)
            }
            Method::Generic(m) => match (&self.global, class) {
                (Some(g), ModClass::Linear) => Declared {
                    format: g.clone(),
                    why: format!(
                        "{} quant_method {m} (every Linear layer not excluded)",
                        self.file
                    ),
                    excluded: false,
                },
                _ => unq(
                    format!("not a Linear layer ({m} quantizes Linear layers)"),
                    false,
                ),
            },
        }
    }

    /// A `quantized_layers` entry for `name` or one of its parents, also trying the
    /// `model.language_model.` ↔ `language_model.model.` spelling (vLLM's candidates).
    fn lookup_layer(&self, name: &str) -> Option<(String, &LayerEntry)> {
        if self.layers.is_empty() {
            return None;
        }
        let mut candidates = vec![name.to_string()];
        if let Some(rest) = name.strip_prefix("model.language_model.") {
            candidates.push(format!("language_model.model.{rest}"));
        } else if let Some(rest) = name.strip_prefix("language_model.model.") {
            candidates.push(format!("model.language_model.{rest}"));
        }
        for c in candidates {
            let mut cur = c.as_str();
            loop {
                if let Some(v) = self.layers.get(cur) {
                    return Some((cur.to_string(), v));
                }
                match cur.rfind('.') {
                    Some(i) => cur = &cur[..i],
                    None => break,
                }
            }
        }
        None
    }

    /// Does any exclude entry plausibly cover MTP modules (for when names are unknown)?
    pub fn excludes_mtp(&self) -> bool {
        self.exclude.iter().any(Pattern::mentions_mtp)
    }

    /// Does the exclude list cover the MTP draft head in the model's own convention (for when
    /// module names are unknown)? Two conventions: a separate `mtp.*` tree (Qwen3.5/3.6,
    /// `mtp_num_hidden_layers`), where an entry naming `mtp`/`nextn` covers it; and the MTP
    /// layers appended as `model.layers.{num_hidden_layers + i}` (DeepSeek V3, GLM-4.5,
    /// `num_nextn_predict_layers`), where an entry must match that layer's MLP modules
    /// (`model.layers.92*`, `re:model\.layers\.92\..*`), with or without the `model.` /
    /// `model.language_model.` prefix.
    pub fn excludes_mtp_for(&self, facts: &super::config::ModelFacts) -> bool {
        if self.excludes_mtp() {
            return true;
        }
        let (Some(n), Some(k)) = (facts.num_hidden_layers, facts.mtp_layers) else {
            return false;
        };
        if facts.mtp_field.as_deref() != Some("num_nextn_predict_layers") || k == 0 {
            return false;
        }
        let prefixes = [
            "model.layers.",
            "model.language_model.layers.",
            "language_model.model.layers.",
            "layers.",
        ];
        let mlp = [
            "mlp.down_proj",
            "mlp.experts.0.down_proj",
            "mlp.shared_experts.down_proj",
            "ffn.experts.0.w2",
        ];
        (n..n.saturating_add(k.min(16))).all(|i| {
            prefixes.iter().any(|p| {
                mlp.iter().any(|m| {
                    let name = format!("{p}{i}.{m}");
                    self.exclude
                        .iter()
                        .any(|pat| pat.matches(&name, ModClass::Linear))
                })
            })
        })
    }

    /// Patterns that failed to compile.
    pub fn invalid_patterns(&self) -> Vec<(String, String)> {
        self.exclude
            .iter()
            .chain(self.groups.iter().flat_map(|g| g.targets.iter()))
            .filter_map(|p| match p {
                Pattern::Invalid { raw, error } => Some((raw.clone(), error.clone())),
                _ => None,
            })
            .collect()
    }
}

fn str_list(
    obj: &Map<String, Value>,
    key: &str,
    where_: &str,
    path: &Path,
) -> Result<Vec<String>, RigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    RigError::file(
                        path,
                        format!(
                            "field {where_}{key}[{i}]: expected a string, found {}",
                            json_kind(v)
                        ),
                    )
                })
            })
            .collect(),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(other) => Err(RigError::file(
            path,
            format!(
                "field {where_}{key}: expected a list of strings, found {}",
                json_kind(other)
            ),
        )),
    }
}

fn obj<'a>(
    o: &'a Map<String, Value>,
    key: &str,
    where_: &str,
    path: &Path,
) -> Result<Option<&'a Map<String, Value>>, RigError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(RigError::file(
            path,
            format!(
                "field {where_}{key}: expected an object, found {}",
                json_kind(other)
            ),
        )),
    }
}

fn producer_of(o: &Map<String, Value>) -> Option<String> {
    match o.get("producer") {
        Some(Value::Object(p)) => {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("?");
            Some(match p.get("version").and_then(Value::as_str) {
                Some(v) => format!("{name} {v}"),
                None => name.to_string(),
            })
        }
        _ => None,
    }
}

/// Parse `quantized_layers` (name → {quant_algo, group_size}).
fn parse_layers(o: &Map<String, Value>, where_: &str, path: &Path) -> Result<LayerMap, RigError> {
    let mut out = HashMap::new();
    if let Some(ql) = obj(o, "quantized_layers", where_, path)? {
        for (name, v) in ql {
            let entry = v.as_object().ok_or_else(|| {
                RigError::file(
                    path,
                    format!(
                        "field {where_}quantized_layers['{name}']: expected an object, found {}",
                        json_kind(v)
                    ),
                )
            })?;
            let algo = entry
                .get("quant_algo")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    RigError::file(
                        path,
                        format!("field {where_}quantized_layers['{name}'].quant_algo: missing or not a string"),
                    )
                })?;
            let gs = opt_u64(
                entry,
                "group_size",
                &format!("{where_}quantized_layers['{name}']."),
                path,
            )?;
            let fmt = ModuleFormat::from_modelopt_algo(algo, gs).unwrap_or(ModuleFormat::Other {
                name: format!("ModelOpt {algo}"),
            });
            out.insert(name.clone(), (fmt, algo.to_string(), gs));
        }
    }
    Ok(out)
}

/// KV-cache scheme dict (`{"type": "float", "num_bits": 8}`) or string → `FP8`, `INT8`, ...
fn kv_from_scheme(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::Object(s)) => {
            let bits = s.get("num_bits").and_then(Value::as_u64);
            let ty = s.get("type").and_then(Value::as_str).unwrap_or("float");
            Some(match (ty, bits) {
                ("float", Some(8)) => "FP8".to_string(),
                ("float", Some(4)) => "FP4".to_string(),
                ("int", Some(b)) => format!("INT{b}"),
                (t, Some(b)) => format!("{t}{b}"),
                (t, None) => t.to_string(),
            })
        }
        Some(Value::String(s)) if !s.is_empty() => Some(s.to_ascii_uppercase()),
        _ => None,
    }
}

/// The format a compressed-tensors (or ModelOpt flat) config group declares.
///
/// Source: compressed-tensors `QuantizationArgs` (`num_bits`, `type`, `strategy`,
/// `group_size`, `block_structure`, `dynamic`) and its `CompressionFormat` names.
pub(crate) fn group_format(g: &Map<String, Value>, ct_format: Option<&str>) -> ModuleFormat {
    let w = g.get("weights").and_then(Value::as_object);
    let a = g.get("input_activations").and_then(Value::as_object);
    let Some(w) = w else {
        return ModuleFormat::Other {
            name: "config group without weights".into(),
        };
    };
    let bits = w.get("num_bits").and_then(Value::as_u64);
    let ty = w.get("type").and_then(Value::as_str).unwrap_or("int");
    let gs = w.get("group_size").and_then(Value::as_u64);
    let strategy = w.get("strategy").and_then(Value::as_str);
    let a_bits = a.and_then(|a| a.get("num_bits")).and_then(Value::as_u64);
    let fmt = ct_format.unwrap_or("");
    match (ty, bits) {
        ("float", Some(4)) => {
            let scale_e8m0 = w
                .get("scale_dtype")
                .and_then(Value::as_str)
                .is_some_and(|s| s.contains("e8m0"));
            if fmt.contains("mxfp4") || scale_e8m0 {
                ModuleFormat::Mxfp4
            } else {
                ModuleFormat::Nvfp4 {
                    activations_4bit: a_bits == Some(4),
                    group_size: gs.unwrap_or(16).min(u32::MAX as u64) as u32,
                }
            }
        }
        ("float", Some(8)) => {
            let scaling = match strategy {
                Some("tensor") => "per-tensor".to_string(),
                Some("channel") => "per-channel".to_string(),
                Some("block") => match w.get("block_structure").and_then(Value::as_array) {
                    Some(b) if b.len() == 2 => format!(
                        "block {}x{}",
                        b[0].as_u64().unwrap_or(0),
                        b[1].as_u64().unwrap_or(0)
                    ),
                    _ => "block".to_string(),
                },
                Some("group") | Some("tensor_group") => {
                    format!("group {}", gs.map(|g| g.to_string()).unwrap_or("?".into()))
                }
                Some(other) => other.to_string(),
                None => "unspecified".to_string(),
            };
            let activations = match a {
                None => "weight-only".to_string(),
                Some(a) if a_bits == Some(8) => match a.get("dynamic") {
                    Some(Value::Bool(false)) => "static".to_string(),
                    Some(Value::Bool(true)) | Some(Value::String(_)) => "dynamic".to_string(),
                    _ => "unspecified".to_string(),
                },
                Some(_) => "unspecified".to_string(),
            };
            ModuleFormat::Fp8 {
                scaling,
                activations,
            }
        }
        ("int", Some(4)) => ModuleFormat::Int4 {
            group_size: gs.map(|g| g.min(u32::MAX as u64) as u32),
        },
        ("int", Some(8)) => ModuleFormat::Int8,
        (t, b) => ModuleFormat::Other {
            name: format!(
                "{t}{} weights{}",
                b.map(|b| b.to_string()).unwrap_or_default(),
                if fmt.is_empty() {
                    String::new()
                } else {
                    format!(" ({fmt})")
                }
            ),
        },
    }
}

/// Parse config groups (compressed-tensors form; also present in ModelOpt's flat form).
fn parse_groups(
    q: &Map<String, Value>,
    where_: &str,
    path: &Path,
    top_format: Option<&str>,
) -> Result<(Vec<GroupRule>, Vec<QuantGroup>), RigError> {
    let mut rules = Vec::new();
    let mut summary = Vec::new();
    if let Some(groups) = obj(q, "config_groups", where_, path)? {
        for (gname, g) in groups {
            let g = g.as_object().ok_or_else(|| {
                RigError::file(
                    path,
                    format!(
                        "field {where_}config_groups.{gname}: expected an object, found {}",
                        json_kind(g)
                    ),
                )
            })?;
            let gfmt = g.get("format").and_then(Value::as_str).or(top_format);
            let format = group_format(g, gfmt);
            let targets = str_list(
                g,
                "targets",
                &format!("{where_}config_groups.{gname}."),
                path,
            )?;
            summary.push(QuantGroup {
                name: gname.clone(),
                format: format.to_string(),
                ct_format: gfmt.map(str::to_string),
                targets: targets.len(),
                sample_targets: targets.iter().take(3).cloned().collect(),
            });
            rules.push(GroupRule {
                name: gname.clone(),
                format,
                targets: targets
                    .iter()
                    .map(|t| Pattern::compressed_tensors(t))
                    .collect(),
            });
        }
    }
    Ok((rules, summary))
}

/// Parse ModelOpt's `hf_quant_config.json` (already read as an object).
///
/// # Errors
/// No `quantization` object, or a field of the wrong type; the error names the file.
pub(crate) fn parse_hf_quant_config(
    root: &Map<String, Value>,
    path: &Path,
) -> Result<(Rules, QuantSource), RigError> {
    let q = obj(root, "quantization", "", path)?.ok_or_else(|| {
        RigError::file(
            path,
            "no 'quantization' object; ModelOpt writes {\"producer\": {...}, \"quantization\": {\"quant_algo\": ...}}",
        )
    })?;
    modelopt_export(
        root,
        q,
        ("hf_quant_config.json", "quantization."),
        "hf_quant_config.json is ModelOpt's export".into(),
        path,
    )
}

/// ModelOpt's export object (`{"producer": {...}, "quantization": {"quant_algo": ...}}`), read
/// from `root` (for the producer) and its `quantization` object `q`; `at` is the file and the
/// key prefix of `q` as findings cite them, `evidence` why the method is ModelOpt.
fn modelopt_export(
    root: &Map<String, Value>,
    q: &Map<String, Value>,
    at: (&str, &str),
    evidence: String,
    path: &Path,
) -> Result<(Rules, QuantSource), RigError> {
    let (file, w) = at;
    let algo = q
        .get("quant_algo")
        .and_then(Value::as_str)
        .map(str::to_string);
    let group_size = opt_u64(q, "group_size", w, path)?;
    let exclude = str_list(q, "exclude_modules", w, path)?;
    let layers = parse_layers(q, w, path)?;
    let kv = match q.get("kv_cache_quant_algo") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.to_ascii_uppercase()),
        _ => None,
    };
    let global = algo
        .as_deref()
        .and_then(|a| ModuleFormat::from_modelopt_algo(a, group_size));
    let rules = Rules {
        file: file.into(),
        method: Method::ModelOpt,
        global,
        algo: algo.clone(),
        layers,
        groups: Vec::new(),
        exclude: exclude.iter().map(|e| Pattern::modelopt(e)).collect(),
        kv: kv.clone(),
        producer: producer_of(root),
    };
    let source = QuantSource {
        file: rules.file.clone(),
        prefix: w.to_string(),
        keys: q.keys().cloned().collect(),
        quant_method: "modelopt".into(),
        quant_method_evidence: evidence,
        producer: rules.producer.clone(),
        quant_algo: algo,
        format: None,
        group_size,
        kv_cache: kv,
        exclude,
        quantized_layers: count_algos(&rules.layers),
        groups: Vec::new(),
    };
    Ok((rules, source))
}

fn count_algos(
    layers: &HashMap<String, (ModuleFormat, String, Option<u64>)>,
) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (_, algo, gs) in layers.values() {
        let key = match gs {
            Some(g) => format!("{algo} (group {g})"),
            None => algo.clone(),
        };
        *m.entry(key).or_insert(0) += 1;
    }
    m
}

/// Parse config.json's `quantization_config` (or `text_config.quantization_config`,
/// or `compression_config`), when present.
///
/// # Errors
/// A field of the wrong type; the error names config.json and the field.
pub(crate) fn parse_config_quant(
    root: &Map<String, Value>,
    path: &Path,
) -> Result<Option<(Rules, QuantSource)>, RigError> {
    let (q, w) = if let Some(q) = obj(root, "quantization_config", "", path)? {
        (q, "quantization_config.")
    } else if let Some(q) = root
        .get("text_config")
        .and_then(Value::as_object)
        .and_then(|t| t.get("quantization_config"))
        .and_then(Value::as_object)
    {
        (q, "text_config.quantization_config.")
    } else if let Some(q) = obj(root, "compression_config", "", path)? {
        (q, "compression_config.")
    } else {
        return Ok(None);
    };
    // ModelOpt's hf_quant_config.json form copied into config.json (`quantization_config:
    // {"producer": {...}, "quantization": {"quant_algo": "FP8", ...}}`, no quant_method): the
    // same reader as the file, citing config.json's keys.
    if !q.contains_key("quant_method") {
        if let Some(inner) = q.get("quantization").and_then(Value::as_object) {
            if inner.contains_key("quant_algo") {
                let prefix = format!("{w}quantization.");
                let evidence = format!(
                    "inferred from config.json {prefix}quant_algo{} (ModelOpt's export form inside config.json; the object has no quant_method key)",
                    if q.contains_key("producer") {
                        format!(" and {w}producer")
                    } else {
                        String::new()
                    }
                );
                return modelopt_export(q, inner, ("config.json", &prefix), evidence, path)
                    .map(Some);
            }
        }
    }
    let (method_raw, method_evidence) = match q.get("quant_method").and_then(Value::as_str) {
        Some(m) => (m.to_string(), format!("config.json {w}quant_method")),
        None => infer_method(q, w),
    };
    let method = match method_raw.as_str() {
        "modelopt" | "modelopt_fp4" | "modelopt_mixed" => Method::ModelOpt,
        "compressed-tensors" | "compressed_tensors" => Method::CompressedTensors,
        other => Method::Generic(other.to_string()),
    };
    let top_format = q.get("format").and_then(Value::as_str);
    let (groups, group_summary) = parse_groups(q, w, path, top_format)?;
    let group_size = opt_u64(q, "group_size", w, path)?;
    let mut exclude = str_list(q, "ignore", w, path)?;
    let algo = q
        .get("quant_algo")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut kv = kv_from_scheme(q.get("kv_cache_scheme"));
    if kv.is_none() {
        if let Some(Value::String(s)) = q.get("kv_cache_quant_algo") {
            if !s.is_empty() {
                kv = Some(s.to_ascii_uppercase());
            }
        }
    }
    let producer = match &method {
        Method::ModelOpt => producer_of(q),
        Method::CompressedTensors => q
            .get("version")
            .and_then(Value::as_str)
            .map(|v| format!("compressed-tensors {v}")),
        Method::Generic(_) => None,
    };
    let (global, layers) = match &method {
        Method::ModelOpt => {
            // ModelOpt flat form: group size may live only in config_groups (vLLM does the same).
            let gs = group_size.or_else(|| {
                q.get("config_groups")
                    .and_then(Value::as_object)
                    .and_then(|g| {
                        g.values().find_map(|g| {
                            g.get("weights")
                                .and_then(|w| w.get("group_size"))
                                .and_then(Value::as_u64)
                        })
                    })
            });
            (
                algo.as_deref()
                    .and_then(|a| ModuleFormat::from_modelopt_algo(a, gs)),
                parse_layers(q, w, path)?,
            )
        }
        Method::CompressedTensors => (None, HashMap::new()),
        Method::Generic(m) => {
            exclude.extend(str_list(q, "modules_to_not_convert", w, path)?);
            exclude.extend(str_list(q, "ignored_layers", w, path)?);
            (Some(generic_format(m, q)), HashMap::new())
        }
    };
    let exclude_patterns = exclude
        .iter()
        .map(|e| match method {
            Method::CompressedTensors => Pattern::compressed_tensors(e),
            _ => Pattern::modelopt(e),
        })
        .collect();
    let rules = Rules {
        file: "config.json".into(),
        method: method.clone(),
        global,
        algo: algo.clone(),
        layers,
        groups,
        exclude: exclude_patterns,
        kv: kv.clone(),
        producer: producer.clone(),
    };
    let source = QuantSource {
        file: "config.json".into(),
        prefix: w.to_string(),
        keys: q.keys().cloned().collect(),
        quant_method: method_raw,
        quant_method_evidence: method_evidence,
        producer,
        quant_algo: algo,
        format: top_format.map(str::to_string),
        group_size,
        kv_cache: kv,
        exclude,
        quantized_layers: count_algos(&rules.layers),
        groups: group_summary,
    };
    Ok(Some((rules, source)))
}

/// The method a `quantization_config` without a `quant_method` key implies, with the keys
/// that say so: `config_groups` (compressed-tensors), `quant_algo` (ModelOpt),
/// `weight_block_size` or `fmt: e4m3` (FP8, DeepSeek's form), `bits` (GPTQ/AWQ-style integer).
/// `unknown` when none does.
fn infer_method(q: &Map<String, Value>, w: &str) -> (String, String) {
    let inferred = |m: &str, keys: &str| {
        (
            m.to_string(),
            format!("inferred from config.json {w}{keys} (the object has no quant_method key)"),
        )
    };
    if q.contains_key("config_groups") {
        return inferred("compressed-tensors", "config_groups");
    }
    if q.contains_key("quant_algo") {
        return inferred("modelopt", "quant_algo");
    }
    let fp8_fmt = q
        .get("fmt")
        .and_then(Value::as_str)
        .is_some_and(|f| f.to_ascii_lowercase().contains("e4m3") || f.contains("e5m2"));
    if q.contains_key("weight_block_size") || fp8_fmt {
        return inferred("fp8", if fp8_fmt { "fmt" } else { "weight_block_size" });
    }
    if q.contains_key("bits") {
        return inferred("gptq", "bits");
    }
    (
        "unknown".into(),
        format!("config.json {w} has no quant_method key and no key that implies one"),
    )
}

/// One format for the `quant_method`s that quantize every Linear layer alike.
/// Sources: transformers `FineGrainedFP8Config` (`fp8`, `weight_block_size`), `Mxfp4Config`,
/// `GPTQConfig`/`AwqConfig` (`bits`, `group_size`).
fn generic_format(method: &str, q: &Map<String, Value>) -> ModuleFormat {
    let bits = q.get("bits").and_then(Value::as_u64);
    let gs = q
        .get("group_size")
        .and_then(Value::as_u64)
        .map(|g| g.min(u32::MAX as u64) as u32);
    match method {
        "fp8" => ModuleFormat::Fp8 {
            scaling: match q.get("weight_block_size").and_then(Value::as_array) {
                Some(b) if b.len() == 2 => format!(
                    "block {}x{}",
                    b[0].as_u64().unwrap_or(0),
                    b[1].as_u64().unwrap_or(0)
                ),
                _ => "per-tensor".into(),
            },
            activations: match q.get("activation_scheme").and_then(Value::as_str) {
                Some("static") => "static".into(),
                _ => "dynamic".into(),
            },
        },
        "mxfp4" => ModuleFormat::Mxfp4,
        "gptq" | "awq" | "gptq_marlin" | "awq_marlin" | "auto-round" | "autoround" => match bits {
            Some(4) | None => ModuleFormat::Int4 { group_size: gs },
            Some(8) => ModuleFormat::Int8,
            Some(b) => ModuleFormat::Other {
                name: format!("{method} {b}-bit"),
            },
        },
        other => ModuleFormat::Other {
            name: format!("quant_method {other}"),
        },
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn m(json: &str) -> Map<String, Value> {
        serde_json::from_str::<Value>(json)
            .unwrap()
            .as_object()
            .unwrap()
            .clone()
    }

    #[test]
    fn globs_follow_fnmatch() {
        let p = Pattern::modelopt("model.language_model.layers.1.linear_attn*");
        assert!(p.matches(
            "model.language_model.layers.1.linear_attn.in_proj_a",
            ModClass::Linear
        ));
        assert!(!p.matches(
            "model.language_model.layers.10.linear_attn.in_proj_a",
            ModClass::Linear
        ));
        let p = Pattern::modelopt("mtp*");
        assert!(p.matches("mtp.layers.0.mlp.experts.3.up_proj", ModClass::Linear));
        // vLLM substring rule.
        let p = Pattern::modelopt("lm_head");
        assert!(p.matches("lm_head", ModClass::Linear));
        assert!(Regex::new(&glob_to_regex("a[!b]c?"))
            .unwrap()
            .is_match("axcd"));
        assert!(Regex::new(&glob_to_regex("a[bc")).is_ok());
    }

    #[test]
    fn compressed_tensors_targets() {
        let p = Pattern::compressed_tensors("re:.*ffn.*(gate|up|down)_proj$");
        assert!(p.matches("layers.3.ffn.experts.7.up_proj", ModClass::Linear));
        assert!(!p.matches("layers.3.attn.wq_b", ModClass::Linear));
        let p = Pattern::compressed_tensors("Linear");
        assert!(p.matches("anything.q_proj", ModClass::Linear));
        assert!(!p.matches("model.embed_tokens", ModClass::Embedding));
        assert!(!p.matches("model.layers.0.mlp.gate", ModClass::Router));
        let p = Pattern::compressed_tensors("re:([unclosed");
        assert!(matches!(p, Pattern::Invalid { .. }));
        assert!(!p.matches("x", ModClass::Linear));
    }

    #[test]
    fn mixed_precision_resolution() {
        let root = m(r#"{"producer":{"name":"modelopt","version":"0.44.0"},
            "quantization":{"quant_algo":"MIXED_PRECISION","kv_cache_quant_algo":"FP8",
              "quantized_layers":{"model.layers.0.mlp.experts":{"quant_algo":"W4A16_NVFP4","group_size":16},
                                   "model.layers.0.self_attn.q_proj":{"quant_algo":"FP8"}},
              "exclude_modules":["mtp*"]}}"#);
        let (r, s) = parse_hf_quant_config(&root, Path::new("hf_quant_config.json")).unwrap();
        assert_eq!(s.kv_cache.as_deref(), Some("FP8"));
        assert_eq!(s.producer.as_deref(), Some("modelopt 0.44.0"));
        let d = r.resolve("model.layers.0.mlp.experts.5.down_proj", ModClass::Linear);
        assert_eq!(
            d.format,
            ModuleFormat::Nvfp4 {
                activations_4bit: false,
                group_size: 16
            }
        );
        assert!(d
            .why
            .contains("quantized_layers['model.layers.0.mlp.experts']"));
        let d = r.resolve("model.layers.0.self_attn.k_proj", ModClass::Linear);
        assert_eq!(d.format, ModuleFormat::Bf16);
        assert!(!d.excluded);
        let d = r.resolve("mtp.fc", ModClass::Linear);
        assert!(d.excluded);
    }

    #[test]
    fn bad_shapes_are_errors_naming_fields() {
        let root =
            m(r#"{"quantization":{"exclude_modules":"lm_head","quantized_layers":{"x":3}}}"#);
        let e = parse_hf_quant_config(&root, Path::new("hf_quant_config.json")).unwrap_err();
        assert!(e.to_string().contains("quantized_layers['x']"), "{e}");
        let root = m(r#"{"producer":{}}"#);
        let e = parse_hf_quant_config(&root, Path::new("hf_quant_config.json")).unwrap_err();
        assert!(e.to_string().contains("'quantization'"), "{e}");
        let root =
            m(r#"{"quantization_config":{"quant_method":"compressed-tensors","ignore":[1]}}"#);
        let e = parse_config_quant(&root, Path::new("config.json")).unwrap_err();
        assert!(
            e.to_string().contains("quantization_config.ignore[0]"),
            "{e}"
        );
    }

    #[test]
    fn generic_methods() {
        let root = m(
            r#"{"quantization_config":{"quant_method":"fp8","weight_block_size":[128,128],
            "activation_scheme":"dynamic","modules_to_not_convert":["lm_head"]}}"#,
        );
        let (r, _) = parse_config_quant(&root, Path::new("config.json"))
            .unwrap()
            .unwrap();
        assert_eq!(
            r.resolve("model.layers.0.mlp.up_proj", ModClass::Linear)
                .format,
            ModuleFormat::Fp8 {
                scaling: "block 128x128".into(),
                activations: "dynamic".into()
            }
        );
        assert_eq!(
            r.resolve("lm_head", ModClass::Linear).format,
            ModuleFormat::Bf16
        );
    }
}
