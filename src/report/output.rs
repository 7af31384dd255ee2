//! A report folder: `reports/<rig-label>/<UTC timestamp>/` with `results.json`, `report.md`,
//! `kernels.csv` and plots, written atomically and incrementally (after every case), redacted
//! by default.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::redact::Redactor;
use super::schema::Results;
use super::write::{atomic_write, atomic_write_json};

/// Where and how a report is written.
#[derive(Debug, Clone)]
pub struct ReportDir {
    /// The report folder.
    pub path: PathBuf,
    redactor: Redactor,
}

/// Files rigbench writes into a report folder (and only those), for reuse of a folder.
fn is_report_file(name: &str) -> bool {
    matches!(
        name,
        "results.json"
            | "report.md"
            | "kernels.csv"
            | "e2e_runs.csv"
            | "e2e_requests.csv"
            | "engine.log"
    ) || (name.ends_with(".svg") && (name.starts_with("kernels_") || name.starts_with("e2e_")))
}

fn remove_previous_report_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| is_report_file(&e.file_name().to_string_lossy()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

impl ReportDir {
    /// Use `out` when given, else `reports/<rig_label>/<UTC timestamp>/` under the current folder.
    /// Creates the folder.
    ///
    /// # Errors
    /// The folder cannot be created (the error names it).
    pub fn create(out: Option<&Path>, rig_label: &str, redact: bool) -> anyhow::Result<Self> {
        let path = match out {
            Some(p) => p.to_path_buf(),
            None => {
                // Two runs in the same second must not share (and overwrite) a folder.
                let base = PathBuf::from("reports")
                    .join(rig_label)
                    .join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string());
                let mut p = base.clone();
                let mut i = 2;
                while p.exists() {
                    p = PathBuf::from(format!("{}-{i}", base.display()));
                    i += 1;
                }
                p
            }
        };
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create report folder {}", path.display()))?;
        // Fail now, not after the measurements, when the folder cannot be written.
        let probe = path.join(".rigbench-write-test");
        std::fs::write(&probe, b"")
            .with_context(|| format!("cannot write into the report folder {}", path.display()))?;
        let _ = std::fs::remove_file(&probe);
        // A reused folder keeps nothing from an earlier report that this one might not rewrite.
        let stale = remove_previous_report_files(&path);
        if stale > 0 {
            eprintln!(
                "rigbench: {} already held a report; its {stale} files were removed",
                path.display()
            );
        }
        Ok(Self {
            path,
            redactor: Redactor::for_this_host(redact),
        })
    }

    /// An existing report folder, used as it is (for re-rendering in place).
    pub fn existing(path: &Path, redact: bool) -> Self {
        Self {
            path: path.to_path_buf(),
            redactor: Redactor::for_this_host(redact),
        }
    }

    /// The redactor in use.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Write `results.json` (redacted) atomically.
    pub fn write_results(&self, results: &Results) -> anyhow::Result<()> {
        let mut v = serde_json::to_value(results).context("cannot serialize results")?;
        self.redactor.redact_json(&mut v);
        atomic_write_json(&self.path.join("results.json"), &v)
    }

    /// Write a text file (redacted) atomically, relative to the report folder.
    pub fn write_text(&self, name: &str, text: &str) -> anyhow::Result<()> {
        atomic_write(&self.path.join(name), self.redactor.redact(text).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_folders_lose_only_report_files() {
        let d = tempfile::tempdir().unwrap();
        for f in [
            "results.json",
            "e2e_runs.csv",
            "kernels_qkv.svg",
            "notes.txt",
        ] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        let r = ReportDir::create(Some(d.path()), "x", false).unwrap();
        let left: Vec<String> = std::fs::read_dir(&r.path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["notes.txt"]);
    }
}
