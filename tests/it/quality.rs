//! `rigbench quality` (docs/quality.md):
//! - against mock engines that answer a scripted share of the task pack wrong, the McNemar
//!   counts and verdict are the ones those scripts imply, `results.json` holds the interface's
//!   fields, and `compare` fails the run whose candidate is worse;
//! - on SmolLM2-135M (`scripts/fetch-smollm2.sh`; the test FAILS, saying how to fetch it, when
//!   the file is absent): `rigbench serve` BF16 as the reference, the FP8 and NVFP4 runtimes as
//!   candidates; KL and top-1 through the API agree with the in-process fidelity study
//!   (`rigbench::runtime_eval::quality::study`) on the same token ids, and BF16 against itself
//!   is exactly 0.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use rigbench::quality::tasks;

/// A mock engine: a fixed tokenizer (one id per whitespace word), a fixed distribution per
/// position, and task answers right except the n-th chat request (from 0; the pack's items
/// come one at a time in pack order) when n is a multiple of `wrong_every` (0: never wrong).
#[derive(Clone)]
struct Mock {
    wrong_every: usize,
    /// Added to every token id (a different tokenizer when not 0).
    id_shift: u64,
    answers: Arc<HashMap<String, String>>,
    asked: Arc<std::sync::atomic::AtomicUsize>,
}

fn word_id(w: &str) -> u64 {
    w.bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
        % 5000
        + 10
}

