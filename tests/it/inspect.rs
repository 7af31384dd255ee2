//! `rigbench inspect` on small generated checkpoints (real safetensors files with tiny tensors)
//! under `tests/fixtures/checkpoints/`, through the library: lint rules, module formats, card
//! verdicts. The binary's exit codes, flags and bad input are in `tests/it/inspect_binary.rs`.
//!
//! The committed checkpoints are written by [`regenerate_checkpoint_fixtures`] with the
//! generator in `tests/common/checkpoints.rs`; after changing the generator, rewrite them with
//! `cargo test --test it -- --ignored regenerate_checkpoint_fixtures`.
//! [`committed_fixtures_match_the_generator`] fails when they are stale.
//!
//! | folder | what it is | expected |
//! |---|---|---|
//! | `qwen36-mixed-clean` | NVIDIA's Qwen3.6 MIXED_PRECISION recipe on a tiny hybrid MoE: experts and shared expert W4A16 NVFP4; attention q/k/v/o and GDN in_proj_qkv/z/out_proj FP8; in_proj_a/b, conv1d, lm_head, MTP and vision BF16; FP8 KV with k/v scales | exit 0, no warning |
//! | `qwen36-bad-ab-mtp` | the same with in_proj_a/b and the MTP experts in W4A16 NVFP4, MTP not excluded | exit 4: `gdn-ab-quantized`, `mtp-4bit` |
//! | `llama-fp8-kv-no-scales` | ModelOpt FP8 dense model declaring an FP8 KV cache without k_scale/v_scale | exit 0, `kv-fp8-no-scales` warning |
//! | `llama-ct-nvfp4` | compressed-tensors `nvfp4-pack-quantized` W4A4, two shards + index | exit 0; fallback on sm_90, native on sm_120 |
//! | `llama-bf16` | plain BF16, tied embeddings | exit 0, no finding |

use crate::checkpoints;

use rigbench::checkpoint::{inspect, InspectOptions, ModuleFormat, Severity};
use safetensors::Dtype;
use serde_json::{json, Value};

use checkpoints::{fixture_root, fixture_specs, Spec, Store, H, P};

// ---------------------------------------------------------------- fixtures match the generator

/// Rewrites `tests/fixtures/checkpoints/` (run with `--ignored` after changing the generator).
#[test]
#[ignore = "rewrites the committed fixtures; run explicitly"]
fn regenerate_checkpoint_fixtures() {
    let root = fixture_root();
    for (name, spec) in fixture_specs() {
        let dir = root.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        spec.write(&dir);
    }
}

#[test]
fn committed_fixtures_match_the_generator() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, spec) in fixture_specs() {
        let want = tmp.path().join(name);
        spec.write(&want);
        let have = fixture_root().join(name);
        let mut files: Vec<String> = std::fs::read_dir(&want)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        for f in files {
            let a = std::fs::read(want.join(&f)).unwrap();
            let b = std::fs::read(have.join(&f)).unwrap_or_default();
            assert!(
                a == b,
                "{name}/{f} differs from the generator; run `cargo test --test it -- --ignored regenerate_checkpoint_fixtures`"
            );
        }
    }
}

// ---------------------------------------------------------------- library-level checks

fn sm(cc: &str) -> InspectOptions {
    InspectOptions {
        cc: Some(cc.parse().unwrap()),
        card: Some("--cc".into()),
        ..Default::default()
    }
}

fn rules_of(r: &rigbench::checkpoint::InspectReport, sev: Severity) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.severity == sev)
        .map(|f| f.rule.clone())
        .collect()
}

