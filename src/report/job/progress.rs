//! How a job keeps its progress as it goes: results.json (and kernels.csv) saved after every part,
//! and a part not started once SIGINT or SIGTERM arrived recorded as skipped.

use crate::report::folder::ReportDir;
use crate::report::schema::{Results, Skip};

/// When SIGINT or SIGTERM has arrived (see `crate::signals`): record `what` as not run and
/// return true.
pub(super) fn skip_if_interrupted(results: &mut Results, what: &str) -> bool {
    match crate::signals::interrupted() {
        Some(sig) => {
            results.skipped.push(Skip {
                what: what.into(),
                reason: format!("not run: interrupted by {sig}"),
            });
            true
        }
        None => false,
    }
}

/// Write results.json, and kernels.csv when there are kernel results, into the report folder
/// (nothing without one).
pub(super) fn save(dir: &Option<ReportDir>, r: &Results) -> anyhow::Result<()> {
    if let Some(d) = dir {
        d.write_results(r)?;
        if let Some(k) = &r.kernels {
            d.write_text("kernels.csv", &crate::kernels::render::csv(k)?)?;
        }
    }
    Ok(())
}
