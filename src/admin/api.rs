//! The admin HTTP API, on its own listener (`--admin-listen`, loopback by
//! default), apart from the data plane.
//!
//! - `/v1/…`: JSON endpoints for everything the CLI does, behind an admin
//!   token (`Authorization: Bearer tsa_…`, made by `tessera admin-token
//!   add`). They call the same service layer as the CLI ([`crate::admin::service`]),
//!   so validation and messages are the CLI's, and every action is recorded
//!   in the admin audit trail under the token's name.
//! - `/healthz` (the process answers) and `/readyz` (database reachable,
//!   policies loaded, master key usable): no token, they reveal nothing.
//! - `/metrics`: Prometheus text, behind an admin token (it names callers'
//!   credentials). These three stay for compatibility; probes and scrapers
//!   use the ops listener ([`crate::admin::ops`]), which is always on.
//! - `/openapi.json`: the OpenAPI 3.1 document, generated from the handlers
//!   below so it cannot drift from them.
//! - `/ui`: the approvals console ([`crate::admin::console`]).
//!
//! Secrets travel only in request bodies (never a URL), are sealed before
//! they are stored, and are never echoed; a caller or admin token is in a
//! response body once, when it is created.

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::admin::ops::{self, Ready};
use crate::admin::service::{self, AdminError, CallerView, ConnectionView, CredentialView};
use crate::crypto::keyring::{ExposeSecret, SecretString};
use crate::crypto::tokens::token_digest;
use crate::state::State;
use crate::store::model::AdminAction;
use crate::store::model::Approval;
use crate::store::model::Scheme;
use crate::store::model::{AuditQuery, AuditRecord};
use crate::store::StoreError;

/// The admin token's name, once the request has been authenticated.
#[derive(Debug, Clone)]
pub struct Admin(pub String);

/// An error answer: `{"error": "…"}` with a status a client can act on.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApiError {
    /// What went wrong, in one line a person can act on.
    pub error: String,
    #[serde(skip)]
    status: StatusCode,
}

impl ApiError {
    fn new(status: StatusCode, error: impl Into<String>) -> Self {
        ApiError {
            error: error.into(),
            status,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut r = (status, Json(self)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"tessera-admin\""),
            );
        }
        r
    }
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> Self {
        use AdminError as A;
        let status = match &e {
            A::Store(StoreError::NotFound { .. }) | A::NotTheCallers { .. } => {
                StatusCode::NOT_FOUND
            }
            A::Store(
                StoreError::Duplicate { .. }
                | StoreError::Revoked { .. }
                | StoreError::RevokedName { .. }
                | StoreError::NotRevoked { .. }
                | StoreError::InUse { .. }
                | StoreError::Unchanged { .. },
            ) => StatusCode::CONFLICT,
            // The interactive login is the CLI's; its failures are an
            // outside party's (the authorization server), as upstream ones.
            A::Store(_) | A::Key(_) | A::Login(_) => StatusCode::SERVICE_UNAVAILABLE,
            A::Credential(_)
            | A::BadName(_)
            | A::BadUpstream(..)
            | A::BadConnection(_)
            | A::BadTokenUrl(..)
            | A::Egress(..)
            | A::OAuth(_)
            | A::BadTtl(_)
            | A::BadUses(_)
            | A::BadScheme(_)
            | A::BadRole(_)
            | A::NotForScheme(..)
            | A::NothingToChange
            | A::Refused(_)
            | A::Policies(_) => StatusCode::UNPROCESSABLE_ENTITY,
            A::LogLevel(crate::telemetry::log::LogLevelError::Unavailable) => StatusCode::CONFLICT,
            A::LogLevel(_) => StatusCode::BAD_REQUEST,
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %e, "admin request failed");
        }
        ApiError::new(status, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

// Patterns below: a name (credential, caller, group) as
// `service::check_name` allows, and a connection or approval id.

/// A credential or caller name in the path.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum's Path extractor as a plain String
struct NamePath {
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    name: String,
}

/// A connection or approval id in the path.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct IdPath {
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    id: String,
}

/// A page size, 1 to 1000 (default 100); anything else is refused, not
/// quietly changed.
fn page_size(limit: Option<i64>) -> ApiResult<i64> {
    match limit.unwrap_or(100) {
        n @ 1..=1000 => Ok(n),
        n => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("limit {n}: give 1 to 1000"),
        )),
    }
}

/// A JSON request body whose rejections (not JSON, wrong content type,
/// wrong fields) are answered as [`ApiError`]s like every other error.
struct Body<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(t)) => Ok(Body(t)),
            Err(e) => Err(ApiError::new(e.status(), without_values(&e.body_text()))),
        }
    }
}

