//! OAuth 2.x upstream credentials against a real authorization server in
//! the test process: client credentials, refresh tokens the server
//! rotates, refresh ahead of expiry and after a 401, a hundred requests at
//! expiry costing one token request, and a token endpoint that refuses or
//! hangs. The server also protects the MCP endpoint, which accepts only
//! tokens it issued and has not revoked.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::support::*;

pub(crate) const CLIENT_ID: &str = "tessera-client";
pub(crate) const CLIENT_SECRET: &str = "client-secret-Hq7wR2xT";
pub(crate) const FIRST_REFRESH: &str = "refresh-0-Vb9mK4sL";

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Normal,
    Refuse,
    Hang,
    /// Hold token answers until the test opens the gate.
    Gated,
    /// Refuse, echoing the request: its `Authorization` as the error code
    /// and its form (the refresh token) as the description, as a careless
    /// or hostile token endpoint could.
    Echo,
}

#[derive(Default)]
pub(crate) struct AsState {
    valid: HashSet<String>,
    refresh: Option<String>,
    token_requests: usize,
    issued: usize,
    pub(crate) expires_in: u64,
    rotate: bool,
    pub(crate) mode: Option<Mode>,
    /// The MCP endpoint refuses every token.
    reject_all: bool,
    /// The MCP endpoint echoes every token issued so far.
    echo_issued: bool,
    base: String,
    /// Dynamically registered clients and their redirect URIs.
    registered: Vec<(String, Vec<String>)>,
    /// Authorization codes: code → (client, redirect, S256 challenge).
    codes: std::collections::HashMap<String, (String, String, String)>,
}

pub(crate) struct AuthServer {
    pub(crate) base: String,
    state: Arc<Mutex<AsState>>,
    gate: Arc<Notify>,
    asked: Arc<Notify>,
}

