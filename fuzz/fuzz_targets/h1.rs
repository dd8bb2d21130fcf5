//! Fuzz target: see `tessera::fuzzing::h1`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::h1(data));
