//! Baselines: committed results files at `baselines/<rig-label>/<suite>.json`, in the results
//! schema ([`Results`]), so a baseline carries the rig facts it was measured on; and the rig
//! compatibility check run before any verdict.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::output::redact::Redactor;
use crate::report::Results;
use crate::rig::RigFacts;
use crate::RigError;

/// Check that `name` can be one path component of a baseline (`what` names it in the error):
/// ASCII letters, digits, `.`, `_` and `-`, not starting with `.`, at most 128 characters.
///
/// # Errors
/// A message naming the offending value and the rule.
pub fn check_component(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} '{name}' cannot name a baseline file: use ASCII letters, digits, '.', '_' and '-' (not starting with '.')"
        ))
    }
}

/// `<baselines_dir>/<rig_label>/<suite>.json`.
///
/// # Errors
/// [`RigError::BadFlag`] when `rig_label` or `suite` is not a safe path component (see
/// [`check_component`]).
pub fn baseline_path(
    baselines_dir: &Path,
    rig_label: &str,
    suite: &str,
) -> Result<PathBuf, RigError> {
    check_component("rig label", rig_label).map_err(|m| RigError::flag("rig label", m))?;
    check_component("suite", suite).map_err(|m| RigError::flag("--suite", m))?;
    Ok(baselines_dir.join(rig_label).join(format!("{suite}.json")))
}

/// The baseline of `suite` for the rig `rig_label` under `baselines_dir`, if that file exists.
///
/// # Errors
/// An unsafe rig label or suite name (see [`baseline_path`]).
pub fn find_baseline(
    baselines_dir: &Path,
    rig_label: &str,
    suite: &str,
) -> Result<Option<PathBuf>, RigError> {
    let p = baseline_path(baselines_dir, rig_label, suite)?;
    Ok(p.is_file().then_some(p))
}

/// Baselines present under `baselines_dir`, as `<rig-label>/<suite>.json`, sorted (empty when
/// the folder is missing or unreadable). Used to make a "baseline missing" message useful.
pub fn list_baselines(baselines_dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rigs) = std::fs::read_dir(baselines_dir) else {
        return out;
    };
    for rig in rigs.flatten() {
        let Ok(files) = std::fs::read_dir(rig.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") && !name.starts_with('.') {
                out.push(format!("{}/{name}", rig.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

/// The between-run spread of every timing metric of `results` measured in at least two repeats
/// (see [`crate::report::schema::RunSpread`]); `None` when nothing was repeated.
pub fn between_run_of(results: &Results) -> Option<crate::report::schema::BetweenRun> {
    let mut out = crate::report::schema::BetweenRun::default();
    for m in crate::compare::metrics_of(results) {
        if let crate::compare::MetricValue::Samples {
            samples, repeats, ..
        } = &m.value
        {
            let Ok(st) = crate::compare::gate::SideStats::of(samples, repeats, "baseline") else {
                continue;
            };
            if let Some(sp) = st.spread() {
                out.repeats = out.repeats.max(st.repeats());
                out.metrics.insert(m.id.clone(), sp);
            }
        }
    }
    (!out.metrics.is_empty()).then_some(out)
}

/// The sections of a results file a baseline gates on, with their metric counts: `rig
/// capability`, `kernel timings`, `kernel checks`, `reference accuracy`, `checkpoint`, `e2e`.
pub fn sections(results: &Results) -> std::collections::BTreeMap<&'static str, usize> {
    let mut out = std::collections::BTreeMap::new();
    for m in crate::compare::metrics_of(results) {
        let sec = match m.id.split('/').next().unwrap_or_default() {
            "rig" => "rig capability",
            "kernels" if m.id.starts_with("kernels/reference_accuracy/") => "reference accuracy",
            "kernels" if !m.is_deterministic() => "kernel timings",
            "kernels" => "kernel checks",
            "checkpoint" => "checkpoint",
            "e2e" => "e2e",
            _ => "other",
        };
        *out.entry(sec).or_insert(0) += 1;
    }
    out
}

/// What replacing a baseline changes: metric counts per section before and after, and the
/// sections the new one lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// Per section: (before, after) metric counts.
    pub sections: Vec<(String, usize, usize)>,
    /// Sections with metrics before and none after.
    pub dropped: Vec<String>,
}

impl Replacement {
    /// Compare the sections of the baseline on disk (`old`) and the new one.
    pub fn of(old: &Results, new: &Results) -> Self {
        let (a, b) = (sections(old), sections(new));
        let mut keys: Vec<&&str> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        let sections: Vec<(String, usize, usize)> = keys
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    a.get(**k).copied().unwrap_or(0),
                    b.get(**k).copied().unwrap_or(0),
                )
            })
            .collect();
        let dropped = sections
            .iter()
            .filter(|(_, x, y)| *x > 0 && *y == 0)
            .map(|(k, _, _)| k.clone())
            .collect();
        Self { sections, dropped }
    }

    /// One line: `metrics 1,412 → 1,380 (kernel timings 1,300 → 1,300, e2e 60 → 0, ...)`.
    pub fn summary(&self) -> String {
        let tot =
            |f: fn(&(String, usize, usize)) -> usize| self.sections.iter().map(f).sum::<usize>();
        let parts: Vec<String> = self
            .sections
            .iter()
            .map(|(k, x, y)| format!("{k} {x} → {y}"))
            .collect();
        format!(
            "metrics {} → {} ({})",
            tot(|s| s.1),
            tot(|s| s.2),
            parts.join(", ")
        )
    }
}

