//! Fuzz target: see `tessera::fuzzing::route`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::route(data));