impl AuthServer {
    pub(crate) async fn start(expires_in: u64, rotate: bool) -> AuthServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(AsState {
            expires_in,
            rotate,
            refresh: Some(FIRST_REFRESH.into()),
            mode: Some(Mode::Normal),
            base: base.clone(),
            ..Default::default()
        }));
        let gate = Arc::new(Notify::new());
        let asked = Arc::new(Notify::new());
        let (st, g, a) = (state.clone(), gate.clone(), asked.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (st, g, a) = (st.clone(), g.clone(), a.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (st, g, a) = (st.clone(), g.clone(), a.clone());
                        async move { Ok::<_, std::convert::Infallible>(serve(req, st, g, a).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        AuthServer {
            base,
            state,
            gate,
            asked,
        }
    }

    pub(crate) fn set(&self, f: impl FnOnce(&mut AsState)) {
        f(&mut self.state.lock().unwrap());
    }

    pub(crate) fn token_requests(&self) -> usize {
        self.state.lock().unwrap().token_requests
    }

    /// Answer the token requests held in [`Mode::Gated`] now.
    pub(crate) fn open_gate(&self) {
        self.gate.notify_waiters();
    }

    /// Revoke every access token issued so far (as if they expired early).
    fn revoke_all(&self) {
        self.state.lock().unwrap().valid.clear();
    }
}

fn json(status: u16, v: serde_json::Value) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

async fn serve(
    req: hyper::Request<hyper::body::Incoming>,
    st: Arc<Mutex<AsState>>,
    gate: Arc<Notify>,
    asked: Arc<Notify>,
) -> hyper::Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if let Some(r) = discovery(&path, &query, &body, &st) {
        return r;
    }
    if path == "/mcp" {
        // The protected MCP endpoint: only live tokens this server issued.
        let token = auth.strip_prefix("Bearer ").unwrap_or("");
        let ok = {
            let s = st.lock().unwrap();
            s.valid.contains(token) && !s.reject_all
        };
        if !ok {
            let hint = format!(
                "Bearer error=\"invalid_token\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
                st.lock().unwrap().base
            );
            return hyper::Response::builder()
                .status(401)
                .header("www-authenticate", hint)
                .body(Full::new(Bytes::new()))
                .unwrap();
        }
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // Which token it was (its number), and the token itself echoed,
        // which tessera must redact.
        let n: u64 = token.split('-').nth(1).unwrap().parse().unwrap();
        let mut result = serde_json::json!({"token":n,"echo":token});
        let s = st.lock().unwrap();
        if s.echo_issued {
            let all: Vec<String> = (1..=s.issued)
                .map(|i| format!("access-{i}-Tz8kQ3vN"))
                .collect();
            result["issued"] = all.into();
        }
        return json(
            200,
            serde_json::json!({"jsonrpc":"2.0","id":v["id"],"result":result}),
        );
    }
    // The token endpoint.
    let mode = {
        let mut s = st.lock().unwrap();
        s.token_requests += 1;
        s.mode.unwrap()
    };
    asked.notify_waiters();
    match mode {
        Mode::Hang => std::future::pending::<()>().await,
        Mode::Gated => gate.notified().await,
        Mode::Refuse => {
            return json(
                400,
                serde_json::json!({"error":"invalid_client","error_description":"client authentication failed"}),
            )
        }
        Mode::Echo => {
            return json(
                400,
                serde_json::json!({"error": auth, "error_description": String::from_utf8_lossy(&body)}),
            )
        }
        Mode::Normal => {}
    }
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(&body).into_owned().collect();
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{CLIENT_ID}:{CLIENT_SECRET}")
        )
    );
    let mut s = st.lock().unwrap();
    match form.get("grant_type").map(String::as_str) {
        Some("client_credentials") if auth == basic => {}
        Some("client_credentials") => {
            return json(401, serde_json::json!({"error":"invalid_client"}));
        }
        Some("authorization_code") => {
            let code = form.get("code").cloned().unwrap_or_default();
            let Some((client, redirect, challenge)) = s.codes.remove(&code) else {
                return json(400, serde_json::json!({"error":"invalid_grant"}));
            };
            let verifier = form.get("code_verifier").cloned().unwrap_or_default();
            let derived = base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                sha2::Digest::finalize(sha2::Digest::chain_update(
                    <sha2::Sha256 as sha2::Digest>::new(),
                    verifier.as_bytes(),
                )),
            );
            let resource = format!("{}/mcp", s.base);
            if form.get("client_id") != Some(&client)
                || form.get("redirect_uri") != Some(&redirect)
                || derived != challenge
                || form.get("resource") != Some(&resource)
            {
                return json(
                    400,
                    serde_json::json!({"error":"invalid_grant","error_description":"PKCE, client, redirect or resource mismatch"}),
                );
            }
            s.rotate = true;
        }
        Some("refresh_token") => {
            let client = form.get("client_id").map(String::as_str).unwrap_or("");
            if client != CLIENT_ID && !s.registered.iter().any(|(c, _)| c == client) {
                return json(401, serde_json::json!({"error":"invalid_client"}));
            }
            if form.get("refresh_token") != s.refresh.as_ref() {
                return json(400, serde_json::json!({"error":"invalid_grant"}));
            }
        }
        _ => return json(400, serde_json::json!({"error":"unsupported_grant_type"})),
    }
    s.issued += 1;
    let token = format!("access-{}-Tz8kQ3vN", s.issued);
    s.valid.insert(token.clone());
    let mut answer = serde_json::json!({
        "access_token": token, "token_type": "Bearer", "expires_in": s.expires_in,
    });
    if matches!(
        form.get("grant_type").map(String::as_str),
        Some("refresh_token" | "authorization_code")
    ) && s.rotate
    {
        let next = format!("refresh-{}-Vb9mK4sL", s.issued);
        s.refresh = Some(next.clone());
        answer["refresh_token"] = next.into();
    }
    json(200, answer)
}

