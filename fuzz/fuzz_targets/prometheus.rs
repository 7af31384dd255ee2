#![no_main]
//! Fuzz target `prometheus`: see `rigbench::fuzz_harness::prometheus`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::prometheus(data));
