//! GEMM implementations behind one trait, checked against a reference before they are timed,
//! with the stopping rule, roofline figures and the determinism check.

pub mod schema;

pub use schema::KernelResults;
