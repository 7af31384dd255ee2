//! `rigbench` binary: parse, run, map the outcome to an exit code, print errors with their chain.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match rigbench::cli::parse() {
        Ok(cli) => cli,
        Err(status) => return status.into(),
    };
    match rigbench::cli::run(cli) {
        Ok(status) => status.into(),
        Err(err) => {
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            // A value rigbench rejected for a flag is a bad command line, like one clap rejects.
            let usage = err.chain().any(|c| {
                matches!(
                    c.downcast_ref::<rigbench::RigError>(),
                    Some(rigbench::RigError::BadFlag { .. })
                )
            });
            if usage {
                rigbench::ExitStatus::Usage.into()
            } else {
                rigbench::ExitStatus::Error.into()
            }
        }
    }
}
