//! `rigbench inspect FILE.gguf`: what a GGUF checkpoint holds, from its header alone (metadata
//! and tensor table; no tensor data is read): the architecture fields, the tensor types of the
//! file's own tensor table per type and per module, bits and bytes per weight, and the KV cache
//! llama.cpp would allocate for a context and a number of parallel slots.
//!
//! KV formula (llama.cpp `llama_kv_cache`, one K and one V row per layer and token, types
//! `-ctk`/`-ctv`, default f16): bytes per token = Σ over layers of `n_head_kv · (key_length +
//! value_length) · bytes(type)`, with `key_length`/`value_length` from
//! `{arch}.attention.key_length`/`value_length` (default `embedding_length / head_count`).
//! llama.cpp allocates `-c` cells in total (`-c 0` = the model's `context_length`), shared by
//! `-np` slots of `-c / -np` tokens each (llama-server without `--kv-unified`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::gguf::{Gguf, Value};
use crate::formats::ggml::GgmlType;
use crate::output::table::{human_bytes, markdown_table, thousands};

/// The llama.cpp settings the KV prediction assumes.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufKvOptions {
    /// `-c`: total KV cells; `None` = the model's `context_length` (llama.cpp's `-c 0`).
    pub ctx_size: Option<u64>,
    /// `-np`: parallel slots sharing the cells (at least 1).
    pub parallel: u64,
    /// KV element type name and bytes (`f16`, 2 by default: llama.cpp's `-ctk f16 -ctv f16`).
    pub kv_type: (String, f64),
    /// GPU memory for the fit figure, bytes, and where it came from.
    pub gpu_memory: Option<(u64, String)>,
    /// Memory assumed for llama.cpp's compute buffers and the CUDA context, bytes.
    pub reserve_bytes: u64,
}

impl Default for GgufKvOptions {
    fn default() -> Self {
        Self {
            ctx_size: None,
            parallel: 1,
            kv_type: ("f16".into(), 2.0),
            gpu_memory: None,
            reserve_bytes: super::DEFAULT_RESERVE_BYTES,
        }
    }
}

/// Tensors of one ggml type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypeRow {
    /// The ggml type (`Q4_1`, ...).
    pub ggml_type: String,
    /// Tensors of this type.
    pub tensors: u64,
    /// Elements (weights).
    pub elements: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Tensors of one module pattern and type (`blk.*.attn_q.weight` in Q4_1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GgufModuleRow {
    /// Name with layer indices replaced by `*`.
    pub module: String,
    /// Layers covered (`0-29`), `-` for tensors outside the blocks.
    pub layers: String,
    /// Tensors.
    pub count: u64,
    /// ggml type.
    pub ggml_type: String,
    /// Shape in PyTorch order (`[N, K]` for a weight), of the first tensor.
    pub shape: Vec<u64>,
    /// Elements of all tensors in the row.
    pub elements: u64,
    /// Bytes of all tensors in the row.
    pub bytes: u64,
    /// Bytes per weight (bytes ÷ elements): 0.625 for Q4_1, 1.0625 for Q8_0, 4 for F32.
    pub bytes_per_weight: f64,
    /// Whether rigbench's runtime can dequantize this type.
    pub runtime_reads: bool,
}

/// The KV cache llama.cpp would allocate, with its assumptions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GgufKvCapacity {
    /// Layers with a KV cache.
    pub layers: Option<u64>,
    /// Bytes per token, all layers, K and V.
    pub bytes_per_token: Option<u64>,
    /// `-c`: total cells.
    pub ctx_size: Option<u64>,
    /// Where `ctx_size` came from.
    pub ctx_source: String,
    /// `-np`.
    pub parallel: u64,
    /// Tokens per slot (`ctx_size / parallel`).
    pub tokens_per_slot: Option<u64>,
    /// KV cache bytes (`ctx_size × bytes_per_token`).
    pub kv_bytes: Option<u64>,
    /// Weight bytes (all tensors, offloaded with `-ngl 99`).
    pub weight_bytes: u64,
    /// GPU memory and its source, when known.
    pub gpu_memory: Option<(u64, String)>,
    /// Whether weights + KV + reserve fit the GPU memory.
    pub fits: Option<bool>,
    /// Largest `-c` that fits the GPU memory with these weights and the reserve.
    pub max_ctx_that_fits: Option<u64>,
    /// Assumptions, one sentence each.
    pub assumptions: Vec<String>,
    /// Why a figure is missing or not modelled.
    pub notes: Vec<String>,
}

