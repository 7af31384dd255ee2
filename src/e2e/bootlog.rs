//! Engine logs, read by `crate::diagnose` (the one parser and the one set of findings for
//! `diagnose`, `e2e --engine-log` and `report`). This module keeps the names e2e uses.

pub use crate::diagnose::log::{Boot, EngineLog as BootLog, ErrorGroup, MarlinFallback};
pub use crate::diagnose::spec::{pool_spec, SpecLogGeneration, SpecLogLine, SpecPooled};
