//! `rigbench diagnose` as a user runs it: exit codes (0 nothing wrong, 4 an error finding, 1 an
//! unreadable input, 64 a bad command line), Markdown and JSON output, `--out`, `--rig`, and
//! binary or garbage files. Reads the real-world fixtures of `tests/fixtures/real/`.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

fn log(prefix: &str) -> String {
    let dir = real_fixture("logs");
    let p: PathBuf = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("no fixture log {prefix}*"));
    p.to_string_lossy().into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn exit_codes_follow_the_findings() {
    for (prefix, code, needle) in [
        ("02_", 0, "652,144 tokens"),
        ("15_", 0, "3.41×"),
        ("18_", 0, "startup incomplete"),
        ("13_", 4, "Error Internal"),
        ("14_", 4, "toolchain too old for sm_120a"),
        ("16_", 4, "cause not captured in this excerpt"),
        ("17_", 4, "the drafter accepts nothing"),
        ("12_", 4, "CUDA out of memory"),
    ] {
        let o = rigbench(&["diagnose", "--log", &log(prefix)]);
        assert_eq!(
            o.status.code(),
            Some(code),
            "{prefix}: {}{}",
            out(&o),
            err(&o)
        );
        assert!(out(&o).contains(needle), "{prefix}: {}", out(&o));
        assert!(!err(&o).contains("panicked"));
    }
}

