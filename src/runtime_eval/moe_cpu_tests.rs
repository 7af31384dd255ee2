//! The CPU backend on mixture-of-experts models: transformers' own greedy tokens of the tiny
//! Qwen3.5-MoE and Qwen3-MoE fixtures (tests/fixtures/real/models/, saved by transformers 5.24),
//! the fused expert layout, the presets' published shapes, and the memory plan against
//! `inspect`. (Here, beside the checks it uses, not in the engine's folder.)

use std::path::Path;

use crate::runtime::backend::cpu::CpuBackend;
use crate::runtime::config::ModelConfig;
use crate::runtime::weights::{load_dir, ModelWeights};
use crate::runtime_eval::check::{check_reference_greedy, explain_mismatch, ReferenceGreedy};

/// The tiny Qwen3.5-MoE (3 Gated-DeltaNet + 1 attention layer, 8 experts top-2, shared expert).
const TINY_QWEN35_MOE: &str = "tests/fixtures/real/models/tiny-qwen35-moe-transformers5";
/// The tiny Qwen3-MoE (4 attention layers, 8 experts top-2, `norm_topk_prob` true).
const TINY_QWEN3_MOE: &str = "tests/fixtures/real/models/tiny-qwen3-moe-transformers5";

/// Logit gap under which a step of the f32 reference may flip (the fixtures' README: random
/// weights give near-ties, and a step whose `min_top2_gap` is under 0.005 may flip).
const FIXTURE_NEAR_TIE: f64 = 0.005;

fn fixture(dir: &str) -> (ModelWeights, ReferenceGreedy, Vec<f64>) {
    let dir = Path::new(dir);
    let hf = ModelConfig::read_hf_config(&dir.join("config.json")).unwrap();
    let path = dir.join("reference_greedy.json");
    let reference = ReferenceGreedy::load(&path).unwrap();
    // Each case's smallest gap between transformers' two best logits.
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let gaps = raw["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["min_top2_gap"].as_f64().unwrap())
        .collect();
    (load_dir(dir, &hf.config).unwrap(), reference, gaps)
}

/// Every case reproduces transformers' tokens, except a case whose `min_top2_gap` is under
/// [`FIXTURE_NEAR_TIE`], which may leave them only at a step where the two candidates' f32
/// logits are within that gap. Returns how many cases left at such a near-tie.
fn reproduces(w: &ModelWeights, reference: &ReferenceGreedy, gaps: &[f64]) -> usize {
    let mut b = CpuBackend::new(w.clone(), 2);
    let out = check_reference_greedy(&mut b, reference).unwrap();
    assert_eq!(out.len(), reference.cases.len());
    let mut near_ties = 0;
    for (o, gap) in out.iter().zip(gaps) {
        if o.matches() {
            continue;
        }
        assert!(
            *gap < FIXTURE_NEAR_TIE,
            "'{}' left transformers' tokens at {:?} although its smallest top-2 gap is {gap}: {:?} vs {:?}",
            o.prompt,
            o.first_mismatch,
            o.got,
            o.expected
        );
        let e = explain_mismatch(w, reference, o, FIXTURE_NEAR_TIE).unwrap();
        assert!(e.near_tie, "'{}': {e:?}", o.prompt);
        near_ties += 1;
    }
    near_ties
}

/// Whether a backend over `w` leaves transformers' tokens on some case.
fn leaves(w: ModelWeights, reference: &ReferenceGreedy) -> bool {
    let mut b = CpuBackend::new(w, 2);
    let out = check_reference_greedy(&mut b, reference).unwrap();
    out.iter().any(|o| !o.matches())
}

#[test]
fn cpu_backend_reproduces_transformers_greedy_on_the_qwen35_moe_fixture() {
    let (w, reference, gaps) = fixture(TINY_QWEN35_MOE);
    let c = &w.config;
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate_size),
        (8, 2, 48)
    );
    assert_eq!(m.shared_expert_intermediate_size, 64);
    assert!(m.norm_topk_prob, "Qwen3_5MoeTopKRouter always renormalises");
    assert_eq!(w.layers.iter().filter(|l| l.moe.is_some()).count(), 4);
    assert_eq!(w.layers.iter().filter(|l| l.gdn.is_some()).count(), 3);
    let near = reproduces(&w, &reference, &gaps);
    assert!(near <= 1, "{near} cases left at near-ties");
    // The check has teeth for each part of the block: no renormalisation, the shared expert's
    // sigmoid gate left out, and top-1 instead of top-2 each leave transformers' tokens.
    let mut raw = w.clone();
    raw.config.moe.as_mut().unwrap().norm_topk_prob = false;
    let mut ungated = w.clone();
    for l in &mut ungated.layers {
        let s = l.moe.as_mut().unwrap().shared.as_mut().unwrap();
        s.gate = crate::runtime::weights::Linear::bf16_from_f32(
            1,
            c.hidden_size,
            &vec![0.0; c.hidden_size],
        );
    }
    let mut top1 = w.clone();
    top1.config.moe.as_mut().unwrap().top_k = 1;
    for (name, bad) in [
        ("no renormalisation", raw),
        ("shared gate 0.5", ungated),
        ("top-1", top1),
    ] {
        assert!(leaves(bad, &reference), "{name} went unnoticed");
    }
}

