//! Lint rules. Each finding names its rule id, a severity, one sentence of why, and the
//! modules it hits.
//!
//! | rule | severity |
//! |---|---|
//! | `gdn-ab-quantized` | error: Gated-DeltaNet `in_proj_a`/`in_proj_b`/`in_proj_ba` quantized |
//! | `mtp-4bit` | error: MTP draft-head modules in 4 bits |
//! | `mtp-not-excluded` | warning: MTP modules unquantized only by omission (no exclude/ignore entry) |
//! | `mtp-fp8` | info: MTP modules in FP8 |
//! | `mtp-weights-absent` | error: config declares MTP layers, the headers (or the index) hold no MTP tensor: MTP speculative decoding cannot load |
//! | `mtp-targeted-unquantized` | error: an MTP module a 4-bit rule targets is stored unquantized (no scales): the engine's 4-bit layer cannot load it |
//! | `mtp-fc-not-excluded` | warning (metadata only): no ignore entry matches `mtp.fc` while a 4-bit rule targets every `Linear`: check the weight map |
//! | `kv-fp8-no-scales` | warning: FP8 KV cache declared, no `k_scale`/`v_scale` tensors |
//! | `metadata-tensor-mismatch` | error: metadata and tensors disagree (missing scales, dtype, shapes) |
//! | `nvfp4-group-size` | error: NVFP4 with a group size other than 16 |
//! | `safetensors-truncated` | error: a file shorter than its header says |
//! | `index-mismatch` | error: index and shards disagree |
//! | `lm-head-quantized` | info |
//! | `embedding-quantized` | warning |
//! | `vision-quantized` | warning (4-bit) / info (FP8) |
//! | `config-disagreement` | warning (info for producer version): config.json vs hf_quant_config.json, or config_groups vs quantized_layers |
//! | `format-unsupported-on-card` / `format-fallback-on-card` | error / warning |
//! | `unknown-quant-method`, `bad-pattern` | warning |
//! | `no-safetensors` | info: tensor-level checks skipped |
//! | `runtime-unsupported` | info: rigbench's built-in runtime cannot run it (see `super::runtime`) |

use std::collections::{BTreeMap, BTreeSet};

use super::config::ModelFacts;
use super::format::ModuleFormat;
use super::headers::Headers;
use super::modules::{name_pattern, ranges, LayerKind};
use super::quant::{Method, Pattern, Rules};
use super::{CardSection, Finding, Rec, Severity};
use crate::rig::Support;

/// Every rule id this module can emit, in the order of the table above. `rigbench compare`
/// gives each one a label (`absent` when it did not fire) so that a rule firing where it did not
/// before is a regression rather than a new metric.
pub const RULES: &[&str] = &[
    "gdn-ab-quantized",
    "mtp-4bit",
    "mtp-not-excluded",
    "mtp-fp8",
    "mtp-weights-absent",
    "mtp-targeted-unquantized",
    "mtp-fc-not-excluded",
    "kv-fp8-no-scales",
    "metadata-tensor-mismatch",
    "nvfp4-group-size",
    "safetensors-truncated",
    "index-mismatch",
    "lm-head-quantized",
    "embedding-quantized",
    "vision-quantized",
    "config-disagreement",
    "format-unsupported-on-card",
    "format-fallback-on-card",
    "unknown-quant-method",
    "bad-pattern",
    "no-safetensors",
    "runtime-unsupported",
    "capacity-does-not-fit",
];

pub(crate) struct LintInput<'a> {
    pub facts: &'a ModelFacts,
    pub recs: &'a [Rec],
    pub followed: Option<&'a Rules>,
    pub other: Option<&'a Rules>,
    pub headers: Option<&'a Headers>,
    pub inventory_error: Option<&'a str>,
    pub card: &'a CardSection,
    /// Why the built-in runtime will not run the checkpoint (`super::runtime::support`).
    pub runtime: Option<&'a super::runtime::RuntimeRefusal>,
}

/// Module names → patterns with their layers, and the count (experts one by one).
fn collapse<'a>(recs: impl IntoIterator<Item = &'a Rec>) -> (Vec<String>, u64) {
    let mut by: BTreeMap<String, (BTreeSet<u32>, u64)> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut total = 0;
    for r in recs {
        let p = name_pattern(&r.m.name);
        if !by.contains_key(&p) {
            order.push(p.clone());
        }
        let e = by.entry(p).or_default();
        if let Some(l) = r.m.layer {
            e.0.insert(l);
        }
        e.1 += r.m.multiplicity.max(1);
        total += r.m.multiplicity.max(1);
    }
    let out = order
        .into_iter()
        .map(|p| {
            let (layers, _) = &by[&p];
            if layers.is_empty() || !p.contains('*') {
                p
            } else {
                format!("{p} (layers {})", ranges(layers))
            }
        })
        .collect();
    (out, total)
}

fn finding(
    rule: &str,
    severity: Severity,
    why: &str,
    detail: String,
    hits: Option<&[&Rec]>,
) -> Finding {
    let (modules, module_count) = match hits {
        Some(h) => collapse(h.iter().copied()),
        None => (Vec::new(), 0),
    };
    Finding {
        rule: rule.into(),
        severity,
        why: why.into(),
        detail,
        modules,
        module_count,
    }
}

