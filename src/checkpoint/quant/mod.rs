//! Quantization metadata in the forms in use, and the rule that says which format a module is
//! declared in.
//!
//! Forms read:
//! - ModelOpt `hf_quant_config.json`: `{"producer": {...}, "quantization": {"quant_algo",
//!   "kv_cache_quant_algo", "group_size", "exclude_modules", "quantized_layers"}}`
//!   (`quant_algo: MIXED_PRECISION` with per-module `quantized_layers`).
//! - config.json `quantization_config` with `quant_method: modelopt` (ModelOpt ≥ 0.31 "flat"
//!   form: `quant_algo`, `kv_cache_scheme`, `ignore`, `quantized_layers`, `config_groups`).
//! - config.json `quantization_config` with `quant_method: compressed-tensors` (`config_groups`
//!   with `targets`, `weights`, `input_activations`, `format`; `ignore`; `kv_cache_scheme`).
//! - Other `quant_method`s (`fp8`, `mxfp4`, `gptq`, `awq`, ...) as one format for every Linear
//!   layer minus `modules_to_not_convert` / `ignored_layers`.
//!
//! Matching follows the engines: ModelOpt exclude entries match by equality, substring or
//! `fnmatch` wildcard (vLLM `ModelOptQuantConfigBase.is_layer_excluded`); `quantized_layers`
//! keys match the module or one of its parents (vLLM `ModelOptMixedPrecisionConfig.
//! _resolve_quant_algo`); compressed-tensors targets match by exact name, `re:` regex with
//! Python `re.match` semantics (anchored at the start), or a class name such as `Linear`.
//!
//! Files: `rules.rs` (name patterns, a source's rules and how a module name resolves to its
//! declared format), `parse.rs` (each metadata form read into rules and a source),
//! `summary.rs` (the report's types and the facts they cite, with the source engines follow).

mod parse;
mod rules;
mod summary;

pub(crate) use parse::{parse_config_quant, parse_hf_quant_config};
pub(crate) use rules::{Declared, Method, ModClass, Pattern, Rules};
pub(crate) use summary::{summarize, summarize_list};
pub use summary::{QuantFact, QuantGroup, QuantSource, QuantSummary};
