//! `rigbench rig`: probe the card and stack; print the facts and the format-capability table.

use crate::output::redact::Redactor;
use crate::rig::capability;
use crate::rig::render::render;
use crate::ExitStatus;

/// Arguments of `rigbench rig`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::help::after_help(crate::cli::help::Cmd::Rig))]
pub struct RigArgs {
    /// Print JSON (the `rig` object of the results schema) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also print the capability table for every compute capability from sm_75 to sm_121.
    #[arg(long)]
    pub all: bool,
    /// Do not redact host name, user paths and IP addresses.
    #[arg(long)]
    pub no_redact: bool,
}

/// Run `rigbench rig`. Exits 0 with or without a GPU.
pub fn run(args: RigArgs) -> anyhow::Result<ExitStatus> {
    let facts = crate::rig::probe();
    let redactor = Redactor::for_this_host(!args.no_redact);
    if args.json {
        let mut v = serde_json::to_value(&facts)?;
        if args.all {
            v["capabilities_by_compute_capability"] = serde_json::to_value(
                capability::KNOWN
                    .iter()
                    .map(|(cc, arch)| {
                        serde_json::json!({"compute_capability": cc.to_string(), "architecture": arch, "capabilities": capability::table(*cc)})
                    })
                    .collect::<Vec<_>>(),
            )?;
        }
        redactor.redact_json(&mut v);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", redactor.redact(&render(&facts, args.all, &redactor)));
    }
    Ok(ExitStatus::Ok)
}
