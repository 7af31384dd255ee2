//! Every `RIGBENCH_*` environment variable the repository's code reads is listed in the README's
//! "Environment variables" table: the names are grepped from `src/`, `crates/`, `tests/` and
//! `scripts/` (Rust, shell and Python), so a new variable without a README line fails here.

use std::collections::BTreeSet;
use std::path::Path;

/// Every `RIGBENCH_[A-Z0-9_]+` name in `text` (a name ending in `_` is a prefix in prose, not a
/// variable, and is skipped).
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(k) = text[from..].find("RIGBENCH_") {
        let at = from + k;
        let end = text[at..]
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .map_or(text.len(), |e| at + e);
        let name = &text[at..end];
        // Preceded by an identifier character: part of a longer name (e.g. `MY_RIGBENCH_X`).
        let inside = at > 0 && {
            let p = text.as_bytes()[at - 1];
            p.is_ascii_alphanumeric() || p == b'_'
        };
        if !inside && name.len() > "RIGBENCH_".len() && !name.ends_with('_') {
            out.insert(name.to_string());
        }
        from = end.max(at + 1);
    }
    out
}

fn scan(dir: &Path, found: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "fixtures") {
                continue; // captured engine output, not code
            }
            scan(&p, found);
        } else if p
            .extension()
            .is_some_and(|x| x == "rs" || x == "sh" || x == "py")
        {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            found.extend(names(&text));
        }
    }
}

#[test]
fn every_environment_variable_is_in_the_readme() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut used = BTreeSet::new();
    for d in ["src", "crates", "tests", "scripts"] {
        scan(&root.join(d), &mut used);
    }
    assert!(
        used.contains("RIGBENCH_CACHE_DIR") && used.contains("RIGBENCH_W4A16_KINDS"),
        "the scan is broken: {used:?}"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = readme
        .split("## Environment variables")
        .nth(1)
        .expect("README.md has an \"Environment variables\" section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    let listed = names(section);
    let missing: Vec<&String> = used.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "RIGBENCH_* variables read by the code but not in README.md's \"Environment variables\" \
         table: {missing:?}; add a line for each (what reads it, what it does)"
    );
    let stale: Vec<&String> = listed.difference(&used).collect();
    assert!(
        stale.is_empty(),
        "README.md lists variables no code reads any more: {stale:?}; remove them"
    );
}

#[test]
fn the_scan_finds_names_and_skips_prefixes() {
    // Built at run time, so that this file's own text holds no made-up variable name.
    let p = "RIGBENCH";
    let text = format!("a {p}_X1 b `{p}_Y_Z`, {p}_* and {p}_W4A16_ prefix MY_{p}_Q");
    let want: BTreeSet<String> = [format!("{p}_X1"), format!("{p}_Y_Z")].into();
    assert_eq!(names(&text), want);
}
