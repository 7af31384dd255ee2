//! Tests on the real configs in `tests/fixtures/real/configs/` (copied into a temporary
//! checkpoint folder at test time, never into the project), with the values a person reading
//! them extracts.

use std::path::PathBuf;

use super::*;

fn fixtures() -> PathBuf {
    crate::real_fixture("configs")
}

/// A temp checkpoint folder holding `<stem>__config.json` (and `__hf_quant_config.json`).
fn folder(stem: &str) -> tempfile::TempDir {
    let src = fixtures();
    assert!(
        src.join(format!("{stem}__config.json")).is_file(),
        "fixture {stem}__config.json missing from {}",
        src.display()
    );
    let d = tempfile::tempdir().unwrap();
    for f in ["config.json", "hf_quant_config.json"] {
        let p = src.join(format!("{stem}__{f}"));
        if p.exists() {
            std::fs::copy(&p, d.path().join(f)).unwrap();
        }
    }
    d
}

fn row<'a>(r: &'a InspectReport, module_suffix: &str) -> Vec<&'a ModuleRow> {
    r.modules
        .iter()
        .filter(|m| m.module.ends_with(module_suffix))
        .collect()
}

fn fmt_of(r: &InspectReport, module_suffix: &str) -> ModuleFormat {
    let rows = row(r, module_suffix);
    assert!(!rows.is_empty(), "no row ends with {module_suffix}");
    let f = rows[0].format.clone();
    assert!(
        rows.iter().all(|x| x.format == f),
        "{module_suffix} has several formats: {rows:?}"
    );
    f
}

fn fp8_static() -> ModuleFormat {
    ModuleFormat::Fp8 {
        scaling: "per-tensor".into(),
        activations: "static".into(),
    }
}

const W4A16: ModuleFormat = ModuleFormat::Nvfp4 {
    activations_4bit: false,
    group_size: 16,
};
const W4A4: ModuleFormat = ModuleFormat::Nvfp4 {
    activations_4bit: true,
    group_size: 16,
};

fn opts_sm(cc: &str) -> InspectOptions {
    InspectOptions {
        cc: Some(cc.parse().unwrap()),
        card: Some("--cc".into()),
        ..Default::default()
    }
}

