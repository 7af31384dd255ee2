//! `report.md`: the rig report. Order: what this is and its conditions, the rig and its
//! capability table, kernels, checkpoint, end to end, and everything skipped with its reason.
//!
//! Two files come out of one rendering ([`render`]): `report-details.md` ([`DETAILS_FILE`])
//! holds every section in full, every table of the run; `report.md` ([`summary`]) holds the
//! head (status, verdict, command, time budget), then each section's conditions and its first
//! table, with the names of the tables it left to the details file, and the failed and skipped
//! parts in full (docs/report.md, "The report's layout").

use super::schema::Results;

/// The appendix file: the whole report, every table of every section.
pub const DETAILS_FILE: &str = "report-details.md";

/// Render the whole report. `plots` are the plot file names written next to report.md; `files`
/// the other files present in the report folder (only those are listed).
pub fn render(
    r: &Results,
    plots: &[String],
    files: &[String],
    redactor: &crate::output::redact::Redactor,
) -> String {
    let mut o = String::new();
    o.push_str(&format!("# rigbench report: {}\n\n", r.rig_label));
    o.push_str(&format!(
        "rigbench {} · results schema v{} · started {}{} · {}\n\n",
        r.rigbench_version,
        r.schema_version,
        r.created_utc,
        r.wall_s
            .map(|w| format!(" · wall time {w:.1} s (start to the last write of results.json)"))
            .unwrap_or_default(),
        match (&r.interrupted, r.complete) {
            (Some(i), _) => format!("run INTERRUPTED ({i}): figures below are what was measured before it stopped"),
            (None, true) => "run complete".to_string(),
            (None, false) => "run INCOMPLETE (interrupted or still running): figures below are what was measured before it stopped".to_string(),
        },
    ));
    o.push_str(&super::headline::markdown(r));
    o.push_str(&format!(
        "Command: {}\n\n",
        crate::output::table::code(&r.command_line)
    ));
    if let Some(b) = &r.budget {
        o.push_str(&budget_markdown(b, r.wall_s));
    }
    let described = [
        (
            "results.json",
            "`results.json` (versioned schema, the file `rigbench compare` reads)",
        ),
        ("kernels.csv", "`kernels.csv`"),
        ("e2e_runs.csv", "`e2e_runs.csv`"),
        ("e2e_requests.csv", "`e2e_requests.csv`"),
        ("engine.log", "`engine.log`"),
    ];
    let mut listed: Vec<String> = described
        .iter()
        .filter(|(name, _)| files.iter().any(|f| f == name))
        .map(|(_, text)| text.to_string())
        .collect();
    // The built-in runtime's end-to-end runs on the GPU keep their files in one folder per
    // format.
    if let Some(rt) = &r.runtime {
        let dirs: Vec<String> = rt
            .formats
            .iter()
            .filter(|f| f.e2e.is_some())
            .map(|f| format!("`{}/`", crate::runtime_eval::section::e2e_dir(&f.format)))
            .collect();
        if !dirs.is_empty() {
            listed.push(format!(
                "{} (each format's end-to-end CSV files, engine log and plot)",
                dirs.join(", ")
            ));
        }
    }
    if !listed.is_empty() {
        o.push_str(&format!("Machine-readable: {}.\n\n", listed.join(", ")));
    }
    o.push_str(&crate::rig::render::render(&r.rig, false, redactor).replace("\n## ", "\n### "));
    o.push('\n');
    if let Some(k) = &r.kernels {
        o.push_str(&crate::kernels::render::markdown_for(
            k,
            plots,
            &r.rig.capabilities,
        ));
    }
    if let Some(mg) = &r.multi_gpu {
        o.push_str(&crate::multigpu::render::markdown(mg, &r.rig));
    }
    if let Some(tp) = &r.tp_model {
        o.push_str(&crate::multigpu::tp_model::markdown(tp));
    }
    if let Some(c) = &r.checkpoint {
        // render_markdown opens with its own "## Checkpoint: DIR" heading.
        o.push_str(&crate::checkpoint::render_markdown(c));
        o.push('\n');
    }
    if let Some(q) = &r.quality {
        o.push_str(&crate::runtime_eval::quality::render_markdown(q));
        o.push('\n');
    }
    if let Some(rt) = &r.runtime {
        o.push_str(&crate::runtime_eval::section::render_markdown(rt));
        o.push('\n');
    }
    if let Some(e) = &r.e2e {
        o.push_str(&crate::e2e::render_markdown(e));
        o.push('\n');
    }
    if let Some(q) = &r.quality_comparison {
        o.push_str(&crate::quality::render::render_markdown(q));
        o.push('\n');
    }
    if !r.failed.is_empty() {
        o.push_str(
            "## Failed\n\nParts that were asked for and failed (`rigbench report` exits 1):\n\n",
        );
        for f in &r.failed {
            o.push_str(&format!(
                "- **{}**:\n\n```text\n{}\n```\n",
                f.what,
                f.reason.trim_end()
            ));
        }
        o.push('\n');
    }
    if !r.skipped.is_empty() {
        o.push_str("## Skipped\n\n");
        for s in &r.skipped {
            o.push_str(&format!("- **{}**: {}\n", s.what, s.reason));
        }
        o.push('\n');
    }
    o
}

