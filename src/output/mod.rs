//! Output primitives every part of rigbench writes with: Markdown tables and number formatting,
//! atomic file writes, redaction of hosts, paths and secrets, shell quoting of command lines, plot axis labels and the shared
//! plot series. Foundation tier (docs/architecture.md): nothing here knows a rigbench type.

pub mod axis;
pub mod plot;
pub mod redact;
pub mod shell;
pub mod stdout_pipe;
pub mod table;
pub mod write;
