//! The versioned results schema: one `results.json` per report, the file `compare` reads, and
//! the format of committed baselines.
//!
//! Versioning: [`SCHEMA_VERSION`] goes up when a field changes meaning or is removed; adding an
//! optional field does not change it (readers ignore unknown fields and default missing ones).

use serde::{Deserialize, Serialize};

use crate::rig::RigFacts;

/// Current schema version.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything a report holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// Schema version of this file.
    pub schema_version: u32,
    /// rigbench version that wrote it.
    pub rigbench_version: String,
    /// When the run started, UTC, RFC 3339.
    pub created_utc: String,
    /// Rig label (folder name under `reports/` and `baselines/`).
    pub rig_label: String,
    /// The command line that produced it (redacted).
    pub command_line: String,
    /// The rig.
    pub rig: RigFacts,
    /// Kernel benches.
    #[serde(default)]
    pub kernels: Option<crate::kernels::KernelResults>,
    /// Checkpoint inspection (`report --checkpoint DIR`).
    #[serde(default)]
    pub checkpoint: Option<crate::checkpoint::InspectReport>,
    /// End-to-end runs (the CPU backend without a GPU, an external engine with `--url` /
    /// `--engine-cmd`, or a labelled harness self-test).
    #[serde(default)]
    pub e2e: Option<crate::e2e::E2eResults>,
    /// The built-in runtime on the GPU: parity, per-format e2e and benchmarks, fidelity.
    #[serde(default)]
    pub runtime: Option<crate::runtime_eval::section::RuntimeSection>,
    /// Fidelity of FP8, W4A16 and emulated W4A4 against BF16 on trained weights (SmolLM2 on the
    /// CPU backend; docs/fidelity.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::runtime_eval::quality::QualityReport>,
    /// A reference endpoint against candidates on the same model: fidelity through the API,
    /// the task pack, the verdict (`rigbench quality`; docs/quality.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality_comparison: Option<crate::quality::QualityComparison>,
    /// Multi-GPU parts: other GPUs' kernel rows and their spread, the interconnect, the
    /// tensor-parallel prediction (`--devices` with two or more GPUs).
    #[serde(default)]
    pub multi_gpu: Option<crate::multigpu::MultiGpuResults>,
    /// The tensor-parallel decode-step composite at TP = 2, 4, 8 predicted from the first GPU's
    /// kernel rows and a stated all-reduce model (predicted, not measured; any GPU count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_model: Option<crate::multigpu::tp_model::TpModel>,
    /// Parts of the job not run, with the reason.
    #[serde(default)]
    pub skipped: Vec<Skip>,
    /// Parts that were asked for and failed, with the whole reason: an engine the end-to-end
    /// part was to measure that did not start, stopped during the runs, or gave no valid run.
    /// `rigbench report` exits 1 on them, and the verdict opens with them. (Absent from files
    /// written before this field; such a failure was then only in `skipped`.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<Skip>,
    /// Whether the run finished (false while in progress or after an interruption).
    #[serde(default)]
    pub complete: bool,
    /// Each timing metric's between-run spread, stored when the results are saved as a baseline
    /// from a repeated run (`report --repeats R --save-baseline`, R ≥ 2); `compare` uses it for
    /// the baseline side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between_run: Option<BetweenRun>,
    /// Set when SIGINT or SIGTERM stopped the run: which signal, and that what follows is what
    /// was measured before it (absent from files of runs that were not interrupted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
    /// The run's wall time, seconds, from the job's start to the last write of this file
    /// (absent from files written before this field; a resumed run counts its own process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// The time budget's plan (`report --budget`, docs/report.md): what ran, the estimate, what
    /// the budget left out and the command that runs it (absent with `--budget none` and in
    /// files written before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRecord>,
}

/// The budget's plan as a report records it: the plan and the command that runs what it left
/// out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetRecord {
    /// The plan (M grid, peers, repeats, estimate, what was left out, the costs' sources).
    pub plan: super::budget::Plan,
    /// The command that runs the full suite (this one with `--budget none`).
    pub full_command: String,
}

