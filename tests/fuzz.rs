//! The fuzz targets (fuzz/, cargo-fuzz on libFuzzer), each run for a bounded
//! time by fuzz/run.sh: 5 s each inside `cargo test` (the kept corpus
//! replayed, then a short exploration), or TESSERA_FUZZ_SECONDS; `.ci/run`
//! adds a 60 s session per target. A crash fails this test and leaves its
//! input in fuzz/artifacts/.

#[test]
fn the_fuzz_targets_run_clean() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/run.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .expect("running fuzz/run.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a fuzz target failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every target ran, and ran a real number of inputs.
    for target in [
        "jsonrpc", "sse", "headers", "route", "raw_head", "redact", "h1",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("fuzz {target}: Done ")))
            .unwrap_or_else(|| panic!("no summary for {target} in:\n{text}"));
        let runs: u64 = line
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(runs > 1000, "{line}");
        println!("{line}");
    }
}
