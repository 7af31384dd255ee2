//! The rule for every sentence (docs/diagnose.md, "The rule for every statement"): every
//! finding of every fixture log, scrape and stream under `tests/fixtures/` cites where its facts
//! come from, and every number it states appears in what it cites or is computed from it.
//!
//! What counts as "computed from": a cited number itself at the precision printed (also as a
//! percentage, in KiB/MiB/GiB, or divided by 1,024 or 1,000), the sum or the largest of the
//! numbers at one position of the cited lines of one shape (Σaccepted, Σdrafted, a cumulative
//! counter's last value), or one step of arithmetic between two of those (a ratio, a product,
//! a difference, 1 + a / b, a share, a percentage). Line numbers and
//! the input's name are citations, not figures. The numbers of rigbench's own rules (the 2%,
//! 5%, 10% thresholds, the card generations, version boundaries, PR numbers) are listed in
//! [`RULE_NUMBERS`] with what each is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use regex::Regex;

use super::log::EngineLog;
use super::*;

/// Numbers that belong to rigbench's rules, not to the input: thresholds (2% between two KV
/// lines, 5% and 10% acceptance, 1.5× a cap, 1.00 mean acceptance length), vLLM version
/// boundaries (0.29, 0.30, 0.32, 0.33) and PR / issue numbers the findings cite, card generations (sm_90,
/// sm_100 …, compute capability 8.0), PTX/CUDA versions, and the 16 of NVFP4's block.
const RULE_NUMBERS: &[f64] = &[
    0.0, 1.0, 1.005, 1.02, 1.5, 2.0, 4.0, 5.0, 8.0, 10.0, 16.0, 20.0, 64.0, 100.0, 0.29, 0.30,
    0.32, 0.33, 0.10, 0.05, 29303.0, 56445.0, 31085.0, 50925.0, 90.0, 100.0, 103.0, 110.0, 120.0,
    121.0, 12.0, 12.1, 13.0, 8.6, 8.7, 8.8, 9.0, 4096.0, 10.0, 1024.0,
];

fn fixture_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("log" | "prom" | "sse")
            ) || (p.extension().and_then(|x| x.to_str()) == Some("txt")
                && p.parent().is_some_and(|d| d.ends_with("metrics")))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(
        out.len() >= 20,
        "expected the fixture logs and scrapes under {}, found {}",
        root.display(),
        out.len()
    );
    out
}

fn num_re() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\d[\d,]*(?:\.\d+)?").expect("static regex"))
}

/// The numbers of a text with their decimals, skipping digits inside identifiers (`sm_120`,
/// `fp8_e4m3`, `E2M1`, a hex hash).
fn numbers(text: &str) -> Vec<(f64, usize)> {
    let mut out = Vec::new();
    for m in num_re().find_iter(text) {
        let before = text[..m.start()].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let after = text[m.end()..].chars().next();
        if after.is_some_and(|c| c.is_alphabetic() && c != 'x' && c != 'K' && c != 'M' && c != 'G')
            && !text[m.end()..].starts_with(|c: char| c.is_whitespace())
        {
            // `4bit`, `8B`: part of a word.
            if !matches!(after, Some('%' | 's' | 'x' | '×')) {
                continue;
            }
        }
        let s = m.as_str().trim_end_matches(',');
        let s = s.strip_suffix('.').unwrap_or(s);
        let decimals = s.split_once('.').map_or(0, |(_, d)| d.len());
        if let Ok(v) = s.replace(',', "").parse::<f64>() {
            out.push((v, decimals));
        }
    }
    out
}

