//! `rigbench e2e`: see the module docs of `crate::e2e` for what it does.

use crate::ExitStatus;

/// Arguments of `rigbench e2e`.
#[derive(Debug, clap::Args)]
pub struct E2eArgs {}

/// Run `rigbench e2e`.
pub fn run(_args: E2eArgs) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("rigbench e2e is not implemented yet")
}
