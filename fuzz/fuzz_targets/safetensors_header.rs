#![no_main]
//! Fuzz target `safetensors_header`: see `rigbench::fuzz_harness::safetensors_header`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::safetensors_header(data));