#[test]
fn clean_recipe_has_no_warning() {
    let r = inspect(&fixture_root().join("qwen36-mixed-clean"), &sm("sm_90")).unwrap();
    assert!(
        rules_of(&r, Severity::Error).is_empty(),
        "{:#?}",
        r.findings
    );
    assert!(
        rules_of(&r, Severity::Warning).is_empty(),
        "{:#?}",
        r.findings
    );
    assert!(r.tensors.headers_read);
    let f = |suffix: &str| {
        r.modules
            .iter()
            .find(|m| m.module.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix}"))
            .clone()
    };
    assert_eq!(f("linear_attn.in_proj_a").format, ModuleFormat::Bf16);
    assert_eq!(f("linear_attn.conv1d").format, ModuleFormat::Bf16);
    let qkv = f("linear_attn.in_proj_qkv");
    assert_eq!(
        qkv.format.to_string(),
        "FP8 W8A8 (per-tensor, static activation scale)"
    );
    assert!(
        qkv.evidence.contains("weight F8_E4M3 [48, 16]"),
        "{}",
        qkv.evidence
    );
    assert!(qkv.evidence.contains("input_scale present"));
    let ex = f("language_model.layers.*.mlp.experts.*.up_proj");
    assert_eq!(ex.format.to_string(), "W4A16 NVFP4 (group 16)");
    assert_eq!(ex.count, 4);
    assert!(
        ex.evidence
            .contains("weight U8 [16, 8] + weight_scale F8_E4M3 [16, 1] + weight_scale_2 F32 []"),
        "{}",
        ex.evidence
    );
    assert!(ex.evidence.contains("no input_scale"));
    assert_eq!(
        f("mtp.layers.*.mlp.experts.*.up_proj").format,
        ModuleFormat::Bf16
    );
    assert_eq!(
        f("model.visual.blocks.*.attn.qkv").format,
        ModuleFormat::Bf16
    );
    // Capacity from the headers: exact weight bytes, KV per token, GDN state.
    let c = &r.capacity;
    assert_eq!(c.weight_bytes, Some(r.tensors.total_bytes));
    assert!(c.weight_source.starts_with("exact"));
    assert_eq!(c.kv_dtype.as_deref(), Some("FP8"));
    assert_eq!(c.kv_bytes_per_token, Some(2 * 8));
    assert_eq!(c.state_bytes_per_sequence, Some(48 * 3 * 2 + 2 * 8 * 8 * 4));
}

#[test]
fn bad_recipe_fires_gdn_and_mtp_errors() {
    let r = inspect(&fixture_root().join("qwen36-bad-ab-mtp"), &sm("sm_90")).unwrap();
    assert!(r.has_errors());
    let errs = rules_of(&r, Severity::Error);
    assert!(errs.contains(&"gdn-ab-quantized".to_string()), "{errs:?}");
    assert!(errs.contains(&"mtp-4bit".to_string()), "{errs:?}");
    let gdn = &r.findings_of("gdn-ab-quantized")[0];
    assert_eq!(gdn.module_count, 2);
    assert!(
        gdn.modules
            .iter()
            .any(|m| m.contains("linear_attn.in_proj_a")),
        "{:?}",
        gdn.modules
    );
    let mtp = &r.findings_of("mtp-4bit")[0];
    assert_eq!(mtp.module_count, 9, "{:?}", mtp.modules);
    // The metadata and tensors agree in this one: the errors are the recipe's.
    assert!(
        r.findings_of("metadata-tensor-mismatch").is_empty(),
        "{:#?}",
        r.findings
    );
}

#[test]
fn fp8_kv_without_scales_warns() {
    let r = inspect(&fixture_root().join("llama-fp8-kv-no-scales"), &sm("sm_90")).unwrap();
    let w = r.findings_of("kv-fp8-no-scales");
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].severity, Severity::Warning);
    assert!(w[0].why.contains("scale 1.0"));
    assert!(!r.has_errors(), "{:#?}", r.findings);
    assert_eq!(r.capacity.kv_bytes_per_token, Some(2 * 2 * 8));
}

