//! Redaction of host names, user names, home and working-directory paths, IP addresses and
//! secrets (access tokens, API keys, passwords in flags, environment assignments, headers and
//! URLs) from everything a report writes (on by default; `--no-redact` turns it off). Engine
//! command lines and engine logs pass through here before they reach a report file.

use regex::Regex;

/// Replaces identifying strings with placeholders (`<host>`, `<user>`, `<home>`, `<cwd>`, `<ip>`,
/// `<token>`).
#[derive(Debug, Clone)]
pub struct Redactor {
    literals: Vec<(String, &'static str)>,
    ipv4: Regex,
    ipv6: Regex,
    home_like: Regex,
    secrets: Vec<(Regex, &'static str)>,
    url_host: Regex,
    private_host: Regex,
    enabled: bool,
}

/// Public hosts that identify no one (kept in URLs).
const PUBLIC_HOSTS: &[&str] = &[
    "localhost",
    "www.w3.org",
    "huggingface.co",
    "github.com",
    "raw.githubusercontent.com",
    "pypi.org",
    "docs.vllm.ai",
    "developer.nvidia.com",
    "docs.nvidia.com",
];

/// Secret patterns and their replacement (capture group 1, when present, is kept; a group 2
/// is the value, left alone when it cannot be a secret: a number, a boolean, a short word).
/// The shapes: the token formats of Hugging Face (`hf_`), OpenAI and Anthropic (`sk-`), GitHub
/// (`ghp_` … `github_pat_`), Slack (`xox?-`), AWS access key ids (`AKIA…`), JSON Web Tokens
/// (`eyJ….….…`); `Authorization`/`Bearer` headers in any quoting; `Cookie` headers; secret
/// flags (also as items of a printed argument list); plain `key=v`, `pass=v`, `sessionid=v`
/// text; environment
/// assignments (`NAME=v`, `NAME: v`, `"NAME": "v"`), JSON / YAML / Python-dict keys (with a value
/// or a list of values); URL user info (`scheme://user:pw@`, `scheme://:pw@`). The corpus they
/// are tested against is `tests/fixtures/secrets/corpus.txt`.
fn secret_patterns() -> Vec<(Regex, &'static str)> {
    let re = |p: &str| Regex::new(p).expect("static regex");
    vec![
        // Known token formats: Hugging Face, OpenAI-style keys, GitHub, Slack, AWS access keys,
        // JSON Web Tokens.
        (re(r"\bhf_[A-Za-z0-9]{20,}"), "<token>"),
        (re(r"\bsk-[A-Za-z0-9_\-]{16,}"), "<token>"),
        (
            re(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
            "<token>",
        ),
        (re(r"\bxox[a-z]-[A-Za-z0-9\-]{10,}"), "<token>"),
        (re(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "<token>"),
        (
            re(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"),
            "<token>",
        ),
        // `Authorization: Bearer X` / `Basic X`, also quoted (`{'Authorization': 'Bearer X'}`).
        (
            re(
                r#"(?i)(authorization['"]?\s*[:=]\s*['"]?\s*(?:bearer|basic|token)\s+)[^\s'",}\]]+"#,
            ),
            "${1}<token>",
        ),
        // A bare `Bearer X` (curl -H lines, exception texts).
        (
            re(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}"),
            "${1}<token>",
        ),
        // Flags: `--api-key X`, `--hf-token=X`, `--password X`.
        (
            re(
                r"(?i)(--(?:api[-_]?key|hf[-_]?token|token|access[-_]?token|auth[-_]?token|password|secret)(?:=|\s+))(\S+)",
            ),
            "${1}<token>",
        ),
        // The same flags as items of a printed argument list (Python's `sys.argv`, a JSON
        // array): `['vllm', 'serve', '--api-key', 'X']`, `["--hf-token", "X"]`.
        (
            re(
                r#"(?i)(['"]--(?:api[-_]?key|hf[-_]?token|token|access[-_]?token|auth[-_]?token|password|secret)['"]\s*,\s*['"])([^'"]+)"#,
            ),
            "${1}<token>",
        ),
        // Cookies: `Cookie: sessionid=X; theme=dark`, `Set-Cookie: X`, `'Cookie': 'X'` (the
        // whole header value: every cookie in it may be a session).
        (
            re(r#"(?i)(\b(?:set-)?cookie['"]?\s*:\s*['"]?)([^'"\r\n]+)"#),
            "${1}<token>",
        ),
        // Plain `name=value` text whose name ends in a secret word: `key=X`, `session_key=X`,
        // `pass=X`, `pwd=X`, `credentials=X`, `sessionid=X`.
        (
            re(
                r#"(?i)\b((?:[a-z0-9]+[_-])*(?:key|pass|pwd|passphrase|credentials?|sessionid|session[_-]id)\s*=\s*['"]?)([^\s'",;}\]&]+)"#,
            ),
            "${1}<token>",
        ),
        // Environment assignments and dumps: `HF_TOKEN=X`, `VLLM_API_KEY: X`,
        // `"HUGGING_FACE_HUB_TOKEN": "X"`, `OPENAI_API_KEY='X'`.
        (
            re(
                r#"\b([A-Z0-9_]*(?:TOKEN|API_KEY|APIKEY|ACCESS_KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Z0-9_]*['"]?\s*(?:=|:\s*)['"]?)([^\s'",}\]]+)"#,
            ),
            "${1}<token>",
        ),
        // JSON, YAML or Python-dict keys: `"api_key": "X"`, `token: X`, `'api_key': ['X']`,
        // `aws_secret_access_key = X`.
        (
            re(
                r#"(?i)(\b(?:[a-z0-9_]*(?:api[_-]?key|access[_-]?key|access[_-]?token|auth[_-]?token|hf[_-]?token|secret|password|passwd)|token)['"]?\s*[:=]\s*\[?\s*['"]?)([^'"\s,}\]]+)"#,
            ),
            "${1}<token>",
        ),
        // Credentials in URLs: `https://user:pass@host`, `redis://:pass@host`.
        (
            re(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s:@]*:[^/\s@]+@"),
            "${1}<user>:<token>@",
        ),
    ]
}

/// Secret values known to this process (an API key given on the command line, the value of a
/// secret-looking environment variable): replaced wherever they appear, whatever surrounds
/// them (an engine that prints `HF_TOKEN`'s value alone on a line).
static KNOWN_SECRETS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Record a secret value (at least 6 characters) so every redactor built afterwards replaces
/// it with `<token>`: `--api-key`'s value, for one.
pub fn register_secret(value: &str) {
    if value.len() < 6 {
        return;
    }
    if let Ok(mut k) = KNOWN_SECRETS.lock() {
        if !k.iter().any(|v| v == value) {
            k.push(value.to_string());
        }
    }
}

/// Whether an environment variable's name says its value is a secret (`HF_TOKEN`,
/// `OPENAI_API_KEY`, `AWS_SECRET_ACCESS_KEY`, `DB_PASSWORD`, …).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "TOKEN",
        "API_KEY",
        "APIKEY",
        "ACCESS_KEY",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
    ]
    .iter()
    .any(|k| n.contains(k))
        && !n.contains("TOKENIZER")
        && !n.starts_with("MAX_")
}

/// Whether a JSON object key holds a secret: every string under it is replaced.
fn is_secret_key(k: &str) -> bool {
    let l = k.to_ascii_lowercase().replace('-', "_");
    matches!(
        l.as_str(),
        "authorization" | "token" | "auth" | "cookie" | "set_cookie"
    ) || [
        "api_key",
        "apikey",
        "access_key",
        "access_token",
        "auth_token",
        "hf_token",
        "secret",
        "password",
        "passwd",
    ]
    .iter()
    .any(|s| l.ends_with(s))
}

/// Remove terminal control sequences (ANSI CSI / OSC escapes) and other control characters
/// except newline, carriage return and tab, so an engine's string cannot move the cursor,
/// retitle the terminal or hide text when printed.
pub fn strip_control(s: &str) -> std::borrow::Cow<'_, str> {
    if !s
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\u{1b}' | '\u{9b}' => {
                let csi = c == '\u{9b}' || it.peek() == Some(&'[');
                let osc = it.peek() == Some(&']');
                if c == '\u{1b}' && (csi || osc) {
                    it.next();
                }
                if csi {
                    // Parameters and intermediates, then one final byte in @..~.
                    for d in it.by_ref() {
                        if ('@'..='~').contains(&d) {
                            break;
                        }
                    }
                } else if osc {
                    // Up to BEL or ESC \.
                    while let Some(d) = it.next() {
                        if d == '\u{7}' {
                            break;
                        }
                        if d == '\u{1b}' {
                            if it.peek() == Some(&'\\') {
                                it.next();
                            }
                            break;
                        }
                    }
                } else if it.peek().is_some_and(|d| ('@'..='_').contains(d)) {
                    it.next();
                }
            }
            '\n' | '\r' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

impl Redactor {
    /// Every placeholder a redactor writes.
    pub const PLACEHOLDERS: [&'static str; 6] =
        ["<host>", "<user>", "<home>", "<cwd>", "<ip>", "<token>"];

    /// A redactor that knows this machine's host name, user, home and working directory.
    pub fn for_this_host(enabled: bool) -> Self {
        let mut literals = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            literals.push((cwd.display().to_string(), "<cwd>"));
        }
        if let Some(home) = std::env::var_os("HOME") {
            literals.push((home.to_string_lossy().into_owned(), "<home>"));
        }
        if let Ok(h) = sysinfo::System::host_name() {
            literals.push((h, "<host>"));
        }
        for var in ["USER", "LOGNAME"] {
            if let Ok(u) = std::env::var(var) {
                literals.push((u, "<user>"));
            }
        }
        // Secret values of this environment (HF_TOKEN, OPENAI_API_KEY, …) and those given on
        // the command line, wherever they are printed.
        for (k, v) in std::env::vars() {
            if is_secret_name(&k) && v.len() >= 8 {
                literals.push((v, "<token>"));
            }
        }
        if let Ok(k) = KNOWN_SECRETS.lock() {
            literals.extend(k.iter().map(|v| (v.clone(), "<token>")));
        }
        Self::with_literals(literals, enabled)
    }

    /// A redactor with explicit literal replacements (longest first is applied automatically).
    pub fn with_literals(mut literals: Vec<(String, &'static str)>, enabled: bool) -> Self {
        // Short literals (e.g. a one-letter user name, "/", "root" as a path) would shred
        // ordinary text; keep only ones long enough to be identifying.
        literals.retain(|(s, _)| !s.is_empty() && s != "/" && s != "root");
        literals.sort_by_key(|l| std::cmp::Reverse(l.0.len()));
        literals.dedup_by(|a, b| a.0 == b.0);
        Self {
            literals,
            ipv4: Regex::new(
                r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b",
            )
            .expect("static regex"),
            ipv6: Regex::new(r"\b[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7}\b")
                .expect("static regex"),
            home_like: Regex::new(r"/(?:home|Users)/[^/\s]+|(?i)\b[A-Z]:\\Users\\[^\\\s]+")
                .expect("static regex"),
            secrets: secret_patterns(),
            url_host: Regex::new(r"(?i)\b((?:https?|wss?|grpc|tcp|redis|postgres(?:ql)?)://(?:[^/\s@]*@)?)([a-z0-9][a-z0-9.\-]*[a-z0-9])")
                .expect("static regex"),
            private_host: Regex::new(
                r"(?i)\b[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?)*\.(?:internal|local|lan|corp|intra|intranet|localdomain|cluster|home\.arpa)\b",
            )
            .expect("static regex"),
            enabled,
        }
    }

    /// A redactor that changes nothing.
    pub fn disabled() -> Self {
        Self::with_literals(Vec::new(), false)
    }

    /// Secrets and control sequences only (hosts, IPs and paths kept): for rigbench's own
    /// messages on a terminal, where a `--url`'s credentials must not show but its host may.
    pub fn secrets_only(&self, s: &str) -> String {
        let s = strip_control(s);
        let mut out = s.into_owned();
        for (lit, repl) in &self.literals {
            if *repl == "<token>" && out.contains(lit.as_str()) {
                out = out.replace(lit.as_str(), repl);
            }
        }
        self.replace_secrets(out)
    }

    fn replace_secrets(&self, mut out: String) -> String {
        for (re, repl) in &self.secrets {
            if !re.is_match(&out) {
                continue;
            }
            let text = out.clone();
            out = re
                .replace_all(&text, |c: &regex::Captures| {
                    // A value after a secret-looking name (group 2) is replaced only when it
                    // could be a secret: not a number, a boolean or a short word
                    // (`MAX_TOKENS=512`, `token: 3`), and not a rate (`bytes per token = …`).
                    if let Some(v) = c.get(2).map(|m| m.as_str()) {
                        let start = c.get(0).map_or(0, |m| m.start());
                        let rate = text
                            .get(start.saturating_sub(4)..start)
                            .is_some_and(|p| p.eq_ignore_ascii_case("per "));
                        let benign = v.len() < 6
                            || v.parse::<f64>().is_ok()
                            || matches!(v, "true" | "false" | "null" | "None" | "<token>")
                            || rate;
                        if benign {
                            return c[0].to_string();
                        }
                    }
                    let mut dst = String::new();
                    c.expand(repl, &mut dst);
                    dst
                })
                .into_owned();
        }
        out
    }

    /// Whether redaction is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Redact one string. Terminal control sequences are removed even when redaction is off
    /// (see [`strip_control`]).
    pub fn redact(&self, s: &str) -> String {
        let s = strip_control(s);
        if !self.enabled {
            return s.into_owned();
        }
        let mut out = s.into_owned();
        for (lit, repl) in &self.literals {
            if !out.contains(lit.as_str()) {
                continue;
            }
            if lit.len() < 5 && !lit.contains('/') {
                // A short name ("vm", "gpu1") is replaced only as a whole word.
                let re = Regex::new(&format!(r"\b{}\b", regex::escape(lit))).expect("escaped");
                out = re.replace_all(&out, *repl).into_owned();
            } else {
                out = out.replace(lit.as_str(), repl);
            }
        }
        let out = self.replace_secrets(out);
        // Host names in URLs (an engine's address, a model server, a proxy), except loopback,
        // IPs (redacted below) and a few public hosts; and names under private suffixes.
        let out = self.url_host.replace_all(&out, |c: &regex::Captures| {
            let host = &c[2];
            let ip_like = host.chars().all(|ch| ch.is_ascii_digit() || ch == '.');
            if ip_like || PUBLIC_HOSTS.iter().any(|p| host.eq_ignore_ascii_case(p)) {
                c[0].to_string()
            } else {
                format!("{}<host>", &c[1])
            }
        });
        let out = self.private_host.replace_all(&out, "<host>");
        let out = self.home_like.replace_all(&out, "<home>");
        let out = self.ipv4.replace_all(&out, |c: &regex::Captures| {
            // Keep loopback and unspecified addresses: they identify nothing. Keep llama.cpp's
            // log timestamp too (`0.10.110.130 I slot …` at the start of a line: elapsed time,
            // not an address).
            let m = &c[0];
            let at = c.get(0).map_or(0, |x| x.start());
            let line_start = at == 0 || out[..at].ends_with('\n') || out[..at].ends_with("] ");
            let after = &out[c.get(0).map_or(0, |x| x.end())..];
            let llama_stamp = line_start
                && after.len() >= 3
                && after.as_bytes()[0] == b' '
                && matches!(after.as_bytes()[1], b'I' | b'W' | b'E' | b'D')
                && after.as_bytes()[2] == b' ';
            if m.starts_with("127.") || m == "0.0.0.0" || llama_stamp {
                m.to_string()
            } else {
                "<ip>".to_string()
            }
        });
        self.ipv6
            .replace_all(&out, |c: &regex::Captures| {
                // An IPv6 address has 8 groups, or fewer with one "::"; times like 12:34:56
                // and Rust paths like a::b::c are left alone (they lack a digit group or the form).
                let m = &c[0];
                let groups = m.split(':').count();
                let compressed = m.contains("::") && m.matches("::").count() == 1;
                let has_digit = m.chars().any(|ch| ch.is_ascii_digit());
                if has_digit && (groups == 8 || (compressed && groups >= 3)) {
                    "<ip>".to_string()
                } else {
                    m.to_string()
                }
            })
            .into_owned()
    }

    /// Redact every string inside a JSON value, in place.
    pub fn redact_json(&self, v: &mut serde_json::Value) {
        if !self.enabled {
            return;
        }
        match v {
            serde_json::Value::String(s) => *s = self.redact(s),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.redact_json(x)),
            serde_json::Value::Object(o) => {
                for (k, x) in o.iter_mut() {
                    if is_secret_key(k) {
                        hide_strings(x);
                    } else {
                        self.redact_json(x);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Replace every string under a secret-named key with `<token>` (numbers and booleans stay:
/// `"max_tokens"` is not such a key, and a count under one is no secret).
fn hide_strings(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => *s = "<token>".into(),
        serde_json::Value::Array(a) => a.iter_mut().for_each(hide_strings),
        serde_json::Value::Object(o) => o.values_mut().for_each(hide_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_lists_cookies_and_plain_key_values_are_hidden_and_lookalikes_kept() {
        let r = Redactor::with_literals(Vec::new(), true);
        for (line, secret) in [
            (
                "['vllm', '--api-key', 'argvK3y999', '--port', '8000']",
                "argvK3y999",
            ),
            (r#"["--hf-token", "hfArgvTok777"]"#, "hfArgvTok777"),
            ("Cookie: sessionid=ck5566QQ; theme=dark", "ck5566QQ"),
            ("{'Set-Cookie': 'sid=zz998877; Path=/'}", "zz998877"),
            ("region=eu key=plainKv8877 retries=3", "plainKv8877"),
            (
                "session_key=abcdef123456 pass=Hunter2Hunter2",
                "Hunter2Hunter2",
            ),
        ] {
            let out = r.redact(line);
            assert!(!out.contains(secret), "{line} -> {out}");
            assert!(out.contains("<token>"), "{out}");
            assert!(!r.secrets_only(line).contains(secret), "{line}");
        }
        // Not secrets: a short or numeric value, a word that merely ends in "key".
        for line in [
            "key=3 pass=true",
            "monkey=bananas turnkey=solution",
            "kv_cache_dtype=auto block_size=16",
            "--port 8000",
        ] {
            assert_eq!(r.redact(line), line);
        }
    }

    #[test]
    fn redacts_literals_ips_and_homes() {
        let r = Redactor::with_literals(
            vec![
                ("gpu-box-17".into(), "<host>"),
                ("/srv/work/alice".into(), "<cwd>"),
            ],
            true,
        );
        let s = r.redact(
            "ran on gpu-box-17 at 10.1.2.3 and [fe80::1:2] from /srv/work/alice/x, /home/bob/m",
        );
        assert_eq!(s, "ran on <host> at <ip> and [<ip>] from <cwd>/x, <home>/m");
        assert_eq!(r.redact("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
        assert_eq!(
            r.redact("version 1.2.3"),
            "version 1.2.3",
            "three-part versions are not IPs"
        );
        assert_eq!(r.redact("GPU 12:34:56 at 12:00"), "GPU 12:34:56 at 12:00");
        assert_eq!(r.redact("cudarc::driver::sys"), "cudarc::driver::sys");
        assert_eq!(r.redact("2001:db8:0:0:0:0:2:1 x"), "<ip> x");
        let short = Redactor::with_literals(vec![("vm".into(), "<host>")], true);
        assert_eq!(short.redact("host vm, vmstat"), "host <host>, vmstat");
    }

    #[test]
    fn disabled_is_identity_and_json_walks() {
        let d = Redactor::disabled();
        assert_eq!(d.redact("10.0.0.1"), "10.0.0.1");
        let r = Redactor::with_literals(vec![], true);
        let mut v = serde_json::json!({"a": ["10.0.0.1", 3], "b": {"c": "x 192.168.1.1"}});
        r.redact_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": ["<ip>", 3], "b": {"c": "x <ip>"}})
        );
    }

    #[test]
    fn secrets_and_foreign_hosts_are_redacted_everywhere_they_appear() {
        let r = Redactor::with_literals(vec![], true);
        let cases = [
            (
                "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWx vllm serve m --api-key sk-proj-0123456789abcdefXYZ",
                "HF_TOKEN=<token> vllm serve m --api-key <token>",
            ),
            ("--hf-token=s3cr3tValue9", "--hf-token=<token>"),
            ("OPENAI_API_KEY='abcdefgh12345678'", "OPENAI_API_KEY='<token>'"),
            (
                "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.x.y",
                "Authorization: Bearer <token>",
            ),
            (r#"{"api_key": "k-1234567890"}"#, r#"{"api_key": "<token>"}"#),
            ("ghp_0123456789abcdefghijABCDEFGHIJ", "<token>"),
            ("AKIAABCDEFGHIJKLMNOP", "<token>"),
            (
                "pull from https://alice:pw12345@hub.corp.example/models",
                "pull from https://<user>:<token>@<host>/models",
            ),
            (
                "--url http://gpu-node-7.cluster.example.com:8000/v1",
                "--url http://<host>:8000/v1",
            ),
            ("INFO on gpu-node-7.internal ready", "INFO on <host> ready"),
            (r"C:\Users\alice\models", r"<home>\models"),
        ];
        for (input, want) in cases {
            assert_eq!(r.redact(input), want, "{input}");
        }
        // Left alone: numbers after token-ish names, module paths, loopback and public hosts,
        // the results schema's own keys.
        for keep in [
            "MAX_TOKENS=512 max_num_batched_tokens=8192",
            "vllm.entrypoints.openai.api_server",
            "http://localhost:8000/v1 http://127.0.0.1:8000",
            "https://huggingface.co/nvidia/Qwen3.6-35B-A3B-NVFP4",
            r#"{"token_source": "usage", "output_tokens": 32, "token: 3"}"#,
            "model.safetensors.index.json",
        ] {
            assert_eq!(r.redact(keep), keep);
        }
        assert_eq!(
            Redactor::disabled().redact("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWx"),
            "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWx"
        );
    }

    #[test]
    fn control_sequences_are_stripped_even_without_redaction() {
        let s = "a\u{1b}[31mred\u{1b}[0m \u{1b}]0;title\u{7}b\u{1b}]8;;http://x\u{1b}\\c \u{9b}2Jd\u{0}e\tf\n";
        assert_eq!(strip_control(s), "ared bc de\tf\n");
        assert_eq!(Redactor::disabled().redact(s), "ared bc de\tf\n");
        assert!(matches!(
            strip_control("plain\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn secrets_only_keeps_hosts_and_hides_credentials() {
        let r = Redactor::with_literals(vec![], true);
        assert_eq!(
            r.secrets_only("no engine answers at http://bench:pw123456@gpu-7.internal:8000/health"),
            "no engine answers at http://<user>:<token>@gpu-7.internal:8000/health"
        );
        assert_eq!(
            r.redact("redis://:Pa55w0rdRedis@cache.internal:6379"),
            "redis://<user>:<token>@<host>:6379"
        );
    }

    #[test]
    fn registered_and_environment_secrets_are_replaced_wherever_they_appear() {
        register_secret("RegisteredKey-0123");
        let r = Redactor::for_this_host(true);
        assert_eq!(
            r.redact("the key RegisteredKey-0123 alone"),
            "the key <token> alone"
        );
        assert!(is_secret_name("HF_TOKEN") && is_secret_name("AWS_SECRET_ACCESS_KEY"));
        assert!(!is_secret_name("TOKENIZERS_PARALLELISM") && !is_secret_name("MAX_TOKENS"));
        // Python-dict reprs, env dumps, quoted headers.
        for (input, want) in [
            (
                "non-default args: {'model': 'm', 'api_key': ['abcdef123456']}",
                "non-default args: {'model': 'm', 'api_key': ['<token>']}",
            ),
            ("VLLM_API_KEY: abcdef123456", "VLLM_API_KEY: <token>"),
            (
                r#""HUGGING_FACE_HUB_TOKEN": "abcdef123456""#,
                r#""HUGGING_FACE_HUB_TOKEN": "<token>""#,
            ),
            (
                "{'Authorization': 'Bearer abcdef123456'}",
                "{'Authorization': 'Bearer <token>'}",
            ),
            (
                "eos_token: <|im_end|> bos_token=<s>",
                "eos_token: <|im_end|> bos_token=<s>",
            ),
        ] {
            assert_eq!(r.redact(input), want);
        }
    }
}
