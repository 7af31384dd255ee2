//! The engine's tests: greedy output unchanged by speculative decoding, preemption, chunking,
//! the prefix cache and device sampling; stop strings and reasoning; load errors.

use super::*;
use crate::runtime::backend::{ForwardBatch, Logits};
use crate::runtime::config::ServeConfig;

fn engine(cfg: &ServeConfig) -> Loaded {
    load(cfg).unwrap()
}

fn req(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        params: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens,
        ignore_eos: true,
        stop: Vec::new(),
        reasoning: ReasoningMode::Off,
        arrival: Instant::now(),
    }
}

/// Run requests to completion; returns each one's generated text and token count.
fn run(e: &mut Engine, reqs: Vec<GenerateRequest>) -> Vec<(String, usize, FinishReason)> {
    let mut rxs = Vec::new();
    for (i, r) in reqs.into_iter().enumerate() {
        let (tx, rx) = tmpsc::unbounded_channel();
        e.add(i as u64 + 1, r, tx);
        rxs.push(rx);
    }
    let mut steps = 0;
    while e.has_work() {
        e.step().unwrap();
        steps += 1;
        assert!(steps < 100_000);
    }
    rxs.into_iter()
        .map(|mut rx| {
            let mut text = String::new();
            let mut n = 0;
            let mut fin = None;
            while let Ok(o) = rx.try_recv() {
                text.push_str(&o.reasoning);
                text.push_str(&o.content);
                n = o.completion_tokens;
                if o.finish.is_some() {
                    fin = o.finish;
                }
            }
            (text, n, fin.expect("finished"))
        })
        .collect()
}

fn prompt(l: &Loaded, text: &str) -> Vec<u32> {
    l.tokenizer.encode(text, false).unwrap()
}

/// A backend that "samples on the device" (the CUDA backend's engine path) by running the
/// CPU backend and taking the argmax: the mock device of the engine's device-sampling path.
struct DeviceSamplingMock(Box<dyn Backend>);