/// The discovery, registration and authorization endpoints of the flow
/// `credential login` drives.
fn discovery(
    path: &str,
    query: &str,
    body: &[u8],
    st: &Arc<Mutex<AsState>>,
) -> Option<hyper::Response<Full<Bytes>>> {
    let mut s = st.lock().unwrap();
    let base = s.base.clone();
    Some(match path {
        "/.well-known/oauth-protected-resource/mcp" => json(
            200,
            serde_json::json!({"resource": format!("{base}/mcp"), "authorization_servers": [base], "scopes_supported": ["mcp"]}),
        ),
        "/.well-known/oauth-authorization-server" => json(
            200,
            serde_json::json!({
                "issuer": base, "authorization_endpoint": format!("{base}/authorize"),
                "token_endpoint": format!("{base}/token"), "registration_endpoint": format!("{base}/register"),
                "code_challenge_methods_supported": ["S256"],
            }),
        ),
        "/register" => {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let redirects: Vec<String> = v["redirect_uris"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|r| r.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let id = format!("dyn-{}", s.registered.len() + 1);
            s.registered.push((id.clone(), redirects));
            json(201, serde_json::json!({"client_id": id}))
        }
        "/authorize" => {
            // The person said yes: redirect with a code, if the request is
            // one a real server would accept.
            let q: std::collections::HashMap<String, String> =
                url::form_urlencoded::parse(query.as_bytes())
                    .into_owned()
                    .collect();
            let client = q.get("client_id").cloned().unwrap_or_default();
            let redirect = q.get("redirect_uri").cloned().unwrap_or_default();
            let known = s
                .registered
                .iter()
                .any(|(c, r)| *c == client && r.contains(&redirect));
            let ok = known
                && q.get("response_type").map(String::as_str) == Some("code")
                && q.get("code_challenge_method").map(String::as_str) == Some("S256")
                && q.get("resource") == Some(&format!("{base}/mcp"))
                && q.get("scope").map(String::as_str) == Some("mcp");
            if !ok {
                return Some(json(400, serde_json::json!({"error": "invalid_request"})));
            }
            let code = format!("code-{}", s.codes.len() + 1);
            s.codes.insert(
                code.clone(),
                (
                    client,
                    redirect.clone(),
                    q.get("code_challenge").cloned().unwrap_or_default(),
                ),
            );
            let state = q.get("state").cloned().unwrap_or_default();
            hyper::Response::builder()
                .status(302)
                .header("location", format!("{redirect}?code={code}&state={state}"))
                .body(Full::new(Bytes::new()))
                .unwrap()
        }
        _ => return None,
    })
}

/// Register an OAuth credential on the proxy's data dir, a caller and a
/// connection; the agent that uses it.
async fn oauth_agent(p: &Proxy, auth: &AuthServer, refresh: bool) -> Agent {
    let token_url = format!("{}/token", auth.base);
    let upstream = format!("{}/mcp", auth.base);
    let mut args = vec![
        "credential",
        "add",
        "saas",
        "--upstream",
        &upstream,
        "--scheme",
        "oauth2",
        "--token-url",
        &token_url,
        "--client-id",
        CLIENT_ID,
        "--scope",
        "read",
        "--scope",
        "write",
    ];
    if refresh {
        args.extend_from_slice(&["--refresh-token-env", "REFRESH"]);
    } else {
        args.extend_from_slice(&["--client-secret-env", "CLIENT_SECRET"]);
    }
    let o = tessera(p.dir.path())
        .args(&args)
        .env("CLIENT_SECRET", CLIENT_SECRET)
        .env("REFRESH", FIRST_REFRESH)
        .env_remove("TESSERA_MASTER_KEY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    agent_on_saas(p).await
}

/// A caller "agent" and a connection to credential "saas", served.
async fn agent_on_saas(p: &Proxy) -> Agent {
    let token = last_line(&p.cli(&["caller", "add", "agent"]));
    let url = last_line(&p.cli(&[
        "connection",
        "add",
        "--caller",
        "agent",
        "--credential",
        "saas",
        "--public-url",
        &p.base(),
    ]));
    p.synced().await;
    Agent { token, url }
}

/// One call; the status and, on success, the token the upstream saw.
async fn call(a: &Agent) -> (u16, serde_json::Value) {
    post_json(a, tools_call(1, "t")).await
}

#[tokio::test]
async fn client_credentials_token_is_fetched_once_and_reused() {
    let auth = AuthServer::start(3600, false).await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = oauth_agent(&p, &auth, false).await;
    let listed = String::from_utf8(p.cli(&["credential", "list"]).stdout).unwrap();
    assert!(
        listed.contains("saas") && listed.contains("oauth2"),
        "{listed}"
    );

    let (s, v) = call(&a).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["token"], 1);
    // The upstream echoed the access token: the caller sees the marker.
    assert!(
        v["result"]["echo"]
            .as_str()
            .unwrap()
            .starts_with("[redacted-by-tes"),
        "{v}"
    );
    let (s, _) = call(&a).await;
    assert_eq!(s, 200);
    assert_eq!(auth.token_requests(), 1, "the token is reused");

    // A token the upstream stops accepting: one refresh, the call retried.
    auth.revoke_all();
    let (s, v) = call(&a).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["token"], 2);
    assert_eq!(auth.token_requests(), 2);

    // Nothing secret in the data dir in clear: client secret, tokens.
    assert_no_plaintext(p.dir.path(), &[CLIENT_SECRET, "access-2-Tz8kQ3vN"]);

    // A restarted proxy uses the cached (sealed) token: no token request.
    let Proxy { dir, .. } = p;
    let p = Proxy::start(dir).await;
    let (s, v) = call(&a_on(&p, &a)).await;
    assert_eq!((s, &v["result"]["token"]), (200, &serde_json::json!(2)));
    assert_eq!(auth.token_requests(), 2);
}