#[test]
fn qwen36_mixed_precision() {
    let d = folder("nvidia--Qwen3.6-35B-A3B-NVFP4");
    let r = inspect(d.path(), &opts_sm("sm_90")).unwrap();
    let m = &r.model;
    assert_eq!(m.architectures, vec!["Qwen3_5MoeForConditionalGeneration"]);
    assert!(m.from_text_config);
    assert_eq!(m.num_hidden_layers, Some(40));
    assert_eq!(m.hidden_size, Some(2048));
    assert_eq!(m.num_attention_heads, Some(16));
    assert_eq!(m.num_key_value_heads, Some(2));
    assert_eq!(m.head_dim, Some(256));
    assert!(!m.head_dim_derived);
    assert_eq!(m.moe_intermediate_size, Some(512));
    assert_eq!(m.shared_expert_intermediate_size, Some(512));
    assert_eq!(m.num_experts, Some(256));
    assert_eq!(m.num_experts_per_tok, Some(8));
    assert_eq!(m.vocab_size, Some(248320));
    assert_eq!(m.tie_word_embeddings, Some(false));
    assert_eq!(m.full_attention_layers, Some(10));
    assert_eq!(m.linear_attention_layers, 30);
    assert_eq!(m.layer_type(3), "full_attention");
    assert_eq!(m.layer_type(4), "linear_attention");
    assert_eq!(m.mtp_layers, Some(1));
    assert_eq!(m.mtp_field.as_deref(), Some("mtp_num_hidden_layers"));

    // Metadata: both files, vLLM follows config.json; facts carry their files.
    let q = &r.quantization;
    assert_eq!(q.followed.as_deref(), Some("config.json"));
    assert_eq!(q.sources.len(), 2);
    let hf = q
        .sources
        .iter()
        .find(|s| s.file == "hf_quant_config.json")
        .unwrap();
    let cfg = q.sources.iter().find(|s| s.file == "config.json").unwrap();
    assert_eq!(hf.quant_algo.as_deref(), Some("MIXED_PRECISION"));
    assert_eq!(hf.kv_cache.as_deref(), Some("FP8"));
    assert_eq!(cfg.kv_cache, None);
    assert_eq!(hf.producer.as_deref(), Some("modelopt 0.44.0"));
    assert_eq!(cfg.producer.as_deref(), Some("modelopt 0.37.0"));
    assert_eq!(hf.exclude, vec!["mtp.layers.0*", "mtp*"]);
    assert_eq!(hf.quantized_layers.get("FP8"), Some(&130));
    assert_eq!(
        hf.quantized_layers.get("W4A16_NVFP4 (group 16)"),
        Some(&161)
    );
    assert!(q.facts.iter().any(|f| f.fact == "KV cache"
        && f.value == "FP8"
        && f.source.starts_with("hf_quant_config.json")));

    // Formats a reader extracts.
    for m in [
        "linear_attn.in_proj_qkv",
        "linear_attn.in_proj_z",
        "linear_attn.out_proj",
        "language_model.layers.*.self_attn.q_proj",
        "language_model.layers.*.self_attn.k_proj",
        "language_model.layers.*.self_attn.v_proj",
        "language_model.layers.*.self_attn.o_proj",
    ] {
        assert_eq!(fmt_of(&r, m), fp8_static(), "{m}");
    }
    assert_eq!(
        row(&r, "linear_attn.in_proj_qkv")[0].layers,
        "all 30 linear_attention layers"
    );
    assert_eq!(
        row(&r, "language_model.layers.*.self_attn.q_proj")[0].count,
        10
    );
    for m in [
        "language_model.layers.*.mlp.experts.*.gate_proj",
        "language_model.layers.*.mlp.experts.*.down_proj",
        "language_model.layers.*.mlp.shared_expert.gate_proj",
        "language_model.layers.*.mlp.shared_expert.up_proj",
        "language_model.layers.*.mlp.shared_expert.down_proj",
        "lm_head",
    ] {
        assert_eq!(fmt_of(&r, m), W4A16, "{m}");
    }
    assert_eq!(fmt_of(&r, "linear_attn.in_proj_a"), ModuleFormat::Bf16);
    assert_eq!(fmt_of(&r, "linear_attn.in_proj_b"), ModuleFormat::Bf16);
    assert!(row(&r, "linear_attn.in_proj_a")[0]
        .declared
        .contains("not in quantized_layers"));
    for m in r.modules.iter().filter(|m| m.kind == LayerKind::Mtp) {
        assert_eq!(m.format, ModuleFormat::Bf16, "{m:?}");
        assert!(m.declared.contains("ignore 'mtp"), "{m:?}");
    }

    // Findings: the disagreements between the files, no GDN/MTP problem, no error.
    assert!(!r.has_errors(), "{:#?}", r.findings);
    assert!(r.findings_of("gdn-ab-quantized").is_empty());
    assert!(r.findings.iter().all(|f| !f.rule.starts_with("mtp")));
    let dis = r.findings_of("config-disagreement");
    assert!(
        dis.iter()
            .any(|f| f.detail.starts_with("KV cache")
                && f.detail.contains("vLLM follows config.json"))
    );
    assert!(dis
        .iter()
        .any(|f| f.detail.contains("0.44.0") && f.detail.contains("0.37.0")));
    assert!(dis.iter().any(|f| f.detail.contains("group_1")
        && f.detail.contains("W4A4")
        && f.detail.contains("161")));
    let lm = r.findings_of("lm-head-quantized");
    assert_eq!(lm.len(), 1);
    assert_eq!(lm[0].severity, Severity::Info);
    let nos = r.findings_of("no-safetensors");
    assert_eq!(nos.len(), 1);
    assert!(nos[0].detail.contains("k_scale/v_scale"));
    assert!(r
        .tensors
        .skipped_reason
        .as_deref()
        .unwrap()
        .contains("tensor-level checks skipped"));

    // Card verdicts on sm_90: all native (W4A16 is weight-only).
    assert!(r
        .card
        .verdicts
        .iter()
        .all(|v| v.support == Some(Support::Native)));
    assert!(r
        .card
        .verdicts
        .iter()
        .any(|v| v.gemm_format == Some(GemmFormat::W4a16)));

    // Capacity: BF16 KV (config.json declares none), GDN state per sequence.
    let c = &r.capacity;
    assert_eq!(c.kind, "prediction");
    assert_eq!(c.kv_dtype.as_deref(), Some("BF16"));
    assert_eq!(c.kv_bytes_per_token, Some(10 * 2 * 2 * 256 * 2));
    assert_eq!(
        c.state_bytes_per_sequence,
        Some(30 * (8192 * 3 * 2 + 32 * 128 * 128 * 4))
    );
    assert!(c.weight_source.starts_with("estimate"));
    assert!(c.kv_tokens.is_none());
    assert!(c.not_computed.iter().any(|n| n.contains("--gpu-mem-gib")));

    // With FP8 KV and a memory size, the numbers follow the formulas.
    let o = InspectOptions {
        kv_cache_dtype: Some(KvCacheDtype::Fp8),
        gpu_memory_bytes: Some(32 << 30),
        max_model_len: Some(131072),
        ..opts_sm("sm_120")
    };
    let r2 = inspect(d.path(), &o).unwrap();
    let c = &r2.capacity;
    assert_eq!(c.kv_bytes_per_token, Some(10240));
    let w = c.weight_bytes.unwrap();
    let budget =
        ((32u64 << 30) as f64 * 0.9).floor() as i64 - w as i64 - DEFAULT_RESERVE_BYTES as i64;
    assert_eq!(c.kv_budget_bytes, Some(budget));
    let state = c.state_bytes_per_sequence.unwrap();
    assert_eq!(c.kv_tokens, Some((budget as u64 - state) / 10240));
    let conc = budget as f64 / (131072.0 * 10240.0 + state as f64);
    assert!((c.max_concurrency.unwrap() - conc).abs() < 1e-9);
    // Weights estimate sits where the real checkpoint does (tens of GiB, not 2 or 200).
    assert!((15u64 << 30..30u64 << 30).contains(&w), "{w}");
}

