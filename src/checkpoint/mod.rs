//! Checkpoint inspection from metadata alone: config.json, hf_quant_config.json and safetensors
//! headers (never the weights); per-module formats with their evidence, lint findings, the
//! verdict of each format on a card, and predicted footprint and KV capacity.
//!
//! Entry points: [`inspect`] (a folder → [`InspectReport`]), [`render_markdown`] (the terminal
//! output and the checkpoint section of `rigbench report`), [`InspectReport::has_errors`]
//! (the lint gate: `rigbench inspect` exits 4 when true).
//!
//! Which metadata file wins when both exist: vLLM reads config.json's `quantization_config`
//! and opens `hf_quant_config.json` only when config.json has none
//! (`vllm/transformers_utils/config.py`, `get_config`); TensorRT-LLM reads
//! `hf_quant_config.json` first (`tensorrt_llm/_torch/model_config.py`). The module table
//! follows vLLM; disagreements between the files are lint findings that name both rules.

pub mod capacity;
pub mod config;
pub mod format;
pub mod gguf;
pub mod gguf_inspect;
pub mod headers;
pub mod hub;
mod lint;
pub mod modules;
pub mod predict;
#[cfg(test)]
mod predict_sources;
pub mod quant;
mod render;
pub mod runtime;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub use capacity::{CapacityPrediction, KvCacheDtype};
pub use config::ModelFacts;
pub use format::ModuleFormat;
pub use headers::{ShardInfo, TensorMeta};
pub use lint::RULES as LINT_RULES;
pub use modules::LayerKind;
pub use quant::{QuantFact, QuantGroup, QuantSource, QuantSummary};
pub use render::render_markdown;

use crate::formats::GemmFormat;
use crate::gpu::ComputeCapability;
use crate::rig::{RigFacts, Support};
use crate::RigError;

use modules::{Module, TensorEvidence};
use quant::{Declared, ModClass, Rules};

/// Options of an inspection: the card to classify for and the capacity assumptions.
#[derive(Debug, Clone)]
pub struct InspectOptions {
    /// Compute capability to give card verdicts for; `None` skips them.
    pub cc: Option<ComputeCapability>,
    /// Where `cc` came from, for the report (`--cc`, or the probed card's name).
    pub card: Option<String>,
    /// Why there is no card (shown when `cc` is `None`).
    pub no_card_reason: Option<String>,
    /// GPU memory for the capacity prediction, bytes (`--gpu-mem-gib`, or the probed card).
    pub gpu_memory_bytes: Option<u64>,
    /// Where `gpu_memory_bytes` came from.
    pub gpu_memory_source: Option<String>,
    /// Fraction of GPU memory the engine may use (vLLM `--gpu-memory-utilization`), (0, 1].
    pub gpu_memory_utilization: f64,
    /// Tokens per request for the concurrency figure; `None` uses `max_position_embeddings`.
    pub max_model_len: Option<u64>,
    /// KV-cache dtype override; `None` takes the checkpoint's declaration or the model dtype.
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Memory assumed for activations, the CUDA-graph pool and the CUDA context, bytes.
    pub reserve_bytes: u64,
    /// Sequences whose Gated-DeltaNet state a hybrid reserves up front (`--max-num-seqs`: the
    /// built-in runtime's scheme, one state slot per sequence that may run); `None` reserves
    /// one sequence's state, as vLLM's allocator, which takes states from the shared pool as
    /// requests arrive.
    pub max_num_seqs: Option<u64>,
    /// The engine and version to predict "What will run" for (`--engine vllm==0.34`); `None`
    /// predicts nothing. The prediction needs `cc` too.
    pub engine: Option<predict::EngineSpec>,
}

/// Default reserve for activations, CUDA graphs and context: 1.5 GiB (an assumption; vLLM
/// measures it by profiling at startup).
pub const DEFAULT_RESERVE_BYTES: u64 = 3 * (1 << 29);

impl Default for InspectOptions {
    fn default() -> Self {
        Self {
            cc: None,
            card: None,
            no_card_reason: None,
            gpu_memory_bytes: None,
            gpu_memory_source: None,
            gpu_memory_utilization: 0.9,
            max_model_len: None,
            kv_cache_dtype: None,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            max_num_seqs: None,
            engine: None,
        }
    }
}