/// The finding `capacity-does-not-fit` (an error) when the GPU memory given leaves no room for
/// the KV cache of even one sequence: memory × utilization − weights − reserve is not above one
/// sequence's recurrent state. `None` when it fits or was not computed.
pub(crate) fn does_not_fit(p: &super::capacity::CapacityPrediction) -> Option<Finding> {
    if p.fits != Some(false) {
        return None;
    }
    use crate::output::table::human_bytes;
    let budget = p.kv_budget_bytes.unwrap_or(0);
    let signed = if budget >= 0 {
        human_bytes(budget as u64)
    } else {
        format!("−{}", human_bytes(budget.unsigned_abs()))
    };
    Some(finding(
        "capacity-does-not-fit",
        Severity::Error,
        "the checkpoint does not fit: the GPU memory left after the weights and the reserve holds no KV cache, so an engine cannot start with it",
        format!(
            "GPU memory {} ({}) × utilization {} − weights {} − reserve {} = {signed}; use a card with more memory, a higher --gpu-memory-utilization or a smaller --reserve-gib",
            human_bytes(p.gpu_memory_bytes.unwrap_or(0)),
            p.gpu_memory_source.as_deref().unwrap_or("unknown source"),
            p.gpu_memory_utilization,
            p.weight_bytes.map(human_bytes).unwrap_or_else(|| "unknown".into()),
            human_bytes(p.reserve_bytes),
        ),
        None,
    ))
}

/// Distinct formats of a set of records, in words.
fn formats_of(recs: &[&Rec]) -> String {
    let set: BTreeSet<String> = recs.iter().map(|r| r.effective.to_string()).collect();
    set.into_iter().collect::<Vec<_>>().join(", ")
}

/// Distinct declaration sources, normalized.
fn formats_of_declared(recs: &[&Rec]) -> String {
    let set: BTreeSet<String> = recs
        .iter()
        .map(|r| format!("{} ({})", r.declared.format, r.declared.why))
        .collect();
    set.into_iter().collect::<Vec<_>>().join(", ")
}

fn sources_of(recs: &[&Rec]) -> String {
    let set: BTreeSet<String> = recs.iter().map(|r| name_pattern(&r.declared.why)).collect();
    let v: Vec<String> = set.into_iter().collect();
    if v.len() > 3 {
        format!("{} (and {} more)", v[..3].join("; "), v.len() - 3)
    } else {
        v.join("; ")
    }
}

const ENGINES: &str = "vLLM follows config.json when it has a quantization_config; TensorRT-LLM follows hf_quant_config.json";

/// Every lint rule over `inp`, findings sorted by severity (each rule is one `rule_*`
/// function below).
pub(crate) fn run(inp: &LintInput) -> Vec<Finding> {
    let mut out = Vec::new();
    rule_gdn_ab_quantized(inp, &mut out);
    rule_mtp(inp, &mut out);
    rule_kv_scales(inp, &mut out);
    rule_metadata_tensor_mismatch(inp, &mut out);
    rule_nvfp4_group_size(inp, &mut out);
    rule_lm_head_embeddings_vision(inp, &mut out);
    rule_config_disagreement(inp, &mut out);
    rule_card_verdicts(inp, &mut out);
    rule_uninterpreted_metadata(inp, &mut out);
    rule_tensor_checks_skipped(inp, &mut out);
    out.sort_by_key(|f| f.severity);
    out
}

/// The MTP linear modules a 4-bit rule targets but that are stored without scales (their own
/// finding in [`rule_mtp`]; left out of [`rule_metadata_tensor_mismatch`]).
fn mtp_targeted_plain(recs: &[Rec]) -> Vec<&Rec> {
    recs.iter()
        .filter(|r| r.m.kind == LayerKind::Mtp && r.m.class == super::quant::ModClass::Linear)
        .filter(|r| r.declared.format.is_4bit() && !r.effective.is_quantized())
        .collect()
}

/// The KV-cache format each quantization file declares: (file, format).
fn kv_declared(inp: &LintInput) -> Vec<(String, String)> {
    inp.followed
        .into_iter()
        .chain(inp.other)
        .filter_map(|r| r.kv.clone().map(|k| (r.file.clone(), k)))
        .collect()
}

/// Lint rule: the Gated-DeltaNet in_proj_a/in_proj_b projections quantized (`gdn-ab-quantized`).
fn rule_gdn_ab_quantized(inp: &LintInput, out: &mut Vec<Finding>) {
    let recs = inp.recs;
    // gdn-ab-quantized
    let ab: Vec<&Rec> = recs
        .iter()
        .filter(|r| {
            let last = r.m.name.rsplit('.').next().unwrap_or("");
            matches!(last, "in_proj_a" | "in_proj_b" | "in_proj_ba")
                && r.m.name.contains("linear_attn")
                && r.effective.is_quantized()
        })
        .collect();
    if !ab.is_empty() {
        out.push(finding(
            "gdn-ab-quantized",
            Severity::Error,
            "Gated-DeltaNet in_proj_a/in_proj_b produce the per-head decay and write gates of the recurrence; quantizing these small projections is known to damage quality (long context first) while aggregate benchmarks still pass, so they must stay BF16",
            format!("found {} ({})", formats_of(&ab), sources_of(&ab)),
            Some(&ab),
        ));
    }
}

