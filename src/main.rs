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
            // Secrets (a --url's credentials, an engine's key in its log tail) and terminal
            // control sequences never reach the terminal; hosts and paths stay.
            let r = rigbench::output::redact::Redactor::for_this_host(true);
            eprintln!("error: {}", r.secrets_only(&err.to_string()));
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {}", r.secrets_only(&cause.to_string()));
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
