//! Fuzz target: see `tessera::fuzzing::headers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::headers(data));