impl InspectOptions {
    /// Card and memory from a rig probe (what `rigbench report --checkpoint` passes).
    pub fn from_rig(rig: &RigFacts) -> Self {
        let mut o = Self::default();
        match &rig.gpu {
            Some(g) => {
                o.cc = g.compute_capability;
                o.card = Some(g.name.clone());
                if g.memory_bytes > 0 {
                    o.gpu_memory_bytes = Some(g.memory_bytes);
                    o.gpu_memory_source = Some(format!("{} (probed)", g.name));
                }
                if o.cc.is_none() {
                    o.no_card_reason = Some(format!(
                        "the probe of {} returned no compute capability",
                        g.name
                    ));
                }
            }
            None => {
                o.no_card_reason = Some(format!(
                    "no GPU found ({}) and no --cc given: card verdicts skipped",
                    rig.gpu_absent_reason.as_deref().unwrap_or("reason unknown")
                ));
            }
        }
        o
    }
}

/// Lint severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The checkpoint is broken or unsafe to serve as is; `rigbench inspect` exits 4.
    Error,
    /// Likely a problem; check it.
    Warning,
    /// Worth knowing.
    Info,
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        })
    }
}

/// One lint finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Rule id (e.g. `gdn-ab-quantized`).
    pub rule: String,
    /// Severity.
    pub severity: Severity,
    /// Why it matters, one sentence.
    pub why: String,
    /// What was found (formats, files, fields).
    pub detail: String,
    /// Modules hit, as name patterns (`*` for layer/expert indices) with their layers.
    pub modules: Vec<String>,
    /// Number of modules hit (experts counted one by one).
    pub module_count: u64,
}

/// A row of the per-module table: modules of one kind and name pattern in one format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleRow {
    /// Layer kind.
    pub kind: LayerKind,
    /// Module name pattern (`*` for layer and expert indices).
    pub module: String,
    /// Layers covered, e.g. `all 30 linear_attention layers` or `0-2, 4-6`.
    pub layers: String,
    /// Modules in the row (experts counted one by one).
    pub count: u64,
    /// Format.
    pub format: ModuleFormat,
    /// What the metadata declares and which file/field says so.
    pub declared: String,
    /// The tensors that show it (dtype, shape), or why there are none.
    pub evidence: String,
}

/// What the safetensors headers held.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorSummary {
    /// True when at least one header was read.
    pub headers_read: bool,
    /// Why tensor-level checks were skipped, when they were.
    pub skipped_reason: Option<String>,
    /// True when the file list came from `model.safetensors.index.json`.
    pub from_index: bool,
    /// True when only the index is here (no shard): tensor names without dtypes or shapes.
    #[serde(default)]
    pub names_only: bool,
    /// Per-file header facts.
    pub files: Vec<ShardInfo>,
    /// Tensors.
    pub tensor_count: usize,
    /// Bytes of all tensors.
    pub total_bytes: u64,
    /// Bytes per dtype.
    pub bytes_by_dtype: BTreeMap<String, u64>,
}

/// The verdict for one declared format on the card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatVerdict {
    /// The module format, in words.
    pub format: String,
    /// The GEMM format of the capability table it runs as, when one fits.
    pub gemm_format: Option<GemmFormat>,
    /// Modules in this format.
    pub modules: u64,
    /// Native / fallback / unsupported (from `crate::rig::capability`); `None` for formats
    /// outside the table (described in `path`).
    pub support: Option<Support>,
    /// What executes it.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// Card verdicts for the formats found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CardSection {
    /// The compute capability classified for.
    pub cc: Option<ComputeCapability>,
    /// Where it came from (`--cc`, or the probed card).
    pub card: Option<String>,
    /// Why verdicts were skipped.
    pub skipped: Option<String>,
    /// One verdict per distinct format.
    pub verdicts: Vec<FormatVerdict>,
}

/// The result of inspecting one checkpoint folder.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InspectReport {
    /// The folder as given.
    pub checkpoint: String,
    /// Metadata files read.
    pub files_read: Vec<String>,
    /// Model facts from config.json.
    pub model: ModelFacts,
    /// Quantization metadata found, each fact with its file.
    pub quantization: QuantSummary,
    /// safetensors headers.
    pub tensors: TensorSummary,
    /// Where the module list came from (headers, or inferred from config.json, or unknown).
    pub module_source: String,
    /// The per-module table, grouped by layer kind.
    pub modules: Vec<ModuleRow>,
    /// Tensors that are not GEMM weights (norms, biases, recurrent-state parameters).
    pub other_tensors: Option<String>,
    /// Lint findings, errors first.
    pub findings: Vec<Finding>,
    /// Verdict of each format on the card.
    pub card: CardSection,
    /// Predicted footprint and KV capacity (a prediction, with its assumptions).
    pub capacity: CapacityPrediction,
    /// "What will run" with `--engine`: per layer class, the kernel the engine selects, whether
    /// it is native, its warning and the rule's source ([`predict`]); absent without `--engine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_prediction: Option<Vec<predict::ClassPrediction>>,
    /// What `engine_prediction` is for: engine, version and card (`vLLM 0.34.0 on sm_121 (--cc)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_prediction_for: Option<String>,
}

