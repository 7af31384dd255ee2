//! 48 broken-engine modes against the e2e driver: none crashes rigbench, every spoiled request is
//! reported with its reason.
//!
//! A mock engine written on a raw tokio `TcpListener` (127.0.0.1:0, so every byte, status line,
//! header and TCP write is the test's own) answers `/health`, `/v1/models`, `/tokenize` and the
//! session's prompt-overhead probe (`stream: false`) normally, and answers every streamed
//! generation request with one of 48 named faults: HTTP statuses with and without a JSON error
//! body, a 200 that is not a stream, SSE faults (bad JSON, wrong chunk shapes, errors mid-stream,
//! missing or early `[DONE]`, comments until the timeout, invalid UTF-8, a NUL byte, impossible
//! `usage` counts, odd `finish_reason` / `index`), and transport faults (a reset before the
//! status line, unfinished headers, stalls, a short body, bad chunked encoding, HTTP/1.0 without
//! a length, a redirect loop, a 1 GiB error body). Some of the 48 are legal but unusual framings
//! a correct client must accept (CRLF line ends, an event cut into one-byte writes, a slow drip,
//! a 2 MB line, HTTP/1.0 read to the close), or harmless oddities (an unknown `finish_reason`
//! after all tokens, a choice `index` of 3): those are `Works` and must give every request with
//! the right token count.
//!
//! Each mode runs a small session through `rigbench::e2e::run_session` (3 requests, concurrency
//! 2, a 2 s request timeout) on a thread of its own under `tokio::time::timeout` (30 s), so a
//! panic or a hang is recorded as that mode's outcome rather than ending the test.
//! `Fails(needle)` modes must record every request failed with a non-empty reason holding
//! `needle` (lowercase), and the run must not present a throughput. All outcomes are printed as
//! a table before the one assertion over them, so one broken mode does not hide the others.
//!
//! The behaviour asserted here is the one described in docs/reliability.md ("Faults and their
//! outcomes", "Hostile engines"); the error texts are those of src/e2e/client.rs.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use rigbench::e2e::executor::StopSignal;
use rigbench::e2e::launcher::EngineChoice;
use rigbench::e2e::workload::Suite;
use rigbench::e2e::{run_session, E2eOptions, E2eResults};

/// Requests per session, all answered with the mode's fault.
const REQUESTS: usize = 3;
/// `output_tokens` of the suite: the `max_tokens` of every request.
const OUTPUT_TOKENS: usize = 6;
/// rigbench's per-request timeout in every session.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The wall-clock bound of one session (a hang past it is that mode's failure).
const SESSION_BOUND: Duration = Duration::from_secs(30);
/// How long a stalling mock waits for the client to go away before it gives up itself.
const STALL_CAP: Duration = Duration::from_secs(60);

mod cases;
mod mock;
mod verdict;

use cases::*;
use cases::{ErrBody::*, Expect::*, Mode::*};
use mock::*;
use verdict::*;

#[test]
fn the_mode_list_has_48_distinct_names() {
    let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), 48);
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 48, "duplicate mode names");
    // Each mode is a distinct behaviour too, not one fault under two names.
    let mut modes: Vec<String> = CASES.iter().map(|c| format!("{:?}", c.mode)).collect();
    modes.sort_unstable();
    modes.dedup();
    assert_eq!(modes.len(), 48, "two names for one mock behaviour");
    for c in CASES {
        if let Fails(n) = c.expect {
            assert!(
                !n.is_empty() && n == n.to_lowercase(),
                "{}: a needle must be non-empty and lowercase",
                c.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_eight_broken_engine_modes_none_crashes_and_each_is_reported_with_its_reason() {
    assert_eq!(CASES.len(), 48);
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut wrong = Vec::new();
    let mut reasons = Vec::new();
    for c in CASES {
        let (ended, stats, took) = run_mode(c.mode).await;
        let (observed, bad) = judge(c, &ended, &stats);
        let expect = match c.expect {
            Works => "Works".to_string(),
            Fails(n) => format!("Fails({})", short(n, 40)),
        };
        let verdict = if bad.is_empty() { "pass" } else { "FAIL" };
        rows.push(format!(
            "| {} | {expect} | {} | {verdict} | {:.1} s |",
            c.name,
            observed.replace('|', "/"),
            took.as_secs_f64()
        ));
        if !bad.is_empty() {
            wrong.push(format!("{}:\n    {}", c.name, bad.join("\n    ")));
        }
        if let Ended::Results(r) = &ended {
            let first = r
                .runs
                .iter()
                .flat_map(|run| run.requests.iter())
                .find_map(|q| q.error.clone());
            if let Some(e) = first {
                reasons.push(format!("- {}: {}", c.name, short(&e, 400)));
            }
        }
    }
    println!("\n| mode | expectation | observed | verdict | time |\n|---|---|---|---|---|");
    for r in &rows {
        println!("{r}");
    }
    println!("\nThe first recorded reason of each mode, in full:");
    for r in &reasons {
        println!("{r}");
    }
    println!(
        "\n{} of {} modes as expected; {:.1} s in all",
        CASES.len() - wrong.len(),
        CASES.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} modes not as expected:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}
