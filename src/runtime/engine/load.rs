//! Building an engine from a [`ServeConfig`]: the model (synthesized, a checkpoint folder or a
//! GGUF file), the backend, the tokenizer and chat template, and the KV cache plan.

use super::*;

/// `--max-num-seqs` when not given (vLLM's default).
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;

/// Why prefix caching is off for a Gated-DeltaNet hybrid (printed at start when it was asked for).
pub const HYBRID_NO_PREFIX_CACHING: &str = "prefix caching off for this hybrid: a cached prefix holds the KV of its full-attention layers but not the Gated-DeltaNet state after it, so a hit could not be resumed (the runtime does not snapshot the state at block boundaries)";

/// Everything [`load`] builds.
pub struct Loaded {
    /// The engine, not yet running.
    pub engine: Engine,
    /// Facts.
    pub info: EngineInfo,
    /// Tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat template.
    pub template: Arc<ChatTemplate>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

pub(super) fn read_generation_eos(dir: &std::path::Path) -> anyhow::Result<Vec<u32>> {
    let p = dir.join("generation_config.json");
    if !p.is_file() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(&p).map_err(|e| RigError::file(&p, format!("cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RigError::file(&p, format!("not valid JSON: {e}")))?;
    Ok(match v.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    })
}

/// Load weights, tokenizer and template for `config`, build the backend for `config.device`
/// (CPU: weights on the host; CUDA: [`CudaBackend::load`], synthetic presets generated and
/// `--quantize` applied on the GPU), plan the KV cache from the backend's memory facts
/// ([`crate::runtime::memory::plan_kv`]) and build the engine.
///
/// # Errors
/// [`RigError::BadFlag`] / [`RigError::BadFile`] naming the flag or file at fault (unknown
/// preset, missing checkpoint files, a checkpoint the runtime refuses — with `inspect`'s
/// finding id —, a KV budget too small for `max_model_len`, ...); a GPU backend that cannot
/// load (its reason) or cannot allocate the KV cache (asked and free sizes).
pub fn load(config: &ServeConfig) -> anyhow::Result<Loaded> {
    config.validate()?;
    let source = config.source()?;
    let mut notes: Vec<String> = Vec::new();
    // The shape, tokenizer, template and provenance; a checkpoint is mapped (headers only
    // read) and its format resolved here, before any weight is touched.
    let ModelParts {
        config: mc,
        tokenizer,
        template,
        provenance,
        mapped,
        gguf_weights,
    } = read_model(config, &source, &mut notes)?;
    let max_model_len = check_load_flags(config, mapped.as_ref(), &mc)?;
    let backend = build_backend(config, &source, &mc, mapped, gguf_weights, max_model_len)?;
    let memory = backend.device_memory();
    let hybrid = backend.config().is_hybrid();
    let enable_prefix_caching = config.enable_prefix_caching && !hybrid;
    if hybrid {
        if config.enable_prefix_caching {
            notes.push(HYBRID_NO_PREFIX_CACHING.to_string());
        }
        if config.speculative.is_some() && !backend.supports_state_rollback() {
            return Err(RigError::flag(
                "--spec-method",
                format!(
                    "n-gram speculation on a Gated-DeltaNet hybrid needs the recurrent state rolled back to the last accepted draft, which the {} backend does not implement; run without --spec-method (or on --device cpu)",
                    backend.name()
                ),
            )
            .into());
        }
    }
    let plan = plan_kv(
        config,
        backend.as_ref(),
        memory.as_ref(),
        max_model_len,
        hybrid,
    )?;
    let capacity = plan.capacity();
    let mc = backend.config().clone();
    let kv = KvCacheSpec {
        num_blocks: capacity.num_blocks,
        block_size: config.block_size,
        dtype: config.kv_cache_dtype,
    };
    let device_kind = backend.name().to_string();
    let info = EngineInfo {
        served_model_name: config.served_name().to_string(),
        model: config.model.clone(),
        backend: device_kind.clone(),
        device: backend.device_label(),
        provenance,
        model_config: mc.clone(),
        weight_format: backend.weight_format(),
        weight_bytes: backend.weight_bytes(),
        capacity,
        kv,
        kv_plan: plan.clone(),
        enable_prefix_caching,
        spec: config.speculative.clone(),
        tokenizer_source: tokenizer.source.clone(),
        template_source: template.source.clone(),
        notes,
    };
    let metrics = Arc::new(Metrics::new(
        config.served_name(),
        CacheInfo {
            block_size: config.block_size,
            num_blocks: capacity.num_blocks,
            device_kind: device_kind.clone(),
            gpu_memory_utilization: plan.gpu_memory_utilization,
            cache_dtype: config.kv_cache_dtype.vllm_name().into(),
            enable_prefix_caching,
        },
        max_model_len,
        config
            .speculative
            .as_ref()
            .map(|s| s.num_speculative_tokens),
    ));
    let tokenizer = Arc::new(tokenizer);
    let engine = Engine::new(
        backend,
        tokenizer.clone(),
        EngineConfig {
            scheduler: SchedulerConfig {
                // A hybrid runs at most as many sequences as it has state slots.
                max_num_seqs: if hybrid {
                    plan.state_slots
                } else {
                    config.max_num_seqs
                },
                max_num_batched_tokens: config.max_num_batched_tokens,
            },
            kv,
            max_model_len,
            enable_prefix_caching,
            spec: config.speculative.clone(),
            seed: config.seed,
        },
        metrics.clone(),
    )
    .map_err(|e| match &memory {
        Some(m) => anyhow::anyhow!(crate::runtime::memory::kv_alloc_failure(
            plan.budget_bytes,
            m.free_after_load,
            &info.device,
            &format!("{e:#}"),
        )),
        None => e,
    })?;
    Ok(Loaded {
        engine,
        info,
        tokenizer,
        template: Arc::new(template),
        metrics,
    })
}

/// Refuse `--quantize` of a checkpoint stored in another format, and a `--max-model-len` beyond
/// the model's; returns the max model length.
pub(super) fn check_load_flags(
    config: &ServeConfig,
    mapped: Option<&MappedCheckpoint>,
    mc: &ModelConfig,
) -> anyhow::Result<usize> {
    let stored = mapped.map_or(WeightFormat::Bf16, MappedCheckpoint::format);
    if let Some(recipe) = config.quantize {
        if stored != WeightFormat::Bf16 && QuantRecipe::Uniform(stored) != recipe {
            return Err(RigError::flag(
                "--quantize",
                format!(
                    "the checkpoint is already {}; only BF16 weights can be quantized at load",
                    stored.id()
                ),
            )
            .into());
        }
    }
    let max_model_len = config.max_model_len.unwrap_or(mc.max_position_embeddings);
    if max_model_len > mc.max_position_embeddings {
        return Err(RigError::flag(
            "--max-model-len",
            format!(
                "{max_model_len} exceeds the model's max_position_embeddings ({})",
                mc.max_position_embeddings
            ),
        )
        .into());
    }
    Ok(max_model_len)
}

/// What [`read_model`] reads of a model before any weight is touched.
pub(super) struct ModelParts {
    config: ModelConfig,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    provenance: ModelProvenance,
    /// A checkpoint folder, mapped (headers read) with its format resolved.
    mapped: Option<MappedCheckpoint>,
    /// A GGUF file's weights, dequantized to BF16 while loading (both backends take them).
    gguf_weights: Option<crate::runtime::weights::ModelWeights>,
}

/// The shape, tokenizer, template and provenance of the model `source` names (a synthetic
/// preset, a checkpoint folder, a GGUF file), with the notes reading it gave.
pub(super) fn read_model(
    config: &ServeConfig,
    source: &ModelSource,
    notes: &mut Vec<String>,
) -> anyhow::Result<ModelParts> {
    let mut mapped = None;
    let mut gguf_weights: Option<crate::runtime::weights::ModelWeights> = None;
    let (mc, tokenizer, template, provenance) = match source {
        ModelSource::Synthetic(name) => {
            let mut mc = ModelConfig::preset(name)
                .ok_or_else(|| RigError::flag("--model", format!("unknown preset {name}")))?;
            if let Some(n) = config.num_layers {
                mc.num_layers = mc.num_layers.min(n);
            }
            let tok = Tokenizer::bytes(mc.vocab_size, &[])?;
            let prov = ModelProvenance::Synthetic {
                preset: name.clone(),
                seed: config.seed,
                num_layers: mc.num_layers,
            };
            (mc, tok, ChatTemplate::builtin(), prov)
        }
        ModelSource::Dir(dir) => {
            // config.json read and decoded once for the whole load (the runtime's reading and
            // the inspection the loader runs share it).
            let (file, hf) = crate::model::ConfigFile::read_for_runtime(&dir.join("config.json"))?;
            notes.extend(hf.warnings.iter().map(|w| format!("config.json: {w}")));
            let mut mc = hf.config;
            if let Some(n) = config.num_layers {
                mc.num_layers = mc.num_layers.min(n);
            }
            let m = MappedCheckpoint::open_parsed(dir, &mc, &file)?;
            for n in m.notes() {
                if !notes.contains(n) {
                    notes.push(n.clone());
                }
            }
            let prov = ModelProvenance::Checkpoint {
                path: dir.display().to_string(),
                content_hash: m.content_hash(),
            };
            let mut eos = mc.eos_token_ids.clone();
            eos.extend(read_generation_eos(dir)?);
            let tok = if dir.join("tokenizer.json").is_file() {
                Tokenizer::from_dir(dir, &eos)?
            } else {
                Tokenizer::bytes(mc.vocab_size, &eos).map_err(|e| {
                    RigError::file(
                        dir.join("config.json"),
                        format!(
                            "no tokenizer.json, and the byte-level fallback cannot be used: {e}"
                        ),
                    )
                })?
            };
            let tmpl = ChatTemplate::from_dir(dir, tok.bos_token.clone(), tok.eos_token.clone())?
                .unwrap_or_else(ChatTemplate::builtin);
            mapped = Some(m);
            (mc, tok, tmpl, prov)
        }
        ModelSource::Gguf(path) => {
            let m = crate::runtime::gguf_model::GgufModel::load(path, config.num_layers)?;
            notes.extend(m.notes.iter().cloned());
            let prov = ModelProvenance::Checkpoint {
                path: m.path.display().to_string(),
                content_hash: m.content_hash.clone(),
            };
            let (mc, tok, tmpl) = (m.config.clone(), m.tokenizer, m.template);
            gguf_weights = Some(m.weights);
            (mc, tok, tmpl, prov)
        }
    };
    Ok(ModelParts {
        config: mc,
        tokenizer,
        template,
        provenance,
        mapped,
        gguf_weights,
    })
}

/// The backend for `config.device`: on the CPU the weights on the host (synthesized with
/// progress lines, or read from the checkpoint; `--quantize` applied); on CUDA
/// [`CudaBackend::load`]. The mapped checkpoint is released before the weights are quantized
/// or uploaded.
pub(super) fn build_backend(
    config: &ServeConfig,
    source: &ModelSource,
    mc: &ModelConfig,
    mapped: Option<MappedCheckpoint>,
    mut gguf_weights: Option<crate::runtime::weights::ModelWeights>,
    max_model_len: usize,
) -> anyhow::Result<Box<dyn Backend>> {
    let backend: Box<dyn Backend> = match config.device {
        Device::Cpu => {
            let mut weights = match (&mapped, gguf_weights.take()) {
                (_, Some(w)) => w,
                (None, None) => {
                    // Large presets take minutes on a CPU: say how far synthesis is, as plain
                    // lines on stderr (a terminal is not needed), at most every 2 s.
                    let start = std::time::Instant::now();
                    let mut last = start;
                    let mut report = |done: usize, total: usize| {
                        let now = std::time::Instant::now();
                        if done > 0 && (now - last).as_secs_f64() >= 2.0 {
                            last = now;
                            eprintln!(
                                "rigbench serve: synthesizing weights: layer {done}/{total} ({:.0} s)",
                                (now - start).as_secs_f64()
                            );
                        }
                    };
                    crate::runtime::weights::synthesize_with_progress(mc, config.seed, &mut report)
                }
                (Some(m), None) => m.to_weights()?,
            };
            drop(mapped);
            if let Some(recipe) = config.quantize {
                weights.quantize_recipe(recipe)?;
            }
            let threads = config
                .num_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Box::new(CpuBackend::new(weights, threads))
        }
        Device::Cuda(ordinal) => {
            drop(mapped);
            let weights = match source {
                ModelSource::Synthetic(_) => WeightSource::Synthetic {
                    config: mc.clone(),
                    seed: config.seed,
                },
                ModelSource::Dir(dir) => WeightSource::Checkpoint {
                    dir: dir.clone(),
                    config: mc.clone(),
                },
                ModelSource::Gguf(_) => WeightSource::Host(Box::new(
                    gguf_weights.take().context("GGUF weights not loaded")?,
                )),
            };
            let b = CudaBackend::load(CudaLoadSpec {
                device: ordinal,
                weights,
                quantize: config.quantize,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_num_seqs: config.max_num_seqs,
                max_model_len,
                kv_dtype: config.kv_cache_dtype,
                block_size: config.block_size,
            })
            .with_context(|| format!("loading {} on cuda:{ordinal}", config.model))?;
            Box::new(b)
        }
    };
    Ok(backend)
}

/// The memory plan of the KV cache (and a hybrid's state slots) from the backend's memory
/// facts; its error names the flag that sets the budget.
pub(super) fn plan_kv(
    config: &ServeConfig,
    backend: &dyn Backend,
    memory: Option<&crate::runtime::backend::DeviceMemory>,
    max_model_len: usize,
    hybrid: bool,
) -> anyhow::Result<KvPlan> {
    let utilization = config
        .gpu_memory_utilization
        .unwrap_or(crate::runtime::memory::DEFAULT_GPU_MEMORY_UTILIZATION);
    let plan = crate::runtime::memory::plan_memory(
        backend.config(),
        memory,
        utilization,
        config.kv_cache_memory,
        config.block_size,
        config.kv_cache_dtype,
        max_model_len,
        config.gpu_memory_utilization.is_some(),
        hybrid.then(|| crate::runtime::memory::StateSpec {
            bytes_per_slot: backend.state_bytes_per_slot(),
            max_num_seqs: config.max_num_seqs,
        }),
    )
    .map_err(|e| {
        let flag = if config.kv_cache_memory.is_some() || memory.is_none() {
            "--kv-cache-memory"
        } else {
            "--gpu-memory-utilization"
        };
        RigError::flag(flag, e)
    })?;
    Ok(plan)
}
