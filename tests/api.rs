//! The admin API checked against its own OpenAPI document by schemathesis
//! (tests/api/schemathesis.sh: a pinned schemathesis from PyPI, installed
//! once into target/tools, against a real `tessera serve`). Every operation
//! gets generated valid and invalid input; every answer must be documented,
//! match its schema, never be a 5xx, and honour the admin token.

#[test]
fn the_admin_api_conforms_to_its_openapi_document() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/schemathesis.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .env("TESSERA_BIN", env!("CARGO_BIN_EXE_tessera"))
        .output()
        .expect("running tests/api/schemathesis.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It ran: something was generated and every case passed.
    let summary = text
        .lines()
        .find(|l| l.contains(" generated, "))
        .unwrap_or_else(|| panic!("no summary in:\n{text}"));
    assert!(summary.contains(" passed"), "{summary}");
    println!("{summary}");
}
