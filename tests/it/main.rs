//! The integration tests, one binary: one module per former test file (the file's name and its
//! tests' names are as they were: `cargo test --test it -- serve_load::` runs what
//! `--test serve_load` did). One binary is linked once, instantiates the dependencies' generic
//! code once, and runs every test beside the others on the harness's threads; 42 binaries took
//! about 380 s of CPU to build, mostly linking, and cargo ran them one after another (README,
//! "Set-up").
//!
//! The tests here share one process, so none may change what the process is: no
//! `std::env::set_var`, no current folder, no signal sent to or handler installed in this process,
//! no figure of the whole process (peak RSS) asserted. The two tests that need those have a
//! binary each: `tests/peer_restart.rs` (PATH and SIGTERM) and `tests/fuzz_regressions.rs` (the
//! process's peak RSS while a header is read).

// Helpers of the tests that run the binary (`use crate::common;`), and the generator of the
// test checkpoints (`use crate::checkpoints;`).
#[path = "../common/checkpoints.rs"]
mod checkpoints;
#[path = "../common/mod.rs"]
mod common;

mod architecture;
mod board;
mod cli;
mod compare_cli;
mod compare_stats;
mod diagnose_cli;
mod docs;
mod e2e_builtin;
mod e2e_engines;
mod e2e_faults;
mod e2e_gate_faults;
mod e2e_mock;
mod e2e_real_engines;
mod e2e_serving;
mod engine_verdict;
mod env_vars;
mod exit_codes;
mod first_hour;
mod fixtures_provenance;
mod fresh_clone;
mod gate_cli;
mod hostile_cli;
mod hostile_engines;
mod hostile_modes;
mod inspect;
mod inspect_binary;
mod inspect_engine;
mod inspect_hub;
mod inspect_index;
mod inspect_metadata;
mod kernel_abi;
mod kernel_sources;
mod multigpu_cli;
mod quality;
mod second_pass;
mod serve;
mod serve_cli;
mod serve_hostile;
mod serve_load;
mod smollm2;
mod state_snapshot;
mod tp_model;
