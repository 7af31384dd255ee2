//! `rigbench serve` as a process: the startup lines launchers parse, a streaming request over
//! loopback, and clear errors for bad flags and checkpoints.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_prints_kv_and_listening_lines_and_streams() {
    let child = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args([
            "serve",
            "--model",
            "synthetic:tiny",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kv-cache-memory",
            "32MiB",
            "--max-model-len",
            "4096",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Kill(child);
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    // vLLM's lines; the CPU backend's blocks are host memory, not "GPU" blocks.
    let budget = lines.next().unwrap().unwrap();
    assert_eq!(
        budget,
        "Available KV cache memory: 0.03 GiB (--kv-cache-memory)"
    );
    let kv = lines.next().unwrap().unwrap();
    // 32 MiB / (256 B per token) = 131,072 tokens = 8,192 blocks; 8,192 / 256 = 32.00x.
    assert_eq!(kv, "CPU KV cache size: 131,072 tokens");
    let conc = lines.next().unwrap().unwrap();
    assert_eq!(
        conc,
        "Maximum concurrency for 4,096 tokens per request: 32.00x"
    );
    let listen = lines.next().unwrap().unwrap();
    let url = listen
        .strip_prefix("rigbench serve: listening on ")
        .unwrap_or_else(|| panic!("unexpected line: {listen}"))
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = rt.block_on(async {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
            .post(format!("{url}/v1/chat/completions"))
            .body(r#"{"model":"synthetic:tiny","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}"#)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    assert!(body.starts_with("data: {"), "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
}

#[test]
fn bad_flags_and_checkpoints_fail_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["serve", "--kv-cache-dtype", "int2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    // A CUDA device that is not there (cuda:0 on a machine without a GPU, one past the last
    // GPU otherwise): exit 64 with the reason.
    let n = rigbench::runtime::device::probe_gpus().count;
    let out = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["serve", "--port", "0", "--device", &format!("cuda:{n}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--device") && err.contains(&format!("cuda:{n}")),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-checkpoint");
    let out = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["serve", "--port", "0", "--model", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-checkpoint"), "{err}");
    std::fs::write(
        dir.path().join("config.json"),
        "{\"model_type\": \"mamba\"}",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args([
            "serve",
            "--port",
            "0",
            "--model",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config.json") && err.contains("mamba"),
        "{err}"
    );
}
