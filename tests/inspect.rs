//! `rigbench inspect` end to end: small generated checkpoints (real safetensors files with
//! tiny tensors) under `tests/fixtures/checkpoints/`, lint rules, exit codes, bad input.
//!
//! The committed checkpoints are written by [`regenerate_checkpoint_fixtures`]; after changing
//! the generator, rewrite them with
//! `cargo test --test inspect -- --ignored regenerate_checkpoint_fixtures`.
//! [`committed_fixtures_match_the_generator`] fails when they are stale.
//!
//! | folder | what it is | expected |
//! |---|---|---|
//! | `qwen36-mixed-clean` | NVIDIA's Qwen3.6 MIXED_PRECISION recipe on a tiny hybrid MoE: experts and shared expert W4A16 NVFP4; attention q/k/v/o and GDN in_proj_qkv/z/out_proj FP8; in_proj_a/b, conv1d, lm_head, MTP and vision BF16; FP8 KV with k/v scales | exit 0, no warning |
//! | `qwen36-bad-ab-mtp` | the same with in_proj_a/b and the MTP experts in W4A16 NVFP4, MTP not excluded | exit 4: `gdn-ab-quantized`, `mtp-4bit` |
//! | `llama-fp8-kv-no-scales` | ModelOpt FP8 dense model declaring an FP8 KV cache without k_scale/v_scale | exit 0, `kv-fp8-no-scales` warning |
//! | `llama-ct-nvfp4` | compressed-tensors `nvfp4-pack-quantized` W4A4, two shards + index | exit 0; fallback on sm_90, native on sm_120 |
//! | `llama-bf16` | plain BF16, tied embeddings | exit 0, no finding |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rigbench::checkpoint::{inspect, InspectOptions, ModuleFormat, Severity};
use rigbench::formats::{fp8, nvfp4};
use safetensors::Dtype;
use serde_json::{json, Value};

// ---------------------------------------------------------------- generator

/// Deterministic values in [-1, 1) (a 64-bit LCG; no RNG crate state to pin).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn seed_of(name: &str) -> u64 {
    name.bytes().fold(1469598103934665603u64, |h, b| {
        (h ^ b as u64).wrapping_mul(1099511628211)
    })
}

/// How to store a Linear module.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Store {
    Bf16,
    /// ModelOpt FP8: weight F8_E4M3, weight_scale F32 scalar, input_scale F32 scalar.
    Fp8,
    /// ModelOpt NVFP4 W4A16: weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2.
    W4a16,
    /// compressed-tensors NVFP4 W4A4: weight_packed, weight_scale, weight_global_scale,
    /// input_global_scale.
    CtW4a4,
}

/// Tensors of a checkpoint, by name.
#[derive(Default, Clone)]
struct Ckpt {
    t: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
}

impl Ckpt {
    fn raw(&mut self, name: &str, dtype: Dtype, shape: &[usize], data: Vec<u8>) {
        self.t
            .insert(name.to_string(), (dtype, shape.to_vec(), data));
    }

    fn bf16(&mut self, name: &str, shape: &[usize]) {
        let n: usize = shape.iter().product();
        let v = values(seed_of(name), n);
        let bytes = rigbench::formats::to_bf16_bits(&v)
            .into_iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        self.raw(name, Dtype::BF16, shape, bytes);
    }

    fn f32s(&mut self, name: &str, shape: &[usize], v: &[f32]) {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.raw(name, Dtype::F32, shape, bytes);
    }

    /// A Linear module `[n, k]` stored as `s`.
    fn linear(&mut self, module: &str, n: usize, k: usize, s: Store) {
        let w = values(seed_of(module), n * k);
        match s {
            Store::Bf16 => self.bf16(&format!("{module}.weight"), &[n, k]),
            Store::Fp8 => {
                let q = fp8::quantize(&w, n, k, fp8::Fp8Granularity::PerTensor).unwrap();
                self.raw(&format!("{module}.weight"), Dtype::F8_E4M3, &[n, k], q.data);
                self.f32s(&format!("{module}.weight_scale"), &[], &q.scales);
                self.f32s(&format!("{module}.input_scale"), &[], &[1.0 / 448.0]);
            }
            Store::W4a16 => {
                let q = nvfp4::quantize(&w, n, k).unwrap();
                self.raw(
                    &format!("{module}.weight"),
                    Dtype::U8,
                    &[n, k / 2],
                    q.packed,
                );
                self.raw(
                    &format!("{module}.weight_scale"),
                    Dtype::F8_E4M3,
                    &[n, k / 16],
                    q.block_scales,
                );
                self.f32s(&format!("{module}.weight_scale_2"), &[], &[q.global_scale]);
            }
            Store::CtW4a4 => {
                let q = nvfp4::quantize(&w, n, k).unwrap();
                self.raw(
                    &format!("{module}.weight_packed"),
                    Dtype::U8,
                    &[n, k / 2],
                    q.packed,
                );
                self.raw(
                    &format!("{module}.weight_scale"),
                    Dtype::F8_E4M3,
                    &[n, k / 16],
                    q.block_scales,
                );
                self.f32s(
                    &format!("{module}.weight_global_scale"),
                    &[1],
                    &[1.0 / q.global_scale],
                );
                self.f32s(
                    &format!("{module}.input_global_scale"),
                    &[1],
                    &[448.0 * 6.0],
                );
            }
        }
    }

