//! `tessera credential login`: the interactive OAuth path for upstreams
//! that need a person's consent, following the MCP authorization spec.
//!
//! 1. protected-resource metadata (RFC 9728): from the upstream's 401
//!    `WWW-Authenticate: … resource_metadata="…"`, else the well-known URL;
//! 2. authorization-server metadata (RFC 8414, then OpenID discovery);
//! 3. dynamic client registration (RFC 7591) when no client id is given;
//! 4. the authorization-code flow with PKCE (S256) and the `resource`
//!    parameter (RFC 8707), redirected to a loopback listener, the URL
//!    printed for the admin to open;
//! 5. the code exchanged for tokens, stored sealed as an OAuth credential
//!    that refreshes itself from then on.
//!
//! Each step reports progress; a failure names its step and why. No token
//! or secret is ever printed.
//!
//! Steps 1 to 3 are hand-written: the `oauth2` crate does no discovery or
//! registration. Steps 4 and 5 (the authorization URL, PKCE, `state`, the
//! code exchange) are the crate's, its requests sent on tessera's own
//! client as a token refresh's are ([`OAuthHttp`]).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::Full;
use oauth2::{
    AuthUrl, AuthorizationCode, ClientSecret, CsrfToken, PkceCodeChallenge, PkceCodeVerifier,
    RedirectUrl, RequestTokenError, Scope, TokenResponse, TokenUrl,
};
use serde::Deserialize;
use url::Url;

use crate::credentials::oauth::{
    oauth_client, printable, standard_code, Grant, OAuthConfig, OAuthHttp, OAuthSecrets,
};
use crate::crypto::keyring::{ExposeSecret, MasterKey, SecretString};
use crate::store::model::NewCredential;
use crate::store::model::Sealed;
use crate::store::Store;
use crate::upstream::pool::UpstreamClient;

/// The largest metadata or token document read.
const MAX_DOC: usize = 256 * 1024;
/// Each HTTP exchange of the flow.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// A failed step, named.
#[derive(Debug, thiserror::Error)]
#[error("login failed at {step}: {why}")]
pub struct LoginError {
    pub step: &'static str,
    pub why: String,
}

fn fail(step: &'static str) -> impl Fn(String) -> LoginError {
    move |why| LoginError { step, why }
}

/// What `credential login` was given.
pub struct LoginSpec {
    pub name: String,
    pub upstream: Url,
    pub client_id: Option<String>,
    pub client_secret: Option<SecretString>,
    pub scopes: Vec<String>,
    /// How long to wait for the person to authorize.
    pub wait: Duration,
}

#[derive(Deserialize)]
struct ResourceMetadata {
    resource: Option<String>,
    #[serde(default)]
    authorization_servers: Vec<String>,
    #[serde(default)]
    scopes_supported: Vec<String>,
}

#[derive(Deserialize)]
struct ServerMetadata {
    issuer: Option<String>,
    authorization_endpoint: String,
    token_endpoint: String,
    registration_endpoint: Option<String>,
    #[serde(default)]
    code_challenge_methods_supported: Vec<String>,
}

#[derive(Deserialize)]
struct Registered {
    client_id: String,
    client_secret: Option<String>,
}

