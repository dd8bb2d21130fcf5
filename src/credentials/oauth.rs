//! OAuth 2.x upstream credentials: the bearer token comes from an
//! authorization server, by the client-credentials grant or a refresh
//! token, and is replaced before it expires.
//!
//! A request asks its credential's [`OAuthSource`] for the current token:
//! a lock-free load while the token is fresh. When it is missing, inside
//! the refresh margin, or was just refused by the upstream (401), one
//! request fetches a new one while the others wait for it (single flight:
//! a hundred requests at expiry cause one token request). The token is
//! cached sealed in the store, so a restart or snapshot reload does not
//! cost a token request; a refresh token the server rotates replaces the
//! old one sealed, in the same step.
//!
//! Token endpoint failures become a 502 naming the credential and the
//! OAuth error code; the client secret, refresh token and access token
//! never appear in an error, a log line or a response.
//!
//! The token request itself (the grant's form, the client's
//! authentication, RFC 6749 error responses) is the `oauth2` crate's, sent
//! through [`OAuthHttp`] on tessera's own client so the egress rule holds
//! for it. What tessera reads in an answer is its own: [`TokenAnswer`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode, Uri};
use oauth2::basic::{
    BasicErrorResponse, BasicRevocationErrorResponse, BasicTokenIntrospectionResponse,
};
use oauth2::{
    AccessToken, AuthType, ClientId, ClientSecret, EndpointNotSet, RefreshToken, RequestTokenError,
    Scope, StandardRevocableToken, TokenResponse, TokenUrl,
};
use serde::{Deserialize, Deserializer, Serialize};
use url::Url;

use crate::credentials::{injection, Injection};
use crate::crypto::keyring::{ExposeSecret, MasterKey, SecretString};
use crate::redact::Redactor;
use crate::store::model::Scheme;
use crate::store::model::Sealed;
use crate::store::model::StoredOAuth;
use crate::store::oauth::OAuthRefresh;
use crate::store::{timed, Store, StoreError};
use crate::upstream::pool::{ExchangeError, SendError, UpstreamClient};

/// The largest token response read.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;

/// How a credential gets its token (stored as JSON, not secret).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OAuthConfig {
    pub token_url: Url,
    pub client_id: String,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub audience: Option<String>,
    /// The resource indicator (RFC 8707) sent with token requests: the
    /// upstream's URL, for credentials made by `credential login`.
    #[serde(default)]
    pub resource: Option<String>,
    pub grant: Grant,
}

/// The grant used at the token endpoint.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    ClientCredentials,
    RefreshToken,
}

/// The secrets of an OAuth credential, sealed together as one JSON object.
#[derive(Serialize, Deserialize, Default)]
pub struct OAuthSecrets {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
}

impl std::fmt::Debug for OAuthSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OAuthSecrets(<redacted>)")
    }
}

impl OAuthSecrets {
    pub fn seal(&self, key: &MasterKey, aad: &str) -> Vec<u8> {
        let json = SecretString::from(serde_json::to_string(self).expect("secrets serialize"));
        key.seal(aad, &json)
    }

    pub fn parse(opened: &SecretString) -> Result<OAuthSecrets, String> {
        serde_json::from_str(opened.expose_secret())
            .map_err(|_| "the sealed OAuth secrets are not a JSON object".to_string())
    }
}

/// The error codes of RFC 6749 §5.2 (and RFC 6750's): the only text of a
/// token endpoint's that reaches a caller. Anything else the endpoint says
/// goes to the log, redacted.
const OAUTH_ERRORS: [&str; 9] = [
    "invalid_request",
    "invalid_client",
    "invalid_grant",
    "unauthorized_client",
    "unsupported_grant_type",
    "invalid_scope",
    "invalid_token",
    "server_error",
    "temporarily_unavailable",
];

/// `code` if it is a standard OAuth error code (RFC 6749 §5.2 and kin),
/// else a fixed phrase: what an error message may say of a refusal. The
/// server's own words may echo what it was sent (a client secret, a code,
/// a verifier), so they never go into a message that is stored or shown.
pub(crate) fn standard_code(code: &str) -> &'static str {
    OAUTH_ERRORS
        .iter()
        .find(|c| **c == code)
        .copied()
        .unwrap_or("an unrecognized OAuth error")
}

