//! The built-in minimal runtime: model, weights, backends, paged KV cache, prefix cache,
//! scheduler, sampler, speculative decoding and the OpenAI-compatible server.
//! No CUDA call is made here: the CUDA backend ([`backend::cuda`]) runs its kernels through the
//! gpu crate ([`crate::gpu`]) and its linear layers through the GEMM layer ([`crate::gemm`], the
//! operations the kernel bench times); the runtime never names the kernel bench
//! (`crate::kernels`, checked by `tests/it/architecture.rs`).
//!
//! Map:
//! - [`config`]: [`ServeConfig`], weight formats and `--quantize` recipes; the model shape
//!   (`config.json` or a preset) is `crate::model`'s, re-exported here;
//! - [`weights`]: BF16 / FP8 / NVFP4 linear weights, safetensors loading, seeded synthesis;
//! - [`tokenizer`], [`template`]: `tokenizer.json` or byte-level; Jinja chat templates;
//! - [`gguf_model`], [`gguf_tokenizer`]: GGUF checkpoints (weights dequantized to BF16,
//!   tokenizer and chat template from the metadata);
//! - [`model`]: the decoder's math (RMSNorm, RoPE, SwiGLU, attention);
//! - [`hybrid`], [`gdn`]: Qwen3.5 / 3.6 hybrids: the layer mix (re-exported from
//!   `crate::model`); the Gated-DeltaNet math (causal convolution, chunked and recurrent gated
//!   delta rule, gated RMSNorm) and the per-sequence state;
//! - [`moe`]: mixtures of experts: routing (softmax, top-k, renormalisation) and the sparse
//!   block on the CPU, the routing distributions and the touched-bytes floor of a decode step;
//! - [`backend`]: the device interface ([`backend::Backend`]), the CPU backend (the reference)
//!   and the CUDA backend ([`backend::cuda`], by concern: load, tune, gemm, gemv, forward,
//!   attention, plan, profile and the self-checks);
//! - [`kv_cache`], [`prefix_cache`]: paged KV blocks, capacity, hashing of full blocks;
//! - [`device`]: `--device` resolution; [`memory`]: the memory planner (weights fit, KV budget);
//! - [`scheduler`], [`sampler`], [`spec`]: continuous batching with chunked prefill and
//!   preemption; sampling; n-gram speculative decoding;
//! - [`direct`]: a backend driven without the scheduler (what the checks and benchmarks of
//!   `crate::runtime_eval` drive);
//! - [`engine`]: the engine thread; [`vllm_metrics`]: Prometheus text with vLLM's names;
//! - [`server`]: the HTTP server, [`server::start`] and [`server::ServerHandle`];
//!   [`serve_guard`]: its connection limit, timeouts, API key and accept loop.
//!
//! This is the engine only: its benchmarks, checks and report section are in
//! `crate::runtime_eval` (docs/architecture.md).

pub mod backend;
pub mod config;
pub mod device;
pub mod direct;
pub mod engine;
pub mod gdn;
pub mod gguf_model;
pub mod gguf_tokenizer;
pub mod hybrid;
pub mod kv_cache;
pub mod memory;
pub mod model;
pub mod moe;
pub mod prefix_cache;
pub mod request_fields;
pub mod sampler;
pub mod scheduler;
pub mod serve_guard;
pub mod server;
pub mod spec;
pub mod template;
pub mod tokenizer;
pub mod vllm_metrics;
pub mod weights;

pub use config::{KvCacheDtype, ModelConfig, ServeConfig, SpecConfig, WeightFormat};
