//! The dense decoders' `config.json` reader (`qwen3`: `Qwen3Config`, `llama`: `LlamaConfig`):
//! every field that changes the math read or refused, defaults named in the warnings.

use serde_json::{Map, Value};

use super::config::{Arch, HfConfig, ModelConfig, SUPPORTED_ARCHITECTURES, SUPPORTED_MODEL_TYPES};
use super::fields::Fields;
use super::rope::parse_rope;

/// The dense reader (`qwen3`, `llama`) behind [`ModelConfig::parse_hf_config`], on the
/// already decoded object.
///
/// # Errors
/// As [`ModelConfig::parse_hf_config`].
pub(super) fn parse(root: &Map<String, Value>) -> anyhow::Result<HfConfig> {
    let mut warnings = Vec::new();
    refuse_wrapper_config(root)?;
    let (arch, moe) = parse_arch(root)?;
    let family = match arch {
        Arch::Qwen3 if moe => "Qwen3MoeConfig",
        Arch::Qwen3 => "Qwen3Config",
        Arch::Llama => "LlamaConfig",
        Arch::Qwen35 => "Qwen3_5TextConfig",
    };
    let f = Fields::new(root, "");
    let uint = |key: &str| f.uint(key);
    let float = super::fields::float;
    let boolean = |key: &str| f.boolean(key);
    let need = |key: &str| f.need(key);
    if boolean("attention_bias")? == Some(true) || boolean("mlp_bias")? == Some(true) {
        anyhow::bail!("attention_bias/mlp_bias = true is not supported by the built-in runtime");
    }
    match root.get("hidden_act") {
        None | Some(Value::Null) => warnings.push(format!(
            "hidden_act absent: using silu ({family}'s default)"
        )),
        Some(Value::String(s)) if s == "silu" => {}
        Some(other) => anyhow::bail!(
            "hidden_act {other} is not supported; the built-in runtime implements SwiGLU with silu"
        ),
    }
    if boolean("use_sliding_window")? == Some(true) {
        anyhow::bail!(
            "use_sliding_window = true: sliding-window attention is not supported by the built-in runtime"
        );
    }
    if let Some(Value::Array(types)) = root.get("layer_types") {
        for (i, t) in types.iter().enumerate() {
            if t.as_str() != Some("full_attention") {
                anyhow::bail!(
                    "layer_types[{i}] = {t}: the built-in runtime runs full_attention layers only"
                );
            }
        }
    }
    let hidden_size = need("hidden_size")?;
    let num_heads = need("num_attention_heads")?;
    let num_kv_heads = match uint("num_key_value_heads")? {
        Some(n) => n,
        None => {
            warnings.push(format!(
                "num_key_value_heads absent: using num_attention_heads = {num_heads} (multi-head attention, {family}'s default)"
            ));
            num_heads
        }
    };
    if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        anyhow::bail!(
            "num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
        );
    }
    let head_dim = match uint("head_dim")? {
        Some(d) if d > 0 => d,
        Some(_) => anyhow::bail!("field 'head_dim' is 0"),
        None => {
            // transformers: Qwen3Config(head_dim=128); LlamaConfig derives H / heads.
            let d = match arch {
                // Qwen3MoeAttention: getattr(config, "head_dim", hidden_size // heads).
                Arch::Qwen3 if !moe => 128,
                Arch::Qwen35 => 256,
                Arch::Qwen3 | Arch::Llama => {
                    if hidden_size % num_heads != 0 {
                        anyhow::bail!(
                            "no head_dim and hidden_size is not a multiple of num_attention_heads"
                        );
                    }
                    hidden_size / num_heads
                }
            };
            warnings.push(format!("head_dim absent: using {d} ({family}'s default)"));
            d
        }
    };
    if head_dim % 2 != 0 {
        anyhow::bail!("head_dim {head_dim} is odd; RoPE needs an even head_dim");
    }
    let (rope_theta, rope_scaling) = parse_rope(root, family, &mut warnings, &float, false)?;
    let rms_norm_eps = match float(root, "rms_norm_eps", "")? {
        Some(e) if e > 0.0 && e.is_finite() => e as f32,
        Some(e) => anyhow::bail!("rms_norm_eps = {e}; expected a small positive number"),
        None => {
            warnings.push(format!(
                "rms_norm_eps absent: using 1e-6 ({family}'s default)"
            ));
            1e-6
        }
    };
    let tie_word_embeddings = match boolean("tie_word_embeddings")? {
        Some(b) => b,
        None => {
            warnings.push(format!(
                "tie_word_embeddings absent: using false ({family}'s default): lm_head.weight must be in the checkpoint"
            ));
            false
        }
    };
    let max_position_embeddings = match uint("max_position_embeddings")? {
        Some(n) if n > 0 => n,
        _ => {
            let d = match arch {
                Arch::Qwen3 | Arch::Qwen35 => 32_768,
                Arch::Llama => 2048,
            };
            warnings.push(format!(
                "max_position_embeddings absent: using {d} ({family}'s default)"
            ));
            d
        }
    };
    let dtype = config_dtype(root, &mut warnings);
    let eos_token_ids = config_eos_token_ids(root);
    let num_layers = need("num_hidden_layers")?;
    let moe = if moe {
        Some(super::moe::parse_moe(
            root,
            "",
            super::moe::MoeFamily::Qwen3,
            num_layers,
            &mut warnings,
        )?)
    } else {
        None
    };
    Ok(HfConfig {
        config: ModelConfig {
            arch,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: need("vocab_size")?,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings,
            eos_token_ids,
            rotary_dim: head_dim,
            hybrid: None,
            moe,
        },
        warnings,
        dtype,
    })
}