/// A body's rejection without the values serde quotes (`` invalid type:
/// string "…" ``, `` integer `…` ``, `` unknown field `…` ``): the value was
/// maybe a secret (`"secret": 1234…`, a token pasted into `groups` or as a
/// key), and the message is answered and may be logged. Names the schema
/// gives (`` missing field `name` ``, `` expected one of `…` ``), the kind
/// of mistake and the position stay.
fn without_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['"', '`']) {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        let q = from.chars().next().expect("found a quote");
        let Some(end) = from[1..].find(q) else {
            out.push(q);
            out.push('…');
            return out;
        };
        let quoted = &from[1..1 + end];
        let value = q == '"'
            || [
                "integer ",
                "point ",
                "boolean ",
                "unknown field ",
                "variant ",
            ]
            .iter()
            .any(|p| out.ends_with(p));
        out.push(q);
        out.push_str(if value { "…" } else { quoted });
        out.push(q);
        rest = &from[2 + end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod body_tests {
    use super::without_values;

    #[test]
    fn a_rejected_body_quotes_no_value() {
        let pasted = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
        for (text, kept) in [
            (format!("secret: invalid type: string \"{pasted}\", expected a sequence at line 1 column 9"), "secret: invalid type: string"),
            ("secret: invalid type: integer `12345678901234567890`, expected a string".to_string(), "expected a string"),
            (format!("unknown field `{pasted}`, expected one of `name`, `groups`"), "expected one of `name`, `groups`"),
            ("missing field `name` at line 1 column 2".to_string(), "missing field `name`"),
        ] {
            let shown = without_values(&text);
            assert!(!shown.contains(pasted) && !shown.contains("1234567890"), "{shown}");
            assert!(shown.contains(kept), "{shown}");
        }
    }
}

/// An optional body: none when the request has no `Content-Type`.
impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::OptionalFromRequest<S>
    for Body<T>
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Option<Self>, ApiError> {
        if !req.headers().contains_key(header::CONTENT_TYPE) {
            return Ok(None);
        }
        <Body<T> as axum::extract::FromRequest<S>>::from_request(req, state)
            .await
            .map(Some)
    }
}

/// Query parameters, rejected as an [`ApiError`].
struct Params<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for Params<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(t)) => Ok(Params(t)),
            Err(e) => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                e.body_text(),
            )),
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "tessera admin API",
        description = "Manage a tessera credential-holding MCP proxy: credentials, callers, connections, approvals, policies and the audit trail."
    ),
    modifiers(&BearerAuth),
    security(("admin_token" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        api.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "admin_token",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some("An admin token from `tessera admin-token add NAME`"))
                        .build(),
                ),
            );
    }
}

/// Every operation behind a token may answer 403 (a token whose role does
/// not allow it); the operations an `approver` token may use say so.
struct Roles;

impl utoipa::Modify for Roles {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{RefOr, ResponseBuilder};
        let forbidden = ResponseBuilder::new()
            .description("This admin token's role does not allow it (an approver token may only list, show and decide approvals and read the audit trail)")
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(utoipa::openapi::Ref::from_schema_name("ApiError")))
                    .build(),
            )
            .build();
        for (path, item) in api.paths.paths.iter_mut() {
            let ops = [
                (http::Method::GET, item.get.as_mut()),
                (http::Method::POST, item.post.as_mut()),
                (http::Method::PUT, item.put.as_mut()),
                (http::Method::PATCH, item.patch.as_mut()),
                (http::Method::DELETE, item.delete.as_mut()),
            ];
            for (method, op) in ops {
                let Some(op) = op else { continue };
                if !op.responses.responses.contains_key("401") {
                    continue;
                }
                op.responses
                    .responses
                    .insert("403".into(), RefOr::T(forbidden.clone()));
                let roles = if approver_may(&method, path) {
                    "Roles: admin, approver."
                } else {
                    "Roles: admin."
                };
                op.description = Some(match op.description.take() {
                    Some(d) if !d.is_empty() => format!("{d}\n\n{roles}"),
                    _ => roles.to_string(),
                });
            }
        }
    }
}

/// Whether an `approver` token may call `method` on `path` (a concrete
/// path, or the document's template): the approvals (list, show, grant,
/// deny, revoke) and the decision audit trail, nothing else.
fn approver_may(method: &http::Method, path: &str) -> bool {
    let rest = path.strip_prefix("/v1/");
    match (method, rest) {
        (&http::Method::GET, Some("approvals" | "audit")) => true,
        (m, Some(rest)) => match rest.strip_prefix("approvals/") {
            Some(tail) => match tail.split_once('/') {
                None => m == http::Method::GET,
                Some((_, "grant" | "deny" | "revoke")) => m == http::Method::POST,
                Some(_) => false,
            },
            None => false,
        },
        _ => false,
    }
}

/// The admin router and its OpenAPI document, built from the same list of
/// handlers.
/// The document with each operation's parameters declared once: utoipa
/// adds a path parameter for the `Path` extractor beside the one `params`
/// declares with its pattern, and OpenAPI forbids the same name and place
/// twice. The declared one (with a schema pattern) is kept.
fn one_parameter_each(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::path::Parameter;
    let has_pattern =
        |p: &Parameter| serde_json::to_value(p).is_ok_and(|v| v["schema"]["pattern"].is_string());
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            let Some(params) = op.parameters.as_mut() else {
                continue;
            };
            let mut kept: Vec<Parameter> = Vec::with_capacity(params.len());
            for p in params.drain(..) {
                let same = kept
                    .iter()
                    .position(|k| k.name == p.name && k.parameter_in == p.parameter_in);
                match same {
                    None => kept.push(p),
                    Some(i) if has_pattern(&p) && !has_pattern(&kept[i]) => kept[i] = p,
                    Some(_) => {}
                }
            }
            *params = kept;
        }
    }
    doc
}

