//! `rigbench inspect DIR`: see the module docs of `crate::checkpoint` for what it does.
//!
//! Exit codes: 0 no error-severity finding; 4 ([`ExitStatus::LintErrors`]) at least one;
//! 1 bad input (missing folder or config.json, malformed metadata or headers).

use std::path::PathBuf;

use crate::checkpoint::{self, InspectOptions, KvCacheDtype};
use crate::output::redact::Redactor;
use crate::{ExitStatus, RigError};

/// Arguments of `rigbench inspect`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Inspect))]
pub struct InspectArgs {
    /// The checkpoint folder (config.json, optional hf_quant_config.json and safetensors), a
    /// GGUF file (or a folder holding one and no config.json), or
    /// hf://ORG/NAME[@REV] to read config files and safetensors headers from the Hugging Face hub
    /// with range requests (no weights downloaded; HF_ENDPOINT for a mirror, HF_TOKEN for gated
    /// repos).
    pub dir: PathBuf,
    /// Print JSON (the `checkpoint` object of the results schema) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Classify formats for this compute capability (e.g. sm_90, 12.0) instead of the probed GPU.
    #[arg(long, value_name = "CC")]
    pub cc: Option<String>,
    /// GPU memory for the capacity prediction, GiB (default: the probed GPU's memory).
    #[arg(long, value_name = "GIB")]
    pub gpu_mem_gib: Option<f64>,
    /// Fraction of GPU memory the engine may use (vLLM --gpu-memory-utilization).
    #[arg(long, default_value_t = 0.9, value_name = "F")]
    pub gpu_memory_utilization: f64,
    /// Tokens per request for the concurrency figure (default: config max_position_embeddings).
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<u64>,
    /// KV-cache dtype for the prediction: auto (the checkpoint's declaration, else the model
    /// dtype), bf16, fp16, fp8 or fp32.
    #[arg(long, default_value = "auto", value_name = "DTYPE")]
    pub kv_cache_dtype: String,
    /// Memory assumed for activations, the CUDA-graph pool and the CUDA context, GiB.
    #[arg(long, default_value_t = 1.5, value_name = "GIB")]
    pub reserve_gib: f64,
    /// Gated-DeltaNet hybrids: reserve the recurrent state of this many sequences before the KV
    /// cache, as rigbench's built-in runtime does (one slot per --max-num-seqs); default: one
    /// sequence's state, as vLLM's shared-pool allocator.
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<u64>,
    /// GGUF files: llama.cpp's `-c`, the KV cells it allocates (default: the model's
    /// context_length, as `-c 0`).
    #[arg(long, value_name = "N")]
    pub ctx_size: Option<u64>,
    /// GGUF files: llama.cpp's `-np`, the parallel slots sharing the context.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub parallel: u64,
    /// Predict "What will run" for this engine and version: per layer class the kernel the
    /// engine selects, whether it is native, its warning and the rule's source. ENGINE==VERSION:
    /// vllm==0.23 … vllm==0.34, or sglang==0.5. Needs a card: --cc, or the probed GPU.
    #[arg(long, value_name = "ENGINE==VERSION")]
    pub engine: Option<String>,
    /// Do not redact host name, user paths and IP addresses.
    #[arg(long)]
    pub no_redact: bool,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn gib_bytes(flag: &str, v: f64) -> Result<u64, RigError> {
    if !(0.0..1e9).contains(&v) {
        return Err(RigError::flag(
            flag,
            format!("{v} is not a size in GiB; give a number of GiB from 0 up to 1e9, e.g. 141"),
        ));
    }
    Ok((v * GIB).round() as u64)
}

/// Build [`InspectOptions`] from the flags, probing the GPU only when `--cc` or
/// `--gpu-mem-gib` leaves something to find out.
pub fn options(args: &InspectArgs) -> Result<InspectOptions, RigError> {
    let mut o = InspectOptions::default();
    if !(args.gpu_memory_utilization > 0.0 && args.gpu_memory_utilization <= 1.0) {
        return Err(RigError::flag(
            "--gpu-memory-utilization",
            format!("{} is not in (0, 1]", args.gpu_memory_utilization),
        ));
    }
    o.gpu_memory_utilization = args.gpu_memory_utilization;
    o.reserve_bytes = gib_bytes("--reserve-gib", args.reserve_gib)?;
    if args.max_num_seqs == Some(0) {
        return Err(RigError::flag("--max-num-seqs", "must be at least 1"));
    }
    o.max_num_seqs = args.max_num_seqs;
    if let Some(l) = args.max_model_len {
        if l == 0 {
            return Err(RigError::flag("--max-model-len", "must be at least 1"));
        }
        o.max_model_len = Some(l);
    }
    o.kv_cache_dtype = match args.kv_cache_dtype.trim().to_ascii_lowercase().as_str() {
        "auto" => None,
        other => Some(
            other
                .parse::<KvCacheDtype>()
                .map_err(|e| RigError::flag("--kv-cache-dtype", e))?,
        ),
    };
    let cc = match &args.cc {
        Some(s) => {
            Some(crate::rig::capability::parse_card(s).map_err(|e| RigError::flag("--cc", e))?)
        }
        None => None,
    };
    let mem = match args.gpu_mem_gib {
        Some(g) => {
            let b = gib_bytes("--gpu-mem-gib", g)?;
            if b == 0 {
                return Err(RigError::flag("--gpu-mem-gib", "must be above 0"));
            }
            Some(b)
        }
        None => None,
    };
    if cc.is_none() || mem.is_none() {
        let probed = InspectOptions::from_rig(&crate::rig::probe());
        if cc.is_none() {
            o.cc = probed.cc;
            o.card = probed.card.clone();
            o.no_card_reason = probed.no_card_reason.clone();
        }
        if mem.is_none() {
            o.gpu_memory_bytes = probed.gpu_memory_bytes;
            o.gpu_memory_source = probed.gpu_memory_source;
        }
    }
    if let Some(c) = cc {
        o.cc = Some(c);
        o.card = Some("--cc".into());
        o.no_card_reason = None;
    }
    if let Some(b) = mem {
        o.gpu_memory_bytes = Some(b);
        o.gpu_memory_source = Some("--gpu-mem-gib".into());
    }
    if let Some(e) = &args.engine {
        o.engine = Some(
            e.parse::<checkpoint::predict::EngineSpec>()
                .map_err(|e| RigError::flag("--engine", e))?,
        );
        if o.cc.is_none() {
            return Err(RigError::flag(
                "--cc",
                format!(
                    "--engine predicts for a card and none is known ({}): give --cc sm_XX, e.g. --cc sm_90, sm_100, sm_120 or 12.1",
                    o.no_card_reason.as_deref().unwrap_or("no GPU probed")
                ),
            ));
        }
    }
    Ok(o)
}

/// For `hf://ORG/NAME[@REV]`: fetch its config files and safetensors headers from the hub with
/// range requests into a temporary folder (see `crate::checkpoint::hub`; `HF_ENDPOINT` names a
/// mirror, `HF_TOKEN` a token for gated repos). `Ok(None)` for a local path.
///
/// # Errors
/// A malformed reference (a flag error), an unreachable hub, a missing repository.
pub fn fetch_hub(
    arg: &std::path::Path,
) -> anyhow::Result<Option<(tempfile::TempDir, checkpoint::hub::HubRef)>> {
    let arg = arg.to_string_lossy();
    if !checkpoint::hub::is_hub_ref(&arg) {
        return Ok(None);
    }
    let r: checkpoint::hub::HubRef = arg.parse().map_err(|e: String| RigError::flag("DIR", e))?;
    let endpoint = std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| checkpoint::hub::DEFAULT_ENDPOINT.to_string());
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    let tmp = tempfile::tempdir()?;
    let fetched =
        checkpoint::hub::fetch_metadata_blocking(&r, &endpoint, token.as_deref(), tmp.path())?;
    eprintln!(
        "read {} and {} safetensors header(s) of {r} from {endpoint} ({} bytes; no weights downloaded)",
        fetched.files.join(", "),
        fetched.shards.len(),
        fetched.bytes_read
    );
    Ok(Some((tmp, r)))
}

