//! The secret never comes back: an upstream that echoes the injected
//! credential in a JSON body, in a response header, and in SSE events split
//! at every byte has every occurrence replaced before the caller sees it,
//! for each scheme. Replacing a secret with `credential set-secret` reaches
//! new requests without failing any.

use base64::Engine;

use crate::support::*;

/// Register `cred` for `path` with a scheme, a caller and a connection.
async fn agent_with(p: &Proxy, up: &Upstream, cred: &str, scheme: &[&str], path: &str) -> Agent {
    let mut args = vec!["credential", "add", cred, "--upstream"];
    let url = up.url(path);
    args.push(&url);
    args.extend_from_slice(scheme);
    args.extend_from_slice(&["--secret-env", "TEST_SECRET"]);
    let o = p.cli(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let caller = format!("{cred}-agent");
    let token = last_line(&p.cli(&["caller", "add", &caller]));
    let url = last_line(&p.cli(&[
        "connection",
        "add",
        "--caller",
        &caller,
        "--credential",
        cred,
        "--public-url",
        &p.base(),
    ]));
    p.synced().await;
    Agent { token, url }
}

/// Every caller-visible byte of an answer: status line parts, headers, body.
async fn everything(a: &Agent) -> (Vec<u8>, http::HeaderMap) {
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("accept", "application/json, text/event-stream")
        .body(tools_call(1, "echo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let headers = r.headers().clone();
    let mut all: Vec<u8> = Vec::new();
    for (k, v) in &headers {
        all.extend_from_slice(k.as_str().as_bytes());
        all.extend_from_slice(v.as_bytes());
    }
    all.extend_from_slice(&r.bytes().await.unwrap());
    (all, headers)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn echoed_secrets_are_redacted_for_every_scheme() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let basic_b64 = base64::engine::general_purpose::STANDARD.encode(format!("bot:{SECRET}"));
    let schemes: [(&str, &[&str]); 3] = [
        ("bearer", &[]),
        ("basic", &["--scheme", "basic", "--username", "bot"]),
        (
            "header",
            &["--scheme", "header", "--header-name", "x-api-key"],
        ),
    ];
    for (name, scheme) in schemes {
        for path in ["/echo", "/echo-sse"] {
            let cred = format!("{name}{}", path.replace('/', "-"));
            let a = agent_with(&p, &up, &cred, scheme, path).await;
            let (all, headers) = everything(&a).await;
            assert!(
                !contains(&all, SECRET.as_bytes()),
                "{cred}: {}",
                String::from_utf8_lossy(&all)
            );
            assert!(!contains(&all, basic_b64.as_bytes()), "{cred}");
            assert!(
                contains(&all, b"[redacted-by-tessera]"),
                "{cred}: nothing was echoed?"
            );
            if path == "/echo" && name != "header" {
                // The reflected header keeps its shape, minus the secret.
                let echo = headers["x-echo"].to_str().unwrap();
                assert!(
                    echo.starts_with(if name == "basic" {
                        "Basic [redacted"
                    } else {
                        "Bearer [redacted"
                    }),
                    "{echo}"
                );
            }
            if path == "/echo-sse" {
                // Each event was split at a different byte; all are caught
                // and the stream's bytes are otherwise intact.
                let text = String::from_utf8(all).unwrap();
                let events = text.matches("data: {\"auth\":\"").count();
                assert!(events > 20, "{text}");
            }
        }
    }
    assert_logs_lack(&[&basic_b64]);
    // The upstream did get the real secret: redaction is on the way back.
    assert!(up
        .seen()
        .iter()
        .any(|s| s.headers["authorization"] == format!("Bearer {SECRET}")));
}

#[tokio::test]
async fn set_secret_reaches_new_requests_and_fails_none() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/sse"), "agent").await;
    // Plain requests go to a sub-path of the upstream's `/sse` URL, which
    // the upstream answers with JSON.
    let b = Agent {
        token: a.token.clone(),
        url: format!("{}/x", a.url),
    };

    // A stream in flight with the old secret.
    let stream = client()
        .get(&a.url)
        .bearer_auth(&a.token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let tx = up.sse_sender().await;

    let o = tessera(p.dir.path())
        .args([
            "credential",
            "set-secret",
            "gh",
            "--secret-env",
            "NEW_SECRET",
        ])
        .env("NEW_SECRET", "rotated-secret-Kp3nW8")
        .env_remove("TESSERA_MASTER_KEY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let took = p.synced().await;
    assert!(took < std::time::Duration::from_secs(1), "{took:?}");

    // New requests carry the new secret.
    let r = client()
        .post(&b.url)
        .bearer_auth(&b.token)
        .body(tools_call(2, "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let last = up.seen().last().unwrap().clone();
    assert_eq!(
        last.headers["authorization"],
        "Bearer rotated-secret-Kp3nW8"
    );

    // The stream opened before goes on.
    tx.send(bytes::Bytes::from_static(b"data: still here\n\n"))
        .await
        .unwrap();
    drop(tx);
    let body = stream.text().await.unwrap();
    assert!(body.contains("still here"), "{body}");

    // Unknown credential, empty secret: clear errors.
    let o = p.cli(&[
        "credential",
        "set-secret",
        "nope",
        "--secret-env",
        "TEST_SECRET",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no credential named \"nope\""));
    assert_no_plaintext(p.dir.path(), &["rotated-secret-Kp3nW8", SECRET]);
    assert_logs_lack(&["rotated-secret-Kp3nW8"]);
}
