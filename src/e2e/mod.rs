//! End-to-end engine runs: OpenAI streaming client, executors, workloads, Prometheus scrape,
//! engine boot-log parsing, engine launcher.

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

/// Options of an end-to-end run for the report (filled in by `rigbench e2e`).
#[derive(Debug, Clone, Default)]
pub struct E2eOptions {}

/// Run end-to-end measurements for `rigbench report`.
pub fn run_for_report(_opts: &E2eOptions) -> anyhow::Result<E2eResults> {
    anyhow::bail!("end-to-end runs are not implemented yet")
}
