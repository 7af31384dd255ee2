//! The e2e section of a report: Markdown (conditions first, then latency and throughput),
//! CSV rows (one per run, one per request) and SVG plots (plotters' SVG backend: latency
//! percentiles against concurrency or rate; acceptance by draft position).
//!
//! An invalid run's throughput is never shown as a figure: its cells say `invalid` and the
//! reasons are listed.
//!
//! The Markdown is in `markdown.rs` (the section in order: preamble, validity, latency,
//! throughput, metrics sampling, speculative acceptance, plots, boot log), with the conditions
//! tables and the suite as run in `condition_tables.rs` and the cell formats they share in
//! `cells.rs`; the plots are in `plots.rs`, the CSV files in `e2e_csv.rs`. The serving part
//! (goodput, energy, trace, definitions) is `super::render_serving`.

mod cells;
mod condition_tables;
mod e2e_csv;
mod markdown;
mod plots;

pub use cells::min_n_for;
pub use condition_tables::suite_as_run;
pub use e2e_csv::write_csv;
pub use markdown::{how_to_state, random_weights_note, render_markdown};
pub use plots::write_plots;
