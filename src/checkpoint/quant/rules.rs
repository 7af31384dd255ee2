//! The rules of one quantization source: name patterns (ModelOpt exclude entries,
//! compressed-tensors targets), `quantized_layers` and config groups, and how a module name
//! resolves to the format it is declared in.

use std::collections::HashMap;

use regex::Regex;

use crate::checkpoint::config::ModelFacts;
use crate::checkpoint::format::ModuleFormat;

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
    pub(super) fn modelopt(raw: &str) -> Self {
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

    pub(super) fn compressed_tensors(raw: &str) -> Self {
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
    pub fn excludes_mtp_for(&self, facts: &ModelFacts) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
