//! `rigbench compare`: see the module docs of `crate::compare` for what it does.

use crate::ExitStatus;

/// Arguments of `rigbench compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {}

/// Run `rigbench compare`.
pub fn run(_args: CompareArgs) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("rigbench compare is not implemented yet")
}