    /// Write `model.safetensors`, or `shards` files plus `model.safetensors.index.json`.
    fn write(&self, dir: &Path, shards: usize) {
        let names: Vec<&String> = self.t.keys().collect();
        let per = names.len().div_ceil(shards.max(1));
        let mut weight_map = serde_json::Map::new();
        for (i, chunk) in names.chunks(per).enumerate() {
            let file = if shards <= 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, shards)
            };
            let views: Vec<(String, safetensors::tensor::TensorView)> = chunk
                .iter()
                .map(|n| {
                    let (d, s, b) = &self.t[*n];
                    (
                        n.to_string(),
                        safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                    )
                })
                .collect();
            let bytes = safetensors::tensor::serialize(views, None).unwrap();
            std::fs::write(dir.join(&file), bytes).unwrap();
            for n in chunk {
                weight_map.insert(n.to_string(), Value::String(file.clone()));
            }
        }
        if shards > 1 {
            write_json(
                &dir.join("model.safetensors.index.json"),
                &json!({"metadata": {}, "weight_map": weight_map}),
            );
        }
    }
}

fn write_json(path: &Path, v: &Value) {
    let mut s = serde_json::to_string_pretty(v).unwrap();
    s.push('\n');
    std::fs::write(path, s).unwrap();
}

/// A checkpoint to write: config.json, optional hf_quant_config.json, tensors, shard count.
#[derive(Clone)]
struct Spec {
    config: Value,
    hf_quant: Option<Value>,
    tensors: Ckpt,
    shards: usize,
}

impl Spec {
    fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        write_json(&dir.join("config.json"), &self.config);
        if let Some(h) = &self.hf_quant {
            write_json(&dir.join("hf_quant_config.json"), h);
        }
        self.tensors.write(dir, self.shards);
    }
}

// Tiny hybrid (Qwen3.5/3.6 layout): hidden 16, layer 0 Gated-DeltaNet, layer 1 full
// attention, 2 routed experts + shared expert, vocab 32, one MTP layer, one vision block.
const H: usize = 16;
const P: &str = "model.language_model.";

fn hybrid_config() -> Value {
    json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "dtype": "bfloat16",
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "dtype": "bfloat16",
            "hidden_size": H,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "full_attention_interval": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "attn_output_gate": true,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 8,
            "linear_num_value_heads": 2,
            "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 4,
            "mamba_ssm_dtype": "float32",
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
            "vocab_size": 32,
            "max_position_embeddings": 4096,
            "mtp_num_hidden_layers": 1,
            "tie_word_embeddings": false
        },
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 16, "intermediate_size": 32}
    })
}

/// Tensors of the tiny hybrid; `store(module)` picks each Linear module's format.
fn hybrid_tensors(store: &dyn Fn(&str) -> Store, kv_scales: bool) -> Ckpt {
    let mut c = Ckpt::default();
    c.bf16(&format!("{P}embed_tokens.weight"), &[32, H]);
    c.bf16(&format!("{P}norm.weight"), &[H]);
    let attn = |c: &mut Ckpt, p: &str| {
        for (m, n, k) in [
            ("q_proj", 32, H),
            ("k_proj", 8, H),
            ("v_proj", 8, H),
            ("o_proj", H, 16),
        ] {
            let name = format!("{p}.self_attn.{m}");
            c.linear(&name, n, k, store(&name));
        }
        c.bf16(&format!("{p}.self_attn.q_norm.weight"), &[8]);
        c.bf16(&format!("{p}.self_attn.k_norm.weight"), &[8]);
    };
    let moe = |c: &mut Ckpt, p: &str| {
        c.bf16(&format!("{p}.mlp.gate.weight"), &[2, H]);
        for e in 0..2 {
            for (m, n, k) in [
                ("gate_proj", 16, H),
                ("up_proj", 16, H),
                ("down_proj", H, 16),
            ] {
                let name = format!("{p}.mlp.experts.{e}.{m}");
                c.linear(&name, n, k, store(&name));
            }
        }
        for (m, n, k) in [
            ("gate_proj", 16, H),
            ("up_proj", 16, H),
            ("down_proj", H, 16),
        ] {
            let name = format!("{p}.mlp.shared_expert.{m}");
            c.linear(&name, n, k, store(&name));
        }
        c.bf16(&format!("{p}.mlp.shared_expert_gate.weight"), &[1, H]);
        c.bf16(&format!("{p}.input_layernorm.weight"), &[H]);
        c.bf16(&format!("{p}.post_attention_layernorm.weight"), &[H]);
    };
    // Layer 0: Gated-DeltaNet (key_dim 16, value_dim 16, conv_dim 48).
    let p0 = format!("{P}layers.0");
    for (m, n, k) in [
        ("in_proj_qkv", 48, H),
        ("in_proj_z", 16, H),
        ("in_proj_b", 2, H),
        ("in_proj_a", 2, H),
        ("out_proj", H, 16),
    ] {
        let name = format!("{p0}.linear_attn.{m}");
        c.linear(&name, n, k, store(&name));
    }
    c.bf16(&format!("{p0}.linear_attn.conv1d.weight"), &[48, 1, 4]);
    c.f32s(&format!("{p0}.linear_attn.A_log"), &[2], &[0.5, -0.5]);
    c.bf16(&format!("{p0}.linear_attn.dt_bias"), &[2]);
    c.bf16(&format!("{p0}.linear_attn.norm.weight"), &[8]);
    moe(&mut c, &p0);
    // Layer 1: full attention.
    let p1 = format!("{P}layers.1");
    attn(&mut c, &p1);
    if kv_scales {
        c.f32s(&format!("{p1}.self_attn.k_proj.k_scale"), &[], &[0.02]);
        c.f32s(&format!("{p1}.self_attn.v_proj.v_scale"), &[], &[0.01]);
    }
    moe(&mut c, &p1);
    c.linear("lm_head", 32, H, store("lm_head"));
    // MTP: fc [H, 2H] + one decoder layer.
    c.linear("mtp.fc", H, 2 * H, store("mtp.fc"));
    attn(&mut c, "mtp.layers.0");
    moe(&mut c, "mtp.layers.0");
    c.bf16("mtp.norm.weight", &[H]);
    // Vision: one block.
    let v = "model.visual.blocks.0";
    for (m, n, k) in [
        ("attn.qkv", 48, 16),
        ("attn.proj", 16, 16),
        ("mlp.linear_fc1", 32, 16),
        ("mlp.linear_fc2", 16, 32),
    ] {
        let name = format!("{v}.{m}");
        c.linear(&name, n, k, store(&name));
    }
    c
}

