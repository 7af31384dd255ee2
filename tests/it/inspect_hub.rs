//! `rigbench inspect hf://ORG/NAME[@REV]` against a local server that serves a checkpoint's
//! files the way the hub does (`/{org}/{name}/resolve/{rev}/{file}`), honouring HTTP Range;
//! and one that ignores Range. The result must equal inspecting the folder itself, and only
//! the headers may cross the wire.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use rigbench::checkpoint::hub::{fetch_metadata, HubRef};
use rigbench::checkpoint::{inspect, InspectOptions};

struct Served {
    dir: PathBuf,
    honour_range: bool,
    bytes_sent: AtomicU64,
}

async fn file(
    State(s): State<Arc<Served>>,
    UrlPath((org, name, rev, f)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if org != "acme" || name != "tiny" || rev != "main" || f.contains("..") {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Ok(bytes) = std::fs::read(s.dir.join(&f)) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let total = bytes.len() as u64;
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
    match range {
        Some((a, b)) if s.honour_range && a <= b && a < total => {
            let b = b.min(total - 1);
            let body = bytes[a as usize..=b as usize].to_vec();
            s.bytes_sent.fetch_add(body.len() as u64, Ordering::SeqCst);
            (
                StatusCode::PARTIAL_CONTENT,
                [(header::CONTENT_RANGE, format!("bytes {a}-{b}/{total}"))],
                body,
            )
                .into_response()
        }
        _ => {
            s.bytes_sent.fetch_add(total, Ordering::SeqCst);
            bytes.into_response()
        }
    }
}

async fn serve(dir: &Path, honour_range: bool) -> (String, Arc<Served>) {
    let s = Arc::new(Served {
        dir: dir.to_path_buf(),
        honour_range,
        bytes_sent: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/{org}/{name}/resolve/{rev}/{*f}", get(file))
        .with_state(s.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (format!("http://{addr}"), s)
}

fn checkpoint() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints/qwen36-mixed-clean")
}

/// What `rigbench inspect` passes (no card).
fn cli_options() -> InspectOptions {
    InspectOptions::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_headers_by_range_equal_the_local_folder() {
    let local = inspect(&checkpoint(), &cli_options()).unwrap();
    let shard = std::fs::metadata(checkpoint().join("model.safetensors"))
        .unwrap()
        .len();
    for honour_range in [true, false] {
        let (url, served) = serve(&checkpoint(), honour_range).await;
        let tmp = tempfile::tempdir().unwrap();
        let r: HubRef = "hf://acme/tiny".parse().unwrap();
        let got = fetch_metadata(&r, &url, None, tmp.path()).await.unwrap();
        assert!(got.files.contains(&"config.json".to_string()));
        assert!(got.files.contains(&"hf_quant_config.json".to_string()));
        assert_eq!(got.shards.len(), 1);
        assert_eq!(
            got.shards[0].1, shard,
            "the real file size, from Content-Range"
        );
        let sent = served.bytes_sent.load(Ordering::SeqCst);
        if honour_range {
            let meta: u64 = ["config.json", "hf_quant_config.json"]
                .iter()
                .map(|f| std::fs::metadata(checkpoint().join(f)).unwrap().len())
                .sum();
            assert_eq!(sent, meta + 8 + got.shards[0].2, "headers only");
        }
        let remote = tokio::task::spawn_blocking({
            let p = tmp.path().to_path_buf();
            move || inspect(&p, &cli_options()).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(remote.modules, local.modules, "range={honour_range}");
        assert_eq!(remote.findings, local.findings);
        assert_eq!(remote.tensors.total_bytes, local.tensors.total_bytes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_repo_and_unreachable_hub_are_clear() {
    let (url, _s) = serve(&checkpoint(), true).await;
    let tmp = tempfile::tempdir().unwrap();
    let e = fetch_metadata(&"hf://acme/other".parse().unwrap(), &url, None, tmp.path())
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("no config.json"), "{e:#}");
    let e = fetch_metadata(
        &"hf://acme/tiny".parse().unwrap(),
        "http://127.0.0.1:9",
        None,
        tmp.path(),
    )
    .await
    .unwrap_err();
    assert!(
        format!("{e:#}").contains("cannot reach the Hugging Face hub"),
        "{e:#}"
    );
}

#[test]
fn cli_unreachable_hub_exits_1_and_bad_reference_64() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["inspect", "hf://acme/tiny"])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot reach the Hugging Face hub") && err.contains("HF_ENDPOINT"),
        "{err}"
    );
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["inspect", "hf://acme"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
}

/// A hub that lies: it states a shard size of 2^50 bytes in `Content-Range` (once "File too
/// large (os error 27)"), or its index names a shard `%2e%2e/…` (once past the `..` check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_shard_sizes_and_escaped_shard_names_are_refused_naming_the_file() {
    // The real checkpoint, but the shard's stated size is 2^50.
    async fn lying(
        State(s): State<Arc<Served>>,
        UrlPath((_o, _n, _r, f)): UrlPath<(String, String, String, String)>,
        headers: HeaderMap,
    ) -> Response {
        let Ok(bytes) = std::fs::read(s.dir.join(&f)) else {
            return StatusCode::NOT_FOUND.into_response();
        };
        let range = headers
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
        match range {
            Some((a, b)) if a < bytes.len() => {
                let b = b.min(bytes.len() - 1);
                (
                    StatusCode::PARTIAL_CONTENT,
                    [(
                        header::CONTENT_RANGE,
                        format!("bytes {a}-{b}/{}", 1u64 << 50),
                    )],
                    bytes[a..=b].to_vec(),
                )
                    .into_response()
            }
            _ => bytes.into_response(),
        }
    }
    let s = Arc::new(Served {
        dir: checkpoint(),
        honour_range: true,
        bytes_sent: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/{org}/{name}/resolve/{rev}/{*f}", get(lying))
        .with_state(s);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let tmp = tempfile::tempdir().unwrap();
    let e = fetch_metadata(&"hf://acme/tiny".parse().unwrap(), &url, None, tmp.path())
        .await
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("model.safetensors")
            && e.contains("1125899906842624 bytes")
            && e.contains("limit of 1099511627776 bytes"),
        "{e}"
    );
    // An index naming `%2e%2e/…`: refused before any request for it.
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "hf_quant_config.json"] {
        std::fs::copy(checkpoint().join(f), dir.path().join(f)).unwrap();
    }
    for bad in [
        "%2e%2e/%2e%2e/etc/passwd",
        "..%2fx.safetensors",
        "a/../../x.safetensors",
    ] {
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            serde_json::json!({"weight_map": {"w": bad}}).to_string(),
        )
        .unwrap();
        let (url, _s) = serve(dir.path(), true).await;
        let out = tempfile::tempdir().unwrap();
        let e = fetch_metadata(&"hf://acme/tiny".parse().unwrap(), &url, None, out.path())
            .await
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains(bad) && e.contains("not a file of the repository"),
            "{e}"
        );
    }
}
