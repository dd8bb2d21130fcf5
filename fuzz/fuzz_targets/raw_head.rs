//! Fuzz target: see `tessera::fuzzing::raw_head`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::raw_head(data));
