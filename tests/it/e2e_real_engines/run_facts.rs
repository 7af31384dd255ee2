//! What the run says about itself: scrapes, the reset, the suite, a failed start.

use super::mock::*;

// ---------------------------------------------------------------------------------------------
// 6. What the run says about itself: scrapes, the reset, the suite, a failed start.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_are_counted_and_timed() {
    let (url, _m) = start(Cfg {
        token_delay: Duration::from_millis(5),
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 24), CLOSED))).await;
    let p = &r.runs[0].polls;
    // The start and the end at least; every scrape answered and timed.
    assert!(p.scrape_ms.len() >= 2, "{p:?}");
    assert_eq!(p.scrape_ms.len(), p.polls);
    assert!(p.scrape_ms.iter().all(|ms| *ms >= 0.0));
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains(&format!("c=1: {} scrapes", p.scrape_ms.len())),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_says_what_the_reset_did_and_which_suite_ran() {
    let (url, _m) = start(Cfg::llamacpp()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rep");
    let (url2, out2) = (url.clone(), out.clone());
    let o = tokio::task::spawn_blocking(move || {
        crate::common::rigbench(&[
            "e2e",
            "--url",
            &url2,
            "--suite",
            "tiny",
            "--input-tokens",
            "40",
            "--output-tokens",
            "6",
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--no-progress",
            "--out",
            out2.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    let err = crate::common::stderr(&o);
    assert!(o.status.success(), "{err}");
    // llama.cpp has no /reset_prefix_cache: nothing claims it was emptied.
    assert!(!err.contains("emptied the engine's prefix cache"), "{err}");
    assert!(err.contains("offers no POST"), "{err}");
    assert!(
        err.contains("suite `tiny` as run: 40-token prompts, 6 output tokens"),
        "{err}"
    );
    let md = read(&out.join("report.md"));
    assert!(
        md.contains("Suite: `tiny` as run: 40-token prompts, 6 output tokens (fixed, ignore_eos), chat API; closed loop at concurrency 2; 4 requests per point"),
        "{md}"
    );
    // vLLM's reset answers 200: then it is said, after the fact.
    let (url, _m) = start(Cfg::vllm()).await;
    let out = dir.path().join("rep2");
    let o = tokio::task::spawn_blocking(move || {
        crate::common::rigbench(&[
            "e2e",
            "--url",
            &url,
            "--suite",
            "tiny",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--output-tokens",
            "4",
            "--no-progress",
            "--out",
            out.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    let err = crate::common::stderr(&o);
    assert!(
        err.contains("/reset_prefix_cache emptied the engine's prefix cache"),
        "{err}"
    );
}

#[test]
fn a_startup_failure_is_reported_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // vLLM's own argparse failure (the fixture, rigbench-captured), then a path under a home.
    let log = vllm_file("06_");
    let cmd = format!(
        "cat '{}'; echo 'cannot open /home/alice/models/secret-model/config.json'; exit 2",
        log.display()
    );
    let o = crate::common::rigbench(&[
        "e2e",
        "--engine-cmd",
        &cmd,
        "--port",
        &port.to_string(),
        "--no-progress",
        "--startup-timeout",
        "30",
        "--out",
        dir.path().join("rep").to_str().unwrap(),
    ]);
    let err = crate::common::stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("exited during startup"), "{err}");
    assert!(err.contains("unrecognized arguments"), "{err}");
    // Paths are redacted as in the report (the home folder becomes `<home>`).
    assert!(!err.contains("/home/alice"), "{err}");
    assert!(err.contains("<home>/models"), "{err}");
}