/// Why no token could be had. Never holds a secret, and its message (what
/// a caller reads) holds nothing the token endpoint chose but a standard
/// error code: an endpoint that echoes its request would otherwise hand
/// the caller the refresh token or the client secret.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// The authorization server answered with an OAuth error.
    #[error("the token endpoint refused: {code}")]
    Refused {
        /// A standard OAuth error code, or "an unrecognized OAuth error".
        code: &'static str,
        /// What the endpoint said, printable and redacted: for the log.
        detail: Option<String>,
    },
    #[error("the token endpoint answered HTTP {0} without an OAuth error")]
    Status(u16),
    #[error("the token endpoint could not be reached: {0}")]
    Unreachable(String),
    #[error("the token endpoint did not answer within {0} ms")]
    Timeout(u128),
    #[error("the token endpoint's answer is not a token response: {0}")]
    BadResponse(&'static str),
    #[error("no {0} is stored for this credential")]
    Missing(&'static str),
}

impl TokenError {
    /// What the endpoint said beyond the code, for the log (redacted).
    pub fn detail(&self) -> Option<&str> {
        match self {
            TokenError::Refused { detail, .. } => detail.as_deref(),
            _ => None,
        }
    }

    fn refused(code: &str, description: Option<&str>, guard: &Redactor) -> TokenError {
        let known = OAUTH_ERRORS.iter().find(|c| **c == code).copied();
        let mut said = printable(code);
        if let Some(d) = description {
            said.push_str(": ");
            said.push_str(&printable(d));
        }
        TokenError::Refused {
            code: known.unwrap_or("an unrecognized OAuth error"),
            detail: Some(guard.text(&said).into_owned()),
        }
    }
}

/// A token in force.
#[derive(Debug)]
pub struct Token {
    /// The `Authorization: Bearer` header and the redactor for the token.
    pub injection: Injection,
    /// When the server said it expires (None: no lifetime given).
    pub expires_at: Option<SystemTime>,
}

impl Token {
    fn fresh(&self, margin: Duration) -> bool {
        self.expires_at
            .is_none_or(|e| SystemTime::now() + margin < e)
    }
}

/// What a refresh needs from the serving process.
pub struct OAuthContext<'a> {
    pub client: &'a UpstreamClient,
    pub store: &'a Store,
    pub key: &'a MasterKey,
    /// Refresh when the token expires within this.
    pub margin: Duration,
    /// The whole token request.
    pub timeout: Duration,
    /// A store operation that takes longer has failed: the refresh goes on
    /// without the store's lock rather than hang on it.
    pub db_timeout: Duration,
    /// Token requests are counted by credential and outcome.
    pub metrics: &'a crate::telemetry::metrics::Metrics,
}

