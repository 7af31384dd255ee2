//! Markdown rendering of an inspection: the terminal output of `rigbench inspect` and the
//! checkpoint section of `rigbench report --checkpoint DIR`.

use super::{InspectReport, Severity};
use crate::output::table::{human_bytes, markdown_table, plural, thousands};

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Render an inspection as Markdown (sections at level `##`/`###`).
pub fn render_markdown(r: &InspectReport) -> String {
    let mut o = String::new();
    o.push_str(&format!("## Checkpoint: {}\n\n", r.checkpoint));
    o.push_str(&format!("Files read: {}.\n\n", r.files_read.join(", ")));

    render_model(&mut o, r);
    render_quantization(&mut o, r);
    render_tensors(&mut o, r);
    render_modules(&mut o, r);
    render_findings(&mut o, r);
    render_card(&mut o, r);
    render_prediction(&mut o, r);
    render_capacity(&mut o, r);
    o
}

/// "What will run" (`--engine`): per layer class, the kernel the engine selects.
fn render_prediction(o: &mut String, r: &InspectReport) {
    let Some(rows) = &r.engine_prediction else {
        return;
    };
    o.push_str(&format!(
        "### What will run: {}\n\n",
        r.engine_prediction_for.as_deref().unwrap_or("engine")
    ));
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            vec![
                format!("{} ({})", p.layer_class.label(), p.modules),
                p.quantization.clone(),
                p.kernel.clone(),
                if p.native { "yes" } else { "no" }.to_string(),
                p.warning.clone().unwrap_or_else(|| "-".into()),
                p.rule_source.clone(),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "layer class",
            "quantization",
            "kernel",
            "native",
            "warning",
            "rule source",
        ],
        &rows,
    ));
    o.push_str("\nA prediction from rigbench's rule table (docs/diagnose.md, \"Prediction rules\"): the engine's own log lines ('Using … for NVFP4 GEMM', '… NvFp4 MoE backend', '… attention backend') say what ran; `rigbench diagnose --log` compares them with this table.\n\n");
}

