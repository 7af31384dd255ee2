#![no_main]
//! Fuzz target `nvidia_smi`: see `rigbench::fuzz_harness::nvidia_smi`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| rigbench::fuzz_harness::nvidia_smi(data));
