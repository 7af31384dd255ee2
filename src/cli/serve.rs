//! `rigbench serve`: see the module docs of `crate::runtime` for what it does.

use crate::ExitStatus;

/// Arguments of `rigbench serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

/// Run `rigbench serve`.
pub fn run(_args: ServeArgs) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("rigbench serve is not implemented yet")
}
