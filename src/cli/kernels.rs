//! `rigbench kernels`.

use crate::ExitStatus;

/// Arguments of `rigbench kernels`.
#[derive(Debug, clap::Args)]
pub struct KernelsArgs {}

/// Run `rigbench kernels`.
pub fn run(_args: KernelsArgs) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("rigbench kernels is not implemented yet")
}