/// The same agent on a restarted proxy (a new port).
fn a_on(p: &Proxy, a: &Agent) -> Agent {
    let id = a.url.rsplit('/').next().unwrap();
    Agent {
        token: a.token.clone(),
        url: format!("{}/c/{id}", p.base()),
    }
}

#[tokio::test]
async fn a_token_inside_the_margin_is_refreshed_first() {
    // Tokens live 30 s; the margin is 60 s: each is due at once.
    let auth = AuthServer::start(30, false).await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = oauth_agent(&p, &auth, false).await;
    for n in 1..=3 {
        let (s, v) = call(&a).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["result"]["token"], n);
    }
    assert_eq!(auth.token_requests(), 3);
}

#[tokio::test]
async fn a_rotated_refresh_token_replaces_the_old_one_sealed() {
    let auth = AuthServer::start(30, true).await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = oauth_agent(&p, &auth, true).await;
    // Each call refreshes (inside the margin); the server rotates the
    // refresh token and refuses the old one, so each refresh must use the
    // one before.
    for n in 1..=3 {
        let (s, v) = call(&a).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["result"]["token"], n);
    }
    assert_no_plaintext(
        p.dir.path(),
        &[FIRST_REFRESH, "refresh-3-Vb9mK4sL", "access-3-Tz8kQ3vN"],
    );
    // After a restart, the rotated refresh token comes from the store.
    let Proxy { dir, .. } = p;
    let p = Proxy::start(dir).await;
    let (s, v) = call(&a_on(&p, &a)).await;
    assert_eq!((s, &v["result"]["token"]), (200, &serde_json::json!(4)));
}

#[tokio::test]
async fn a_hundred_requests_at_expiry_cost_one_token_request() {
    let auth = AuthServer::start(3600, false).await;
    auth.set(|s| s.mode = Some(Mode::Gated));
    let p = Proxy::start(Proxy::dir()).await;
    let a = Arc::new(oauth_agent(&p, &auth, false).await);
    let asked = auth.asked.notified();
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { call(&a).await })
        })
        .collect();
    // The first token request is held open; the other requests queue
    // behind it rather than asking themselves.
    tokio::time::timeout(Duration::from_secs(5), asked)
        .await
        .unwrap();
    auth.set(|s| s.mode = Some(Mode::Normal));
    auth.open_gate();
    for c in calls {
        let (s, v) = c.await.unwrap();
        assert_eq!((s, &v["result"]["token"]), (200, &serde_json::json!(1)));
    }
    assert_eq!(auth.token_requests(), 1);
}