pub fn router(state: Arc<State>) -> Router {
    let (v1, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(list_credentials, add_credential))
        .routes(routes!(update_credential, remove_credential))
        .routes(routes!(set_credential_secret))
        .routes(routes!(list_callers, add_caller))
        .routes(routes!(revoke_caller, update_caller))
        .routes(routes!(rotate_caller_token))
        .routes(routes!(restore_caller))
        .routes(routes!(list_connections, add_connection))
        .routes(routes!(revoke_connection))
        .routes(routes!(list_approvals))
        .routes(routes!(show_approval))
        .routes(routes!(grant_approval))
        .routes(routes!(deny_approval))
        .routes(routes!(revoke_approval))
        .routes(routes!(list_tools))
        .routes(routes!(tool_diff))
        .routes(routes!(accept_tools))
        .routes(routes!(reject_tools))
        .routes(routes!(explain_prediction))
        .routes(routes!(forget_evidence))
        .routes(routes!(query_audit))
        .routes(routes!(admin_audit))
        .routes(routes!(policies_in_force))
        .routes(routes!(check_policies))
        .routes(routes!(reload_policies))
        .routes(routes!(get_log_level, set_log_level))
        .routes(routes!(metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .split_for_parts();
    let mut doc = one_parameter_each(doc);
    // On the whole document: the paths exist only now.
    utoipa::Modify::modify(&Roles, &mut doc);
    let doc = Arc::new(doc);
    v1.route(
        "/openapi.json",
        axum::routing::get(move || {
            let doc = doc.clone();
            async move { Json(doc.as_ref().clone()) }
        }),
    )
    .merge(crate::admin::console::router(state.clone()))
    .fallback(|| async {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no such admin endpoint: see /openapi.json",
        )
    })
    .with_state(state)
}

/// The admin token in `Authorization: Bearer …`, checked against the
/// store's live admin tokens on each request (a revoked token stops at
/// once; the admin plane is not a hot path).
async fn authenticate(
    AxState(state): AxState<Arc<State>>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = bearer(req.headers());
    let Some(token) = token else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "send an admin token as 'Authorization: Bearer <token>' (tessera admin-token add NAME)",
        )
        .into_response();
    };
    match state
        .store
        .admin_token_role(&token_digest(token.as_bytes()))
        .await
    {
        Ok(Some((name, role))) => {
            if role != service::Role::Admin.as_str()
                && !approver_may(req.method(), req.uri().path())
            {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!("admin token {name:?} has the role {role:?}, which may only list, show and decide approvals and read the audit trail"),
                )
                .into_response();
            }
            req.extensions_mut().insert(Admin(name));
            next.run(req).await
        }
        Ok(None) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this admin token is unknown or revoked",
        )
        .into_response(),
        Err(e) => ApiError::from(AdminError::Store(e)).into_response(),
    }
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

// ---- credentials ---------------------------------------------------------

/// A credential to register. `secret` is the bearer token, password or
/// header value (for `oauth2`: the client secret, optional with a refresh
/// token).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCredential {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    name: String,
    /// An http(s) URL without credentials or fragment.
    #[schema(pattern = "^https?://[A-Za-z0-9.-]+(:[1-9][0-9]{0,4})?(/[A-Za-z0-9._~/-]*)?$")]
    upstream: String,
    /// `bearer` (default), `basic`, `header` or `oauth2`.
    #[serde(default = "bearer_scheme")]
    #[schema(pattern = "^(bearer|basic|header|oauth2)$")]
    scheme: String,
    /// The header that carries the secret, with `header`.
    header_name: Option<String>,
    /// The user name, with `basic`.
    username: Option<String>,
    #[schema(value_type = Option<String>, format = Password, min_length = 1)]
    secret: Option<SecretString>,
    /// With `oauth2`: the token endpoint.
    token_url: Option<String>,
    /// With `oauth2`.
    client_id: Option<String>,
    /// With `oauth2`.
    #[serde(default)]
    scopes: Vec<String>,
    /// With `oauth2`.
    audience: Option<String>,
    /// With `oauth2`: use the refresh-token grant.
    #[schema(value_type = Option<String>, format = Password, min_length = 1)]
    refresh_token: Option<SecretString>,
}

fn bearer_scheme() -> String {
    "bearer".into()
}

/// A new secret for a credential.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSecret {
    #[schema(value_type = String, format = Password, pattern = "^[^\\x00-\\x1f\\x7f]+$")]
    secret: SecretString,
}

/// The registered credentials (never their secrets).
#[utoipa::path(get, path = "/v1/credentials", tag = "credentials",
    responses((status = 200, body = Vec<CredentialView>), (status = 401, body = ApiError)))]
async fn list_credentials(AxState(s): AxState<Arc<State>>) -> ApiResult<Json<Vec<CredentialView>>> {
    Ok(Json(service::credentials(&s.store).await?))
}

/// Register an upstream and its credential. The secret is sealed at once
/// and never returned.
#[utoipa::path(post, path = "/v1/credentials", tag = "credentials", request_body = NewCredential,
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 201, body = CredentialView), (status = 409, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn add_credential(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Body(c): Body<NewCredential>,
) -> ApiResult<(StatusCode, Json<CredentialView>)> {
    // Everything the request asks is checked under the record: a refused
    // definition is an admin action that failed.
    service::Admin::new(&s.store, &actor)
        .record(service::Action::CredentialAdd, &c.name, async |st| {
            add_credential_with(&s, st, &c).await
        })
        .await?;
    let view = service::credentials(&s.store)
        .await?
        .into_iter()
        .find(|v| v.name == c.name)
        .ok_or_else(|| {
            ApiError::new(StatusCode::CONFLICT, "the credential was removed meanwhile")
        })?;
    Ok((StatusCode::CREATED, Json(view)))
}

async fn add_credential_with(
    s: &State,
    store: &crate::store::Store,
    c: &NewCredential,
) -> Result<(), AdminError> {
    let key = s.master_key();
    let oauth_fields = c.token_url.is_some()
        || c.client_id.is_some()
        || !c.scopes.is_empty()
        || c.audience.is_some()
        || c.refresh_token.is_some();
    if c.scheme != "oauth2" && oauth_fields {
        return Err(AdminError::OAuth(
            "token_url, client_id, scopes, audience and refresh_token apply to scheme oauth2 only",
        ));
    }
    if c.scheme == "oauth2" {
        if c.header_name.is_some() || c.username.is_some() {
            return Err(AdminError::OAuth(
                "header_name and username do not apply to scheme oauth2",
            ));
        }
        let spec = service::OAuthSpec {
            name: &c.name,
            egress: s.config.egress,
            upstream: &c.upstream,
            token_url: c
                .token_url
                .as_deref()
                .ok_or(AdminError::OAuth("scheme oauth2 needs token_url"))?,
            client_id: c
                .client_id
                .as_deref()
                .ok_or(AdminError::OAuth("scheme oauth2 needs client_id"))?,
            scopes: c.scopes.clone(),
            audience: c.audience.clone(),
            client_secret: c.secret.clone(),
            refresh_token: c.refresh_token.clone(),
        };
        return service::credential_add_oauth(store, key, spec).await;
    }
    let scheme: Scheme = c
        .scheme
        .parse()
        .map_err(|_| AdminError::BadScheme(c.scheme.clone()))?;
    let secret = c
        .secret
        .clone()
        .filter(|s| !s.expose_secret().is_empty())
        .ok_or(AdminError::OAuth(
            "give the credential's secret in \"secret\"",
        ))?;
    service::credential_add(
        store,
        key,
        service::CredentialSpec {
            name: &c.name,
            egress: s.config.egress,
            upstream: &c.upstream,
            scheme,
            header_name: c.header_name.as_deref(),
            username: c.username.as_deref(),
            secret,
        },
    )
    .await
}

/// Replace a credential's secret; requests use it within one refresh.
#[utoipa::path(put, path = "/v1/credentials/{name}/secret", tag = "credentials", request_body = NewSecret,
    params(NamePath),
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 204), (status = 404, body = ApiError), (status = 422, body = ApiError),
        (status = 401, body = ApiError)))]
