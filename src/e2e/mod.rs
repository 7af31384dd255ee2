//! End-to-end engine runs: OpenAI streaming client, executors, workloads, Prometheus scrape,
//! engine boot-log parsing, engine launcher.

pub mod bootlog;
pub mod client;
pub mod executor;
pub mod metrics;
pub mod prometheus;
pub mod prompts;
pub mod workload;

use serde::{Deserialize, Serialize};

/// End-to-end results (filled in by `rigbench e2e`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct E2eResults {}

/// Render end-to-end results as Markdown (the report's e2e section: conditions first, then
/// latency and throughput tables, with links to the plots written by [`write_plots`]).
pub fn render_markdown(_results: &E2eResults) -> String {
    String::new()
}

/// Write the e2e plots (SVG) into `dir`; returns the file names written (relative to `dir`).
pub fn write_plots(_results: &E2eResults, _dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    Ok(Vec::new())
}
