//! `rigbench inspect --engine`: the "What will run" prediction (`rigbench::checkpoint::predict`)
//! for the test checkpoints on the cards and engine versions it covers, its JSON key, the flags'
//! errors, and `rigbench diagnose` stating where a log's kernel differs from the prediction.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use common::rigbench;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/checkpoints")
        .join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// `inspect --json` with `--engine` and `--cc`: the `engine_prediction` rows.
fn rows(ckpt: &str, engine: &str, cc: &str) -> Vec<serde_json::Value> {
    let dir = fixture(ckpt);
    let o = rigbench(&["inspect", s(&dir), "--json", "--engine", engine, "--cc", cc]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    v["engine_prediction"]
        .as_array()
        .expect("engine_prediction is a list")
        .clone()
}

/// The row of one class whose quantization starts with `quant`.
fn row<'a>(rows: &'a [serde_json::Value], class: &str, quant: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| {
            r["layer_class"] == class && r["quantization"].as_str().unwrap().starts_with(quant)
        })
        .unwrap_or_else(|| panic!("no {class} row in {quant}: {rows:#?}"))
}

fn kernel(r: &serde_json::Value) -> (&str, bool, Option<&str>) {
    (
        r["kernel"].as_str().unwrap(),
        r["native"].as_bool().unwrap(),
        r["warning"].as_str(),
    )
}

const MARLIN_WARNING: &str = "Your GPU does not have native support for FP4 computation";

/// The Qwen3.6 MIXED_PRECISION fixture: W4A16 NVFP4 experts, FP8 attention projections, FP8 KV,
/// one Gated-DeltaNet layer.
#[test]
fn weight_only_moe_follows_the_version_and_card() {
    let cases = [
        ("vllm==0.34", "sm_90", "Humming", false),
        // MoE experts: no FlashInfer backend takes BF16 activations (fused_moe/oracle/nvfp4.py).
        ("vllm==0.34", "sm_100", "Marlin", true),
        ("vllm==0.34", "sm_120", "Marlin", true),
        ("vllm==0.34", "sm_121", "Marlin", true),
        ("vllm==0.30", "sm_90", "Marlin", true),
    ];
    for (engine, cc, want, warned) in cases {
        let rs = rows("qwen36-mixed-clean", engine, cc);
        let (k, native, w) = kernel(row(&rs, "moe_experts", "NVFP4 W4A16"));
        assert_eq!(k, want, "{engine} {cc}");
        assert!(!native, "{engine} {cc}: weight-only is never native");
        assert_eq!(
            w.is_some_and(|w| w.contains(MARLIN_WARNING)),
            warned,
            "{engine} {cc}: {w:?}"
        );
        for r in &rs {
            assert!(
                r["rule_source"].as_str().unwrap().contains(".py"),
                "{engine} {cc}: every rule names its engine file: {r}"
            );
        }
        // FP8 projections run on FP8 tensor cores from sm_89; the GDN and KV rows are there.
        let (k, native, _) = kernel(row(&rs, "dense_linear", "FP8"));
        assert!(k.contains("FP8") && native, "{engine} {cc}: {k}");
        assert!(
            rs.iter().any(|r| r["layer_class"] == "gdn"),
            "{engine} {cc}"
        );
        let (k, _, _) = kernel(row(&rs, "kv_cache", "FP8"));
        assert!(k.starts_with("FP8 E4M3"), "{k}");
    }
    // The attention backend: FlashInfer first on compute capability 10.x, FA3 on sm_90.
    let b = rows("qwen36-mixed-clean", "vllm==0.34", "sm_100");
    assert_eq!(kernel(row(&b, "attention", "softmax")).0, "FlashInfer");
    let h = rows("qwen36-mixed-clean", "vllm==0.34", "sm_90");
    assert_eq!(
        kernel(row(&h, "attention", "softmax")).0,
        "FlashAttention 3"
    );
}

/// The compressed-tensors W4A4 fixture: native on FP4 tensor cores from sm_100, weight-only
/// below (FlashInfer CuTe-DSL W4A4 on sm_10x from vLLM 0.24, FlashInfer CUTLASS on sm_12x).
#[test]
fn w4a4_dense_is_native_from_sm_100() {
    let cases = [
        ("vllm==0.34", "sm_90", "Humming", false),
        ("vllm==0.30", "sm_90", "Marlin", false),
        ("vllm==0.34", "sm_100", "FlashInfer CuTe-DSL (W4A4)", true),
        ("vllm==0.23", "sm_100", "FlashInfer CUTLASS", true),
        ("vllm==0.34", "sm_120", "FlashInfer CUTLASS", true),
        ("vllm==0.34", "sm_121", "FlashInfer CUTLASS", true),
        ("vllm==0.29", "sm_120", "FlashInfer CUTLASS", true),
    ];
    for (engine, cc, want, want_native) in cases {
        let rs = rows("llama-ct-nvfp4", engine, cc);
        let (k, native, _) = kernel(row(&rs, "dense_linear", "NVFP4 W4A4"));
        assert_eq!((k, native), (want, want_native), "{engine} {cc}");
    }
}

