//! Redaction of host names, user names, home and working-directory paths and IP addresses from
//! everything a report writes (on by default; `--no-redact` turns it off).

use regex::Regex;

/// Replaces identifying strings with placeholders (`<host>`, `<user>`, `<home>`, `<cwd>`, `<ip>`).
#[derive(Debug, Clone)]
pub struct Redactor {
    literals: Vec<(String, &'static str)>,
    ipv4: Regex,
    ipv6: Regex,
    home_like: Regex,
    enabled: bool,
}

impl Redactor {
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
            home_like: Regex::new(r"/(?:home|Users)/[^/\s]+").expect("static regex"),
            enabled,
        }
    }

    /// A redactor that changes nothing.
    pub fn disabled() -> Self {
        Self::with_literals(Vec::new(), false)
    }

    /// Whether redaction is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Redact one string.
    pub fn redact(&self, s: &str) -> String {
        if !self.enabled {
            return s.to_string();
        }
        let mut out = s.to_string();
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
        let out = self.home_like.replace_all(&out, "<home>");
        let out = self.ipv4.replace_all(&out, |c: &regex::Captures| {
            // Keep loopback and unspecified addresses: they identify nothing.
            let m = &c[0];
            if m.starts_with("127.") || m == "0.0.0.0" {
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
            serde_json::Value::Object(o) => o.values_mut().for_each(|x| self.redact_json(x)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