/// NVIDIA's Qwen3.6 recipe as a store rule (plus `extra` 4-bit modules for the bad variant).
fn recipe(name: &str, bad: bool) -> Store {
    let l = |s: &str| name.contains(s);
    if bad
        && (l("in_proj_a")
            || l("in_proj_b")
            || (name.starts_with("mtp.") && l(".mlp.") && !l("mlp.gate")))
    {
        return Store::W4a16;
    }
    if name.starts_with("mtp.") || name.starts_with("model.visual") || name == "lm_head" {
        return Store::Bf16;
    }
    if l("in_proj_qkv") || l("in_proj_z") || l("linear_attn.out_proj") || l("self_attn.") {
        Store::Fp8
    } else if l(".mlp.experts.") || l(".mlp.shared_expert.") {
        Store::W4a16
    } else {
        Store::Bf16
    }
}

fn hybrid_hf_quant(bad: bool) -> Value {
    let mut layers = serde_json::Map::new();
    let w4 = json!({"quant_algo": "W4A16_NVFP4", "group_size": 16});
    let f8 = json!({"quant_algo": "FP8"});
    for m in ["in_proj_qkv", "in_proj_z", "out_proj"] {
        layers.insert(format!("{P}layers.0.linear_attn.{m}"), f8.clone());
    }
    if bad {
        for m in ["in_proj_a", "in_proj_b"] {
            layers.insert(format!("{P}layers.0.linear_attn.{m}"), w4.clone());
        }
        layers.insert("mtp.layers.0.mlp.experts".into(), w4.clone());
        for m in ["gate_proj", "up_proj", "down_proj"] {
            layers.insert(format!("mtp.layers.0.mlp.shared_expert.{m}"), w4.clone());
        }
    }
    for m in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        layers.insert(format!("{P}layers.1.self_attn.{m}"), f8.clone());
    }
    for l in 0..2 {
        layers.insert(format!("{P}layers.{l}.mlp.experts"), w4.clone());
        for m in ["gate_proj", "up_proj", "down_proj"] {
            layers.insert(format!("{P}layers.{l}.mlp.shared_expert.{m}"), w4.clone());
        }
    }
    let exclude: Vec<&str> = if bad {
        vec!["lm_head", "model.visual*"]
    } else {
        vec!["lm_head", "model.visual*", "mtp*"]
    };
    json!({
        "producer": {"name": "modelopt", "version": "0.44.0"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": "FP8",
            "quantized_layers": layers,
            "exclude_modules": exclude
        }
    })
}

fn llama_config(quant: Option<Value>, tied: bool) -> Value {
    let mut v = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 32,
        "vocab_size": 32,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": tied
    });
    if let Some(q) = quant {
        v["quantization_config"] = q;
    }
    v
}

fn llama_tensors(store: Store, lm_head: bool) -> Ckpt {
    let mut c = Ckpt::default();
    c.bf16("model.embed_tokens.weight", &[32, H]);
    c.bf16("model.norm.weight", &[H]);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (m, n, k) in [
            ("self_attn.q_proj", 16, H),
            ("self_attn.k_proj", 8, H),
            ("self_attn.v_proj", 8, H),
            ("self_attn.o_proj", H, 16),
            ("mlp.gate_proj", 32, H),
            ("mlp.up_proj", 32, H),
            ("mlp.down_proj", H, 32),
        ] {
            c.linear(&format!("{p}.{m}"), n, k, store);
        }
        c.bf16(&format!("{p}.input_layernorm.weight"), &[H]);
        c.bf16(&format!("{p}.post_attention_layernorm.weight"), &[H]);
    }
    if lm_head {
        c.linear("lm_head", 32, H, Store::Bf16);
    }
    c
}

