//! Token accounting from every chunk, on the real SSE captures.

use super::mock::*;

// ---------------------------------------------------------------------------------------------
// 4. Token accounting from every chunk: the real SSE captures.

/// Arrival times for a capture without them: `ms[i]` for event `i`.
fn outcome_of(events: &[String], ms: impl Fn(usize) -> f64) -> StreamOutcome {
    let mut o = StreamOutcome::default();
    for (i, e) in events.iter().enumerate() {
        o.apply(Duration::from_secs_f64(ms(i) / 1e3), e).unwrap();
    }
    o.end = Duration::from_secs_f64(ms(events.len()) / 1e3);
    o
}

#[test]
fn vllm_capture_counts_every_token_including_the_empty_content_chunks() {
    let events = sse_events(&vllm_file("09_"));
    // Synthetic arrival times (the capture holds none): one event every 2 ms from 50 ms.
    let o = outcome_of(&events, |i| 50.0 + 2.0 * i as f64);
    assert!(o.done);
    assert_eq!(o.chunks, 130, "129 choices chunks and the usage-only one");
    assert_eq!(o.choice_chunks, 129);
    let empty = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v.pointer("/choices/0/delta/content") == Some(&json!("")))
        .count();
    assert_eq!(empty, 35);
    // 128 token chunks, one token each, counted from the cumulative usage.
    assert_eq!(o.events.len(), 128);
    let usage = o.usage.unwrap().completion_tokens;
    assert_eq!(usage, Some(128));
    let (tokens, split) = split_tokens(&o.events, usage);
    assert_eq!(split, ChunkSplit::UsagePerChunk);
    assert!(tokens.iter().all(|t| *t == 1));
    assert_eq!(
        o.events.iter().filter(|e| e.content_chars == 0).count(),
        34,
        "34 tokens arrived with an empty content (held back or special)"
    );
    // TTFT: the first token (event 1, empty content); TTFC: the first text (event 2); vllm bench
    // serve's first chunk: the role chunk (event 0).
    let (ttft, ttfc, tpot, itl) = rigbench::e2e::metrics::latencies(&o, &tokens, usage);
    assert_eq!(ttft, Some(0.052));
    assert_eq!(ttfc, Some(0.054));
    assert_eq!(o.first_chunk, Some(Duration::from_millis(50)));
    assert_eq!(itl.len(), 127);
    // The stream ends with the [DONE] event (131st) at 50 + 2 × 131 ms.
    assert!((tpot.unwrap() - (0.312 - 0.052) / 127.0).abs() < 1e-12);
    let d = Delivery::of(&o.events, &tokens, usage, true);
    assert!(!d.bursty, "{d:?}");
}

#[test]
fn llamacpp_capture_is_bursty_without_per_chunk_usage() {
    let events = sse_events(&llamacpp_file("13_"));
    // Synthetic arrival times after the fixture's README: the first ~10 tokens within 0.2 ms
    // of each other, then one chunk every 4 ms.
    let at = |i: usize| match i {
        0 => 30.0,
        1..=10 => 40.0 + 0.02 * (i - 1) as f64,
        _ => 40.2 + 4.0 * (i - 10) as f64,
    };
    let o = outcome_of(&events, at);
    assert!(o.done);
    // No usage until the end (llama-server ignores continuous_usage_stats).
    assert_eq!(o.usage_chunks, 0);
    assert_eq!(o.usage.unwrap().completion_tokens, Some(32));
    // The role chunk (content null) and the empty finish chunk carry no token.
    assert_eq!(o.events.len(), 26);
    let (tokens, split) = split_tokens(&o.events, Some(32));
    assert_eq!(split, ChunkSplit::Estimated);
    assert_eq!(tokens.iter().sum::<u64>(), 32);
    let (ttft, ttfc, _, _) = rigbench::e2e::metrics::latencies(&o, &tokens, Some(32));
    assert_eq!(ttft, Some(0.040));
    assert_eq!(ttfc, Some(0.040));
    assert_eq!(o.first_chunk, Some(Duration::from_millis(30)));
    let d = Delivery::of(&o.events, &tokens, Some(32), false);
    assert!(d.bursty);
    assert_eq!(d.burst_gaps, 9);
    assert_eq!((d.extra_tokens, d.multi_token_chunks), (6, 6));
    // The cached prompt tokens the engine reported with it.
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["timings"]["cache_n"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_vllm_capture_gives_128_tokens_and_the_first_token_time() {
    let events = sse_events(&vllm_file("09_"));
    // One event per write, 2 ms apart (the capture holds no times).
    let mut groups = vec![(Duration::from_millis(20), 1)];
    groups.extend(std::iter::repeat_n(
        (Duration::from_millis(2), 1),
        events.len() - 1,
    ));
    let (url, _m) = start(Cfg {
        replay: Some(Replay { events, groups }),
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 128), CLOSED))).await;
    assert!(r.failure.is_none(), "{:?}", r.failure);
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(128));
        assert_eq!(q.token_chunks, 128);
        assert_eq!(q.chunks, 130);
        assert_eq!(q.chunk_split, Some(ChunkSplit::UsagePerChunk));
        assert!(q.ttft_s.unwrap() <= q.ttfc_s.unwrap());
        assert!(q.first_chunk_s.unwrap() <= q.ttft_s.unwrap());
        assert!(
            !q.flags
                .iter()
                .any(|f| f.contains("one chunk") || f.starts_with("empty")),
            "{:?}",
            q.flags
        );
    }
    assert_eq!(run.latency.decode_not_observable, 0);
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains("TTFT: request sent → the first chunk that carries a generated token"),
        "{md}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_llamacpp_capture_is_flagged_bursty_and_its_itl_marked() {
    let events = sse_events(&llamacpp_file("13_"));
    // The role chunk, then the first 10 token chunks in one write (a burst), then one by one.
    let mut groups = vec![
        (Duration::from_millis(20), 1),
        (Duration::from_millis(5), 10),
    ];
    groups.extend(std::iter::repeat_n(
        (Duration::from_millis(4), 1),
        events.len() - 11,
    ));
    let (url, _m) = start(Cfg {
        replay: Some(Replay { events, groups }),
        ..Cfg::llamacpp()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 32), CLOSED))).await;
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    for q in &run.requests {
        assert_eq!(q.output_tokens, Some(32));
        assert_eq!(q.token_chunks, 26);
        assert!(q.delivery.as_ref().unwrap().bursty);
        assert!(
            q.flags.iter().any(|f| f.starts_with("bursty delivery")),
            "{:?}",
            q.flags
        );
    }
    assert_eq!(run.latency.bursty, 4);
    let md = rigbench::e2e::render_markdown(&r);
    assert!(
        md.contains("ITL (delivery, not decode: 4 bursty requests)"),
        "{md}"
    );
}
