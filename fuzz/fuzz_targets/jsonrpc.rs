//! Fuzz target: see `tessera::fuzzing::jsonrpc`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::jsonrpc(data));
