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
pub fn command_line() -> String {
    std::env::args_os()
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}