#[test]
fn compressed_tensors_nvfp4_sharded() {
    let dir = fixture_root().join("llama-ct-nvfp4");
    let r = inspect(&dir, &sm("sm_90")).unwrap();
    assert!(r.tensors.from_index);
    assert_eq!(r.tensors.files.len(), 2);
    assert!(!r.has_errors(), "{:#?}", r.findings);
    let q = r
        .modules
        .iter()
        .find(|m| m.module.ends_with("mlp.down_proj"))
        .unwrap();
    assert_eq!(
        q.format,
        ModuleFormat::Nvfp4 {
            activations_4bit: true,
            group_size: 16
        }
    );
    assert!(
        q.evidence
            .contains("weight_packed U8 [16, 16] + weight_scale F8_E4M3 [16, 2]"),
        "{}",
        q.evidence
    );
    assert!(
        q.declared.contains("config_groups.group_0 target 'Linear'"),
        "{}",
        q.declared
    );
    assert_eq!(
        r.modules
            .iter()
            .find(|m| m.module == "lm_head")
            .unwrap()
            .format,
        ModuleFormat::Bf16
    );
    assert_eq!(r.findings_of("format-fallback-on-card").len(), 1);
    let r = inspect(&dir, &sm("sm_120")).unwrap();
    assert!(r.findings_of("format-fallback-on-card").is_empty());
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn plain_bf16_has_no_findings() {
    let r = inspect(&fixture_root().join("llama-bf16"), &sm("sm_80")).unwrap();
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.quantization.followed, None);
    assert!(r.modules.iter().all(|m| m.format == ModuleFormat::Bf16));
    assert_eq!(r.model.tie_word_embeddings, Some(true));
    assert!(!r.modules.iter().any(|m| m.module == "lm_head"));
    // On Turing, BF16 is a fallback (FP16 tensor cores).
    let r = inspect(&fixture_root().join("llama-bf16"), &sm("sm_75")).unwrap();
    assert_eq!(r.findings_of("format-fallback-on-card").len(), 1);
}

/// Write a variant of a fixture into a temp folder.
fn variant(name: &str, edit: impl FnOnce(&mut Spec)) -> tempfile::TempDir {
    let mut spec = fixture_specs()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1;
    edit(&mut spec);
    let d = tempfile::tempdir().unwrap();
    spec.write(d.path());
    d
}