/// The committed checkpoints, by folder name.
fn fixture_specs() -> Vec<(&'static str, Spec)> {
    let ct = json!({
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "version": "0.12.2",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "nvfp4-pack-quantized",
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": true, "dynamic": false, "scale_dtype": "torch.float8_e4m3fn"},
                "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": true, "dynamic": "local"}
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": null
    });
    vec![
        (
            "qwen36-mixed-clean",
            Spec {
                config: hybrid_config(),
                hf_quant: Some(hybrid_hf_quant(false)),
                tensors: hybrid_tensors(&|n| recipe(n, false), true),
                shards: 1,
            },
        ),
        (
            "qwen36-bad-ab-mtp",
            Spec {
                config: hybrid_config(),
                hf_quant: Some(hybrid_hf_quant(true)),
                tensors: hybrid_tensors(&|n| recipe(n, true), true),
                shards: 1,
            },
        ),
        (
            "llama-fp8-kv-no-scales",
            Spec {
                config: llama_config(None, false),
                hf_quant: Some(json!({
                    "producer": {"name": "modelopt", "version": "0.23.0"},
                    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
                })),
                tensors: llama_tensors(Store::Fp8, true),
                shards: 1,
            },
        ),
        (
            "llama-ct-nvfp4",
            Spec {
                config: llama_config(Some(ct), false),
                hf_quant: None,
                tensors: llama_tensors(Store::CtW4a4, true),
                shards: 2,
            },
        ),
        (
            "llama-bf16",
            Spec {
                config: llama_config(None, true),
                hf_quant: None,
                tensors: llama_tensors(Store::Bf16, false),
                shards: 1,
            },
        ),
    ]
}

fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints")
}

/// Rewrites `tests/fixtures/checkpoints/` (run with `--ignored` after changing the generator).
#[test]
#[ignore = "rewrites the committed fixtures; run explicitly"]
fn regenerate_checkpoint_fixtures() {
    let root = fixture_root();
    for (name, spec) in fixture_specs() {
        let dir = root.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        spec.write(&dir);
    }
}

#[test]
fn committed_fixtures_match_the_generator() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, spec) in fixture_specs() {
        let want = tmp.path().join(name);
        spec.write(&want);
        let have = fixture_root().join(name);
        let mut files: Vec<String> = std::fs::read_dir(&want)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        for f in files {
            let a = std::fs::read(want.join(&f)).unwrap();
            let b = std::fs::read(have.join(&f)).unwrap_or_default();
            assert!(
                a == b,
                "{name}/{f} differs from the generator; run `cargo test --test inspect -- --ignored regenerate_checkpoint_fixtures`"
            );
        }
    }
}

// ---------------------------------------------------------------- library-level checks

fn sm(cc: &str) -> InspectOptions {
    InspectOptions {
        cc: Some(cc.parse().unwrap()),
        card: Some("--cc".into()),
        ..Default::default()
    }
}

fn rules_of(r: &rigbench::checkpoint::InspectReport, sev: Severity) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.severity == sev)
        .map(|f| f.rule.clone())
        .collect()
}

#[test]
fn clean_recipe_has_no_warning() {
    let r = inspect(&fixture_root().join("qwen36-mixed-clean"), &sm("sm_90")).unwrap();
    assert!(
        rules_of(&r, Severity::Error).is_empty(),
        "{:#?}",
        r.findings
    );
    assert!(
        rules_of(&r, Severity::Warning).is_empty(),
        "{:#?}",
        r.findings
    );
    assert!(r.tensors.headers_read);
    let f = |suffix: &str| {
        r.modules
            .iter()
            .find(|m| m.module.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix}"))
            .clone()
    };
    assert_eq!(f("linear_attn.in_proj_a").format, ModuleFormat::Bf16);
    assert_eq!(f("linear_attn.conv1d").format, ModuleFormat::Bf16);
    let qkv = f("linear_attn.in_proj_qkv");
    assert_eq!(
        qkv.format.to_string(),
        "FP8 W8A8 (per-tensor, static activation scale)"
    );
    assert!(
        qkv.evidence.contains("weight F8_E4M3 [48, 16]"),
        "{}",
        qkv.evidence
    );
    assert!(qkv.evidence.contains("input_scale present"));
    let ex = f("language_model.layers.*.mlp.experts.*.up_proj");
    assert_eq!(ex.format.to_string(), "W4A16 NVFP4 (group 16)");
    assert_eq!(ex.count, 4);
    assert!(
        ex.evidence
            .contains("weight U8 [16, 8] + weight_scale F8_E4M3 [16, 1] + weight_scale_2 F32 []"),
        "{}",
        ex.evidence
    );
    assert!(ex.evidence.contains("no input_scale"));
    assert_eq!(
        f("mtp.layers.*.mlp.experts.*.up_proj").format,
        ModuleFormat::Bf16
    );
    assert_eq!(
        f("model.visual.blocks.*.attn.qkv").format,
        ModuleFormat::Bf16
    );
    // Capacity from the headers: exact weight bytes, KV per token, GDN state.
    let c = &r.capacity;
    assert_eq!(c.weight_bytes, Some(r.tensors.total_bytes));
    assert!(c.weight_source.starts_with("exact"));
    assert_eq!(c.kv_dtype.as_deref(), Some("FP8"));
    assert_eq!(c.kv_bytes_per_token, Some(2 * 8));
    assert_eq!(c.state_bytes_per_sequence, Some(48 * 3 * 2 + 2 * 8 * 8 * 4));
}