async fn set_credential_secret(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
    Body(b): Body<NewSecret>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .credential_set_secret(s.master_key(), &name, b.secret)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A change to a credential: each field changed when present.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialPatch {
    upstream: Option<String>,
    /// Scheme `header` only.
    header_name: Option<String>,
    /// Scheme `basic` only.
    username: Option<String>,
    /// Scheme `oauth2` only: the token endpoint.
    token_url: Option<String>,
    /// Scheme `oauth2` only: the scopes, replacing the old ones.
    scopes: Option<Vec<String>>,
    /// Scheme `oauth2` only: the audience ("" removes it).
    audience: Option<String>,
    /// A new secret (not `oauth2`): required to move the upstream to
    /// another origin.
    #[schema(value_type = Option<String>, format = Password, min_length = 1)]
    secret: Option<SecretString>,
}

/// Change a credential's upstream URL or scheme options (the secret has its
/// own endpoint); requests use the change within one refresh.
#[utoipa::path(patch, path = "/v1/credentials/{name}", tag = "credentials", request_body = CredentialPatch,
    params(NamePath),
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 204), (status = 404, body = ApiError), (status = 422, body = ApiError),
        (status = 401, body = ApiError)))]
async fn update_credential(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
    Body(c): Body<CredentialPatch>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .credential_update(
            s.master_key(),
            service::CredentialChange {
                name: &name,
                egress: s.config.egress,
                upstream: c.upstream.as_deref(),
                header_name: c.header_name.as_deref(),
                username: c.username.as_deref(),
                token_url: c.token_url.as_deref(),
                scopes: c.scopes,
                audience: c.audience.as_deref(),
                secret: c.secret.filter(|s| !s.expose_secret().is_empty()),
            },
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RemoveQuery {
    /// Also remove the connections that use it (else a live one refuses).
    #[serde(default)]
    cascade: bool,
}

/// Remove a credential and its sealed secret; refused (409) while a live
/// connection uses it, unless `cascade=true`, which removes its connections.
#[utoipa::path(delete, path = "/v1/credentials/{name}", tag = "credentials",
    params(NamePath, RemoveQuery),
    responses((status = 204), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 422, body = ApiError),
        (status = 401, body = ApiError)))]
async fn remove_credential(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
    Params(q): Params<RemoveQuery>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .credential_remove(&name, q.cascade)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- callers -------------------------------------------------------------

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCaller {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    name: String,
    /// Groups for policies (`Group::"name"`).
    #[serde(default)]
    #[schema(inline, value_type = Vec<GroupName>)]
    groups: Vec<String>,
}

/// A group name.
#[derive(ToSchema)]
#[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
#[allow(dead_code)]
struct GroupName(String);

/// A new caller and its token: the only time the token is shown.
#[derive(Serialize, ToSchema)]
pub struct CreatedCaller {
    name: String,
    groups: Vec<String>,
    /// The caller's bearer token for its connections. Shown once.
    token: String,
}

#[utoipa::path(get, path = "/v1/callers", tag = "callers",
    responses((status = 200, body = Vec<CallerView>), (status = 401, body = ApiError)))]
async fn list_callers(AxState(s): AxState<Arc<State>>) -> ApiResult<Json<Vec<CallerView>>> {
    Ok(Json(service::callers(&s.store).await?))
}

