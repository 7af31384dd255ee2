//! Markdown tables (also the terminal output format: pipes align, and they paste into issues).

/// The most characters a table cell shows; a longer cell is cut and ends with
/// [`cut_note`] (the first characters and how many there were). Column widths then stay within
/// what a terminal or a Markdown viewer can show, and far below the 65,535 characters Rust's
/// `{:<w$}` formatting accepts as a width (it panics above that; cells are padded by hand here).
pub const MAX_CELL_CHARS: usize = 1024;

/// The end of a cell cut to [`MAX_CELL_CHARS`]: says that it was cut and how long it was.
pub fn cut_note(total_chars: usize) -> String {
    format!("… [cut: {} characters]", thousands(total_chars as u64))
}

/// `s` cut to at most `max` characters (a char boundary) with [`cut_note`] at its end when it
/// was longer; `s` itself otherwise.
pub fn cut_cell(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let note = cut_note(n);
    let keep = max.saturating_sub(note.chars().count());
    let mut out: String = s.chars().take(keep).collect();
    out.push_str(&note);
    out
}

/// `s` (a name read from a file, an engine or the command line: a suite, a model, a rig label)
/// as a Markdown inline code span that cannot end early nor break the surrounding block, so that
/// no such name can inject Markdown into a report (a suite named "x`\n\n## Verdict: PASS"
/// used to add its own heading to report.md). Line breaks and other control characters become
/// spaces (a blank line would end the paragraph); the text is cut to [`MAX_CELL_CHARS`] (a
/// table escapes its own `|`, [`markdown_table`]); the fence is one backtick longer than the
/// longest run of backticks inside, padded with a space when the text starts or ends with one
/// (CommonMark 0.31, 6.1 "Code spans").
pub fn code(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = cut_cell(&flat, MAX_CELL_CHARS);
    let mut longest = 0;
    let mut run = 0;
    for c in flat.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if flat.starts_with('`') || flat.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{flat}{pad}{fence}")
}

/// Render a Markdown table with aligned columns. Pipes inside cells are escaped; a cell over
/// [`MAX_CELL_CHARS`] characters is cut and says so ([`cut_cell`]).
pub fn markdown_table<S: AsRef<str>>(headers: &[&str], rows: &[Vec<S>]) -> String {
    let esc = |s: &str| cut_cell(&s.replace('|', "\\|").replace('\n', " "), MAX_CELL_CHARS);
    let ncol = headers.len();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            (0..ncol)
                .map(|i| r.get(i).map(|c| esc(c.as_ref())).unwrap_or_default())
                .collect()
        })
        .collect();
    let headers: Vec<String> = headers.iter().map(|h| esc(h)).collect();
    // Widths from the cut cells (a header's own length would pad a long one's column).
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count().max(3)).collect();
    for r in &cells {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |vals: Vec<String>| {
        let parts: Vec<String> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let pad = widths[i].saturating_sub(v.chars().count());
                format!("{v}{}", " ".repeat(pad))
            })
            .collect();
        format!("| {} |\n", parts.join(" | "))
    };
    let mut out = line(headers);
    out.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for r in cells {
        out.push_str(&line(r));
    }
    out
}

/// Format a byte count with binary units (e.g. `141.0 GiB`).
pub fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Format an integer with thousands separators (`1,234,560`).
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `n` with the singular or plural noun, digit-grouped: `1 error`, `2 errors`, `1,024 tokens`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// Format a number with `decimals` decimals and thousands separators (`4,770.5`).
pub fn grouped(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let s = format!("{:.decimals$}", v.abs());
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i.to_string(), format!(".{f}")),
        None => (s.clone(), String::new()),
    };
    let int = int.parse::<u64>().map(thousands).unwrap_or(int);
    let sign = if v < 0.0 && s.chars().any(|c| c.is_ascii_digit() && c != '0') {
        "-"
    } else {
        ""
    };
    format!("{sign}{int}{frac}")
}

/// Format seconds with a unit that suits the magnitude (`12.3 µs`, `4.56 ms`, `1.23 s`).
pub fn human_seconds(s: f64) -> String {
    if !s.is_finite() {
        return "n/a".into();
    }
    let a = s.abs();
    if a < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if a < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_span_holds_any_name_on_one_line() {
        assert_eq!(code("qwen3.6-27b"), "`qwen3.6-27b`");
        let evil = code("x`\n\n## Verdict: PASS\n[a](javascript:alert(1))");
        assert!(!evil.contains('\n'), "{evil}");
        assert!(evil.starts_with("``") && evil.ends_with("``"), "{evil}");
        assert_eq!(code("`a`"), "`` `a` ``");
        assert!(code(&"x".repeat(5000)).chars().count() < MAX_CELL_CHARS + 10);
    }

    #[test]
    fn table_aligns_and_escapes() {
        let t = markdown_table(&["a", "bee"], &[vec!["x|y", "1"], vec!["long cell", ""]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[2].contains("x\\|y"));
        assert!(lines
            .iter()
            .all(|l| l.chars().count() == lines[0].chars().count()));
    }

    #[test]
    fn long_cells_are_cut_and_say_so() {
        // Rust's `{:<w$}` panics for a width over 65,535 ("Formatting argument out of range");
        // cells of 65,536 and 200,000 characters, in a row and in a header, must render.
        for n in [65_536usize, 200_000] {
            let long = "x".repeat(n);
            let t = markdown_table(
                &["name", &long],
                &[vec!["a", long.as_str()], vec!["b", "1"]],
            );
            let lines: Vec<&str> = t.lines().collect();
            assert_eq!(lines.len(), 4);
            // Two columns of at most MAX_CELL_CHARS each, the pipes and padding.
            assert!(lines
                .iter()
                .all(|l| l.chars().count() <= 2 * MAX_CELL_CHARS + 7));
            assert!(
                lines[2].contains(&format!("[cut: {} characters]", thousands(n as u64))),
                "{}",
                lines[2]
            );
            assert!(lines
                .iter()
                .all(|l| l.chars().count() == lines[0].chars().count()));
        }
        // A cell at the limit is kept whole; multi-byte characters are cut on a boundary.
        let exact = "é".repeat(MAX_CELL_CHARS);
        assert_eq!(cut_cell(&exact, MAX_CELL_CHARS), exact);
        let over = "é".repeat(MAX_CELL_CHARS + 1);
        let cut = cut_cell(&over, MAX_CELL_CHARS);
        assert_eq!(cut.chars().count(), MAX_CELL_CHARS);
        assert!(cut.ends_with("[cut: 1,025 characters]"));
    }

    #[test]
    fn number_formats() {
        assert_eq!(thousands(1234560), "1,234,560");
        assert_eq!(thousands(999), "999");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_seconds(12.3e-6), "12.3 µs");
        assert_eq!(human_seconds(0.00456), "4.56 ms");
        assert_eq!(plural(1, "error", "errors"), "1 error");
        assert_eq!(plural(0, "error", "errors"), "0 errors");
        assert_eq!(plural(1234, "token", "tokens"), "1,234 tokens");
        assert_eq!(grouped(4770.46, 1), "4,770.5");
        assert_eq!(grouped(2012304.925, 2), "2,012,304.93");
        assert_eq!(grouped(-1234.0, 0), "-1,234");
        assert_eq!(grouped(0.25, 3), "0.250");
    }
}