/// Inspect a checkpoint folder, or `hf://ORG/NAME[@REV]` (see [`fetch_hub`]).
///
/// # Errors
/// What [`fetch_hub`] or [`checkpoint::inspect`] refuse.
pub fn inspect_any(
    dir: &std::path::Path,
    opts: &InspectOptions,
) -> anyhow::Result<checkpoint::InspectReport> {
    match fetch_hub(dir)? {
        None => checkpoint::inspect(dir, opts),
        Some((tmp, r)) => {
            let mut report = checkpoint::inspect(tmp.path(), opts)?;
            report.checkpoint = r.to_string();
            Ok(report)
        }
    }
}

/// The llama.cpp KV settings of `rigbench inspect FILE.gguf` from the flags.
///
/// # Errors
/// `--parallel 0`, `--ctx-size 0`, or `--kv-cache-dtype fp8` (llama.cpp has no FP8 KV cache).
pub fn gguf_options(
    args: &InspectArgs,
    opts: &InspectOptions,
) -> Result<checkpoint::gguf_inspect::GgufKvOptions, RigError> {
    if args.parallel == 0 {
        return Err(RigError::flag("--parallel", "must be at least 1"));
    }
    if args.ctx_size == Some(0) {
        return Err(RigError::flag(
            "--ctx-size",
            "0 means the model's context_length: leave the flag out for that",
        ));
    }
    let kv_type = match opts.kv_cache_dtype {
        None | Some(KvCacheDtype::F16) => ("f16".to_string(), 2.0),
        Some(KvCacheDtype::Bf16) => ("bf16".to_string(), 2.0),
        Some(KvCacheDtype::F32) => ("f32".to_string(), 4.0),
        Some(KvCacheDtype::Fp8) => {
            return Err(RigError::flag(
                "--kv-cache-dtype",
                "llama.cpp has no FP8 KV cache (its -ctk/-ctv types are f16, bf16, f32, q8_0, q4_0, ...); use fp16, bf16 or fp32 for a GGUF file",
            ))
        }
    };
    Ok(checkpoint::gguf_inspect::GgufKvOptions {
        ctx_size: args.ctx_size,
        parallel: args.parallel,
        kv_type,
        gpu_memory: opts
            .gpu_memory_bytes
            .map(|b| (b, opts.gpu_memory_source.clone().unwrap_or_default())),
        reserve_bytes: opts.reserve_bytes,
    })
}

