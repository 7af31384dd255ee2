//! `inspect` states only what the metadata says: a quantization fact cites a key that exists
//! (or says the key is missing and what the method was inferred from), an FP8 config without
//! `quant_method` is sized as FP8, sliding-window layers (gpt-oss's `layer_types`) are counted
//! apart from full attention, MXFP4 gets a verdict per card, and the MTP rule knows the
//! `model.layers.{num_hidden_layers}` convention (GLM-4.5, DeepSeek V3). Each kind with other
//! numbers too; the configs are small ones written for the test, in the published forms.

use std::path::Path;

use serde_json::{json, Value};

use super::*;

fn opts(cc: &str) -> InspectOptions {
    InspectOptions {
        cc: Some(cc.parse().unwrap()),
        card: Some("--cc".into()),
        ..Default::default()
    }
}

fn folder(config: &Value, hf_quant: Option<&Value>) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("config.json"), config.to_string()).unwrap();
    if let Some(h) = hf_quant {
        std::fs::write(d.path().join("hf_quant_config.json"), h.to_string()).unwrap();
    }
    d
}

fn llama(quant: Option<Value>) -> Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 256, "torch_dtype": "bfloat16", "max_position_embeddings": 4096
    });
    if let Some(q) = quant {
        c["quantization_config"] = q;
    }
    c
}

fn fact<'a>(r: &'a InspectReport, name: &str) -> &'a QuantFact {
    r.quantization
        .facts
        .iter()
        .find(|f| f.fact == name)
        .unwrap_or_else(|| panic!("no fact {name}: {:#?}", r.quantization.facts))
}

#[test]
fn facts_cite_keys_that_exist_and_fp8_is_sized_as_fp8() {
    // DeepSeek-V3's FP8 form without the quant_method key.
    let q = json!({"activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]});
    let d = folder(&llama(Some(q)), None);
    let r = inspect(d.path(), &opts("sm_90")).unwrap();
    let m = fact(&r, "quant_method");
    assert_eq!(m.value, "fp8");
    assert!(
        m.source
            .contains("inferred from config.json quantization_config.fmt")
            && m.source.contains("no quant_method key"),
        "{}",
        m.source
    );
    // Absent keys are named as absent, never cited as a source.
    assert_eq!(
        fact(&r, "KV cache").source,
        "config.json quantization_config.(no kv_cache_scheme key)"
    );
    assert_eq!(
        fact(&r, "excluded modules").source,
        "config.json quantization_config.(no ignore key)"
    );
    let q_proj = r
        .modules
        .iter()
        .find(|m| m.module.ends_with("q_proj"))
        .unwrap();
    assert!(q_proj.format.is_fp8(), "{:?}", q_proj.format);
    // Sized as FP8: about half the BF16 bytes of the same model.
    let fp8 = r.capacity.weight_bytes.unwrap();
    let plain = folder(&llama(None), None);
    let bf16 = inspect(plain.path(), &opts("sm_90"))
        .unwrap()
        .capacity
        .weight_bytes
        .unwrap();
    assert!(
        (fp8 as f64) < 0.6 * bf16 as f64,
        "FP8 {fp8} bytes vs BF16 {bf16}"
    );
    // Other forms: only weight_block_size; a quant_method key; a nested text_config.
    let d = folder(&llama(Some(json!({"weight_block_size": [128, 128]}))), None);
    let r = inspect(d.path(), &opts("sm_90")).unwrap();
    assert_eq!(fact(&r, "quant_method").value, "fp8");
    assert!(fact(&r, "quant_method")
        .source
        .contains("quantization_config.weight_block_size"));
    let d = folder(
        &llama(Some(
            json!({"quant_method": "fp8", "kv_cache_scheme": {"type": "float", "num_bits": 8}}),
        )),
        None,
    );
    let r = inspect(d.path(), &opts("sm_90")).unwrap();
    assert_eq!(
        fact(&r, "quant_method").source,
        "config.json quantization_config.quant_method"
    );
    assert_eq!(
        fact(&r, "KV cache").source,
        "config.json quantization_config.kv_cache_scheme"
    );
    let mut nested = llama(None);
    nested["text_config"] =
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}});
    let d = folder(&nested, None);
    let r = inspect(d.path(), &opts("sm_90")).unwrap();
    assert_eq!(
        fact(&r, "quant_method").source,
        "config.json text_config.quantization_config.quant_method"
    );
    // Nothing implies a method: it is called unknown, with the reason, not a cited key.
    let d = folder(&llama(Some(json!({"something": 1}))), None);
    let r = inspect(d.path(), &opts("sm_90")).unwrap();
    let m = fact(&r, "quant_method");
    assert_eq!(m.value, "unknown");
    assert!(m.source.contains("has no quant_method key"), "{}", m.source);
}

