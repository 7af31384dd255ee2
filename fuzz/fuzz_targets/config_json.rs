#![no_main]
//! Fuzz target `config_json`: see `rigbench::fuzz_harness::config_json`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::config_json(data));
