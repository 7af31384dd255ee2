//! A report folder: `reports/<rig-label>/<UTC timestamp>/` with `results.json`, `report.md`,
//! `kernels.csv` and plots, written atomically and incrementally (after every case), redacted
//! by default.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::schema::Results;
use crate::output::redact::Redactor;
use crate::output::write::{atomic_write, atomic_write_json};

/// Where and how a report is written.
///
/// A folder that already holds a report (`results.json` or `report.md`) is refused unless the
/// caller forces it (`--force`); even then nothing of the earlier report is deleted before the
/// new run has measured something: the new files go to a staging folder beside it and
/// [`ReportDir::commit`] moves them in at the end (after a success, an interruption or a
/// failure that left results). A run that fails before measuring anything leaves the earlier
/// report as it was ([`ReportDir::keep_after_failed_start`]).
///
/// While a run writes, it holds an advisory lock (`flock(2)`, exclusive) on the report folder
/// itself; a second run into the same folder is refused at once with an error naming it (two
/// runs into one new `--out` used to both succeed: one report silently lost, or both mixed).
/// The staging folder is created fresh with a random name
/// (`<name>.rigbench-partial-XXXXXX`, `mkdir(2)`, which fails on anything already there, a
/// symlink included), so a stale staging folder of an earlier run (the same pid is usual in
/// containers) or a planted symlink is never written into nor merged.
#[derive(Debug, Clone)]
pub struct ReportDir {
    /// Where files are written now: the report folder, or its staging folder while a forced run
    /// replaces an earlier report.
    pub path: PathBuf,
    /// The folder the report ends up in.
    pub target: PathBuf,
    redactor: Redactor,
    staged: bool,
    /// The report files the target folder held when the run started, with their times.
    before: Vec<(PathBuf, Option<std::time::SystemTime>)>,
    /// The open folder whose `flock` this run holds (released when the last clone is dropped).
    _lock: Option<std::sync::Arc<std::fs::File>>,
}

/// Take the exclusive advisory lock of report folder `dir` (an existing folder) without
/// waiting.
///
/// # Errors
/// Another process holds it ([`crate::RigError::BadFlag`] naming `--out`, the folder and the
/// fix), or the folder cannot be opened.
pub fn lock_folder(dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir)
        .with_context(|| format!("cannot open the report folder {} to lock it", dir.display()))?;
    // SAFETY: flock(2) on a descriptor we own; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(crate::RigError::flag(
                "--out",
                format!(
                    "another rigbench run is writing a report into {} now (it holds the folder's lock); choose another folder, or wait until that run has finished",
                    dir.display()
                ),
            )
            .into());
        }
        return Err(anyhow::anyhow!(
            "cannot lock the report folder {}: {e}",
            dir.display()
        ));
    }
    Ok(f)
}

/// The peer script's progress in a report folder: its output so far, saved after every peer
/// case, which `report --resume` continues (see [`crate::kernels::peers`]).
pub const PEERS_PROGRESS: &str = "peers-progress.json";

/// Files rigbench writes into a report folder (and only those), for reuse of a folder.
pub fn is_report_file(name: &str) -> bool {
    matches!(
        name,
        "results.json"
            | "report.md"
            | super::markdown::DETAILS_FILE
            | "kernels.csv"
            | "e2e_runs.csv"
            | "e2e_requests.csv"
            | "engine.log"
            | PEERS_PROGRESS
    ) || (name.ends_with(".svg") && (name.starts_with("kernels_") || name.starts_with("e2e_")))
}

/// Whether `dir` holds a report (a `results.json` or a `report.md`).
pub fn holds_report(dir: &Path) -> bool {
    dir.join("results.json").exists() || dir.join("report.md").exists()
}

/// Report files in `dir` last written before `before` (an earlier run's).
/// The report files in `dir` now, each with its modification time.
fn report_files_with_mtime(dir: &Path) -> Vec<(PathBuf, Option<std::time::SystemTime>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| is_report_file(&e.file_name().to_string_lossy()))
        .map(|e| (e.path(), e.metadata().and_then(|m| m.modified()).ok()))
        .collect()
}