/// Refuse a multimodal or wrapper config (no top-level hidden_size, a text_config), naming both model types.
fn refuse_wrapper_config(root: &serde_json::Map<String, serde_json::Value>) -> anyhow::Result<()> {
    use serde_json::Value;
    if root.get("hidden_size").is_none() && root.get("text_config").is_some_and(|v| !v.is_null()) {
        let inner = root
            .get("text_config")
            .and_then(|t| t.get("model_type"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        let outer = root
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("?");
        anyhow::bail!(
            "model_type '{outer}' (text_config.model_type '{inner}') is a multimodal/wrapper \
                 config; the built-in runtime runs dense text decoders of model_type {} \
                 (architectures {})",
            SUPPORTED_MODEL_TYPES.join(", "),
            SUPPORTED_ARCHITECTURES.join(", ")
        );
    }
    Ok(())
}

/// The architecture from `model_type` (and whether it is Qwen3-MoE), checked against every
/// `architectures` entry.
fn parse_arch(root: &serde_json::Map<String, serde_json::Value>) -> anyhow::Result<(Arch, bool)> {
    use serde_json::Value;
    let model_type = match root.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => anyhow::bail!(
            "no model_type; the built-in runtime runs model_type {} (architectures {})",
            SUPPORTED_MODEL_TYPES.join(", "),
            SUPPORTED_ARCHITECTURES.join(", ")
        ),
        Some(other) => anyhow::bail!("field model_type: expected a string, found {other}"),
    };
    let arch = match model_type.as_str() {
        "qwen3" | "qwen3_moe" => Arch::Qwen3,
        "llama" => Arch::Llama,
        other => anyhow::bail!(
            "model_type '{other}' is not supported by the built-in runtime; it runs model_type \
                 {} (architectures {}); use an external engine (--url / --engine-cmd) for others",
            SUPPORTED_MODEL_TYPES.join(", "),
            SUPPORTED_ARCHITECTURES.join(", ")
        ),
    };
    if let Some(Value::Array(a)) = root.get("architectures") {
        let want = match arch {
            Arch::Qwen3 if model_type == "qwen3_moe" => "Qwen3MoeForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen35 => "Qwen3_5ForCausalLM",
        };
        for v in a {
            let name = v.as_str().unwrap_or("(not a string)");
            if name != want {
                anyhow::bail!(
                    "architecture '{name}' is not supported by the built-in runtime for \
                         model_type '{model_type}'; supported architectures: {}",
                    SUPPORTED_ARCHITECTURES.join(", ")
                );
            }
        }
    }
    Ok((arch, model_type == "qwen3_moe"))
}

/// The weights' dtype: `dtype`, else `torch_dtype` (a warning when they disagree).
fn config_dtype(
    root: &serde_json::Map<String, serde_json::Value>,
    warnings: &mut Vec<String>,
) -> Option<String> {
    use serde_json::Value;
    match (
        root.get("dtype").and_then(Value::as_str),
        root.get("torch_dtype").and_then(Value::as_str),
    ) {
        (Some(a), Some(b)) if a != b => {
            warnings.push(format!(
                "dtype = {a} and torch_dtype = {b} disagree: using dtype (transformers 5 reads dtype)"
            ));
            Some(a.to_string())
        }
        (Some(a), _) => Some(a.to_string()),
        (None, Some(b)) => Some(b.to_string()),
        (None, None) => None,
    }
}

/// `eos_token_id`: one id or a list.
fn config_eos_token_ids(root: &serde_json::Map<String, serde_json::Value>) -> Vec<u32> {
    use serde_json::Value;
    match root.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::*;

    #[test]
    fn hf_config_qwen3_and_llama() {
        let q = r#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","hidden_size":1024,
            "intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,
            "num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"rms_norm_eps":1e-06,
            "rope_theta":1000000,"max_position_embeddings":40960,"tie_word_embeddings":true,
            "eos_token_id":151645,"rope_scaling":null,"attention_bias":false}"#;
        let c = ModelConfig::parse_hf_config(q).unwrap().config;
        assert_eq!(c.arch, Arch::Qwen3);
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (16, 8, 128));
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![151645]);
        let l = r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
            "vocab_size":128256,"rope_theta":500000.0,"eos_token_id":[128001,128008,128009],
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::parse_hf_config(l).unwrap().config;
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.eos_token_ids.len(), 3);
        let f = c.rope_inv_freq();
        // Highest frequency unchanged, lowest divided by the factor.
        assert_eq!(f[0], 1.0);
        let plain = 1.0 / 500000f64.powf(126.0 / 128.0);
        assert!(((f[63] as f64) - plain / 8.0).abs() / (plain / 8.0) < 1e-5);
    }

    #[test]
    fn hf_config_errors_name_the_problem() {
        let e = ModelConfig::parse_hf_config("{not json").unwrap_err();
        assert!(format!("{e:#}").contains("JSON"));
        let e = ModelConfig::parse_hf_config(r#"{"model_type":"qwen3_next"}"#).unwrap_err();
        assert!(format!("{e:#}").contains("qwen3_next"));
        let e = ModelConfig::parse_hf_config(r#"{"model_type":"qwen3_moe"}"#).unwrap_err();
        assert!(format!("{e:#}").contains("hidden_size"));
        let e =
            ModelConfig::parse_hf_config(r#"{"model_type":"qwen3","hidden_size":8}"#).unwrap_err();
        assert!(format!("{e:#}").contains("num_attention_heads"));
        let e = ModelConfig::parse_hf_config(
            r#"{"model_type":"llama","hidden_size":64,"num_attention_heads":4,"num_key_value_heads":3,
            "intermediate_size":8,"num_hidden_layers":1,"vocab_size":8}"#,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("num_key_value_heads"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, "[]").unwrap();
        let e = ModelConfig::read_hf_config(&p).unwrap_err();
        assert!(e.to_string().contains("config.json"), "{e}");
    }

    #[test]
    fn transformers5_rope_parameters_and_dtype() {
        // The fixture's config.json as transformers 5.17 wrote it.
        let text = std::fs::read_to_string(
            "tests/fixtures/real/models/tiny-qwen3-transformers5/config.json",
        )
        .expect("tests/fixtures/real/models/tiny-qwen3-transformers5/config.json");
        let h = ModelConfig::parse_hf_config(&text).unwrap();
        assert_eq!(h.config.rope_theta, 1_000_000.0);
        assert_eq!(h.config.rope_scaling, RopeScaling::None);
        assert_eq!(h.dtype.as_deref(), Some("bfloat16"));
        assert_eq!((h.config.head_dim, h.config.num_kv_heads), (32, 2));
        assert!(!h.config.tie_word_embeddings);
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        // The same facts in the older form read the same.
        let old = r#"{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"hidden_size":128,
            "intermediate_size":256,"num_hidden_layers":2,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":32,"vocab_size":383,"rms_norm_eps":1e-6,
            "rope_theta":1000000.0,"rope_scaling":null,"torch_dtype":"bfloat16","hidden_act":"silu",
            "max_position_embeddings":2048,"tie_word_embeddings":false,"eos_token_id":3}"#;
        let o = ModelConfig::parse_hf_config(old).unwrap();
        assert_eq!(o.config, h.config);
        assert_eq!(o.dtype, h.dtype);
        // Llama 3.1 scaling under rope_parameters, as transformers 5 writes it.
        let l = r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,
            "vocab_size":128256,"rms_norm_eps":1e-5,"hidden_act":"silu","tie_word_embeddings":false,
            "max_position_embeddings":131072,"dtype":"bfloat16",
            "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;
        let c = ModelConfig::parse_hf_config(l).unwrap().config;
        assert_eq!(c.rope_theta, 500_000.0);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        // Linear scaling divides every frequency.
        let lin = l.replace(
            r#""rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192"#,
            r#""rope_type":"linear","rope_theta":500000.0,"factor":2.0"#,
        );
        let c2 = ModelConfig::parse_hf_config(&lin).unwrap().config;
        let mut plain = c2.clone();
        plain.rope_scaling = RopeScaling::None;
        assert_eq!(c2.rope_inv_freq()[5], plain.rope_inv_freq()[5] / 2.0);
    }

    #[test]
    fn math_fields_are_never_defaulted_silently() {
        let base = serde_json::json!({"model_type":"qwen3","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
            "vocab_size":300,"rms_norm_eps":1e-6,"rope_theta":10000.0,"hidden_act":"silu",
            "tie_word_embeddings":true,"max_position_embeddings":512});
        let with = |f: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
            let mut v = base.clone();
            f(v.as_object_mut().unwrap());
            ModelConfig::parse_hf_config(&v.to_string())
        };
        assert!(with(&|_| {}).unwrap().warnings.is_empty());
        // Each absent math field: a warning naming the field and the value used.
        for (field, value) in [
            ("rope_theta", "10000"),
            ("rms_norm_eps", "1e-6"),
            ("head_dim", "128"),
            ("num_key_value_heads", "4"),
            ("hidden_act", "silu"),
            ("tie_word_embeddings", "false"),
        ] {
            let h = with(&|m| {
                m.remove(field);
            })
            .unwrap();
            assert!(
                h.warnings
                    .iter()
                    .any(|w| w.contains(field) && w.contains(value)),
                "{field}: {:?}",
                h.warnings
            );
        }
        // Unknown or unsupported values: errors naming them.
        for (f, want) in [
            (
                serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}),
                "yarn",
            ),
            (
                serde_json::json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}),
                "dynamic",
            ),
            (
                serde_json::json!({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}),
                "low_freq_factor",
            ),
            (
                serde_json::json!({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
                "disagree",
            ),
            (
                serde_json::json!({"rope_parameters": {"rope_theta": 1e4, "mrope_section": [1, 2]}}),
                "mrope_section",
            ),
            (serde_json::json!({"hidden_act": "gelu"}), "gelu"),
            (serde_json::json!({"use_sliding_window": true}), "sliding"),
            (
                serde_json::json!({"layer_types": ["sliding_attention"]}),
                "sliding_attention",
            ),
            (
                serde_json::json!({"partial_rotary_factor": 0.5}),
                "partial_rotary_factor",
            ),
            (
                serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"]}),
                "Qwen3ForCausalLM",
            ),
            (serde_json::json!({"model_type": "mistral"}), "qwen3, llama"),
        ] {
            let e = with(&|m| {
                for (k, v) in f.as_object().unwrap() {
                    m.insert(k.clone(), v.clone());
                }
            })
            .unwrap_err();
            assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
        }
    }
}
