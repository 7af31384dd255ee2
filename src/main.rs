//! `rigbench` binary: parse, run, map the outcome to an exit code, print errors with their chain.

use std::process::ExitCode;

/// `eprintln!` that never panics when standard error is closed or hung up (as the library's,
/// src/lib.rs): the error line is dropped, the exit status stays.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    // A standard output whose reader goes away (`| head`) must not end the command early or
    // change its exit status (src/output/stdout_pipe.rs).
    let stdout = rigbench::output::stdout_pipe::guard();
    let code = run();
    if let Some(g) = stdout {
        g.finish(std::time::Duration::from_secs(5));
    }
    code
}

fn run() -> ExitCode {
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