#[test]
fn qwen35_nvfp4_with_exclude_list() {
    let d = folder("nvidia--Qwen3.5-122B-A10B-NVFP4");
    let r = inspect(d.path(), &opts_sm("sm_90")).unwrap();
    assert_eq!(r.model.num_hidden_layers, Some(48));
    assert_eq!(r.model.hidden_size, Some(3072));
    assert_eq!(r.model.full_attention_layers, Some(12));
    assert_eq!(r.model.linear_attention_layers, 36);
    // Only routed experts are FP4.
    for row in &r.modules {
        if row.kind == LayerKind::MoeExperts {
            assert_eq!(row.format, W4A4, "{row:?}");
        } else {
            assert_eq!(row.format, ModuleFormat::Bf16, "{row:?}");
        }
    }
    for kind in [
        LayerKind::LinearAttention,
        LayerKind::FullAttention,
        LayerKind::SharedExpert,
        LayerKind::LmHead,
        LayerKind::Vision,
        LayerKind::Mtp,
    ] {
        let rows: Vec<_> = r.modules.iter().filter(|m| m.kind == kind).collect();
        assert!(!rows.is_empty(), "{kind:?}");
        assert!(
            rows.iter().all(|m| m.declared.contains("ignore")),
            "{kind:?}: {rows:?}"
        );
    }
    let q = &r.quantization;
    assert!(q
        .sources
        .iter()
        .all(|s| s.kv_cache.as_deref() == Some("FP8")));
    assert!(q.sources.iter().all(|s| s.exclude.len() == 148));
    assert!(
        r.findings_of("config-disagreement").is_empty(),
        "{:#?}",
        r.findings
    );
    // W4A4 on Hopper is a fallback; on Blackwell native.
    let fb = r.findings_of("format-fallback-on-card");
    assert_eq!(fb.len(), 1);
    assert!(fb[0].detail.contains("W4A4"));
    assert!(!r.has_errors());
    let r = inspect(d.path(), &opts_sm("sm_100")).unwrap();
    assert!(r.findings_of("format-fallback-on-card").is_empty());
    assert_eq!(r.capacity.kv_dtype.as_deref(), Some("FP8"));
    assert_eq!(r.capacity.kv_bytes_per_token, Some(12 * 2 * 2 * 256));
}