impl InspectReport {
    /// True when any finding has error severity (`rigbench inspect` then exits 4).
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// Findings of one rule.
    pub fn findings_of(&self, rule: &str) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.rule == rule).collect()
    }

    /// What the engine prediction needs from this report: the linear modules grouped by class
    /// (MoE experts, everything else dense) and format, the attention and Gated-DeltaNet layers,
    /// and the KV-cache dtype (`kv_override` first, then the checkpoint's declaration).
    pub fn prediction_input(&self, kv_override: Option<KvCacheDtype>) -> predict::PredictInput {
        use predict::{LayerClass, LinearGroup};
        let mut linear: Vec<LinearGroup> = Vec::new();
        let mut gdn_formats: Vec<String> = Vec::new();
        for row in &self.modules {
            let class = match row.kind {
                LayerKind::MoeExperts => LayerClass::MoeExperts,
                LayerKind::Mlp
                | LayerKind::SharedExpert
                | LayerKind::FullAttention
                | LayerKind::LinearAttention => LayerClass::DenseLinear,
                _ => continue,
            };
            if row.kind == LayerKind::LinearAttention {
                let w = predict::quant_words(&row.format);
                if !gdn_formats.contains(&w) {
                    gdn_formats.push(w);
                }
            }
            let label = row.kind.label();
            match linear
                .iter_mut()
                .find(|g| g.class == class && g.format == row.format)
            {
                Some(g) => {
                    if !g.modules.split(", ").any(|m| m == label) {
                        g.modules = format!("{}, {label}", g.modules);
                    }
                }
                None => linear.push(LinearGroup {
                    class,
                    format: row.format.clone(),
                    modules: label.to_string(),
                }),
            }
        }
        let kv_cache = match kv_override {
            Some(KvCacheDtype::Fp8) => Some("FP8".to_string()),
            Some(_) => None,
            None => self
                .quantization
                .sources
                .iter()
                .find_map(|s| s.kv_cache.clone()),
        };
        predict::PredictInput {
            linear,
            attention: self.model.full_attention_layers != Some(0),
            gdn_layers: self.model.linear_attention_layers,
            gdn_projections: (!gdn_formats.is_empty()).then(|| gdn_formats.join(" + ")),
            kv_cache,
            kv_from_flag: kv_override.is_some(),
            quant_method: self.quantization_method(),
        }
    }

    /// The checkpoint's quantization method for the engine rules: `compressed-tensors` or
    /// `modelopt` when a metadata file says so (a ModelOpt producer counts), else the first
    /// file's method; `None` without quantization metadata.
    pub fn quantization_method(&self) -> Option<String> {
        let srcs = &self.quantization.sources;
        let has = |w: &str| {
            srcs.iter().any(|s| {
                s.quant_method.contains(w) || s.producer.as_deref().is_some_and(|p| p.contains(w))
            })
        };
        if has("compressed") {
            Some("compressed-tensors".into())
        } else if has("modelopt") {
            Some("modelopt".into())
        } else {
            srcs.first().map(|s| s.quant_method.clone())
        }
    }

    /// Rewrite the strings copied from the checkpoint and the command line (the folder or hub
    /// reference, file names, module names and patterns, metadata values, the findings'
    /// details that quote them) with `redact`, and leave rigbench's own text (capacity
    /// assumptions, verdicts, `KV bytes per token = …`) as written.
    pub fn redact_inputs(&mut self, redact: &dyn Fn(&str) -> String) {
        self.checkpoint = redact(&self.checkpoint);
        for src in &mut self.quantization.sources {
            if let Some(p) = src.producer.as_mut() {
                *p = redact(p);
            }
            for e in &mut src.exclude {
                *e = redact(e);
            }
            for g in &mut src.groups {
                for t in &mut g.sample_targets {
                    *t = redact(t);
                }
            }
        }
        for fact in &mut self.quantization.facts {
            fact.value = redact(&fact.value);
        }
        for f in &mut self.tensors.files {
            f.file = redact(&f.file);
        }
        for r in &mut self.modules {
            r.module = redact(&r.module);
            r.declared = redact(&r.declared);
        }
        for f in &mut self.findings {
            f.detail = redact(&f.detail);
            for m in &mut f.modules {
                *m = redact(m);
            }
        }
    }
}