/// The result of inspecting a GGUF file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GgufInspection {
    /// The file.
    pub file: String,
    /// GGUF version.
    pub version: u32,
    /// File size, bytes.
    pub file_bytes: u64,
    /// Bytes of header, metadata and tensor table (all that was read).
    pub header_bytes: u64,
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// `general.name`.
    pub name: Option<String>,
    /// `general.file_type` as llama.cpp names it (`MOSTLY_Q4_1`), with the number.
    pub file_type: Option<String>,
    /// Every `{architecture}.*` metadata field, with its value.
    pub architecture_fields: Vec<(String, String)>,
    /// Tokenizer facts (`tokenizer.ggml.*`, chat template).
    pub tokenizer: Vec<(String, String)>,
    /// Other metadata keys (general.*), with values.
    pub general: Vec<(String, String)>,
    /// Metadata keys in the file.
    pub metadata_keys: usize,
    /// Tensors in the file.
    pub tensor_count: usize,
    /// Per ggml type, from the file's own tensor table.
    pub types: Vec<TypeRow>,
    /// Per module pattern and type.
    pub modules: Vec<GgufModuleRow>,
    /// The KV cache llama.cpp would allocate.
    pub kv: GgufKvCapacity,
    /// Things worth knowing (types the runtime cannot read, tied embeddings, ...).
    pub notes: Vec<String>,
}

/// llama.cpp's `llama_ftype` name of `general.file_type` (`llama.h`).
pub fn file_type_name(v: u64) -> Option<&'static str> {
    Some(match v {
        0 => "ALL_F32",
        1 => "MOSTLY_F16",
        2 => "MOSTLY_Q4_0",
        3 => "MOSTLY_Q4_1",
        7 => "MOSTLY_Q8_0",
        8 => "MOSTLY_Q5_0",
        9 => "MOSTLY_Q5_1",
        10 => "MOSTLY_Q2_K",
        11 => "MOSTLY_Q3_K_S",
        12 => "MOSTLY_Q3_K_M",
        13 => "MOSTLY_Q3_K_L",
        14 => "MOSTLY_Q4_K_S",
        15 => "MOSTLY_Q4_K_M",
        16 => "MOSTLY_Q5_K_S",
        17 => "MOSTLY_Q5_K_M",
        18 => "MOSTLY_Q6_K",
        19 => "MOSTLY_IQ2_XXS",
        20 => "MOSTLY_IQ2_XS",
        21 => "MOSTLY_Q2_K_S",
        22 => "MOSTLY_IQ3_XS",
        23 => "MOSTLY_IQ3_XXS",
        24 => "MOSTLY_IQ1_S",
        25 => "MOSTLY_IQ4_NL",
        26 => "MOSTLY_IQ3_S",
        27 => "MOSTLY_IQ3_M",
        28 => "MOSTLY_IQ2_S",
        29 => "MOSTLY_IQ2_M",
        30 => "MOSTLY_IQ4_XS",
        31 => "MOSTLY_IQ1_M",
        32 => "MOSTLY_BF16",
        36 => "MOSTLY_TQ1_0",
        37 => "MOSTLY_TQ2_0",
        38 => "MOSTLY_MXFP4_MOE",
        _ => return None,
    })
}

/// `blk.12.attn_q.weight` → (`blk.*.attn_q.weight`, Some(12)).
fn pattern(name: &str) -> (String, Option<u32>) {
    let mut parts: Vec<&str> = name.split('.').collect();
    let mut layer = None;
    if parts.len() > 2 && parts[0] == "blk" {
        if let Ok(l) = parts[1].parse::<u32>() {
            layer = Some(l);
            parts[1] = "*";
        }
    }
    (parts.join("."), layer)
}

fn per_layer(g: &Gguf, key: &str, layers: u64) -> Option<Vec<u64>> {
    match g.get(key)? {
        Value::Array(a) => {
            let v = a.as_i64s()?;
            Some(v.iter().map(|x| (*x).max(0) as u64).collect())
        }
        v => v.as_u64().map(|x| vec![x; layers as usize]),
    }
}