#[test]
fn cpu_backend_reproduces_transformers_greedy_on_the_qwen3_moe_fixture() {
    let (w, reference, gaps) = fixture(TINY_QWEN3_MOE);
    let m = w.config.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate_size),
        (8, 2, 48)
    );
    assert!(m.norm_topk_prob && !m.has_shared_expert());
    assert_eq!(
        w.config.head_dim, 32,
        "Qwen3-MoE's head_dim is hidden / heads"
    );
    let near = reproduces(&w, &reference, &gaps);
    assert!(near <= 1, "{near} cases left at near-ties");
    let mut raw = w.clone();
    raw.config.moe.as_mut().unwrap().norm_topk_prob = false;
    assert!(leaves(raw, &reference), "no renormalisation went unnoticed");
}

#[test]
fn fused_expert_tensors_load_as_the_per_expert_ones() {
    // The Qwen3-MoE fixture rewritten with transformers' fused layout: gate_up_proj [E, 2I, H]
    // (gate rows, then up rows) and down_proj [E, H, I].
    let src = Path::new(TINY_QWEN3_MOE);
    let (w, _, _) = fixture(TINY_QWEN3_MOE);
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let m = w.config.moe.as_ref().unwrap();
    for (name, t) in st.tensors() {
        if !name.contains(".mlp.experts.") {
            out.push((name.clone(), t.shape().to_vec(), t.data().to_vec()));
        }
    }
    for i in 0..w.config.num_layers {
        let (mut gu, mut dn) = (Vec::new(), Vec::new());
        for e in 0..m.num_experts {
            let get = |p: &str| {
                st.tensor(&format!("model.layers.{i}.mlp.experts.{e}.{p}.weight"))
                    .unwrap()
                    .data()
                    .to_vec()
            };
            gu.extend(get("gate_proj"));
            gu.extend(get("up_proj"));
            dn.extend(get("down_proj"));
        }
        let (e, ie, h) = (
            m.num_experts,
            m.expert_intermediate_size,
            w.config.hidden_size,
        );
        out.push((
            format!("model.layers.{i}.mlp.experts.gate_up_proj"),
            vec![e, 2 * ie, h],
            gu,
        ));
        out.push((
            format!("model.layers.{i}.mlp.experts.down_proj"),
            vec![e, h, ie],
            dn,
        ));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    let fused = load_dir(dir.path(), &w.config).unwrap();
    for (a, b) in fused.layers.iter().zip(&w.layers) {
        assert_eq!(a.moe, b.moe);
    }
}

#[test]
fn moe_presets_have_the_published_shapes() {
    let c = ModelConfig::preset("qwen3.6-35b-a3b").unwrap();
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (c.hidden_size, c.num_layers, c.vocab_size),
        (2048, 40, 248_320)
    );
    assert_eq!((c.num_attention_layers(), c.num_gdn_layers()), (10, 30));
    assert_eq!(
        (c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim),
        (16, 2, 256, 64)
    );
    let hy = c.hybrid.as_ref().unwrap();
    assert_eq!(
        (hy.num_key_heads, hy.num_value_heads, hy.key_head_dim),
        (16, 32, 128)
    );
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate_size),
        (256, 8, 512)
    );
    assert_eq!(m.shared_expert_intermediate_size, 512);
    // "35B-A3B": about 35e9 parameters in all, about 3e9 active per token (the model card's
    // figures include the vision tower and MTP layer, about 0.5e9 together).
    let p = c.num_params() as f64 / 1e9;
    assert!((34.0..35.5).contains(&p), "{p}");
    let q = ModelConfig::preset("qwen3-30b-a3b").unwrap();
    let m = q.moe.as_ref().unwrap();
    assert_eq!(
        (q.hidden_size, q.num_layers, q.vocab_size),
        (2048, 48, 151_936)
    );
    assert_eq!((q.num_heads, q.num_kv_heads, q.head_dim), (32, 4, 128));
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate_size),
        (128, 8, 768)
    );
    assert!(!m.has_shared_expert() && m.norm_topk_prob);
    // Qwen3-30B-A3B is published as 30.5B parameters, 3.3B activated.
    let p = q.num_params() as f64 / 1e9;
    assert!((30.3..30.7).contains(&p), "{p}");
    let active: u64 = q.num_params() - (0..q.num_layers).map(|i| q.mlp_params(i)).sum::<u64>()
        + q.num_layers as u64 * m.active_block_params(q.hidden_size);
    assert!((3.2..3.4).contains(&(active as f64 / 1e9)), "{active}");
}

#[test]
fn the_nvfp4_35b_config_reads_as_the_preset() {
    let text = std::fs::read_to_string(
        "tests/fixtures/real/configs/nvidia--Qwen3.6-35B-A3B-NVFP4__config.json",
    )
    .unwrap();
    let h = ModelConfig::parse_hf_config(&text).unwrap();
    let mut want = ModelConfig::preset("qwen3.6-35b-a3b").unwrap();
    // The export states one EOS id (<|endoftext|>); the preset carries <|im_end|> too.
    want.eos_token_ids = h.config.eos_token_ids.clone();
    assert_eq!(h.config, want);
}