/// One module with everything known about it.
#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub m: Module,
    /// What the followed metadata declares.
    pub declared: Declared,
    /// What the other metadata file declares, when there are two.
    pub other: Option<Declared>,
    /// What the tensors show.
    pub ev: Option<TensorEvidence>,
    /// The format shown and linted.
    pub effective: ModuleFormat,
    /// Disagreements between metadata and tensors, and tensor problems.
    pub problems: Vec<String>,
}

/// Are a declared format and a tensor-derived one the same kind of thing?
fn compatible(declared: &ModuleFormat, tensor: &ModuleFormat) -> bool {
    use ModuleFormat::*;
    matches!(
        (declared, tensor),
        (Bf16 | F16 | F32, Bf16 | F16 | F32)
            | (Fp8 { .. }, Fp8 { .. })
            | (Nvfp4 { .. }, Nvfp4 { .. })
            | (Mxfp4, Mxfp4)
            | (Int8, Int8)
            | (Int4 { .. }, Int4 { .. })
            | (Other { .. }, _)
    )
}

fn unquantized(why: &str) -> Declared {
    Declared {
        format: ModuleFormat::Bf16,
        why: why.to_string(),
        excluded: false,
    }
}

/// Inspect the checkpoint folder `dir`.
///
/// Reads `config.json` (required), `hf_quant_config.json` and the safetensors headers (single
/// file or sharded via `model.safetensors.index.json`) when present. Without safetensors it
/// classifies from metadata and says that tensor-level checks were skipped.
///
/// # Errors
/// Missing folder or config.json; malformed JSON or non-UTF-8 bytes in any metadata file; a
/// field of the wrong type; a malformed or truncated safetensors header; an index naming a
/// missing shard. Each error names the file.
pub fn inspect(dir: &Path, opts: &InspectOptions) -> anyhow::Result<InspectReport> {
    check_inspect_input(dir, opts)?;
    let cfg = crate::model::ConfigFile::read(dir)?;
    inspect_body(dir, &cfg, opts)
}

/// [`inspect`] with `config.json` already read (the runtime's loader reads it once per load:
/// [`crate::model::ConfigFile`]).
///
/// # Errors
/// As [`inspect`].
pub fn inspect_parsed(
    dir: &Path,
    cfg: &crate::model::ConfigFile,
    opts: &InspectOptions,
) -> anyhow::Result<InspectReport> {
    check_inspect_input(dir, opts)?;
    inspect_body(dir, cfg, opts)
}

