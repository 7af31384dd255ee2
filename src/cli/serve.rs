//! `rigbench serve`: the built-in minimal runtime behind an OpenAI-compatible HTTP server; see
//! the module docs of `crate::runtime` for what it does.
//!
//! At start it prints the KV lines in vLLM's form (`Available KV cache memory: X GiB`,
//! `GPU KV cache size: N tokens` — `CPU KV cache size` on the CPU backend —, `Maximum
//! concurrency for L tokens per request: X.XXx`) and then `rigbench serve: listening on
//! http://HOST:PORT` on stdout, flushed; launchers parse the latter to find the port. It binds
//! the port before it loads the model (a busy port fails at once), and serves until Ctrl-C (or
//! SIGTERM, or SIGHUP), which also stops it while the model loads (exit 0 either way).
//!
//! Against hostile clients (`crate::runtime::serve_guard`): `--api-key` (or `VLLM_API_KEY`) on
//! every route, a connection limit, header-read and body timeouts, a limit on the messages of
//! one chat request, and a warning on stderr when it listens beyond loopback.

use std::io::Write;

use crate::runtime::backend::Device;
use crate::runtime::config::{parse_size, KvCacheDtype, QuantRecipe, ServeConfig, SpecConfig};
use crate::runtime::device::{probe_gpus, resolve_device, GpuPresence};
use crate::{ExitStatus, RigError};

pub use crate::runtime::engine::DEFAULT_MAX_NUM_SEQS;

