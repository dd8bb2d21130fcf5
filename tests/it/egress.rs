//! The egress rule (SSRF defence): internal upstreams and plain HTTP are
//! refused at registration and again at connect time, unless allowed.

use crate::support::*;

/// `credential add` without TESSERA_ALLOW_PRIVATE_UPSTREAMS (the suite
/// sets it for every other test).
fn add_strict(
    dir: &std::path::Path,
    name: &str,
    upstream: &str,
    extra: &[&str],
) -> std::process::Output {
    tessera(dir)
        .env_remove("TESSERA_ALLOW_PRIVATE_UPSTREAMS")
        .args([
            "credential",
            "add",
            name,
            "--upstream",
            upstream,
            "--secret-env",
            "TEST_SECRET",
        ])
        .args(extra)
        .env("TEST_SECRET", SECRET)
        .output()
        .unwrap()
}

#[tokio::test]
async fn internal_upstreams_are_refused_at_registration_unless_allowed() {
    let dir = Proxy::dir();
    let refused = [
        ("http://api.example/mcp", "plain http://"),
        ("https://127.0.0.1/mcp", "127.0.0.1"),
        ("https://[::1]:8443/mcp", "::1"),
        ("https://10.1.2.3/mcp", "10.1.2.3"),
        ("https://172.16.5.4/mcp", "172.16.5.4"),
        ("https://192.168.0.10/mcp", "192.168.0.10"),
        (
            "https://169.254.169.254/latest/meta-data",
            "169.254.169.254",
        ),
        ("https://[fd00::1]/mcp", "fd00::1"),
        ("https://[fe80::1]/mcp", "fe80::1"),
        ("https://[::ffff:127.0.0.1]/mcp", "127.0.0.1"),
        // A name: resolved, and refused for what it resolves to.
        (
            "https://localhost:8443/mcp",
            "resolves to a private or local address",
        ),
    ];
    for (i, (url, named)) in refused.iter().enumerate() {
        let o = add_strict(dir.path(), &format!("c{i}"), url, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{url} was accepted");
        assert!(err.contains(named), "{url}: {err}");
        assert!(err.contains("--allow-private-upstreams"), "{url}: {err}");
    }
    // Nothing was stored.
    let list =
        String::from_utf8(cli(dir.path(), &["--json", "credential", "list"]).stdout).unwrap();
    assert_eq!(list.trim(), "[]");
    // The OAuth token URL follows the same rule.
    let o = add_strict(
        dir.path(),
        "oa",
        "https://1.1.1.1/mcp",
        &[
            "--scheme",
            "oauth2",
            "--token-url",
            "https://169.254.169.254/token",
            "--client-id",
            "x",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--token-url") && err.contains("169.254.169.254"),
        "{err}"
    );
    // A public address over https passes (no connection is made).
    assert!(add_strict(dir.path(), "public", "https://1.1.1.1/mcp", &[])
        .status
        .success());
    // The flag (or the variable) allows an internal upstream.
    let o = add_strict(
        dir.path(),
        "local",
        "http://127.0.0.1:9/mcp",
        &["--allow-private-upstreams"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[tokio::test]
async fn serve_refuses_an_internal_upstream_at_connect_time() {
    // Registered while allowed (as a name that resolved elsewhere then
    // would be), served by a tessera that does not allow internal
    // upstreams: refused when connecting, after resolution, and nothing
    // reaches the upstream.
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| c.egress.allow_private = false).await;
    let port = up
        .url("/")
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let by_ip = p.agent("ip", &up.url("/mcp"), "a1").await;
    let by_name = p
        .agent("name", &format!("https://localhost:{port}/mcp"), "a2")
        .await;
    for a in [&by_ip, &by_name] {
        let (status, v) = post_json(a, tools_call(1, "t")).await;
        assert_eq!(status, 502, "{v}");
        assert_eq!(v["error"]["code"], -32010);
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("will not connect") && msg.contains("--allow-private-upstreams"),
            "{msg}"
        );
        // The caller is not told the address.
        assert!(!msg.contains("127.0.0.1") && !msg.contains(&port), "{msg}");
    }
    assert!(up.seen().is_empty(), "an internal upstream was reached");
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    let metrics = crate::admin_api::metrics_text(&api, &token).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "tessera_refusals_total{reason=\"upstream_forbidden\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_admin_api_applies_serve_s_egress_rule() {
    let p = Proxy::start_with(Proxy::dir(), |c| c.egress.allow_private = false).await;
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    let r = client()
        .post(format!("{api}/v1/credentials"))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "name": "meta", "upstream": "https://169.254.169.254/", "scheme": "bearer", "secret": "s"
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("169.254.169.254"),
        "{v}"
    );
}
