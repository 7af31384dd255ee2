//! The command line: clap derive, one file per subcommand. Each subcommand's `run` returns the
//! [`ExitStatus`] to exit with; errors travel up as `anyhow` chains and are printed by `main`.

use clap::{Parser, Subcommand};

use crate::ExitStatus;

pub mod board;
pub mod compare;
pub mod devcheck;
pub mod diagnose;
pub mod e2e;
pub mod help;
pub mod inspect;
pub mod kernels;
pub mod quality;
pub mod report;
pub mod rig;
pub mod serve;
pub mod serving;

/// rigbench: benchmark and validate quantized LLM inference (BF16, FP8, NVFP4) on NVIDIA GPUs.
///
/// The exit codes of every command are in [`help::exits`].
#[derive(Debug, Parser)]
#[command(name = "rigbench", version, about, long_about = None, propagate_version = true,
          after_help = help::after_help(help::Cmd::Top))]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The user's verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe the card and stack; print the format-capability table.
    Rig(rig::RigArgs),
    /// Microkernel benches: BF16, FP8 W8A8, W4A16 NVFP4, W4A4 NVFP4 over a suite's shapes and M.
    Kernels(kernels::KernelsArgs),
    /// Read a checkpoint's metadata (never its weights): formats, lint findings, KV capacity.
    Inspect(inspect::InspectArgs),
    /// Run the built-in minimal runtime behind an OpenAI-compatible HTTP server.
    Serve(serve::ServeArgs),
    /// Drive end-to-end runs against the built-in runtime or an OpenAI-compatible engine.
    E2e(e2e::E2eArgs),
    /// The main job: rig + kernels + e2e (+ inspect) into one rig report.
    Report(Box<report::ReportArgs>),
    /// Compare results with a baseline; statistical verdict per metric; exit code for CI.
    Compare(compare::CompareArgs),
    /// Explain an engine's logs and /metrics against the checkpoint and the card.
    Diagnose(diagnose::DiagnoseArgs),
    /// One table of many rigs' reports: decode-step composite, e2e tok/s, KV capacity.
    Board(board::BoardArgs),
    /// A reference against candidates on the same model: fidelity, task pack, verdict.
    Quality(quality::QualityArgs),
    /// Developer checks of the CUDA runtime (parity with the CPU, kernel checks, speed).
    #[command(hide = true)]
    Devcheck(devcheck::DevcheckArgs),
}

/// Parse the process arguments. On a bad command line, prints clap's message and returns
/// [`ExitStatus::Usage`]; `--help` and `--version` print and return [`ExitStatus::Ok`].
pub fn parse() -> Result<Cli, ExitStatus> {
    parse_from(std::env::args_os())
}

/// [`parse`] over explicit arguments (the first is the program name).
pub fn parse_from<I, T>(args: I) -> Result<Cli, ExitStatus>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => Ok(cli),
        Err(e) => {
            let _ = e.print();
            Err(if e.use_stderr() {
                ExitStatus::Usage
            } else {
                ExitStatus::Ok
            })
        }
    }
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitStatus> {
    match cli.command {
        Command::Rig(a) => rig::run(a),
        Command::Kernels(a) => kernels::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Serve(a) => serve::run(a),
        Command::E2e(a) => e2e::run(a),
        Command::Devcheck(a) => devcheck::run(a),
        Command::Report(a) => report::run(*a),
        Command::Compare(a) => compare::run(a),
        Command::Diagnose(a) => diagnose::run(a),
        Command::Board(a) => board::run(a),
        Command::Quality(a) => quality::run(a),
    }
}

/// A suite given with `suite_flag` that cannot be used (no such name, a missing or malformed
/// file) is a bad value of that flag (exit 64), as in every command that takes a suite; the
/// message still names the file.
pub fn suite_error(suite_flag: &str, e: crate::RigError) -> crate::RigError {
    use crate::RigError;
    match e {
        RigError::BadFile { path, message } => {
            RigError::flag(suite_flag, format!("{}: {message}", path.display()))
        }
        RigError::BadFlag { message, .. } => RigError::flag(suite_flag, message),
        other => other,
    }
}

pub use crate::output::shell::{command_line, shell_quote};

/// Parse a comma-separated list flag (`--m 1,16,64`), naming the flag in the error.
pub fn parse_list<T: std::str::FromStr>(flag: &str, raw: &str) -> Result<Vec<T>, crate::RigError>
where
    T::Err: std::fmt::Display,
{
    // What a list of numbers looks like, for the message (other types say what they expect).
    let ty = std::any::type_name::<T>();
    let example = if ["usize", "u32", "u64"].contains(&ty) {
        "; give whole numbers separated by commas, e.g. 1,16,256"
    } else if ty == "f64" {
        "; give numbers separated by commas, e.g. 0.5,1,2"
    } else {
        ""
    };
    let mut out = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        out.push(
            part.parse::<T>()
                .map_err(|e| crate::RigError::flag(flag, format!("'{part}': {e}{example}")))?,
        );
    }
    if out.is_empty() {
        return Err(crate::RigError::flag(flag, format!("empty list{example}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{parse_list, shell_quote};

    #[test]
    fn the_command_line_keeps_its_quoting() {
        assert_eq!(shell_quote("--url"), "--url");
        assert_eq!(
            shell_quote("http://127.0.0.1:8000"),
            "http://127.0.0.1:8000"
        );
        assert_eq!(shell_quote("echo boom; exit 3"), "'echo boom; exit 3'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a*b"), "'a*b'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        // What a shell makes of the quoted words is the original argument list.
        let args = ["report", "--engine-cmd", "echo 'boom'; exit 3", "", "x y"];
        let line: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "for a in {}; do printf '[%s]' \"$a\"; done",
                line.join(" ")
            ))
            .output()
            .expect("sh runs");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "[report][--engine-cmd][echo 'boom'; exit 3][][x y]"
        );
    }

    #[test]
    fn a_bad_list_item_names_the_flag_the_item_and_the_form() {
        let e = parse_list::<usize>("--m", "1,abc").unwrap_err().to_string();
        assert!(
            e.contains("--m") && e.contains("'abc'") && e.contains("e.g. 1,16,256"),
            "{e}"
        );
        let e = parse_list::<f64>("--rate", "x").unwrap_err().to_string();
        assert!(e.contains("--rate") && e.contains("e.g. 0.5,1,2"), "{e}");
        let e = parse_list::<String>("--shapes", " , ")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shapes") && e.contains("empty list"), "{e}");
    }
}