fn inspect_body(
    dir: &Path,
    cfg: &crate::model::ConfigFile,
    opts: &InspectOptions,
) -> anyhow::Result<InspectReport> {
    let mut report = InspectReport {
        checkpoint: dir.display().to_string(),
        ..Default::default()
    };
    let root = &cfg.root;
    let facts = config::parse_model_facts(root, &cfg.path)
        .with_context(|| format!("reading {}", cfg.path.display()))?;
    report.files_read.push("config.json".into());
    let cfg_path = dir.join("config.json");
    let cfg_q = quant::parse_config_quant(root, &cfg_path)?;
    let hf_path = dir.join("hf_quant_config.json");
    let hf_q = if hf_path.exists() {
        let obj = config::read_json_object(&hf_path)?;
        report.files_read.push("hf_quant_config.json".into());
        Some(quant::parse_hf_quant_config(&obj, &hf_path)?)
    } else {
        None
    };
    report.quantization = quant::summarize(cfg_q.as_ref(), hf_q.as_ref());
    let (followed, other): (Option<&Rules>, Option<&Rules>) = match (&cfg_q, &hf_q) {
        (Some(c), Some(h)) => (Some(&c.0), Some(&h.0)),
        (Some(c), None) => (Some(&c.0), None),
        (None, Some(h)) => (Some(&h.0), None),
        (None, None) => (None, None),
    };

    let hdrs = headers::read_checkpoint(dir)
        .with_context(|| format!("reading safetensors headers in {}", dir.display()))?;
    if let Some(h) = &hdrs {
        if h.from_index {
            report
                .files_read
                .push("model.safetensors.index.json".into());
        }
        report.tensors = tensor_summary(h);
    } else {
        report.tensors.skipped_reason = Some(
            "no safetensors headers found (no *.safetensors file, no model.safetensors.index.json): tensor-level checks skipped; formats come from the metadata alone".into(),
        );
    }

    // The module list.
    let (module_list, module_source, inventory_error) =
        module_list(hdrs.as_ref(), followed, other, &facts);
    report.module_source = module_source;

    // Resolve every module.
    let no_meta = format!(
        "no quantization metadata: model dtype {}",
        facts.dtype.as_deref().unwrap_or("(unstated)")
    );
    let mut recs: Vec<Rec> = Vec::new();
    let mut other_count = 0usize;
    let mut other_bytes = 0u64;
    for m in module_list {
        if !m.is_gemm_like() {
            other_count += m.tensors.len();
            other_bytes += m.bytes();
            continue;
        }
        recs.push(resolve_module(m, followed, other, &no_meta));
    }
    if other_count > 0 {
        report.other_tensors = Some(format!(
            "{} that {} not GEMM weights (norms, biases, recurrence parameters such as A_log and dt_bias, KV scales), {}",
            crate::output::table::plural(other_count as u64, "tensor", "tensors"),
            if other_count == 1 { "is" } else { "are" },
            crate::output::table::human_bytes(other_bytes)
        ));
    }

    report.modules = if recs.is_empty() {
        rows_from_rules(followed)
    } else {
        group_rows(&recs, &facts)
    };
    let formats: Vec<(ModuleFormat, u64)> = if recs.is_empty() {
        report
            .modules
            .iter()
            .map(|r| (r.format.clone(), r.count))
            .collect()
    } else {
        recs.iter()
            .map(|r| (r.effective.clone(), r.m.multiplicity.max(1)))
            .collect()
    };
    report.card = card_section(&formats, opts);
    report.capacity = capacity::predict(&facts, &recs, followed, other, hdrs.as_ref(), opts);
    let runtime_refusal = runtime::support(&cfg.runtime, &report.modules).err();
    report.findings = lint::run(&lint::LintInput {
        facts: &facts,
        recs: &recs,
        followed,
        other,
        headers: hdrs.as_ref(),
        inventory_error: inventory_error.as_deref(),
        card: &report.card,
        runtime: runtime_refusal.as_ref(),
    });
    if let Some(f) = lint::does_not_fit(&report.capacity) {
        // Errors come first.
        report.findings.insert(0, f);
    }
    report.model = facts;
    if let (Some(engine), Some(cc)) = (&opts.engine, opts.cc) {
        let p = predict::predict(
            engine,
            cc.as_int(),
            &report.prediction_input(opts.kv_cache_dtype),
        );
        report.engine_prediction_for = Some(format!(
            "{} on {} ({})",
            p.engine,
            p.cc,
            opts.card.as_deref().unwrap_or("card")
        ));
        report.engine_prediction = Some(p.rows);
    }
    Ok(report)
}

/// Refuse a `dir` that is not a folder and a `--gpu-memory-utilization` outside (0, 1].
fn check_inspect_input(dir: &Path, opts: &InspectOptions) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(RigError::file(dir, "not a folder; give the checkpoint folder").into())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RigError::file(dir, "checkpoint folder not found").into())
        }
        Err(e) => return Err(RigError::file(dir, format!("cannot open folder: {e}")).into()),
    }
    if !(opts.gpu_memory_utilization > 0.0 && opts.gpu_memory_utilization <= 1.0) {
        return Err(RigError::flag(
            "--gpu-memory-utilization",
            format!("{} is not in (0, 1]", opts.gpu_memory_utilization),
        )
        .into());
    }
    Ok(())
}

/// What the safetensors headers (or an index alone) say about the tensors: files, counts,
/// bytes by dtype.
fn tensor_summary(h: &headers::Headers) -> TensorSummary {
    TensorSummary {
        headers_read: !h.names_only,
        skipped_reason: h.names_only.then(|| {
            format!(
                "dtypes unknown without the shard headers: model.safetensors.index.json names {} tensors in {} shard(s), none of them here; module names and scale tensors come from the index, dtypes, shapes and bytes do not",
                h.tensors.len(),
                h.shards.len()
            )
        }),
        names_only: h.names_only,
        from_index: h.from_index,
        files: h.shards.clone(),
        tensor_count: h.tensors.len(),
        total_bytes: if h.names_only {
            h.index_total_size.unwrap_or(0)
        } else {
            h.tensors.iter().map(|t| t.bytes).sum()
        },
        bytes_by_dtype: h.tensors.iter().fold(BTreeMap::new(), |mut m, t| {
            *m.entry(t.dtype.clone()).or_insert(0) += t.bytes;
            m
        }),
    }
}

