//! `rigbench board` on the committed reports: the table committed as `reports/BOARD.md` (and
//! `reports/board.csv`) is what today's binary makes of `reports/`, rows of different conditions
//! are never ranked together, no CPU self-test figure sits on a GPU's row, and the SQLite file
//! holds the same rows. The board is made of the committed files of `reports/` only (`git
//! ls-files`, copied into a temporary folder): a report the main job wrote into the checkout's
//! `reports/<rig>/<time>/` (ignored by git, local output) must not change what this test reads.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files under `sub` that git tracks in the repository at `repo` (the index: committed or
/// added with `git add -f`), relative to `repo`. Fails the test, saying why, outside a git
/// checkout: which reports are committed is git's to say.
fn tracked_files(repo: &Path, sub: &str) -> Vec<PathBuf> {
    let o = Command::new("git")
        .args(["ls-files", "-z", "--", sub])
        .current_dir(repo)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "git ls-files in {}: {e} (this test needs git)",
                repo.display()
            )
        });
    assert!(
        o.status.success(),
        "git ls-files in {} failed: {} (this test reads the committed reports of a git checkout)",
        repo.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
        .collect()
}

/// A temporary folder holding a copy of the tracked files of `repo`'s `reports/` (same relative
/// paths, so the board names them as `rigbench board reports` run in `repo` would).
fn committed_reports(repo: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let files = tracked_files(repo, "reports");
    assert!(
        !files.is_empty(),
        "no tracked file under {}/reports",
        repo.display()
    );
    for rel in files {
        let to = d.path().join(&rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo.join(&rel), &to)
            .unwrap_or_else(|e| panic!("copy {}: {e}", repo.join(&rel).display()));
    }
    d
}

#[test]
fn a_report_folder_git_does_not_track_is_not_read() {
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args(args)
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    git(&["init", "-q"]);
    for f in [
        "reports/BOARD.md",
        "reports/rig/20260101T000000Z/results.json",
    ] {
        let p = repo.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "{}").unwrap();
    }
    git(&["add", "-f", "reports"]);
    // What the main job writes afterwards: a new report folder, never added.
    let local = repo
        .path()
        .join("reports/rig/20260102T000000Z/results.json");
    std::fs::create_dir_all(local.parent().unwrap()).unwrap();
    std::fs::write(&local, "{}").unwrap();
    let copy = committed_reports(repo.path());
    assert!(copy
        .path()
        .join("reports/rig/20260101T000000Z/results.json")
        .is_file());
    assert!(!copy.path().join("reports/rig/20260102T000000Z").exists());
}

#[test]
fn the_committed_board_is_what_rigbench_board_makes_of_the_committed_reports() {
    let d = tempfile::tempdir().unwrap();
    let committed = committed_reports(root());
    let o = Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(["board", "reports", "--out"])
        .arg(d.path())
        .current_dir(committed.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let md = std::fs::read_to_string(d.path().join("BOARD.md")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        md,
        "stdout is the Markdown written"
    );
    let committed = std::fs::read_to_string(root().join("reports/BOARD.md")).unwrap();
    assert!(
        committed == md,
        "reports/BOARD.md is not what `rigbench board reports --out reports` makes today of the committed reports; regenerate it (and reports/board.csv) with that command on a checkout without local report folders"
    );
    let csv = std::fs::read_to_string(d.path().join("board.csv")).unwrap();
    assert_eq!(
        std::fs::read_to_string(root().join("reports/board.csv")).unwrap(),
        csv
    );

    // The H200 and the x2 rig are both on it; the kernels of record give W4A16 6.81 ms per
    // step at M = 1 (reports/nvidia-h200-sm90/README.md quotes it).
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| nvidia-")).collect();
    assert!(
        rows.iter().any(|l| l.starts_with("| nvidia-h200-sm90-x2 ")),
        "{md}"
    );
    let record = rows
        .iter()
        .find(|l| l.contains("20261201T021503Z") && l.contains("W4A16 NVFP4"))
        .expect("the kernels of record");
    assert!(record.contains("6.81 ms (147 tok/s)"), "{record}");

    // Ranks: within one kernel-conditions tag, 1..n once each; the x2 rig's smoke suite (part
    // of a step) has its own tag, so it is not ranked against the full-step rows.
    let cell = |l: &str, i: usize| l.split('|').nth(i + 1).unwrap_or("").trim().to_string();
    let mut by_tag: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for l in &rows {
        let (tag, rank) = (cell(l, 6), cell(l, 7));
        if let Some((n, t)) = rank.split_once(" in ") {
            assert_eq!(t, tag, "{l}");
            by_tag.entry(tag).or_default().push(n.parse().unwrap());
        }
    }
    assert!(by_tag.len() >= 2, "{by_tag:?}");
    for (tag, mut ranks) in by_tag {
        ranks.sort_unstable();
        assert_eq!(ranks, (1..=ranks.len()).collect::<Vec<_>>(), "{tag}");
    }
    let x2 = rows.iter().find(|l| l.contains("-x2 ")).unwrap();
    let full = rows
        .iter()
        .find(|l| l.contains("20261201T021503Z"))
        .unwrap();
    assert_ne!(
        cell(x2, 6),
        cell(full, 6),
        "smoke and the full step share a tag"
    );
    assert!(md.contains("only part of the step"), "{md}");

    // The built-in runtime's CPU self-tests (round 1's e2e) are not on the board, and say why.
    assert!(!rows.iter().any(|l| l.contains("20261130T062726Z")), "{md}");
    assert!(
        md.contains("`reports/nvidia-h200-sm90/20261130T062726Z`: ")
            && md.contains("a harness self-test, not a figure of this card"),
        "{md}"
    );
    // The GPU runtime's e2e figures are, with their conditions.
    assert!(md.contains("on cuda:0 (NVIDIA H200, sm_90)"), "{md}");

    // The SQLite file holds the same rows.
    let db = rusqlite::Connection::open(d.path().join("board.sqlite")).unwrap();
    let n: i64 = db
        .query_row("SELECT count(*) FROM board", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n as usize, rows.len());
    let m1: f64 = db
        .query_row(
            "SELECT composite_m1_s FROM board WHERE report LIKE '%20261201T021503Z' AND format = 'W4A16 NVFP4'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!((m1 * 1e3 - 6.81).abs() < 0.005, "{m1}");
    let tags: i64 = db
        .query_row(
            "SELECT count(DISTINCT kernel_conditions) FROM board WHERE rank IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(tags >= 2);
}
