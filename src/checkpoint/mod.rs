//! Checkpoint inspection from metadata alone: config.json, hf_quant_config.json and safetensors
//! headers; per-module formats, lint findings, and predicted footprint and KV capacity.

use serde::{Deserialize, Serialize};

/// The result of inspecting one checkpoint (filled in by `rigbench inspect`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InspectReport {}

/// Render an inspection as Markdown (terminal output and the report's checkpoint section).
pub fn render_markdown(_report: &InspectReport) -> String {
    String::new()
}

/// Options of an inspection (filled in by `rigbench inspect`).
#[derive(Debug, Clone, Default)]
pub struct InspectOptions {}

/// Inspect the checkpoint folder `dir`.
pub fn inspect(dir: &std::path::Path, _opts: &InspectOptions) -> anyhow::Result<InspectReport> {
    anyhow::bail!(
        "checkpoint inspection of {} is not implemented yet",
        dir.display()
    )
}
