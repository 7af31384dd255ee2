//! Prompt lengths: llama.cpp's own `/tokenize` body, `usage.prompt_tokens` and the tolerance.

use super::mock::*;

// ---------------------------------------------------------------------------------------------
// 1. Prompt lengths against llama.cpp: its own /tokenize body, checked against usage.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_prompts_are_token_exact_through_its_own_tokenize_body() {
    let (url, m) = start(Cfg::llamacpp()).await;
    let overhead = template_overhead();
    assert!(overhead > 0);
    // Two lengths (the 64 and 256).
    for input in [64u32, 256] {
        let r = session(&options(&url, suite(&fixed(input, 8), CLOSED))).await;
        assert!(r.failure.is_none(), "{:?}", r.failure);
        let f = &r.engine.facts;
        assert_eq!(f.kind, EngineKind::LlamaCpp);
        assert_eq!(f.tokenize_form, Some(TokenizeForm::LlamaCpp));
        assert_eq!(f.prompt_overhead.as_ref().unwrap().value, overhead);
        let run = &r.runs[0];
        assert!(run.validity.valid, "{:#?}", run.validity);
        for q in &run.requests {
            assert_eq!(q.input_tokens_counted, Some(u64::from(input)), "{q:?}");
            // The engine's count is the prompt plus the template, never a −100% mismatch.
            let p = q.prompt_tokens.unwrap() as i64;
            assert!(
                (p - i64::from(input) - overhead).abs() <= 2,
                "prompt {p} for {input} + {overhead}"
            );
        }
        let check = run.conditions.lengths.prompt_check.as_ref().unwrap();
        assert_eq!((check.checked, check.mismatched), (4, 0));
        assert_eq!(run.conditions.lengths.input_exact, Some(true));
        let md = rigbench::e2e::render_markdown(&r);
        assert!(
            md.contains(&format!("its chat template adds {overhead}")),
            "{md}"
        );
    }
    // llama.cpp was asked in its own body; vLLM's body would have counted nothing.
    let bodies = m.tokenize_bodies.lock().unwrap().clone();
    assert!(
        bodies.get("content").copied().unwrap_or(0) > 10,
        "{bodies:?}"
    );
    assert_eq!(bodies.get("prompt"), None, "{bodies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_tokenization_is_an_error_never_zero() {
    // llama.cpp answers vLLM's body with 200 {"tokens": []}: an error, not 0 tokens.
    let (url, _m) = start(Cfg::llamacpp()).await;
    let c = EngineClient::new(&url).unwrap();
    let e = c
        .tokenize_as(TokenizeForm::Vllm, "m", "three short words")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("counted 0 tokens for a non-empty text"), "{e}");
    let ok = c
        .tokenize_as(TokenizeForm::LlamaCpp, "m", "three short words")
        .await
        .unwrap()
        .unwrap();
    assert!(ok.count >= 3);
    // The empty text is legitimately 0.
    assert_eq!(
        c.tokenize_as(TokenizeForm::LlamaCpp, "m", "")
            .await
            .unwrap()
            .unwrap()
            .count,
        0
    );
    // A server whose /tokenize counts nothing in either body: not used, said why, and the
    // prompt lengths are not claimed exact; with --tokenizer they are.
    let (url, _m) = start(Cfg {
        tokenize_broken: true,
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(32, 4), CLOSED))).await;
    let f = &r.engine.facts;
    assert!(!f.tokenize);
    assert!(
        f.tokenize_note
            .as_deref()
            .unwrap()
            .contains("counted 0 tokens"),
        "{:?}",
        f.tokenize_note
    );
    let run = &r.runs[0];
    assert_eq!(run.conditions.lengths.input_exact, None);
    assert!(run
        .requests
        .iter()
        .all(|q| q.input_tokens_counted.is_none()));
    assert!(
        r.notes.iter().any(|n| n.contains("--tokenizer")),
        "{:?}",
        r.notes
    );
    let mut o = options(&url, suite(&fixed(32, 4), CLOSED));
    o.tokenizer = Some(tokenizer_path());
    let r = session(&o).await;
    let run = &r.runs[0];
    assert_eq!(run.conditions.lengths.input_exact, Some(true));
    assert!(run.validity.valid, "{:#?}", run.validity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokenizer_flag_is_used_when_given() {
    // The engine's own tokenizer agrees with --tokenizer: used, and said so.
    let (url, m) = start(Cfg::vllm()).await;
    let mut o = options(&url, suite(&fixed(48, 4), CLOSED));
    o.tokenizer = Some(tokenizer_path());
    let r = session(&o).await;
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("token counts from --tokenizer") && n.contains("agrees")),
        "{:?}",
        r.notes
    );
    let run = &r.runs[0];
    assert!(run.validity.valid, "{:#?}", run.validity);
    assert_eq!(
        run.conditions.token_check.as_ref().unwrap().source,
        TokenSource::LocalTokenizer.label()
    );
    // Prompts were fitted with the local tokenizer: the engine's /tokenize saw only the probes.
    assert!(
        m.tokenize_bodies
            .lock()
            .unwrap()
            .get("prompt")
            .copied()
            .unwrap_or(0)
            <= 2
    );
    // A served model whose tokenizer is not the one given: the probe says so, and the prompt
    // lengths the engine counts do not match: the run is invalid, with the reason.
    let (url, _m) = start(Cfg {
        word_tokenizer: true,
        ..Cfg::vllm()
    })
    .await;
    let mut o = options(&url, suite(&fixed(96, 4), CLOSED));
    o.tokenizer = Some(tokenizer_path());
    let r = session(&o).await;
    assert!(
        r.notes.iter().any(|n| n.contains("DISAGREES")),
        "{:?}",
        r.notes
    );
    let run = &r.runs[0];
    assert!(!run.validity.valid);
    assert!(
        run.validity
            .reasons
            .iter()
            .any(|w| w.contains("prompt lengths disagree with the engine's usage.prompt_tokens")),
        "{:?}",
        run.validity.reasons
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Prompt lengths against usage.prompt_tokens: max(2%, 2 tokens) after the known overhead.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_length_mismatches_beyond_the_tolerance_invalidate_the_run() {
    let ov = template_overhead();
    let tol = |input: u32| ((0.02 * (i64::from(input) + ov) as f64).floor() as i64).max(2);
    // (prompt length, tokens the engine counts beyond prompt + template on the measured
    // prompts only, valid?): a BPE merge of a token or two at the template boundary is within
    // the tolerance; more is not.
    let cases = [
        (16u32, 1i64, true),
        (16, tol(16), true),
        (16, tol(16) + 1, false),
        (200, tol(200), true),
        (200, -(tol(200) + 1), false),
        (200, 21, false),
    ];
    for (input, delta, valid) in cases {
        let (url, _m) = start(Cfg {
            prompt_delta: delta,
            ..Cfg::vllm()
        })
        .await;
        let r = session(&options(&url, suite(&fixed(input, 4), CLOSED))).await;
        let run = &r.runs[0];
        assert_eq!(
            r.engine.facts.prompt_overhead.as_ref().unwrap().value,
            ov,
            "the probe is counted as the engine counts it"
        );
        let check = run.conditions.lengths.prompt_check.as_ref().unwrap();
        assert_eq!(check.checked, 4);
        assert_eq!(check.max_abs_diff, delta.unsigned_abs(), "{input} {delta}");
        assert_eq!(
            run.validity.valid, valid,
            "{input} tokens, {delta:+}: {:#?}",
            run.validity
        );
        if !valid {
            let why = run.validity.reasons.join("; ");
            assert!(
                why.contains("4 of 4 prompt lengths disagree")
                    && why.contains(&format!("off by {}", delta.unsigned_abs())),
                "{why}"
            );
        }
    }
    // An engine that counts 10% more on every prompt (another tokenizer): the probe's
    // overhead absorbs the difference on a short text only; long prompts are caught.
    let (url, _m) = start(Cfg {
        prompt_scale: 1.10,
        ..Cfg::vllm()
    })
    .await;
    let r = session(&options(&url, suite(&fixed(300, 4), CLOSED))).await;
    assert!(!r.runs[0].validity.valid, "{:#?}", r.runs[0].validity);
}
