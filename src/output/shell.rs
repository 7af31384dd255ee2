//! A command line as a POSIX shell takes it back (the `Command:` line of reports).

/// `arg` as a POSIX shell word: unchanged when it holds only characters no shell treats
/// specially (letters, digits and `_ - . / : = , @ % + ^`), else in single quotes (a `'` inside
/// written `'\''`); the empty string is `''`.
pub fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=,@%+^".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// This process's command line as a shell would take it back: each argument
/// [`shell_quote`]d, joined by spaces (the `Command:` line of report.md; redacted later with the
/// rest of the report).
///
/// The value of a secret flag (`--api-key`, `--hf-token`, `--token`, `--password`, given as
/// `--flag VALUE` or `--flag=VALUE`) is recorded as `<token>`: the key never reaches a report.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    scrub_secret_flags(&args)
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The flags whose value is a secret.
const SECRET_FLAGS: [&str; 5] = [
    "--api-key",
    "--hf-token",
    "--token",
    "--password",
    "--secret",
];

/// `args` with the value of every secret flag replaced by `<token>`.
pub fn scrub_secret_flags(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut hide_next = false;
    for a in args {
        if hide_next {
            out.push("<token>".to_string());
            hide_next = false;
            continue;
        }
        if let Some((flag, _)) = a.split_once('=') {
            if SECRET_FLAGS.contains(&flag) {
                out.push(format!("{flag}=<token>"));
                continue;
            }
        }
        hide_next = SECRET_FLAGS.contains(&a.as_str());
        out.push(a.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn secret_flag_values_are_scrubbed() {
        let a: Vec<String> = [
            "rigbench",
            "e2e",
            "--api-key",
            "sk-abc",
            "--url=http://h",
            "--api-key=k2",
            "--port",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            super::scrub_secret_flags(&a),
            [
                "rigbench",
                "e2e",
                "--api-key",
                "<token>",
                "--url=http://h",
                "--api-key=<token>",
                "--port",
                "1"
            ]
        );
    }
}