/// One OAuth credential's token, shared by the requests that use it.
pub struct OAuthSource {
    credential: String,
    config: OAuthConfig,
    secrets: Mutex<OAuthSecrets>,
    token: ArcSwapOption<Token>,
    /// Held by the one request that refreshes.
    refreshing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for OAuthSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthSource")
            .field("credential", &self.credential)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OAuthSource {
    /// A source starting from the cached token, if any.
    pub fn new(
        credential: &str,
        config: OAuthConfig,
        secrets: OAuthSecrets,
        cached: Option<(SecretString, Option<SystemTime>)>,
    ) -> OAuthSource {
        let source = OAuthSource {
            credential: credential.to_string(),
            config,
            secrets: Mutex::new(secrets),
            token: ArcSwapOption::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        };
        if let Some(t) = cached.and_then(|(t, exp)| source.token(&t, exp).ok()) {
            source.token.store(Some(Arc::new(t)));
        }
        source
    }

    /// A token for `value`. Its redactor covers the token, the refresh
    /// token and the client secret, and, for [`crate::redact::RETIRED_GRACE`],
    /// the tokens it replaced: an upstream may still echo a request made
    /// with one.
    fn token(
        &self,
        value: &SecretString,
        expires_at: Option<SystemTime>,
    ) -> Result<Token, crate::credentials::CredentialError> {
        let mut injection = bearer(value)?;
        let secrets = self.secret_values();
        let now = injection.redactor.with(&secrets);
        injection.redactor = Arc::new(match self.token.load_full() {
            Some(previous) => previous.injection.redactor.succeeded_by(&now),
            None => now,
        });
        Ok(Token {
            injection,
            expires_at,
        })
    }

    /// The refresh token and client secret, for redactors.
    fn secret_values(&self) -> Vec<SecretString> {
        let s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        [&s.client_secret, &s.refresh_token]
            .into_iter()
            .flatten()
            .map(|v| SecretString::from(v.clone()))
            .collect()
    }

    /// A redactor of this credential's secrets (with the client's basic
    /// authentication as sent), for what the token endpoint says.
    fn guard(&self) -> Redactor {
        let secrets = self.secret_values();
        let current = self.token.load_full();
        let base = match &current {
            Some(t) => t.injection.redactor.with(&secrets),
            None => Redactor::new(&secrets),
        };
        match self.basic_value() {
            Some(basic) => base.with_sent(basic),
            None => base,
        }
    }

    /// The redactor for what comes back on a request with this credential:
    /// the current token's, or, before there is one, the guard's.
    pub fn redactor(&self) -> Arc<Redactor> {
        match self.token.load_full() {
            Some(t) => t.injection.redactor.clone(),
            None => Arc::new(self.guard()),
        }
    }

    /// The client's HTTP basic credentials as sent to the token endpoint,
    /// for the redactor: the `oauth2` crate sends them encoded this way
    /// (RFC 6749 §2.3.1: each form-urlencoded, then joined and base64ed),
    /// and a test below holds the two together.
    fn basic_value(&self) -> Option<(SecretString, SecretString)> {
        let s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        let secret = s.client_secret.as_deref()?;
        let enc = |v: &str| url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
        Some((
            SecretString::from(secret.to_string()),
            SecretString::from(STANDARD.encode(format!(
                "{}:{}",
                enc(&self.config.client_id),
                enc(secret)
            ))),
        ))
    }

    /// Whether `other` (built from the store now) has the same settings:
    /// then this source, with its newer state, stays in use.
    pub fn same_settings(&self, other: &OAuthSource) -> bool {
        self.credential == other.credential && self.config == other.config
    }

    /// Adopt `other`'s client secret (an admin may have replaced it with
    /// `credential set-secret`); the refresh token here is the newest and
    /// stays.
    pub fn take_client_secret(&self, other: &OAuthSource) {
        let theirs = other
            .secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .client_secret
            .clone();
        self.secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .client_secret = theirs;
    }

    /// The token to send: the current one while fresh, else a new one.
    pub async fn current(&self, cx: &OAuthContext<'_>) -> Result<Arc<Token>, TokenError> {
        if let Some(t) = self.token.load_full().filter(|t| t.fresh(cx.margin)) {
            return Ok(t);
        }
        self.refresh(cx, None).await
    }

    /// Get a new token, unless another request did while this one waited.
    /// `rejected`: the token the upstream just refused; it is replaced even
    /// if it looks fresh.
    pub async fn refresh(
        &self,
        cx: &OAuthContext<'_>,
        rejected: Option<&Arc<Token>>,
    ) -> Result<Arc<Token>, TokenError> {
        let span = crate::telemetry::trace::Span::child_of_kind(
            "oauth.refresh",
            opentelemetry::trace::SpanKind::Client,
        );
        span.set(|| {
            vec![opentelemetry::KeyValue::new(
                "tessera.credential",
                self.credential.to_string(),
            )]
        });
        let refreshed = span.run(self.refresh_once(cx, rejected)).await;
        if let Err(e) = &refreshed {
            span.error(|| e.to_string());
        }
        refreshed
    }

    /// [`OAuthSource::refresh`], one at a time per credential.
    async fn refresh_once(
        &self,
        cx: &OAuthContext<'_>,
        rejected: Option<&Arc<Token>>,
    ) -> Result<Arc<Token>, TokenError> {
        let _one = self.refreshing.lock().await;
        if let Some(t) = self.token.load_full() {
            let is_rejected = rejected.is_some_and(|r| Arc::ptr_eq(r, &t));
            if !is_rejected && t.fresh(cx.margin) {
                return Ok(t);
            }
        }
        // Across replicas: lock the credential in the store and read what
        // is there. Another replica may have refreshed meanwhile (and
        // rotated the refresh token), so its token and secrets win.
        // Bounded within: the database by `db_timeout`, another replica's
        // refresh by its token request and save.
        let locking = cx
            .store
            .begin_oauth_refresh(&self.credential, cx.db_timeout, cx.timeout);
        let mut lock = match locking.await {
            Ok(lock) => Some(lock),
            Err(e) => {
                tracing::warn!(credential = %self.credential, error = %e, "cannot lock the credential in the store; refreshing without the lock");
                None
            }
        };
        if let Some(lock) = lock.as_mut() {
            match timed(cx.db_timeout, lock.stored()).await {
                Ok(stored) => {
                    if let Some(t) = self.adopt(cx, stored, rejected) {
                        tracing::debug!(credential = %self.credential, "OAuth token taken from the store");
                        return Ok(t);
                    }
                }
                Err(e) => {
                    tracing::warn!(credential = %self.credential, error = %e, "reading the stored OAuth token failed")
                }
            }
        }
        let fetched = tokio::time::timeout(cx.timeout, self.fetch(cx.client))
            .await
            .map_err(|_| TokenError::Timeout(cx.timeout.as_millis()))
            .and_then(|r| r);
        cx.metrics.token_refresh(&self.credential, fetched.is_ok());
        let (token, expires_at, rotated) = fetched?;
        let t = Arc::new(
            self.token(&token, expires_at)
                .map_err(|_| TokenError::BadResponse("an unusable access_token"))?,
        );
        self.token.store(Some(t.clone()));
        let persisting = self.persist(cx, lock, &token, expires_at, rotated);
        if let Err(e) = timed(cx.db_timeout, persisting).await {
            // The token works; only the cache (or a rotated refresh token)
            // failed to reach the store. Say so loudly: a lost rotated
            // refresh token means a person must log in again.
            tracing::error!(credential = %self.credential, error = %e, "storing the new OAuth token failed");
        }
        tracing::info!(credential = %self.credential, "OAuth token refreshed");
        Ok(t)
    }

    /// Take up what the store holds: its secrets always (they are the
    /// newest), and its token when it is fresh and not the one `rejected`.
    fn adopt(
        &self,
        cx: &OAuthContext<'_>,
        stored: StoredOAuth,
        rejected: Option<&Arc<Token>>,
    ) -> Option<Arc<Token>> {
        let aad = Sealed::Credential.aad(&self.credential);
        if let Some(secrets) = cx
            .key
            .open(&aad, &stored.sealed_secrets)
            .ok()
            .and_then(|opened| OAuthSecrets::parse(&opened).ok())
        {
            *self.secrets.lock().unwrap_or_else(|p| p.into_inner()) = secrets;
        }
        let (sealed, expires_ms) = stored.token?;
        let value = cx
            .key
            .open(&Sealed::OAuthToken.aad(&self.credential), &sealed)
            .ok()?;
        let expires_at = expires_ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
        let t = self.token(&value, expires_at).ok()?;
        let refused = rejected.is_some_and(|r| r.injection.value == t.injection.value);
        if refused || !t.fresh(cx.margin) {
            return None;
        }
        let t = Arc::new(t);
        self.token.store(Some(t.clone()));
        Some(t)
    }

    async fn persist(
        &self,
        cx: &OAuthContext<'_>,
        lock: Option<OAuthRefresh>,
        token: &SecretString,
        expires_at: Option<SystemTime>,
        rotated: bool,
    ) -> Result<(), StoreError> {
        let ms = expires_at.map(|e| {
            e.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64)
        });
        let sealed_token = cx
            .key
            .seal(&Sealed::OAuthToken.aad(&self.credential), token);
        let sealed_secrets = rotated.then(|| {
            let s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
            s.seal(cx.key, &Sealed::Credential.aad(&self.credential))
        });
        match lock {
            Some(lock) => {
                lock.save(&sealed_token, ms, sealed_secrets.as_deref())
                    .await
            }
            None => {
                cx.store
                    .put_oauth_token(
                        &self.credential,
                        &sealed_token,
                        ms,
                        sealed_secrets.as_deref(),
                    )
                    .await
            }
        }
    }

