//! `rigbench inspect`: see the module docs of `crate::checkpoint` for what it does.

use crate::ExitStatus;

/// Arguments of `rigbench inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {}

/// Run `rigbench inspect`.
pub fn run(_args: InspectArgs) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("rigbench inspect is not implemented yet")
}