/// Create a caller; its token is in this response only.
#[utoipa::path(post, path = "/v1/callers", tag = "callers", request_body = NewCaller,
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 201, body = CreatedCaller), (status = 409, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn add_caller(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Body(c): Body<NewCaller>,
) -> ApiResult<(StatusCode, Json<CreatedCaller>)> {
    let token = service::Admin::new(&s.store, &actor)
        .caller_add(&c.name, &c.groups)
        .await?;
    let mut groups = c.groups;
    groups.sort();
    groups.dedup();
    Ok((
        StatusCode::CREATED,
        Json(CreatedCaller {
            name: c.name,
            groups,
            token: token.expose_secret().to_string(),
        }),
    ))
}

/// Revoke a caller: its connections stop working with it. The record stays.
#[utoipa::path(delete, path = "/v1/callers/{name}", tag = "callers", params(NamePath),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 401, body = ApiError)))]
async fn revoke_caller(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .caller_revoke(&name)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A change to a caller: its groups, replaced.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallerPatch {
    #[schema(inline, value_type = Vec<GroupName>)]
    groups: Vec<String>,
}

/// Replace a live caller's groups; policies see them within one refresh.
#[utoipa::path(patch, path = "/v1/callers/{name}", tag = "callers", request_body = CallerPatch, params(NamePath),
    responses((status = 204), (status = 400, body = ApiError), (status = 415, body = ApiError), (status = 404, body = ApiError),
        (status = 409, body = ApiError), (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn update_caller(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
    Body(c): Body<CallerPatch>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .caller_update(&name, &c.groups)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A caller's new token, shown once.
#[derive(Serialize, ToSchema)]
pub struct NewToken {
    name: String,
    token: String,
}

/// Give a live caller a new token, in this response only; the old one
/// stops within a second.
#[utoipa::path(post, path = "/v1/callers/{name}/token", tag = "callers", params(NamePath),
    responses((status = 200, body = NewToken), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 401, body = ApiError)))]
async fn rotate_caller_token(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
) -> ApiResult<Json<NewToken>> {
    let token = service::Admin::new(&s.store, &actor)
        .caller_rotate_token(&name)
        .await?;
    let token = token.expose_secret().to_string();
    Ok(Json(NewToken { name, token }))
}

/// Make a revoked caller live again under a new token, in this response
/// only (the old token stays dead); its connections serve it again, except
/// those revoked one by one.
#[utoipa::path(post, path = "/v1/callers/{name}/restore", tag = "callers", params(NamePath),
    responses((status = 200, body = NewToken), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 401, body = ApiError)))]
async fn restore_caller(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
) -> ApiResult<Json<NewToken>> {
    let token = service::Admin::new(&s.store, &actor)
        .caller_restore(&name)
        .await?;
    let token = token.expose_secret().to_string();
    Ok(Json(NewToken { name, token }))
}

// ---- connections ---------------------------------------------------------

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewConnection {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    caller: String,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    credential: String,
}

/// A new connection: the address to give the caller's agent.
#[derive(Serialize, ToSchema)]
pub struct CreatedConnection {
    id: String,
    url: String,
    caller: String,
    credential: String,
}

#[utoipa::path(get, path = "/v1/connections", tag = "connections",
    responses((status = 200, body = Vec<ConnectionView>), (status = 401, body = ApiError)))]
async fn list_connections(AxState(s): AxState<Arc<State>>) -> ApiResult<Json<Vec<ConnectionView>>> {
    Ok(Json(
        service::connections(&s.store, &s.config.public_url).await?,
    ))
}

/// Allocate an address binding a live caller to a credential.
#[utoipa::path(post, path = "/v1/connections", tag = "connections", request_body = NewConnection,
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 201, body = CreatedConnection), (status = 404, body = ApiError),
        (status = 409, body = ApiError), (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn add_connection(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Body(c): Body<NewConnection>,
) -> ApiResult<(StatusCode, Json<CreatedConnection>)> {
    let url = service::Admin::new(&s.store, &actor)
        .connection_add(&s.config.public_url, &c.caller, &c.credential)
        .await?;
    let id = service::connection_id(&url)?.to_string();
    Ok((
        StatusCode::CREATED,
        Json(CreatedConnection {
            id,
            url,
            caller: c.caller,
            credential: c.credential,
        }),
    ))
}

#[utoipa::path(delete, path = "/v1/connections/{id}", tag = "connections", params(IdPath),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn revoke_connection(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .connection_revoke(&id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- approvals -----------------------------------------------------------

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ApprovalsQuery {
    /// Granted and denied approvals too, not only pending ones.
    #[serde(default)]
    all: bool,
    /// At most this many, newest first (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// The next page: those listed after this approval id (the last of
    /// the previous page).
    before: Option<String>,
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    /// How long the grant lasts: `30s`, `10m` (default), `1h`, `7d`.
    #[schema(pattern = "^[1-9][0-9]{0,5}[smhd]$")]
    ttl: Option<String>,
    /// How many times the call may run within the ttl (default 1).
    #[schema(value_type = Option<i64>, minimum = 1)]
    uses: Option<serde_json::Number>,
}

/// Calls held for a person's approval, newest first.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalsQuery),
    responses((status = 422, body = ApiError), (status = 200, body = Vec<Approval>), (status = 401, body = ApiError)))]
async fn list_approvals(
    AxState(s): AxState<Arc<State>>,
    Params(q): Params<ApprovalsQuery>,
) -> ApiResult<Json<Vec<Approval>>> {
    let limit = page_size(q.limit)?;
    Ok(Json(
        service::approvals(
            &s.store,
            service::Reveal {
                key: Some(s.master_key()),
                snapshot: Some(&s.snapshot.load()),
            },
            q.all,
            q.before.as_deref(),
            limit,
        )
        .await?,
    ))
}

/// One approval, whatever its state: the held call (its complete params,
/// opened from the sealed copy), the id the model quotes, who decided and
/// when.
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals", params(IdPath),
    responses((status = 200, body = Approval), (status = 404, body = ApiError), (status = 401, body = ApiError)))]