#[tokio::test]
async fn token_endpoint_failures_are_a_clear_502() {
    let auth = AuthServer::start(3600, false).await;
    auth.set(|s| s.mode = Some(Mode::Refuse));
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.token_timeout = Duration::from_millis(300)
    })
    .await;
    let a = oauth_agent(&p, &auth, false).await;
    let (s, v) = call(&a).await;
    assert_eq!(s, 502, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"saas\"") && msg.contains("invalid_client"),
        "{msg}"
    );
    assert!(!msg.contains(CLIENT_SECRET));

    auth.set(|s| s.mode = Some(Mode::Hang));
    let (s, v) = call(&a).await;
    assert_eq!(s, 502, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("did not answer within 300 ms"), "{msg}");

    // Working again: the next request gets a token.
    auth.set(|s| s.mode = Some(Mode::Normal));
    assert_eq!(call(&a).await.0, 200);

    // An upstream that refuses every token: one refresh and one retry,
    // then the 502 that names the credential.
    auth.set(|s| s.reject_all = true);
    let before = auth.token_requests();
    let (s, v) = call(&a).await;
    assert_eq!(s, 502, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"saas\"") && msg.contains("HTTP 401"),
        "{msg}"
    );
    assert_eq!(auth.token_requests(), before + 1);
    assert_logs_lack(&[CLIENT_SECRET, "access-1-Tz8kQ3vN", "access-2-Tz8kQ3vN"]);
}

/// `credential login saas` against `auth`, with a person who opens the
/// printed URL and says yes: the exit status and every line printed.
async fn login_with_consent(
    p: &Proxy,
    auth: &AuthServer,
) -> (std::process::ExitStatus, Vec<String>) {
    use tokio::io::AsyncBufReadExt;
    let upstream = format!("{}/mcp", auth.base);
    let mut child = tessera_async(p.dir.path())
        .args(["credential", "login", "saas", "--upstream", &upstream])
        .env_remove("TESSERA_MASTER_KEY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let url = loop {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("login printed no URL")
            .unwrap()
            .expect("login ended before printing a URL");
        said.push(line.clone());
        if line.starts_with("http") {
            break line;
        }
    };
    assert!(
        said[0].starts_with("1/5 reading the protected-resource metadata"),
        "{said:?}"
    );
    assert!(
        url.contains("code_challenge_method=S256") && url.contains("resource="),
        "{url}"
    );
    // The person opens the URL and says yes; the browser follows the
    // redirect to tessera's loopback listener.
    let browser = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = browser.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 302, "{}", r.text().await.unwrap());
    let back = r.headers()["location"].to_str().unwrap().to_string();
    assert!(back.starts_with("http://127.0.0.1:"), "{back}");
    let r = browser.get(&back).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    while let Ok(Some(l)) = lines.next_line().await {
        said.push(l);
    }
    let o = child.wait_with_output().await.unwrap();
    said.extend(String::from_utf8_lossy(&o.stderr).lines().map(String::from));
    (status, said)
}

#[tokio::test]
async fn login_discovers_registers_and_authorizes_headlessly() {
    let auth = AuthServer::start(3600, false).await;
    let p = Proxy::start(Proxy::dir()).await;
    let (status, said) = login_with_consent(&p, &auth).await;
    assert!(status.success(), "{said:?}");
    assert!(
        said.last().unwrap().contains("credential saas stored"),
        "{said:?}"
    );
    // The login is an admin action like any other: recorded, by the CLI.
    let rows = p.store().admin_audit(None, 10).await.unwrap();
    assert!(
        rows.iter().any(|r| r.actor == "cli"
            && r.action == "credential.login"
            && r.target == "saas"
            && r.outcome == "ok"),
        "{rows:?}"
    );
    // Nothing secret was printed.
    let printed = said.join("\n");
    assert!(
        !printed.contains("access-1-") && !printed.contains("refresh-1-"),
        "{printed}"
    );

    // The credential works through the proxy with the token from the login,
    // and refreshes with the refresh token (rotated) when refused.
    let a = agent_on_saas(&p).await;
    let (s, v) = call(&a).await;
    assert_eq!(
        (s, &v["result"]["token"]),
        (200, &serde_json::json!(1)),
        "{v}"
    );
    auth.revoke_all();
    let (s, v) = call(&a).await;
    assert_eq!(
        (s, &v["result"]["token"]),
        (200, &serde_json::json!(2)),
        "{v}"
    );
    assert_no_plaintext(p.dir.path(), &["access-2-Tz8kQ3vN", "refresh-2-Vb9mK4sL"]);
    assert_logs_lack(&[
        "access-2-Tz8kQ3vN",
        "refresh-1-Vb9mK4sL",
        "refresh-2-Vb9mK4sL",
    ]);
}