#[test]
fn llama_fp8_metadata_only_in_hf_quant_config() {
    let d = folder("nvidia--Llama-3.1-70B-Instruct-FP8");
    let r = inspect(d.path(), &InspectOptions::default()).unwrap();
    assert_eq!(r.model.num_hidden_layers, Some(80));
    assert_eq!(r.model.num_key_value_heads, Some(8));
    assert_eq!(r.model.head_dim, Some(128));
    assert!(r.model.head_dim_derived);
    assert_eq!(r.model.intermediate_size, Some(28672));
    assert_eq!(r.model.vocab_size, Some(128256));
    assert_eq!(
        r.quantization.followed.as_deref(),
        Some("hf_quant_config.json")
    );
    assert_eq!(r.quantization.sources.len(), 1);
    for m in [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ] {
        assert_eq!(fmt_of(&r, m), fp8_static(), "{m}");
    }
    assert_eq!(fmt_of(&r, "lm_head"), ModuleFormat::Bf16);
    assert_eq!(fmt_of(&r, "embed_tokens"), ModuleFormat::Bf16);
    assert_eq!(r.capacity.kv_dtype.as_deref(), Some("FP8"));
    assert_eq!(r.capacity.kv_bytes_per_token, Some(80 * 2 * 8 * 128));
    assert!(r.findings_of("no-safetensors")[0]
        .detail
        .contains("k_scale/v_scale"));
    // No GPU and no --cc: said so, verdicts skipped.
    assert!(r.card.verdicts.is_empty());
    assert!(r.card.skipped.is_some());
    assert!(!r.has_errors());
}

#[test]
fn deepseek_v4_compressed_tensors() {
    let d = folder("RedHatAI--DeepSeek-V4-Flash-NVFP4-FP8");
    let r = inspect(d.path(), &opts_sm("sm_100")).unwrap();
    assert_eq!(r.model.num_hidden_layers, Some(43));
    assert_eq!(r.model.num_experts, Some(256));
    assert_eq!(r.model.head_dim, Some(512));
    assert_eq!(r.model.num_key_value_heads, Some(1));
    assert_eq!(r.model.mtp_layers, Some(1));
    let src = &r.quantization.sources[0];
    assert_eq!(src.quant_method, "compressed-tensors");
    assert_eq!(src.format.as_deref(), Some("mixed-precision"));
    assert!(src.exclude.is_empty());
    assert_eq!(src.kv_cache, None);
    let g0 = src.groups.iter().find(|g| g.name == "group_0").unwrap();
    assert_eq!(g0.format, "FP8 W8A8 (block 128x128, dynamic activations)");
    let g1 = src.groups.iter().find(|g| g.name == "group_1").unwrap();
    assert_eq!(g1.format, "W4A4 NVFP4 (group 16)");
    assert_eq!(g1.ct_format.as_deref(), Some("nvfp4-pack-quantized"));
    // Module names unknown: rows are the rules.
    assert!(r.module_source.starts_with("unknown"));
    assert!(r
        .modules
        .iter()
        .any(|m| m.format == W4A4 && m.module.contains("ffn")));
    // MTP layer: nothing excludes it; whether the regexes hit it is unknown without headers.
    let mtp = r.findings_of("mtp-not-excluded");
    assert_eq!(mtp.len(), 1);
    assert_eq!(mtp[0].severity, Severity::Warning);
    assert!(mtp[0].detail.contains("group_1"));
    assert!(r.capacity.weight_bytes.is_none());
    // Compressed / indexed / sliding attention: no dense per-token figure.
    assert!(r
        .capacity
        .kv_not_modelled
        .as_deref()
        .is_some_and(|w| w.contains("sliding_window") && w.contains("compress_ratios")));
    assert_eq!(r.capacity.kv_bytes_per_token, None);
    assert!(r
        .card
        .verdicts
        .iter()
        .any(|v| v.gemm_format == Some(GemmFormat::W4a4) && v.support == Some(Support::Native)));
    assert!(!r.has_errors());
}