/// Inspect an opened GGUF file.
pub fn inspect_gguf(g: &Gguf, opts: &GgufKvOptions) -> GgufInspection {
    let h = &g.header;
    let arch = g.architecture().map(str::to_string);
    let mut r = GgufInspection {
        file: g.path.display().to_string(),
        version: h.version,
        file_bytes: h.file_bytes,
        header_bytes: h.data_start,
        architecture: arch.clone(),
        name: g
            .get("general.name")
            .and_then(Value::as_str)
            .map(str::to_string),
        file_type: g
            .get("general.file_type")
            .and_then(Value::as_u64)
            .map(|v| format!("{} ({v})", file_type_name(v).unwrap_or("unknown"))),
        metadata_keys: h.metadata.len(),
        tensor_count: h.tensors.len(),
        ..Default::default()
    };
    let prefix = arch.as_deref().map(|a| format!("{a}."));
    for (k, v) in &h.metadata {
        let shown = (k.clone(), v.display(80));
        if prefix.as_deref().is_some_and(|p| k.starts_with(p)) {
            r.architecture_fields.push(shown);
        } else if k.starts_with("tokenizer.") {
            r.tokenizer.push(shown);
        } else if k != "general.architecture" {
            r.general.push(shown);
        }
    }
    // Per type.
    let mut types: BTreeMap<GgmlType, TypeRow> = BTreeMap::new();
    for t in &h.tensors {
        let e = types.entry(t.ggml_type).or_insert(TypeRow {
            ggml_type: t.ggml_type.name().into(),
            tensors: 0,
            elements: 0,
            bytes: 0,
        });
        e.tensors += 1;
        e.elements += t.elements;
        e.bytes += t.bytes;
    }
    r.types = types.into_values().collect();
    // Per module.
    struct Acc {
        first: usize,
        layers: BTreeSet<u32>,
        row: GgufModuleRow,
    }
    let mut mods: BTreeMap<(String, GgmlType), Acc> = BTreeMap::new();
    for (i, t) in h.tensors.iter().enumerate() {
        let (pat, layer) = pattern(&t.name);
        let a = mods.entry((pat.clone(), t.ggml_type)).or_insert(Acc {
            first: i,
            layers: BTreeSet::new(),
            row: GgufModuleRow {
                module: pat,
                layers: "-".into(),
                count: 0,
                ggml_type: t.ggml_type.name().into(),
                shape: t.shape(),
                elements: 0,
                bytes: 0,
                bytes_per_weight: 0.0,
                runtime_reads: t.ggml_type.dequantizable(),
            },
        });
        a.row.count += 1;
        a.row.elements += t.elements;
        a.row.bytes += t.bytes;
        if let Some(l) = layer {
            a.layers.insert(l);
        }
    }
    let mut rows: Vec<(usize, GgufModuleRow)> = mods
        .into_values()
        .map(|mut a| {
            if !a.layers.is_empty() {
                a.row.layers = super::modules::ranges(&a.layers);
            }
            a.row.bytes_per_weight = a.row.bytes as f64 / a.row.elements.max(1) as f64;
            (a.first, a.row)
        })
        .collect();
    rows.sort_by_key(|(first, row)| (row.module.starts_with("blk."), *first));
    r.modules = rows.into_iter().map(|(_, row)| row).collect();
    let unreadable: BTreeSet<&str> = h
        .tensors
        .iter()
        .filter(|t| !t.ggml_type.dequantizable())
        .map(|t| t.ggml_type.name())
        .collect();
    if !unreadable.is_empty() {
        r.notes.push(format!(
            "tensors of type {} cannot be dequantized by rigbench's runtime (`rigbench serve` refuses this file; llama.cpp runs it)",
            unreadable.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if h.tensors.iter().any(|t| t.name == "token_embd.weight")
        && !h.tensors.iter().any(|t| t.name == "output.weight")
    {
        r.notes.push(
            "no output.weight: the output layer is tied to token_embd.weight (tied embeddings)"
                .into(),
        );
    }
    r.kv = kv_capacity(g, arch.as_deref(), opts);
    r
}

fn kv_capacity(g: &Gguf, arch: Option<&str>, opts: &GgufKvOptions) -> GgufKvCapacity {
    let weight_bytes: u64 = g.header.tensors.iter().map(|t| t.bytes).sum();
    let mut k = GgufKvCapacity {
        parallel: opts.parallel.max(1),
        weight_bytes,
        gpu_memory: opts.gpu_memory.clone(),
        ..Default::default()
    };
    let Some(a) = arch else {
        k.notes
            .push("no general.architecture: the KV cache is not predicted".into());
        return k;
    };
    let num = |key: &str| g.get(&format!("{a}.{key}")).and_then(Value::as_u64);
    let Some(layers) = num("block_count") else {
        k.notes
            .push(format!("no {a}.block_count: the KV cache is not predicted"));
        return k;
    };
    let blocks = g.blocks_with_tensors();
    if layers > blocks {
        k.notes.push(format!(
            "{a}.block_count = {layers}, but the file holds tensors for {blocks} block(s) (blk.N.*): the header is inconsistent, the KV cache is not predicted"
        ));
        return k;
    }
    k.layers = Some(layers);
    for (key, why) in [
        (
            "ssm.state_size",
            "recurrent (SSM) layers keep a fixed state per sequence",
        ),
        (
            "attention.sliding_window",
            "sliding-window layers keep only the window",
        ),
        (
            "attention.kv_lora_rank",
            "MLA caches a compressed latent, not K and V",
        ),
    ] {
        if g.get(&format!("{a}.{key}")).is_some() {
            k.notes.push(format!(
                "{a}.{key} is set: {why}; the dense formula below overstates the KV cache"
            ));
        }
    }
    let heads = per_layer(g, &format!("{a}.attention.head_count"), layers);
    let kv_heads = per_layer(g, &format!("{a}.attention.head_count_kv"), layers).or(heads.clone());
    let embd = num("embedding_length");
    let default_hd = match (embd, heads.as_ref().and_then(|h| h.first().copied())) {
        (Some(e), Some(h)) if h > 0 => Some(e / h),
        _ => None,
    };
    let kl = num("attention.key_length").or(default_hd);
    let vl = num("attention.value_length").or(default_hd);
    let (Some(kvh), Some(kl), Some(vl)) = (kv_heads, kl, vl) else {
        k.notes.push(format!(
            "{a}.attention.head_count(_kv) or the head size is missing: the KV cache is not predicted"
        ));
        return k;
    };
    let bytes_el = opts.kv_type.1;
    let per_token: f64 = kvh
        .iter()
        .take(layers as usize)
        .map(|n| (*n * (kl + vl)) as f64 * bytes_el)
        .sum();
    let per_token = per_token.round() as u64;
    k.bytes_per_token = Some(per_token);
    let ctx_train = num("context_length");
    let (ctx, src) = match (opts.ctx_size, ctx_train) {
        (Some(c), _) => (Some(c), format!("-c {c} (--ctx-size)")),
        (None, Some(c)) => (
            Some(c),
            format!(
                "{a}.context_length = {c} (llama.cpp's -c 0 takes the model's training context)"
            ),
        ),
        (None, None) => (None, "unknown: no --ctx-size and no context_length".into()),
    };
    k.ctx_size = ctx;
    k.ctx_source = src;
    if let Some(c) = ctx {
        k.tokens_per_slot = Some(c / k.parallel);
        k.kv_bytes = Some(c.saturating_mul(per_token));
    }
    if let Some((mem, _)) = &opts.gpu_memory {
        let need = weight_bytes
            .saturating_add(k.kv_bytes.unwrap_or(0))
            .saturating_add(opts.reserve_bytes);
        if k.kv_bytes.is_some() {
            k.fits = Some(need <= *mem);
        }
        let left = mem.saturating_sub(weight_bytes + opts.reserve_bytes);
        k.max_ctx_that_fits = left.checked_div(per_token);
    }
    k.assumptions = vec![
        format!(
            "KV type {} ({} bytes per element) for K and V: llama.cpp's -ctk/-ctv default f16",
            opts.kv_type.0, bytes_el
        ),
        format!(
            "-np {}: the {} cells are shared by {} slot(s) of -c/-np tokens each (llama-server without --kv-unified)",
            k.parallel,
            ctx.map(thousands).unwrap_or_else(|| "?".into()),
            k.parallel
        ),
        "every layer offloaded (-ngl 99): all tensor bytes on the GPU".into(),
        format!(
            "{} reserved for compute buffers and the CUDA context (--reserve-gib)",
            human_bytes(opts.reserve_bytes)
        ),
    ];
    k
}

/// Inspect the GGUF file at `path` (a `.gguf` file or a folder holding one).
///
/// # Errors
/// What [`Gguf::open`] refuses (naming the file and the byte offset).
pub fn inspect_path(path: &Path, opts: &GgufKvOptions) -> anyhow::Result<GgufInspection> {
    let g = Gguf::open(path)?;
    Ok(inspect_gguf(&g, opts))
}

/// Render as Markdown (the terminal output of `rigbench inspect FILE.gguf`).
pub fn render_markdown(r: &GgufInspection) -> String {
    let mut o = format!("## GGUF checkpoint: {}\n\n", r.file);
    o.push_str(&format!(
        "GGUF version {}, {} metadata keys, {} tensors; read the first {} of {} (header, metadata and tensor table; no tensor data).\n\n",
        r.version,
        r.metadata_keys,
        r.tensor_count,
        human_bytes(r.header_bytes),
        human_bytes(r.file_bytes)
    ));
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
    o.push_str("### Model\n\n");
    let mut rows = vec![
        vec!["architecture".to_string(), opt(&r.architecture)],
        vec!["name".into(), opt(&r.name)],
        vec!["file type".into(), opt(&r.file_type)],
    ];
    rows.extend(
        r.architecture_fields
            .iter()
            .map(|(k, v)| vec![k.clone(), v.clone()]),
    );
    o.push_str(&markdown_table(&["field", "value"], &rows));
    if !r.tokenizer.is_empty() {
        o.push_str("\n### Tokenizer\n\n");
        let rows: Vec<Vec<String>> = r
            .tokenizer
            .iter()
            .map(|(k, v)| vec![k.clone(), v.clone()])
            .collect();
        o.push_str(&markdown_table(&["field", "value"], &rows));
    }
    o.push_str("\n### Tensor types (the file's tensor table)\n\n");
    let total: u64 = r.types.iter().map(|t| t.bytes).sum();
    let rows: Vec<Vec<String>> = r
        .types
        .iter()
        .map(|t| {
            vec![
                t.ggml_type.clone(),
                t.tensors.to_string(),
                thousands(t.elements),
                human_bytes(t.bytes),
                format!("{:.4}", 8.0 * t.bytes as f64 / t.elements.max(1) as f64),
                format!("{:.1}%", 100.0 * t.bytes as f64 / total.max(1) as f64),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "type",
            "tensors",
            "weights",
            "bytes",
            "bits/weight",
            "of bytes",
        ],
        &rows,
    ));
    o.push_str("\n### Modules\n\n");
    let rows: Vec<Vec<String>> = r
        .modules
        .iter()
        .map(|m| {
            vec![
                m.module.clone(),
                m.layers.clone(),
                m.count.to_string(),
                m.ggml_type.clone(),
                format!(
                    "[{}]",
                    m.shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                format!("{:.4}", m.bytes_per_weight),
                human_bytes(m.bytes),
                if m.runtime_reads { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "module",
            "layers",
            "tensors",
            "type",
            "shape [N, K]",
            "bytes/weight",
            "bytes",
            "rigbench runtime reads",
        ],
        &rows,
    ));
    let k = &r.kv;
    o.push_str("\n### KV cache under llama.cpp (a prediction)\n\n");
    let f = |v: Option<u64>, fmt: &dyn Fn(u64) -> String| {
        v.map(fmt).unwrap_or_else(|| "unknown".into())
    };
    let mut rows = vec![
        vec![
            "KV bytes per token (all layers, K+V)".to_string(),
            f(k.bytes_per_token, &|b| {
                format!("{} ({b} B)", human_bytes(b))
            }),
        ],
        vec![
            "context cells (-c)".into(),
            format!("{} — {}", f(k.ctx_size, &thousands), k.ctx_source),
        ],
        vec!["parallel slots (-np)".into(), k.parallel.to_string()],
        vec!["tokens per slot".into(), f(k.tokens_per_slot, &thousands)],
        vec!["KV cache allocated".into(), f(k.kv_bytes, &human_bytes)],
        vec!["weights".into(), human_bytes(k.weight_bytes)],
    ];
    if let Some((m, src)) = &k.gpu_memory {
        rows.push(vec![
            "GPU memory".into(),
            format!("{} ({src})", human_bytes(*m)),
        ]);
        rows.push(vec![
            "fits (weights + KV + reserve)".into(),
            match k.fits {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "unknown".into(),
            },
        ]);
        rows.push(vec![
            "largest -c that fits".into(),
            f(k.max_ctx_that_fits, &thousands),
        ]);
    }
    o.push_str(&markdown_table(&["figure", "value"], &rows));
    if !k.assumptions.is_empty() {
        o.push_str("\nAssumptions:\n");
        for a in &k.assumptions {
            o.push_str(&format!("- {a}\n"));
        }
    }
    for n in k.notes.iter().chain(&r.notes) {
        o.push_str(&format!("\nNote: {n}\n"));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::super::gguf::tests::Writer;
    use super::*;

    #[test]
    fn a_block_count_beyond_the_files_tensors_is_a_note_not_an_allocation() {
        // 1 KB of header declaring 2^32 - 1 blocks: per-layer head counts used to be a
        // vec![_; block_count] (34 GB), then the prediction summed over it.
        let mut w = Writer::new();
        w.str("general.architecture", "llama")
            .u32("llama.block_count", u32::MAX)
            .u32("llama.context_length", 1024)
            .u32("llama.embedding_length", 64)
            .u32("llama.attention.head_count", 4);
        w.tensor("blk.0.attn_norm.weight", &[64], GgmlType::F32, vec![0; 256]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("huge.gguf");
        std::fs::write(&p, w.bytes()).unwrap();
        let g = Gguf::open(&p).unwrap();
        assert_eq!(g.blocks_with_tensors(), 1);
        let r = inspect_gguf(&g, &GgufKvOptions::default());
        assert!(r.kv.bytes_per_token.is_none());
        assert!(
            r.kv.notes
                .iter()
                .any(|n| n.contains("4294967295") && n.contains("1 block")),
            "{:?}",
            r.kv.notes
        );
    }

    #[test]
    fn types_modules_and_kv_of_a_small_file() {
        let mut w = Writer::new();
        w.str("general.architecture", "llama")
            .str("general.name", "toy")
            .u32("general.file_type", 3)
            .u32("llama.block_count", 2)
            .u32("llama.context_length", 1024)
            .u32("llama.embedding_length", 64)
            .u32("llama.attention.head_count", 4)
            .u32("llama.attention.head_count_kv", 2);
        for l in 0..2 {
            w.tensor(
                &format!("blk.{l}.attn_q.weight"),
                &[64, 64],
                GgmlType::Q4_1,
                vec![0; 64 * 64 / 32 * 20],
            );
            w.tensor(
                &format!("blk.{l}.attn_norm.weight"),
                &[64],
                GgmlType::F32,
                vec![0; 256],
            );
        }
        w.tensor(
            "token_embd.weight",
            &[64, 10],
            GgmlType::Q8_0,
            vec![0; 2 * 10 * 34],
        );
        w.tensor(
            "blk.0.ffn_up.weight",
            &[256, 4],
            GgmlType::IQ2_XXS,
            vec![0; 4 * 66],
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("toy.gguf");
        std::fs::write(&p, w.bytes()).unwrap();
        let mut o = GgufKvOptions {
            parallel: 4,
            gpu_memory: Some((1 << 30, "test".into())),
            reserve_bytes: 0,
            ..Default::default()
        };
        let r = inspect_path(&p, &o).unwrap();
        assert_eq!(r.file_type.as_deref(), Some("MOSTLY_Q4_1 (3)"));
        let q41 = r.types.iter().find(|t| t.ggml_type == "Q4_1").unwrap();
        assert_eq!((q41.tensors, q41.elements, q41.bytes), (2, 8192, 5120));
        let q = r
            .modules
            .iter()
            .find(|m| m.module == "blk.*.attn_q.weight")
            .unwrap();
        assert_eq!(
            (q.layers.as_str(), q.count, q.bytes_per_weight),
            ("0-1", 2, 0.625)
        );
        assert_eq!(r.modules[0].module, "token_embd.weight");
        assert!(
            r.notes.iter().any(|n| n.contains("IQ2_XXS")),
            "{:?}",
            r.notes
        );
        assert!(r.notes.iter().any(|n| n.contains("tied")));
        // 2 layers × 2 KV heads × (16 + 16) × 2 bytes = 256 B per token.
        assert_eq!(r.kv.bytes_per_token, Some(256));
        assert_eq!(
            (r.kv.ctx_size, r.kv.tokens_per_slot),
            (Some(1024), Some(256))
        );
        assert_eq!(r.kv.kv_bytes, Some(256 * 1024));
        assert_eq!(r.kv.fits, Some(true));
        let md = render_markdown(&r);
        assert!(
            md.contains("-np 4") && md.contains("f16") && md.contains("IQ2_XXS"),
            "{md}"
        );
        o.ctx_size = Some(4096);
        o.kv_type = ("f32".into(), 4.0);
        let r = inspect_path(&p, &o).unwrap();
        assert_eq!(r.kv.kv_bytes, Some(4096 * 512));
        assert!(r.kv.ctx_source.contains("-c 4096"));
    }
}
