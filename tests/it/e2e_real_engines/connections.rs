//! Connections: llama-server closes idle kept-alive connections after 5 s.

use super::mock::*;

// ---------------------------------------------------------------------------------------------
// 3. Connections: llama-server closes idle kept-alive connections after 5 s.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_connection_the_server_closed_is_retried_once_on_a_fresh_one() {
    let (url, m) = start(Cfg {
        keepalive: Some(Duration::from_millis(150)),
        ..Cfg::llamacpp()
    })
    .await;
    // A pool that keeps connections longer than the server does (as rigbench did).
    let c = EngineClient::with_idle_timeout(&url, Duration::from_secs(60)).unwrap();
    let req = GenRequest {
        api: rigbench::e2e::client::Api::Chat,
        model: "m".into(),
        prompt: "hello there".into(),
        max_tokens: 4,
        ignore_eos: true,
        temperature: 0.0,
        seed: None,
        thinking: None,
    };
    let (_, first) = c
        .stream(&req, Duration::from_secs(30), std::future::pending())
        .await;
    assert!(first.error.is_none() && first.retries == 0, "{first:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, second) = c
        .stream(&req, Duration::from_secs(30), std::future::pending())
        .await;
    assert_eq!(m.stale_resets.load(Ordering::SeqCst), 1);
    assert!(second.error.is_none(), "{:?}", second.error);
    assert!(second.done);
    assert_eq!(second.retries, 1);
    assert!(second.retry_reason.is_some());
    // Idle connections dropped before the server's limit: nothing to retry.
    let c = EngineClient::with_idle_timeout(&url, Duration::from_millis(50)).unwrap();
    for _ in 0..2 {
        let (_, o) = c
            .stream(&req, Duration::from_secs(30), std::future::pending())
            .await;
        assert!(o.error.is_none() && o.retries == 0, "{o:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(m.stale_resets.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_server_that_closed_idle_connections_is_not_unreachable() {
    // An open loop at 3 requests/s leaves connections idle beyond the server's 150 ms.
    let load = "mode = 'open'
rates = [3.0]
requests = 8
warmup = 0
cache = 'cold'";
    let (url, m) = start(Cfg {
        keepalive: Some(Duration::from_millis(150)),
        ..Cfg::llamacpp()
    })
    .await;
    let mut o = options(&url, suite(&fixed(32, 4), load));
    o.pool_idle_timeout = Duration::from_secs(60);
    // No scrape during the run: it would keep a pooled connection fresh for the requests. The
    // seeded arrival gaps leave several connections idle beyond 150 ms.
    o.metrics_interval = Duration::from_secs(30);
    let r = session(&o).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    let retried = run.requests.iter().filter(|q| q.retries > 0).count();
    assert!(m.stale_resets.load(Ordering::SeqCst) >= 1);
    assert!(retried >= 1, "{:?}", run.requests);
    assert!(run.requests.iter().all(|q| q.ok), "{:?}", run.requests);
    assert!(run.validity.valid, "{:#?}", run.validity);
    assert!(
        run.validity
            .notes
            .iter()
            .any(|n| n.contains("sent again once on a fresh connection")),
        "{:?}",
        run.validity.notes
    );
    // The default pool (idle connections dropped before the server's keep-alive): no reset
    // reaches a request.
    let (url, m) = start(Cfg {
        keepalive: Some(Duration::from_millis(300)),
        ..Cfg::llamacpp()
    })
    .await;
    let mut o = options(&url, suite(&fixed(32, 4), load));
    o.pool_idle_timeout = Duration::from_millis(100);
    let r = session(&o).await;
    assert_eq!(m.stale_resets.load(Ordering::SeqCst), 0);
    assert!(r.runs[0].validity.valid, "{:#?}", r.runs[0].validity);
    // Every generation connection reset while /health answers: requests fail (the run is
    // invalid), but the engine is not declared unreachable.
    let (url, _m) = start(Cfg {
        generation_resets: true,
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 4), CLOSED))).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    assert!(run.requests.iter().all(|q| !q.ok));
    assert!(!run.validity.valid);
    assert!(
        run.validity
            .notes
            .iter()
            .any(|n| n.contains("while GET /health still answered")),
        "{:?}",
        run.validity.notes
    );
}