/// Arguments of `rigbench serve`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Serve))]
pub struct ServeArgs {
    /// `synthetic:tiny`, `synthetic:qwen3-8b`, `synthetic:qwen3-32b`, `synthetic:tiny-hybrid`,
    /// `synthetic:qwen3.6-27b` (seeded weights at the real dimensions; the last two are
    /// Gated-DeltaNet hybrids), a local checkpoint directory (config.json + *.safetensors), or
    /// a GGUF file (llama.cpp's format; `llama` and `qwen3` architectures; F32, F16, BF16, Q4_0,
    /// Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K–Q6_K weights, dequantized to BF16 at load; tokenizer and
    /// chat template from the file), e.g. the SmolLM2 that scripts/fetch-smollm2.sh fetches.
    #[arg(long, default_value = "synthetic:tiny")]
    pub model: String,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind; 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Quantize BF16 weights at load: bf16, fp8 (W8A8, E4M3 per-tensor), nvfp4 (W4A16,
    /// ModelOpt layout), or nvfp4-mixed (NVIDIA's Qwen3.6-NVFP4 recipe for hybrids: NVFP4 MLP
    /// and lm_head, FP8 attention and Gated-DeltaNet projections, BF16 in_proj_a/in_proj_b).
    /// Weights stay in that format and are dequantized in the matmul.
    #[arg(long)]
    pub quantize: Option<QuantRecipe>,
    /// Seed of synthesized weights and of requests without a seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep only the first N decoder layers (run real-dimension presets on a small machine).
    #[arg(long)]
    pub num_layers: Option<usize>,
    /// Where to run: cuda, cuda:N or cpu (default: cuda:0 when a GPU is present, else cpu).
    /// `--device cuda` without a GPU is an error (exit 64).
    #[arg(long)]
    pub device: Option<Device>,
    /// Fraction of GPU memory the engine may use, (0, 1] (default 0.9, as vLLM): the KV cache
    /// gets this fraction of the total less what weights, activations and workspace use.
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV cache budget: bytes or a human size (256MiB, 1.5GiB, 512MB). Wins over
    /// --gpu-memory-utilization; the CPU backend's default is 512MiB.
    #[arg(long, value_parser = parse_size)]
    pub kv_cache_memory: Option<u64>,
    /// KV cache element type: bf16 or fp8 (E4M3 with per-layer scales).
    #[arg(long, default_value = "bf16")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Most requests running at once (a Gated-DeltaNet hybrid reserves one recurrent state per
    /// sequence, and runs fewer when the KV budget cannot hold them all).
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks + decode tokens; chunked prefill).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Longest prompt + output (default: the model's max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Speculative decoding method: `ngram` (prompt lookup). Off by default.
    #[arg(
        long = "spec-method",
        alias = "speculative-method",
        value_name = "METHOD"
    )]
    pub speculative_method: Option<String>,
    /// k: draft tokens per step (with --spec-method).
    #[arg(long = "spec-k", alias = "num-speculative-tokens", value_name = "K")]
    pub num_speculative_tokens: Option<usize>,
    /// Shortest n-gram the prompt-lookup drafter matches.
    #[arg(long, default_value_t = 1)]
    pub prompt_lookup_min: usize,
    /// Longest n-gram the prompt-lookup drafter tries first.
    #[arg(long, default_value_t = 4)]
    pub prompt_lookup_max: usize,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Model name served in /v1/models and accepted in requests (default: --model).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// CPU threads for the matmul (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Every request (every route, `/health` and `/metrics` included) must carry
    /// `Authorization: Bearer KEY`; others get 401. Stricter than vLLM's `--api-key`, which
    /// checks only the `/v1/...` routes: a health probe needs the key here.
    #[arg(long, env = "VLLM_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Connections open at once; one more is answered 503 and closed (default: the process's
    /// file-descriptor limit less 64).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a whole request head, counted from when the server waits
    /// for it; also how long an idle kept-alive connection stays open.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub header_read_timeout: f64,
    /// Longest pause, in seconds, inside a request body; a client that stops half-way is
    /// answered 400 and disconnected.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub idle_timeout: f64,
    /// Longest time, in seconds, to receive a whole request body (a client that sends a byte
    /// now and then is answered 400 and disconnected).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub body_read_timeout: f64,
    /// Most messages one chat request may have; more is answered 400 naming this limit.
    #[arg(long, value_name = "N", default_value_t = crate::runtime::serve_guard::DEFAULT_MAX_CHAT_MESSAGES)]
    pub max_chat_messages: usize,
    /// Most log-probability alternatives per token a request may ask for (`logprobs`,
    /// `top_logprobs`, vLLM's `prompt_logprobs`); more is answered 400 naming the field. As
    /// vLLM's `--max-logprobs`: default 20, -1 for the whole vocabulary. `rigbench quality
    /// --top-k K` needs at least K.
    #[arg(long, value_name = "N", default_value_t = crate::runtime::serve_guard::DEFAULT_MAX_LOGPROBS as i64, allow_negative_numbers = true)]
    pub max_logprobs: i64,
}

