//! The generator of the test checkpoints under `tests/fixtures/checkpoints/`: tiny but real
//! checkpoints (config.json, hf_quant_config.json, safetensors files quantized with rigbench's own
//! `formats`), shared by `tests/it/inspect.rs` (which rewrites and checks the committed ones) and
//! `tests/it/inspect_binary.rs` (`mod checkpoints` of `tests/it/main.rs`, by path).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rigbench::formats::{fp8, nvfp4};
use safetensors::Dtype;
use serde_json::{json, Value};

/// Deterministic values in [-1, 1) (a 64-bit LCG; no RNG crate state to pin).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
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

pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(1469598103934665603u64, |h, b| {
        (h ^ b as u64).wrapping_mul(1099511628211)
    })
}

/// How to store a Linear module.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Store {
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
pub struct Ckpt {
    pub t: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
}

impl Ckpt {
    pub fn raw(&mut self, name: &str, dtype: Dtype, shape: &[usize], data: Vec<u8>) {
        self.t
            .insert(name.to_string(), (dtype, shape.to_vec(), data));
    }

    pub fn bf16(&mut self, name: &str, shape: &[usize]) {
        let n: usize = shape.iter().product();
        let v = values(seed_of(name), n);
        let bytes = rigbench::formats::to_bf16_bits(&v)
            .into_iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        self.raw(name, Dtype::BF16, shape, bytes);
    }

    pub fn f32s(&mut self, name: &str, shape: &[usize], v: &[f32]) {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.raw(name, Dtype::F32, shape, bytes);
    }

    /// A Linear module `[n, k]` stored as `s`.
    pub fn linear(&mut self, module: &str, n: usize, k: usize, s: Store) {
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
                let g = self.nvfp4_codes(module, "weight", &w, n, k);
                self.f32s(&format!("{module}.weight_scale_2"), &[], &[g]);
            }
            Store::CtW4a4 => {
                // compressed-tensors names the codes `weight_packed` and stores the reciprocal
                // global scales.
                let g = self.nvfp4_codes(module, "weight_packed", &w, n, k);
                self.f32s(&format!("{module}.weight_global_scale"), &[1], &[1.0 / g]);
                self.f32s(
                    &format!("{module}.input_global_scale"),
                    &[1],
                    &[448.0 * 6.0],
                );
            }
        }
    }

    /// `w` `[n, k]` quantized to NVFP4: its E2M1 codes as `{module}.{codes}` (`[n, k / 2]`
    /// bytes) and E4M3 block scales as `{module}.weight_scale`; returns the global scale.
    fn nvfp4_codes(&mut self, module: &str, codes: &str, w: &[f32], n: usize, k: usize) -> f32 {
        let q = nvfp4::quantize(w, n, k).unwrap();
        self.raw(
            &format!("{module}.{codes}"),
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
        q.global_scale
    }

    /// Write `model.safetensors`, or `shards` files plus `model.safetensors.index.json`.
    pub fn write(&self, dir: &Path, shards: usize) {
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

pub fn write_json(path: &Path, v: &Value) {
    let mut s = serde_json::to_string_pretty(v).unwrap();
    s.push('\n');
    std::fs::write(path, s).unwrap();
}

/// A checkpoint to write: config.json, optional hf_quant_config.json, tensors, shard count.
#[derive(Clone)]
pub struct Spec {
    pub config: Value,
    pub hf_quant: Option<Value>,
    pub tensors: Ckpt,
    pub shards: usize,
}

impl Spec {
    pub fn write(&self, dir: &Path) {
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
pub const H: usize = 16;
pub const P: &str = "model.language_model.";

pub fn hybrid_config() -> Value {
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
pub fn hybrid_tensors(store: &dyn Fn(&str) -> Store, kv_scales: bool) -> Ckpt {
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
pub fn recipe(name: &str, bad: bool) -> Store {
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

pub fn hybrid_hf_quant(bad: bool) -> Value {
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

pub fn llama_config(quant: Option<Value>, tied: bool) -> Value {
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

pub fn llama_tensors(store: Store, lm_head: bool) -> Ckpt {
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
pub fn fixture_specs() -> Vec<(&'static str, Spec)> {
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

pub fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints")
}
