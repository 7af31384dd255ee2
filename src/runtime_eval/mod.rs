//! The built-in runtime's evaluation, apart from the engine ([`crate::runtime`]): its benchmarks
//! ([`bench`]), correctness checks over any backend ([`check`]: reference greedy, parity,
//! fidelity), the CUDA backend's whole-model parity and speed ([`cuda_check`], hybrids in [`hybrid_check`]), and the
//! runtime's section of `rigbench report` ([`section`]). App tier (docs/architecture.md): it
//! drives the engine, the kernel bench and the e2e driver; the engine imports nothing from here.

pub mod bench;
pub mod check;
pub mod cuda_check;
pub mod decode_profile;
pub mod fp8_bisect;
pub mod hybrid_check;
pub mod quality;
pub mod section;

#[cfg(test)]
mod hybrid_cpu_tests;
#[cfg(test)]
mod moe_cpu_tests;
