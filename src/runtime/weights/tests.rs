//! The weights' tests and the checkpoint writer they share with other modules' tests
//! ([`config_json`], [`write_checkpoint`]): checkpoints written and loaded back in every format
//! (dense and hybrid, with a quantization recipe), the loader's errors, synthesis and
//! quantization.

use super::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// The `config.json` of `c` in transformers' form (`qwen3`, or `qwen3_5_text` for hybrids,
/// with `mamba_ssm_dtype: float32` as the published Qwen3.5 / 3.6 configs).
pub(crate) fn config_json(c: &ModelConfig) -> serde_json::Value {
    let mut cfg = serde_json::json!({
        "model_type": "qwen3", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings, "eos_token_id": c.eos_token_ids,
    });
    if let Some(h) = &c.hybrid {
        let m = cfg.as_object_mut().unwrap();
        m.remove("rope_theta");
        let types: Vec<&str> = h.layer_types[..c.num_layers]
            .iter()
            .map(|t| match t {
                crate::runtime::hybrid::LayerType::Attention => "full_attention",
                crate::runtime::hybrid::LayerType::Gdn => "linear_attention",
            })
            .collect();
        for (k, v) in [
            ("model_type", serde_json::json!("qwen3_5_text")),
            ("architectures", serde_json::json!(["Qwen3_5ForCausalLM"])),
            ("hidden_act", serde_json::json!("silu")),
            ("layer_types", serde_json::json!(types)),
            ("linear_conv_kernel_dim", serde_json::json!(h.conv_kernel)),
            ("linear_key_head_dim", serde_json::json!(h.key_head_dim)),
            ("linear_value_head_dim", serde_json::json!(h.value_head_dim)),
            ("linear_num_key_heads", serde_json::json!(h.num_key_heads)),
            (
                "linear_num_value_heads",
                serde_json::json!(h.num_value_heads),
            ),
            ("mamba_ssm_dtype", serde_json::json!("float32")),
            ("dtype", serde_json::json!("bfloat16")),
            (
                "rope_parameters",
                serde_json::json!({"rope_type": "default", "rope_theta": c.rope_theta,
                    "partial_rotary_factor": c.rotary_dim as f64 / c.head_dim as f64}),
            ),
        ] {
            m.insert(k.into(), v);
        }
    }
    cfg
}