    /// One token request. Returns the access token, its expiry, and
    /// whether the refresh token was rotated (already swapped in memory).
    async fn fetch(
        &self,
        client: &UpstreamClient,
    ) -> Result<(SecretString, Option<SystemTime>, bool), TokenError> {
        let (client_secret, refresh_token) = {
            let s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
            (s.client_secret.clone(), s.refresh_token.clone())
        };
        let refresh_token = match self.config.grant {
            Grant::ClientCredentials => None,
            Grant::RefreshToken => Some(RefreshToken::new(
                refresh_token.ok_or(TokenError::Missing("refresh token"))?,
            )),
        };
        if client_secret.is_none() && self.config.grant == Grant::ClientCredentials {
            return Err(TokenError::Missing("client secret"));
        }
        let _: Uri = self
            .config
            .token_url
            .as_str()
            .parse()
            .map_err(|_| TokenError::Unreachable("the token URL is not a URI".into()))?;
        let oauth = oauth_client(&self.config.client_id, client_secret.map(ClientSecret::new))
            .set_token_uri(TokenUrl::from_url(self.config.token_url.clone()));
        let scopes = self.config.scopes.iter().cloned().map(Scope::new);
        // `audience` (Auth0 and kin) and `resource` (RFC 8707) are no part
        // of RFC 6749: extra form parameters.
        let extra: Vec<(&str, &str)> = [
            ("audience", self.config.audience.as_deref()),
            ("resource", self.config.resource.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        // A pool of its own: these connections carry the client secret.
        let pool_key = format!("oauth:{}", self.credential);
        let http = OAuthHttp::new(client, &pool_key, MAX_TOKEN_RESPONSE);
        let answered = match &refresh_token {
            None => {
                let mut r = oauth.exchange_client_credentials().add_scopes(scopes);
                for (k, v) in extra {
                    r = r.add_extra_param(k, v);
                }
                r.request_async(&http).await
            }
            Some(rt) => {
                let mut r = oauth.exchange_refresh_token(rt).add_scopes(scopes);
                for (k, v) in extra {
                    r = r.add_extra_param(k, v);
                }
                r.request_async(&http).await
            }
        };
        let a = answered.map_err(|e| self.token_error(e, http.status()))?;
        if let Some((code, description)) = a.refusal() {
            return Err(TokenError::refused(code, description, &self.guard()));
        }
        let token = a.access_token().secret();
        if token.is_empty() {
            return Err(TokenError::BadResponse("no access_token"));
        }
        if a.token_type()
            .0
            .as_deref()
            .is_some_and(|t| !t.eq_ignore_ascii_case("bearer"))
        {
            return Err(TokenError::BadResponse("the token_type is not Bearer"));
        }
        let expires_at = a.expires_in().map(|d| SystemTime::now() + d);
        let rotated = match a.refresh_token() {
            Some(new) if self.config.grant == Grant::RefreshToken => {
                let new = new.secret();
                let mut s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
                let changed = s.refresh_token.as_deref() != Some(new.as_str());
                s.refresh_token = Some(new.clone());
                changed
            }
            _ => false,
        };
        Ok((SecretString::from(token.clone()), expires_at, rotated))
    }

    /// A failed token request as a [`TokenError`]. `status`: what the
    /// endpoint answered, if it did.
    fn token_error(
        &self,
        e: RequestTokenError<ExchangeError, BasicErrorResponse>,
        status: Option<StatusCode>,
    ) -> TokenError {
        match e {
            RequestTokenError::Request(ExchangeError::Send(SendError::Connect(_))) => {
                TokenError::Unreachable("could not connect".into())
            }
            RequestTokenError::Request(ExchangeError::Send(SendError::Http(_))) => {
                TokenError::Unreachable("the HTTP exchange broke".into())
            }
            RequestTokenError::Request(ExchangeError::Body(_)) => {
                TokenError::BadResponse("unreadable or too large")
            }
            // An RFC 6749 §5.2 error response.
            RequestTokenError::ServerResponse(r) => TokenError::refused(
                r.error().as_ref(),
                r.error_description().map(String::as_str),
                &self.guard(),
            ),
            // No JSON the crate could read: on an error status, that status;
            // on a success, no token response. Without a status the request
            // was never sent: the crate could not make one of the URL.
            RequestTokenError::Parse(..) | RequestTokenError::Other(_) => match status {
                Some(s) if !s.is_success() => TokenError::Status(s.as_u16()),
                Some(_) => TokenError::BadResponse("not JSON"),
                None => TokenError::Unreachable("the token URL is not a URI".into()),
            },
        }
    }
}

/// The `oauth2` crate's client for tessera's token requests: errors read
/// as RFC 6749's, answers as [`TokenAnswer`]. Introspection and revocation
/// are not used; their types are the crate's basic ones.
pub(crate) type OAuthClient<HasAuthUrl = EndpointNotSet, HasTokenUrl = EndpointNotSet> =
    oauth2::Client<
        BasicErrorResponse,
        TokenAnswer,
        BasicTokenIntrospectionResponse,
        StandardRevocableToken,
        BasicRevocationErrorResponse,
        HasAuthUrl,
        EndpointNotSet,
        EndpointNotSet,
        EndpointNotSet,
        HasTokenUrl,
    >;

/// A client `client_id`, confidential when it has a secret. A confidential
/// client authenticates with HTTP Basic (RFC 6749 §2.3.1); a public one
/// names itself in the body (what the crate's `BasicAuth` does without a
/// secret).
pub(crate) fn oauth_client(client_id: &str, secret: Option<ClientSecret>) -> OAuthClient {
    let client =
        OAuthClient::new(ClientId::new(client_id.to_string())).set_auth_type(AuthType::BasicAuth);
    match secret {
        Some(s) => client.set_client_secret(s),
        None => client,
    }
}

/// A token endpoint's successful answer, read as tessera always has. The
/// crate's `StandardTokenResponse` wants a `token_type` and an integer
/// `expires_in`; servers send neither always, and some answer 200 with an
/// `error` member. So every member is optional here (an `access_token`
/// missing or null reads as empty), `expires_in` may be a float, any
/// `token_type` is read (the caller decides), and `error` is kept.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TokenAnswer {
    #[serde(default = "no_access_token", deserialize_with = "access_token")]
    access_token: AccessToken,
    #[serde(default)]
    token_type: TokenTypeName,
    expires_in: Option<f64>,
    refresh_token: Option<RefreshToken>,
    error: Option<String>,
    error_description: Option<String>,
}

fn no_access_token() -> AccessToken {
    AccessToken::new(String::new())
}

fn access_token<'de, D: Deserializer<'de>>(d: D) -> Result<AccessToken, D::Error> {
    Ok(AccessToken::new(
        Option::<String>::deserialize(d)?.unwrap_or_default(),
    ))
}

/// A `token_type` as the server wrote it, if it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct TokenTypeName(pub(crate) Option<String>);

impl oauth2::TokenType for TokenTypeName {}

impl TokenAnswer {
    /// The OAuth error of an answer that is one despite its success
    /// status: its code and description.
    pub(crate) fn refusal(&self) -> Option<(&str, Option<&str>)> {
        let code = self.error.as_deref()?;
        Some((code, self.error_description.as_deref()))
    }
}

impl TokenResponse for TokenAnswer {
    type TokenType = TokenTypeName;

