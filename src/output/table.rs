//! Markdown tables (also the terminal output format: pipes align, and they paste into issues).

/// Render a Markdown table with aligned columns. Pipes inside cells are escaped.
pub fn markdown_table<S: AsRef<str>>(headers: &[&str], rows: &[Vec<S>]) -> String {
    let esc = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let ncol = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count().max(3)).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            (0..ncol)
                .map(|i| r.get(i).map(|c| esc(c.as_ref())).unwrap_or_default())
                .collect()
        })
        .collect();
    for r in &cells {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |vals: Vec<String>| {
        let parts: Vec<String> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{v:<w$}", w = widths[i]))
            .collect();
        format!("| {} |\n", parts.join(" | "))
    };
    let mut out = line(headers.iter().map(|h| esc(h)).collect());
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