/// Write `weights` as a ModelOpt-style safetensors checkpoint with its config.json into
/// `dir` (used by loader tests here and in the backend tests).
pub(crate) fn write_checkpoint(dir: &Path, w: &ModelWeights) {
    let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let lin = |name: &str, l: &Linear, bufs: &mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>| match l
    {
        Linear::Bf16 { n, k, data } => bufs.push((
            format!("{name}.weight"),
            Dtype::BF16,
            vec![*n, *k],
            data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )),
        Linear::Fp8 { w, input_scale } => {
            bufs.push((
                format!("{name}.weight"),
                Dtype::F8_E4M3,
                vec![w.rows, w.cols],
                w.data.clone(),
            ));
            bufs.push((
                format!("{name}.weight_scale"),
                Dtype::F32,
                vec![],
                f32s(&w.scales),
            ));
            if let Some(s) = input_scale {
                bufs.push((
                    format!("{name}.input_scale"),
                    Dtype::F32,
                    vec![],
                    f32s(&[*s]),
                ));
            }
        }
        Linear::Nvfp4(w) => {
            bufs.push((
                format!("{name}.weight"),
                Dtype::U8,
                vec![w.n, w.k / 2],
                w.packed.clone(),
            ));
            bufs.push((
                format!("{name}.weight_scale"),
                Dtype::F8_E4M3,
                vec![w.n, w.k / 16],
                w.block_scales.clone(),
            ));
            bufs.push((
                format!("{name}.weight_scale_2"),
                Dtype::F32,
                vec![],
                f32s(&[w.global_scale]),
            ));
        }
    };
    // The Qwen3.5 family stores its zero-centred norms as w (applied as 1 + w).
    let hybrid = w.config.is_hybrid();
    let norm = |v: &[f32]| -> Vec<u8> {
        if hybrid {
            f32s(&v.iter().map(|x| x - 1.0).collect::<Vec<f32>>())
        } else {
            f32s(v)
        }
    };
    lin("model.embed_tokens", &w.embed, &mut bufs);
    if let Some(h) = &w.lm_head {
        lin("lm_head", h, &mut bufs);
    }
    bufs.push((
        "model.norm.weight".into(),
        Dtype::F32,
        vec![w.norm.len()],
        norm(&w.norm),
    ));
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        for (role, x) in l.linears() {
            lin(&format!("{p}.{}", role.module()), x, &mut bufs);
        }
        if let Some(g) = &l.gdn {
            let c = g.conv_w.len() / w.config.hybrid.as_ref().map_or(1, |h| h.conv_kernel);
            let kk = g.conv_w.len() / c.max(1);
            for (n, shape, v) in [
                ("conv1d.weight", vec![c, 1, kk], &g.conv_w),
                ("A_log", vec![g.a_log.len()], &g.a_log),
                ("dt_bias", vec![g.dt_bias.len()], &g.dt_bias),
                ("norm.weight", vec![g.norm.len()], &g.norm),
            ] {
                bufs.push((format!("{p}.linear_attn.{n}"), Dtype::F32, shape, f32s(v)));
            }
        }
        bufs.push((
            format!("{p}.input_layernorm.weight"),
            Dtype::F32,
            vec![l.input_norm.len()],
            norm(&l.input_norm),
        ));
        bufs.push((
            format!("{p}.post_attention_layernorm.weight"),
            Dtype::F32,
            vec![l.post_norm.len()],
            norm(&l.post_norm),
        ));
        if let (Some(q), Some(k)) = (&l.q_norm, &l.k_norm) {
            bufs.push((
                format!("{p}.self_attn.q_norm.weight"),
                Dtype::F32,
                vec![q.len()],
                norm(q),
            ));
            bufs.push((
                format!("{p}.self_attn.k_norm.weight"),
                Dtype::F32,
                vec![k.len()],
                norm(k),
            ));
        }
        if let Some(s) = l.k_scale {
            bufs.push((
                format!("{p}.self_attn.k_proj.k_scale"),
                Dtype::F32,
                vec![],
                f32s(&[s]),
            ));
        }
        if let Some(s) = l.v_scale {
            bufs.push((
                format!("{p}.self_attn.v_proj.v_scale"),
                Dtype::F32,
                vec![],
                f32s(&[s]),
            ));
        }
    }
    let views: Vec<(String, TensorView)> = bufs
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let c = &w.config;
    let cfg = config_json(c);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    write_quant_config(dir, w);
}

/// Write hf_quant_config.json for quantized weights: ModelOpt's MIXED_PRECISION form when
/// several formats are mixed, else one algorithm for every linear layer.
fn write_quant_config(dir: &Path, w: &ModelWeights) {
    let c = &w.config;
    // Several quantized formats: ModelOpt's MIXED_PRECISION form, one entry per quantized
    // module (as NVIDIA's Qwen3.6 exports).
    let algo_of = |l: &Linear| match l {
        Linear::Fp8 { .. } => Some(serde_json::json!({"quant_algo": "FP8"})),
        Linear::Nvfp4(_) => {
            Some(serde_json::json!({"quant_algo": "W4A16_NVFP4", "group_size": 16}))
        }
        Linear::Bf16 { .. } => None,
    };
    let mut layers = serde_json::Map::new();
    let mut formats = std::collections::BTreeSet::new();
    for (i, l) in w.layers.iter().enumerate() {
        for (role, x) in l.linears() {
            if let Some(a) = algo_of(x) {
                formats.insert(x.format().id());
                layers.insert(format!("model.layers.{i}.{}", role.module()), a);
            }
        }
    }
    if let Some(a) = w.lm_head.as_ref().and_then(algo_of) {
        formats.insert(w.lm_head().format().id());
        layers.insert("lm_head".into(), a);
    }
    if formats.len() > 1 {
        let q = serde_json::json!({
            "producer": {"name": "modelopt", "version": "0.44.0"},
            "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": null,
                "quantized_layers": layers},
        });
        std::fs::write(dir.join("hf_quant_config.json"), q.to_string()).unwrap();
        return;
    }
    // ModelOpt's quantization metadata for quantized weights (without it, the metadata
    // declares BF16 and the loader refuses the checkpoint as inspect's
    // metadata-tensor-mismatch).
    let algo = match w.linear_format() {
        WeightFormat::Bf16 => None,
        WeightFormat::Fp8 => Some("FP8_PER_CHANNEL_PER_TOKEN"),
        WeightFormat::Nvfp4 => Some("W4A16_NVFP4"),
    };
    if let Some(algo) = algo {
        let mut exclude = vec!["lm_head"];
        if c.is_hybrid() {
            // ModelOpt leaves the Gated-DeltaNet decay and β inputs in BF16.
            exclude.extend([
                "*linear_attn.in_proj_a",
                "*linear_attn.in_proj_b",
                "*conv1d",
            ]);
        }
        let q = serde_json::json!({
            "producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": algo, "group_size": 16,
                "kv_cache_quant_algo": null, "exclude_modules": exclude},
        });
        std::fs::write(dir.join("hf_quant_config.json"), q.to_string()).unwrap();
    }
}