/// Lint rule: the MTP draft head stored in 4 bits, in FP8, BF16 only by omission, targeted but stored plain, or left out of the metadata (`mtp-*`).
fn rule_mtp(inp: &LintInput, out: &mut Vec<Finding>) {
    let recs = inp.recs;
    // MTP
    let mtp: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.m.kind == LayerKind::Mtp && r.m.class == super::quant::ModClass::Linear)
        .collect();
    // Without tensors, a catch-all 4-bit rule (`Linear`, quant_algo) hitting an MTP module is an
    // inference about how the engine builds it, not proof that it is stored in 4 bits.
    let catch_all = |r: &Rec| {
        r.declared.why.contains("every Linear layer not excluded")
            || r.declared.why.ends_with("target 'Linear'")
    };
    let inferred4: Vec<&Rec> = mtp
        .iter()
        .copied()
        .filter(|r| inp.headers.is_none() && r.effective.is_4bit() && catch_all(r))
        .collect();
    mtp_stored_format(inp, &mtp, &inferred4, out);
    // An MTP module a 4-bit rule targets but stored without scales.
    let targeted_plain = mtp_targeted_plain(inp.recs);
    if !targeted_plain.is_empty() {
        out.push(finding(
            "mtp-targeted-unquantized",
            Severity::Error,
            "the metadata targets these MTP modules with a 4-bit format, but the weights are stored unquantized (no scale tensors): an engine builds a 4-bit layer for them and cannot load the plain weight, so MTP speculative decoding fails to load; add them to the ignore list",
            format!(
                "declared {}; the weight map has {}",
                formats_of_declared(&targeted_plain),
                targeted_plain
                    .iter()
                    .filter_map(|r| r.ev.as_ref().map(|e| e.evidence.clone()))
                    .next()
                    .unwrap_or_default()
            ),
            Some(&targeted_plain),
        ));
    }
    let declared_mtp = inp.facts.mtp_layers.unwrap_or(0);
    if mtp.is_empty() && declared_mtp > 0 {
        mtp_declared_but_absent(inp, declared_mtp, out);
    }
    mtp_fc_not_excluded(inp, &mtp, &inferred4, declared_mtp, out);
}

/// The MTP draft head's stored format: 4-bit (error), FP8 (info), or BF16 only because no
/// exclude/ignore entry of a quantized checkpoint names it (warning). `inferred4` are modules
/// only a catch-all rule makes 4-bit without tensors to prove it ([`mtp_fc_not_excluded`]).
fn mtp_stored_format(inp: &LintInput, mtp: &[&Rec], inferred4: &[&Rec], out: &mut Vec<Finding>) {
    let quantized_checkpoint = inp.followed.is_some();
    let mtp4: Vec<&Rec> = mtp
        .iter()
        .copied()
        .filter(|r| r.effective.is_4bit())
        .filter(|r| !inferred4.iter().any(|x| std::ptr::eq(*x, *r)))
        .collect();
    let mtp8: Vec<&Rec> = mtp
        .iter()
        .copied()
        .filter(|r| r.effective.is_fp8())
        .collect();
    if !mtp4.is_empty() {
        out.push(finding(
            "mtp-4bit",
            Severity::Error,
            "a 4-bit MTP draft head drafts tokens the main model rejects: acceptance collapses toward zero and speculative decoding becomes slower than none; keep mtp.* in BF16 (or FP8)",
            format!("found {} ({})", formats_of(&mtp4), sources_of(&mtp4)),
            Some(&mtp4),
        ));
    } else if !mtp8.is_empty() {
        out.push(finding(
            "mtp-fp8",
            Severity::Info,
            "an FP8 MTP draft head usually keeps acceptance close to BF16; measure the acceptance length if speculative decoding matters",
            format!("found {} ({})", formats_of(&mtp8), sources_of(&mtp8)),
            Some(&mtp8),
        ));
    } else if !mtp.is_empty() && quantized_checkpoint && !mtp.iter().any(|r| r.declared.excluded) {
        out.push(finding(
            "mtp-not-excluded",
            Severity::Warning,
            "the MTP draft head is BF16 only by omission: no exclude/ignore entry names it, so an engine or re-export that applies the checkpoint's default format would quantize it and collapse draft acceptance",
            format!(
                "no entry of {} matches the MTP modules; add 'mtp*' to it",
                inp.followed
                    .map(|r| format!("{}'s exclude/ignore list", r.file))
                    .unwrap_or_default()
            ),
            Some(mtp),
        ));
    }
}