/// Run `rigbench inspect`: 0 without lint errors, 4 with, 1 on bad input, 64 on a bad flag value.
pub fn run(args: InspectArgs) -> anyhow::Result<ExitStatus> {
    let opts = options(&args)?;
    if checkpoint::gguf::is_gguf_path(&args.dir) {
        if args.engine.is_some() {
            return Err(RigError::flag(
                "--engine",
                "the prediction covers safetensors checkpoints (config.json + quantization metadata), not GGUF files",
            )
            .into());
        }
        let g = checkpoint::gguf_inspect::inspect_path(&args.dir, &gguf_options(&args, &opts)?)?;
        let redactor = Redactor::for_this_host(!args.no_redact);
        if args.json {
            let mut v = serde_json::to_value(&g)?;
            redactor.redact_json(&mut v);
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            print!(
                "{}",
                redactor.redact(&checkpoint::gguf_inspect::render_markdown(&g))
            );
        }
        return Ok(ExitStatus::Ok);
    }
    let mut report = inspect_any(&args.dir, &opts)?;
    // Redaction applies to what the checkpoint and the command line supplied, never to
    // rigbench's own words.
    let redactor = Redactor::for_this_host(!args.no_redact);
    if redactor.enabled() {
        report.redact_inputs(&|s: &str| redactor.redact(s));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", checkpoint::render_markdown(&report));
    }
    Ok(if report.has_errors() {
        ExitStatus::LintErrors
    } else {
        ExitStatus::Ok
    })
}