/// One HTTP exchange: status, headers, body (bounded). `pool_key` keeps
/// the flow's connections to itself (see [`crate::upstream::pool`]).
async fn exchange(
    client: &UpstreamClient,
    pool_key: &str,
    method: Method,
    url: &Url,
    headers: &[(header::HeaderName, String)],
    body: Option<(&'static str, String)>,
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let uri: Uri = url
        .as_str()
        .parse()
        .map_err(|_| format!("{url} is not a URI"))?;
    let mut req = Request::new(Bytes::from(
        body.as_ref().map(|b| b.1.clone()).unwrap_or_default(),
    ));
    *req.method_mut() = method;
    let h = req.headers_mut();
    if let Some(a) = uri.authority() {
        h.insert(
            header::HOST,
            HeaderValue::from_str(a.as_str()).map_err(|e| e.to_string())?,
        );
    }
    if let Some((ctype, _)) = &body {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    }
    for (k, v) in headers {
        let mut v = HeaderValue::from_str(v).map_err(|_| format!("an invalid {k} value"))?;
        v.set_sensitive(*k == header::AUTHORIZATION);
        h.insert(k.clone(), v);
    }
    *req.uri_mut() = uri;
    let run = async {
        let a = client
            .exchange(req, pool_key, MAX_DOC)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        Ok((a.status, a.headers, a.body))
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, run)
        .await
        .map_err(|_| format!("{url}: no answer within {} s", EXCHANGE_TIMEOUT.as_secs()))?
}

/// GET a JSON document; `Ok(None)` when it is not there (404 and kin).
async fn get_json<T: serde::de::DeserializeOwned>(
    client: &UpstreamClient,
    pool_key: &str,
    url: &Url,
) -> Result<Option<T>, String> {
    let (status, _, body) = exchange(
        client,
        pool_key,
        Method::GET,
        url,
        &[(header::ACCEPT, "application/json".into())],
        None,
    )
    .await?;
    if !status.is_success() {
        return Ok(None);
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| format!("{url}: not the expected JSON document ({e})"))
}

/// `resource_metadata="…"` from a `WWW-Authenticate` challenge.
pub fn resource_metadata_hint(challenge: &str) -> Option<&str> {
    let at = challenge.find("resource_metadata=")? + "resource_metadata=".len();
    let rest = &challenge[at..];
    match rest.strip_prefix('"') {
        Some(q) => q.split('"').next(),
        None => rest.split([',', ' ']).next(),
    }
}

/// Well-known URLs for a URL (RFC 8615 path insertion): the path-aware one
/// first, then the root one.
fn well_known(base: &Url, name: &str) -> Vec<Url> {
    let path = base.path().trim_end_matches('/');
    let mut out = Vec::new();
    let mut u = base.clone();
    u.set_query(None);
    u.set_fragment(None);
    if !path.is_empty() {
        u.set_path(&format!("/.well-known/{name}{path}"));
        out.push(u.clone());
    }
    u.set_path(&format!("/.well-known/{name}"));
    out.push(u);
    out
}

/// Step 1: the upstream's protected-resource metadata.
async fn resource_metadata(
    client: &UpstreamClient,
    pool_key: &str,
    upstream: &Url,
) -> Result<ResourceMetadata, String> {
    let probe = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_string();
    let (status, headers, _) = exchange(
        client,
        pool_key,
        Method::POST,
        upstream,
        &[(header::ACCEPT, "application/json, text/event-stream".into())],
        Some(("application/json", probe)),
    )
    .await?;
    let hint = headers
        .get_all(header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(resource_metadata_hint)
        .map(str::to_string);
    let mut tried = Vec::new();
    let candidates =
        match hint {
            Some(h) => vec![Url::parse(&h)
                .map_err(|_| format!("the resource_metadata hint {h:?} is not a URL"))?],
            None => well_known(upstream, "oauth-protected-resource"),
        };
    for url in candidates {
        if let Some(m) = get_json::<ResourceMetadata>(client, pool_key, &url).await? {
            return Ok(m);
        }
        tried.push(url.to_string());
    }
    Err(format!(
        "the upstream answered HTTP {} without a resource_metadata hint, and no metadata at {}",
        status.as_u16(),
        tried.join(" or ")
    ))
}

/// Step 2: the authorization server's metadata.
async fn server_metadata(
    client: &UpstreamClient,
    pool_key: &str,
    issuer: &Url,
) -> Result<ServerMetadata, String> {
    let mut candidates = well_known(issuer, "oauth-authorization-server");
    candidates.extend(well_known(issuer, "openid-configuration"));
    let mut tried = Vec::new();
    for url in candidates {
        if let Some(m) = get_json::<ServerMetadata>(client, pool_key, &url).await? {
            if let Some(i) = &m.issuer {
                if i.trim_end_matches('/') != issuer.as_str().trim_end_matches('/') {
                    return Err(format!("{url} names issuer {i:?}, not {issuer}"));
                }
            }
            return Ok(m);
        }
        tried.push(url.to_string());
    }
    Err(format!("no metadata at {}", tried.join(", ")))
}

/// A PKCE verifier (32 random bytes, base64url) and its S256 challenge.
fn pkce() -> (PkceCodeVerifier, PkceCodeChallenge) {
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    (verifier, challenge)
}

/// The loopback redirect: the first `/callback` request's query.
async fn wait_for_callback(
    listener: tokio::net::TcpListener,
    wait: Duration,
) -> Result<Vec<(String, String)>, String> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<(String, String)>>(1);
    let serve = async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (status, text) = if req.uri().path() == "/callback" {
                            let q: Vec<(String, String)> = url::form_urlencoded::parse(
                                req.uri().query().unwrap_or("").as_bytes(),
                            )
                            .into_owned()
                            .collect();
                            let _ = tx.send(q).await;
                            (
                                200,
                                "tessera: authorization received. You can close this window.",
                            )
                        } else {
                            (404, "not found")
                        };
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .status(status)
                                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                                .body(Full::new(Bytes::from_static(text.as_bytes())))
                                .expect("a static response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    };
    tokio::select! {
        q = rx.recv() => q.ok_or_else(|| "the loopback listener stopped".to_string()),
        _ = serve => Err("the loopback listener stopped".into()),
        () = tokio::time::sleep(wait) => Err(format!("nobody authorized within {} s", wait.as_secs())),
    }
}

/// Run the whole flow and store the credential. `say` gets each progress
/// line (the authorization URL among them).
pub async fn login(
    store: &Store,
    key: &MasterKey,
    client: &UpstreamClient,
    spec: LoginSpec,
    mut say: impl FnMut(&str),
) -> Result<(), LoginError> {
    let step1 = fail("step 1 (protected-resource metadata, RFC 9728)");
    say(&format!(
        "1/5 reading the protected-resource metadata of {}",
        spec.upstream
    ));
    // The flow's connections carry this credential's client secret and
    // codes: a pool of their own, as a token refresh gets.
    let pool_key = format!("oauth:{}", spec.name);
    let pool_key = pool_key.as_str();
    let prm = resource_metadata(client, pool_key, &spec.upstream)
        .await
        .map_err(&step1)?;
    if let Some(r) = &prm.resource {
        let r = r.trim_end_matches('/');
        if !spec.upstream.as_str().trim_end_matches('/').starts_with(r) {
            return Err(step1(format!(
                "the metadata is for resource {r:?}, not {}",
                spec.upstream
            )));
        }
    }
    let issuer = prm
        .authorization_servers
        .first()
        .ok_or_else(|| step1("the metadata names no authorization server".into()))?;
    let issuer = Url::parse(issuer).map_err(|_| step1(format!("{issuer:?} is not a URL")))?;

    let step2 = fail("step 2 (authorization-server metadata, RFC 8414)");
    say(&format!(
        "2/5 reading the metadata of authorization server {issuer}"
    ));
    let asm = server_metadata(client, pool_key, &issuer)
        .await
        .map_err(&step2)?;
    if !asm
        .code_challenge_methods_supported
        .iter()
        .any(|m| m == "S256")
    {
        return Err(step2("the server does not list PKCE S256 in code_challenge_methods_supported; the MCP spec says not to proceed".into()));
    }
    let parse = |u: &str| Url::parse(u).map_err(|_| step2(format!("{u:?} is not a URL")));
    let authorize_url = parse(&asm.authorization_endpoint)?;
    let token_url = parse(&asm.token_endpoint)?;

    let step4 = fail("step 4 (authorization)");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| step4(format!("opening the loopback listener: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| step4(e.to_string()))?
        .port();
    let redirect = format!("http://127.0.0.1:{port}/callback");

    let step3 = fail("step 3 (client registration, RFC 7591)");
    let (client_id, client_secret) = match spec.client_id {
        Some(id) => {
            say(&format!("3/5 using client id {id}"));
            (id, spec.client_secret)
        }
        None => {
            let endpoint = asm.registration_endpoint.as_deref().ok_or_else(|| {
                step3("the server offers no registration_endpoint: give --client-id".into())
            })?;
            say(&format!("3/5 registering a client at {endpoint}"));
            let endpoint =
                Url::parse(endpoint).map_err(|_| step3(format!("{endpoint:?} is not a URL")))?;
            let body = serde_json::json!({
                "client_name": "tessera",
                "redirect_uris": [redirect],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            });
            let (status, _, bytes) = exchange(
                client,
                pool_key,
                Method::POST,
                &endpoint,
                &[(header::ACCEPT, "application/json".into())],
                Some(("application/json", body.to_string())),
            )
            .await
            .map_err(&step3)?;
            if !status.is_success() {
                return Err(step3(format!(
                    "the server answered HTTP {}",
                    status.as_u16()
                )));
            }
            let r: Registered = serde_json::from_slice(&bytes)
                .map_err(|_| step3("the answer has no client_id".into()))?;
            (r.client_id, r.client_secret.map(SecretString::from))
        }
    };

    let scopes = if spec.scopes.is_empty() {
        prm.scopes_supported.clone()
    } else {
        spec.scopes
    };
    let (verifier, challenge) = pkce();
    let resource = spec.upstream.as_str().to_string();
    let redirect_url =
        RedirectUrl::new(redirect).map_err(|e| step4(format!("the redirect URI: {e}")))?;
    let oauth = oauth_client(
        &client_id,
        client_secret
            .as_ref()
            .map(|s| ClientSecret::new(s.expose_secret().to_string())),
    )
    .set_auth_uri(AuthUrl::from_url(authorize_url))
    .set_token_uri(TokenUrl::from_url(token_url.clone()))
    .set_redirect_uri(redirect_url);
    // `state`: 16 random bytes, base64url.
    let (url, state) = oauth
        .authorize_url(CsrfToken::new_random)
        .set_pkce_challenge(challenge)
        .add_extra_param("resource", &resource)
        .add_scopes(scopes.iter().cloned().map(Scope::new))
        .url();
    say("4/5 open this URL in a browser and authorize tessera:");
    say(url.as_str());
    let q = wait_for_callback(listener, spec.wait)
        .await
        .map_err(&step4)?;
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if let Some(e) = get("error") {
        // Whoever reaches the loopback listener writes these: a standard
        // code goes into the error (stored in the admin audit), the
        // description only to the person's terminal, printable.
        if let Some(d) = get("error_description") {
            say(&format!("the authorization server said: {}", printable(d)));
        }
        return Err(step4(format!(
            "the authorization server answered {}",
            standard_code(e)
        )));
    }
    if get("state") != Some(state.secret().as_str()) {
        return Err(step4(
            "the redirect's state does not match: not the request tessera made".into(),
        ));
    }
    let code = get("code").ok_or_else(|| step4("the redirect carries no code".into()))?;

    let step5 = fail("step 5 (token exchange)");
    say(&format!("5/5 exchanging the code at {token_url}"));
    let http = OAuthHttp::new(client, pool_key, MAX_DOC);
    let exchange = oauth
        .exchange_code(AuthorizationCode::new(code.to_string()))
        .set_pkce_verifier(verifier)
        .add_extra_param("resource", &resource)
        .request_async(&http);
    let answered = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            step5(format!(
                "{token_url}: no answer within {} s",
                EXCHANGE_TIMEOUT.as_secs()
            ))
        })?;
    let status = http.status().map_or(0, |s| s.as_u16());
    // The token endpoint was just sent the code, the verifier and maybe the
    // client secret, and may echo them: only a standard code goes into the
    // error (stored in the admin audit); its words only to the terminal.
    let mut refused = |e: &str, d: Option<&str>| {
        if let Some(d) = d {
            say(&format!("the token endpoint said: {}", printable(d)));
        }
        step5(format!("the server refused: {}", standard_code(e)))
    };
    let t = answered.map_err(|e| match e {
        RequestTokenError::Request(e) => step5(format!("{token_url}: {e}")),
        RequestTokenError::ServerResponse(r) => refused(
            r.error().as_ref(),
            r.error_description().map(String::as_str),
        ),
        // Never sent: the crate could not make a request of the URL.
        RequestTokenError::Other(_) if status == 0 => step5(format!("{token_url} is not a URI")),
        // An error status with JSON that is no OAuth error.
        RequestTokenError::Parse(_, body)
            if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() =>
        {
            step5(format!("HTTP {status}: no access_token"))
        }
        RequestTokenError::Parse(..) | RequestTokenError::Other(_) => {
            step5(format!("HTTP {status}: not a token response"))
        }
    })?;
    if let Some((e, d)) = t.refusal() {
        return Err(refused(e, d));
    }
    let access = t.access_token().secret();
    if access.is_empty() {
        return Err(step5(format!("HTTP {status}: no access_token")));
    }
    let refresh_token = t.refresh_token().map(|r| r.secret().clone());
    if refresh_token.is_none() {
        say("note: the server issued no refresh token; log in again when the access token expires");
    }

    let store_step = fail("storing the credential");
    let config = OAuthConfig {
        token_url,
        client_id,
        scopes,
        audience: None,
        resource: Some(resource),
        grant: Grant::RefreshToken,
    };
    let secrets = OAuthSecrets {
        client_secret: client_secret.map(|s| s.expose_secret().to_string()),
        refresh_token,
    };
    let config_json = serde_json::to_string(&config).expect("settings serialize");
    store
        .add_credential(NewCredential {
            name: &spec.name,
            upstream: spec.upstream.as_str(),
            scheme: crate::store::model::Scheme::Bearer,
            header_name: None,
            username: None,
            sealed: secrets.seal(key, &Sealed::Credential.aad(&spec.name)),
            oauth: Some(&config_json),
        })
        .await
        .map_err(|e| store_step(e.to_string()))?;
    let expires_at = t
        .expires_in()
        .map(|d| crate::telemetry::time::now_ms() + d.as_millis() as i64);
    let sealed = key.seal(
        &Sealed::OAuthToken.aad(&spec.name),
        &SecretString::from(access.clone()),
    );
    store
        .put_oauth_token(&spec.name, &sealed, expires_at, None)
        .await
        .map_err(|e| store_step(e.to_string()))?;
    say(&format!(
        "credential {} stored; tessera refreshes its token from now on",
        spec.name
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use sha2::{Digest, Sha256};

    #[test]
    fn reads_the_resource_metadata_hint() {
        let c = r#"Bearer error="invalid_token", resource_metadata="https://mcp.example/.well-known/oauth-protected-resource/mcp""#;
        assert_eq!(
            resource_metadata_hint(c),
            Some("https://mcp.example/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            resource_metadata_hint("Bearer resource_metadata=https://a/b, x=1"),
            Some("https://a/b")
        );
        assert_eq!(resource_metadata_hint("Bearer realm=\"x\""), None);
    }

    #[test]
    fn well_known_urls_insert_the_path() {
        let u = Url::parse("https://as.example/tenant1?x=1").unwrap();
        let w: Vec<String> = well_known(&u, "oauth-authorization-server")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            w,
            [
                "https://as.example/.well-known/oauth-authorization-server/tenant1",
                "https://as.example/.well-known/oauth-authorization-server"
            ]
        );
        let root = Url::parse("https://as.example/").unwrap();
        assert_eq!(well_known(&root, "x").len(), 1);
    }

    #[test]
    fn pkce_is_s256_of_the_verifier() {
        let (v, c) = pkce();
        assert_eq!(c.method().as_str(), "S256");
        let (v, c) = (v.secret(), c.as_str());
        assert_eq!(v.len(), 43);
        assert_eq!(c, URL_SAFE_NO_PAD.encode(Sha256::digest(v.as_bytes())));
        assert_ne!(pkce().0.secret(), v);
    }
}