#[test]
fn bad_recipe_fires_gdn_and_mtp_errors() {
    let r = inspect(&fixture_root().join("qwen36-bad-ab-mtp"), &sm("sm_90")).unwrap();
    assert!(r.has_errors());
    let errs = rules_of(&r, Severity::Error);
    assert!(errs.contains(&"gdn-ab-quantized".to_string()), "{errs:?}");
    assert!(errs.contains(&"mtp-4bit".to_string()), "{errs:?}");
    let gdn = &r.findings_of("gdn-ab-quantized")[0];
    assert_eq!(gdn.module_count, 2);
    assert!(
        gdn.modules
            .iter()
            .any(|m| m.contains("linear_attn.in_proj_a")),
        "{:?}",
        gdn.modules
    );
    let mtp = &r.findings_of("mtp-4bit")[0];
    assert_eq!(mtp.module_count, 9, "{:?}", mtp.modules);
    // The metadata and tensors agree in this one: the errors are the recipe's.
    assert!(
        r.findings_of("metadata-tensor-mismatch").is_empty(),
        "{:#?}",
        r.findings
    );
}

#[test]
fn fp8_kv_without_scales_warns() {
    let r = inspect(&fixture_root().join("llama-fp8-kv-no-scales"), &sm("sm_90")).unwrap();
    let w = r.findings_of("kv-fp8-no-scales");
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].severity, Severity::Warning);
    assert!(w[0].why.contains("scale 1.0"));
    assert!(!r.has_errors(), "{:#?}", r.findings);
    assert_eq!(r.capacity.kv_bytes_per_token, Some(2 * 2 * 8));
}

#[test]
fn compressed_tensors_nvfp4_sharded() {
    let dir = fixture_root().join("llama-ct-nvfp4");
    let r = inspect(&dir, &sm("sm_90")).unwrap();
    assert!(r.tensors.from_index);
    assert_eq!(r.tensors.files.len(), 2);
    assert!(!r.has_errors(), "{:#?}", r.findings);
    let q = r
        .modules
        .iter()
        .find(|m| m.module.ends_with("mlp.down_proj"))
        .unwrap();
    assert_eq!(
        q.format,
        ModuleFormat::Nvfp4 {
            activations_4bit: true,
            group_size: 16
        }
    );
    assert!(
        q.evidence
            .contains("weight_packed U8 [16, 16] + weight_scale F8_E4M3 [16, 2]"),
        "{}",
        q.evidence
    );
    assert!(
        q.declared.contains("config_groups.group_0 target 'Linear'"),
        "{}",
        q.declared
    );
    assert_eq!(
        r.modules
            .iter()
            .find(|m| m.module == "lm_head")
            .unwrap()
            .format,
        ModuleFormat::Bf16
    );
    assert_eq!(r.findings_of("format-fallback-on-card").len(), 1);
    let r = inspect(&dir, &sm("sm_120")).unwrap();
    assert!(r.findings_of("format-fallback-on-card").is_empty());
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn plain_bf16_has_no_findings() {
    let r = inspect(&fixture_root().join("llama-bf16"), &sm("sm_80")).unwrap();
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.quantization.followed, None);
    assert!(r.modules.iter().all(|m| m.format == ModuleFormat::Bf16));
    assert_eq!(r.model.tie_word_embeddings, Some(true));
    assert!(!r.modules.iter().any(|m| m.module == "lm_head"));
    // On Turing, BF16 is a fallback (FP16 tensor cores).
    let r = inspect(&fixture_root().join("llama-bf16"), &sm("sm_75")).unwrap();
    assert_eq!(r.findings_of("format-fallback-on-card").len(), 1);
}

/// Write a variant of a fixture into a temp folder.
fn variant(name: &str, edit: impl FnOnce(&mut Spec)) -> tempfile::TempDir {
    let mut spec = fixture_specs()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1;
    edit(&mut spec);
    let d = tempfile::tempdir().unwrap();
    spec.write(d.path());
    d
}