async fn show_approval(
    AxState(s): AxState<Arc<State>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Approval>> {
    Ok(Json(
        service::approval(
            &s.store,
            service::Reveal {
                key: Some(s.master_key()),
                snapshot: Some(&s.snapshot.load()),
            },
            &id,
        )
        .await?,
    ))
}

/// Allow the held call (same tool, params, sub-path, query and session) to
/// run. 409 unless the approval is pending (a denial stands; an expired,
/// used or revoked one is final).
#[utoipa::path(post, path = "/v1/approvals/{id}/grant", tag = "approvals",
    params(IdPath), request_body(content = Option<GrantBody>),
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn grant_approval(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(id): Path<String>,
    body: Option<Body<Option<GrantBody>>>,
) -> ApiResult<StatusCode> {
    let b = body.and_then(|Body(b)| b).unwrap_or_default();
    let ttl = b.ttl.as_deref().unwrap_or("10m");
    // JSON has one number type: 2.0 is the integer 2.
    let uses = match &b.uses {
        None => 1,
        Some(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("uses {n}: give a whole number"),
                )
            })?,
    };
    service::Admin::new(&s.store, &actor)
        .approval_grant(&id, ttl, uses)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Refuse a pending call (the denial stands), or revoke a live grant. 409
/// when its state allows neither (denied, used, expired, revoked).
#[utoipa::path(post, path = "/v1/approvals/{id}/deny", tag = "approvals", params(IdPath),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 401, body = ApiError)))]
async fn deny_approval(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .approval_deny(&id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// End a live grant. 409 unless the approval is granted and not used up
/// or expired.
#[utoipa::path(post, path = "/v1/approvals/{id}/revoke", tag = "approvals", params(IdPath),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 401, body = ApiError)))]
async fn revoke_approval(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .approval_revoke(&id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- tool pinning ----------------------------------------------------------

use crate::admin::tool_pins::{self, ToolDiff, ToolView};

/// A credential's tools as pinning sees them: `pinned`, `changed` (its
/// upstream offers another definition than the one pinned), `new` (not
/// pinned yet) or `rejected` (kept hidden), with first and last seen and
/// the pinned and offered digests. 404: no credential of that name.
#[utoipa::path(get, path = "/v1/credentials/{name}/tools", tag = "tools", params(NamePath),
    responses((status = 200, body = Vec<ToolView>), (status = 404, body = ApiError), (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn list_tools(
    AxState(s): AxState<Arc<State>>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<ToolView>>> {
    Ok(Json(tool_pins::tools(&s.store, &name).await?))
}

/// Which tool (its name as listed: any text, so not in the path).
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ToolQuery {
    #[param(min_length = 1)]
    tool: String,
}

/// A tool's pinned and offered definitions, their digests and their
/// unified diff. Accept with `offered_digest` to pin this definition only.
#[utoipa::path(get, path = "/v1/credentials/{name}/tools/diff", tag = "tools", params(NamePath, ToolQuery),
    responses((status = 200, body = ToolDiff), (status = 404, body = ApiError), (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn tool_diff(
    AxState(s): AxState<Arc<State>>,
    Path(name): Path<String>,
    Params(q): Params<ToolQuery>,
) -> ApiResult<Json<ToolDiff>> {
    Ok(Json(tool_pins::tool_diff(&s.store, &name, &q.tool).await?))
}

/// Which tools to accept or reject: one by name, or every one awaiting
/// review (`all`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolReview {
    #[schema(min_length = 1)]
    tool: Option<String>,
    #[serde(default)]
    all: bool,
}

/// Which tools to accept: one by name, or every one awaiting review
/// (`all`, as offered now). With `digest` (one tool only), the tool is
/// accepted only while its upstream still offers the definition of that
/// digest (the `offered_digest` of the diff reviewed): else 409 and
/// nothing changes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolAccept {
    #[schema(min_length = 1)]
    tool: Option<String>,
    #[serde(default)]
    all: bool,
    /// Hex SHA-256 of the definition to pin: all 64 digits.
    #[schema(pattern = "^[0-9A-Fa-f]{64}$")]
    digest: Option<String>,
}

/// The tools an acceptance pinned, and the digest each was pinned at.
#[derive(Serialize, ToSchema)]
pub struct Accepted {
    tools: Vec<String>,
    pinned: Vec<crate::store::tool_pins::PinnedTool>,
}

impl ToolReview {
    fn target(&self) -> ApiResult<Option<&str>> {
        match (&self.tool, self.all) {
            (Some(t), false) if !t.is_empty() => Ok(Some(t)),
            (None, true) => Ok(None),
            _ => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "give either a tool or all: true",
            )),
        }
    }
}

/// The tools a review changed.
#[derive(Serialize, ToSchema)]
pub struct Reviewed {
    tools: Vec<String>,
}

/// Pin the offered definition of a tool (or of every changed or new tool):
/// it is listed and callable again within a second. 409: nothing to
/// review, or `digest` is no longer the definition offered (it changed
/// after it was reviewed; nothing was accepted).
#[utoipa::path(post, path = "/v1/credentials/{name}/tools/accept", tag = "tools", params(NamePath),
    request_body = ToolAccept,
    responses((status = 200, body = Accepted), (status = 400, body = ApiError), (status = 415, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn accept_tools(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
    Body(b): Body<ToolAccept>,
) -> ApiResult<Json<Accepted>> {
    let review = ToolReview {
        tool: b.tool,
        all: b.all,
    };
    let pinned = service::Admin::new(&s.store, &actor)
        .tool_accept(&name, review.target()?, b.digest.as_deref())
        .await?;
    let tools = pinned.iter().map(|p| p.tool.clone()).collect();
    Ok(Json(Accepted { tools, pinned }))
}

/// Keep a tool's offered definition (or every changed or new tool's)
/// hidden: left out of lists and its calls refused until accepted.
#[utoipa::path(post, path = "/v1/credentials/{name}/tools/reject", tag = "tools", params(NamePath),
    request_body = ToolReview,
    responses((status = 200, body = Reviewed), (status = 400, body = ApiError), (status = 415, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn reject_tools(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Path(name): Path<String>,
    Body(b): Body<ToolReview>,
) -> ApiResult<Json<Reviewed>> {
    let tools = service::Admin::new(&s.store, &actor)
        .tool_reject(&name, b.target()?)
        .await?;
    Ok(Json(Reviewed { tools }))
}

// ---- approvals that learn --------------------------------------------------

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExplainQuery {
    /// The caller making the call.
    caller: String,
    /// The connection (id or URL) the call goes to.
    #[param(
        pattern = "^([A-Za-z0-9_-]{1,64}|https?://[^ ]*/c/[A-Za-z0-9_-]{1,64}(/mcp|/sse)?/?)$"
    )]
    connection: String,
    /// The tool called.
    tool: String,
    /// The call's arguments as JSON text (only their names and types count;
    /// 422 when it is not JSON).
    arguments: Option<String>,
}

/// What approvals that learn (`@ask("learn")`) would do with this call now:
/// the predicted probability that a person approves it, the evidence at
/// each level, the thresholds from this serve's costs, and the action.
#[utoipa::path(get, path = "/v1/approval-evidence/explain", tag = "approvals",
    params(ExplainQuery),
    responses((status = 200, body = service::Explanation), (status = 404, body = ApiError),
        (status = 422, body = ApiError), (status = 401, body = ApiError)))]
async fn explain_prediction(
    AxState(s): AxState<Arc<State>>,
    Params(q): Params<ExplainQuery>,
) -> ApiResult<Json<service::Explanation>> {
    let redactor = s
        .snapshot
        .load()
        .connections
        .get(service::connection_id(&q.connection)?)
        .map(|c| c.upstream.redactor());
    let redact = |t: &str| match &redactor {
        Some(r) => r.text(t).into_owned(),
        None => t.to_string(),
    };
    Ok(Json(
        service::explain(
            &s.store,
            &s.config.predict,
            &q.caller,
            &q.connection,
            &q.tool,
            q.arguments.as_deref(),
            redact,
        )
        .await?,
    ))
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct ForgetBody {
    /// Only this caller's answers.
    caller: Option<String>,
    /// Only answers about this tool.
    tool: Option<String>,
    /// Every answer (required when neither caller nor tool is given).
    #[serde(default)]
    all: bool,
}

#[derive(Serialize, ToSchema)]
pub struct Forgotten {
    /// How many answers were dropped.
    forgotten: u64,
}

/// Drop the answers people gave that approvals that learn predict from (a
/// person changed their mind about a class of calls): a caller's, a tool's,
/// or with `all` every one. Recorded in the admin audit.
#[utoipa::path(post, path = "/v1/approval-evidence/forget", tag = "approvals",
    request_body = ForgetBody,
    responses((status = 200, body = Forgotten), (status = 400, body = ApiError),
        (status = 415, body = ApiError), (status = 422, body = ApiError),
        (status = 401, body = ApiError)))]
async fn forget_evidence(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Body(b): Body<ForgetBody>,
) -> ApiResult<Json<Forgotten>> {
    let forgotten = service::Admin::new(&s.store, &actor)
        .approval_forget(b.caller.as_deref(), b.tool.as_deref(), b.all)
        .await?;
    Ok(Json(Forgotten { forgotten }))
}

// ---- audit ---------------------------------------------------------------

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    caller: Option<String>,
    /// A connection id.
    connection: Option<String>,
    /// Records at or after this time (unix milliseconds).
    since_ms: Option<i64>,
    /// A page: the records following this id, oldest first. Without it,
    /// the newest records.
    #[param(minimum = 0)]
    after_id: Option<i64>,
    /// Page size (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only the records of this request (its `X-Request-Id`: 32 hex
    /// digits).
    request_id: Option<String>,
}

/// A page of the decision trail.
#[derive(Serialize, ToSchema)]
pub struct AuditPage {
    records: Vec<AuditRecord>,
    /// Pass as `after_id` for the next page (the last record's id).
    next_after_id: Option<i64>,
}

/// The audit trail of authorization decisions, oldest first within a page.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", params(AuditParams),
    responses((status = 422, body = ApiError), (status = 200, body = AuditPage), (status = 401, body = ApiError)))]
async fn query_audit(
    AxState(s): AxState<Arc<State>>,
    Params(p): Params<AuditParams>,
) -> ApiResult<Json<AuditPage>> {
    if p.after_id.is_some_and(|a| a < 0) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "after_id must be 0 or more",
        ));
    }
    let q = AuditQuery {
        caller: p.caller,
        connection: p.connection,
        since: p.since_ms,
        after_id: p.after_id,
        limit: page_size(p.limit)?,
        request_id: p.request_id,
        ..AuditQuery::default()
    };
    let records = s.store.audit(&q).await.map_err(AdminError::from)?;
    let next_after_id = records.last().map(|r| r.id).or(p.after_id);
    Ok(Json(AuditPage {
        records,
        next_after_id,
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AdminAuditParams {
    /// A page: the actions before this id, newest first.
    #[param(minimum = 0)]
    before_id: Option<i64>,
    /// Page size (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// Admin actions (API and CLI), newest first.
#[utoipa::path(get, path = "/v1/admin-audit", tag = "audit", params(AdminAuditParams),
    responses((status = 422, body = ApiError), (status = 200, body = Vec<AdminAction>), (status = 401, body = ApiError)))]
async fn admin_audit(
    AxState(s): AxState<Arc<State>>,
    Params(p): Params<AdminAuditParams>,
) -> ApiResult<Json<Vec<AdminAction>>> {
    let limit = page_size(p.limit)?;
    if p.before_id.is_some_and(|b| b < 0) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "before_id must be 0 or more",
        ));
    }
    Ok(Json(
        s.store
            .admin_audit(p.before_id, limit)
            .await
            .map_err(AdminError::from)?,
    ))
}