/// The fixture is a compressed-tensors NVFP4 export: SGLang has no such scheme before 0.5.7, and
/// from 0.5.7 its scheme needs sm_100 (`CompressedTensorsW4A4Fp4.get_min_capability`), with
/// the error Python prints for the tuple `_check_scheme_supported` raises.
#[test]
fn sglang_refuses_nvfp4_below_sm_100() {
    let rs = rows("llama-ct-nvfp4", "sglang==0.5.4", "sm_100");
    let (k, native, w) = kernel(row(&rs, "dense_linear", "NVFP4 W4A4"));
    assert!(
        k.contains("no compressed-tensors NVFP4 scheme before SGLang 0.5.7") && !native,
        "{k}"
    );
    assert!(w.is_none(), "{w:?}");
    let rs = rows("llama-ct-nvfp4", "sglang==0.5.10", "sm_90");
    let (k, native, w) = kernel(row(&rs, "dense_linear", "NVFP4 W4A4"));
    assert!(k.contains("load fails") && !native, "{k}");
    assert_eq!(
        w,
        Some("RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Min capability: 100. ', 'Current capability: 90.')")
    );
    let rs = rows("llama-ct-nvfp4", "sglang==0.5.23", "sm_100");
    let (_, native, w) = kernel(row(&rs, "dense_linear", "NVFP4 W4A4"));
    assert!(native && w.is_none());
}

#[test]
fn the_table_and_the_key_appear_only_with_engine() {
    let dir = fixture("llama-ct-nvfp4");
    let with = rigbench(&[
        "inspect",
        s(&dir),
        "--engine",
        "vllm==0.34",
        "--cc",
        "sm_121",
    ]);
    let md = String::from_utf8_lossy(&with.stdout);
    assert!(
        md.contains("### What will run: vLLM 0.34.0 on sm_121"),
        "{md}"
    );
    assert!(
        md.contains("| layer class") && md.contains("rule source"),
        "{md}"
    );
    let without = rigbench(&["inspect", s(&dir), "--cc", "sm_121"]);
    assert!(!String::from_utf8_lossy(&without.stdout).contains("What will run"));
    let json = rigbench(&["inspect", s(&dir), "--cc", "sm_121", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        v.get("engine_prediction").is_none(),
        "no key without --engine"
    );
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_engine_and_cc_values_exit_64_naming_the_flag() {
    let dir = fixture("llama-ct-nvfp4");
    for bad in ["vllm==0.99", "vllm", "tgi==2.0", "sglang==0.4"] {
        let o = rigbench(&["inspect", s(&dir), "--engine", bad, "--cc", "sm_90"]);
        assert_eq!(o.status.code(), Some(64), "{bad}: {}", err(&o));
        assert!(err(&o).contains("--engine"), "{bad}: {}", err(&o));
        assert!(
            err(&o).contains("vllm==0.23 … vllm==0.34"),
            "{bad}: {}",
            err(&o)
        );
    }
    let o = rigbench(&[
        "inspect",
        s(&dir),
        "--engine",
        "vllm==0.34",
        "--cc",
        "sm_77",
    ]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(err(&o).contains("--cc"), "{}", err(&o));
}

/// A vLLM 0.34 log that names Marlin for the NVFP4 GEMM, joined with the W4A4 checkpoint: on
/// sm_90 the prediction is Humming (both weight-only: info), on sm_100 native FlashInfer
/// CuTe-DSL (a warning); a log that names the predicted kernel gets no such finding.
#[test]
fn diagnose_states_where_the_log_differs_from_the_prediction() {
    let tmp = tempfile::tempdir().unwrap();
    let log = |name: &str, kernel: &str| {
        let p = tmp.path().join(name);
        std::fs::write(
            &p,
            format!(
                "INFO 05-01 10:00:00 [api_server.py:1000] vLLM API server version 0.34.0\n\
                 INFO 05-01 10:00:05 [__init__.py:1077] Using {kernel} for NVFP4 GEMM\n"
            ),
        )
        .unwrap();
        p
    };
    let marlin = log("marlin.log", "MarlinNvFp4LinearKernel");
    let native = log("native.log", "FlashInferCuteDslNvFp4LinearKernel");
    let ck = fixture("llama-ct-nvfp4");
    let run = |l: &Path, cc: &str| -> Vec<serde_json::Value> {
        let o = rigbench(&[
            "diagnose",
            "--log",
            s(l),
            "--checkpoint",
            s(&ck),
            "--cc",
            cc,
            "--json",
        ]);
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", err(&o)));
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["id"] == "kernel-differs-from-prediction")
            .cloned()
            .collect()
    };
    let f = run(&marlin, "sm_90");
    assert_eq!(f.len(), 1, "{f:#?}");
    let title = f[0]["title"].as_str().unwrap();
    assert!(
        title.contains("predicted Humming for NVFP4 W4A4 dense linear on sm_90")
            && title.contains("vLLM 0.34.0")
            && title.contains("the log shows MarlinNvFp4LinearKernel"),
        "{title}"
    );
    assert_eq!(f[0]["severity"], "info");
    let f = run(&marlin, "sm_100");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0]["severity"], "warning");
    assert!(f[0]["detail"]
        .as_str()
        .unwrap()
        .contains("kernels/linear/__init__.py"));
    assert!(
        run(&native, "sm_100").is_empty(),
        "the predicted kernel is no difference"
    );
}