/// gpt-oss-20b's published config, trimmed to what `inspect` reads.
fn gpt_oss(layers: usize) -> Value {
    let types: Vec<&str> = (0..layers)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    json!({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": 2880, "num_hidden_layers": layers, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
        "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
        "sliding_window": 128, "layer_types": types, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4"
        }
    })
}

#[test]
fn sliding_window_layers_are_counted_apart() {
    for (layers, full) in [(24u64, 12u64), (36, 18)] {
        let d = folder(&gpt_oss(layers as usize), None);
        let r = inspect(d.path(), &opts("sm_100")).unwrap();
        assert_eq!(r.model.full_attention_layers, Some(full));
        assert_eq!(r.model.sliding_attention_layers, layers - full);
        assert_eq!(r.model.sliding_window, Some(128));
        let c = &r.capacity;
        // full layers × 2 × 8 KV heads × 64 × 2 bytes
        assert_eq!(c.kv_bytes_per_token, Some(full * 2 * 8 * 64 * 2));
        assert_eq!(
            c.sliding_bytes_per_token,
            Some((layers - full) * 2 * 8 * 64 * 2)
        );
        assert!(c.kv_not_modelled.is_none(), "{:?}", c.kv_not_modelled);
        assert!(
            c.assumptions
                .iter()
                .any(|a| a.contains("sliding-window layers") && a.contains("128 tokens")),
            "{:#?}",
            c.assumptions
        );
        assert!(!c
            .assumptions
            .iter()
            .any(|a| a.contains("counted as full attention")));
    }
    // Tokens and concurrency: one sequence's window reserved, the full layers per token.
    let d = folder(&gpt_oss(24), None);
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        json!({"metadata": {"total_size": 13_761_264_768u64}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}).to_string(),
    )
    .unwrap();
    let o = InspectOptions {
        gpu_memory_bytes: Some(80 << 30),
        gpu_memory_source: Some("test".into()),
        max_model_len: Some(4096),
        ..opts("sm_100")
    };
    let c = inspect(d.path(), &o).unwrap().capacity;
    let budget =
        ((80u64 << 30) as f64 * 0.9).floor() as u64 - 13_761_264_768 - DEFAULT_RESERVE_BYTES;
    let per_token = 12 * 2 * 8 * 64 * 2;
    let window_state = per_token * 128; // 12 sliding layers × the same per-layer bytes × 128
    assert_eq!(c.kv_tokens, Some((budget - window_state) / per_token));
    let conc = budget as f64 / (4096.0 * per_token as f64 + window_state as f64);
    assert!((c.max_concurrency.unwrap() - conc).abs() < 1e-9);
    // Sliding layers without a stated window stay counted as full attention, and say so.
    let mut no_window = gpt_oss(24);
    no_window.as_object_mut().unwrap().remove("sliding_window");
    let d = folder(&no_window, None);
    let r = inspect(d.path(), &opts("sm_100")).unwrap();
    assert_eq!(r.model.full_attention_layers, Some(24));
    assert!(r
        .capacity
        .assumptions
        .iter()
        .any(|a| a.contains("counted as full attention")));
}

