//! Qwen3.5 / Qwen3.6 hybrids: the layer mix and the Gated-DeltaNet dimensions live with the
//! model's configuration in `crate::model::hybrid` (docs/architecture.md); re-exported here so
//! the runtime's paths read as before.

pub use crate::model::hybrid::*;