    fn access_token(&self) -> &AccessToken {
        &self.access_token
    }

    fn token_type(&self) -> &TokenTypeName {
        &self.token_type
    }

    /// Whole and fractional seconds, capped at 10⁹; none when negative or
    /// not finite.
    fn expires_in(&self) -> Option<Duration> {
        self.expires_in
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(1e9)))
    }

    fn refresh_token(&self) -> Option<&RefreshToken> {
        self.refresh_token.as_ref()
    }

    fn scopes(&self) -> Option<&Vec<Scope>> {
        None
    }
}

/// The `oauth2` crate's HTTP client: its requests go out on tessera's own
/// pooled client ([`UpstreamClient::exchange`]), so the egress rule holds
/// for them, they go only on connections of `pool_key`, and an answer is
/// read up to `max` bytes.
pub(crate) struct OAuthHttp<'a> {
    client: &'a UpstreamClient,
    pool_key: &'a str,
    max: usize,
    /// The status of the last answer as sent (0: none yet).
    status: AtomicU16,
}

impl<'a> OAuthHttp<'a> {
    pub(crate) fn new(client: &'a UpstreamClient, pool_key: &'a str, max: usize) -> Self {
        OAuthHttp {
            client,
            pool_key,
            max,
            status: AtomicU16::new(0),
        }
    }

