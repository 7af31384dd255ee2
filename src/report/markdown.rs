//! `report.md`: the rig report. Order: what this is and its conditions, the rig and its
//! capability table, kernels, checkpoint, end to end, and everything skipped with its reason.

use super::schema::Results;

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
        "rigbench {} · results schema v{} · started {} · {}\n\n",
        r.rigbench_version,
        r.schema_version,
        r.created_utc,
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
}