/// The between-run spread of every timing metric of a results file (what `rigbench compare`'s
/// gate uses for the baseline side: docs/gate.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BetweenRun {
    /// Repeats the spread was measured over.
    pub repeats: usize,
    /// Metric id → standard deviation of the repeats' `ln median` and its degrees of freedom.
    pub metrics: std::collections::BTreeMap<String, RunSpread>,
}

/// Between-run spread of one metric: the standard deviation of `ln median` across repeats and
/// its degrees of freedom (repeats − 1). Baselines store it per timing metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunSpread {
    /// Standard deviation of the repeats' `ln median` (≈ the relative spread: 0.01 = 1%).
    pub sd_log: f64,
    /// Degrees of freedom (repeats − 1).
    pub df: usize,
}

/// A part of the job not run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skip {
    /// What (e.g. `kernels`, `e2e`, `kernels/w4a4`).
    pub what: String,
    /// Why, and what would make it run.
    pub reason: String,
}

impl Results {
    /// A new, empty result for this rig, stamped now.
    pub fn new(rig: RigFacts, rig_label: String, command_line: String) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            rigbench_version: env!("CARGO_PKG_VERSION").to_string(),
            created_utc: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            rig_label,
            command_line,
            rig,
            kernels: None,
            checkpoint: None,
            e2e: None,
            runtime: None,
            multi_gpu: None,
            tp_model: None,
            quality: None,
            quality_comparison: None,
            skipped: Vec::new(),
            failed: Vec::new(),
            complete: false,
            between_run: None,
            interrupted: None,
            wall_s: None,
            budget: None,
        }
    }

    /// Read a results file, checking the schema version.
    ///
    /// # Errors
    /// [`crate::RigError::BadFile`] when the file is missing, not JSON, or of another schema
    /// version; the message says which.
    pub fn load(path: &std::path::Path) -> Result<Self, crate::RigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| crate::RigError::file(path, format!("cannot read results file: {e}")))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            crate::RigError::file(
                path,
                format!("not valid JSON ({e}); expected a rigbench results.json"),
            )
        })?;
        let version = v.get("schema_version").and_then(|x| x.as_u64());
        match version {
            Some(x) if x == SCHEMA_VERSION as u64 => {}
            Some(x) => {
                return Err(crate::RigError::file(
                    path,
                    format!("results schema version {x}, but this rigbench reads version {SCHEMA_VERSION}; re-run the producing command with this version"),
                ))
            }
            None => {
                return Err(crate::RigError::file(
                    path,
                    "no schema_version field: not a rigbench results.json",
                ))
            }
        }
        serde_json::from_value(v).map_err(|e| {
            crate::RigError::file(path, format!("does not match the results schema: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_version_check() {
        let d = tempfile::tempdir().unwrap();
        let r = Results::new(
            RigFacts::default(),
            "cpu-x86-64".into(),
            "rigbench report".into(),
        );
        let p = d.path().join("results.json");
        crate::output::write::atomic_write_json(&p, &r).unwrap();
        assert_eq!(Results::load(&p).unwrap(), r);

        let mut v = serde_json::to_value(&r).unwrap();
        v["schema_version"] = 999.into();
        std::fs::write(&p, v.to_string()).unwrap();
        let e = Results::load(&p).unwrap_err().to_string();
        assert!(e.contains("999") && e.contains("results.json"), "{e}");

        std::fs::write(&p, b"{not json").unwrap();
        assert!(Results::load(&p)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        assert!(Results::load(&d.path().join("missing.json")).is_err());
    }

    /// Results written by older versions (the committed baselines, with their engine logs) read
    /// back under today's schema.
    #[test]
    fn committed_baselines_read_back() {
        for f in [
            "baselines/ci-cpu/qwen3.6-27b.json",
            "baselines/nvidia-h200-sm90/qwen3.6-27b.json",
        ] {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(f);
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{f}: {e}"));
            let _: Results = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }
}