/// `report.md` from the whole report `full` (as [`render`] returns it): the head up to the
/// first section kept as it is (title, status, verdict, command, budget, files) with a link to
/// [`DETAILS_FILE`]; then each `## ` section as its heading, its text up to its first table and
/// that table (the first `### ` subsection holding one, when the section's own text has none),
/// and one line naming the subsections left to the details file; `Failed` and `Skipped` in
/// full. Nothing is computed here: every figure is text of `full`.
pub fn summary(full: &str) -> String {
    let mut blocks: Vec<Vec<&str>> = vec![Vec::new()];
    for line in full.lines() {
        if line.starts_with("## ") {
            blocks.push(Vec::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push(line);
        }
    }
    let mut o = String::new();
    let mut head_done = false;
    for b in &blocks {
        let title = b.first().copied().unwrap_or("");
        let keep_whole = !title.starts_with("## ")
            || title == "## Verdict"
            || title == "## Failed"
            || title == "## Skipped";
        if keep_whole {
            o.push_str(&b.join("\n"));
            o.push('\n');
            continue;
        }
        if !head_done {
            head_done = true;
            o.push_str(&format!(
                "This page: the verdict, then each part's conditions and first table. Every table of the run (per shape, per case, per format, peers, notes) is in [`{DETAILS_FILE}`]({DETAILS_FILE}).\n\n"
            ));
        }
        o.push_str(&summarize_section(b));
    }
    o
}

/// One section of [`summary`]: heading, text, first table, the subsections left out.
fn summarize_section(b: &[&str]) -> String {
    let is_table = |l: &str| l.trim_start().starts_with('|');
    let mut out: Vec<&str> = Vec::new();
    let mut i = 0;
    let mut table_seen = false;
    // The section's own text, up to its first subsection or the end of its first table.
    while i < b.len() && !b[i].starts_with("### ") {
        if is_table(b[i]) {
            table_seen = true;
        } else if table_seen {
            break;
        }
        out.push(b[i]);
        i += 1;
    }
    let mut kept_sub: Option<&str> = None;
    if !table_seen {
        // The first subsection that holds a table: its heading, text and that table.
        let mut j = i;
        while j < b.len() {
            if b[j].starts_with("### ") {
                let end = (j + 1..b.len())
                    .find(|&k| b[k].starts_with("### "))
                    .unwrap_or(b.len());
                if let Some(t) = (j..end).find(|&k| is_table(b[k])) {
                    let t_end = (t..end).find(|&k| !is_table(b[k])).unwrap_or(end);
                    out.push("");
                    out.extend_from_slice(&b[j..t_end]);
                    kept_sub = Some(b[j]);
                    break;
                }
                j = end;
            } else {
                j += 1;
            }
        }
    }
    let left: Vec<String> = b
        .iter()
        .filter(|l| l.starts_with("### ") && Some(**l) != kept_sub)
        .map(|l| {
            let t = l.trim_start_matches("### ").trim();
            let short: String = t.chars().take(70).collect();
            if short.len() < t.len() {
                format!("{short}…")
            } else {
                short
            }
        })
        .collect();
    let mut s = out.join("\n");
    while s.ends_with('\n') {
        s.pop();
    }
    s.push_str("\n\n");
    if !left.is_empty() {
        s.push_str(&format!(
            "More in [`{DETAILS_FILE}`]({DETAILS_FILE}): {}.\n\n",
            left.join("; ")
        ));
    }
    s
}

/// The time budget's paragraph: the plan, its estimate by part against the wall time, what the
/// budget left out and the command that runs it (docs/report.md, "The time budget").
pub fn budget_markdown(b: &super::schema::BudgetRecord, wall_s: Option<f64>) -> String {
    let p = &b.plan;
    let mut o = String::from("### Time budget\n\n");
    let budget = p
        .budget_s
        .map(|s| format!("{s:.0} s"))
        .unwrap_or_else(|| "none".into());
    let parts: Vec<String> = p
        .parts
        .iter()
        .filter(|(_, s)| *s > 0.0)
        .map(|(what, s)| format!("{what} {s:.0} s"))
        .collect();
    o.push_str(&format!(
        "Budget {budget}: the kernel suite at M = {}, peers {}, {}; estimated {:.0} s ({}; a sum of committed timings, not a measurement){}{}.\n\n",
        p.m.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", "),
        if p.peers { "on" } else { "off" },
        crate::output::table::plural(p.repeats as u64, "repeat", "repeats"),
        p.estimate_s,
        parts.join(", "),
        wall_s
            .map(|w| format!("; measured wall time {w:.1} s"))
            .unwrap_or_default(),
        if p.over_budget {
            "; **over the budget**: what was asked for (--m, --peers, --repeats) does not fit it"
        } else {
            ""
        }
    ));
    if !p.left_out.is_empty() {
        o.push_str("Left out by the budget:\n\n");
        for l in &p.left_out {
            o.push_str(&format!("- {l}\n"));
        }
        o.push_str(&format!("\nThe full suite: `{}`.\n\n", b.full_command));
    }
    o.push_str("Where the estimates come from:\n\n");
    for s in &p.sources {
        o.push_str(&format!("- {s}\n"));
    }
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::Skip;

    #[test]
    fn renders_skips_and_incomplete_runs() {
        let mut r = Results::new(
            Default::default(),
            "cpu-x86-64".into(),
            "rigbench report".into(),
        );
        r.skipped.push(Skip {
            what: "kernels".into(),
            reason: "no CUDA driver found".into(),
        });
        let md = render(&r, &[], &[], &crate::output::redact::Redactor::disabled());
        assert!(md.contains("# rigbench report: cpu-x86-64"));
        assert!(
            !md.contains("Machine-readable"),
            "no file present, none listed"
        );
        assert!(md.contains("INCOMPLETE"));
        assert!(md.contains("**kernels**: no CUDA driver found"));
        r.complete = true;
        assert!(
            render(&r, &[], &[], &crate::output::redact::Redactor::disabled())
                .contains("run complete")
        );
    }

    /// report.md keeps the head, the first table of each section and the failed / skipped parts;
    /// every other line is in the details file, and nothing in report.md is absent from it.
    #[test]
    fn the_summary_keeps_the_first_table_and_names_the_rest() {
        let full = "# rigbench report: x\n\nstatus\n\n## Verdict\n\n- fastest: A\n\nCommand: `rigbench report`\n\n\
## Rig\n\n| fact | value |\n|---|---|\n| GPU | H |\n\n### Format capability\n\n| f | y |\n|---|---|\n| a | b |\n\n\
## Kernels: suite `s`\n\nConditions: cold L2.\n\n### Goals\n\ntext\n\n| goal | got |\n|---|---|\n| g1 | 1 |\n\nafter\n\n### `qkv` (N = 1)\n\n| M | t |\n|---|---|\n| 1 | 2 |\n\n\
## Skipped\n\n- **e2e**: not requested\n";
        let s = summary(full);
        for want in [
            "## Verdict",
            "- fastest: A",
            "Command: `rigbench report`",
            "| GPU | H |",
            "Conditions: cold L2.",
            "### Goals",
            "| g1 | 1 |",
            "- **e2e**: not requested",
            "More in [`report-details.md`](report-details.md): Format capability.",
            "More in [`report-details.md`](report-details.md): `qkv` (N = 1).",
        ] {
            assert!(s.contains(want), "lacks {want:?}:\n{s}");
        }
        for gone in ["| a | b |", "| 1 | 2 |", "after"] {
            assert!(
                !s.contains(gone),
                "{gone:?} stays in the details only:\n{s}"
            );
        }
        for line in s
            .lines()
            .filter(|l| l.starts_with('|') || l.starts_with('#'))
        {
            assert!(full.contains(line), "{line:?} is not in the full report");
        }
    }

    /// The budget's plan and the wall time reach report.md: what was left out, the command
    /// that runs it, the estimate beside the measured wall time.
    #[test]
    fn renders_the_budget_and_the_wall_time() {
        use crate::report::budget;
        let mut r = Results::new(Default::default(), "x".into(), "rigbench report".into());
        let req = budget::Request {
            budget_s: Some(10.0),
            shapes: vec![(4096, 4096), (14336, 4096)],
            m: vec![1, 16, 256, 4096, 8192],
            m_fixed: false,
            impls: 5,
            peers_fixed: None,
            repeats_fixed: None,
        };
        let plan = budget::plan(&req, &budget::Costs::measured(false, false));
        assert!(!plan.left_out.is_empty(), "{plan:?}");
        r.budget = Some(crate::report::schema::BudgetRecord {
            plan,
            full_command: "rigbench report --budget none".into(),
        });
        r.wall_s = Some(97.25);
        let md = render(&r, &[], &[], &crate::output::redact::Redactor::disabled());
        assert!(md.contains("wall time 97.2 s"), "{md}");
        assert!(
            md.contains("### Time budget") && md.contains("Budget 10 s"),
            "{md}"
        );
        assert!(md.contains("measured wall time 97.2 s"), "{md}");
        assert!(
            md.contains("Left out by the budget:\n\n- kernel suite at M = "),
            "{md}"
        );
        assert!(md.contains("`rigbench report --budget none`"), "{md}");
        assert!(
            md.contains("20261201T021503Z/report.log"),
            "sources said: {md}"
        );
    }
}
