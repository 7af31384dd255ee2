#![no_main]
//! Fuzz target `suite_toml`: see `rigbench::fuzz_harness::suite_toml`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::suite_toml(data));