    /// What the endpoint answered, once it did. The crate tells only 200
    /// from the rest; the status itself is for the error.
    pub(crate) fn status(&self) -> Option<StatusCode> {
        StatusCode::from_u16(self.status.load(Ordering::Relaxed)).ok()
    }

    async fn send(&self, req: oauth2::HttpRequest) -> Result<oauth2::HttpResponse, ExchangeError> {
        let (parts, body) = req.into_parts();
        let mut req = Request::from_parts(parts, Bytes::from(body));
        if let Some(host) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, host);
        }
        if let Some(basic) = req.headers_mut().get_mut(header::AUTHORIZATION) {
            basic.set_sensitive(true);
        }
        let answer = self.client.exchange(req, self.pool_key, self.max).await?;
        self.status.store(answer.status.as_u16(), Ordering::Relaxed);
        let mut resp = http::Response::new(answer.body.to_vec());
        // Any 2xx is a token response, as tessera has always read it; the
        // crate takes only 200 as one.
        *resp.status_mut() = if answer.status.is_success() {
            StatusCode::OK
        } else {
            answer.status
        };
        // The crate refuses an answer whose Content-Type is not JSON's;
        // tessera reads the body as JSON whatever its label says (servers
        // answer `text/plain` or `application/x-json` too), as it always
        // has. Without the header the crate does the same.
        *resp.headers_mut() = answer.headers;
        resp.headers_mut().remove(header::CONTENT_TYPE);
        Ok(resp)
    }
}

