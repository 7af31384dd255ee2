//! Replays, through the same entry points the fuzz targets use (`rigbench::fuzz_harness`), the
//! committed fuzz corpus (`fuzz/corpus/TARGET/`, minimized by `scripts/fuzz`), every input that
//! ever crashed, hung or blew up memory (`fuzz/regressions/TARGET/`), and the real-world inputs of
//! `tests/fixtures/real/`; and checks that a safetensors file declaring a 2 GB header is refused
//! with bounded memory. The long fuzz campaign itself is `scripts/fuzz` (not run by `cargo test`).
//!
//! A test binary of its own, not a module of `tests/it/`: the 2 GB header test reads the peak RSS
//! of the whole process, which the other integration tests (a 135M-parameter model among them)
//! would raise if they ran in it.

use std::path::{Path, PathBuf};

use rigbench::fuzz_harness::TARGETS;

mod common;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn run(target: &str, bytes: &[u8]) {
    let f = TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"))
        .1;
    f(bytes);
}

#[test]
fn every_target_has_a_fuzz_binary_and_a_committed_corpus() {
    for (name, _) in TARGETS {
        assert!(
            root()
                .join(format!("fuzz/fuzz_targets/{name}.rs"))
                .is_file(),
            "fuzz/fuzz_targets/{name}.rs missing"
        );
        assert!(
            !files(&root().join("fuzz/corpus").join(name)).is_empty(),
            "fuzz/corpus/{name} is empty: run scripts/fuzz and commit the corpus"
        );
    }
}

#[test]
fn the_corpus_and_every_crash_found_replay_without_panics() {
    let mut n = 0;
    for (name, f) in TARGETS {
        for kind in ["corpus", "regressions"] {
            for p in files(&root().join("fuzz").join(kind).join(name)) {
                let bytes = std::fs::read(&p).unwrap();
                // A panic names the input file (the test harness shows the panic message).
                eprintln!("replay {}", p.display());
                f(&bytes);
                n += 1;
            }
        }
    }
    assert!(n > 0);
}

/// Inputs found by fuzzing, kept as named cases (each was a panic, a hang or unbounded memory
/// before its fix; see docs/reliability.md).
#[test]
fn named_regressions() {
    // SSE: a stream that never ends a line grew the decoder's buffer without bound, and many
    // events in one read were drained one by one from the front (quadratic time).
    let mut endless = vec![7u8];
    endless.extend(std::iter::repeat_n(b'x', 1 << 16));
    run("sse", &endless);
    let mut many = vec![63u8];
    for i in 0..4000 {
        many.extend_from_slice(
            format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{i}\"}}}}]}}\n\n").as_bytes(),
        );
    }
    run("sse", &many);
    // Inputs over 64 KiB (the fuzzers' old cap; they now take up to 1 MiB): a table cell over
    // 65,535 characters panicked in every Markdown table ("Formatting argument out of range").
    let long = "A".repeat(70_000);
    let cfg = serde_json::json!({
        "architectures": [format!("Llama{long}ForCausalLM")],
        "model_type": format!("llama{long}"),
        "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_hidden_layers": 2, "num_key_value_heads": 1, "vocab_size": 32,
        "torch_dtype": format!("bfloat16{long}"),
    })
    .to_string();
    assert!(cfg.len() > 1 << 16);
    run("config_json", cfg.as_bytes());
    run("config_json", format!("{cfg} ").as_bytes());
    let base = root().join("baselines/ci-cpu/qwen3.6-27b.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    v["rig_label"] = long.clone().into();
    run("results_json", v.to_string().as_bytes());
}

#[test]
fn real_inputs_from_the_shared_fixtures_replay() {
    let shared = common::real_fixture("");
    let mut n = 0;
    for (dir, target) in [
        ("logs", "engine_log"),
        ("metrics", "prometheus"),
        ("configs", "config_json"),
        ("configs", "hf_quant_config"),
    ] {
        let found = files(&shared.join(dir));
        assert!(
            !found.is_empty(),
            "no files in {}: the real-world fixtures are incomplete",
            shared.join(dir).display()
        );
        for p in found {
            run(target, &std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    let sse = files(&shared.join("sse"));
    assert!(
        !sse.is_empty(),
        "no files in {}: the real-world fixtures are incomplete",
        shared.join("sse").display()
    );
    for p in sse {
        for cut in [0u8, 6, 63] {
            let mut b = vec![cut];
            b.extend(std::fs::read(&p).unwrap());
            run("sse", &b);
            n += 1;
        }
    }
    assert!(n >= 20, "only {n} shared fixture inputs found");
}

fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn a_2gb_declared_safetensors_header_is_refused_with_bounded_memory() {
    use rigbench::checkpoint::headers::{read_header, MAX_HEADER_BYTES};
    let d = tempfile::tempdir().unwrap();
    let before = peak_rss_bytes();
    // A sparse file really 2 GB long whose header claims 2 GB: refused before any read.
    let p = d.path().join("huge.safetensors");
    let declared: u64 = 2 << 30;
    {
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(declared + 8 + 16).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&declared.to_le_bytes(), 0).unwrap();
    }
    let e = read_header(&p, "huge.safetensors").unwrap_err().to_string();
    assert!(
        e.contains("absurdly large") && e.contains("huge.safetensors"),
        "{e}"
    );
    // The same claim in a small file: refused as truncated.
    let small = d.path().join("small.safetensors");
    let mut b = declared.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    std::fs::write(&small, &b).unwrap();
    assert!(read_header(&small, "small.safetensors").is_err());
    // The largest header accepted, all zero bytes: read once (bounded by the limit) and refused.
    let edge = d.path().join("edge.safetensors");
    {
        let f = std::fs::File::create(&edge).unwrap();
        f.set_len(MAX_HEADER_BYTES + 8).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&MAX_HEADER_BYTES.to_le_bytes(), 0).unwrap();
    }
    assert!(read_header(&edge, "edge.safetensors").is_err());
    if let (Some(b), Some(a)) = (before, peak_rss_bytes()) {
        let grew = a.saturating_sub(b);
        assert!(
            grew < 4 * MAX_HEADER_BYTES,
            "peak memory grew by {grew} bytes reading headers (limit {MAX_HEADER_BYTES})"
        );
    }
}