/// The model facts from config.json.
fn render_model(o: &mut String, r: &InspectReport) {
    let m = &r.model;
    o.push_str("### Model (config.json)\n\n");
    let mut rows: Vec<Vec<String>> = vec![
        vec![
            "architecture".into(),
            if m.architectures.is_empty() {
                "unknown".into()
            } else {
                m.architectures.join(", ")
            },
        ],
        vec![
            "model_type".into(),
            match (&m.model_type, &m.text_model_type) {
                (Some(a), Some(b)) => format!("{a} (text_config: {b})"),
                (a, _) => opt(a),
            },
        ],
        vec!["layers".into(), opt(&m.num_hidden_layers)],
        vec!["hidden size".into(), opt(&m.hidden_size)],
        vec![
            "attention heads / KV heads".into(),
            format!(
                "{} / {}",
                opt(&m.num_attention_heads),
                opt(&m.num_key_value_heads)
            ),
        ],
        vec![
            "head_dim".into(),
            // Latent attention (MLA: DeepSeek, GLM, Kimi) has no single head_dim: config.json
            // gives qk_nope_head_dim + qk_rope_head_dim for Q and K and v_head_dim for V, so
            // hidden / heads would be a false figure (docs/diagnose.md, "inspect").
            if m.head_dim_derived && m.attention_extras.iter().any(|x| x == "kv_lora_rank") {
                "none (latent attention, MLA: config.json's qk_nope_head_dim + qk_rope_head_dim give Q/K, v_head_dim gives V)".to_string()
            } else {
                format!(
                    "{}{}",
                    opt(&m.head_dim),
                    if m.head_dim_derived {
                        " (hidden / heads)"
                    } else {
                        ""
                    }
                )
            },
        ],
    ];
    if m.intermediate_size.is_some() {
        rows.push(vec!["intermediate size".into(), opt(&m.intermediate_size)]);
    }
    if m.num_experts.is_some() {
        rows.push(vec![
            "experts".into(),
            format!(
                "{} routed, {} per token, expert intermediate {}{}",
                opt(&m.num_experts),
                opt(&m.num_experts_per_tok),
                opt(&m.moe_intermediate_size),
                m.shared_expert_intermediate_size
                    .map(|s| format!(", shared expert intermediate {s}"))
                    .unwrap_or_default()
            ),
        ]);
    }
    rows.push(vec!["vocab".into(), opt(&m.vocab_size)]);
    rows.push(vec!["tied embeddings".into(), opt(&m.tie_word_embeddings)]);
    rows.push(vec!["dtype".into(), opt(&m.dtype)]);
    if m.linear_attention_layers > 0 || !m.layer_types.is_empty() {
        rows.push(vec![
            "layer types".into(),
            format!(
                "{} full attention, {} linear attention (Gated-DeltaNet){}",
                opt(&m.full_attention_layers),
                m.linear_attention_layers,
                m.layer_types_source
                    .as_deref()
                    .map(|s| format!(" [from {s}]"))
                    .unwrap_or_default()
            ),
        ]);
    }
    if let Some(la) = &m.linear_attention {
        rows.push(vec![
            "Gated-DeltaNet dims".into(),
            format!(
                "key heads {} × {}, value heads {} × {}, conv kernel {}",
                opt(&la.num_key_heads),
                opt(&la.key_head_dim),
                opt(&la.num_value_heads),
                opt(&la.value_head_dim),
                opt(&la.conv_kernel)
            ),
        ]);
    }
    rows.push(vec![
        "MTP layers".into(),
        match (&m.mtp_layers, &m.mtp_field) {
            (Some(n), Some(f)) => format!("{n} ({f})"),
            _ => "none declared".into(),
        },
    ]);
    if m.from_text_config {
        rows.push(vec![
            "nested text_config".into(),
            "yes (multimodal wrapper)".into(),
        ]);
    }
    if m.vision.is_some() {
        rows.push(vec!["vision tower".into(), "yes (vision_config)".into()]);
    }
    o.push_str(&markdown_table(&["fact", "value"], &rows));
    o.push('\n');
}

/// The quantization metadata and which file engines follow.
fn render_quantization(o: &mut String, r: &InspectReport) {
    o.push_str("### Quantization metadata\n\n");
    if r.quantization.facts.is_empty() {
        o.push_str(&format!("{}\n\n", r.quantization.followed_why));
    } else {
        let rows: Vec<Vec<String>> = r
            .quantization
            .facts
            .iter()
            .map(|f| vec![f.fact.clone(), f.value.clone(), f.source.clone()])
            .collect();
        o.push_str(&markdown_table(&["fact", "value", "source"], &rows));
        o.push_str(&format!(
            "\nWhich file engines follow: {}\n\n",
            r.quantization.followed_why
        ));
    }
}

/// The safetensors headers summary.
fn render_tensors(o: &mut String, r: &InspectReport) {
    o.push_str("### safetensors headers\n\n");
    if let Some(reason) = &r.tensors.skipped_reason {
        o.push_str(&format!("{reason}.\n\n"));
    } else {
        let by: Vec<String> = r
            .tensors
            .bytes_by_dtype
            .iter()
            .map(|(d, b)| format!("{d} {}", human_bytes(*b)))
            .collect();
        o.push_str(&format!(
            "{}, {} in {}{}; by dtype: {}.\n\n",
            plural(r.tensors.tensor_count as u64, "tensor", "tensors"),
            human_bytes(r.tensors.total_bytes),
            plural(r.tensors.files.len() as u64, "file", "files"),
            if r.tensors.from_index {
                " (via model.safetensors.index.json)"
            } else {
                ""
            },
            by.join(", ")
        ));
    }
}

