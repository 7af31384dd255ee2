#![no_main]
//! Fuzz target `results_json`: see `rigbench::fuzz_harness::results_json`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::results_json(data));