/// The outcome of [`save_baseline`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The file written.
    pub path: PathBuf,
    /// What it replaced, when a baseline was there.
    pub replaced: Option<Replacement>,
}

/// Check before measuring that a baseline can be saved under `baselines_dir`: the folder can be
/// created and written (a temporary file is created and removed).
///
/// # Errors
/// [`RigError::BadFlag`] naming `--baseline-dir` and why.
pub fn check_writable(baselines_dir: &Path) -> Result<(), RigError> {
    std::fs::create_dir_all(baselines_dir)
        .and_then(|_| tempfile::NamedTempFile::new_in(baselines_dir).map(drop))
        .map_err(|e| {
            RigError::flag(
                "--baseline-dir",
                format!(
                    "{} cannot be written ({e}); pick a writable folder before measuring",
                    baselines_dir.display()
                ),
            )
        })
}

/// Save `results` as the baseline of `suite` for its rig: `<baselines_dir>/<rig_label>/<suite>.json`,
/// in the results schema (so it records the rig facts it was measured on), with each timing
/// metric's between-run spread when the run was repeated ([`between_run_of`]), written
/// atomically ([`crate::output::write::atomic_write_json`]) and redacted (host name, user, home
/// and working directory, IP addresses), since baselines are committed.
///
/// Replacing a baseline: the outcome says what changed (metric counts per section); a new
/// baseline that lacks a whole section the old one had (e.g. a `--no-e2e` refresh, or one made
/// without a GPU) is refused unless `force` (`--force-baseline`), since every later run would then compare that
/// section as "new" and pass.
///
/// `rigbench report --save-baseline` calls this after the run has finished.
///
/// # Errors
/// The results are incomplete (`complete == false`: an interrupted run must not become the
/// contract), the rig label or suite is not a safe file name, a section would be dropped without
/// `force`, or the file cannot be written.
pub fn save_baseline(
    results: &Results,
    baselines_dir: &Path,
    suite: &str,
    force: bool,
) -> anyhow::Result<Saved> {
    if !results.complete {
        anyhow::bail!(
            "refusing to save an incomplete run as the baseline of suite '{suite}' (the run was interrupted or is still in progress); re-run it to completion first"
        );
    }
    let path = baseline_path(baselines_dir, &results.rig_label, suite)?;
    let mut results = results.clone();
    results.between_run = between_run_of(&results);
    let replaced = if path.is_file() {
        match Results::load(&path) {
            Ok(old) => Some(Replacement::of(&old, &results)),
            Err(_) => None,
        }
    } else {
        None
    };
    if let Some(r) = &replaced {
        if !r.dropped.is_empty() && !force {
            anyhow::bail!(
                "refusing to replace baseline {}: the new results have no {} metrics, which the old baseline gates on ({}); a later full run would compare them as new and pass. Re-run with those parts, or pass --force-baseline to drop them",
                path.display(),
                r.dropped.join(", "),
                r.summary()
            );
        }
    }
    let mut v = serde_json::to_value(&results).context("cannot serialize the results")?;
    Redactor::for_this_host(true).redact_json(&mut v);
    crate::output::write::atomic_write_json(&path, &v)
        .with_context(|| format!("cannot write baseline {}", path.display()))?;
    Ok(Saved { path, replaced })
}