/// Line references in a finding's words (`line 12`, `lines 3–9`, `line 4)`, `lines 3, 7`).
fn cited_lines(text: &str, max: usize) -> BTreeSet<usize> {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"lines? (\d+)(?:\s*[–-]\s*(\d+))?((?:, \d+)*)").expect("static regex")
    });
    let mut out = BTreeSet::new();
    for c in re.captures_iter(text) {
        let a: usize = c[1].parse().unwrap_or(0);
        let b: usize = c.get(2).map_or(a, |m| m.as_str().parse().unwrap_or(a));
        for l in a..=b.min(a + 100_000) {
            if (1..=max).contains(&l) {
                out.insert(l);
            }
        }
        if let Some(rest) = c.get(3) {
            for x in rest
                .as_str()
                .split(", ")
                .filter_map(|x| x.trim().parse().ok())
            {
                out.insert(x);
            }
        }
    }
    out
}

/// The finding's words with its citations (line references, the input's name) blanked.
fn without_citations(text: &str, name: &str) -> String {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"(?:lines?|boot|pids?|ranks?|pid=|line\(s\)) \d+(?:\s*[–-]\s*\d+)?(?:(?:, | and )\d+)*|boot \d+ of \d+|:\d+\b")
            .expect("static regex")
    });
    re.replace_all(&text.replace(name, " "), " ").into_owned()
}

/// What the cited text supports: `values`, its numbers (also in other units) and the sums of
/// the numbers at each position of lines of one shape (the lines with their numbers blanked:
/// Σaccepted, Σtokens), and one step of arithmetic between two of `pairs` (checked by
/// [`is_supported`] by inverting each operation, so no pair is left out for size); `named` (the
/// lines the words name one by one) also gives products and ratios of three of its numbers
/// (`1.56 × 20000 / 1952`).
struct Support {
    /// Sorted.
    values: Vec<f64>,
    /// The operands of one step of arithmetic, sorted.
    pairs: Vec<f64>,
}

fn supported(cited: &str, named: &str) -> Support {
    let mut base: Vec<f64> = numbers(cited).into_iter().map(|(v, _)| v).collect();
    // Per shape, in one pass: how many lines, and per number position the sum and the largest
    // (a cumulative counter's last value).
    #[derive(Default)]
    struct Agg {
        lines: usize,
        sums: Vec<f64>,
        max: Vec<f64>,
    }
    let mut shapes: std::collections::BTreeMap<String, Agg> = Default::default();
    for line in cited.lines() {
        let a = shapes.entry(shape_of(line)).or_default();
        a.lines += 1;
        for (i, (v, _)) in numbers(&positional(line)).into_iter().enumerate() {
            if a.sums.len() <= i {
                a.sums.push(v);
                a.max.push(v);
            } else {
                a.sums[i] += v;
                a.max[i] = a.max[i].max(v);
            }
        }
    }
    let few: Vec<f64> = numbers(named).into_iter().map(|(v, _)| v).collect();
    // What pairs are formed from: every number when there are few, else the named lines'
    // numbers, the per-shape sums and maxima of shapes with more than one line (one line's own
    // numbers are in the base already) and the rules'.
    let mut derived: Vec<f64> = shapes
        .values()
        .filter(|a| a.lines > 1)
        .flat_map(|a| a.sums.iter().chain(&a.max).copied())
        .collect();
    derived.extend(RULE_NUMBERS.iter().copied());
    derived.extend(few.iter().copied());
    derived.push(cited.lines().count() as f64);
    base.extend(derived.iter().copied());
    base.sort_by(f64::total_cmp);
    base.dedup();
    let mut pairs = if base.len() <= 250 {
        base.clone()
    } else {
        derived
    };
    pairs.retain(|x| x.is_finite());
    pairs.sort_by(f64::total_cmp);
    pairs.dedup();
    let mut out = base.clone();
    for v in &base {
        for unit in [1024.0, 1e3, 1048576.0, 1e6, 1073741824.0, 1e9, 0.01] {
            out.push(v / unit);
        }
        out.push(v * 100.0);
    }
    let tri = if base.len() <= 80 { base.clone() } else { few };
    if tri.len() <= 80 {
        for a in &tri {
            for b in &tri {
                for c in tri.iter().filter(|c| **c != 0.0) {
                    out.push(a * b / c);
                }
            }
        }
    }
    out.retain(|x| x.is_finite());
    out.sort_by(f64::total_cmp);
    Support { values: out, pairs }
}