/// The checkpoint's modules: from the tensors when there are headers, else inferred from
/// config.json. Returns them with where they came from (the report's `module_source`) and,
/// when they could not be listed, why.
fn module_list(
    hdrs: Option<&headers::Headers>,
    followed: Option<&Rules>,
    other: Option<&Rules>,
    facts: &ModelFacts,
) -> (Vec<Module>, String, Option<String>) {
    match hdrs {
        Some(h) => {
            let plural = crate::output::table::plural;
            let source = if h.names_only {
                format!(
                    "model.safetensors.index.json weight map ({} in {} not downloaded)",
                    plural(h.tensors.len() as u64, "tensor name", "tensor names"),
                    plural(h.shards.len() as u64, "shard", "shards")
                )
            } else {
                format!(
                    "safetensors headers ({} in {})",
                    plural(h.tensors.len() as u64, "tensor", "tensors"),
                    plural(h.shards.len() as u64, "file", "files")
                )
            };
            (
                modules::modules_from_tensors(&h.tensors, facts),
                source,
                None,
            )
        }
        None => {
            let names: Vec<&str> = followed
                .into_iter()
                .chain(other)
                .flat_map(|r| {
                    r.layers
                        .keys()
                        .map(String::as_str)
                        .chain(r.exclude.iter().map(|p| p.raw()))
                })
                .collect();
            let prefix = modules::lm_prefix(facts, &names);
            match modules::modules_from_config(facts, &prefix) {
                Ok(v) => (
                    v,
                    format!(
                        "inferred from config.json ({} architecture, module prefix '{prefix}'): no safetensors headers, so names and shapes follow the transformers modeling code",
                        facts.lm_model_type().unwrap_or("?")
                    ),
                    None,
                ),
                Err(reason) => (
                    Vec::new(),
                    format!("unknown: {reason}; the table lists the metadata's rules instead"),
                    Some(reason),
                ),
            }
        }
    }
}

/// One GEMM-like module with what the metadata declares (`no_meta` without metadata), what
/// its tensors show, and the format shown and linted.
fn resolve_module(
    m: Module,
    followed: Option<&Rules>,
    other: Option<&Rules>,
    no_meta: &str,
) -> Rec {
    let declared = match followed {
        Some(r) => r.resolve(&m.name, m.class),
        None => unquantized(no_meta),
    };
    let other_d = other.map(|r| r.resolve(&m.name, m.class));
    let ev = if m.tensors.is_empty() {
        None
    } else {
        modules::evidence(&m)
    };
    let mut problems = Vec::new();
    let effective = match &ev {
        Some(e) => effective_format(&m, &declared, e, &mut problems),
        None => declared.format.clone(),
    };
    Rec {
        m,
        declared,
        other: other_d,
        ev,
        effective,
        problems,
    }
}

/// The format of a module with tensors: the declared one where the tensors agree (completed
/// from them), else the tensors'; each disagreement goes into `problems` after the tensors' own.
fn effective_format(
    m: &Module,
    declared: &Declared,
    e: &TensorEvidence,
    problems: &mut Vec<String>,
) -> ModuleFormat {
    problems.extend(e.problems.iter().cloned());
    let tensor_quantized = e.format.is_quantized();
    if m.class != ModClass::Linear && !declared.format.is_quantized() {
        // Not a quantizable layer: the tensors are the only word.
        e.format.clone()
    } else if compatible(&declared.format, &e.format) {
        if let (
            ModuleFormat::Nvfp4 {
                activations_4bit: true,
                ..
            },
            ModuleFormat::Nvfp4 {
                activations_4bit: false,
                ..
            },
        ) = (&declared.format, &e.format)
        {
            problems.push(format!(
                "metadata declares {} ({}) but the module has no input scale for 4-bit activations",
                declared.format, declared.why
            ));
        }
        if let ModuleFormat::Fp8 { activations, .. } = &declared.format {
            if activations == "static" && !m.tensors.contains_key("input_scale") {
                problems.push(format!(
                    "metadata declares {} ({}) but there is no input_scale tensor",
                    declared.format, declared.why
                ));
            }
        }
        match (&declared.format, &e.format) {
            (
                ModuleFormat::Nvfp4 {
                    activations_4bit, ..
                },
                ModuleFormat::Nvfp4 { group_size, .. },
            ) => ModuleFormat::Nvfp4 {
                activations_4bit: *activations_4bit,
                group_size: *group_size,
            },
            (
                ModuleFormat::Fp8 {
                    scaling: ds,
                    activations,
                },
                ModuleFormat::Fp8 { scaling: ts, .. },
            ) => ModuleFormat::Fp8 {
                scaling: if ts == "unknown" || ts == "no scale" {
                    ds.clone()
                } else {
                    ts.clone()
                },
                activations: activations.clone(),
            },
            (d, t) if !d.is_quantized() => t.clone(),
            (d, _) => d.clone(),
        }
    } else {
        problems.push(format!(
            "metadata declares {} ({}) but the tensors are {}{}",
            declared.format,
            declared.why,
            e.format,
            if tensor_quantized && !declared.format.is_quantized() {
                ": an engine following the metadata would load quantized bytes as unquantized weights"
            } else if !tensor_quantized {
                ": the engine expects quantized tensors and scales that are not there"
            } else {
                ""
            }
        ));
        e.format.clone()
    }
}

