//! `rigbench inspect`, the binary, on the committed test checkpoints (`tests/it/inspect.rs`,
//! `tests/fixtures/checkpoints/`): exit codes, JSON output and flags, no GPU or `--cc`, and bad
//! input naming the file.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::checkpoints;

use checkpoints::{fixture_root, llama_config};

fn rigbench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .output()
        .expect("run rigbench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fx(name: &str) -> String {
    fixture_root().join(name).display().to_string()
}

#[test]
fn binary_exit_codes_on_fixtures() {
    let cases = [
        ("qwen36-mixed-clean", 0),
        ("qwen36-bad-ab-mtp", 4),
        ("llama-fp8-kv-no-scales", 0),
        ("llama-ct-nvfp4", 0),
        ("llama-bf16", 0),
    ];
    for (name, code) in cases {
        let (rc, out, err) = rigbench(&[
            "inspect",
            &fx(name),
            "--cc",
            "sm_90",
            // Room for the KV cache: 1 GiB less the default 1.5 GiB reserve would not fit, an
            // error of its own (capacity-does-not-fit, tests/it/first_hour.rs).
            "--gpu-mem-gib",
            "8",
            "--no-redact",
        ]);
        assert_eq!(rc, code, "{name}: stdout {out}\nstderr {err}");
        assert!(out.contains("### Findings"), "{name}: {out}");
        assert!(out.contains("### Capacity (prediction)"), "{name}");
    }
    let (_, out, _) = rigbench(&["inspect", &fx("qwen36-bad-ab-mtp"), "--cc", "sm_90"]);
    assert!(out.contains("gdn-ab-quantized") && out.contains("mtp-4bit"));
    let (_, out, _) = rigbench(&["inspect", &fx("llama-fp8-kv-no-scales"), "--cc", "sm_90"]);
    assert!(out.contains("kv-fp8-no-scales"));
}

#[test]
fn binary_json_and_flags() {
    let (rc, out, err) = rigbench(&[
        "inspect",
        &fx("qwen36-mixed-clean"),
        "--json",
        "--cc",
        "12.0",
        "--gpu-mem-gib",
        "2",
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        "1024",
        "--kv-cache-dtype",
        "bf16",
        "--reserve-gib",
        "0",
    ]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let c = &v["capacity"];
    assert_eq!(c["kind"], "prediction");
    assert_eq!(c["kv_dtype"], "BF16");
    assert_eq!(c["kv_bytes_per_token"], 2 * 8 * 2);
    let w = c["weight_bytes"].as_u64().unwrap();
    let budget = (1u64 << 30) - w; // 2 GiB × 0.5, no reserve
    assert_eq!(c["kv_budget_bytes"].as_i64().unwrap(), budget as i64);
    let state = c["state_bytes_per_sequence"].as_u64().unwrap();
    assert_eq!(c["kv_tokens"].as_u64().unwrap(), (budget - state) / 32);
    assert_eq!(v["card"]["cc"]["major"], 12);

    for bad in [
        vec!["--cc", "hopper"],
        vec!["--gpu-memory-utilization", "1.5"],
        vec!["--kv-cache-dtype", "int3"],
        vec!["--gpu-mem-gib=-1"],
    ] {
        let mut args = vec!["inspect", "tests/fixtures/checkpoints/llama-bf16"];
        args.extend(bad.iter());
        let (rc, _, err) = rigbench(&args);
        assert_eq!(
            rc, 64,
            "a bad flag value is a bad command line: {bad:?}: {err}"
        );
        let flag = bad[0].split('=').next().unwrap();
        assert!(err.contains(flag), "{bad:?}: {err}");
    }
}

#[test]
fn binary_without_gpu_or_cc_says_so() {
    let (rc, out, _) = rigbench(&["inspect", &fx("llama-bf16")]);
    assert_eq!(rc, 0);
    if out.contains("### Formats on this card: sm_") {
        eprintln!("a GPU was probed on this machine; the no-GPU message is not checked");
        return;
    }
    assert!(out.contains("card verdicts skipped"), "{out}");
    assert!(out.contains("need a GPU memory size"), "{out}");
}

#[test]
fn binary_bad_input_exits_1_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n);
    let run = |dir: &Path| {
        rigbench(&[
            "inspect",
            &dir.display().to_string(),
            "--cc",
            "sm_90",
            "--no-redact",
        ])
    };

    let (rc, _, err) = run(&p("missing"));
    assert_eq!(rc, 1);
    assert!(
        err.contains("missing") && err.contains("not found"),
        "{err}"
    );

    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(err.contains("config.json"), "{err}");

    std::fs::write(p("config.json"), "{ \"hidden_size\": ").unwrap();
    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(err.contains("config.json: not valid JSON"), "{err}");

    std::fs::write(p("config.json"), b"{\"model_type\": \"ll\xc3\x28ama\"}").unwrap();
    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(
        err.contains("config.json") && err.contains("not UTF-8"),
        "{err}"
    );

    // Safetensors headers.
    std::fs::write(p("config.json"), llama_config(None, true).to_string()).unwrap();
    let st = p("model.safetensors");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![7, 0, 0], "fewer than the 8-byte"),
        (
            {
                let mut v = 64u64.to_le_bytes().to_vec();
                v.extend_from_slice(b"{\"a\":{\"dtype\"");
                v
            },
            "larger than the file",
        ),
        (
            {
                let mut v = (1u64 << 40).to_le_bytes().to_vec();
                v.extend_from_slice(b"{}");
                v
            },
            "absurdly large",
        ),
        (
            {
                let mut v = 3u64.to_le_bytes().to_vec();
                v.extend_from_slice(&[b'{', 0xc3, b'}']);
                v
            },
            "not UTF-8",
        ),
        (
            {
                let h = b"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2";
                let mut v = (h.len() as u64).to_le_bytes().to_vec();
                v.extend_from_slice(h);
                v
            },
            "invalid safetensors header",
        ),
    ];
    for (bytes, want) in cases {
        std::fs::write(&st, &bytes).unwrap();
        let (rc, out, err) = run(d.path());
        assert_eq!(rc, 1, "{want}: {out}");
        assert!(err.contains("model.safetensors"), "{want}: {err}");
        assert!(err.contains(want), "{want}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_file(&st).unwrap();

    // An index naming a missing shard while another is present (a partial download; with no
    // shard at all the index alone is read).
    std::fs::write(
        p("model.safetensors.index.json"),
        r#"{"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors", "model.norm.weight": "model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let header = r#"{"model.norm.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
    let mut shard = (header.len() as u64).to_le_bytes().to_vec();
    shard.extend_from_slice(header.as_bytes());
    shard.extend_from_slice(&[0u8; 4]);
    std::fs::write(p("model-00001-of-00002.safetensors"), shard).unwrap();
    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(
        err.contains("model.safetensors.index.json")
            && err.contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
}