#[test]
fn metadata_tensor_mismatches_are_errors() {
    // A module the metadata declares W4A16 NVFP4 stored in BF16.
    let d = variant("qwen36-mixed-clean", |s| {
        let name = format!("{P}layers.0.mlp.shared_expert.up_proj");
        s.tensors
            .t
            .retain(|k, _| !k.starts_with(&format!("{name}.")));
        s.tensors.linear(&name, 16, H, Store::Bf16);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("metadata-tensor-mismatch");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert!(f[0].detail.contains("W4A16 NVFP4"), "{}", f[0].detail);
    assert_eq!(f[0].module_count, 1);

    // Excluded by the metadata but stored as FP8: an engine would read FP8 bytes as BF16.
    let d = variant("qwen36-mixed-clean", |s| {
        s.tensors.t.remove("lm_head.weight");
        s.tensors.linear("lm_head", 32, H, Store::Fp8);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("metadata-tensor-mismatch");
    assert_eq!(f.len(), 1);
    assert!(
        f[0].detail.contains("exclude_modules 'lm_head'"),
        "{}",
        f[0].detail
    );
    assert!(f[0].detail.contains("unquantized"), "{}", f[0].detail);

    // Missing weight_scale_2, a scale of the wrong dtype and shape (group 32).
    let d = variant("qwen36-mixed-clean", |s| {
        let e = format!("{P}layers.1.mlp.experts.1.down_proj");
        s.tensors.t.remove(&format!("{e}.weight_scale_2"));
        s.tensors.raw(
            &format!("{e}.weight_scale"),
            Dtype::F32,
            &[16, 1],
            vec![0; 64],
        );
        let g = format!("{P}layers.1.mlp.experts.0.gate_proj");
        s.tensors.raw(
            &format!("{g}.weight_scale"),
            Dtype::F8_E4M3,
            &[16, 1],
            vec![0x38; 16],
        );
        s.tensors
            .raw(&format!("{g}.weight"), Dtype::U8, &[16, 16], vec![0; 256]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert!(r.has_errors());
    let f = &r.findings_of("metadata-tensor-mismatch")[0];
    assert!(f.detail.contains("weight_scale_2"), "{}", f.detail);
    assert!(f.detail.contains("F8_E4M3"), "{}", f.detail);
    let g = r.findings_of("nvfp4-group-size");
    assert_eq!(g.len(), 1, "{:#?}", r.findings);
    assert!(g[0].detail.contains("32"), "{}", g[0].detail);

    // An FP8 module without its weight_scale.
    let d = variant("llama-fp8-kv-no-scales", |s| {
        s.tensors
            .t
            .remove("model.layers.1.mlp.up_proj.weight_scale");
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = &r.findings_of("metadata-tensor-mismatch")[0];
    assert!(f.detail.contains("weight_scale"), "{}", f.detail);
    assert_eq!(f.modules, vec!["model.layers.*.mlp.up_proj (layers 1)"]);
}

#[test]
fn declared_group_size_other_than_16_is_an_error() {
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.as_mut().unwrap();
        h["quantization"]["quantized_layers"][format!("{P}layers.0.mlp.experts")]["group_size"] =
            json!(32);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let g = r.findings_of("nvfp4-group-size");
    assert!(!g.is_empty(), "{:#?}", r.findings);
    assert!(g.iter().any(|f| f.detail.contains("quantized_layers")));
    assert!(r.has_errors());
}

#[test]
fn mtp_rules() {
    // FP8 draft head: info.
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.as_mut().unwrap();
        h["quantization"]["exclude_modules"] = json!(["lm_head", "model.visual*"]);
        for m in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            let name = format!("mtp.layers.0.self_attn.{m}");
            h["quantization"]["quantized_layers"][&name] = json!({"quant_algo": "FP8"});
            s.tensors
                .t
                .retain(|k, _| !k.starts_with(&format!("{name}.")));
            s.tensors.linear(
                &name,
                if m == "q_proj" {
                    32
                } else if m == "o_proj" {
                    H
                } else {
                    8
                },
                H,
                Store::Fp8,
            );
        }
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("mtp-fp8");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Info);
    assert!(r.findings_of("mtp-not-excluded").is_empty());

    // BF16 only by omission: warning.
    let d = variant("qwen36-mixed-clean", |s| {
        s.hf_quant.as_mut().unwrap()["quantization"]["exclude_modules"] =
            json!(["lm_head", "model.visual*"]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("mtp-not-excluded");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(!r.has_errors());

    // Config declares MTP, headers hold none: info.
    let d = variant("qwen36-mixed-clean", |s| {
        s.tensors.t.retain(|k, _| !k.starts_with("mtp."));
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert_eq!(
        r.findings_of("mtp-weights-absent").len(),
        1,
        "{:#?}",
        r.findings
    );
}

#[test]
fn quantized_lm_head_embeddings_and_vision() {
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.as_mut().unwrap();
        h["quantization"]["exclude_modules"] = json!(["mtp*"]);
        let w4 = json!({"quant_algo": "W4A16_NVFP4", "group_size": 16});
        h["quantization"]["quantized_layers"]["lm_head"] = w4.clone();
        h["quantization"]["quantized_layers"]["model.visual.blocks.0.attn.qkv"] = w4;
        s.tensors.t.retain(|k, _| {
            !k.starts_with("lm_head.") && !k.starts_with("model.visual.blocks.0.attn.qkv.")
        });
        s.tensors.linear("lm_head", 32, H, Store::W4a16);
        s.tensors
            .linear("model.visual.blocks.0.attn.qkv", 48, 16, Store::W4a16);
        // An FP8 embedding table.
        s.tensors.t.remove(&format!("{P}embed_tokens.weight"));
        s.tensors.raw(
            &format!("{P}embed_tokens.weight"),
            Dtype::F8_E4M3,
            &[32, H],
            vec![0x38; 32 * H],
        );
        s.tensors
            .f32s(&format!("{P}embed_tokens.weight_scale"), &[], &[1.0]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert_eq!(
        r.findings_of("lm-head-quantized")[0].severity,
        Severity::Info
    );
    assert_eq!(
        r.findings_of("vision-quantized")[0].severity,
        Severity::Warning
    );
    assert_eq!(
        r.findings_of("embedding-quantized")[0].severity,
        Severity::Warning
    );
}

#[test]
fn kv_scales_on_some_layers_only() {
    let d = variant("llama-fp8-kv-no-scales", |s| {
        s.tensors
            .f32s("model.layers.0.self_attn.k_proj.k_scale", &[], &[0.1]);
        s.tensors
            .f32s("model.layers.0.self_attn.v_proj.v_scale", &[], &[0.1]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let w = r.findings_of("kv-fp8-no-scales");
    assert_eq!(w.len(), 1);
    assert!(w[0].detail.contains("layers 1"), "{}", w[0].detail);
}

#[test]
fn config_json_vs_hf_quant_config() {
    // config.json carries ModelOpt's flat form without a KV scheme and an older producer.
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.clone().unwrap();
        let mut q = h["quantization"].clone();
        q["quant_method"] = json!("modelopt");
        q["producer"] = json!({"name": "modelopt", "version": "0.37.0"});
        q["ignore"] = q["exclude_modules"].clone();
        q.as_object_mut().unwrap().remove("exclude_modules");
        q.as_object_mut().unwrap().remove("kv_cache_quant_algo");
        q["quantized_layers"][format!("{P}layers.0.linear_attn.in_proj_z")] =
            json!({"quant_algo": "W4A16_NVFP4", "group_size": 16});
        s.config["quantization_config"] = q;
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let dis = r.findings_of("config-disagreement");
    let details: Vec<&str> = dis.iter().map(|f| f.detail.as_str()).collect();
    assert!(
        details.iter().any(|d| d.starts_with("KV cache")),
        "{details:#?}"
    );
    assert!(
        details.iter().any(|d| d.starts_with("producer")),
        "{details:#?}"
    );
    assert!(
        details.iter().any(
            |d| d.starts_with("quantized_layers differ: 0 only in config.json")
                && d.contains("1 with different algorithms")
        ),
        "{details:#?}"
    );
    // Module level: in_proj_z is W4A16 by config.json (what vLLM follows) and FP8 by
    // hf_quant_config.json; the tensors are FP8, so the followed file disagrees with them.
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("modules resolve differently")),
        "{details:#?}"
    );
    assert!(!r.findings_of("metadata-tensor-mismatch").is_empty());
    assert_eq!(r.quantization.followed.as_deref(), Some("config.json"));
    assert_eq!(r.capacity.kv_dtype.as_deref(), Some("BF16"));
}

#[test]
fn truncated_data_and_index_mismatch_are_lint_errors() {
    let d = variant("llama-bf16", |_| {});
    let f = d.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 10]).unwrap();
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert_eq!(r.findings_of("safetensors-truncated").len(), 1);
    assert!(r.has_errors());

    let d = variant("llama-ct-nvfp4", |_| {});
    let idx = d.path().join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&idx).unwrap()).unwrap();
    let flip = |f: &Value| {
        if f == "model-00001-of-00002.safetensors" {
            json!("model-00002-of-00002.safetensors")
        } else {
            json!("model-00001-of-00002.safetensors")
        }
    };
    let now = v["weight_map"]["model.norm.weight"].clone();
    v["weight_map"]["model.norm.weight"] = flip(&now);
    std::fs::write(&idx, serde_json::to_vec(&v).unwrap()).unwrap();
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("index-mismatch");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert!(f[0].detail.contains("model.norm.weight"), "{}", f[0].detail);
    assert!(r.has_errors());
}
