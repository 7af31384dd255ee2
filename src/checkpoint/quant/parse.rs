//! Reading quantization metadata: ModelOpt's `hf_quant_config.json` (and its copy inside
//! config.json), config.json's `quantization_config` in the ModelOpt flat, compressed-tensors
//! and generic forms, each into the rules that resolve module names and the source the report
//! shows.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{Map, Value};

use super::rules::{GroupRule, LayerMap, Method, Pattern, Rules};
use super::summary::{QuantGroup, QuantSource};
use crate::checkpoint::config::{json_kind, opt_u64};
use crate::checkpoint::format::ModuleFormat;
use crate::RigError;

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

#[cfg(test)]
mod tests {
    use super::super::rules::ModClass;
    use super::*;

    fn m(json: &str) -> Map<String, Value> {
        serde_json::from_str::<Value>(json)
            .unwrap()
            .as_object()
            .unwrap()
            .clone()
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