/// The outcome of comparing the rig of a baseline with the rig of the results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RigCheck {
    /// Differences that make timings incomparable: GPU name, compute capability, driver major
    /// version (or a GPU on one side only). Non-empty = rig mismatch.
    pub mismatches: Vec<String>,
    /// Other differences worth knowing (driver minor version, CUDA, NVRTC, cuBLASLt, CPU),
    /// which do not block the comparison.
    pub differences: Vec<String>,
}

impl RigCheck {
    /// Whether the rigs match on GPU name, compute capability and driver major version.
    pub fn compatible(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Major version of an NVIDIA driver version string (`580.159.04` → 580).
pub fn driver_major(v: &str) -> Option<u32> {
    v.trim().split('.').next()?.parse().ok()
}

fn or_unknown(v: Option<&str>) -> &str {
    v.unwrap_or("unknown")
}

/// Compare the rig of the baseline (`b`) with that of the results (`c`).
///
/// A mismatch is a different GPU name, compute capability or driver major version, or a GPU on
/// one side only. A driver version known on one side and unknown on the other is a mismatch
/// (sameness cannot be confirmed); unknown on both sides is listed as a difference.
pub fn check_rig(b: &RigFacts, c: &RigFacts) -> RigCheck {
    let mut r = RigCheck::default();
    match (&b.gpu, &c.gpu) {
        (None, None) => {
            if b.host.arch != c.host.arch {
                r.differences.push(format!(
                    "CPU architecture: {} (baseline) vs {} (results)",
                    b.host.arch, c.host.arch
                ));
            }
        }
        (Some(g), None) => r.mismatches.push(format!(
            "GPU: {} in the baseline, none in the results ({})",
            g.name,
            or_unknown(c.gpu_absent_reason.as_deref())
        )),
        (None, Some(g)) => r.mismatches.push(format!(
            "GPU: none in the baseline, {} in the results",
            g.name
        )),
        (Some(bg), Some(cg)) => {
            if bg.name != cg.name {
                r.mismatches.push(format!(
                    "GPU: {} (baseline) vs {} (results)",
                    bg.name, cg.name
                ));
            }
            if bg.compute_capability != cg.compute_capability {
                let cc = |x: Option<crate::gpu::ComputeCapability>| {
                    x.map(|c| c.to_string()).unwrap_or_else(|| "unknown".into())
                };
                r.mismatches.push(format!(
                    "compute capability: {} (baseline) vs {} (results)",
                    cc(bg.compute_capability),
                    cc(cg.compute_capability)
                ));
            }
            let (bd, cd) = (
                b.stack.driver_version.as_deref(),
                c.stack.driver_version.as_deref(),
            );
            let (bm, cm) = (bd.and_then(driver_major), cd.and_then(driver_major));
            match (bm, cm) {
                (Some(x), Some(y)) if x != y => r.mismatches.push(format!(
                    "driver major version: {x} (baseline {}) vs {y} (results {})",
                    or_unknown(bd),
                    or_unknown(cd)
                )),
                (Some(_), Some(_)) => {
                    if bd != cd {
                        r.differences.push(format!(
                            "driver: {} (baseline) vs {} (results), same major version",
                            or_unknown(bd),
                            or_unknown(cd)
                        ));
                    }
                }
                (None, None) => r
                    .differences
                    .push("driver version unknown in both baseline and results".into()),
                _ => r.mismatches.push(format!(
                    "driver version: {} (baseline) vs {} (results); cannot confirm the same major version",
                    or_unknown(bd),
                    or_unknown(cd)
                )),
            }
        }
    }
    let mut soft = |what: &str, x: Option<&str>, y: Option<&str>| {
        if x != y {
            r.differences.push(format!(
                "{what}: {} (baseline) vs {} (results)",
                or_unknown(x),
                or_unknown(y)
            ));
        }
    };
    soft(
        "driver CUDA version",
        b.stack.driver_cuda_version.as_deref(),
        c.stack.driver_cuda_version.as_deref(),
    );
    soft(
        "NVRTC",
        b.stack.nvrtc_version.as_deref(),
        c.stack.nvrtc_version.as_deref(),
    );
    soft(
        "cuBLASLt",
        b.stack.cublaslt_version.as_deref(),
        c.stack.cublaslt_version.as_deref(),
    );
    soft(
        "built for CUDA",
        Some(b.stack.built_for_cuda.as_str()).filter(|s| !s.is_empty()),
        Some(c.stack.built_for_cuda.as_str()).filter(|s| !s.is_empty()),
    );
    soft(
        "CPU",
        Some(b.host.cpu_model.as_str()).filter(|s| !s.is_empty()),
        Some(c.host.cpu_model.as_str()).filter(|s| !s.is_empty()),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ComputeCapability;
    use crate::rig::GpuFacts;

    fn gpu(name: &str, cc: (u32, u32), driver: Option<&str>) -> RigFacts {
        let mut f = RigFacts::default();
        f.host.arch = "x86_64".into();
        f.gpu = Some(GpuFacts {
            name: name.into(),
            compute_capability: Some(ComputeCapability::new(cc.0, cc.1)),
            ..Default::default()
        });
        f.stack.driver_version = driver.map(String::from);
        f
    }

    #[test]
    fn rig_checks() {
        let h200 = gpu("NVIDIA H200", (9, 0), Some("580.159.04"));
        assert!(check_rig(&h200, &h200).compatible());
        let minor = gpu("NVIDIA H200", (9, 0), Some("580.65.06"));
        let r = check_rig(&h200, &minor);
        assert!(r.compatible(), "{r:?}");
        assert!(r.differences[0].contains("same major"), "{r:?}");
        let major = gpu("NVIDIA H200", (9, 0), Some("570.86.15"));
        let r = check_rig(&h200, &major);
        assert!(
            !r.compatible() && r.mismatches[0].contains("580") && r.mismatches[0].contains("570")
        );
        let h100 = gpu("NVIDIA H100 80GB HBM3", (9, 0), Some("580.159.04"));
        assert!(check_rig(&h200, &h100).mismatches[0].contains("H100"));
        let ada = gpu("NVIDIA H200", (8, 9), Some("580.159.04"));
        assert!(check_rig(&h200, &ada).mismatches[0].contains("sm_89"));
        let unknown = gpu("NVIDIA H200", (9, 0), None);
        assert!(!check_rig(&h200, &unknown).compatible());
        let mut cpu = RigFacts::default();
        cpu.host.arch = "x86_64".into();
        assert!(check_rig(&cpu, &cpu).compatible());
        assert!(!check_rig(&h200, &cpu).compatible());
        assert_eq!(driver_major("580.159.04"), Some(580));
        assert_eq!(driver_major("n/a"), None);
    }

    #[test]
    fn names_and_paths() {
        let d = Path::new("baselines");
        assert_eq!(
            baseline_path(d, "nvidia-h200-sm90", "qwen3.6-27b").unwrap(),
            PathBuf::from("baselines/nvidia-h200-sm90/qwen3.6-27b.json")
        );
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(baseline_path(d, "rig", bad).is_err(), "{bad}");
            assert!(baseline_path(d, bad, "suite").is_err(), "{bad}");
        }
    }

    #[test]
    fn save_find_and_refuse_incomplete() {
        let d = tempfile::tempdir().unwrap();
        let mut r = Results::new(
            RigFacts::default(),
            "cpu-x86-64".into(),
            "rigbench report".into(),
        );
        assert!(save_baseline(&r, d.path(), "ci", false)
            .unwrap_err()
            .to_string()
            .contains("incomplete"));
        assert_eq!(find_baseline(d.path(), "cpu-x86-64", "ci").unwrap(), None);
        r.complete = true;
        let saved = save_baseline(&r, d.path(), "ci", false).unwrap();
        assert_eq!(saved.replaced, None);
        let p = saved.path;
        assert_eq!(p, d.path().join("cpu-x86-64/ci.json"));
        assert_eq!(
            find_baseline(d.path(), "cpu-x86-64", "ci").unwrap(),
            Some(p.clone())
        );
        assert_eq!(Results::load(&p).unwrap().rig_label, "cpu-x86-64");
        assert_eq!(
            list_baselines(d.path()),
            vec!["cpu-x86-64/ci.json".to_string()]
        );
        r.rig_label = "../escape".into();
        assert!(save_baseline(&r, d.path(), "ci", false).is_err());
    }

    fn with_e2e_and_repeats() -> Results {
        use crate::kernels::schema::{CaseRepeats, KernelCase, SuiteRepeats, Timing};
        let mut r = Results::new(RigFacts::default(), "cpu-x86-64".into(), "t".into());
        r.complete = true;
        let case = KernelCase {
            provider: "rigbench".into(),
            implementation: "bf16".into(),
            format: crate::formats::GemmFormat::Bf16,
            shape: "qkv".into(),
            m: 1,
            n: 8,
            k: 8,
            path: "p".into(),
            check: None,
            timing: Timing {
                samples_s: vec![1.0, 1.0, 1.0, 1.1, 1.1, 1.1],
                ..Default::default()
            },
            extra: Vec::new(),
            derived: Default::default(),
            sm_clock_mhz: None,
            throttle: Vec::new(),
            graph: None,
            graph_skip: None,
            clocks: None,
        };
        r.kernels = Some(crate::kernels::KernelResults {
            repeats: Some(SuiteRepeats {
                count: 2,
                order: Vec::new(),
                cases: vec![CaseRepeats {
                    provider: "rigbench".into(),
                    implementation: "bf16".into(),
                    shape: "qkv".into(),
                    m: 1,
                    part: None,
                    sizes: vec![3, 3],
                }],
            }),
            cases: vec![case],
            ..Default::default()
        });
        r.e2e = Some(crate::e2e::E2eResults {
            suite: Some(crate::e2e::workload::Suite::load("tiny").unwrap()),
            runs: Vec::new(),
            ..Default::default()
        });
        r
    }

    #[test]
    fn baselines_store_the_between_run_spread() {
        let d = tempfile::tempdir().unwrap();
        let r = with_e2e_and_repeats();
        let saved = save_baseline(&r, d.path(), "ci", false).unwrap();
        let b = Results::load(&saved.path).unwrap();
        let spread = b.between_run.clone().expect("stored");
        assert_eq!(spread.repeats, 2);
        let s = spread.metrics["kernels/rigbench/bf16/qkv/m=1/time_s"];
        assert_eq!(s.df, 1);
        // ln 1.1 − ln 1.0 between two repeats: sd = 0.0953 / √2.
        assert!(
            (s.sd_log - 1.1f64.ln() / 2f64.sqrt()).abs() < 1e-12,
            "{s:?}"
        );
        // And compare reads it back into the metric.
        let m = crate::compare::metrics_of(&b)
            .into_iter()
            .find(|m| m.id.ends_with("qkv/m=1/time_s"))
            .unwrap();
        assert!(matches!(
            m.value,
            crate::compare::MetricValue::Samples {
                between_run: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn replacing_a_baseline_says_what_changed_and_refuses_to_drop_a_section() {
        let d = tempfile::tempdir().unwrap();
        let mut r = with_e2e_and_repeats();
        r.rig.capabilities =
            crate::rig::capability::table(crate::gpu::ComputeCapability::new(9, 0));
        save_baseline(&r, d.path(), "ci", false).unwrap();
        // The same again: replaced, nothing dropped.
        let again = save_baseline(&r, d.path(), "ci", false).unwrap();
        let rep = again.replaced.expect("replaced");
        assert!(rep.dropped.is_empty());
        assert!(
            rep.summary().contains("kernel timings 1 → 1"),
            "{}",
            rep.summary()
        );
        // Without the kernel timings (e.g. a refresh on a host without a GPU): refused.
        let mut no_k = r.clone();
        no_k.kernels = None;
        let e = save_baseline(&no_k, d.path(), "ci", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no kernel timings metrics") && e.contains("--force-baseline"),
            "{e}"
        );
        // The file was not touched.
        assert!(Results::load(&d.path().join("cpu-x86-64/ci.json"))
            .unwrap()
            .kernels
            .is_some());
        // --force-baseline replaces, and says what was dropped.
        let forced = save_baseline(&no_k, d.path(), "ci", true).unwrap();
        assert_eq!(
            forced.replaced.unwrap().dropped,
            vec!["kernel timings".to_string()]
        );
    }

    #[test]
    fn writability_is_checked_up_front() {
        let d = tempfile::tempdir().unwrap();
        assert!(check_writable(&d.path().join("new/sub")).is_ok());
        let file = d.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = check_writable(&file.join("x")).unwrap_err().to_string();
        assert!(e.contains("--baseline-dir"), "{e}");
    }
}
