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

impl ReportDir {
    /// Use `out` when given, else `reports/<rig_label>/<UTC timestamp>/` under the current folder.
    /// Creates the folder.
    ///
    /// # Errors
    /// The folder cannot be created (the error names it).
    pub fn create(out: Option<&Path>, rig_label: &str, redact: bool) -> anyhow::Result<Self> {
        let path = match out {
            Some(p) => p.to_path_buf(),
            None => PathBuf::from("reports")
                .join(rig_label)
                .join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string()),
        };
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create report folder {}", path.display()))?;
        Ok(Self {
            path,
            redactor: Redactor::for_this_host(redact),
        })
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