impl<'c> oauth2::AsyncHttpClient<'c> for OAuthHttp<'_> {
    type Error = ExchangeError;
    type Future =
        Pin<Box<dyn Future<Output = Result<oauth2::HttpResponse, ExchangeError>> + Send + 'c>>;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(self.send(request))
    }
}

/// `Authorization: Bearer <token>`, with a redactor for the token.
fn bearer(token: &SecretString) -> Result<Injection, crate::credentials::CredentialError> {
    injection(Scheme::Bearer, None, None, token)
}

/// What the server said, cut to printable ASCII and 200 characters (for
/// the log).
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_code_never_a_secret() {
        let guard = Redactor::new([&SecretString::from("rt-Zq8mX1vP-refresh".to_string())]);
        let e = TokenError::refused(
            "invalid_grant",
            Some("refresh token rt-Zq8mX1vP-refresh revoked"),
            &guard,
        );
        assert_eq!(e.to_string(), "the token endpoint refused: invalid_grant");
        let detail = e.detail().unwrap();
        assert!(
            detail.starts_with("invalid_grant: refresh token ["),
            "{detail}"
        );
        assert!(!detail.contains("Zq8mX1vP"), "{detail}");
        let e = TokenError::refused("rt-Zq8mX1vP-refresh", None, &guard);
        assert_eq!(
            e.to_string(),
            "the token endpoint refused: an unrecognized OAuth error"
        );
        assert!(!e.detail().unwrap().contains("Zq8mX1vP"));
        assert_eq!(printable("bad\r\nX-Injected: 1\u{7}"), "badX-Injected: 1");
        assert_eq!(printable(&"x".repeat(500)).len(), 200);
    }

    #[test]
    fn freshness_honours_the_margin() {
        let inj = bearer(&SecretString::from("t".to_string())).unwrap();
        let t = Token {
            injection: inj.clone(),
            expires_at: Some(SystemTime::now() + Duration::from_secs(30)),
        };
        assert!(t.fresh(Duration::from_secs(10)));
        assert!(!t.fresh(Duration::from_secs(60)));
        let forever = Token {
            injection: inj,
            expires_at: None,
        };
        assert!(forever.fresh(Duration::from_secs(3600)));
    }

    /// The redactor's idea of the client's Basic credentials is what the
    /// `oauth2` crate sends (RFC 6749 §2.3.1 encoding), even for an id and
    /// secret with characters the form encoding changes.
    #[tokio::test]
    async fn the_guard_knows_the_basic_credentials_the_crate_sends() {
        let (id, secret) = ("tessera client:1", "cs+/=:&%Zq8mX1vP é");
        let config = OAuthConfig {
            token_url: Url::parse("https://as.example/token").unwrap(),
            client_id: id.into(),
            scopes: vec![],
            audience: None,
            resource: None,
            grant: Grant::ClientCredentials,
        };
        let secrets = OAuthSecrets {
            client_secret: Some(secret.into()),
            refresh_token: None,
        };
        let source = OAuthSource::new("c", config.clone(), secrets, None);
        let sent = Mutex::new(None);
        let http = |req: oauth2::HttpRequest| {
            *sent.lock().unwrap() = req.headers().get(header::AUTHORIZATION).cloned();
            async { Ok::<_, std::io::Error>(http::Response::new(b"{}".to_vec())) }
        };
        let _ = oauth_client(id, Some(ClientSecret::new(secret.into())))
            .set_token_uri(TokenUrl::from_url(config.token_url))
            .exchange_client_credentials()
            .request_async(&http)
            .await;
        let sent = sent
            .lock()
            .unwrap()
            .take()
            .expect("an Authorization header");
        let (_, basic) = source.basic_value().unwrap();
        assert_eq!(
            sent.to_str().unwrap(),
            format!("Basic {}", basic.expose_secret())
        );
    }

    /// Token answers read as tessera always has: a float `expires_in`, no
    /// `token_type`, a null `access_token`, an `error` in a 200 answer.
    #[test]
    fn token_answers_read_leniently() {
        let read = |s: &str| serde_json::from_str::<TokenAnswer>(s).unwrap();
        let a = read(r#"{"access_token":"at","expires_in":1.5,"refresh_token":"rt"}"#);
        assert_eq!(a.access_token().secret(), "at");
        assert_eq!(a.expires_in(), Some(Duration::from_millis(1500)));
        assert_eq!(a.token_type().0, None);
        assert_eq!(a.refresh_token().unwrap().secret(), "rt");
        assert!(a.refusal().is_none());
        let a = read(r#"{"access_token":null,"token_type":"mac","expires_in":-1}"#);
        assert_eq!(a.access_token().secret(), "");
        assert_eq!(a.token_type().0.as_deref(), Some("mac"));
        assert_eq!(a.expires_in(), None);
        let a = read(r#"{"error":"invalid_grant","error_description":"gone"}"#);
        assert_eq!(a.refusal(), Some(("invalid_grant", Some("gone"))));
        assert_eq!(a.access_token().secret(), "");
        assert!(serde_json::from_str::<TokenAnswer>(r#"{"expires_in":"60"}"#).is_err());
    }

    #[test]
    fn secrets_never_print() {
        let s = OAuthSecrets {
            client_secret: Some("cs-123".into()),
            refresh_token: Some("rt-456".into()),
        };
        let d = format!("{s:?}");
        assert!(!d.contains("cs-123") && !d.contains("rt-456"), "{d}");
    }
}