#[test]
fn metadata_tensor_mismatches_are_errors() {
    // A module the metadata declares W4A16 NVFP4 stored in BF16.
    let d = variant("qwen36-mixed-clean", |s| {
        let name = format!("{P}layers.0.mlp.shared_expert.up_proj");
        s.tensors
            .t
            .retain(|k, _| !k.starts_with(&format!("{name}.")));
        s.tensors.linear(&name, 16, H, Store::Bf16);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("metadata-tensor-mismatch");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert!(f[0].detail.contains("W4A16 NVFP4"), "{}", f[0].detail);
    assert_eq!(f[0].module_count, 1);

    // Excluded by the metadata but stored as FP8: an engine would read FP8 bytes as BF16.
    let d = variant("qwen36-mixed-clean", |s| {
        s.tensors.t.remove("lm_head.weight");
        s.tensors.linear("lm_head", 32, H, Store::Fp8);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("metadata-tensor-mismatch");
    assert_eq!(f.len(), 1);
    assert!(
        f[0].detail.contains("exclude_modules 'lm_head'"),
        "{}",
        f[0].detail
    );
    assert!(f[0].detail.contains("unquantized"), "{}", f[0].detail);

    // Missing weight_scale_2, a scale of the wrong dtype and shape (group 32).
    let d = variant("qwen36-mixed-clean", |s| {
        let e = format!("{P}layers.1.mlp.experts.1.down_proj");
        s.tensors.t.remove(&format!("{e}.weight_scale_2"));
        s.tensors.raw(
            &format!("{e}.weight_scale"),
            Dtype::F32,
            &[16, 1],
            vec![0; 64],
        );
        let g = format!("{P}layers.1.mlp.experts.0.gate_proj");
        s.tensors.raw(
            &format!("{g}.weight_scale"),
            Dtype::F8_E4M3,
            &[16, 1],
            vec![0x38; 16],
        );
        s.tensors
            .raw(&format!("{g}.weight"), Dtype::U8, &[16, 16], vec![0; 256]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert!(r.has_errors());
    let f = &r.findings_of("metadata-tensor-mismatch")[0];
    assert!(f.detail.contains("weight_scale_2"), "{}", f.detail);
    assert!(f.detail.contains("F8_E4M3"), "{}", f.detail);
    let g = r.findings_of("nvfp4-group-size");
    assert_eq!(g.len(), 1, "{:#?}", r.findings);
    assert!(g[0].detail.contains("32"), "{}", g[0].detail);

    // An FP8 module without its weight_scale.
    let d = variant("llama-fp8-kv-no-scales", |s| {
        s.tensors
            .t
            .remove("model.layers.1.mlp.up_proj.weight_scale");
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = &r.findings_of("metadata-tensor-mismatch")[0];
    assert!(f.detail.contains("weight_scale"), "{}", f.detail);
    assert_eq!(f.modules, vec!["model.layers.*.mlp.up_proj (layers 1)"]);
}

#[test]
fn declared_group_size_other_than_16_is_an_error() {
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.as_mut().unwrap();
        h["quantization"]["quantized_layers"][format!("{P}layers.0.mlp.experts")]["group_size"] =
            json!(32);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let g = r.findings_of("nvfp4-group-size");
    assert!(!g.is_empty(), "{:#?}", r.findings);
    assert!(g.iter().any(|f| f.detail.contains("quantized_layers")));
    assert!(r.has_errors());
}

#[test]
fn mtp_rules() {
    // FP8 draft head: info.
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.as_mut().unwrap();
        h["quantization"]["exclude_modules"] = json!(["lm_head", "model.visual*"]);
        for m in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            let name = format!("mtp.layers.0.self_attn.{m}");
            h["quantization"]["quantized_layers"][&name] = json!({"quant_algo": "FP8"});
            s.tensors
                .t
                .retain(|k, _| !k.starts_with(&format!("{name}.")));
            s.tensors.linear(
                &name,
                if m == "q_proj" {
                    32
                } else if m == "o_proj" {
                    H
                } else {
                    8
                },
                H,
                Store::Fp8,
            );
        }
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("mtp-fp8");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Info);
    assert!(r.findings_of("mtp-not-excluded").is_empty());

    // BF16 only by omission: warning.
    let d = variant("qwen36-mixed-clean", |s| {
        s.hf_quant.as_mut().unwrap()["quantization"]["exclude_modules"] =
            json!(["lm_head", "model.visual*"]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("mtp-not-excluded");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(!r.has_errors());

    // Config declares MTP, headers hold none: info.
    let d = variant("qwen36-mixed-clean", |s| {
        s.tensors.t.retain(|k, _| !k.starts_with("mtp."));
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert_eq!(
        r.findings_of("mtp-weights-absent").len(),
        1,
        "{:#?}",
        r.findings
    );
}

#[test]
fn quantized_lm_head_embeddings_and_vision() {
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.as_mut().unwrap();
        h["quantization"]["exclude_modules"] = json!(["mtp*"]);
        let w4 = json!({"quant_algo": "W4A16_NVFP4", "group_size": 16});
        h["quantization"]["quantized_layers"]["lm_head"] = w4.clone();
        h["quantization"]["quantized_layers"]["model.visual.blocks.0.attn.qkv"] = w4;
        s.tensors.t.retain(|k, _| {
            !k.starts_with("lm_head.") && !k.starts_with("model.visual.blocks.0.attn.qkv.")
        });
        s.tensors.linear("lm_head", 32, H, Store::W4a16);
        s.tensors
            .linear("model.visual.blocks.0.attn.qkv", 48, 16, Store::W4a16);
        // An FP8 embedding table.
        s.tensors.t.remove(&format!("{P}embed_tokens.weight"));
        s.tensors.raw(
            &format!("{P}embed_tokens.weight"),
            Dtype::F8_E4M3,
            &[32, H],
            vec![0x38; 32 * H],
        );
        s.tensors
            .f32s(&format!("{P}embed_tokens.weight_scale"), &[], &[1.0]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert_eq!(
        r.findings_of("lm-head-quantized")[0].severity,
        Severity::Info
    );
    assert_eq!(
        r.findings_of("vision-quantized")[0].severity,
        Severity::Warning
    );
    assert_eq!(
        r.findings_of("embedding-quantized")[0].severity,
        Severity::Warning
    );
}

#[test]
fn kv_scales_on_some_layers_only() {
    let d = variant("llama-fp8-kv-no-scales", |s| {
        s.tensors
            .f32s("model.layers.0.self_attn.k_proj.k_scale", &[], &[0.1]);
        s.tensors
            .f32s("model.layers.0.self_attn.v_proj.v_scale", &[], &[0.1]);
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let w = r.findings_of("kv-fp8-no-scales");
    assert_eq!(w.len(), 1);
    assert!(w[0].detail.contains("layers 1"), "{}", w[0].detail);
}

#[test]
fn config_json_vs_hf_quant_config() {
    // config.json carries ModelOpt's flat form without a KV scheme and an older producer.
    let d = variant("qwen36-mixed-clean", |s| {
        let h = s.hf_quant.clone().unwrap();
        let mut q = h["quantization"].clone();
        q["quant_method"] = json!("modelopt");
        q["producer"] = json!({"name": "modelopt", "version": "0.37.0"});
        q["ignore"] = q["exclude_modules"].clone();
        q.as_object_mut().unwrap().remove("exclude_modules");
        q.as_object_mut().unwrap().remove("kv_cache_quant_algo");
        q["quantized_layers"][format!("{P}layers.0.linear_attn.in_proj_z")] =
            json!({"quant_algo": "W4A16_NVFP4", "group_size": 16});
        s.config["quantization_config"] = q;
    });
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let dis = r.findings_of("config-disagreement");
    let details: Vec<&str> = dis.iter().map(|f| f.detail.as_str()).collect();
    assert!(
        details.iter().any(|d| d.starts_with("KV cache")),
        "{details:#?}"
    );
    assert!(
        details.iter().any(|d| d.starts_with("producer")),
        "{details:#?}"
    );
    assert!(
        details.iter().any(
            |d| d.starts_with("quantized_layers differ: 0 only in config.json")
                && d.contains("1 with different algorithms")
        ),
        "{details:#?}"
    );
    // Module level: in_proj_z is W4A16 by config.json (what vLLM follows) and FP8 by
    // hf_quant_config.json; the tensors are FP8, so the followed file disagrees with them.
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("modules resolve differently")),
        "{details:#?}"
    );
    assert!(!r.findings_of("metadata-tensor-mismatch").is_empty());
    assert_eq!(r.quantization.followed.as_deref(), Some("config.json"));
    assert_eq!(r.capacity.kv_dtype.as_deref(), Some("BF16"));
}

#[test]
fn truncated_data_and_index_mismatch_are_lint_errors() {
    let d = variant("llama-bf16", |_| {});
    let f = d.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 10]).unwrap();
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    assert_eq!(r.findings_of("safetensors-truncated").len(), 1);
    assert!(r.has_errors());

    let d = variant("llama-ct-nvfp4", |_| {});
    let idx = d.path().join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&idx).unwrap()).unwrap();
    let flip = |f: &Value| {
        if f == "model-00001-of-00002.safetensors" {
            json!("model-00002-of-00002.safetensors")
        } else {
            json!("model-00001-of-00002.safetensors")
        }
    };
    let now = v["weight_map"]["model.norm.weight"].clone();
    v["weight_map"]["model.norm.weight"] = flip(&now);
    std::fs::write(&idx, serde_json::to_vec(&v).unwrap()).unwrap();
    let r = inspect(d.path(), &sm("sm_90")).unwrap();
    let f = r.findings_of("index-mismatch");
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert!(f[0].detail.contains("model.norm.weight"), "{}", f[0].detail);
    assert!(r.has_errors());
}

// ---------------------------------------------------------------- the binary

fn rigbench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .output()
        .expect("run rigbench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fx(name: &str) -> String {
    fixture_root().join(name).display().to_string()
}

#[test]
fn binary_exit_codes_on_fixtures() {
    let cases = [
        ("qwen36-mixed-clean", 0),
        ("qwen36-bad-ab-mtp", 4),
        ("llama-fp8-kv-no-scales", 0),
        ("llama-ct-nvfp4", 0),
        ("llama-bf16", 0),
    ];
    for (name, code) in cases {
        let (rc, out, err) = rigbench(&[
            "inspect",
            &fx(name),
            "--cc",
            "sm_90",
            // Room for the KV cache: 1 GiB less the default 1.5 GiB reserve would not fit, an
            // error of its own (capacity-does-not-fit, tests/first_hour.rs).
            "--gpu-mem-gib",
            "8",
            "--no-redact",
        ]);
        assert_eq!(rc, code, "{name}: stdout {out}\nstderr {err}");
        assert!(out.contains("### Findings"), "{name}: {out}");
        assert!(out.contains("### Capacity (prediction)"), "{name}");
    }
    let (_, out, _) = rigbench(&["inspect", &fx("qwen36-bad-ab-mtp"), "--cc", "sm_90"]);
    assert!(out.contains("gdn-ab-quantized") && out.contains("mtp-4bit"));
    let (_, out, _) = rigbench(&["inspect", &fx("llama-fp8-kv-no-scales"), "--cc", "sm_90"]);
    assert!(out.contains("kv-fp8-no-scales"));
}

#[test]
fn binary_json_and_flags() {
    let (rc, out, err) = rigbench(&[
        "inspect",
        &fx("qwen36-mixed-clean"),
        "--json",
        "--cc",
        "12.0",
        "--gpu-mem-gib",
        "2",
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        "1024",
        "--kv-cache-dtype",
        "bf16",
        "--reserve-gib",
        "0",
    ]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let c = &v["capacity"];
    assert_eq!(c["kind"], "prediction");
    assert_eq!(c["kv_dtype"], "BF16");
    assert_eq!(c["kv_bytes_per_token"], 2 * 8 * 2);
    let w = c["weight_bytes"].as_u64().unwrap();
    let budget = (1u64 << 30) - w; // 2 GiB × 0.5, no reserve
    assert_eq!(c["kv_budget_bytes"].as_i64().unwrap(), budget as i64);
    let state = c["state_bytes_per_sequence"].as_u64().unwrap();
    assert_eq!(c["kv_tokens"].as_u64().unwrap(), (budget - state) / 32);
    assert_eq!(v["card"]["cc"]["major"], 12);

    for bad in [
        vec!["--cc", "hopper"],
        vec!["--gpu-memory-utilization", "1.5"],
        vec!["--kv-cache-dtype", "int3"],
        vec!["--gpu-mem-gib=-1"],
    ] {
        let mut args = vec!["inspect", "tests/fixtures/checkpoints/llama-bf16"];
        args.extend(bad.iter());
        let (rc, _, err) = rigbench(&args);
        assert_eq!(
            rc, 64,
            "a bad flag value is a bad command line: {bad:?}: {err}"
        );
        let flag = bad[0].split('=').next().unwrap();
        assert!(err.contains(flag), "{bad:?}: {err}");
    }
}

#[test]
fn binary_without_gpu_or_cc_says_so() {
    let (rc, out, _) = rigbench(&["inspect", &fx("llama-bf16")]);
    assert_eq!(rc, 0);
    if out.contains("### Formats on this card: sm_") {
        eprintln!("a GPU was probed on this machine; the no-GPU message is not checked");
        return;
    }
    assert!(out.contains("card verdicts skipped"), "{out}");
    assert!(out.contains("need a GPU memory size"), "{out}");
}

#[test]
fn binary_bad_input_exits_1_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n);
    let run = |dir: &Path| {
        rigbench(&[
            "inspect",
            &dir.display().to_string(),
            "--cc",
            "sm_90",
            "--no-redact",
        ])
    };

    let (rc, _, err) = run(&p("missing"));
    assert_eq!(rc, 1);
    assert!(
        err.contains("missing") && err.contains("not found"),
        "{err}"
    );

    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(err.contains("config.json"), "{err}");

    std::fs::write(p("config.json"), "{ \"hidden_size\": ").unwrap();
    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(err.contains("config.json: not valid JSON"), "{err}");

    std::fs::write(p("config.json"), b"{\"model_type\": \"ll\xc3\x28ama\"}").unwrap();
    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(
        err.contains("config.json") && err.contains("not UTF-8"),
        "{err}"
    );

    // Safetensors headers.
    std::fs::write(p("config.json"), llama_config(None, true).to_string()).unwrap();
    let st = p("model.safetensors");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![7, 0, 0], "fewer than the 8-byte"),
        (
            {
                let mut v = 64u64.to_le_bytes().to_vec();
                v.extend_from_slice(b"{\"a\":{\"dtype\"");
                v
            },
            "larger than the file",
        ),
        (
            {
                let mut v = (1u64 << 40).to_le_bytes().to_vec();
                v.extend_from_slice(b"{}");
                v
            },
            "absurdly large",
        ),
        (
            {
                let mut v = 3u64.to_le_bytes().to_vec();
                v.extend_from_slice(&[b'{', 0xc3, b'}']);
                v
            },
            "not UTF-8",
        ),
        (
            {
                let h = b"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2";
                let mut v = (h.len() as u64).to_le_bytes().to_vec();
                v.extend_from_slice(h);
                v
            },
            "invalid safetensors header",
        ),
    ];
    for (bytes, want) in cases {
        std::fs::write(&st, &bytes).unwrap();
        let (rc, out, err) = run(d.path());
        assert_eq!(rc, 1, "{want}: {out}");
        assert!(err.contains("model.safetensors"), "{want}: {err}");
        assert!(err.contains(want), "{want}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_file(&st).unwrap();

    // An index naming a missing shard while another is present (a partial download; with no
    // shard at all the index alone is read).
    std::fs::write(
        p("model.safetensors.index.json"),
        r#"{"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors", "model.norm.weight": "model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let header = r#"{"model.norm.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
    let mut shard = (header.len() as u64).to_le_bytes().to_vec();
    shard.extend_from_slice(header.as_bytes());
    shard.extend_from_slice(&[0u8; 4]);
    std::fs::write(p("model-00001-of-00002.safetensors"), shard).unwrap();
    let (rc, _, err) = run(d.path());
    assert_eq!(rc, 1);
    assert!(
        err.contains("model.safetensors.index.json")
            && err.contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
}