#[test]
fn a_synthetic_moe_loads_on_the_cpu_and_the_cuda_path_no_longer_refuses_it() {
    let mut sc = crate::runtime::ServeConfig::tiny();
    sc.model = "synthetic:tiny-moe".into();
    let loaded = crate::runtime::engine::load(&sc).unwrap();
    assert!(loaded.info.model_config.is_moe());
    sc.device = crate::runtime::backend::Device::Cuda(0);
    // Without a GPU the load fails for that reason, never for the model being a MoE.
    if let Err(e) = crate::runtime::engine::load(&sc) {
        let e = format!("{e:#}");
        assert!(
            !e.contains("mixture-of-experts") && !e.contains("CPU backend only"),
            "{e}"
        );
    }
}

/// The runtime's weights of a MoE model against `inspect`'s prediction: the bound.
const MOE_WEIGHTS_VS_INSPECT: f64 = 0.03;

#[test]
fn the_runtime_allocates_what_its_formula_says_and_inspect_agrees_at_the_35b_shape() {
    use crate::runtime::config::{QuantRecipe, WeightFormat};
    use crate::runtime::memory::recipe_weight_bytes;
    // On the CPU: what the backend holds is the formula, for a uniform and the mixed recipe.
    let c = ModelConfig::preset("tiny-moe").unwrap();
    for recipe in [
        QuantRecipe::Uniform(WeightFormat::Bf16),
        QuantRecipe::Uniform(WeightFormat::Fp8),
        QuantRecipe::Nvfp4Mixed,
    ] {
        let mut w = crate::runtime::weights::synthesize(&c, 3);
        w.quantize_recipe(recipe).unwrap();
        let l = &w.layers[0].moe.as_ref().unwrap();
        assert_eq!(l.router.format(), WeightFormat::Bf16, "{recipe:?}");
        let b = CpuBackend::new(w, 1);
        use crate::runtime::backend::Backend;
        // The backend's count leaves the per-layer norms out (4 bytes × (2·H + 2·head_dim)
        // per attention layer, 2·H + the Gated-DeltaNet parameters per GDN layer, well under
        // 1% here); the formula counts them.
        let (held, formula) = (
            b.weight_bytes() as f64,
            recipe_weight_bytes(&c, recipe) as f64,
        );
        let rel = held / formula - 1.0;
        assert!(
            rel <= 0.0 && rel > -0.01,
            "{recipe:?}: held {held} vs {formula} ({rel:+.5})"
        );
    }
    // At the 35B shape: NVIDIA's NVFP4 export's config.json and hf_quant_config.json (its
    // language model: the vision tower and the MTP layer, which the runtime does not load,
    // taken out), inspected without weights, against the preset under the same recipe.
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new("tests/fixtures/real/configs");
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(src.join("nvidia--Qwen3.6-35B-A3B-NVFP4__config.json")).unwrap(),
    )
    .unwrap();
    cfg.as_object_mut().unwrap().remove("vision_config");
    cfg["text_config"]["mtp_num_hidden_layers"] = serde_json::json!(0);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("nvidia--Qwen3.6-35B-A3B-NVFP4__hf_quant_config.json"),
        dir.path().join("hf_quant_config.json"),
    )
    .unwrap();
    let r = crate::checkpoint::inspect(dir.path(), &Default::default()).unwrap();
    let predicted = r.capacity.weight_bytes.unwrap() as f64;
    let runtime = recipe_weight_bytes(
        &ModelConfig::preset("qwen3.6-35b-a3b").unwrap(),
        QuantRecipe::Nvfp4Mixed,
    ) as f64;
    let rel = runtime / predicted - 1.0;
    assert!(
        rel.abs() < MOE_WEIGHTS_VS_INSPECT,
        "runtime {runtime} vs inspect {predicted} ({rel:+.4})"
    );
    // The runtime would run it (the MoE modules in formats it loads).
    assert!(
        !r.findings
            .iter()
            .any(|f| f.rule == crate::checkpoint::runtime::RUNTIME_UNSUPPORTED),
        "{:?}",
        r.findings
    );
}

#[test]
fn the_moe_kernel_suite_loads_and_matches_the_preset() {
    let s = crate::kernels::suite::load("suites/kernels/qwen3.6-35b-a3b.toml").unwrap();
    let c = ModelConfig::preset("qwen3.6-35b-a3b").unwrap();
    let m = c.moe.as_ref().unwrap();
    let shape = |name: &str| s.shapes.iter().find(|x| x.name == name).unwrap();
    let e = shape("expert_gate_up");
    assert_eq!((e.n, e.k), (2 * m.expert_intermediate_size, c.hidden_size));
    assert_eq!(e.per_step, Some((c.num_layers * m.top_k) as u32));
    assert_eq!(shape("qkv").n, c.q_proj_rows() + 2 * c.kv_dim());
    assert_eq!(shape("lm_head").n, c.vocab_size);
}
