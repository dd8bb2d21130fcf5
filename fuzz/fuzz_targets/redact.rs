//! Fuzz target: see `tessera::fuzzing::redact`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::redact(data));