#[test]
fn json_out_and_rig() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("diag");
    let o = rigbench(&[
        "diagnose",
        "--log",
        &log("15_"),
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).expect("JSON on stdout");
    assert_eq!(v["logs"][0]["log"]["boots"].as_array().unwrap().len(), 2);
    assert!(dir.join("diagnose.md").is_file() && dir.join("diagnose.json").is_file());
    // --rig: the card from a results.json (here a committed H200 report).
    let rig =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/nvidia-h200-sm90/qwen3.6-27b.json");
    let o = rigbench(&[
        "diagnose",
        "--log",
        &log("06_"),
        "--rig",
        rig.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(out(&o).contains("expected on sm_90"), "{}", out(&o));
    // A CPU-only results.json has no card: say so.
    let cpu = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/ci-cpu/qwen3.6-27b.json");
    let o = rigbench(&[
        "diagnose",
        "--log",
        &log("06_"),
        "--rig",
        cpu.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("--cc"), "{}", err(&o));
}

#[test]
fn bad_input_is_named_never_a_panic() {
    let d = tempfile::tempdir().unwrap();
    // No input at all, a bad --cc, --cc with --rig: the command line.
    for args in [
        vec!["diagnose"],
        vec!["diagnose", "--log", "x.log", "--cc", "sm_banana"],
        vec![
            "diagnose", "--log", "x.log", "--cc", "sm_90", "--rig", "r.json",
        ],
    ] {
        let o = rigbench(&args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", err(&o));
    }
    // A missing file or a folder: named, exit 1.
    let o = rigbench(&["diagnose", "--log", "/no/such/engine.log"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("/no/such/engine.log"), "{}", err(&o));
    let o = rigbench(&["diagnose", "--log", d.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("is a folder"), "{}", err(&o));
    // Binary and garbage: a note, exit 0.
    let bin = d.path().join("weights.bin");
    std::fs::write(
        &bin,
        (0..4096u32)
            .map(|i| (i * 7 % 256) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let junk = d.path().join("junk.txt");
    std::fs::write(&junk, "hello\nnothing to see\n").unwrap();
    for f in [&bin, &junk] {
        for flag in ["--log", "--metrics", "--sse"] {
            let o = rigbench(&["diagnose", flag, f.to_str().unwrap()]);
            assert_eq!(
                o.status.code(),
                Some(0),
                "{flag} {}: {}",
                f.display(),
                err(&o)
            );
            assert!(
                out(&o).contains("nothing recognised") || out(&o).contains("no SSE data"),
                "{flag} {}: {}",
                f.display(),
                out(&o)
            );
            assert!(!err(&o).contains("panicked"));
        }
    }
    // A malformed checkpoint: named.
    std::fs::write(d.path().join("config.json"), "{not json").unwrap();
    let o = rigbench(&[
        "diagnose",
        "--log",
        &log("06_"),
        "--checkpoint",
        d.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("config.json"), "{}", err(&o));
}

/// A file of `tests/fixtures/real/engines/<engine>/` whose name starts with `prefix`.
fn engine_file(engine: &str, prefix: &str) -> String {
    let dir = real_fixture(&format!("engines/{engine}"));
    let p: PathBuf = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("no fixture {engine}/{prefix}*"));
    p.to_string_lossy().into_owned()
}

#[test]
fn real_engine_output_exit_codes_and_figures() {
    for (engine, flag, prefix, code, needles) in [
        (
            "vllm-0.32.0-cpu",
            "--log",
            "06_",
            4,
            vec!["unrecognized arguments: --no-such-flag"],
        ),
        (
            "vllm-0.32.0-cpu",
            "--log",
            "01_",
            0,
            vec![
                "2,097,152 tokens",
                "error while the engine was being stopped",
            ],
        ),
        (
            "llama.cpp-0c1e57098",
            "--log",
            "05_",
            0,
            vec!["KV cache 8,192 tokens", "2,048 cells × 4 streams"],
        ),
        (
            "llama.cpp-0c1e57098",
            "--log",
            "01_",
            0,
            vec!["KV cache 8,192 tokens", "152 requests timed"],
        ),
        (
            "llama.cpp-0c1e57098",
            "--metrics",
            "02_",
            0,
            vec!["6,465 of 25,314 prompt tokens"],
        ),
        (
            "vllm-0.32.0-cpu",
            "--metrics",
            "02_",
            0,
            vec!["4 metric families announced without samples"],
        ),
    ] {
        let f = engine_file(engine, prefix);
        let o = rigbench(&["diagnose", flag, &f]);
        assert_eq!(o.status.code(), Some(code), "{f}: {}{}", out(&o), err(&o));
        for n in needles {
            assert!(out(&o).contains(n), "{f}: {n}: {}", out(&o));
        }
    }
}

#[test]
fn redaction_never_rewrites_rigbench_words() {
    // The checkpoint sits under the working directory, which the redactor knows.
    let cwd = tempfile::tempdir().unwrap();
    let ck = cwd.path().join("ckpt");
    std::fs::create_dir(&ck).unwrap();
    std::fs::write(
        ck.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,
            "num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,
            "vocab_size":256,"torch_dtype":"bfloat16","max_position_embeddings":4096}"#,
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args([
            "inspect",
            ck.to_str().unwrap(),
            "--cc",
            "sm_90",
            "--gpu-mem-gib",
            "24",
        ])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let s = out(&o);
    assert!(
        s.contains("KV bytes per token = full-attention layers"),
        "{s}"
    );
    assert!(!s.contains("<token>"), "{s}");
    assert!(s.contains("<cwd>/ckpt"), "{s}");
    assert!(!s.contains(cwd.path().to_str().unwrap()), "{s}");
    // diagnose: a path in an error message is redacted, the finding's words are not.
    let log = cwd.path().join("engine.log");
    std::fs::write(
        &log,
        format!(
            "FileNotFoundError: {}/models/x/config.json\n",
            cwd.path().display()
        ),
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["diagnose", "--log", log.to_str().unwrap()])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let s = out(&o);
    assert!(s.contains("<cwd>/models/x/config.json"), "{s}");
    assert!(s.contains("engine error"), "{s}");
}

/// `--engine` for a log without a version line (SGLang prints none): the real SGLang 0.5.9 log
/// on sm_90 is joined with the prediction (its `fa3` agrees); a value outside the rules is a
/// command-line error naming the flag, never a panic.
#[test]
fn engine_flag_joins_a_versionless_log_with_the_prediction() {
    let sg = log("19_sglang-0.5.9");
    let o = rigbench(&[
        "diagnose",
        "--log",
        &sg,
        "--cc",
        "sm_90",
        "--engine",
        "sglang==0.5.9",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", out(&o), err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    let joined: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["id"] == "prediction-joined")
        .collect();
    assert_eq!(joined.len(), 1, "{}", out(&o));
    assert!(
        joined[0]["detail"]
            .as_str()
            .unwrap()
            .contains("attention: fa3 at line 5 (FlashAttention, as predicted)"),
        "{}",
        joined[0]
    );
    // Without --engine the version is unknown: nothing is predicted.
    let o = rigbench(&["diagnose", "--log", &sg, "--cc", "sm_90", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("\"findings\""), "{}", out(&o));
    assert!(!out(&o).contains("prediction-joined"), "{}", out(&o));
    for bad in ["sglang==0.4", "tgi==1.0", "vllm"] {
        let o = rigbench(&["diagnose", "--log", &sg, "--engine", bad]);
        assert_eq!(o.status.code(), Some(64), "{bad}: {}", err(&o));
        assert!(err(&o).contains("--engine"), "{bad}: {}", err(&o));
        assert!(!err(&o).contains("panicked"));
    }
}
