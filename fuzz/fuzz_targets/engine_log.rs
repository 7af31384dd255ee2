#![no_main]
//! Fuzz target `engine_log`: see `rigbench::fuzz_harness::engine_log`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::engine_log(data));