#[test]
fn render_covers_every_section() {
    let d = folder("nvidia--Qwen3.6-35B-A3B-NVFP4");
    let r = inspect(d.path(), &opts_sm("sm_90")).unwrap();
    let md = render_markdown(&r);
    for s in [
        "## Checkpoint",
        "### Model",
        "### Quantization metadata",
        "### Modules by layer kind",
        "### Findings",
        "### Formats on this card: sm_90",
        "### Capacity (prediction)",
        "assumption:",
        "config-disagreement",
    ] {
        assert!(md.contains(s), "missing {s}");
    }
    // JSON round trip (the report is embedded in the results schema).
    let v = serde_json::to_string(&r).unwrap();
    let back: InspectReport = serde_json::from_str(&v).unwrap();
    assert_eq!(back, r);
}

#[test]
fn bad_inputs_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("nope");
    let e = inspect(&missing, &InspectOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("nope"), "{e:#}");
    let e = inspect(d.path(), &InspectOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("config.json"), "{e:#}");
    std::fs::write(d.path().join("config.json"), "{\"hidden_size\": 4,").unwrap();
    let e = inspect(d.path(), &InspectOptions::default()).unwrap_err();
    assert!(
        format!("{e:#}").contains("config.json: not valid JSON"),
        "{e:#}"
    );
    std::fs::write(d.path().join("config.json"), b"{\"a\": \"\xff\"}").unwrap();
    let e = inspect(d.path(), &InspectOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("not UTF-8"), "{e:#}");
    std::fs::write(d.path().join("config.json"), "[1]").unwrap();
    let e = inspect(d.path(), &InspectOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("JSON object"), "{e:#}");
    std::fs::write(d.path().join("config.json"), "{}").unwrap();
    std::fs::write(
        d.path().join("hf_quant_config.json"),
        "{\"quantization\": 3}",
    )
    .unwrap();
    let e = inspect(d.path(), &InspectOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("hf_quant_config.json"), "{e:#}");
    std::fs::remove_file(d.path().join("hf_quant_config.json")).unwrap();
    // Bare config: works, says what it does not know.
    let r = inspect(d.path(), &InspectOptions::default()).unwrap();
    assert!(r.modules.is_empty());
    assert!(r.capacity.kv_bytes_per_token.is_none());
    let bad = InspectOptions {
        gpu_memory_utilization: 1.5,
        ..Default::default()
    };
    assert!(inspect(d.path(), &bad).is_err());
}

#[test]
fn unsupported_card_unknown_method_and_bad_pattern() {
    let d = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 256, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}
    });
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    // FP8 on Turing: no FP8 tensor cores and no Marlin-style fallback below sm_80.
    let r = inspect(d.path(), &opts_sm("sm_75")).unwrap();
    let u = r.findings_of("format-unsupported-on-card");
    assert_eq!(u.len(), 1, "{:#?}", r.findings);
    assert_eq!(u[0].severity, Severity::Error);
    assert!(r.has_errors());
    // On Ampere it is a fallback (W8A16), on Hopper native.
    let r = inspect(d.path(), &opts_sm("sm_86")).unwrap();
    assert_eq!(r.findings_of("format-fallback-on-card").len(), 1);
    assert!(!r.has_errors());

    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 256,
        "quantization_config": {"quant_method": "hqq-like-something"}
    });
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    let r = inspect(d.path(), &opts_sm("sm_90")).unwrap();
    assert_eq!(
        r.findings_of("unknown-quant-method").len(),
        1,
        "{:#?}",
        r.findings
    );

    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 256,
        "quantization_config": {"quant_method": "compressed-tensors", "ignore": ["re:(unclosed"],
            "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    });
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    let r = inspect(d.path(), &opts_sm("sm_90")).unwrap();
    assert_eq!(r.findings_of("bad-pattern").len(), 1, "{:#?}", r.findings);
    // Weight-only FP8 (no input_activations) has no GEMM format: described, not classified.
    let v = r
        .card
        .verdicts
        .iter()
        .find(|v| v.format.contains("W8A16"))
        .unwrap();
    assert_eq!(v.support, None);
    assert!(v.path.contains("weight-only FP8"));
}
