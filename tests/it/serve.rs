//! The built-in server over real loopback HTTP: streaming, usage, reasoning split, errors,
//! disconnects, queueing, speculative decoding and /metrics values.

use std::time::{Duration, Instant};

use futures::StreamExt;
use rigbench::runtime::server::{start, ServeConfig, ServerHandle};
use rigbench::runtime::SpecConfig;
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn post(s: &ServerHandle, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{}{path}", s.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// POST a streaming request and return every `data:` payload (the final `[DONE]` included).
async fn stream(s: &ServerHandle, path: &str, body: Value) -> Vec<String> {
    let r = client()
        .post(format!("{}{path}", s.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// Scrape /metrics into (series with labels) → value.
async fn metrics(s: &ServerHandle) -> std::collections::HashMap<String, f64> {
    let t = client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    t.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn m(map: &std::collections::HashMap<String, f64>, name: &str) -> f64 {
    *map.get(&format!("{name}{{model_name=\"synthetic:tiny\"}}"))
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

fn chat(content: &str, max_tokens: u64) -> Value {
    json!({"model": "synthetic:tiny", "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_usage_and_non_streaming() {
    let s = start(ServeConfig::tiny()).await.unwrap();
    let c = client();
    assert_eq!(
        c.get(format!("{}/health", s.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let v: Value = c
        .get(format!("{}/version", s.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["engine"], "rigbench");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let models: Value = c
        .get(format!("{}/v1/models", s.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "synthetic:tiny");
    assert_eq!(models["data"][0]["max_model_len"], 2048);

    let msgs = json!([{"role": "user", "content": "hello there"}]);
    let (st, tok) = post(&s, "/tokenize", json!({"messages": msgs})).await;
    assert_eq!(st, 200);
    assert_eq!(tok["max_model_len"], 2048);
    assert_eq!(
        tok["count"].as_u64().unwrap() as usize,
        tok["tokens"].as_array().unwrap().len()
    );
    let (st, det) = post(&s, "/detokenize", json!({"tokens": tok["tokens"]})).await;
    assert_eq!(st, 200);
    assert!(det["prompt"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>user\nhello there<|im_end|>"));

    let (st, r) = post(&s, "/v1/chat/completions", chat("hello there", 9)).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 9);
    assert_eq!(r["usage"]["prompt_tokens"], tok["count"]);
    assert_eq!(
        r["usage"]["total_tokens"].as_u64().unwrap(),
        9 + tok["count"].as_u64().unwrap()
    );

    let (st, r) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Once upon", "max_tokens": 5, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["usage"]["completion_tokens"], 5);
    assert_eq!(r["usage"]["prompt_tokens"], 9);
    // Token-id prompts are accepted too.
    let (st, r) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [79, 110, 99, 101], "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], 4);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_usage_and_reasoning_split() {
    let s = start(ServeConfig::tiny()).await.unwrap();
    // Thinking on (asked for): the template opens <think>, so text is reasoning.
    let mut body = chat("tell me", 12);
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = stream(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    let finish: Vec<&Value> = chunks
        .iter()
        .filter(|c| {
            !c["choices"][0]["finish_reason"].is_null()
                && c["choices"].as_array().is_some_and(|a| !a.is_empty())
        })
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "length");
    let text = |key: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| {
                c["choices"].get(0)?["delta"]
                    .get(key)?
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    };
    let reasoning = text("reasoning_content");
    assert!(!reasoning.is_empty(), "thinking on gives reasoning_content");
    // The non-streaming answer to the same greedy request carries the same text.
    let mut same = chat("tell me", 12);
    same["chat_template_kwargs"] = json!({"enable_thinking": true});
    let (_, full) = post(&s, "/v1/chat/completions", same).await;
    let msg = &full["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"].as_str().unwrap_or(""), reasoning);
    assert_eq!(msg["content"].as_str().unwrap(), text("content"));

    // Not asked for (a first curl): thinking is off, the answer is content.
    let (_, plain) = post(&s, "/v1/chat/completions", chat("tell me", 12)).await;
    let m = &plain["choices"][0]["message"];
    assert!(
        !m["content"].as_str().unwrap_or("").is_empty(),
        "a request without chat_template_kwargs gets content: {plain}"
    );
    assert!(
        m["reasoning_content"].as_str().unwrap_or("").is_empty(),
        "{plain}"
    );

    // Thinking off: no reasoning at all.
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let events = stream(&s, "/v1/chat/completions", body).await;
    let all = events.join("\n");
    assert!(!all.contains("reasoning_content"), "{all}");
    assert!(all.contains("\"content\""));

    // Completions stream without usage: no usage chunk.
    let events = stream(
        &s,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 3, "stream": true, "ignore_eos": true}),
    )
    .await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(!events.join("").contains("\"usage\""));
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_server_stays_up() {
    let mut cfg = ServeConfig::tiny();
    cfg.max_model_len = Some(64);
    let s = start(cfg).await.unwrap();
    let c = client();
    let raw = c
        .post(format!("{}/v1/chat/completions", s.url()))
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let e: Value = raw.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("JSON"));
    for k in ["message", "type", "param", "code"] {
        assert!(e["error"].get(k).is_some(), "error body lacks {k}: {e}");
    }
    assert_eq!(e["error"]["code"], 400);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
            "gpt-9",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "synthetic:tiny"}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x".repeat(100)}]}),
            "maximum context length",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1_000_000_000_000u64}),
            "maximum context length",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
            "temperature",
        ),
        ("/v1/completions", json!({"max_tokens": 3}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": [1, 99999]}),
            "vocabulary",
        ),
        ("/tokenize", json!({}), "prompt"),
        ("/detokenize", json!({"tokens": [-1]}), "vocabulary"),
    ];
    for (path, body, needle) in cases {
        let (st, e) = post(&s, path, body.clone()).await;
        assert_eq!(st, 400, "{path} {body}: {e}");
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{path} {body}: '{msg}' lacks '{needle}'"
        );
        assert_eq!(e["error"]["type"], "BadRequestError");
    }
    // Still serving.
    let (st, _) = post(&s, "/v1/chat/completions", chat("x", 2)).await;
    assert_eq!(st, 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_and_frees_blocks() {
    let mut cfg = ServeConfig::tiny();
    cfg.max_model_len = Some(4096);
    let s = start(cfg).await.unwrap();
    let mut body = chat("stream a lot", 4000);
    body["stream"] = json!(true);
    let r = client()
        .post(format!("{}/v1/chat/completions", s.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut bytes = r.bytes_stream();
    // Wait until tokens flow and the request holds KV blocks.
    let mut seen = 0;
    while seen < 3000 {
        seen += bytes.next().await.unwrap().unwrap().len();
    }
    let during = metrics(&s).await;
    assert_eq!(m(&during, "vllm:num_requests_running"), 1.0);
    assert!(m(&during, "vllm:kv_cache_usage_perc") > 0.0);
    drop(bytes);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = metrics(&s).await;
        if m(&now, "vllm:num_requests_running") == 0.0 && m(&now, "vllm:kv_cache_usage_perc") == 0.0
        {
            assert!(
                m(&now, "vllm:generation_tokens_total") < 4000.0,
                "the request was aborted early"
            );
            assert_eq!(now["vllm:request_success_total{finished_reason=\"abort\",model_name=\"synthetic:tiny\"}"], 1.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks not freed after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_requests_than_fit_are_queued_not_dropped() {
    let mut cfg = ServeConfig::tiny();
    // 10 blocks of 16 = 160 KV tokens for 8 requests of about 70 tokens each.
    cfg.kv_cache_memory = Some(10 * 16 * 256);
    cfg.max_model_len = Some(128);
    cfg.max_num_seqs = 3;
    let s = start(cfg).await.unwrap();
    let reqs = (0..8).map(|i| {
        let s = &s;
        async move {
            post(
                s,
                "/v1/chat/completions",
                chat(&format!("request number {i}"), 48),
            )
            .await
        }
    });
    let results = futures::future::join_all(reqs).await;
    for (st, r) in &results {
        assert_eq!(*st, 200, "{r}");
        assert_eq!(r["usage"]["completion_tokens"], 48);
    }
    let after = metrics(&s).await;
    assert_eq!(after["vllm:request_success_total{finished_reason=\"length\",model_name=\"synthetic:tiny\"}"], 8.0);
    assert_eq!(m(&after, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(m(&after, "vllm:kv_cache_usage_perc"), 0.0);
    assert!(after.contains_key("vllm:num_preemptions_total{model_name=\"synthetic:tiny\"}"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_requests_and_prefix_cache() {
    let s = start(ServeConfig::tiny()).await.unwrap();
    let t = client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(t.contains("# TYPE vllm:prefix_cache_queries_total counter"));
    assert!(t.contains("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"bfloat16\",device=\"cpu\",enable_prefix_caching=\"True\",kv_cache_size_tokens=\"262144\",model_name=\"synthetic:tiny\"} 1.0"), "{t}");
    assert!(
        !t.contains("spec_decode"),
        "no speculative series when it is off"
    );
    let m0 = metrics(&s).await;
    assert_eq!(m(&m0, "vllm:prompt_tokens_total"), 0.0);
    let long = "a long shared system prompt that spans several blocks. ".repeat(3);
    let (_, r1) = post(&s, "/v1/chat/completions", chat(&long, 4)).await;
    let p = r1["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(r1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let m1 = metrics(&s).await;
    assert_eq!(m(&m1, "vllm:prompt_tokens_total"), p);
    assert_eq!(m(&m1, "vllm:generation_tokens_total"), 4.0);
    assert_eq!(m(&m1, "vllm:prefix_cache_queries_total"), p);
    assert_eq!(m(&m1, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(m(&m1, "vllm:time_to_first_token_seconds_count"), 1.0);
    assert_eq!(m(&m1, "vllm:e2e_request_latency_seconds_count"), 1.0);
    assert_eq!(m(&m1, "vllm:inter_token_latency_seconds_count"), 3.0);
    assert_eq!(m(&m1, "vllm:request_generation_tokens_sum"), 4.0);
    // Warm: the same prompt hits every full block but the last token's.
    let (_, r2) = post(&s, "/v1/chat/completions", chat(&long, 4)).await;
    let hits = ((p as u64 - 1) / 16 * 16) as f64;
    assert_eq!(
        r2["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap(),
        hits
    );
    assert_eq!(
        r1["choices"], r2["choices"],
        "a prefix-cache hit gives identical greedy output"
    );
    let m2 = metrics(&s).await;
    assert_eq!(m(&m2, "vllm:prefix_cache_hits_total"), hits);
    assert_eq!(m(&m2, "vllm:prefix_cache_queries_total"), 2.0 * p);
    // Reset: cold again.
    let st = client()
        .post(format!("{}/reset_prefix_cache", s.url()))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, 200);
    let (_, r3) = post(&s, "/v1/chat/completions", chat(&long, 4)).await;
    assert_eq!(r3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(m(&metrics(&s).await, "vllm:prefix_cache_hits_total"), hits);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_decoding_keeps_greedy_output_and_counts() {
    let plain = start(ServeConfig::tiny()).await.unwrap();
    let mut cfg = ServeConfig::tiny();
    cfg.speculative = Some(SpecConfig {
        num_speculative_tokens: 3,
        prompt_lookup_min: 1,
        prompt_lookup_max: 4,
    });
    let spec = start(cfg).await.unwrap();
    for prompt in ["to be or not to be, to be or not to", "1 2 3 1 2 3 1 2"] {
        let (_, a) = post(&plain, "/v1/chat/completions", chat(prompt, 40)).await;
        let (_, b) = post(&spec, "/v1/chat/completions", chat(prompt, 40)).await;
        assert_eq!(a["choices"], b["choices"]);
        assert_eq!(b["usage"]["completion_tokens"], 40);
    }
    let ms = metrics(&spec).await;
    let drafts = m(&ms, "vllm:spec_decode_num_drafts_total");
    let drafted = m(&ms, "vllm:spec_decode_num_draft_tokens_total");
    let accepted = m(&ms, "vllm:spec_decode_num_accepted_tokens_total");
    assert!(drafts > 0.0 && drafted >= drafts && drafted <= 3.0 * drafts);
    assert!(accepted > 0.0 && accepted <= drafted);
    let per_pos: f64 = (0..3)
        .map(|i| ms[&format!("vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"synthetic:tiny\",position=\"{i}\"}}")])
        .sum();
    assert_eq!(per_pos, accepted);
    // Fewer engine steps than tokens: the ITL histogram counts steps.
    assert!(
        m(&ms, "vllm:inter_token_latency_seconds_count")
            < m(&ms, "vllm:generation_tokens_total") - 2.0
    );
    plain.shutdown().await;
    spec.shutdown().await;
}

/// Log-probabilities as vLLM answers them: chat `logprobs`/`top_logprobs`, completions
/// `logprobs` with `echo` (the prompt's tokens, the first without a value), vLLM's
/// `prompt_logprobs`; and the prompt's figures equal the CPU backend's own teacher-forced
/// log-softmax on the same weights (synthetic:tiny seed 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_echo_and_prompt_logprobs_as_vllm_answers_them() {
    let s = start(ServeConfig::tiny()).await.unwrap();
    // Chat.
    let mut body = chat("hello there", 4);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    // (ignore_eos masks special tokens, so the chosen token would not always be the top one.)
    body["ignore_eos"] = json!(false);
    let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(
        (1..=4).contains(&content.len()) && content.len() == n,
        "{v}"
    );
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert!(
            (lp - top[0]["logprob"].as_f64().unwrap()).abs() < 1e-6,
            "{e}"
        );
        assert!(lp <= 0.0 && e["bytes"].is_array());
    }
    body["top_logprobs"] = json!(21);
    let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("top_logprobs") && msg.contains("--max-logprobs"),
        "names the field and the flag that raises the cap: {msg}"
    );
    // Without logprobs: null, as before.
    let (_, v) = post(&s, "/v1/chat/completions", chat("hi", 2)).await;
    assert!(v["choices"][0]["logprobs"].is_null());

    // Completions with echo and logprobs.
    let prompt: Vec<u32> = vec![72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100];
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"model": "synthetic:tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0,
               "echo": true, "logprobs": 1, "prompt_logprobs": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert!(
        c["text"].as_str().unwrap().starts_with("Hello world"),
        "{c}"
    );
    let lp = &c["logprobs"];
    let tl = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(tl.len(), prompt.len() + 2);
    assert!(tl[0].is_null() && lp["top_logprobs"][0].is_null());
    assert_eq!(lp["tokens"][0], "H");
    assert_eq!(lp["text_offset"][1], 1);
    // vLLM's prompt_logprobs: null, then {id: {logprob, rank, decoded_token}}.
    let pl = c["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), prompt.len());
    assert!(pl[0].is_null());
    let e1 = &pl[1]["101"];
    assert_eq!(e1["decoded_token"], "e");
    assert!((e1["logprob"].as_f64().unwrap() - tl[1].as_f64().unwrap()).abs() < 1e-6);
    assert!(pl[1].as_object().unwrap().len() >= 2);
    // The same numbers as the CPU backend teacher-forced on the prompt.
    let w = rigbench::runtime::weights::synthesize(&rigbench::runtime::ModelConfig::tiny(), 0);
    let mut b = rigbench::runtime::backend::cpu::CpuBackend::new(w, 1);
    let mut want = Vec::new();
    rigbench::runtime_eval::quality::teacher_force(&mut b, &prompt, &mut |i, row| {
        want.push(rigbench::runtime::direct::log_softmax(row)[prompt[i + 1] as usize]);
        Ok(())
    })
    .unwrap();
    for (i, w) in want.iter().enumerate() {
        let got = tl[i + 1].as_f64().unwrap();
        assert!(
            (got - w).abs() < 1e-4,
            "prompt token {}: {got} vs {w}",
            i + 1
        );
    }
    // Streaming completions carry the logprobs of their tokens.
    let evs = stream(
        &s,
        "/v1/completions",
        json!({"model": "synthetic:tiny", "prompt": "abc", "max_tokens": 3, "temperature": 0,
               "logprobs": 0, "stream": true, "ignore_eos": true}),
    )
    .await;
    let n: usize = evs
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .map(|a| a.len())
        })
        .sum();
    assert_eq!(n, 3);
    s.shutdown().await;
}

/// `--max-logprobs` raises the cap of every log-probability field (vLLM's flag; 20 by default);
/// a request above it is refused by name; `usize::MAX` (vLLM's -1) caps at the vocabulary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_logprobs_raises_the_cap_of_every_logprob_field() {
    let prompt: Vec<u32> = vec![72, 101, 108, 108, 111];
    let vocab = rigbench::runtime::ModelConfig::tiny().vocab_size;
    for (cap, ask, ok) in [
        (300, 300, true),
        (300, 301, false),
        (usize::MAX, vocab, true),
        // Above the vocabulary, and a count that would not fit in memory: refused, not a crash.
        (usize::MAX, vocab + 5, false),
        (usize::MAX, usize::MAX, false),
    ] {
        let mut cfg = ServeConfig::tiny();
        cfg.limits.max_logprobs = cap;
        let s = start(cfg).await.unwrap();
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"model": "synthetic:tiny", "prompt": prompt, "max_tokens": 1,
                   "temperature": 0, "prompt_logprobs": ask}),
        )
        .await;
        if ok {
            assert_eq!(st, 200, "{v}");
            let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
            // The alternatives (at most the vocabulary), the prompt token among them or beside.
            let n = pl[1].as_object().unwrap().len();
            assert!(n >= ask.min(vocab) && n <= ask.min(vocab) + 1, "{n}");
        } else {
            assert_eq!(st, 400, "{v}");
            let msg = v["error"]["message"].as_str().unwrap();
            // The cap in force: the flag's, or the vocabulary for vLLM's -1.
            let cap_shown = format!("between 0 and {}", cap.min(vocab));
            assert!(
                msg.contains("prompt_logprobs") && msg.contains(&cap_shown),
                "{msg}"
            );
        }
        let (st, _) = post(
            &s,
            "/v1/chat/completions",
            json!({"model": "synthetic:tiny", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 1, "logprobs": true, "top_logprobs": ask.min(vocab + 1)}),
        )
        .await;
        assert_eq!(st, if ok { 200 } else { 400 });
        s.shutdown().await;
    }
}

/// Every field of vLLM's OpenAI requests is honoured or refused with a 400 naming it
/// (docs/runtime.md, "Request fields"): `min_tokens` is honoured, a sampling parameter the
/// server does not implement is refused unless it asks for nothing, an unknown field is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_parameters_are_honoured_or_refused_by_name() {
    let s = start(ServeConfig::tiny()).await.unwrap();
    let with = |extra: Value| {
        let mut b = chat("hello", 6);
        b["ignore_eos"] = json!(false);
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // Honoured, and neutral values of unimplemented parameters pass.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        with(
            json!({"min_tokens": 6, "frequency_penalty": 0, "repetition_penalty": 1.0,
                    "logit_bias": {}, "user": "u-1", "stop_token_ids": []}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"], 6,
        "min_tokens = max_tokens runs to 6: {v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let cases = [
        (
            "/v1/chat/completions",
            with(json!({"min_tokens": 7})),
            Some("min_tokens"),
        ),
        (
            "/v1/chat/completions",
            with(json!({"min_tokens": -1})),
            Some("min_tokens"),
        ),
        (
            "/v1/chat/completions",
            with(json!({"frequency_penalty": 0.5})),
            Some("frequency_penalty"),
        ),
        (
            "/v1/chat/completions",
            with(json!({"repetition_penalty": 1.2})),
            Some("repetition_penalty"),
        ),
        (
            "/v1/chat/completions",
            with(json!({"min_p": 0.1})),
            Some("min_p"),
        ),
        (
            "/v1/chat/completions",
            with(json!({"use_beam_search": true})),
            Some("use_beam_search"),
        ),
        ("/v1/chat/completions", with(json!({"max_tokenz": 3})), None),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 2, "guided_json": {"type": "object"}}),
            Some("guided_json"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 2, "messages": []}),
            None,
        ),
    ];
    for (path, body, param) in cases {
        let (st, e) = post(&s, path, body.clone()).await;
        assert_eq!(st, 400, "{path} {body}: {e}");
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        let named = body
            .as_object()
            .unwrap()
            .keys()
            .find(|k| msg.contains(&format!("'{k}'")) || msg.starts_with(k.as_str()));
        assert!(named.is_some(), "{path} {body}: '{msg}' names no field");
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], p, "{e}");
            assert!(msg.contains(p), "{msg}");
        }
    }
    s.shutdown().await;
}
