#![no_main]
//! Fuzz target `sse`: see `rigbench::fuzz_harness::sse`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::sse(data));
