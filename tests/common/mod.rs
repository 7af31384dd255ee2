//! Helpers shared by the integration tests that run the `rigbench` binary (`mod common;` in
//! each test file; not every file uses every helper).
#![allow(dead_code)]

use std::process::{Command, Output};

/// Run the `rigbench` binary built for these tests with `args`; its exit status and output.
pub fn rigbench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rigbench"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// A run's stderr as text (lossy UTF-8).
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