// ---- policies ------------------------------------------------------------

/// The policy set in force on this process.
#[derive(Serialize, ToSchema)]
pub struct PolicySet {
    /// The folder it was read from, or `built-in`.
    origin: String,
    files: Vec<String>,
    ids: Vec<String>,
    /// Why the last reload failed (the set above stays in force).
    last_reload_error: Option<String>,
}

/// Policy texts to validate, as `tessera policy check` does a folder.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyTexts {
    /// File name → Cedar text.
    files: std::collections::BTreeMap<String, String>,
    /// A Cedar schema (default: the built-in one).
    schema: Option<String>,
}

/// A valid policy set.
#[derive(Serialize, ToSchema)]
pub struct PolicyCheck {
    count: usize,
    ids: Vec<String>,
}

#[utoipa::path(get, path = "/v1/policies", tag = "policies",
    responses((status = 200, body = PolicySet), (status = 401, body = ApiError)))]
async fn policies_in_force(AxState(s): AxState<Arc<State>>) -> Json<PolicySet> {
    let p = s.authorizer.policies();
    Json(PolicySet {
        origin: p.origin.clone(),
        files: p.files.clone(),
        ids: p.ids(),
        last_reload_error: s.authorizer.reloads().borrow().last_error.clone(),
    })
}

/// Validate policies against the schema without installing them.
#[utoipa::path(post, path = "/v1/policies/check", tag = "policies", request_body = PolicyTexts,
    responses((status = 400, body = ApiError), (status = 415, body = ApiError), (status = 200, body = PolicyCheck), (status = 422, body = ApiError),
        (status = 401, body = ApiError)))]