/// Group module records into table rows.
fn group_rows(recs: &[Rec], facts: &ModelFacts) -> Vec<ModuleRow> {
    struct Acc {
        first: usize,
        layers: BTreeSet<u32>,
        count: u64,
        evidence: String,
    }
    let norm = |s: &str| modules::name_pattern(s);
    let mut groups: BTreeMap<(LayerKind, String, ModuleFormat, String), Acc> = BTreeMap::new();
    for (i, r) in recs.iter().enumerate() {
        let evidence = match &r.ev {
            Some(e) => e.evidence.clone(),
            None if r.m.tensors.is_empty() => "no safetensors headers".into(),
            None => "no weight tensor".into(),
        };
        let key = (
            r.m.kind,
            modules::name_pattern(&r.m.name),
            r.effective.clone(),
            norm(&r.declared.why),
        );
        let acc = groups.entry(key).or_insert(Acc {
            first: i,
            layers: BTreeSet::new(),
            count: 0,
            evidence: evidence.clone(),
        });
        if let Some(l) = r.m.layer {
            acc.layers.insert(l);
        }
        acc.count += r.m.multiplicity.max(1);
        if acc.evidence != evidence && !acc.evidence.ends_with("(varies)") {
            acc.evidence.push_str(" (varies)");
        }
    }
    let mut rows: Vec<(LayerKind, usize, ModuleRow)> = groups
        .into_iter()
        .map(|((kind, pattern, format, declared), acc)| {
            let layers = describe_layers(kind, &pattern, &acc.layers, facts);
            (
                kind,
                acc.first,
                ModuleRow {
                    kind,
                    module: pattern,
                    layers,
                    count: acc.count,
                    format,
                    declared,
                    evidence: acc.evidence,
                },
            )
        })
        .collect();
    rows.sort_by_key(|r| (r.0, r.1));
    rows.into_iter().map(|r| r.2).collect()
}

fn describe_layers(
    kind: LayerKind,
    pattern: &str,
    layers: &BTreeSet<u32>,
    f: &ModelFacts,
) -> String {
    if layers.is_empty() {
        return "-".into();
    }
    let decoder =
        !matches!(kind, LayerKind::Mtp | LayerKind::Vision) && pattern.contains("layers.*");
    if decoder {
        if let Some(n) = f.num_hidden_layers {
            let all: BTreeSet<u32> = (0..n as u32).collect();
            if *layers == all && n > 1 {
                return format!("all {n} layers");
            }
            if !f.layer_types.is_empty() {
                for ty in ["linear_attention", "full_attention"] {
                    let of: BTreeSet<u32> = f
                        .layer_types
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| t.as_str() == ty)
                        .map(|(i, _)| i as u32)
                        .collect();
                    if of.len() > 1 && *layers == of {
                        return format!("all {} {ty} layers", of.len());
                    }
                }
            }
        }
    }
    modules::ranges(layers)
}

/// Table rows from the metadata's own rules, when module names are unknown.
fn rows_from_rules(rules: Option<&Rules>) -> Vec<ModuleRow> {
    let Some(r) = rules else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    let ev = "no safetensors headers; module names unknown".to_string();
    let mut by_pattern: BTreeMap<(String, ModuleFormat), (u64, String)> = BTreeMap::new();
    for (name, (fmt, algo, _)) in &r.layers {
        let e = by_pattern
            .entry((modules::name_pattern(name), fmt.clone()))
            .or_insert((0, format!("{} quantized_layers: {algo}", r.file)));
        e.0 += 1;
    }
    for ((pattern, format), (count, declared)) in by_pattern {
        let (kind, _) = modules::classify(&pattern, &ModelFacts::default());
        rows.push(ModuleRow {
            kind,
            module: pattern,
            layers: "-".into(),
            count,
            format,
            declared,
            evidence: ev.clone(),
        });
    }
    for g in &r.groups {
        let targets: Vec<&str> = g.targets.iter().map(|t| t.raw()).collect();
        rows.push(ModuleRow {
            kind: LayerKind::Other,
            module: quant::summarize_list(
                &targets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ),
            layers: "-".into(),
            count: 0,
            format: g.format.clone(),
            declared: format!("{} config_groups.{}", r.file, g.name),
            evidence: ev.clone(),
        });
    }
    if let Some(g) = &r.global {
        rows.push(ModuleRow {
            kind: LayerKind::Other,
            module: "every Linear layer not excluded".into(),
            layers: "-".into(),
            count: 0,
            format: g.clone(),
            declared: format!("{} quant_algo {}", r.file, r.algo.as_deref().unwrap_or("?")),
            evidence: ev.clone(),
        });
    }
    if !r.exclude.is_empty() {
        let ex: Vec<String> = r.exclude.iter().map(|p| p.raw().to_string()).collect();
        rows.push(ModuleRow {
            kind: LayerKind::Other,
            module: quant::summarize_list(&ex),
            layers: "-".into(),
            count: 0,
            format: ModuleFormat::Bf16,
            declared: format!("{} exclude/ignore list", r.file),
            evidence: ev,
        });
    }
    rows
}

