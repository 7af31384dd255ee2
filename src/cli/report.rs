//! `rigbench report`.

use crate::ExitStatus;

/// Arguments of `rigbench report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {}

/// Run `rigbench report`.
pub fn run(_args: ReportArgs) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("rigbench report is not implemented yet")
}