/// A line whose numbers stand at the positions of the other lines of its shape: the redaction's
/// `<ip>` (a dotted timestamp that looked like an address) counts as one number, as the
/// timestamp does in the lines the redaction left alone.
fn positional(line: &str) -> String {
    line.replace("<ip>", "0")
}

/// A line with its numbers blanked and its spaces collapsed: lines of one shape are one kind
/// (`draft acceptance = # ( # accepted / # generated)`), whatever their padding.
fn shape_of(line: &str) -> String {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    // A dotted run (`0.02.452.452`, llama.cpp's timestamp) is one number, and `<ip>` is what the
    // fixtures' redaction left of such a run that looked like an address.
    let re = RE.get_or_init(|| Regex::new(r"<ip>|\d[\d,]*(?:\.\d+)*").expect("static regex"));
    re.replace_all(line, "#")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Statements the one-step check cannot rebuild, each with why (the test fails when one of
/// them passes, so the list shrinks as the checker learns): (file name prefix, finding id).
const KNOWN_GAPS: &[(&str, &str, &str)] = &[(
    "10_vllm_specdecode-log-format-history",
    "spec-decoding",
    "pooled over four line generations, cumulative V0 runs contributing their last value (docs/diagnose.md, vLLM): a sum over more than two line shapes",
)];

fn is_supported(v: f64, decimals: usize, s: &Support) -> bool {
    let half = 0.5 * 10f64.powi(-(decimals as i32)) + 1e-9 * v.abs().max(1.0);
    let (lo, hi) = (v - half, v + half);
    let within = |xs: &[f64], lo: f64, hi: f64| {
        let (lo, hi) = (lo.min(hi), lo.max(hi));
        let i = xs.partition_point(|x| *x < lo);
        xs.get(i).is_some_and(|x| *x <= hi)
    };
    if within(&s.values, lo, hi) {
        return true;
    }
    // One step between a and b of `pairs`: for each a, the interval b must fall in.
    // `a / x = r` for r in [rlo, rhi] (not straddling 0, a not 0): x between a/rlo and a/rhi.
    let inv = |a: f64, rlo: f64, rhi: f64| -> Option<(f64, f64)> {
        (a != 0.0 && (rlo > 0.0 || rhi < 0.0)).then(|| (a / rlo, a / rhi))
    };
    let ps = &s.pairs;
    ps.iter().any(|&a| {
        let mut ivs: Vec<(f64, f64)> = vec![(lo - a, hi - a), (a - hi, a - lo)]; // a + b, a - b
        if a != 0.0 {
            ivs.push((lo / a, hi / a)); // a · b
        }
        for k in [1.0, 100.0, 1000.0, 1.0 / 1073741824.0] {
            ivs.extend(inv(a * k, lo, hi)); // a / b · k
        }
        ivs.extend(inv(a, lo - 1.0, hi - 1.0)); // 1 + a / b
        for k in [1.0, 100.0] {
            // a / (a + b) · k
            ivs.extend(inv(a * k, lo, hi).map(|(x, y)| (x - a, y - a)));
        }
        ivs.extend(inv(a, lo, hi).map(|(x, y)| (x + 1.0, y + 1.0))); // a / (b - 1)
        ivs.into_iter().any(|(x, y)| within(ps, x, y))
    })
}

/// One fixture's findings, with the text each cites.
fn check_file(
    path: &Path,
    failures: &mut Vec<String>,
    gaps: &mut BTreeSet<(String, String)>,
) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let mut d = Diagnosis::default();
    match path.extension().and_then(|x| x.to_str()) {
        Some("log") => d.logs.push(LogInput {
            name: name.clone(),
            log: EngineLog::parse_bytes(&bytes),
        }),
        Some("sse") => d.sse.push(parse_sse(&name, &text)),
        _ => d.metrics.push(parse_metrics(&name, &bytes)),
    }
    d.findings = build_findings(&d);
    check_diagnosis(&name, &text, &d, "", failures, gaps);
    d.findings.len()
}

/// Check every finding of `d`, made from the input `name` (whose text is `text`): each number
/// it states is in, or one step from, the lines it cites, or `extra` (what the command line
/// gave: the card, the engine version, and the rules the finding quotes).
fn check_diagnosis(
    name: &str,
    text: &str,
    d: &Diagnosis,
    extra: &str,
    failures: &mut Vec<String>,
    gaps: &mut BTreeSet<(String, String)>,
) {
    let name = name.to_string();
    let lines: Vec<&str> = text.lines().collect();
    for f in &d.findings {
        let words = format!("{} {}", f.title, f.detail);
        if !f.source.contains(&name) && f.source != "-" {
            failures.push(format!(
                "{name}: [{}] cites no input: source '{}'",
                f.id, f.source
            ));
            continue;
        }
        // The source (`file:N`, `file lines a–b`) and the lines the words name.
        let mut cited = cited_lines(&f.source.replace(&format!("{name}:"), "line "), lines.len());
        let named = cited_lines(&words, lines.len());
        cited.extend(named.iter().copied());
        let text_of = |set: &BTreeSet<usize>| {
            set.iter()
                .filter_map(|l| lines.get(l - 1))
                .copied()
                .collect::<Vec<_>>()
                .join("\n")
        };
        let cited_text = if cited.is_empty() {
            text.to_string() // a scrape or stream cites the whole file
        } else {
            text_of(&cited)
        };
        let values = supported(&format!("{cited_text}\n{extra}"), &text_of(&named));
        for (v, dec) in numbers(&without_citations(&words, &name)) {
            if !is_supported(v, dec, &values) {
                if KNOWN_GAPS
                    .iter()
                    .any(|(file, id, _)| name.starts_with(file) && f.id == *id)
                {
                    gaps.insert((name.clone(), f.id.clone()));
                    continue;
                }
                failures.push(format!(
                    "{name}: [{}] states {v} (at {dec} decimals), which the lines it cites ({}) do not hold or give: {}",
                    f.id,
                    if cited.is_empty() { "the whole file".to_string() } else { format!("{} lines", cited.len()) },
                    words
                ));
            }
        }
    }
}

#[test]
fn every_number_of_every_finding_comes_from_what_it_cites() {
    let mut failures = Vec::new();
    let mut gaps = BTreeSet::new();
    let mut findings = 0;
    for p in fixture_files() {
        findings += check_file(&p, &mut failures, &mut gaps);
    }
    for (file, id, why) in KNOWN_GAPS {
        assert!(
            gaps.iter().any(|(n, i)| n.starts_with(file) && i == id),
            "the known gap {file}* [{id}] ({why}) now passes: remove it from KNOWN_GAPS"
        );
    }
    assert!(findings >= 40, "only {findings} findings over the fixtures");
    assert!(
        failures.is_empty(),
        "{} statements without support:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The inverted operations find what the old list of every pair's results found, and no more:
/// a ratio, a share, `1 + a / b`, but not a value no pair gives; a zero operand supports nothing
/// by division.
#[test]
fn one_step_of_arithmetic_is_found_by_inverting_it() {
    let s = Support {
        values: vec![],
        pairs: vec![0.0, 7343.49, 12087.0],
    };
    assert!(is_supported(1645.9, 1, &s), "12087 / 7343.49 · 1000");
    assert!(is_supported(19430.5, 1, &s), "a sum");
    assert!(
        is_supported(62.2, 1, &s),
        "a share: 12087 / (12087 + 7343.49) · 100"
    );
    assert!(is_supported(2.646, 3, &s), "1 + 12087 / 7343.49");
    assert!(!is_supported(1646.3, 1, &s));
    assert!(
        !is_supported(3.7, 1, &s),
        "0 / x is 0 for every x, never 3.7"
    );
}

/// The checkpoint folders of `tests/fixtures` (a folder holding `config.json`, inspected in
/// place) and the real config pairs (`ORG--NAME__config.json` with its `__hf_quant_config.json`,
/// copied into a temporary folder): (name, folder, the temporary folder that keeps it alive).
fn config_fixtures() -> Vec<(String, PathBuf, Option<tempfile::TempDir>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if p.join("config.json").is_file() {
                    out.push((name.clone(), p.clone(), None));
                }
                stack.push(p);
            } else if let Some(stem) = name.strip_suffix("__config.json") {
                let t = tempfile::tempdir().unwrap();
                for f in ["config.json", "hf_quant_config.json"] {
                    let src = d.join(format!("{stem}__{f}"));
                    if src.exists() {
                        std::fs::copy(&src, t.path().join(f)).unwrap();
                    }
                }
                out.push((stem.to_string(), t.path().to_path_buf(), Some(t)));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= 15,
        "expected the checkpoint folders and config pairs under {}, found {}",
        root.display(),
        out.len()
    );
    out
}

/// What an `inspect` finding cites: the metadata files it read (config.json,
/// hf_quant_config.json, the weight index), the modules it names and their count, and the model
/// facts rigbench reads from config.json (layer counts by kind, heads, experts), which other
/// tests check against the configs.
fn inspect_cited(dir: &Path, r: &checkpoint::InspectReport, f: &checkpoint::Finding) -> String {
    let mut cited = String::new();
    for file in [
        "config.json",
        "hf_quant_config.json",
        "model.safetensors.index.json",
    ] {
        if let Ok(t) = std::fs::read_to_string(dir.join(file)) {
            cited.push_str(&t);
            cited.push('\n');
        }
    }
    cited.push_str(&f.modules.join("\n"));
    cited.push_str(&format!("\n{}\n", f.module_count));
    cited.push_str(&serde_json::to_string(&r.model).unwrap().replace(',', ", "));
    cited
}

/// The rule for every sentence over `inspect`: every number each lint finding of every
/// committed checkpoint folder and config pair states (in its why and its detail) is in, or one
/// step of arithmetic from, what it cites ([`inspect_cited`]), with a card given (`--cc sm_120`,
/// so the card's findings speak too) and without.
#[test]
fn every_number_of_every_inspect_finding_comes_from_the_config_it_cites() {
    let mut failures = Vec::new();
    let mut findings = 0;
    for (name, dir, _keep) in config_fixtures() {
        for cc in [None, Some("sm_120")] {
            let opts = checkpoint::InspectOptions {
                cc: cc.map(|c| c.parse().unwrap()),
                card: cc.map(|_| "--cc".to_string()),
                ..Default::default()
            };
            let r = match checkpoint::inspect(&dir, &opts) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("{name}: inspect refused it: {e:#}"));
                    continue;
                }
            };
            for f in &r.findings {
                findings += 1;
                let cited = inspect_cited(&dir, &r, f);
                let values = supported(&cited, "");
                let words = format!("{} {}", f.why, f.detail);
                let words = words.replace(&dir.display().to_string(), " ");
                for (v, dec) in numbers(&without_citations(&words, &name)) {
                    if !is_supported(v, dec, &values) {
                        failures.push(format!(
                            "{name} (cc {cc:?}): [{}] states {v} (at {dec} decimals), which its config and modules do not hold or give: {words}",
                            f.rule
                        ));
                    }
                }
            }
        }
    }
    assert!(
        findings >= 20,
        "only {findings} inspect findings over the configs"
    );
    // The rule is not vacuous: a number no config holds is refused.
    let (name, dir, _keep) = config_fixtures()
        .into_iter()
        .find(|(n, ..)| n.starts_with("nvidia--Qwen3.6"))
        .expect("the Qwen3.6 config pair");
    let r = checkpoint::inspect(&dir, &Default::default()).unwrap();
    let f = r.findings.first().expect("a finding");
    let values = supported(&inspect_cited(&dir, &r, f), "");
    let planted = format!("{} 9173.25 layers", f.detail);
    let bad: Vec<f64> = numbers(&without_citations(&planted, &name))
        .into_iter()
        .filter(|(v, d)| !is_supported(*v, *d, &values))
        .map(|(v, _)| v)
        .collect();
    assert_eq!(bad, vec![9173.25], "{planted}");
    assert!(
        failures.is_empty(),
        "{} statements without support:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The prediction joined with the real logs (`prediction-joined`, `kernel-differs-from-prediction`)
/// goes through the same rule: each number is in the lines it cites, or in what the command
/// line gave (the card, `--engine`) and the rules the finding quotes (each predicted row's
/// kernel and rule source).
#[test]
fn every_number_of_the_prediction_join_comes_from_what_it_cites() {
    let cases = [
        (
            "03_vllm-v0.24",
            "sm_120",
            "vllm==0.24",
            Some("nvidia--Qwen3.6-35B-A3B-NVFP4"),
        ),
        ("19_sglang-0.5.9", "sm_90", "sglang==0.5.9", None),
        ("19_sglang-0.5.9", "sm_100", "sglang==0.5.9", None),
    ];
    let mut failures = Vec::new();
    let mut gaps = BTreeSet::new();
    let mut checked = 0;
    for (prefix, cc, engine, config) in cases {
        let path = fixture_files()
            .into_iter()
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .unwrap_or_else(|| panic!("fixture logs/{prefix}*"));
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let card = Card {
            cc: cc.parse().unwrap(),
            source: "--cc".into(),
        };
        let keep = config.map(|stem| {
            let src = crate::real_fixture("configs");
            let t = tempfile::tempdir().unwrap();
            for f in ["config.json", "hf_quant_config.json"] {
                let p = src.join(format!("{stem}__{f}"));
                if p.exists() {
                    std::fs::copy(&p, t.path().join(f)).unwrap();
                }
            }
            t
        });
        let spec: checkpoint::predict::EngineSpec = engine.parse().unwrap();
        let mut d = Diagnosis {
            logs: vec![LogInput {
                name: name.clone(),
                log: EngineLog::parse_bytes(&bytes),
            }],
            checkpoint: keep
                .as_ref()
                .map(|t| checkpoint_facts(t.path(), Some(card.cc)).unwrap()),
            card: Some(card.clone()),
            engine: Some(spec),
            ..Default::default()
        };
        d.findings = build_findings(&d);
        d.findings
            .retain(|f| f.id == "prediction-joined" || f.id == "kernel-differs-from-prediction");
        assert!(!d.findings.is_empty(), "{name} on {cc}: no join finding");
        checked += d.findings.len();
        // What the command line gave, and the rules the findings quote.
        let input = d
            .checkpoint
            .as_ref()
            .and_then(|c| c.predict_input.clone())
            .unwrap_or(checkpoint::predict::PredictInput {
                attention: true,
                ..Default::default()
            });
        let p = checkpoint::predict::predict(&spec, card.cc.as_int(), &input);
        let mut extra = format!("{cc} {engine} {spec}\n");
        for r in &p.rows {
            extra.push_str(&format!("{}\n{}\n", r.kernel, r.rule_source));
        }
        check_diagnosis(&name, &text, &d, &extra, &mut failures, &mut gaps);
    }
    assert!(checked >= 3, "only {checked} join findings");
    assert!(
        failures.is_empty(),
        "{} statements without support:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