#[test]
fn synthesis_is_deterministic_and_scaled() {
    let c = ModelConfig::tiny();
    let a = synthesize(&c, 7);
    let b = synthesize(&c, 7);
    let d = synthesize(&c, 8);
    assert_eq!(a.layers[1].q, b.layers[1].q);
    assert_ne!(a.layers[1].q, d.layers[1].q);
    let q = a.layers[0].gate.dequantize();
    let var = q.iter().map(|x| x * x).sum::<f32>() / q.len() as f32;
    let want = 1.0 / c.hidden_size as f32;
    assert!((var / want - 1.0).abs() < 0.1, "variance {var} vs {want}");
    // A truncated model shares its layers with the full one.
    let mut c1 = c.clone();
    c1.num_layers = 1;
    assert_eq!(synthesize(&c1, 7).layers[0].down, a.layers[0].down);
}

#[test]
fn quantize_keeps_shapes_and_changes_values() {
    let mut w = synthesize(&ModelConfig::tiny(), 1);
    let before = w.layers[0].up.dequantize();
    w.quantize(WeightFormat::Nvfp4).unwrap();
    assert_eq!(w.linear_format(), WeightFormat::Nvfp4);
    assert_eq!(w.embed.format(), WeightFormat::Bf16);
    let after = w.layers[0].up.dequantize();
    assert_eq!(before.len(), after.len());
    assert_ne!(before, after);
    assert!(w.stored_bytes() < synthesize(&ModelConfig::tiny(), 1).stored_bytes());
}

#[test]
fn checkpoint_round_trip_all_formats() {
    for fmt in [WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Nvfp4] {
        let mut w = synthesize(&ModelConfig::tiny(), 3);
        w.quantize(fmt).unwrap();
        w.layers[1].k_scale = Some(0.5);
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), &w);
        let cfg = ModelConfig::read_hf_config(&dir.path().join("config.json"))
            .unwrap()
            .config;
        let back = load_dir(dir.path(), &cfg).unwrap();
        assert_eq!(back.layers.len(), 2);
        assert_eq!(back.layers[1].down, w.layers[1].down, "{fmt:?}");
        assert_eq!(back.layers[1].k_scale, Some(0.5));
        assert_eq!(back.layers[0].k_scale, None);
        assert_eq!(back.embed, w.embed);
        assert!(back.lm_head.is_none());
        // --num-layers 1 reads only the first layer.
        let mut c1 = cfg.clone();
        c1.num_layers = 1;
        assert_eq!(load_dir(dir.path(), &c1).unwrap().layers.len(), 1);
    }
}