/// The modules by layer kind and the other tensors.
fn render_modules(o: &mut String, r: &InspectReport) {
    o.push_str("### Modules by layer kind\n\n");
    o.push_str(&format!("Module list: {}.\n\n", r.module_source));
    if r.modules.is_empty() {
        o.push_str("No modules to show.\n\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .modules
            .iter()
            .map(|row| {
                vec![
                    row.kind.label().to_string(),
                    row.module.clone(),
                    row.layers.clone(),
                    if row.count > 0 {
                        thousands(row.count)
                    } else {
                        "-".into()
                    },
                    row.format.to_string(),
                    row.declared.clone(),
                    row.evidence.clone(),
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &[
                "kind",
                "module",
                "layers",
                "count",
                "format",
                "declared by",
                "evidence",
            ],
            &rows,
        ));
        o.push('\n');
    }
    if let Some(t) = &r.other_tensors {
        o.push_str(&format!("Also: {t}.\n\n"));
    }
}

/// The findings, counted by severity in the heading.
fn render_findings(o: &mut String, r: &InspectReport) {
    let (e, w, i) = r
        .findings
        .iter()
        .fold((0, 0, 0), |(e, w, i), f| match f.severity {
            Severity::Error => (e + 1, w, i),
            Severity::Warning => (e, w + 1, i),
            Severity::Info => (e, w, i + 1),
        });
    o.push_str(&format!(
        "### Findings: {}, {}, {i} info\n\n",
        plural(e, "error", "errors"),
        plural(w, "warning", "warnings")
    ));
    if r.findings.is_empty() {
        o.push_str("None.\n\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .findings
            .iter()
            .map(|f| {
                let mut mods: Vec<String> = f.modules.iter().take(4).cloned().collect();
                if f.modules.len() > 4 {
                    mods.push(format!("… {} patterns", f.modules.len()));
                }
                vec![
                    f.severity.to_string(),
                    f.rule.clone(),
                    f.why.clone(),
                    f.detail.clone(),
                    if f.module_count > 0 {
                        format!(
                            "{} ({} modules)",
                            mods.join("; "),
                            thousands(f.module_count)
                        )
                    } else {
                        "-".into()
                    },
                ]
            })
            .collect();
        o.push_str(&markdown_table(
            &["severity", "rule", "why", "found", "modules"],
            &rows,
        ));
        o.push('\n');
    }
}

/// The formats on this card, or why there is none.
fn render_card(o: &mut String, r: &InspectReport) {
    match (&r.card.cc, &r.card.skipped) {
        (Some(cc), _) => {
            o.push_str(&format!(
                "### Formats on this card: {cc}{}\n\n",
                r.card
                    .card
                    .as_deref()
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default()
            ));
            if r.card.verdicts.is_empty() {
                o.push_str("No modules to classify.\n\n");
            } else {
                let rows: Vec<Vec<String>> = r
                    .card
                    .verdicts
                    .iter()
                    .map(|v| {
                        vec![
                            v.format.clone(),
                            if v.modules > 0 {
                                thousands(v.modules)
                            } else {
                                "-".into()
                            },
                            v.support
                                .map(|s| s.to_string())
                                .unwrap_or_else(|| "not classified".into()),
                            v.path.clone(),
                            v.reason.clone(),
                        ]
                    })
                    .collect();
                o.push_str(&markdown_table(
                    &["format", "modules", "verdict", "runs as", "why"],
                    &rows,
                ));
                o.push('\n');
            }
        }
        (None, Some(why)) => o.push_str(&format!("### Formats on this card\n\n{why}.\n\n")),
        (None, None) => {}
    }
}

/// The capacity prediction, what was not computed and the assumptions.
fn render_capacity(o: &mut String, r: &InspectReport) {
    let c = &r.capacity;
    o.push_str("### Capacity (prediction)\n\n");
    let mut rows: Vec<Vec<String>> = vec![
        vec![
            "weights".into(),
            c.weight_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "unknown".into()),
            c.weight_source.clone(),
        ],
        vec![
            "KV dtype".into(),
            c.kv_dtype.clone().unwrap_or_else(|| "unknown".into()),
            c.kv_dtype_source.clone(),
        ],
        vec![
            "KV bytes per token".into(),
            c.kv_bytes_per_token
                .map(|b| {
                    if b >= 1024 {
                        format!("{} B ({})", thousands(b), human_bytes(b))
                    } else {
                        format!("{b} B")
                    }
                })
                .unwrap_or_else(|| match &c.kv_not_modelled {
                    Some(_) => "not modelled".into(),
                    None => "unknown".into(),
                }),
            match (&c.kv_not_modelled, c.full_attention_layers) {
                (Some(why), _) => why.clone(),
                (None, Some(n)) => plural(n, "full-attention layer", "full-attention layers"),
                (None, None) => "unknown full-attention layers".into(),
            },
        ],
    ];
    if let (Some(b), Some(w)) = (c.sliding_bytes_per_token, c.sliding_window) {
        rows.push(vec![
            "sliding-window KV per token".into(),
            format!("{} B", thousands(b)),
            format!(
                "{}, each holding at most {} tokens per sequence",
                plural(
                    c.sliding_attention_layers,
                    "sliding-window layer",
                    "sliding-window layers"
                ),
                thousands(w)
            ),
        ]);
    }
    if c.linear_attention_layers > 0 {
        rows.push(vec![
            "recurrent state per sequence".into(),
            c.state_bytes_per_sequence
                .map(human_bytes)
                .unwrap_or_else(|| "unknown".into()),
            format!(
                "{}, fixed per sequence",
                plural(
                    c.linear_attention_layers,
                    "Gated-DeltaNet layer",
                    "Gated-DeltaNet layers"
                )
            ),
        ]);
    }
    rows.push(vec![
        "GPU memory".into(),
        c.gpu_memory_bytes
            .map(human_bytes)
            .unwrap_or_else(|| "unknown".into()),
        format!(
            "{}; utilization {}",
            c.gpu_memory_source
                .as_deref()
                .unwrap_or("no GPU and no --gpu-mem-gib"),
            c.gpu_memory_utilization
        ),
    ]);
    if let Some(b) = c.kv_budget_bytes {
        rows.push(vec![
            "KV budget".into(),
            match (b >= 0, c.fits) {
                (true, Some(false)) => format!("{} (does not fit)", human_bytes(b as u64)),
                (true, _) => human_bytes(b as u64),
                (false, _) => format!("−{} (does not fit)", human_bytes(b.unsigned_abs())),
            },
            format!(
                "memory × utilization − weights − reserve {}",
                human_bytes(c.reserve_bytes)
            ),
        ]);
    }
    rows.push(vec![
        "predicted KV tokens".into(),
        c.kv_tokens
            .map(thousands)
            .unwrap_or_else(|| "not computed".into()),
        if c.linear_attention_layers > 0 {
            "KV budget less one sequence's recurrent state, / KV bytes per token".into()
        } else {
            "KV budget / KV bytes per token".into()
        },
    ]);
    rows.push(vec![
        "predicted max concurrency".into(),
        c.max_concurrency
            .map(|x| format!("{}x", crate::output::table::grouped(x, 2)))
            .unwrap_or_else(|| "not computed".into()),
        match (c.max_model_len, &c.max_model_len_source) {
            (Some(l), Some(s)) => format!("at {} tokens per request ({s})", thousands(l)),
            _ => "no max_model_len".into(),
        },
    ]);
    o.push_str(&markdown_table(&["figure", "value", "basis"], &rows));
    o.push('\n');
    for n in &c.not_computed {
        o.push_str(&format!("- not computed: {n}\n"));
    }
    for a in &c.assumptions {
        o.push_str(&format!("- assumption: {a}\n"));
    }
    o.push('\n');
}