/// config.json declares MTP layers but no module is an MTP module: with headers, the weights
/// are absent (error); with metadata only, no exclude/ignore entry names the MTP layers
/// (warning, naming the 4-bit rules that may hit them).
fn mtp_declared_but_absent(inp: &LintInput, declared_mtp: u64, out: &mut Vec<Finding>) {
    if let Some(h) = inp.headers {
        out.push(finding(
            "mtp-weights-absent",
            Severity::Error,
            "config.json declares MTP layers but the checkpoint holds no MTP tensor: MTP speculative decoding cannot load (an engine started with it fails, or the drafter is missing); use another checkpoint for MTP, or run without speculative decoding",
            format!(
                "{} = {declared_mtp}; no tensor name in {} looks like an MTP module (mtp.*)",
                inp.facts.mtp_field.as_deref().unwrap_or("mtp layers"),
                if h.names_only {
                    "model.safetensors.index.json's weight map"
                } else {
                    "the safetensors headers"
                }
            ),
            None,
        ));
    } else if let Some(r) = inp.followed {
        if !r.excludes_mtp_for(inp.facts) {
            let four_bit_rules: Vec<String> = r
                .groups
                .iter()
                .filter(|g| g.format.is_4bit())
                .map(|g| {
                    format!(
                        "{} ({}: {})",
                        g.name,
                        g.format,
                        g.targets
                            .iter()
                            .map(Pattern::raw)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .chain(
                    r.global
                        .iter()
                        .filter(|g| g.is_4bit())
                        .map(|g| format!("quant_algo {g}")),
                )
                .collect();
            out.push(finding(
                "mtp-not-excluded",
                Severity::Warning,
                "nothing in the exclude/ignore list names the MTP draft head, so it is quantized like the layers its module names resemble; a 4-bit draft head collapses draft acceptance",
                format!(
                    "config.json {} = {declared_mtp}; {}'s exclude/ignore list has no entry for the MTP layers ({}); without safetensors headers rigbench cannot tell which rules hit the MTP modules{}",
                    inp.facts.mtp_field.as_deref().unwrap_or("mtp layers"),
                    r.file,
                    match (inp.facts.mtp_field.as_deref(), inp.facts.num_hidden_layers) {
                        (Some("num_nextn_predict_layers"), Some(n)) => format!(
                            "they are model.layers.{n}{}: exclude them with 'model.layers.{n}*'",
                            if declared_mtp > 1 {
                                format!(" to {}", n + declared_mtp - 1)
                            } else {
                                String::new()
                            }
                        ),
                        _ => "they are mtp.*: exclude them with 'mtp*'".to_string(),
                    },
                    if four_bit_rules.is_empty() {
                        String::new()
                    } else {
                        format!("; 4-bit rules that may: {}", four_bit_rules.join("; "))
                    }
                ),
                None,
            ));
        }
    }
}

/// Metadata only: MTP modules (Qwen3.5/3.6 `mtp.fc`) that no ignore entry covers while a
/// catch-all 4-bit rule targets them.
fn mtp_fc_not_excluded(
    inp: &LintInput,
    mtp: &[&Rec],
    inferred4: &[&Rec],
    declared_mtp: u64,
    out: &mut Vec<Finding>,
) {
    if !inferred4.is_empty() {
        let r = inp.followed;
        out.push(finding(
            "mtp-fc-not-excluded",
            Severity::Warning,
            "no ignore/exclude entry matches these MTP modules while a catch-all 4-bit rule targets every Linear, so an engine may build them as 4-bit layers; whether that loads depends on how they are stored: check the weight map (model.safetensors.index.json) for their weight_scale tensors",
            format!(
                "{}: declared {}; ignore list: {}",
                collapse(inferred4.iter().copied()).0.join(", "),
                formats_of_declared(inferred4),
                r.map(|r| r.exclude.iter().map(Pattern::raw).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            ),
            Some(inferred4),
        ));
    } else if mtp.is_empty()
        && inp.headers.is_none()
        && inp.facts.mtp_field.as_deref() == Some("mtp_num_hidden_layers")
        && declared_mtp > 0
    {
        if let Some(r) = inp.followed {
            let d = r.resolve("mtp.fc", super::quant::ModClass::Linear);
            if d.format.is_4bit() && !d.excluded {
                out.push(finding(
                    "mtp-fc-not-excluded",
                    Severity::Warning,
                    "no ignore/exclude entry matches mtp.fc while a 4-bit rule targets it, so an engine may build mtp.fc as a 4-bit layer; whether that loads depends on how the weight is stored: check the weight map (model.safetensors.index.json) for mtp.fc.weight_scale",
                    format!(
                        "{}: mtp.fc resolves to {} ({}); its ignore list: {}",
                        r.file,
                        d.format,
                        d.why,
                        r.exclude.iter().map(Pattern::raw).collect::<Vec<_>>().join(", ")
                    ),
                    None,
                ));
            }
        }
    }
}

/// Lint rule: KV-cache scales, declared and stored.
fn rule_kv_scales(inp: &LintInput, out: &mut Vec<Finding>) {
    // KV scales
    let kv_decl = kv_declared(inp);
    if let (Some(h), Some((file, k))) = (inp.headers, kv_decl.iter().find(|(_, k)| k == "FP8")) {
        let mut k_layers = BTreeSet::new();
        let mut v_layers = BTreeSet::new();
        for t in &h.tensors {
            let l = super::modules::layer_index(&t.name).unwrap_or(u32::MAX);
            if t.name.ends_with(".k_scale") {
                k_layers.insert(l);
            } else if t.name.ends_with(".v_scale") {
                v_layers.insert(l);
            }
        }
        let full: BTreeSet<u32> = match inp.facts.num_hidden_layers {
            Some(n) => (0..n as u32)
                .filter(|i| {
                    let t = inp.facts.layer_type(*i as u64);
                    t.contains("attention") && t != "linear_attention"
                })
                .collect(),
            None => BTreeSet::new(),
        };
        let missing: BTreeSet<u32> = full
            .iter()
            .copied()
            .filter(|l| !(k_layers.contains(l) && v_layers.contains(l)))
            .collect();
        if k_layers.is_empty() && v_layers.is_empty() {
            out.push(finding(
                "kv-fp8-no-scales",
                Severity::Warning,
                "an FP8 KV cache without calibrated k_scale/v_scale runs at scale 1.0: keys and values outside E4M3's ±448 range clip and small ones lose precision",
                format!("{file} declares {k} KV cache; no tensor ends in .k_scale or .v_scale"),
                None,
            ));
        } else if !missing.is_empty() {
            out.push(finding(
                "kv-fp8-no-scales",
                Severity::Warning,
                "attention layers without calibrated k_scale/v_scale run their FP8 KV cache at scale 1.0",
                format!(
                    "{file} declares {k} KV cache; full-attention layers {} lack k_scale or v_scale",
                    ranges(&missing)
                ),
                None,
            ));
        }
    }
}

/// Lint rule: quantization metadata the stored tensors contradict (`metadata-tensor-mismatch`).
fn rule_metadata_tensor_mismatch(inp: &LintInput, out: &mut Vec<Finding>) {
    let targeted_plain = mtp_targeted_plain(inp.recs);
    let recs = inp.recs;
    // metadata-tensor-mismatch (MTP modules targeted but stored plain have their own rule)
    let bad: Vec<&Rec> = recs
        .iter()
        .filter(|r| !r.problems.is_empty())
        .filter(|r| !targeted_plain.iter().any(|t| std::ptr::eq(*t, *r)))
        .collect();
    if !bad.is_empty() {
        let mut problems: BTreeSet<String> = BTreeSet::new();
        for r in &bad {
            for p in &r.problems {
                problems.insert(name_pattern(p));
            }
        }
        let n = problems.len();
        let mut list: Vec<String> = problems.into_iter().take(4).collect();
        if n > 4 {
            list.push(format!("and {} more", n - 4));
        }
        out.push(finding(
            "metadata-tensor-mismatch",
            Severity::Error,
            "the metadata and the tensors disagree: an engine that follows the metadata fails to load these modules or silently computes garbage",
            list.join("; "),
            Some(&bad),
        ));
    }
    if let Some(h) = inp.headers {
        if !h.size_mismatches.is_empty() {
            out.push(finding(
                "safetensors-truncated",
                Severity::Error,
                "a safetensors file's size does not match its header: the download is incomplete or the file is corrupt, and loading it fails",
                h.size_mismatches.join("; "),
                None,
            ));
        }
        if !h.index_mismatches.is_empty() {
            out.push(finding(
                "index-mismatch",
                Severity::Error,
                "model.safetensors.index.json and the shards disagree: loaders look tensors up through the index and fail on the ones it misplaces",
                h.index_mismatches.join("; "),
                None,
            ));
        }
    }
}

/// Lint rule: the NVFP4 group size in the metadata and in the tensors (`nvfp4-group-size`).
fn rule_nvfp4_group_size(inp: &LintInput, out: &mut Vec<Finding>) {
    let recs = inp.recs;
    // nvfp4-group-size
    let mut gs_meta: Vec<String> = Vec::new();
    for r in inp.followed.into_iter().chain(inp.other) {
        let mut bad_keys = 0usize;
        let mut example = None;
        for (k, (f, _, _)) in &r.layers {
            if let ModuleFormat::Nvfp4 { group_size, .. } = f {
                if *group_size != 16 {
                    bad_keys += 1;
                    example.get_or_insert(format!("{k}: group {group_size}"));
                }
            }
        }
        if bad_keys > 0 {
            gs_meta.push(format!(
                "{} quantized_layers: {bad_keys} NVFP4 entries, e.g. {}",
                r.file,
                example.unwrap_or_default()
            ));
        }
        if let Some(ModuleFormat::Nvfp4 { group_size, .. }) = &r.global {
            if *group_size != 16 {
                gs_meta.push(format!("{} group_size {group_size}", r.file));
            }
        }
        for g in &r.groups {
            if let ModuleFormat::Nvfp4 { group_size, .. } = &g.format {
                if *group_size != 16 {
                    gs_meta.push(format!(
                        "{} config_groups.{} group_size {group_size}",
                        r.file, g.name
                    ));
                }
            }
        }
    }
    let gs_tensor: Vec<&Rec> = recs
        .iter()
        .filter(|r| {
            matches!(r.effective, ModuleFormat::Nvfp4 { .. })
                && r.ev
                    .as_ref()
                    .and_then(|e| e.group_size)
                    .is_some_and(|g| g != 16)
        })
        .collect();
    if !gs_meta.is_empty() || !gs_tensor.is_empty() {
        let mut detail = gs_meta.join("; ");
        if !gs_tensor.is_empty() {
            let gs: BTreeSet<u64> = gs_tensor
                .iter()
                .filter_map(|r| r.ev.as_ref().and_then(|e| e.group_size))
                .collect();
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            detail.push_str(&format!(
                "tensor shapes give group size {}",
                gs.iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.push(finding(
            "nvfp4-group-size",
            Severity::Error,
            "NVFP4 is defined with one E4M3 scale per 16 elements; NVFP4 kernels (FP4 tensor cores and the Marlin-style W4A16 path) support only group 16",
            detail,
            (!gs_tensor.is_empty()).then_some(gs_tensor.as_slice()),
        ));
    }
}

/// Lint rule: lm_head, embeddings and the vision tower quantized.
fn rule_lm_head_embeddings_vision(inp: &LintInput, out: &mut Vec<Finding>) {
    let recs = inp.recs;
    // lm_head / embeddings / vision
    let of_kind = |k: LayerKind| -> Vec<&Rec> {
        recs.iter()
            .filter(|r| r.m.kind == k && r.effective.is_quantized())
            .collect()
    };
    let lm = of_kind(LayerKind::LmHead);
    if !lm.is_empty() {
        out.push(finding(
            "lm-head-quantized",
            Severity::Info,
            "lm_head maps the last hidden state to every vocabulary logit, so its quantization error shifts token probabilities directly; NVIDIA's recipes do quantize it, check accuracy on your task",
            format!("found {} ({})", formats_of(&lm), sources_of(&lm)),
            Some(&lm),
        ));
    }
    let emb = of_kind(LayerKind::Embedding);
    if !emb.is_empty() {
        out.push(finding(
            "embedding-quantized",
            Severity::Warning,
            "token embeddings are a lookup table, not a GEMM: engines either dequantize the table at load or reject quantized embeddings",
            format!("found {} ({})", formats_of(&emb), sources_of(&emb)),
            Some(&emb),
        ));
    }
    let vis = of_kind(LayerKind::Vision);
    let vis4: Vec<&Rec> = vis
        .iter()
        .copied()
        .filter(|r| r.effective.is_4bit())
        .collect();
    if !vis4.is_empty() {
        out.push(finding(
            "vision-quantized",
            Severity::Warning,
            "the vision tower is small next to the language model and sensitive to quantization: 4-bit vision weights save little memory and degrade image understanding",
            format!("found {} ({})", formats_of(&vis4), sources_of(&vis4)),
            Some(&vis4),
        ));
    } else if !vis.is_empty() {
        out.push(finding(
            "vision-quantized",
            Severity::Info,
            "the vision tower is quantized; FP8 usually keeps image understanding close to BF16, check it on your images",
            format!("found {} ({})", formats_of(&vis), sources_of(&vis)),
            Some(&vis),
        ));
    }
}

/// Lint rule: config.json and hf_quant_config.json disagreeing (`config-disagreement`).
fn rule_config_disagreement(inp: &LintInput, out: &mut Vec<Finding>) {
    // config-disagreement
    config_disagreements(inp, out);
}

/// Lint rule: what the card runs natively, emulates or cannot run.
fn rule_card_verdicts(inp: &LintInput, out: &mut Vec<Finding>) {
    let recs = inp.recs;
    // Card verdicts
    for (sup, rule, sev, why) in [
        (
            Support::Unsupported,
            "format-unsupported-on-card",
            Severity::Error,
            "this card cannot run these modules' format in the common engines",
        ),
        (
            Support::Fallback,
            "format-fallback-on-card",
            Severity::Warning,
            "this card runs these modules through a fallback path, not the format's native arithmetic: speed (and for W4A4, the activation precision) differs from what the format promises",
        ),
    ] {
        let hit: Vec<String> = inp
            .card
            .verdicts
            .iter()
            .filter(|v| v.support == Some(sup))
            .map(|v| format!("{} ({} modules): {}; {}", v.format, v.modules, v.path, v.reason))
            .collect();
        if !hit.is_empty() {
            let fmts: BTreeSet<String> = inp
                .card
                .verdicts
                .iter()
                .filter(|v| v.support == Some(sup))
                .map(|v| v.format.clone())
                .collect();
            let hits: Vec<&Rec> = recs
                .iter()
                .filter(|r| fmts.contains(&r.effective.to_string()))
                .collect();
            out.push(finding(
                rule,
                sev,
                why,
                format!(
                    "on {}: {}",
                    inp.card.cc.map(|c| c.to_string()).unwrap_or_default(),
                    hit.join("; ")
                ),
                Some(&hits),
            ));
        }
    }
}

/// Lint rule: metadata rules rigbench cannot interpret.
fn rule_uninterpreted_metadata(inp: &LintInput, out: &mut Vec<Finding>) {
    // Metadata rules rigbench cannot interpret
    for r in inp.followed.into_iter().chain(inp.other) {
        if let (Method::Generic(m), Some(ModuleFormat::Other { name })) = (&r.method, &r.global) {
            out.push(finding(
                "unknown-quant-method",
                Severity::Warning,
                "rigbench does not know this quantization method's layout, so formats and tensor checks for it are incomplete",
                format!("{} quant_method '{m}' ({name})", r.file),
                None,
            ));
        }
        for (raw, err) in r.invalid_patterns() {
            out.push(finding(
                "bad-pattern",
                Severity::Warning,
                "a target/ignore pattern that does not compile matches nothing here, and may fail or match differently in the engine",
                format!("{}: '{raw}': {err}", r.file),
                None,
            ));
        }
    }
}

/// Lint rule: tensor checks skipped.
fn rule_tensor_checks_skipped(inp: &LintInput, out: &mut Vec<Finding>) {
    let kv_decl = kv_declared(inp);
    // Tensor checks skipped
    if let Some(h) = inp.headers.filter(|h| h.names_only) {
        out.push(finding(
            "no-safetensors",
            Severity::Info,
            "dtypes unknown without the shard headers: the shards named by model.safetensors.index.json are not here (inspecting before downloading is fine), so module names and scale tensors come from the index, dtypes, shapes and exact bytes do not",
            format!(
                "{} tensors named in {} shard(s), none present; skipped: dtypes, packed shapes and group sizes, exact weight bytes",
                h.tensors.len(),
                h.shards.len()
            ),
            None,
        ));
    }
    if inp.headers.is_none() {
        let mut skipped = vec![
            "scale tensors, packed shapes and group sizes of quantized modules".to_string(),
            "metadata-versus-tensor agreement".to_string(),
        ];
        if !kv_decl.is_empty() {
            skipped.push(format!(
                "k_scale/v_scale tensors for the declared {} KV cache",
                kv_decl
                    .iter()
                    .map(|(f, k)| format!("{k} ({f})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        skipped.push("exact weight bytes (estimated from config.json instead, when the architecture is modelled)".into());
        let mut detail = format!("skipped: {}", skipped.join("; "));
        if let Some(e) = inp.inventory_error {
            detail.push_str(&format!("; module list: {e}"));
        }
        out.push(finding(
            "no-safetensors",
            Severity::Info,
            "no safetensors headers were found, so the formats come from the metadata alone and tensor-level checks were skipped",
            detail,
            None,
        ));
    }

    if let Some(r) = inp.runtime {
        out.push(finding(
            "runtime-unsupported",
            Severity::Info,
            "rigbench's built-in runtime (serve/e2e/report --model DIR) refuses this checkpoint with this finding id; external engines may run it",
            r.detail.clone(),
            None,
        ));
    }
}

fn set_diff(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let sa: BTreeSet<&String> = a.iter().collect();
    let sb: BTreeSet<&String> = b.iter().collect();
    (
        sa.difference(&sb).map(|s| s.to_string()).collect(),
        sb.difference(&sa).map(|s| s.to_string()).collect(),
    )
}

fn sample(v: &[String]) -> String {
    let mut s: Vec<String> = v.iter().take(3).cloned().collect();
    if v.len() > 3 {
        s.push(format!("… ({} in all)", v.len()));
    }
    s.join(", ")
}

/// Lint rule: the two quantization metadata files disagree with each other, or one ModelOpt
/// file's config_groups disagree with its quantized_layers (`config-disagreement`).
fn config_disagreements(inp: &LintInput, out: &mut Vec<Finding>) {
    if let (Some(c), Some(h)) = (inp.followed, inp.other) {
        file_fields_disagree(c, h, out);
        file_lists_disagree(c, h, out);
        modules_disagree(inp, c, h, out);
    }
    modelopt_groups_disagree(inp, out);
}

/// Why two metadata files that disagree matter.
const WHY_FILES: &str = "config.json and hf_quant_config.json describe the quantization differently, so engines that read different files run different formats";

/// The followed file `c` and the other file `h` disagree on a single field: producer version,
/// quant_algo, or KV-cache format.
fn file_fields_disagree(c: &Rules, h: &Rules, out: &mut Vec<Finding>) {
    if c.producer != h.producer {
        out.push(finding(
            "config-disagreement",
            Severity::Info,
            "the two metadata files were written by different producer versions, so they may describe different exports",
            format!(
                "producer: {} says {}, {} says {}",
                h.file,
                h.producer.as_deref().unwrap_or("nothing"),
                c.file,
                c.producer.as_deref().unwrap_or("nothing")
            ),
            None,
        ));
    }
    let algo = |r: &Rules| r.algo.clone().map(|a| a.to_ascii_uppercase());
    if algo(c) != algo(h) {
        out.push(finding(
            "config-disagreement",
            Severity::Warning,
            WHY_FILES,
            format!(
                "quant_algo: {} says {}, {} says {}; {ENGINES}",
                h.file,
                h.algo.as_deref().unwrap_or("nothing"),
                c.file,
                c.algo.as_deref().unwrap_or("nothing")
            ),
            None,
        ));
    }
    if c.kv != h.kv {
        out.push(finding(
            "config-disagreement",
            Severity::Warning,
            WHY_FILES,
            format!(
                "KV cache: {} declares {}, {} declares {}; vLLM follows config.json and runs the KV cache in {} unless --kv-cache-dtype is given; TensorRT-LLM follows hf_quant_config.json ({})",
                h.file,
                h.kv.as_deref().unwrap_or("none"),
                c.file,
                c.kv.as_deref().unwrap_or("none (no kv_cache_scheme)"),
                c.kv.as_deref().map(|k| k.to_string()).unwrap_or_else(|| "the model dtype".into()),
                h.kv.as_deref().unwrap_or("model dtype"),
            ),
            None,
        ));
    }
}

/// The followed file `c` and the other file `h` disagree on a list: the exclude/ignore lists,
/// or the quantized_layers (layers in one only, or with different algorithms).
fn file_lists_disagree(c: &Rules, h: &Rules, out: &mut Vec<Finding>) {
    let ex = |r: &Rules| {
        r.exclude
            .iter()
            .map(|p| p.raw().to_string())
            .collect::<Vec<_>>()
    };
    let (only_c, only_h) = set_diff(&ex(c), &ex(h));
    if !only_c.is_empty() || !only_h.is_empty() {
        out.push(finding(
            "config-disagreement",
            Severity::Warning,
            WHY_FILES,
            format!(
                "exclude lists differ: only in {} ignore: [{}]; only in {} exclude_modules: [{}]; {ENGINES}",
                c.file,
                sample(&only_c),
                h.file,
                sample(&only_h)
            ),
            None,
        ));
    }
    let keys_c: Vec<String> = c.layers.keys().cloned().collect();
    let keys_h: Vec<String> = h.layers.keys().cloned().collect();
    let (only_c, only_h) = set_diff(&keys_c, &keys_h);
    let mut differ: Vec<String> = c
        .layers
        .iter()
        .filter_map(|(k, (fc, ac, _))| {
            h.layers
                .get(k)
                .filter(|(fh, _, _)| fh != fc)
                .map(|(_, ah, _)| format!("{k}: {ac} vs {ah}"))
        })
        .collect();
    differ.sort();
    if !only_c.is_empty() || !only_h.is_empty() || !differ.is_empty() {
        out.push(finding(
            "config-disagreement",
            Severity::Warning,
            WHY_FILES,
            format!(
                "quantized_layers differ: {} only in {} [{}], {} only in {} [{}], {} with different algorithms [{}]; {ENGINES}",
                only_c.len(),
                c.file,
                sample(&only_c),
                only_h.len(),
                h.file,
                sample(&only_h),
                differ.len(),
                sample(&differ)
            ),
            None,
        ));
    }
}

/// Module by module, what the two files make of it: modules the followed file `c` and the
/// other file `h` resolve to different formats.
fn modules_disagree(inp: &LintInput, c: &Rules, h: &Rules, out: &mut Vec<Finding>) {
    let differ: Vec<&Rec> = inp
        .recs
        .iter()
        .filter(|r| {
            r.other
                .as_ref()
                .is_some_and(|o| o.format != r.declared.format)
        })
        .collect();
    if !differ.is_empty() {
        let pairs: BTreeSet<String> = differ
            .iter()
            .filter_map(|r| {
                r.other.as_ref().map(|o| {
                    format!(
                        "{} by {} vs {} by {}",
                        r.declared.format, c.file, o.format, h.file
                    )
                })
            })
            .collect();
        out.push(finding(
            "config-disagreement",
            Severity::Warning,
            WHY_FILES,
            format!(
                "modules resolve differently: {}; {ENGINES}",
                pairs.into_iter().collect::<Vec<_>>().join("; ")
            ),
            Some(&differ),
        ));
    }
}

/// Inside one ModelOpt file: config_groups (informational for vLLM's ModelOpt loader) vs
/// quantized_layers / quant_algo (what it uses).
fn modelopt_groups_disagree(inp: &LintInput, out: &mut Vec<Finding>) {
    for r in inp.followed.into_iter().chain(inp.other) {
        if r.method != Method::ModelOpt {
            continue;
        }
        for g in &r.groups {
            let mut n = 0usize;
            let mut decl: BTreeSet<String> = BTreeSet::new();
            for t in &g.targets {
                let used = match t {
                    Pattern::Exact(name) => r.layers.get(name).map(|(f, _, _)| f.clone()),
                    Pattern::Class(c) if c == "Linear" => r.global.clone(),
                    _ => None,
                };
                if let Some(f) = used {
                    if !same_format(&g.format, &f) {
                        n += 1;
                        decl.insert(f.to_string());
                    }
                }
            }
            if n > 0 {
                out.push(finding(
                    "config-disagreement",
                    Severity::Warning,
                    "config_groups and quantized_layers in the same file disagree: readers of the compressed-tensors-style groups and readers of the per-module algorithms expect different tensors",
                    format!(
                        "{} config_groups.{} declares {} for {n} module(s) that {} declares {}; vLLM's ModelOpt loader takes the per-module algorithm from quantized_layers / quant_algo (ModelOptMixedPrecisionConfig) and ignores config_groups; a config_groups reader would expect {}",
                        r.file,
                        g.name,
                        g.format,
                        if r.layers.is_empty() { "quant_algo" } else { "quantized_layers" },
                        decl.into_iter().collect::<Vec<_>>().join(", "),
                        if g.format.gemm_format() == Some(crate::formats::GemmFormat::W4a4) {
                            "4-bit activations with input scales"
                        } else {
                            "that format"
                        }
                    ),
                    None,
                ));
            }
        }
    }
}

/// Same format for the purpose of comparing two declarations (unspecified details match).
fn same_format(a: &ModuleFormat, b: &ModuleFormat) -> bool {
    match (a, b) {
        (
            ModuleFormat::Nvfp4 {
                activations_4bit: x,
                group_size: g,
            },
            ModuleFormat::Nvfp4 {
                activations_4bit: y,
                group_size: h,
            },
        ) => x == y && g == h,
        (
            ModuleFormat::Fp8 {
                scaling: s1,
                activations: a1,
            },
            ModuleFormat::Fp8 {
                scaling: s2,
                activations: a2,
            },
        ) => {
            let eq = |x: &str, y: &str| x == y || x == "unspecified" || y == "unspecified";
            eq(s1, s2) && eq(a1, a2)
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod rules_tests {
    use super::RULES;

    /// `RULES` lists exactly the rule ids this file emits: every literal passed as the first
    /// argument of `finding(` is listed, and every listed id appears as a literal in the code.
    #[test]
    fn rules_list_matches_the_code() {
        let src = include_str!("lint.rs");
        let code = src
            .split("pub(crate) struct LintInput")
            .nth(1)
            .unwrap_or_default();
        let re = regex::Regex::new(r#"finding\(\s*"([a-z0-9-]+)""#).unwrap();
        let emitted: std::collections::BTreeSet<&str> = re
            .captures_iter(code)
            .map(|c| c.get(1).unwrap().as_str())
            .collect();
        assert!(emitted.len() > 10, "{emitted:?}");
        for r in &emitted {
            assert!(
                RULES.contains(r),
                "rule '{r}' is emitted but missing from RULES"
            );
        }
        for r in RULES {
            assert!(
                code.contains(&format!("\"{r}\"")),
                "RULES lists '{r}' but the code never emits it"
            );
        }
        let mut sorted = RULES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), RULES.len(), "duplicate rule ids");
    }
}
