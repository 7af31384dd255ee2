#![no_main]
//! Fuzz target `gguf_header`: see `rigbench::fuzz_harness::gguf_header`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::gguf_header(data));
