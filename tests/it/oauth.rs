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

const CLIENT_ID: &str = "tessera-client";
const CLIENT_SECRET: &str = "client-secret-Hq7wR2xT";
const FIRST_REFRESH: &str = "refresh-0-Vb9mK4sL";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    Refuse,
    Hang,
    /// Hold token answers until the test opens the gate.
    Gated,
}

#[derive(Default)]
struct AsState {
    valid: HashSet<String>,
    refresh: Option<String>,
    token_requests: usize,
    issued: usize,
    expires_in: u64,
    rotate: bool,
    mode: Option<Mode>,
    /// The MCP endpoint refuses every token.
    reject_all: bool,
}

struct AuthServer {
    base: String,
    state: Arc<Mutex<AsState>>,
    gate: Arc<Notify>,
    asked: Arc<Notify>,
}

impl AuthServer {
    async fn start(expires_in: u64, rotate: bool) -> AuthServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(AsState {
            expires_in,
            rotate,
            refresh: Some(FIRST_REFRESH.into()),
            mode: Some(Mode::Normal),
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

    fn set(&self, f: impl FnOnce(&mut AsState)) {
        f(&mut self.state.lock().unwrap());
    }

    fn token_requests(&self) -> usize {
        self.state.lock().unwrap().token_requests
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
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if path == "/mcp" {
        // The protected MCP endpoint: only live tokens this server issued.
        let token = auth.strip_prefix("Bearer ").unwrap_or("");
        let ok = {
            let s = st.lock().unwrap();
            s.valid.contains(token) && !s.reject_all
        };
        if !ok {
            return hyper::Response::builder()
                .status(401)
                .header("www-authenticate", "Bearer error=\"invalid_token\"")
                .body(Full::new(Bytes::new()))
                .unwrap();
        }
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // Which token it was (its number), and the token itself echoed,
        // which tessera must redact.
        let n: u64 = token.split('-').nth(1).unwrap().parse().unwrap();
        return json(
            200,
            serde_json::json!({"jsonrpc":"2.0","id":v["id"],"result":{"token":n,"echo":token}}),
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
        Some("refresh_token") => {
            if form.get("client_id").map(String::as_str) != Some(CLIENT_ID) {
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
    if form.get("grant_type").map(String::as_str) == Some("refresh_token") && s.rotate {
        let next = format!("refresh-{}-Vb9mK4sL", s.issued);
        s.refresh = Some(next.clone());
        answer["refresh_token"] = next.into();
    }
    json(200, answer)
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
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(&args)
        .env("TESSERA_DATA_DIR", p.dir.path())
        .env("CLIENT_SECRET", CLIENT_SECRET)
        .env("REFRESH", FIRST_REFRESH)
        .env_remove("TESSERA_MASTER_KEY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
            .starts_with("[redacted-by-tess"),
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
    auth.gate.notify_waiters();
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
}