#[test]
fn mxfp4_gets_a_verdict_per_card() {
    let d = folder(&gpt_oss(24), None);
    for (cc, support, path_has) in [
        (
            "sm_100",
            crate::rig::Support::Native,
            "tcgen05.mma kind::mxf4",
        ),
        ("sm_103", crate::rig::Support::Native, "tcgen05"),
        (
            "sm_120",
            crate::rig::Support::Native,
            "mma.sync block_scale kind::mxf4",
        ),
        ("sm_90", crate::rig::Support::Fallback, "weight-only"),
        ("sm_86", crate::rig::Support::Fallback, "Marlin"),
        ("sm_75", crate::rig::Support::Unsupported, "none"),
    ] {
        let r = inspect(d.path(), &opts(cc)).unwrap();
        let v = r
            .card
            .verdicts
            .iter()
            .find(|v| v.format.starts_with("MXFP4"))
            .unwrap_or_else(|| panic!("{cc}: {:#?}", r.card));
        assert_eq!(v.support, Some(support), "{cc}");
        assert!(v.path.contains(path_has), "{cc}: {}", v.path);
    }
}

/// GLM-4.5 / DeepSeek V3 style: MTP at `model.layers.{num_hidden_layers}`.
fn nextn(layers: u64, exclude: &[&str]) -> (Value, Value) {
    let cfg = json!({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
        "hidden_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 256, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16"
    });
    let hf = json!({
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": null,
                          "exclude_modules": exclude}
    });
    (cfg, hf)
}

#[test]
fn mtp_rule_knows_the_appended_layer_convention() {
    for layers in [92u64, 61, 4] {
        let pattern = format!("model.layers.{layers}*");
        let (cfg, hf) = nextn(layers, &["lm_head", &pattern]);
        let d = folder(&cfg, Some(&hf));
        let r = inspect(d.path(), &opts("sm_100")).unwrap();
        assert!(
            r.findings_of("mtp-not-excluded").is_empty(),
            "{layers}: {:#?}",
            r.findings
        );
        // Without the entry: warned, with the pattern that would fix it.
        let (cfg, hf) = nextn(layers, &["lm_head"]);
        let d = folder(&cfg, Some(&hf));
        let r = inspect(d.path(), &opts("sm_100")).unwrap();
        let f = r.findings_of("mtp-not-excluded");
        assert_eq!(f.len(), 1, "{layers}: {:#?}", r.findings);
        assert!(f[0].detail.contains(&pattern), "{}", f[0].detail);
        // Another layer's entry does not cover it.
        let other = format!("model.layers.{}*", layers + 1);
        let (cfg, hf) = nextn(layers, &["lm_head", &other]);
        let d = folder(&cfg, Some(&hf));
        let r = inspect(d.path(), &opts("sm_100")).unwrap();
        assert_eq!(r.findings_of("mtp-not-excluded").len(), 1, "{layers}");
    }
    // compressed-tensors regex form, and the keys without the `model.` prefix.
    let (cfg, _) = nextn(61, &[]);
    let mut cfg = cfg;
    cfg["quantization_config"] = json!({
        "quant_method": "compressed-tensors",
        "ignore": ["lm_head", "re:.*layers[.]61[.].*"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16},
                                      "input_activations": {"num_bits": 4, "type": "float", "group_size": 16}}}
    });
    let d = folder(&cfg, None);
    let r = inspect(d.path(), &opts("sm_100")).unwrap();
    assert!(
        r.findings_of("mtp-not-excluded").is_empty(),
        "{:#?}",
        r.findings
    );
}

#[test]
fn redaction_rewrites_inputs_only() {
    let d = folder(&llama(None), None);
    let mut r = inspect(
        d.path(),
        &InspectOptions {
            gpu_memory_bytes: Some(24 << 30),
            gpu_memory_source: Some("test".into()),
            ..opts("sm_90")
        },
    )
    .unwrap();
    let dir = d.path().display().to_string();
    r.redact_inputs(&|s: &str| s.replace(&dir, "<cwd>/ckpt").replace("token", "<token>"));
    let md = render_markdown(&r);
    assert!(md.contains("<cwd>/ckpt"), "{md}");
    assert!(!md.contains(&dir));
    // rigbench's own words are not passed through the redactor.
    assert!(
        md.contains("KV bytes per token = full-attention layers"),
        "{md}"
    );
    let _ = Path::new(".");
}
