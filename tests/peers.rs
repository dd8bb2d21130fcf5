//! Real third-party MCP peers through a real `tessera serve`
//! (tests/peers/run.sh): server-everything, a fastmcp server and the
//! Python SDK's own server behind Starlette's gzip middleware upstream;
//! the TypeScript SDK 1.x and 2.x clients, the Python SDK, the Inspector
//! CLI and the MCP conformance suite as callers. All pinned, installed from
//! the registries on first use into ignored folders.

#[test]
fn real_mcp_peers_work_through_tessera() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/run.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .env("TESSERA_BIN", env!("CARGO_BIN_EXE_tessera"))
        .output()
        .expect("running tests/peers/run.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "peers failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It ran: the summary is there, with checks passed and none failed.
    let summary = text
        .lines()
        .rev()
        .find(|l| l.ends_with(" failed"))
        .unwrap_or_else(|| panic!("no summary in:\n{text}"));
    let passed: u32 = summary
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 20, "only {passed} checks ran: {summary}");
    assert!(summary.ends_with(", 0 failed"), "{summary}");
}
