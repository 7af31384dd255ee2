//! End-to-end engine runs: OpenAI streaming client, executors, workloads, Prometheus scrape,
//! engine boot-log parsing, engine launcher.

use serde::{Deserialize, Serialize};

/// End-to-end results (filled in by `rigbench e2e`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct E2eResults {}
