//! Writing a report's Markdown and plots from its results ([`render_into`]), at the end of a run
//! or from a saved results.json (`rigbench report --render`).

use crate::report::folder::ReportDir;
use crate::report::schema::Results;

/// Write report.md and the plots for `results` into `dir`.
pub fn render_into(dir: &ReportDir, results: &Results) -> anyhow::Result<()> {
    let mut plots = Vec::new();
    if let Some(k) = &results.kernels {
        plots.extend(crate::kernels::render::write_plots(k, &dir.path)?);
    }
    if let Some(e) = &results.e2e {
        plots.extend(crate::e2e::write_plots(e, &dir.path)?);
    }
    // The built-in runtime's end-to-end runs on the GPU, one folder per format: report.md
    // links their plots there.
    if let Some(rt) = &results.runtime {
        for f in &rt.formats {
            if let Some(e) = &f.e2e {
                let sub = crate::runtime_eval::section::e2e_dir(&f.format);
                std::fs::create_dir_all(dir.path.join(&sub))?;
                crate::e2e::write_plots(e, &dir.path.join(&sub))?;
            }
        }
    }
    let files: Vec<String> = std::fs::read_dir(&dir.path)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let md = crate::report::markdown::render(results, &plots, &files, dir.redactor());
    // report.md: the verdict and one table per part; the details file: every table
    // (docs/report.md, "The report's layout").
    let details = format!(
        "{}\n\nEvery table of this run. The verdict and one table per part: [`report.md`](report.md).\n{}",
        md.lines().next().unwrap_or("# rigbench report").replacen(
            "# rigbench report",
            "# rigbench report details",
            1
        ),
        md.split_once('\n').map_or("", |(_, rest)| rest)
    );
    dir.write_text(crate::report::markdown::DETAILS_FILE, &details)?;
    dir.write_text("report.md", &crate::report::markdown::summary(&md))?;
    Ok(())
}