#[test]
fn hybrid_checkpoint_round_trip_and_recipe() {
    let c = crate::runtime::hybrid::tiny_hybrid();
    for recipe in [
        QuantRecipe::Uniform(WeightFormat::Bf16),
        QuantRecipe::Uniform(WeightFormat::Fp8),
        QuantRecipe::Uniform(WeightFormat::Nvfp4),
    ] {
        let mut w = synthesize(&c, 3);
        w.quantize_recipe(recipe).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), &w);
        let cfg = ModelConfig::read_hf_config(&dir.path().join("config.json"))
            .unwrap()
            .config;
        assert_eq!(cfg, c, "{recipe:?}");
        let back = load_dir(dir.path(), &cfg).unwrap();
        for (a, b) in back.layers.iter().zip(&w.layers) {
            assert_eq!(a.linears(), b.linears(), "{recipe:?}");
            assert_eq!(a.gdn, b.gdn);
            for (x, y) in a.input_norm.iter().zip(&b.input_norm) {
                assert!((x - y).abs() < 1e-6, "1 + (w - 1) round trip");
            }
        }
    }
    // The mixed recipe: NVFP4 MLP and lm_head, FP8 attention and GDN projections, BF16 a/b.
    let mut c2 = c.clone();
    c2.tie_word_embeddings = false;
    let mut w = synthesize(&c2, 3);
    w.quantize_recipe(QuantRecipe::Nvfp4Mixed).unwrap();
    // Written as ModelOpt's MIXED_PRECISION export (whose FP8 modules carry a static
    // activation scale, as NVIDIA's do), it loads module by module in its own formats.
    let mut exported = w.clone();
    let set = |l: &mut Linear| {
        if let Linear::Fp8 { input_scale, .. } = l {
            *input_scale = Some(0.02);
        }
    };
    for l in &mut exported.layers {
        for x in [&mut l.q, &mut l.k, &mut l.v, &mut l.o] {
            set(x);
        }
        if let Some(g) = &mut l.gdn {
            for x in [&mut g.qkv, &mut g.z, &mut g.out] {
                set(x);
            }
        }
    }
    let w = exported;
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &w);
    let m = MappedCheckpoint::open(dir.path(), &c2).unwrap();
    assert_eq!(
        m.formats(),
        &[WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Nvfp4]
    );
    let back = m.to_weights().unwrap();
    for (a, b) in back.layers.iter().zip(&w.layers) {
        assert_eq!(a.linears(), b.linears());
    }
    assert_eq!(back.lm_head, w.lm_head);
    let g = w.layers[0].gdn.as_ref().unwrap();
    assert_eq!(
        [
            g.qkv.format(),
            g.z.format(),
            g.a.format(),
            g.b.format(),
            g.out.format()
        ],
        [
            WeightFormat::Fp8,
            WeightFormat::Fp8,
            WeightFormat::Bf16,
            WeightFormat::Bf16,
            WeightFormat::Fp8
        ]
    );
    let attn = &w.layers[3];
    assert_eq!(
        [
            attn.q.format(),
            attn.o.format(),
            attn.gate.format(),
            attn.down.format()
        ],
        [
            WeightFormat::Fp8,
            WeightFormat::Fp8,
            WeightFormat::Nvfp4,
            WeightFormat::Nvfp4
        ]
    );
    assert_eq!(w.lm_head().format(), WeightFormat::Nvfp4);
    assert_eq!(w.embed.format(), WeightFormat::Bf16);
    // in_proj_qkv and in_proj_z run as one GEMM: one per-tensor scale.
    let scale = |l: &Linear| match l {
        Linear::Fp8 { w, .. } => w.scales.clone(),
        _ => panic!("FP8 expected"),
    };
    assert_eq!(scale(&g.qkv), scale(&g.z));
}

#[test]
fn loader_errors_name_the_tensor() {
    let w = synthesize(&ModelConfig::tiny(), 3);
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &w);
    let mut cfg = ModelConfig::read_hf_config(&dir.path().join("config.json"))
        .unwrap()
        .config;
    cfg.hidden_size = 32;
    let e = load_dir(dir.path(), &cfg).unwrap_err().to_string();
    assert!(e.contains("tensor 'model.") && e.contains("shape"), "{e}");
    let mut cfg3 = ModelConfig::tiny();
    cfg3.num_layers = 3;
    let e = load_dir(dir.path(), &cfg3).unwrap_err().to_string();
    assert!(e.contains("model.layers.2"), "{e}");
    std::fs::write(dir.path().join("model.safetensors"), b"garbage").unwrap();
    let e = load_dir(dir.path(), &ModelConfig::tiny()).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("model.safetensors") && e.contains("safetensors"),
        "{e}"
    );
    let empty = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.path().join("config.json"),
        empty.path().join("config.json"),
    )
    .unwrap();
    let e = load_dir(empty.path(), &ModelConfig::tiny())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no *.safetensors"), "{e}");
}
