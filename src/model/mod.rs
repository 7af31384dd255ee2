//! The model's description, below both the checkpoint inspector and the runtime
//! (docs/architecture.md): the one home of `config.json` reading.
//!
//! - [`config`]: [`ModelConfig`], the decoder's shape the runtime runs (dense Qwen3 / Llama,
//!   the Qwen3.5 / 3.6 Gated-DeltaNet hybrids), the presets, and the strict reader
//!   ([`ModelConfig::parse_hf_config`]: every field that changes the math read or refused);
//!   [`dense`] and [`hybrid`] are its two families, [`rope`] their shared RoPE reader.
//! - [`facts`]: [`facts::ModelFacts`], the lenient reading `inspect` reports (anything a
//!   config may say, unknown left `None`), for models the runtime does not run too.
//! - [`moe`]: the sparse MLP blocks of Qwen3-MoE and Qwen3.5 / 3.6-MoE ([`moe::MoeConfig`]),
//!   their readers and the MoE presets.
//! - [`roles`]: the roles of a decoder layer's linear layers ([`roles::LinearRole`]).
//! - [`ConfigFile`]: `config.json` read and decoded once per model load, with the runtime's
//!   reading of it, so the runtime's loader and `inspect` (which the loader runs) share one
//!   decode.

pub mod config;
pub mod dense;
pub mod facts;
mod fields;
pub mod hybrid;
pub mod moe;
pub mod roles;
pub mod rope;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use config::{Arch, HfConfig, ModelConfig, RopeScaling};

use crate::RigError;

/// A checkpoint's `config.json`, read and decoded once: the top-level object, and the
/// runtime's reading of it ([`ModelConfig::from_hf_root`]) or why the runtime refuses it.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// The file (`<checkpoint>/config.json`), for messages.
    pub path: PathBuf,
    /// The decoded top-level object.
    pub root: Map<String, Value>,
    /// The runtime's reading, or its refusal (the whole error chain, as text).
    pub runtime: Result<HfConfig, String>,
}

impl ConfigFile {
    /// Wrap an already decoded object (read by the runtime's reader once, here).
    pub fn from_root(path: &Path, root: Map<String, Value>) -> Self {
        let runtime = ModelConfig::from_hf_root(&root).map_err(|e| format!("{e:#}"));
        ConfigFile {
            path: path.to_path_buf(),
            root,
            runtime,
        }
    }

    /// Read `dir/config.json` as `inspect` does.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file: missing (with the fix), unreadable, not UTF-8, not
    /// JSON, or not an object.
    pub fn read(dir: &Path) -> Result<Self, RigError> {
        let path = dir.join("config.json");
        let root = facts::read_json_object(&path).map_err(|e| match e {
            RigError::BadFile { path, message } if message == "not found" => RigError::file(
                path,
                "not found; a Hugging Face checkpoint folder needs config.json (download it with the weights' metadata)",
            ),
            other => other,
        })?;
        Ok(Self::from_root(&path, root))
    }

    /// Read `path` as the runtime does ([`ModelConfig::read_hf_config`]): the file and the
    /// runtime's reading of it.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file when it is unreadable, not JSON, or refused by the
    /// runtime's reader (its reason).
    pub fn read_for_runtime(path: &Path) -> anyhow::Result<(Self, HfConfig)> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RigError::file(path, format!("cannot read the model config: {e}")))?;
        let root =
            config::parse_json_root(&text).map_err(|e| RigError::file(path, format!("{e:#}")))?;
        let file = Self::from_root(path, root);
        let hf = file.runtime.clone().map_err(|e| RigError::file(path, e))?;
        Ok((file, hf))
    }
}
