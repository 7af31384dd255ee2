//! Model facts from a Hugging Face `config.json`: the lenient reader `inspect` uses lives with
//! the runtime's in `crate::model::facts` (docs/architecture.md); re-exported here so the
//! checkpoint's paths read as before.

pub use crate::model::facts::*;
