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

/// Every caller-visible byte of an answer to `body` sent to `url`, with
/// `Accept-Encoding` as undici and httpx send it: status, header names and
/// values, then the body.
async fn reflected(a: &Agent, query: &str, body: String) -> (u16, http::HeaderMap, Vec<u8>) {
    let r = client()
        .post(format!("{}?{query}", a.url))
        .bearer_auth(&a.token)
        .header("accept", "application/json, text/event-stream")
        .header("accept-encoding", "gzip, deflate, br, zstd")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let mut all: Vec<u8> = Vec::new();
    for (k, v) in &headers {
        all.extend_from_slice(k.as_str().as_bytes());
        all.extend_from_slice(v.as_bytes());
    }
    all.extend_from_slice(&r.bytes().await.unwrap());
    (status, headers, all)
}

/// The forms a test sends, with the encoding indices as the query names
/// them.
fn form_query(chain: &[usize]) -> String {
    chain
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `chain` leaves the secret readable at all (a case change after
/// base64 leaves nothing a client could decode): only those are checked.
fn readable(secret: &[u8], chain: &[usize]) -> bool {
    use tessera::redact::leaks::{encode_chain, leak, Encoding};
    let chain: Vec<Encoding> = chain.iter().map(|&i| Encoding::ALL[i]).collect();
    let t = tessera::redact::threshold(secret.len());
    leak(&encode_chain(&chain, secret, 7), secret, t).is_some()
}

/// An upstream that reflects the injected credential in every reversible
/// form, in a JSON body, an SSE stream one byte per frame, a header value,
/// a header name, and cut across header fields: no decoding of what the
/// caller gets shows a piece of the secret of half its length or more
/// (tessera::redact::leaks is the oracle, independent of the redactor).
#[tokio::test]
async fn no_decoding_of_an_answer_shows_the_secret() {
    use tessera::redact::leaks::{leak, Encoding};
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let t = tessera::redact::threshold(SECRET.len());
    let basic = ["--scheme", "basic", "--username", "bot"];
    let bearer = agent_with(&p, &up, "bearer", &[], "/reflect").await;
    let basic = agent_with(&p, &up, "basic", &basic, "/reflect").await;
    let n = Encoding::ALL.len();
    // Every encoding alone, in every place, for both schemes.
    let mut cases: Vec<(Vec<usize>, &Agent, &str, &str)> = vec![];
    for chain in std::iter::once(vec![]).chain((0..n).map(|i| vec![i])) {
        for (a, whole) in [(&bearer, "0"), (&basic, "1"), (&bearer, "1")] {
            for at in ["json", "sse", "header", "split", "name"] {
                cases.push((chain.clone(), a, whole, at));
            }
        }
    }
    // Every escape (JSON, percent, HTML) over every encoding, in a body.
    for i in 0..n {
        for j in 0..12 {
            cases.push((vec![i, j], &bearer, "0", "json"));
        }
    }
    let mut checked = 0;
    for (chain, a, whole, at) in cases {
        if !readable(SECRET.as_bytes(), &chain) {
            continue;
        }
        let enc = form_query(&chain);
        {
            {
                let q = format!("enc={enc}&at={at}&whole={whole}");
                let (status, _, all) = reflected(a, &q, tools_call(1, "echo")).await;
                if status == 422 {
                    continue; // not a header hyper's upstream could send
                }
                assert_eq!(status, 200, "{q}");
                if let Some(how) = leak(&all, SECRET.as_bytes(), t) {
                    panic!("{q}: {how}\n{}", String::from_utf8_lossy(&all));
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 600, "{checked}");
    assert_logs_lack(&[SECRET]);
}

/// Compressed answers (as Starlette's and Express's middleware send them
/// whenever the request allows): tessera asks for `identity`, decodes what
/// still arrives coded, redacts, and passes it on uncoded. A coding it
/// cannot decode is a 502, never passed on.
#[tokio::test]
async fn coded_answers_are_decoded_then_redacted() {
    use tessera::redact::leaks::leak;
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let t = tessera::redact::threshold(SECRET.len());
    let a = agent_with(&p, &up, "bearer", &[], "/reflect").await;
    for coding in ["gzip", "deflate", "br", "zstd"] {
        for at in ["json", "sse"] {
            for enc in ["", "12", "0", "6"] {
                let q = format!("enc={enc}&at={at}&coding={coding}");
                let (status, headers, all) = reflected(&a, &q, tools_call(1, "echo")).await;
                assert_eq!(status, 200, "{q}");
                assert!(!headers.contains_key("content-encoding"), "{q}");
                assert!(leak(&all, SECRET.as_bytes(), t).is_none(), "{q}");
                assert!(
                    String::from_utf8_lossy(&all).contains("[redacted-by-tessera]"),
                    "{q}: nothing was echoed? {}",
                    String::from_utf8_lossy(&all)
                );
            }
        }
    }
    // The upstream was asked for an uncoded answer every time.
    for s in up.seen() {
        assert_eq!(s.headers["accept-encoding"], "identity", "{}", s.path);
    }
    let (status, _, all) = reflected(&a, "coding=x-squash", tools_call(1, "echo")).await;
    assert_eq!(status, 502);
    let v: serde_json::Value =
        serde_json::from_slice(&all[all.iter().position(|&b| b == b'{').unwrap()..]).unwrap();
    assert_eq!(v["error"]["code"], -32010, "{v}");
    assert!(leak(&all, SECRET.as_bytes(), t).is_none());
}

/// The tools/list filter parses an answer and writes it anew: a secret it
/// read JSON-escaped (or behind `\/`) would be plain in what it wrote, on
/// every connection. What it writes is redacted too.
#[tokio::test]
async fn the_tools_list_filter_never_writes_the_secret() {
    use tessera::redact::leaks::{leak, Encoding};
    let up = Upstream::start().await;
    // Each answer's description is another form of the secret: tool
    // pinning would hold every one after the first (pinning::
    // a_reflected_secret_is_not_stored_in_a_pin covers it with pinning).
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.pin_tools = tessera::config::PinMode::Off
    })
    .await;
    let t = tessera::redact::threshold(SECRET.len());
    let a = agent_with(&p, &up, "bearer", &[], "/reflect").await;
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#.to_string();
    let escapes = [
        Encoding::JsonUnicodeLower,
        Encoding::JsonUnicodeUpper,
        Encoding::JsonUnicodeSome,
        Encoding::JsonPhp,
        Encoding::JsonGo,
    ];
    for e in escapes {
        let i = Encoding::ALL.iter().position(|x| *x == e).unwrap();
        for at in ["json", "sse"] {
            let q = format!("enc={i}&at={at}");
            let (status, _, all) = reflected(&a, &q, list.clone()).await;
            assert_eq!(status, 200, "{q}");
            let text = String::from_utf8_lossy(&all);
            assert!(
                text.contains("\"search\""),
                "{q}: the list was not passed: {text}"
            );
            if let Some(how) = leak(&all, SECRET.as_bytes(), t) {
                panic!("{q}: {how}\n{text}");
            }
        }
    }
}

/// A JSON-RPC method name is the agent's to choose, like a tool's: one
/// holding the secret is written redacted in the audit trail and the log,
/// and one far longer than any method is refused before anything is
/// written of it (found by the attack review).
#[tokio::test]
async fn a_method_name_is_redacted_and_bounded() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let method = format!("x/{SECRET}");
    let body = serde_json::json!({"jsonrpc":"2.0","id":1,"method":method}).to_string();
    let (status, _) = post_json(&a, body).await;
    assert_eq!(status, 200);
    let long = "m".repeat(300);
    let body = serde_json::json!({"jsonrpc":"2.0","id":2,"method":long}).to_string();
    let (status, v) = post_json(&a, body).await;
    assert_eq!(status, 400, "{v}");
    let seen = up.seen();
    assert!(!seen.iter().any(|s| s.body.len() > 250), "{seen:?}");
    let rows = within(std::time::Duration::from_secs(5), || async {
        audit_rows(&p)
            .await
            .iter()
            .any(|r| r.rpc_method.as_deref().is_some_and(|m| m.starts_with("x/")))
    });
    rows.await;
    for r in audit_rows(&p).await {
        let m = r.rpc_method.unwrap_or_default();
        assert!(!m.contains(SECRET), "{m}");
        assert!(m.len() < 300, "{m}");
    }
    assert_logs_lack(&[&long]);
}
