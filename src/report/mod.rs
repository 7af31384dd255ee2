//! Reports: the versioned result schema, the `report` job that fills it, the report folder
//! (atomic, incremental writing), the verdict and the Markdown of the whole report. The
//! primitives it writes with (tables, atomic writes, redaction, plots) are in [`crate::output`].

pub mod budget;
pub mod folder;
pub mod headline;
pub mod job;
pub mod markdown;
pub mod multigpu;
pub mod schema;

pub use schema::{Results, Skip, SCHEMA_VERSION};