async fn tokenize(State(m): State<Mock>, Json(b): Json<Value>) -> Json<Value> {
    let text = match (b.get("prompt"), b.get("messages")) {
        (Some(p), _) => p.as_str().unwrap_or("").to_string(),
        (_, Some(m)) => m
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                format!(
                    "{} {}",
                    x["role"].as_str().unwrap(),
                    x["content"].as_str().unwrap()
                )
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    let ids: Vec<u64> = text
        .split_whitespace()
        .map(|w| word_id(w) + m.id_shift)
        .collect();
    Json(json!({"count": ids.len(), "tokens": ids}))
}

async fn completions(Json(b): Json<Value>) -> Json<Value> {
    let ids: Vec<u64> = b["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let k = b["prompt_logprobs"].as_u64().unwrap() as usize;
    let mut pl = vec![Value::Null];
    for (i, t) in ids.iter().enumerate().skip(1) {
        // Alternatives 1..=k with probabilities 0.5, 0.25, ...; the prompt token 0.01.
        let mut m = serde_json::Map::new();
        for r in 1..=k {
            m.insert(
                format!("{}", 6000 + (i + r) % 50),
                json!({"logprob": -(r as f64) * std::f64::consts::LN_2, "rank": r}),
            );
        }
        m.entry(t.to_string())
            .or_insert(json!({"logprob": 0.01f64.ln(), "rank": 100}));
        pl.push(Value::Object(m));
    }
    Json(
        json!({"choices": [{"text": "x", "prompt_logprobs": pl}], "usage": {"prompt_tokens": ids.len(), "completion_tokens": 1}}),
    )
}

async fn chat(State(m): State<Mock>, Json(b): Json<Value>) -> Json<Value> {
    let prompt = b["messages"][0]["content"].as_str().unwrap();
    let answer = m.answers.get(prompt).cloned().expect("a task pack prompt");
    let index = m.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let wrong = m.wrong_every > 0 && index % m.wrong_every == 0;
    let content = if wrong {
        format!("{answer}0")
    } else {
        format!("The answer is {answer}.")
    };
    Json(
        json!({"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
    )
}

/// Start a mock on a free port in a thread of its own; its base URL.
fn mock(wrong_every: usize) -> String {
    mock_with(wrong_every, 0)
}

fn mock_with(wrong_every: usize, id_shift: u64) -> String {
    let answers: HashMap<String, String> = tasks::pack()
        .into_iter()
        .map(|it| (it.prompt, it.answer))
        .collect();
    let state = Mock {
        wrong_every,
        id_shift,
        answers: Arc::new(answers),
        asked: Default::default(),
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/health", get(|| async { "ok" }))
                .route(
                    "/v1/models",
                    get(|| async { Json(json!({"data": [{"id": "mock"}]})) }),
                )
                .route("/tokenize", post(tokenize))
                .route("/v1/completions", post(completions))
                .route("/v1/chat/completions", post(chat))
                .with_state(state);
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    url
}

#[test]
fn a_scripted_share_of_wrong_answers_gives_the_mcnemar_verdict_it_implies() {
    let (reference, worse, slight) = (mock(0), mock(5), mock(60));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q");
    let o = common::rigbench(&[
        "quality",
        "--reference",
        &reference,
        "--candidate",
        &worse,
        "--candidate",
        &slight,
        "--limit",
        "60",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let q = &v["quality_comparison"];
    let c = q["candidates"].as_array().unwrap();
    assert_eq!(c.len(), 2);
    // Candidate 1: items 0, 5, 10, ... 55 of the first 60 wrong: 12 lost, none won.
    // McNemar exact: 2 · P(X ≤ 0 | Binomial(12, ½)) = 2 · 2⁻¹².
    let t = &c[0]["tasks"];
    assert_eq!(
        (
            t["items"].as_u64(),
            t["passed_reference"].as_u64(),
            t["passed_candidate"].as_u64()
        ),
        (Some(60), Some(60), Some(48))
    );
    let p = c[0]["mcnemar_p"].as_f64().unwrap();
    assert!((p - 2.0 * 0.5f64.powi(12)).abs() < 1e-12, "{p}");
    assert_eq!(c[0]["verdict"], "worse");
    // Candidate 2: only item 0 wrong: p = 1, and 60 items are too few to call a tie.
    assert_eq!(c[1]["tasks"]["passed_candidate"].as_u64(), Some(59));
    // statrs's binomial CDF carries rounding: 2 · P(X ≤ 0 | n = 1) = 1 within 1e-12.
    assert!((c[1]["mcnemar_p"].as_f64().unwrap() - 1.0).abs() < 1e-12);
    assert_eq!(c[1]["verdict"], "undecided");
    assert!(c[1]["would_need"].as_u64().unwrap() > 60);
    // The same distributions everywhere: KL 0 both ways, full agreement, floor 0.
    for x in c {
        for f in [
            "kl_ref_to_candidate",
            "kl_candidate_to_ref",
            "noise_floor_kl",
        ] {
            assert_eq!(x[f].as_f64(), Some(0.0), "{f}");
        }
        assert_eq!(x["top1_agreement"].as_f64(), Some(1.0));
    }
    assert_eq!(q["positions"].as_u64(), Some(60));
    let items = std::fs::read_to_string(out.join("items.csv")).unwrap();
    assert!(
        items.starts_with("item,variant,reference_passed,candidate-1_passed,candidate-2_passed\n")
    );
    assert_eq!(items.lines().count(), 61);
    assert!(std::fs::read_to_string(out.join("quality.md"))
        .unwrap()
        .contains("McNemar"));
    // `compare` gates on the verdict: the worse candidate fails the run (exit 2).
    let results = out.join("results.json");
    let o = common::rigbench(&[
        "compare",
        results.to_str().unwrap(),
        "--baseline",
        results.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("quality/candidate-1/verdict"));
}

/// Few alternatives leave a heavy tail: the report says the KL is understated and how to fix it;
/// with enough alternatives it says nothing of the kind.
#[test]
fn a_heavy_tail_is_named_with_the_flag_that_fixes_it() {
    let (reference, cand) = (mock(0), mock(0));
    let dir = tempfile::tempdir().unwrap();
    for (k, warned) in [("3", true), ("20", false)] {
        let out = dir.path().join(k);
        let o = common::rigbench(&[
            "quality",
            "--reference",
            &reference,
            "--candidate",
            &cand,
            "--no-tasks",
            "--limit",
            "20",
            "--top-k",
            k,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let md = std::fs::read_to_string(out.join("quality.md")).unwrap();
        // The mock lists 0.5, 0.25, … for ranks 1..=k: 2^-3 - 0.01 of the mass is left at k = 3.
        assert_eq!(
            md.contains("low by an unknown amount"),
            warned,
            "top-{k}:\n{md}"
        );
        if warned {
            assert!(
                md.contains("--top-k") && md.contains("--max-logprobs"),
                "{md}"
            );
        }
    }
}

#[test]
fn a_side_that_tokenizes_differently_is_refused_by_name() {
    // Another tokenizer: an error naming the document and the first differing token, never a
    // figure; the runs measured are still written.
    let (reference, other) = (mock(0), mock_with(0, 1));
    let dir = tempfile::tempdir().unwrap();
    let o = common::rigbench(&[
        "quality",
        "--reference",
        &reference,
        "--candidate",
        &other,
        "--limit",
        "6",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let e = common::stderr(&o);
    assert!(
        e.contains("tokenize `public-domain` differently")
            && e.contains("first difference at token 0"),
        "{e}"
    );
    assert!(dir.path().join("runs.json").is_file());
}

#[test]
fn a_candidate_that_cannot_be_reached_exits_1_and_names_it() {
    let reference = mock(0);
    let dir = tempfile::tempdir().unwrap();
    let o = common::rigbench(&[
        "quality",
        "--reference",
        &reference,
        "--candidate",
        "http://127.0.0.1:9",
        "--limit",
        "6",
        "--out",
        dir.path().to_str().unwrap(),
        "--startup-timeout",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("candidate-1"),
        "{}",
        common::stderr(&o)
    );
}

/// The KL estimate from the top 1,000 against the full-vocabulary KL of the in-process study:
/// within 10% (relative) and top-1 within 2 points, on the same token ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_through_serve_agrees_with_the_fidelity_study() {
    use rigbench::quality::client::{run_side, RunSpec, Side};
    use rigbench::runtime::config::{QuantRecipe, WeightFormat};
    let path = rigbench::runtime::gguf_model::smollm2_for_tests();
    const POSITIONS: usize = 128;
    // With 1,000 alternatives about 2% of the reference's mass is left in the tail bucket; with
    // vLLM's default 20 it was 20%, and the KL came out 32% low (docs/quality.md, "Figures").
    let top_k: usize = 1000;
    let spec = RunSpec {
        limit: Some(POSITIONS),
        top_k,
        variants: vec![],
        seed: 0,
        max_tokens_off: 8,
        max_tokens_on: 8,
        timeout: std::time::Duration::from_secs(1800),
        tasks: false,
    };
    let docs = rigbench::quality::corpus::documents().unwrap();
    let mut runs = Vec::new();
    for (label, q, times) in [
        ("reference", None, 2),
        ("fp8", Some(QuantRecipe::Uniform(WeightFormat::Fp8)), 1),
        ("nvfp4", Some(QuantRecipe::Uniform(WeightFormat::Nvfp4)), 1),
    ] {
        let mut cfg = rigbench::runtime::ServeConfig::tiny();
        cfg.model = path.display().to_string();
        cfg.kv_cache_memory = Some(128 << 20);
        cfg.quantize = q;
        cfg.limits.max_logprobs = top_k;
        let s = rigbench::runtime::server::start(cfg).await.unwrap();
        let side = Side {
            label: label.into(),
            how: "rigbench serve (in-process)".into(),
            url: s.url(),
            model: None,
        };
        for _ in 0..times {
            runs.push(
                run_side(&side, &docs, &[], &spec, &mut |m| eprintln!("{m}"))
                    .await
                    .unwrap(),
            );
        }
        s.shutdown().await;
    }
    let q = rigbench::quality::compare(&runs[0], &runs[1], &runs[2..], &Default::default(), top_k)
        .unwrap();
    eprintln!("{}", rigbench::quality::render::render_markdown(&q));
    assert_eq!(q.positions, POSITIONS);
    assert_eq!(q.noise_floor.kl_ab, 0.0, "BF16 against itself");
    assert_eq!(q.noise_floor.top1_agreement, 1.0);
    // The study on the same ids: the first POSITIONS + 1 tokens of the fixed text.
    let ids = &runs[0].docs[0].ids;
    let m = rigbench::runtime::gguf_model::GgufModel::load(&path, None).unwrap();
    assert_eq!(
        &m.tokenizer
            .encode(rigbench::runtime_eval::quality::FIXED_TEXT, false)
            .unwrap()[..ids.len()],
        &ids[..]
    );
    let study = rigbench::runtime_eval::quality::study(
        &m.weights,
        &m.tokenizer,
        "smollm2",
        rigbench::runtime_eval::quality::QualitySpec {
            text_tokens: ids.len(),
            prompts: 1,
            greedy_tokens: 1,
            threads: 2,
        },
        &mut |_| {},
    )
    .unwrap();
    for (cand, fmt) in q.candidates.iter().zip(["fp8", "nvfp4"]) {
        let s = study.formats.iter().find(|f| f.format == fmt).unwrap();
        eprintln!(
            "{fmt}: API KL {:.5} top-1 {:.4} (tail {:.4}); study KL {:.5} top-1 {:.4}",
            cand.kl_ref_to_candidate,
            cand.top1_agreement,
            cand.fidelity.tail_mass_a,
            s.mean_kl,
            s.top1_agreement
        );
        assert!(
            (cand.top1_agreement - s.top1_agreement).abs() <= 0.02,
            "{fmt} top-1"
        );
        assert!(
            (cand.kl_ref_to_candidate - s.mean_kl).abs() <= 0.10 * s.mean_kl,
            "{fmt} KL"
        );
        assert!(cand.kl_candidate_to_ref > 0.0);
        let ppl = cand.fidelity.perplexity_b.unwrap();
        assert!(
            (ppl - s.perplexity.ppl).abs() / s.perplexity.ppl < 1e-3,
            "{fmt} perplexity {ppl} vs {}",
            s.perplexity.ppl
        );
    }
}