/// MXFP4 (OCP MX: E2M1 weights, an E8M0 scale per 32, as gpt-oss ships its MoE experts) on a
/// card: native on FP4 tensor cores (sm_100 and up: `tcgen05.mma kind::mxf4` on sm_100/sm_103,
/// `mma.sync … kind::mxf4` with block scales on sm_12x; PTX ISA), weight-only below (the
/// 4-bit weights dequantized to BF16 in a Marlin or Triton kernel: vLLM's Marlin MXFP4 MoE from
/// sm_80, Triton `matmul_ogs` on sm_90), none below sm_80. Older vLLM refused MXFP4 below its
/// minimum capability (`quantization method mxfp4 is not supported for the current GPU.
/// Minimum capability: 100`, see `docs/diagnose.md`).
pub fn mxfp4_verdict(cc: ComputeCapability) -> (Support, String, String) {
    let n = cc.as_int();
    if n >= 100 {
        (
            Support::Native,
            if cc.major == 12 {
                "FP4 tensor cores (mma.sync block_scale kind::mxf4, E8M0 scales per 32)".into()
            } else {
                "FP4 tensor cores (tcgen05.mma kind::mxf4, E8M0 scales per 32)".into()
            },
            format!(
                "{cc} has FP4 tensor cores (sm_100 and up); the engine runs MXFP4 natively when its build ships MXFP4 kernels for this card (vLLM: FlashInfer TRT-LLM / CUTLASS MoE on sm_100/sm_103; sm_12x builds may still fall back to Marlin, which the engine log names)"
            ),
        )
    } else if n >= 80 {
        (
            Support::Fallback,
            "weight-only: E2M1 weights dequantized to BF16 in the kernel (Marlin MXFP4, or Triton matmul_ogs on sm_90), BF16 activations".into(),
            format!(
                "{cc} has no FP4 tensor cores (they start at sm_100); engines dequantize MXFP4 weights (vLLM versions that required sm_100 for mxfp4 refuse it here)"
            ),
        )
    } else {
        (
            Support::Unsupported,
            "none".into(),
            format!("{cc} has no FP4 tensor cores, and the weight-only MXFP4 kernels need sm_80"),
        )
    }
}

/// Verdicts of the formats found on the card.
fn card_section(formats: &[(ModuleFormat, u64)], opts: &InspectOptions) -> CardSection {
    let mut s = CardSection {
        cc: opts.cc,
        card: opts.card.clone(),
        ..Default::default()
    };
    let Some(cc) = opts.cc else {
        s.skipped = Some(opts.no_card_reason.clone().unwrap_or_else(|| {
            "no GPU and no --cc given: card verdicts skipped (pass --cc sm_90 to classify for a card)".into()
        }));
        return s;
    };
    let mut counts: BTreeMap<ModuleFormat, u64> = BTreeMap::new();
    for (f, n) in formats {
        *counts.entry(f.clone()).or_insert(0) += n;
    }
    for (fmt, n) in counts {
        let v = match fmt.gemm_format() {
            Some(g) => {
                let c = crate::rig::capability::capability(cc, g);
                FormatVerdict {
                    format: fmt.to_string(),
                    gemm_format: Some(g),
                    modules: n,
                    support: Some(c.support),
                    path: c.path,
                    reason: c.reason,
                }
            }
            None if fmt == ModuleFormat::Mxfp4 => {
                let (support, path, reason) = mxfp4_verdict(cc);
                FormatVerdict {
                    format: fmt.to_string(),
                    gemm_format: None,
                    modules: n,
                    support: Some(support),
                    path,
                    reason,
                }
            }
            None => FormatVerdict {
                format: fmt.to_string(),
                gemm_format: None,
                modules: n,
                support: None,
                path: fmt.plain_verdict().to_string(),
                reason:
                    "no GEMM format of rigbench's capability table fits; described, not classified"
                        .into(),
            },
        };
        s.verdicts.push(v);
    }
    s
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kinds;