#[tokio::test]
async fn login_names_the_step_that_failed() {
    // An upstream with no OAuth metadata at all.
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    // Run without blocking the runtime the upstream answers on.
    let o = tessera_async(dir.path())
        .args([
            "credential",
            "login",
            "x",
            "--upstream",
            &up.url("/mcp"),
            "--wait-s",
            "1",
        ])
        .env_remove("TESSERA_MASTER_KEY")
        .output()
        .await
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("login failed at step 1 (protected-resource metadata, RFC 9728)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_reload_keeps_the_token_source() {
    let auth = AuthServer::start(3600, true).await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = oauth_agent(&p, &auth, true).await;
    assert_eq!(call(&a).await.0, 200);
    let source = || {
        let snap = p.state.snapshot.load_full();
        let c = snap.connections.values().next().unwrap();
        match &c.upstream.auth {
            tessera::model::Auth::OAuth(o) => o.clone(),
            tessera::model::Auth::Static(_) => panic!("not an OAuth credential"),
        }
    };
    let before = source();
    // Any change reloads the snapshot; the source with the newest refresh
    // token and any refresh in flight stays the one in use.
    last_line(&p.cli(&["caller", "add", "someone-else"]));
    p.synced().await;
    assert!(std::sync::Arc::ptr_eq(&before, &source()));
    assert_eq!(call(&a).await.0, 200);
    assert_eq!(auth.token_requests(), 1);
}

/// The login trusts the certificate authorities it is given, as serve
/// does: an authorization server behind a private CA is reached with
/// `--upstream-ca-file` (its TLS handshake completes and the first request
/// arrives), and not without it.
#[tokio::test]
async fn login_trusts_the_configured_certificate_authorities() {
    let server = TlsUpstream::start(&[b"http/1.1"]).await;
    let upstream = format!("https://localhost:{}/mcp", server.port);
    let dir = Proxy::dir();
    let pem = server.ca_pem(dir.path());
    let login = |extra: Vec<String>| {
        let mut args = vec![
            "credential".to_string(),
            "login".into(),
            "x".into(),
            "--upstream".into(),
            upstream.clone(),
            "--allow-private-upstreams".into(),
            "--wait-s".into(),
            "1".into(),
        ];
        args.extend(extra);
        tessera_async(dir.path())
            .args(args)
            .env_remove("TESSERA_MASTER_KEY")
            .output()
    };
    let o = login(vec![]).await.unwrap();
    assert!(!o.status.success());
    assert_eq!(
        server.seen.lock().unwrap().len(),
        0,
        "reached without its CA"
    );
    let o = login(vec!["--upstream-ca-file".into(), pem.display().to_string()])
        .await
        .unwrap();
    // The server answers "ok" to everything: no metadata, so step 1 fails,
    // after the handshake.
    assert!(!o.status.success());
    assert!(
        !server.seen.lock().unwrap().is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A token endpoint that echoes the code exchange (the authorization code
/// and the PKCE verifier in its form) in its refusal: the login fails at
/// step 5 naming a standard code only, and nothing it echoed reaches the
/// admin audit, where the failure is recorded in clear.
#[tokio::test]
async fn a_login_refusal_that_echoes_the_exchange_records_no_part_of_it() {
    let auth = AuthServer::start(3600, false).await;
    auth.set(|s| s.mode = Some(Mode::Echo));
    let p = Proxy::start(Proxy::dir()).await;
    let (status, said) = login_with_consent(&p, &auth).await;
    assert!(!status.success(), "{said:?}");
    let rows = p.store().admin_audit(None, 10).await.unwrap();
    let row = rows
        .iter()
        .find(|r| r.action == "credential.login")
        .unwrap_or_else(|| panic!("no login row: {rows:?}"));
    assert!(row.outcome.contains("step 5"), "{row:?}");
    for echoed in ["code=", "code_verifier", "grant_type"] {
        assert!(!row.outcome.contains(echoed), "{echoed} recorded: {row:?}");
    }
}

/// A token endpoint that echoes its request (the refresh token in the
/// form, the client's `Basic` credentials) in its error: the caller's 502
/// holds only a standard error code, and no decoding of it shows a secret;
/// what the endpoint said is in the log, redacted.
#[tokio::test]
async fn a_token_endpoint_that_echoes_its_request_reveals_nothing() {
    use tessera::redact::leaks::leak;
    for refresh in [false, true] {
        let auth = AuthServer::start(3600, false).await;
        auth.set(|s| s.mode = Some(Mode::Echo));
        let p = Proxy::start(Proxy::dir()).await;
        let a = oauth_agent(&p, &auth, refresh).await;
        let r = client()
            .post(&a.url)
            .bearer_auth(&a.token)
            .body(tools_call(1, "t"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        let body = r.bytes().await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("an unrecognized OAuth error"), "{msg}");
        for secret in [CLIENT_SECRET, FIRST_REFRESH] {
            let t = tessera::redact::threshold(secret.len());
            if let Some(how) = leak(&body, secret.as_bytes(), t) {
                panic!("{secret}: {how}\n{msg}");
            }
        }
        assert_eq!(auth.token_requests(), 1);
    }
    assert_logs_lack(&[CLIENT_SECRET, FIRST_REFRESH]);
}

/// After a 401 and a refresh, the token refreshed away is still redacted:
/// an upstream may keep echoing it (here: every token it ever issued).
#[tokio::test]
async fn a_token_refreshed_away_stays_redacted() {
    use tessera::redact::leaks::leak;
    let auth = AuthServer::start(3600, false).await;
    auth.set(|s| s.echo_issued = true);
    let p = Proxy::start(Proxy::dir()).await;
    let a = oauth_agent(&p, &auth, false).await;
    let (s, v) = call(&a).await;
    assert_eq!(
        (s, &v["result"]["token"]),
        (200, &serde_json::json!(1)),
        "{v}"
    );
    // The upstream stops taking token 1: tessera refreshes and retries.
    auth.revoke_all();
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(2, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["result"]["token"], 2, "{v}");
    assert_eq!(
        v["result"]["issued"].as_array().map(Vec::len),
        Some(2),
        "{v}"
    );
    for token in ["access-1-Tz8kQ3vN", "access-2-Tz8kQ3vN", CLIENT_SECRET] {
        let t = tessera::redact::threshold(token.len());
        assert!(leak(&body, token.as_bytes(), t).is_none(), "{token}: {v}");
    }
}

/// New OAuth settings (`credential update --scope`, `--token-url`) drop
/// the cached token: the next request asks the token endpoint again, with
/// them. Options of other schemes are refused.
#[tokio::test]
async fn updated_oauth_settings_ask_for_a_new_token() {
    let auth = AuthServer::start(3600, false).await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = oauth_agent(&p, &auth, false).await;
    assert_eq!(call(&a).await.0, 200);
    assert_eq!(call(&a).await.0, 200);
    assert_eq!(auth.token_requests(), 1);

    let o = p.cli(&["credential", "update", "saas", "--scope", "read"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    p.synced().await;
    let (s, v) = call(&a).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(auth.token_requests(), 2, "the cached token was kept");

    let o = p.cli(&["credential", "update", "saas", "--username", "bot"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("does not apply to a credential of scheme oauth2"),
        "{err}"
    );
    let o = p.cli(&["credential", "update", "saas", "--token-url", "ftp://x"]);
    assert!(!o.status.success());
    // Its secrets stay with the origins they were issued for.
    for flag in ["--token-url", "--upstream"] {
        let o = p.cli(&["credential", "update", "saas", flag, "http://127.0.0.1:1/t"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("stay with the origins"), "{flag}: {err}");
    }
    assert_eq!(call(&a).await.0, 200);
    assert_eq!(auth.token_requests(), 2);
}

/// A refresh on Postgres holds the credential's cross-replica lock across
/// the token request; it must not hold one of the serving pool's
/// connections meanwhile. With more hanging token endpoints than the pool
/// has connections, a call on a static credential is still audited and an
/// approval is still held and redeemed, each far within the token timeout.
#[tokio::test]
async fn hanging_token_endpoints_leave_the_audit_writer_and_approvals_working() {
    const POOL: u32 = 2;
    const SLOW: usize = 4;
    // Each wait below is bounded far under the token timeout: on the old
    // lock (a pooled connection held for the whole token request) they
    // waited out the token timeout. Generous against a loaded CI machine.
    let token_timeout = Duration::from_secs(20);
    let bound = Duration::from_secs(5);
    let auth = AuthServer::start(3600, false).await;
    auth.set(|s| s.mode = Some(Mode::Hang));
    let up = Upstream::start().await;
    let p = Proxy::start_with_pool(
        Proxy::dir(),
        POOL,
        |c| c.token_timeout = token_timeout,
        policies_with(&["ask-for-writes"]),
    )
    .await;
    let token_url = format!("{}/token", auth.base);
    let upstream = format!("{}/mcp", auth.base);
    let mut slow = Vec::new();
    for i in 0..SLOW {
        let (name, caller) = (format!("slow{i}"), format!("agent{i}"));
        let o = tessera(p.dir.path())
            .args([
                "credential",
                "add",
                &name,
                "--upstream",
                &upstream,
                "--scheme",
                "oauth2",
                "--token-url",
                &token_url,
                "--client-id",
                CLIENT_ID,
                "--client-secret-env",
                "CLIENT_SECRET",
            ])
            .env("CLIENT_SECRET", CLIENT_SECRET)
            .env_remove("TESSERA_MASTER_KEY")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let token = last_line(&p.cli(&["caller", "add", &caller]));
        let url = last_line(&p.cli(&[
            "connection",
            "add",
            "--caller",
            &caller,
            "--credential",
            &name,
            "--public-url",
            &p.base(),
        ]));
        slow.push(Agent { token, url });
    }
    let a = register(p.dir.path(), &p.base(), "gh", &up.url("/mcp"), "static");
    // Set-up, not the property: served once the snapshot has every row
    // (bounded loosely: nine CLI processes just wrote them).
    p.synced_within(Duration::from_secs(10)).await;

    // Every slow credential refreshes at once, and its token endpoint
    // takes the request and never answers.
    let calls: Vec<_> = slow
        .into_iter()
        .map(|a| tokio::spawn(async move { call(&a).await }))
        .collect();
    within(bound, || async { auth.token_requests() >= POOL as usize }).await;

    // A call on a static credential: answered, and its audit row written.
    let started = std::time::Instant::now();
    let (s, v) = post_json(&a, tools_call(1, "search")).await;
    assert_eq!(s, 200, "{v}");
    let store = p.store().clone();
    let audited = || {
        let store = store.clone();
        async move {
            let q = tessera::store::model::AuditQuery {
                limit: 1000,
                ..Default::default()
            };
            store
                .audit(&q)
                .await
                .unwrap()
                .iter()
                .any(|r| r.caller == "static" && r.tool.as_deref() == Some("search"))
        }
    };
    within(bound, audited).await;
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());

    // A write is held for a person (the approval is stored), …
    let write = || tools_call(2, "write_file");
    let started = std::time::Instant::now();
    let (s, v) = post_json(&a, write()).await;
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["isError"], true, "{v}");
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    let at = text.find("approval ap_").expect(text) + "approval ".len();
    let id = text[at..at + 15].to_string();
    // … granted, and the same call then runs (the grant redeemed).
    let o = p.cli(&["approval", "grant", &id]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let started = std::time::Instant::now();
    let (s, v) = post_json(&a, write()).await;
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    assert_eq!(
        (s, &v["result"]["echo"]),
        (200, &serde_json::json!("tools/call")),
        "{v}"
    );

    // The slow credentials all asked, and end in the token endpoint's 502.
    within(bound, || async { auth.token_requests() == SLOW }).await;
    for c in calls {
        let (s, v) = c.await.unwrap();
        assert_eq!(s, 502, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("did not answer within 20000 ms"), "{msg}");
    }
}