impl Backend for DeviceSamplingMock {
    fn name(&self) -> &str {
        "mock-device"
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn weight_format(&self) -> WeightFormat {
        self.0.weight_format()
    }
    fn weight_bytes(&self) -> u64 {
        self.0.weight_bytes()
    }
    fn init_kv_cache(&mut self, spec: KvCacheSpec) -> anyhow::Result<()> {
        self.0.init_kv_cache(spec)
    }
    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits> {
        self.0.forward(batch)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> anyhow::Result<Vec<u32>> {
        let l = self.0.forward(batch)?;
        anyhow::ensure!(
            rows.len() == l.rows(),
            "{} rows for {} logit rows",
            rows.len(),
            l.rows()
        );
        Ok((0..l.rows())
            .map(|i| {
                assert!(rows[i].temperature < 1e-5, "the test sends greedy requests");
                super::super::sampler::argmax(l.row(i))
            })
            .collect())
    }
}

#[test]
fn device_sampling_path_gives_the_host_sampling_output() {
    let cfg = ServeConfig::tiny();
    let mut host = engine(&cfg);
    let dev = engine(&cfg);
    let kv = dev.engine.config.kv;
    let econf = dev.engine.config.clone();
    let backend = dev.engine.into_backend();
    let mut mocked = Engine::new(
        Box::new(DeviceSamplingMock(backend)),
        dev.tokenizer.clone(),
        econf,
        dev.metrics.clone(),
    )
    .unwrap();
    let _ = kv;
    let prompts = ["the cat sat on the mat", "abcabc", "hi"];
    let mk = |l: &Loaded| {
        prompts
            .iter()
            .map(|p| req(prompt(l, p), 24))
            .collect::<Vec<_>>()
    };
    // Without ignore_eos both paths take the plain argmax (with it the host masks special
    // tokens and the device path replaces them: see the next test).
    let plain = |l: &Loaded| {
        mk(l)
            .into_iter()
            .map(|mut r| {
                r.ignore_eos = false;
                r
            })
            .collect::<Vec<_>>()
    };
    let (ra, rb) = (plain(&host), plain(&host));
    let a = run(&mut host.engine, ra);
    let b = run(&mut mocked, rb);
    assert_eq!(a, b);
    // With ignore_eos the device path never emits a special or invisible token either.
    let reqs: Vec<GenerateRequest> = (0..24)
        .map(|i| req(prompt(&host, &format!("p{i} {}", "q".repeat(i))), 16))
        .collect();
    for (i, (text, n, _)) in run(&mut mocked, reqs).into_iter().enumerate() {
        assert_eq!(n, 16);
        assert!(
            !text.trim().is_empty()
                && !text.contains('\u{fffd}')
                && !text.contains("<|")
                && !text.contains("think>"),
            "request {i}: {text:?}"
        );
    }
}

#[test]
fn ignore_eos_output_is_always_visible_text() {
    // Synthetic weights lock greedy decoding onto one token per prompt; when that token was
    // a special one, a whole fixed-length answer decoded to nothing and the e2e validity
    // guard called the run invalid ("empty output") at random.
    let mut l = engine(&ServeConfig::tiny());
    let suppressed = l.tokenizer.suppressed_under_ignore_eos();
    for id in [256, 257, 258, 259, 260, 0x80, 0xff, 0x00] {
        assert!(suppressed.contains(&id), "{id}");
    }
    assert!(!suppressed.contains(&u32::from(b'a')) && !suppressed.contains(&261));
    let mut reqs = Vec::new();
    for i in 0..48 {
        let mut r = req(
            prompt(&l, &format!("prompt {i}: {}", "xyz ".repeat(i % 7))),
            24,
        );
        if i % 2 == 1 {
            r.params = SamplingParams {
                temperature: 1.0,
                seed: Some(i as u64),
                ..Default::default()
            };
        }
        reqs.push(r);
    }
    for (i, (text, n, fin)) in run(&mut l.engine, reqs).into_iter().enumerate() {
        assert_eq!((n, fin), (24, FinishReason::Length), "request {i}");
        assert!(!text.trim().is_empty(), "request {i}: empty output");
        assert!(
            !text.contains('\u{fffd}') && !text.contains("<|") && !text.contains("think>"),
            "request {i}: {text:?}"
        );
        assert!(text.chars().count() >= 24, "request {i}: {text:?}");
    }
}

#[test]
fn speculative_greedy_equals_plain_greedy() {
    let plain_cfg = ServeConfig::tiny();
    let mut spec_cfg = ServeConfig::tiny();
    spec_cfg.speculative = Some(SpecConfig {
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
    });
    let mut plain = engine(&plain_cfg);
    let mut spec = engine(&spec_cfg);
    let prompts = [
        "the cat sat on the mat; the cat sat on the",
        "abcabcabcabc",
        "hi",
    ];
    let mk = |l: &Loaded| {
        prompts
            .iter()
            .map(|p| req(prompt(l, p), 48))
            .collect::<Vec<_>>()
    };
    let reqs = mk(&plain);
    let a = run(&mut plain.engine, reqs);
    let reqs = mk(&spec);
    let b = run(&mut spec.engine, reqs);
    assert_eq!(a, b);
    let s = spec.metrics.snapshot().spec.unwrap();
    assert!(s.num_drafts > 0 && s.num_draft_tokens >= s.num_drafts);
    assert!(
        s.num_accepted_tokens > 0,
        "a repetitive greedy model accepts some drafts: {s:?}"
    );
    assert!(s.accepted_per_pos.iter().sum::<u64>() == s.num_accepted_tokens);
    assert!(plain.metrics.snapshot().spec.is_none());
    for (_, n, f) in &a {
        assert_eq!((*n, f), (48, &FinishReason::Length));
    }
}

fn hybrid_cfg() -> ServeConfig {
    let mut c = ServeConfig::tiny();
    c.model = "synthetic:tiny-hybrid".into();
    c
}

/// On a Gated-DeltaNet hybrid, n-gram speculation verifies drafts token by token through
/// the recurrent state and rolls it back past rejected ones: the greedy output equals plain
/// greedy output exactly, with drafts accepted and rejected along the way; sequences share
/// state slots in turn (more requests than slots).
#[test]
fn hybrid_speculative_greedy_equals_plain_greedy() {
    let mut plain_cfg = hybrid_cfg();
    plain_cfg.max_num_seqs = 2;
    let mut spec_cfg = plain_cfg.clone();
    spec_cfg.speculative = Some(SpecConfig {
        num_speculative_tokens: 3,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
    });
    let mut plain = engine(&plain_cfg);
    let mut spec = engine(&spec_cfg);
    assert_eq!(plain.engine.scheduler.running().len(), 0);
    let prompts = [
        "the cat sat on the mat; the cat sat on the",
        "abcabcabcabc",
        "hi",
        "one two one two one",
    ];
    let mk = |l: &Loaded| {
        prompts
            .iter()
            .map(|p| req(prompt(l, p), 40))
            .collect::<Vec<_>>()
    };
    let reqs = mk(&plain);
    let a = run(&mut plain.engine, reqs);
    let reqs = mk(&spec);
    let b = run(&mut spec.engine, reqs);
    assert_eq!(a, b);
    let s = spec.metrics.snapshot().spec.unwrap();
    assert!(s.num_drafts > 0, "{s:?}");
    assert!(
        s.num_draft_tokens > s.num_accepted_tokens,
        "some drafts are rejected (and rolled back): {s:?}"
    );
    for (_, n, f) in &a {
        assert_eq!((*n, f), (40, &FinishReason::Length));
    }
}

/// Preemption by recomputation restarts a hybrid's state from position 0 (its slot freed
/// and retaken), and chunked prefill carries the state across chunks: every request still
/// finishes with its full length. The tokens match the roomy run's wherever no near-tie
/// intervenes: recomputed prefill runs the chunked form where the first run decoded token
/// by token, which rounds differently in f32.
#[test]
fn hybrid_preemption_and_chunking_finish_every_request() {
    let base = hybrid_cfg();
    let mut tight = hybrid_cfg();
    let mc = ModelConfig::preset("tiny-hybrid").unwrap();
    let state = mc.gdn_state_bytes(4);
    tight.kv_cache_memory = Some(
        12 * crate::runtime::kv_cache::kv_bytes_per_block(&mc, 16, tight.kv_cache_dtype)
            + 4 * state,
    );
    tight.max_model_len = Some(128);
    tight.max_num_batched_tokens = 7;
    tight.max_num_seqs = 4;
    let mut a = engine(&base);
    let mut b = engine(&tight);
    assert_eq!(b.info.kv_plan.state_slots, 4);
    let prompts = ["one two three", "four five six seven", "eight nine", "ten"];
    let mk = |l: &Loaded| {
        prompts
            .iter()
            .map(|p| req(prompt(l, p), 48))
            .collect::<Vec<_>>()
    };
    let reqs = mk(&a);
    let ra = run(&mut a.engine, reqs);
    let reqs = mk(&b);
    let rb = run(&mut b.engine, reqs);
    assert!(
        b.engine.scheduler().num_preemptions > 0,
        "the budget forces preemption"
    );
    for ((ta, na, fa), (tb, nb, fb)) in ra.iter().zip(&rb) {
        assert_eq!((na, fa), (&48, &FinishReason::Length));
        assert_eq!((nb, fb), (&48, &FinishReason::Length));
        let common = ta
            .chars()
            .zip(tb.chars())
            .take_while(|(x, y)| x == y)
            .count();
        assert!(common > 0, "{ta:?} vs {tb:?}");
    }
    // On this preset and seed no near-tie intervenes: the texts are equal (measured; a
    // change of the arithmetic may move a near-tie, and then this line, not the above).
    assert_eq!(ra, rb);
}

#[test]
fn preemption_and_chunking_do_not_change_greedy_output() {
    let base = ServeConfig::tiny();
    let mut tight = ServeConfig::tiny();
    // 12 blocks of 16 tokens for 4 requests of ~60 tokens each: preemption is certain.
    tight.kv_cache_memory = Some(
        12 * crate::runtime::kv_cache::kv_bytes_per_block(
            &ModelConfig::tiny(),
            16,
            tight.kv_cache_dtype,
        ),
    );
    tight.max_model_len = Some(128);
    tight.max_num_batched_tokens = 7;
    let mut a = engine(&base);
    let mut b = engine(&tight);
    let prompts = [
        "one two three",
        "four five six seven",
        "eight",
        "nine ten eleven twelve thirteen",
    ];
    let mk = |l: &Loaded| {
        prompts
            .iter()
            .map(|p| req(prompt(l, p), 40))
            .collect::<Vec<_>>()
    };
    let (qa, qb) = (mk(&a), mk(&b));
    let ra = run(&mut a.engine, qa);
    let rb = run(&mut b.engine, qb);
    assert_eq!(ra, rb);
    let m = b.metrics.snapshot();
    assert!(m.preemptions > 0, "expected preemptions");
    assert_eq!(m.kv_usage, 0.0);
    assert_eq!(m.finished[FinishedLabel::Length as usize], 4);
    assert_eq!(b.engine.scheduler().pool().num_free(), 12);
}

#[test]
fn prefix_cache_hits_give_identical_output() {
    let mut l = engine(&ServeConfig::tiny());
    let p = prompt(&l, &"a long shared system prompt. ".repeat(4));
    let first = run(&mut l.engine, vec![req(p.clone(), 16)]);
    let before = l.metrics.snapshot().prefix;
    let second = run(&mut l.engine, vec![req(p.clone(), 16)]);
    let after = l.metrics.snapshot().prefix;
    assert_eq!(first, second);
    assert_eq!(after.queries - before.queries, p.len() as u64);
    let full_blocks = ((p.len() - 1) / 16 * 16) as u64;
    assert_eq!(after.hits - before.hits, full_blocks);
    assert!(full_blocks > 0);
    l.engine.reset_prefix_cache();
    run(&mut l.engine, vec![req(p, 16)]);
    assert_eq!(
        l.metrics.snapshot().prefix.hits,
        after.hits,
        "no hits after reset"
    );
}

#[test]
fn eos_stop_strings_and_reasoning_split() {
    let mut l = engine(&ServeConfig::tiny());
    let p = prompt(
        &l,
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n",
    );
    let plain = run(&mut l.engine, vec![req(p.clone(), 30)]);
    let text = plain[0].0.clone();
    assert!(!text.is_empty());
    // A stop string taken from the middle of the greedy output cuts it there.
    let chars: Vec<char> = text.chars().collect();
    if chars.len() > 6 {
        let stop: String = chars[3..5].iter().collect();
        let mut r = req(p.clone(), 30);
        r.stop = vec![stop.clone()];
        let out = run(&mut l.engine, vec![r]);
        assert_eq!(out[0].2, FinishReason::Stop);
        let idx = text.find(&stop).unwrap();
        assert_eq!(out[0].0, text[..idx]);
    }
    // With the think block open, everything before </think> is reasoning.
    let (tx, mut rx) = tmpsc::unbounded_channel();
    let mut r = req(p.clone(), 30);
    r.reasoning = ReasoningMode::InThink;
    l.engine.add(99, r, tx);
    while l.engine.has_work() {
        l.engine.step().unwrap();
    }
    let (mut reasoning, mut content) = (String::new(), String::new());
    while let Ok(o) = rx.try_recv() {
        reasoning.push_str(&o.reasoning);
        content.push_str(&o.content);
    }
    assert_eq!(
        format!("{reasoning}{content}"),
        text.replacen("</think>", "", 1)
    );
    assert!(!reasoning.is_empty());
    // EOS ends a request unless ignore_eos.
    let mut r = req(p, 200);
    r.ignore_eos = false;
    let out = run(&mut l.engine, vec![r]);
    assert!(matches!(
        out[0].2,
        FinishReason::Stop | FinishReason::Length
    ));
}

#[test]
fn load_errors_name_flags_and_files() {
    let mut c = ServeConfig::tiny();
    c.kv_cache_memory = Some(1024);
    let e = load(&c).err().unwrap().to_string();
    assert!(e.contains("--kv-cache-memory"), "{e}");
    let mut c = ServeConfig::tiny();
    c.max_model_len = Some(1 << 20);
    let e = load(&c).err().unwrap().to_string();
    assert!(e.contains("--max-model-len"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let mut c = ServeConfig::tiny();
    c.model = dir.path().display().to_string();
    let e = load(&c).err().unwrap().to_string();
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn loads_a_checkpoint_directory_and_quantizes() {
    let w = crate::runtime::weights::synthesize(&ModelConfig::tiny(), 0);
    let dir = tempfile::tempdir().unwrap();
    crate::runtime::weights::tests::write_checkpoint(dir.path(), &w);
    let mut c = ServeConfig::tiny();
    c.model = dir.path().display().to_string();
    c.max_model_len = Some(512);
    let mut from_dir = engine(&c);
    let mut synth = engine(&ServeConfig::tiny());
    let p = prompt(&synth, "same weights, same output");
    assert_eq!(
        run(&mut from_dir.engine, vec![req(p.clone(), 12)]),
        run(&mut synth.engine, vec![req(p.clone(), 12)])
    );
    c.quantize = Some(WeightFormat::Fp8.into());
    let q = engine(&c);
    assert_eq!(q.info.weight_format, WeightFormat::Fp8);
    assert_eq!(q.tokenizer.source, "byte-level");
}

/// A backend whose every logit row makes EOS (`<|im_end|>`) by far the most likely token, and
/// that also "samples on the device" (its argmax): the mock of a model that wants to stop.
struct EosMock(Box<dyn Backend>);

impl EosMock {
    fn boost(mut l: Logits) -> Logits {
        let v = l.vocab;
        for row in l.data.chunks_mut(v) {
            row[crate::runtime::tokenizer::ByteTokenizer::IM_END as usize] += 1e3;
        }
        l
    }
}

impl Backend for EosMock {
    fn name(&self) -> &str {
        "mock-eos"
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn weight_format(&self) -> WeightFormat {
        self.0.weight_format()
    }
    fn weight_bytes(&self) -> u64 {
        self.0.weight_bytes()
    }
    fn init_kv_cache(&mut self, spec: KvCacheSpec) -> anyhow::Result<()> {
        self.0.init_kv_cache(spec)
    }
    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<Logits> {
        self.0.forward(batch).map(Self::boost)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        _rows: &[RowSampling],
    ) -> anyhow::Result<Vec<u32>> {
        let l = Self::boost(self.0.forward(batch)?);
        Ok((0..l.rows())
            .map(|i| super::super::sampler::argmax(l.row(i)))
            .collect())
    }
}

/// vLLM's `min_tokens`: EOS is never drawn before N tokens (on the engine's device-sampling
/// path too, which cannot mask: such a request is sampled on the host), then ends the request
/// at once; stop strings are not matched before N either.
#[test]
fn min_tokens_holds_back_eos_and_stop_strings() {
    let cfg = ServeConfig::tiny();
    let l = engine(&cfg);
    let econf = l.engine.config.clone();
    let mut e = Engine::new(
        Box::new(EosMock(l.engine.into_backend())),
        l.tokenizer.clone(),
        econf,
        l.metrics.clone(),
    )
    .unwrap();
    let p = l.tokenizer.encode("the cat sat", false).unwrap();
    let mk = |min: usize, temperature: f32| {
        let mut r = req(p.clone(), 20);
        r.ignore_eos = false;
        r.params.min_tokens = min;
        r.params.temperature = temperature;
        r.params.seed = Some(3);
        r
    };
    // Without min_tokens the model stops at once (EOS is the first token, counted).
    let out = run(&mut e, vec![mk(0, 0.0)]);
    assert_eq!((out[0].1, &out[0].2), (1, &FinishReason::Stop), "{out:?}");
    for temperature in [0.0, 0.8] {
        let out = run(&mut e, vec![mk(5, temperature), mk(0, temperature)]);
        // Five tokens that are not EOS, then the EOS the model wants.
        assert_eq!((out[0].1, &out[0].2), (6, &FinishReason::Stop), "{out:?}");
        assert_eq!(out[1].1, 1, "the request beside it is not held back");
    }
    // min_tokens = max_tokens: the request runs to its length.
    let mut r = mk(20, 0.0);
    r.max_tokens = 20;
    let out = run(&mut e, vec![r]);
    assert_eq!((out[0].1, &out[0].2), (20, &FinishReason::Length));

    // Stop strings: the first character of the greedy text stops a plain request before any
    // text; with min_tokens = 4 the first four tokens go out whatever they hold.
    let mut l = engine(&cfg);
    let p = prompt(&l, "abcabc");
    let text = run(&mut l.engine, vec![req(p.clone(), 12)])[0].0.clone();
    let stop: String = text.chars().take(1).collect();
    let mut r = req(p.clone(), 12);
    r.stop = vec![stop.clone()];
    let plain = run(&mut l.engine, vec![r.clone()]);
    assert_eq!(
        (plain[0].0.as_str(), &plain[0].2),
        ("", &FinishReason::Stop)
    );
    r.params.min_tokens = 4;
    let held = run(&mut l.engine, vec![r]);
    assert!(held[0].1 >= 4, "{held:?}");
    assert!(
        held[0].0.starts_with(&stop) && text.starts_with(&held[0].0),
        "{held:?} vs {text:?}"
    );
}
