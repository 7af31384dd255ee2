//! Reports: the versioned result schema, exporters (JSON, CSV, Markdown), plots, redaction,
//! and atomic, incremental writing.

pub mod axis;
pub mod job;
pub mod markdown;
pub mod output;
pub mod plot;
pub mod redact;
pub mod schema;
pub mod table;
pub mod verdict;
pub mod write;

pub use schema::{Results, Skip, SCHEMA_VERSION};
