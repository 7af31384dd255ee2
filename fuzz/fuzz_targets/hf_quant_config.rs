#![no_main]
//! Fuzz target `hf_quant_config`: see `rigbench::fuzz_harness::hf_quant_config`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::hf_quant_config(data));