/// The files of `before` (report files present when the run started) that this run did not
/// rewrite: still there with the same modification time. Comparing with the snapshot, not with
/// the start time, matters: file times come from the kernel's coarse clock (a few ms behind the
/// clock `SystemTime::now` reads), so a file written just after the start can look older than it.
fn stale_report_files(before: &[(PathBuf, Option<std::time::SystemTime>)]) -> Vec<PathBuf> {
    before
        .iter()
        .filter(|(p, t)| {
            let now = std::fs::metadata(p).and_then(|m| m.modified()).ok();
            now.is_some() && now == *t
        })
        .map(|(p, _)| p.clone())
        .collect()
}

fn sibling(target: &Path, suffix: &str) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    target.with_file_name(format!("{name}.{suffix}"))
}

impl ReportDir {
    /// Use `out` when given, else `reports/<rig_label>/<UTC timestamp>/` under the current folder.
    /// Creates the folder (or, with `force` over an earlier report, its staging folder).
    ///
    /// # Errors
    /// `out` holds a report and `force` is false ([`crate::RigError::BadFlag`] naming `--out`
    /// and the fix); the folder cannot be created or written (the error names it).
    pub fn create(
        out: Option<&Path>,
        rig_label: &str,
        redact: bool,
        force: bool,
    ) -> anyhow::Result<Self> {
        let target = match out {
            Some(p) => {
                std::fs::create_dir_all(p)
                    .with_context(|| format!("cannot create report folder {}", p.display()))?;
                p.to_path_buf()
            }
            None => {
                // Two runs in the same second must not share (and overwrite) a folder: each
                // takes the first name it creates itself (`mkdir` fails on an existing one).
                let base = PathBuf::from("reports")
                    .join(rig_label)
                    .join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string());
                if let Some(parent) = base.parent() {
                    std::fs::create_dir_all(parent).with_context(|| {
                        format!("cannot create report folder {}", parent.display())
                    })?;
                }
                let mut p = base.clone();
                let mut i = 2;
                loop {
                    match std::fs::create_dir(&p) {
                        Ok(()) => break,
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && i < 10_000 => {
                            p = PathBuf::from(format!("{}-{i}", base.display()));
                            i += 1;
                        }
                        Err(e) => {
                            return Err(e).with_context(|| {
                                format!("cannot create report folder {}", p.display())
                            })
                        }
                    }
                }
                p
            }
        };
        // The lock before anything is looked at: a run that finished meanwhile has left its
        // report, which the check below then sees.
        let lock = lock_folder(&target)?;
        let before = report_files_with_mtime(&target);
        // Any file named like one rigbench writes (a user's own `engine.log` or `kernels.csv`
        // included) would be overwritten, or removed at the commit as stale: never without
        // --force, and with it only after the new run has measured something (staging).
        let staged = !before.is_empty();
        if staged && !force {
            let mut names: Vec<String> = before
                .iter()
                .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            names.sort();
            return Err(crate::RigError::flag(
                "--out",
                format!(
                    "{} already holds a report or files named like its files ({}), which a run there would replace or remove; choose another folder, or pass --force to replace them once the new run has measured something",
                    target.display(),
                    names.join(", ")
                ),
            )
            .into());
        }
        let path = if staged {
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "report".into());
            let parent = match target.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            tempfile::Builder::new()
                .prefix(&format!("{name}.rigbench-partial-"))
                .rand_bytes(12)
                .tempdir_in(&parent)
                .with_context(|| format!("cannot create a staging folder in {}", parent.display()))?
                .keep()
        } else {
            target.clone()
        };
        // Fail now, not after the measurements, when the folder cannot be written.
        let probe = path.join(".rigbench-write-test");
        std::fs::write(&probe, b"")
            .with_context(|| format!("cannot write into the report folder {}", path.display()))?;
        let _ = std::fs::remove_file(&probe);
        Ok(Self {
            path,
            target,
            redactor: Redactor::for_this_host(redact),
            staged,
            before,
            _lock: Some(std::sync::Arc::new(lock)),
        })
    }

    /// An interrupted report folder continued in place (`report --resume`): nothing is staged
    /// and no file of it counts as stale (the run adds to it).
    ///
    /// # Errors
    /// The folder cannot be written (the error names it).
    pub fn continue_in(path: &Path, redact: bool) -> anyhow::Result<Self> {
        let lock = lock_folder(path)?;
        let probe = path.join(".rigbench-write-test");
        std::fs::write(&probe, b"")
            .with_context(|| format!("cannot write into the report folder {}", path.display()))?;
        let _ = std::fs::remove_file(&probe);
        Ok(Self {
            path: path.to_path_buf(),
            target: path.to_path_buf(),
            redactor: Redactor::for_this_host(redact),
            staged: false,
            before: Vec::new(),
            _lock: Some(std::sync::Arc::new(lock)),
        })
    }

    /// An existing report folder, used as it is (for re-rendering in place).
    pub fn existing(path: &Path, redact: bool) -> Self {
        Self {
            path: path.to_path_buf(),
            target: path.to_path_buf(),
            redactor: Redactor::for_this_host(redact),
            staged: false,
            before: report_files_with_mtime(path),
            _lock: None,
        }
    }

    /// Whether files go to a staging folder (a forced run over an earlier report).
    pub fn staged(&self) -> bool {
        self.staged
    }

    /// Redact, in place, the report files other modules write straight into the folder (the
    /// e2e CSV files and the SVG plots: request errors, model names and titles may hold paths,
    /// hosts or tokens). Placeholders inserted into SVG are escaped (`&lt;host&gt;`). A no-op
    /// with redaction off.
    ///
    /// # Errors
    /// A file cannot be read or rewritten (the error names it).
    pub fn redact_direct_writes(&self) -> anyhow::Result<()> {
        if !self.redactor.enabled() {
            return Ok(());
        }
        let Ok(rd) = std::fs::read_dir(&self.path) else {
            return Ok(());
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let svg = name.ends_with(".svg");
            if !is_report_file(&name) || !(svg || name.ends_with(".csv") || name == PEERS_PROGRESS)
            {
                continue;
            }
            let text = std::fs::read_to_string(e.path())
                .with_context(|| format!("cannot read {}", e.path().display()))?;
            if name == PEERS_PROGRESS {
                // JSON that `report --resume` reads back: redact its values, not its text.
                if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&text) {
                    let before = v.clone();
                    self.redactor.redact_json(&mut v);
                    if v != before {
                        atomic_write_json(&e.path(), &v)?;
                    }
                }
                continue;
            }
            let mut red = self.redactor.redact(&text);
            if svg {
                for p in Redactor::PLACEHOLDERS {
                    red = red.replace(p, &p.replace('<', "&lt;").replace('>', "&gt;"));
                }
            }
            if red != text {
                atomic_write(&e.path(), red.as_bytes())?;
            }
        }
        Ok(())
    }

    /// Put the finished (or interrupted) report in place: with a staging folder, move its files
    /// into the target (each rename atomic) and remove the staging folder; in both cases remove
    /// report files of an earlier run that this run did not rewrite (other files stay).
    ///
    /// # Errors
    /// A file cannot be moved or removed (the error names it; the staging folder is kept).
    pub fn commit(&self) -> anyhow::Result<()> {
        self.redact_direct_writes()?;
        if self.staged {
            std::fs::create_dir_all(&self.target)
                .with_context(|| format!("cannot create {}", self.target.display()))?;
            let entries = std::fs::read_dir(&self.path)
                .with_context(|| format!("cannot list {}", self.path.display()))?;
            for e in entries.flatten() {
                let to = self.target.join(e.file_name());
                // A report subfolder (`e2e-<format>/` of the GPU runtime) replaces its namesake.
                if to.is_dir() && e.file_name().to_string_lossy().starts_with("e2e-") {
                    std::fs::remove_dir_all(&to)
                        .with_context(|| format!("cannot replace {}", to.display()))?;
                }
                std::fs::rename(e.path(), &to).with_context(|| {
                    format!(
                        "cannot move {} to {} (the new report stays in {})",
                        e.path().display(),
                        to.display(),
                        self.path.display()
                    )
                })?;
            }
            let _ = std::fs::remove_dir(&self.path);
        }
        let stale = stale_report_files(&self.before);
        for f in &stale {
            std::fs::remove_file(f)
                .with_context(|| format!("cannot remove the stale file {}", f.display()))?;
        }
        if self.staged || !stale.is_empty() {
            eprintln!(
                "rigbench: {} held an earlier report; it is replaced ({} of its files not rewritten were removed)",
                self.target.display(),
                stale.len()
            );
        }
        Ok(())
    }

    /// A run that failed before measuring anything: keep `name` (the engine's log) without
    /// touching an earlier report. Returns where it was written: the report folder when that
    /// holds no earlier report, else a folder beside it (`<name>.failed-start-<UTC>`).
    ///
    /// # Errors
    /// The file or folder cannot be written.
    pub fn keep_after_failed_start(&self, name: &str, text: &str) -> anyhow::Result<PathBuf> {
        self.write_text(name, text)?;
        if !self.staged {
            return Ok(self.path.join(name));
        }
        let kept = sibling(
            &self.target,
            &format!(
                "failed-start-{}",
                chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
            ),
        );
        std::fs::rename(&self.path, &kept).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.path.display(),
                kept.display()
            )
        })?;
        Ok(kept.join(name))
    }

    /// Remove the staging folder of a run that measured nothing (no-op without one).
    pub fn discard(&self) {
        if self.staged {
            let _ = std::fs::remove_dir_all(&self.path);
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
    fn the_peer_progress_file_is_redacted_as_json_and_stays_readable() {
        let d = tempfile::tempdir().unwrap();
        let mut dir = ReportDir::continue_in(d.path(), true).unwrap();
        // A user named like a JSON key, whose name would break the text if replaced blindly.
        dir.redactor = Redactor::with_literals(vec![("cases".into(), "<user>")], true);
        let f = d.path().join(PEERS_PROGRESS);
        std::fs::write(
            &f,
            r#"{"peers":[{"detail":"looked in /home/cases/x from 10.1.2.3"}],"cases":[],"in_flight":null}"#,
        )
        .unwrap();
        dir.redact_direct_writes().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        assert!(v.get("cases").is_some_and(|c| c.is_array()), "{v}");
        let detail = v["peers"][0]["detail"].as_str().unwrap();
        assert!(
            !detail.contains("10.1.2.3") && !detail.contains("/home/cases"),
            "{detail}"
        );
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_folder_holding_a_report_is_refused_without_force() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("results.json"), b"old").unwrap();
        let e = ReportDir::create(Some(d.path()), "x", false, false).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("--out") && msg.contains("--force"), "{msg}");
        assert!(matches!(
            e.downcast_ref::<crate::RigError>(),
            Some(crate::RigError::BadFlag { .. })
        ));
        assert_eq!(
            std::fs::read(d.path().join("results.json")).unwrap(),
            b"old"
        );
    }

    #[test]
    fn forced_runs_replace_only_at_commit_and_keep_other_files() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("rep");
        std::fs::create_dir(&t).unwrap();
        for f in [
            "results.json",
            "report.md",
            "e2e_runs.csv",
            "kernels_qkv.svg",
            "notes.txt",
        ] {
            std::fs::write(t.join(f), b"old").unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let r = ReportDir::create(Some(&t), "x", false, true).unwrap();
        assert_ne!(r.path, t);
        r.write_text("results.json", "new").unwrap();
        r.write_text("report.md", "new").unwrap();
        // Nothing of the earlier report is touched before the commit.
        assert_eq!(std::fs::read(t.join("e2e_runs.csv")).unwrap(), b"old");
        assert_eq!(std::fs::read(t.join("results.json")).unwrap(), b"old");
        r.commit().unwrap();
        assert_eq!(names(&t), vec!["notes.txt", "report.md", "results.json"]);
        assert_eq!(std::fs::read(t.join("results.json")).unwrap(), b"new");
        assert!(!r.path.exists(), "staging folder left behind");
    }

    #[test]
    fn a_failed_start_keeps_the_log_and_the_earlier_report() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("rep");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("results.json"), b"old").unwrap();
        let r = ReportDir::create(Some(&t), "x", false, true).unwrap();
        let kept = r.keep_after_failed_start("engine.log", "boom").unwrap();
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "boom");
        assert!(!kept.starts_with(&t));
        assert_eq!(names(&t), vec!["results.json"]);
        // Into a fresh folder, the log goes into the report folder itself.
        let fresh = d.path().join("fresh");
        let r = ReportDir::create(Some(&fresh), "x", false, false).unwrap();
        let kept = r.keep_after_failed_start("engine.log", "boom").unwrap();
        assert_eq!(kept, fresh.join("engine.log"));
    }

    #[test]
    fn files_named_like_report_files_are_refused_without_force_and_go_only_at_commit() {
        // A user's own engine.log and kernels.csv (no results.json, no report.md): a run used to
        // overwrite them, or remove them as stale at its end, without --force.
        for name in ["engine.log", "kernels.csv", "e2e_runs.csv"] {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join(name), b"mine").unwrap();
            std::fs::write(d.path().join("notes.txt"), b"mine").unwrap();
            let e = ReportDir::create(Some(d.path()), "x", false, false).unwrap_err();
            let msg = format!("{e:#}");
            assert!(
                msg.contains("--out") && msg.contains("--force") && msg.contains(name),
                "{msg}"
            );
            assert_eq!(std::fs::read(d.path().join(name)).unwrap(), b"mine");
        }
        // With --force: staged, and the stale file goes only at the commit.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("e2e_runs.csv"), b"old").unwrap();
        std::fs::write(d.path().join("notes.txt"), b"mine").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let r = ReportDir::create(Some(d.path()), "x", false, true).unwrap();
        assert_ne!(r.path, d.path());
        r.write_text("results.json", "{}").unwrap();
        assert_eq!(
            std::fs::read(d.path().join("e2e_runs.csv")).unwrap(),
            b"old"
        );
        r.commit().unwrap();
        assert_eq!(names(d.path()), vec!["notes.txt", "results.json"]);
    }

    #[test]
    fn a_second_run_into_the_same_new_folder_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("new-out");
        let first = ReportDir::create(Some(&out), "x", false, false).unwrap();
        // A second run (the lock is per open folder, so this holds within one process too).
        let e = ReportDir::create(Some(&out), "x", false, false).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains(&out.display().to_string()) && msg.contains("another rigbench run"),
            "{msg}"
        );
        // Also with --force, and for `report --resume`.
        assert!(ReportDir::create(Some(&out), "x", false, true).is_err());
        assert!(ReportDir::continue_in(&out, false).is_err());
        first
            .write_text("results.json", "{\"first\": true}")
            .unwrap();
        first.commit().unwrap();
        drop(first);
        // The first run's report is whole; a later run without --force is refused by it.
        assert_eq!(
            std::fs::read_to_string(out.join("results.json")).unwrap(),
            "{\"first\": true}"
        );
        let e = ReportDir::create(Some(&out), "x", false, false).unwrap_err();
        assert!(format!("{e:#}").contains("already holds a report"));
    }

    #[test]
    fn staging_is_fresh_unpredictable_and_follows_no_symlink() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("rep");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("results.json"), b"old").unwrap();
        // What the old naming (`<out>.rigbench-partial-<pid>`) would have picked up: a stale
        // staging folder of the same pid, and a symlink to someone else's files.
        let stale = d
            .path()
            .join(format!("rep.rigbench-partial-{}", std::process::id()));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("kernels.csv"), b"stale").unwrap();
        let victim = d.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("secret.txt"), b"mine").unwrap();
        symlink(&victim, d.path().join("rep.rigbench-partial-1")).unwrap();
        let a = ReportDir::create(Some(&t), "x", false, true).unwrap();
        assert!(a.path != stale && a.path.parent() == Some(d.path()));
        let meta = std::fs::symlink_metadata(&a.path).unwrap();
        assert!(meta.is_dir() && !meta.file_type().is_symlink());
        assert_eq!(
            names(&a.path),
            Vec::<String>::new(),
            "a fresh, empty folder"
        );
        a.write_text("results.json", "new").unwrap();
        a.commit().unwrap();
        assert_eq!(names(&t), vec!["results.json"], "nothing stale merged");
        assert_eq!(std::fs::read(t.join("results.json")).unwrap(), b"new");
        assert_eq!(names(&victim), vec!["secret.txt"]);
        assert_eq!(std::fs::read(stale.join("kernels.csv")).unwrap(), b"stale");
        drop(a);
        // Two forced runs get two different staging folders.
        let b = ReportDir::create(Some(&t), "x", false, true).unwrap();
        let b_path = b.path.clone();
        drop(b);
        let c = ReportDir::create(Some(&t), "x", false, true).unwrap();
        assert_ne!(b_path, c.path);
    }
}