/// A timeout flag's seconds as a [`std::time::Duration`], in (0, 86,400].
fn timeout_flag(flag: &str, secs: f64) -> Result<std::time::Duration, RigError> {
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(RigError::flag(
            flag,
            format!("{secs} is not a number of seconds in (0, 86400]"),
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

impl ServeArgs {
    /// The [`ServeConfig`] these flags describe, with `--device` resolved against this
    /// machine's GPUs.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] for inconsistent speculative-decoding flags, out-of-range values,
    /// or `--device cuda` without a GPU.
    pub fn to_config(&self) -> Result<ServeConfig, RigError> {
        // Probe only when it matters: an explicit `--device cpu` needs no driver.
        let gpus = match self.device {
            Some(Device::Cpu) => GpuPresence::default(),
            _ => probe_gpus(),
        };
        self.to_config_for(&gpus)
    }

    /// As [`Self::to_config`], for a given GPU presence (tests).
    ///
    /// # Errors
    /// As [`Self::to_config`].
    pub fn to_config_for(&self, gpus: &GpuPresence) -> Result<ServeConfig, RigError> {
        let speculative = match (
            self.speculative_method.as_deref(),
            self.num_speculative_tokens,
        ) {
            (None, None) => None,
            (None, Some(_)) => return Err(RigError::flag("--spec-k", "needs --spec-method ngram")),
            (Some(m), k) => {
                if m.eq_ignore_ascii_case("mtp") {
                    return Err(RigError::flag(
                        "--spec-method",
                        "'mtp' is not available in the built-in runtime: it does not load MTP draft layers, and on Gated-DeltaNet hybrids (Qwen3.5 / 3.6) MTP verification would also need every layer's recurrent state rolled back for rejected drafts; use ngram",
                    ));
                }
                if !m.eq_ignore_ascii_case("ngram") {
                    return Err(RigError::flag(
                        "--spec-method",
                        format!("'{m}' is not available in the built-in runtime; use ngram"),
                    ));
                }
                let k =
                    k.ok_or_else(|| RigError::flag("--spec-k", "required with --spec-method"))?;
                Some(SpecConfig {
                    num_speculative_tokens: k,
                    prompt_lookup_min: self.prompt_lookup_min,
                    prompt_lookup_max: self.prompt_lookup_max,
                })
            }
        };
        let c = ServeConfig {
            model: self.model.clone(),
            served_model_name: self.served_model_name.clone(),
            host: self.host.clone(),
            port: self.port,
            quantize: self.quantize,
            seed: self.seed,
            num_layers: self.num_layers,
            block_size: self.block_size,
            device: resolve_device(self.device, gpus)?,
            gpu_memory_utilization: self.gpu_memory_utilization,
            kv_cache_memory: self.kv_cache_memory,
            kv_cache_dtype: self.kv_cache_dtype,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            speculative,
            enable_prefix_caching: !self.no_prefix_caching,
            num_threads: self.threads,
            limits: crate::runtime::serve_guard::ServeLimits {
                max_connections: match self.max_connections {
                    Some(n) if !(1..=1_000_000).contains(&n) => {
                        return Err(RigError::flag(
                            "--max-connections",
                            format!("{n} is out of range 1..=1000000"),
                        ))
                    }
                    n => n,
                },
                header_read_timeout: timeout_flag(
                    "--header-read-timeout",
                    self.header_read_timeout,
                )?,
                idle_timeout: timeout_flag("--idle-timeout", self.idle_timeout)?,
                body_read_timeout: timeout_flag("--body-read-timeout", self.body_read_timeout)?,
                max_chat_messages: match self.max_chat_messages {
                    0 => return Err(RigError::flag("--max-chat-messages", "must be at least 1")),
                    n => n,
                },
                max_logprobs: match self.max_logprobs {
                    -1 => usize::MAX,
                    n if n >= 0 => n as usize,
                    n => {
                        return Err(RigError::flag(
                            "--max-logprobs",
                            format!(
                                "{n} is neither a count (0 or more) nor -1 (the whole vocabulary)"
                            ),
                        ))
                    }
                },
            },
            api_key: self
                .api_key
                .as_deref()
                .and_then(crate::runtime::serve_guard::ApiKey::new),
        };
        c.validate()?;
        Ok(c)
    }
}

/// Check a `rigbench serve` argument list (without the program name) as `serve` would, without
/// loading anything: `e2e` calls it before it starts the built-in engine, so a value the engine
/// would reject is a bad command line (exit 64) there too.
///
/// # Errors
/// [`RigError::BadFlag`] naming the flag (clap's parse errors name `--serve-arg`).
pub fn check_args(args: &[String]) -> Result<ServeConfig, RigError> {
    #[derive(clap::Parser)]
    #[command(name = "rigbench serve")]
    struct P {
        #[command(flatten)]
        a: ServeArgs,
    }
    let argv = std::iter::once("rigbench serve".to_string()).chain(args.iter().cloned());
    let p = <P as clap::Parser>::try_parse_from(argv).map_err(|e| {
        let msg = e.to_string();
        let first = msg
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        RigError::flag(
            "--serve-arg",
            format!("the built-in engine rejects it: {first}"),
        )
    })?;
    p.a.to_config()
}

/// Run `rigbench serve` until Ctrl-C or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<ExitStatus> {
    let config = args.to_config()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let status = rt.block_on(async move {
        // The handlers are in place before anything is said: Ctrl-C or SIGTERM while the model
        // loads stops it as it stops a serving server, exit 0 (the load runs on a blocking
        // thread, which the runtime's shutdown leaves behind).
        let signal = shutdown_signal()?;
        tokio::pin!(signal);
        // The port before the model: a busy one fails at once.
        let listener = crate::runtime::server::bind(&config).await?;
        if let Some(w) = listener.local_addr().ok().and_then(|a| {
            crate::runtime::serve_guard::exposure_warning(&a, config.api_key.is_some())
        }) {
            eprintln!("{w}");
        }
        eprintln!("rigbench serve: loading {} ...", config.model);
        let handle = tokio::select! {
            h = crate::runtime::server::start_on(listener, config) => h?,
            _ = &mut signal => {
                eprintln!("rigbench serve: stopped while loading the model");
                return Ok(ExitStatus::Ok);
            }
        };
        let i = handle.info();
        eprintln!(
            "rigbench serve: {} backend on {}, {}, {} layers, hidden {}, vocab {}, {} weights ({}), KV {}, tokenizer {}, chat template {}",
            i.backend,
            i.device,
            i.provenance.describe(),
            i.model_config.num_layers,
            i.model_config.hidden_size,
            i.model_config.vocab_size,
            i.weight_format.id(),
            crate::output::table::human_bytes(i.weight_bytes),
            i.kv.dtype.vllm_name(),
            i.tokenizer_source,
            i.template_source,
        );
        for n in &i.notes {
            eprintln!("rigbench serve: note: {n}");
        }
        {
            let mut out = std::io::stdout().lock();
            for l in handle.kv_lines() {
                writeln!(out, "{l}")?;
            }
            writeln!(out, "rigbench serve: listening on {}", handle.url())?;
            out.flush()?;
        }
        signal.await;
        eprintln!("rigbench serve: shutting down");
        handle.shutdown().await;
        Ok::<_, anyhow::Error>(ExitStatus::Ok)
    });
    // A model still loading on a blocking thread is not waited for.
    rt.shutdown_background();
    status
}

/// Resolves on the first SIGINT (Ctrl-C), SIGTERM or SIGHUP (a closed terminal or dropped ssh
/// session; as `crate::signals` treats it). The handlers are installed when this is
/// called (inside the runtime), not when the future is first polled, so a signal sent right
/// after is never missed.
///
/// # Errors
/// The signal streams cannot be set up.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        T::try_parse_from(v)
            .map_err(|e| e.to_string())?
            .a
            .to_config_for(&GpuPresence::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_map_to_config() {
        let c = parse(&[
            "--model",
            "synthetic:qwen3-8b",
            "--num-layers",
            "2",
            "--port",
            "0",
            "--quantize",
            "nvfp4",
            "--kv-cache-memory",
            "256MiB",
            "--kv-cache-dtype",
            "fp8",
            "--speculative-method",
            "ngram",
            "--num-speculative-tokens",
            "3",
            "--no-prefix-caching",
            "--served-model-name",
            "q",
        ])
        .unwrap();
        assert_eq!(c.kv_cache_memory, Some(256 << 20));
        assert_eq!(c.device, Device::Cpu, "no GPU: the default is the CPU");
        assert_eq!(
            c.quantize,
            Some(QuantRecipe::Uniform(crate::runtime::WeightFormat::Nvfp4))
        );
        assert_eq!(c.kv_cache_dtype, KvCacheDtype::Fp8);
        assert_eq!(c.speculative.as_ref().unwrap().num_speculative_tokens, 3);
        assert!(!c.enable_prefix_caching);
        assert_eq!(c.served_name(), "q");
        assert_eq!(c.num_layers, Some(2));
    }

    #[test]
    fn one_spelling_with_e2e_old_spellings_hidden() {
        let c = parse(&["--spec-method", "ngram", "--spec-k", "2"]).unwrap();
        assert_eq!(c.speculative.unwrap().num_speculative_tokens, 2);
        let c = parse(&[
            "--speculative-method",
            "ngram",
            "--num-speculative-tokens",
            "2",
        ])
        .unwrap();
        assert_eq!(c.speculative.unwrap().num_speculative_tokens, 2);
        use clap::CommandFactory;
        let help = T::command().render_long_help().to_string();
        assert!(
            help.contains("--spec-method") && help.contains("--spec-k"),
            "{help}"
        );
        assert!(
            !help.contains("--speculative-method") && !help.contains("--num-speculative-tokens")
        );
        assert!(help.contains("Exit codes"), "{help}");
        assert!(check_args(&["--spec-method".into(), "eagle".into()]).is_err());
    }

    #[test]
    fn bad_flags_are_named() {
        assert!(parse(&["--kv-cache-memory", "lots"])
            .unwrap_err()
            .contains("256MiB"));
        assert!(parse(&["--quantize", "int3"]).unwrap_err().contains("bf16"));
        assert!(parse(&["--num-speculative-tokens", "3"])
            .unwrap_err()
            .contains("--spec-method"));
        assert!(parse(&[
            "--speculative-method",
            "eagle",
            "--num-speculative-tokens",
            "3"
        ])
        .unwrap_err()
        .contains("ngram"));
        assert!(parse(&["--spec-method", "ngram"])
            .unwrap_err()
            .contains("--spec-k"));
        assert!(parse(&["--block-size", "0"])
            .unwrap_err()
            .contains("--block-size"));
        let e = parse(&["--device", "cuda"]).unwrap_err();
        assert!(e.contains("--device") && e.contains("no usable GPU"), "{e}");
        assert!(parse(&["--device", "tpu"]).unwrap_err().contains("cuda:N"));
        assert!(parse(&["--gpu-memory-utilization", "1.5"])
            .unwrap_err()
            .contains("--gpu-memory-utilization"));
        for (flag, v) in [
            ("--max-connections", "0"),
            ("--max-connections", "2000000"),
            ("--header-read-timeout", "0"),
            ("--header-read-timeout", "1e30"),
            ("--idle-timeout", "-1"),
            ("--idle-timeout", "NaN"),
            ("--max-chat-messages", "0"),
        ] {
            // `--flag=value`: clap takes `--flag -1` for two flags.
            let e = parse(&[&format!("{flag}={v}")]).unwrap_err();
            assert!(e.contains(flag), "{flag} {v}: {e}");
        }
    }

    #[test]
    fn hostile_client_flags_map_to_limits() {
        let c = parse(&[
            "--api-key",
            "k1",
            "--max-connections",
            "100",
            "--header-read-timeout",
            "2.5",
            "--idle-timeout",
            "7",
            "--max-chat-messages",
            "9",
            "--max-logprobs",
            "200",
        ])
        .unwrap();
        assert!(c.api_key.is_some());
        assert!(
            !format!("{c:?}").contains("k1"),
            "the key never shows in Debug"
        );
        assert_eq!(c.limits.max_connections, Some(100));
        assert_eq!(c.limits.header_read_timeout.as_millis(), 2500);
        assert_eq!(c.limits.idle_timeout.as_secs(), 7);
        assert_eq!(c.limits.max_chat_messages, 9);
        assert_eq!(c.limits.max_logprobs, 200);
        assert_eq!(
            parse(&[]).unwrap().limits.max_logprobs,
            20,
            "vLLM's default"
        );
        assert_eq!(
            parse(&["--max-logprobs", "-1"])
                .unwrap()
                .limits
                .max_logprobs,
            usize::MAX,
            "vLLM's -1: the whole vocabulary"
        );
        let e = parse(&["--max-logprobs", "-2"]).unwrap_err().to_string();
        assert!(e.contains("--max-logprobs"), "{e}");
        // An empty key is no key, as in vLLM.
        assert!(parse(&["--api-key", ""]).unwrap().api_key.is_none());
    }
}