async fn check_policies(Body(t): Body<PolicyTexts>) -> ApiResult<Json<PolicyCheck>> {
    let p = crate::authz::cedar::Policies::from_texts(
        "the request",
        t.schema.as_deref(),
        t.files.into_iter().collect(),
    )
    .map_err(|e| ApiError::from(AdminError::Policies(e.to_string())))?;
    Ok(Json(PolicyCheck {
        count: p.len(),
        ids: p.ids(),
    }))
}

/// Ask every serving process on this database to read its policy folder
/// again (as `tessera policy reload`).
#[utoipa::path(post, path = "/v1/policies/reload", tag = "policies",
    responses((status = 202), (status = 401, body = ApiError)))]
async fn reload_policies(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
) -> ApiResult<StatusCode> {
    service::Admin::new(&s.store, &actor)
        .policy_reload()
        .await?;
    Ok(StatusCode::ACCEPTED)
}

// ---- operability ---------------------------------------------------------

/// The log filter: a level (`error`, `warn`, `info`, `debug`, `trace`) or
/// `EnvFilter` directives (`info,tessera::access=warn`).
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LogLevel {
    #[schema(example = "debug", min_length = 1, max_length = 1024)]
    level: String,
}

fn log_filter(s: &State) -> ApiResult<&crate::telemetry::log::LogFilter> {
    s.log_filter.get().map(|f| f.as_ref()).ok_or_else(|| {
        ApiError::from(AdminError::LogLevel(
            crate::telemetry::log::LogLevelError::Unavailable,
        ))
    })
}

/// The log filter in force in this process.
#[utoipa::path(get, path = "/v1/log-level", tag = "operability",
    responses((status = 200, body = LogLevel), (status = 401, body = ApiError),
        (status = 409, body = ApiError)))]
async fn get_log_level(AxState(s): AxState<Arc<State>>) -> ApiResult<Json<LogLevel>> {
    Ok(Json(LogLevel {
        level: log_filter(&s)?.current(),
    }))
}

/// Change this process's log filter at once, without a restart (recorded
/// in the admin audit as `log-level.set`). 400 for a filter that does not
/// parse, with what to give.
#[utoipa::path(put, path = "/v1/log-level", tag = "operability", request_body = LogLevel,
    responses((status = 200, body = LogLevel), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 409, body = ApiError),
        (status = 415, body = ApiError), (status = 422, body = ApiError)))]
async fn set_log_level(
    AxState(s): AxState<Arc<State>>,
    Extension(Admin(actor)): Extension<Admin>,
    Body(body): Body<LogLevel>,
) -> ApiResult<Json<LogLevel>> {
    let log = s.log_filter.get().map(|f| f.as_ref());
    service::Admin::new(&s.store, &actor)
        .log_level(log, &body.level)
        .await?;
    let level = log_filter(&s)?.current();
    // In the log as well as the admin trail: whoever reads the log sees
    // why it grew or went quiet. At warn, so the usual filters keep it.
    tracing::warn!(by = %actor, level = %level, "log level changed");
    Ok(Json(LogLevel { level }))
}

/// Prometheus text format (the ops listener serves the same without a
/// token).
#[utoipa::path(get, path = "/metrics", tag = "operability",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String),
        (status = 401, body = ApiError)))]
async fn metrics(AxState(s): AxState<Arc<State>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, ops::METRICS_CONTENT_TYPE)],
        ops::metrics_text(&s),
    )
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    status: &'static str,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "operability", security(()),
    responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Ready to serve: the database answers and takes the audit trail,
/// policies are loaded, the master key seals and opens. 503 when a check
/// fails (as the ops listener's `/readyz`).
#[utoipa::path(get, path = "/readyz", tag = "operability", security(()),
    responses((status = 200, body = Ready), (status = 503, body = Ready)))]
async fn readyz(AxState(s): AxState<Arc<State>>) -> (StatusCode, Json<Ready>) {
    let r = ops::readiness(&s).await;
    (r.status(), Json(r))
}
