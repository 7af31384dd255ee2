//! `inspect` on metadata forms that used to read wrong: ModelOpt's export object inside
//! config.json without a `quant_method` key, and latent attention (MLA) configs. Config-only
//! checkpoints (what `hf://` reads before a download), written here from the keys the real
//! exports carry (`tests/fixtures/real/configs/nvidia--Llama-3.1-70B-Instruct-FP8__*.json` for
//! ModelOpt's object; DeepSeek-V3's published config.json keys for MLA).

use std::path::Path;

use rigbench::checkpoint::{inspect, InspectOptions, InspectReport};
use serde_json::{json, Value};

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn sm90() -> InspectOptions {
    InspectOptions {
        cc: Some("sm_90".parse().unwrap()),
        card: Some("--cc".into()),
        ..Default::default()
    }
}

fn llama() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 2048,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": false
    })
}

/// ModelOpt's export object, as nvidia/Llama-3.1-70B-Instruct-FP8's hf_quant_config.json has it.
fn modelopt_fp8() -> Value {
    json!({
        "producer": {"name": "modelopt", "version": "0.23.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    })
}

fn rows(r: &InspectReport) -> Vec<(String, String)> {
    r.modules
        .iter()
        .map(|m| (m.module.clone(), m.format.to_string()))
        .collect()
}

/// The object inside config.json (`quantization_config: {"producer", "quantization"}`, no
/// `quant_method`, no hf_quant_config.json) is the same FP8 checkpoint as the file form: every
/// Linear FP8 (not BF16, so the weights are not sized at twice their bytes) and its producer
/// read from config.json.
#[test]
fn modelopt_export_form_inside_config_json_is_read_as_modelopt() {
    let file_form = tempfile::tempdir().unwrap();
    write(file_form.path(), "config.json", &llama());
    write(file_form.path(), "hf_quant_config.json", &modelopt_fp8());
    let nested = tempfile::tempdir().unwrap();
    let mut c = llama();
    c["quantization_config"] = modelopt_fp8();
    write(nested.path(), "config.json", &c);

    let a = inspect(file_form.path(), &sm90()).unwrap();
    let b = inspect(nested.path(), &sm90()).unwrap();
    assert_eq!(rows(&b), rows(&a));
    assert!(
        rows(&b)
            .iter()
            .any(|(m, f)| m.contains("q_proj") && f.contains("FP8")),
        "{:?}",
        rows(&b)
    );
    assert!(b.capacity.weight_bytes.is_some());
    assert_eq!(b.capacity.weight_bytes, a.capacity.weight_bytes);
    let src = &b.quantization.sources[0];
    assert_eq!(src.file, "config.json");
    assert_eq!(src.quant_method, "modelopt");
    assert!(src.quant_method_evidence.contains("no quant_method key"));
    assert_eq!(src.producer.as_deref(), Some("modelopt 0.23.0"));
    assert_eq!(src.kv_cache.as_deref(), Some("FP8"));
}

/// Latent attention (MLA, DeepSeek-V3's config keys): no "head_dim = hidden / heads" figure
/// (7168 / 128 = 56 is no dimension of this model); the table names the keys that hold them.
#[test]
fn mla_models_get_no_hidden_over_heads_head_dim() {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "config.json",
        &json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "num_hidden_layers": 61,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "n_routed_experts": 256,
            "num_experts_per_tok": 8,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "vocab_size": 129280,
            "torch_dtype": "bfloat16"
        }),
    );
    let r = inspect(d.path(), &sm90()).unwrap();
    let md = rigbench::checkpoint::render_markdown(&r);
    assert!(!md.contains("56 (hidden / heads)"), "{md}");
    assert!(md.contains("qk_nope_head_dim + qk_rope_head_dim"), "{md}");
}
