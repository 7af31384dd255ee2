//! Wording shared by the verdict's lines: short format names, lists joined with "and", a long
//! reason cut to its first clause or put on one line, and M ranges.

use crate::formats::GemmFormat;
use crate::output::table::thousands;

pub(super) fn short_name(f: GemmFormat) -> &'static str {
    match f {
        GemmFormat::Bf16 => "BF16",
        GemmFormat::Fp8 => "FP8",
        GemmFormat::W4a16 => "W4A16",
        GemmFormat::W4a4 => "W4A4",
    }
}

pub(super) fn join_and(v: &[String]) -> String {
    match v.len() {
        0 => String::new(),
        1 => v[0].clone(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// The first clause of a long reason, for a one-line summary: up to the first `; ` that is not
/// inside parentheses, brackets, backticks or quotes (a command such as `(echo boom; exit 3)` is
/// never cut), on its first line.
pub(super) fn first_clause(s: &str) -> &str {
    let line = s.lines().next().unwrap_or(s);
    let mut depth = 0i32;
    let mut quoted: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quoted, c) {
            (Some(q), c) if c == q => quoted = None,
            (Some(_), _) => {}
            (None, '`') | (None, '"') => quoted = Some(c),
            // An apostrophe inside a word ("engine's") opens nothing.
            (None, '\'') if !prev.is_alphanumeric() => quoted = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ';') if depth <= 0 && line[i + 1..].starts_with(' ') => {
                return line[..i].trim_end_matches('.');
            }
            _ => {}
        }
        prev = c;
    }
    line.trim_end_matches('.')
}

/// A reason on one line: its lines trimmed and joined (`; ` after a line that ends a clause, a
/// space after one that ends with `:`).
pub(super) fn one_line(s: &str) -> String {
    let mut o = String::new();
    for l in s.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !o.is_empty() {
            o.push_str(if o.ends_with(':') { " " } else { "; " });
        }
        o.push_str(l);
    }
    o
}

fn m_range(a: usize, b: usize) -> String {
    if a == b {
        format!("M = {}", thousands(a as u64))
    } else {
        format!("M = {}…{}", thousands(a as u64), thousands(b as u64))
    }
}

/// `(M, label)` runs joined: `**A** at M = 1…4, **B** at M = 16`.
pub(super) fn segments(points: Vec<(usize, String)>) -> String {
    let mut segs: Vec<(String, usize, usize)> = Vec::new();
    for (m, w) in points {
        match segs.last_mut() {
            Some(s) if s.0 == w => s.2 = m,
            _ => segs.push((w, m, m)),
        }
    }
    segs.iter()
        .map(|(w, a, b)| format!("**{w}** at {}", m_range(*a, *b)))
        .collect::<Vec<_>>()
        .join(", ")
}
