//! `inspect` on what real configs showed: configs + model.safetensors.index.json without shards
//! (inspecting before downloading), MTP declared without weights, `mtp.fc` targeted by an NVFP4
//! `Linear` rule, and attention the dense KV formula does not model. Reads
//! the real-world fixtures of `tests/fixtures/real/`.

use std::path::PathBuf;

use rigbench::checkpoint::{inspect, InspectOptions, Severity};

use crate::common;

fn fixture(rel: &str) -> PathBuf {
    common::real_fixture(rel)
}

/// What `rigbench inspect` passes (no card).
fn opts() -> InspectOptions {
    InspectOptions::default()
}

#[test]
fn index_without_shards_is_a_normal_input() {
    let r = inspect(&fixture("checkpoints/mtp-declared-weights-absent"), &opts()).unwrap();
    assert!(r.tensors.names_only);
    assert!(!r.tensors.headers_read);
    assert!(r
        .tensors
        .skipped_reason
        .as_deref()
        .unwrap()
        .contains("dtypes unknown without the shard headers"));
    assert_eq!(r.tensors.tensor_count, 25);
    assert_eq!(r.tensors.total_bytes, 9_437_184, "metadata.total_size");
    assert_eq!(r.capacity.weight_bytes, Some(9_437_184));
    // Split GDN names come from the index.
    for m in ["in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b"] {
        assert!(r.modules.iter().any(|row| row.module.ends_with(m)), "{m}");
    }
    // A partial download is still an error naming the file.
    let d = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors.index.json"] {
        std::fs::copy(
            fixture("checkpoints/mtp-fc-not-excluded").join(f),
            d.path().join(f),
        )
        .unwrap();
    }
    let idx = std::fs::read_to_string(d.path().join("model.safetensors.index.json")).unwrap();
    let idx = idx.replacen(
        "model-00001-of-00001.safetensors",
        "model-00002-of-00002.safetensors",
        1,
    );
    std::fs::write(d.path().join("model.safetensors.index.json"), idx).unwrap();
    std::fs::write(d.path().join("model-00001-of-00001.safetensors"), b"").unwrap();
    let e = format!("{:#}", inspect(d.path(), &opts()).unwrap_err());
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("incomplete download"),
        "{e}"
    );
}

#[test]
fn mtp_declared_without_weights_is_an_error() {
    let r = inspect(&fixture("checkpoints/mtp-declared-weights-absent"), &opts()).unwrap();
    let f = r.findings_of("mtp-weights-absent");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Error);
    assert!(f[0].why.contains("cannot load"));
    assert!(r.has_errors());
}

#[test]
fn mtp_fc_metadata_only_is_a_warning_and_unquantized_in_the_map_an_error() {
    // config.json alone.
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("checkpoints/mtp-fc-not-excluded/config.json"),
        d.path().join("config.json"),
    )
    .unwrap();
    let r = inspect(d.path(), &opts()).unwrap();
    let f = r.findings_of("mtp-fc-not-excluded");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(f[0].detail.contains("mtp.fc"));
    assert!(
        r.findings_of("mtp-4bit").is_empty(),
        "not an 'MTP is 4-bit' error"
    );
    assert!(!r.has_errors(), "{:#?}", r.findings);
    // With the index: mtp.fc.weight has no weight_scale while the MLP weights do.
    let r = inspect(&fixture("checkpoints/mtp-fc-not-excluded"), &opts()).unwrap();
    let f = r.findings_of("mtp-targeted-unquantized");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Error);
    assert!(
        f[0].modules.iter().any(|m| m.contains("mtp.fc")),
        "{:?}",
        f[0].modules
    );
    assert!(r.findings_of("mtp-4bit").is_empty());
    assert!(
        r.findings_of("metadata-tensor-mismatch").is_empty(),
        "{:#?}",
        r.findings
    );
    let mlp = r
        .modules
        .iter()
        .find(|m| m.module.ends_with("mlp.down_proj"))
        .unwrap();
    assert_eq!(mlp.format.to_string(), "W4A4 NVFP4 (group 16)");
}

#[test]
fn compressed_attention_capacity_is_not_modelled() {
    // Both public DeepSeek-V4 exports: ModelOpt (a folder) and compressed-tensors (a config).
    let ct = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("configs/RedHatAI--DeepSeek-V4-Flash-NVFP4-FP8__config.json"),
        ct.path().join("config.json"),
    )
    .unwrap();
    for dir in [
        fixture("configs/nvidia--DeepSeek-V4-Flash-NVFP4"),
        ct.path().to_path_buf(),
    ] {
        let mut o = opts();
        o.gpu_memory_bytes = Some(192 << 30);
        let r = inspect(&dir, &o).unwrap();
        assert_eq!(r.capacity.kv_bytes_per_token, None, "{}", dir.display());
        assert_eq!(r.capacity.kv_tokens, None);
        assert_eq!(r.capacity.max_concurrency, None);
        let why = r.capacity.kv_not_modelled.as_deref().unwrap();
        assert!(
            why.contains("compress_ratios") && why.contains("sliding"),
            "{why}"
        );
        assert!(!why.contains("MLA"), "{why}");
        let md = rigbench::checkpoint::render_markdown(&r);
        assert!(md.contains("not modelled"));
    }
    // MLA (kv_lora_rank) and a sliding window in use: not modelled; Qwen's unused window: modelled.
    let d = tempfile::tempdir().unwrap();
    let base = r#""architectures": ["X"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 100, "torch_dtype": "bfloat16""#;
    for (extra, modelled) in [
        (r#", "kv_lora_rank": 512"#, false),
        (r#", "sliding_window": 4096"#, false),
        (
            r#", "sliding_window": 4096, "use_sliding_window": false"#,
            true,
        ),
        (r#", "q_lora_rank": 1536"#, true),
    ] {
        std::fs::write(d.path().join("config.json"), format!("{{{base}{extra}}}")).unwrap();
        let r = inspect(d.path(), &opts()).unwrap();
        assert_eq!(r.capacity.kv_bytes_per_token.is_some(), modelled, "{extra}");
    }
}
