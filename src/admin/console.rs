//! The approvals console: a small server-rendered page on the admin
//! listener (`/ui`) where a person sees the calls held for approval and the
//! recent audit trail, and grants or denies each held call with one click.
//!
//! - Sign-in takes an admin token in a form and sets a session cookie
//!   (`HttpOnly`, `SameSite=Strict`, path `/ui`); the token itself never
//!   goes into the cookie. A session lasts 8 hours and ends at once when
//!   its admin token is revoked (checked on every request).
//! - Every form that changes something carries the session's CSRF token,
//!   and every POST must come from the console's own origin (`Origin`).
//! - Everything shown is HTML-escaped: tool names and arguments come from
//!   agents and may be hostile. A strict Content-Security-Policy allows no
//!   script at all; the page needs none.
//! - Grants and denials go through the same service layer as the CLI and
//!   the API, recorded in the admin audit trail under the token's name.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::extract::{Form, Path, Query, State as AxState};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use crate::admin::service::{self, AdminError};
use crate::crypto::keyring::ExposeSecret;
use crate::crypto::tokens::token_digest;
use crate::state::State;
use crate::store::StoreError;

const COOKIE: &str = "tessera_ui";
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most; the oldest goes first (a flood of sign-ins with
/// a valid token cannot grow memory without bound).
const MAX_SESSIONS: usize = 1024;
/// Pending approvals shown on one page; the page links to the next.
const PAGE: i64 = 100;
/// Decisions on the approvals page, and on one page of `/ui/decisions`.
const RECENT: i64 = 20;
const DECISIONS_PAGE: i64 = 50;
/// How often the approvals page reloads itself, so a person watching it
/// sees new held calls without a script (a `<meta>` refresh; the CSP
/// allows no script).
const REFRESH_S: u32 = 15;

/// One signed-in browser.
struct Session {
    admin: String,
    token_sha256: [u8; 32],
    csrf: String,
    expires: Instant,
}

/// The console's sessions, in this process's memory (a replica's console
/// signs in on that replica).
#[derive(Clone)]
struct Console {
    state: Arc<State>,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
}

/// The console's routes, for the admin router.
pub fn router<S: Clone + Send + Sync + 'static>(state: Arc<State>) -> Router<S> {
    let console = Console {
        state,
        sessions: Arc::default(),
    };
    Router::new()
        .route("/ui", get(page))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/approvals/{id}/{decision}", post(decide))
        .route("/ui/decisions", get(decisions_page))
        .route("/ui/credentials", get(credentials_page))
        .route("/ui/callers", get(callers_page))
        .route("/ui/connections", get(connections_page))
        .route("/ui/tools", get(tools_page))
        .route("/ui/tools/{decision}", post(review_tool))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(console)
}

/// No script, no framing, no caching, no referrer to other sites. (Not
/// `no-referrer`: with it a browser sends `Origin: null` on the console's own
/// forms, which the origin check refuses.)
async fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

impl Console {
    /// The session this request's cookie names, if it is live and its
    /// admin token still is.
    async fn session(&self, headers: &HeaderMap) -> Option<(String, String)> {
        self.signed_in(headers).await.map(|s| (s.admin, s.csrf))
    }

    /// [`Console::session`] with the admin token's role.
    async fn signed_in(&self, headers: &HeaderMap) -> Option<SignedIn> {
        let id = cookie(headers)?;
        let (admin, digest, csrf) = {
            let mut s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            s.retain(|_, v| v.expires > now);
            let v = s.get(id)?;
            (v.admin.clone(), v.token_sha256, v.csrf.clone())
        };
        match self.state.store.admin_token_role(&digest).await {
            Ok(Some((name, role))) if name == admin => Some(SignedIn {
                admin,
                csrf,
                admin_role: role == service::Role::Admin.as_str(),
            }),
            _ => {
                self.sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(id);
                None
            }
        }
    }
}

/// Who is signed in on a request.
struct SignedIn {
    admin: String,
    csrf: String,
    /// The token's role is `admin`; an `approver` sees the approvals and
    /// the decision trail only.
    admin_role: bool,
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// A POST must come from the console's own page: its `Origin` names the
/// host the request was sent to. (SameSite=Strict already keeps the
/// cookie off cross-site requests; this also covers the sign-in form.)
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    match (host, origin) {
        (Some(h), Some(o)) => o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
            .is_some_and(|rest| rest.eq_ignore_ascii_case(h)),
        _ => false,
    }
}

fn random_token() -> String {
    let t = crate::crypto::tokens::new_caller_token();
    t.expose_secret()[4..].to_string()
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login_form() -> Response {
    html(StatusCode::OK, &layout("Sign in", &login_body(None)))
}

fn login_body(error: Option<&str>) -> String {
    let mut b = String::new();
    if let Some(e) = error {
        let _ = write!(b, "<p class=error role=alert>{}</p>", esc(e));
    }
    b.push_str(
        "<form method=post action=/ui/login>\
         <label>Admin token <input type=password name=token autocomplete=off required autofocus></label> \
         <button type=submit>Sign in</button></form>\
         <p class=muted>Make one with <code>tessera admin-token add NAME</code>.</p>",
    );
    b
}

async fn login(
    AxState(c): AxState<Console>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return forbidden();
    }
    let digest = token_digest(f.token.trim().as_bytes());
    let admin = match c.state.store.admin_token_by_digest(&digest).await {
        Ok(Some(name)) => name,
        Ok(None) => {
            let body = login_body(Some("That admin token is unknown or revoked."));
            return html(StatusCode::UNAUTHORIZED, &layout("Sign in", &body));
        }
        Err(e) => {
            tracing::error!(error = %e, "console sign-in: the store failed");
            let body = login_body(Some("The database is unavailable; try again."));
            return html(StatusCode::SERVICE_UNAVAILABLE, &layout("Sign in", &body));
        }
    };
    let id = random_token();
    {
        let mut s = c.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() >= MAX_SESSIONS {
            if let Some(oldest) = s
                .iter()
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| k.clone())
            {
                s.remove(&oldest);
            }
        }
        s.insert(
            id.clone(),
            Session {
                admin: admin.clone(),
                token_sha256: digest,
                csrf: random_token(),
                expires: Instant::now() + SESSION_TTL,
            },
        );
    }
    tracing::info!(admin = %admin, "console: signed in");
    let mut r = Redirect::to("/ui").into_response();
    let cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={}",
        SESSION_TTL.as_secs()
    );
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a cookie of URL-safe characters"),
    );
    r
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn logout(
    AxState(c): AxState<Console>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    let Some((_, csrf)) = c.session(&headers).await else {
        return Redirect::to("/ui/login").into_response();
    };
    if !same_origin(&headers) || !ct_eq(&f.csrf, &csrf) {
        return forbidden();
    }
    if let Some(id) = cookie(&headers) {
        c.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
    let mut r = Redirect::to("/ui/login").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("tessera_ui=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0"),
    );
    r
}

fn ct_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

async fn decide(
    AxState(c): AxState<Console>,
    headers: HeaderMap,
    Path((id, decision)): Path<(String, String)>,
    Form(f): Form<CsrfForm>,
) -> Response {
    let Some((admin, csrf)) = c.session(&headers).await else {
        return Redirect::to("/ui/login").into_response();
    };
    if !same_origin(&headers) || !ct_eq(&f.csrf, &csrf) {
        return forbidden();
    }
    let store = &c.state.store;
    let done = match decision.as_str() {
        "grant" => {
            service::Admin::new(store, &admin)
                .approval_grant(&id, "10m", 1)
                .await
        }
        "deny" => service::Admin::new(store, &admin)
            .approval_deny(&id)
            .await
            .map(drop),
        _ => return (StatusCode::NOT_FOUND, "no such decision").into_response(),
    };
    match done {
        Ok(()) => Redirect::to("/ui").into_response(),
        Err(e) => {
            let view = View {
                error: Some(&e.to_string()),
                status: StatusCode::CONFLICT,
                before: None,
            };
            render(&c, &admin, &csrf, view).await
        }
    }
}

/// `/ui?before=ID`: the pending approvals listed after `ID` (the last of
/// the previous page).
#[derive(Deserialize)]
struct PageQuery {
    before: Option<String>,
}

async fn page(
    AxState(c): AxState<Console>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Response {
    match c.session(&headers).await {
        Some((admin, csrf)) => {
            let view = View {
                error: None,
                status: StatusCode::OK,
                before: q.before.as_deref(),
            };
            render(&c, &admin, &csrf, view).await
        }
        None => Redirect::to("/ui/login").into_response(),
    }
}

/// What one rendering of the page shows besides the store's rows.
struct View<'a> {
    error: Option<&'a str>,
    status: StatusCode,
    /// The page of pending approvals: after this one (`None`: the first).
    before: Option<&'a str>,
}

async fn render(c: &Console, admin: &str, csrf: &str, view: View<'_>) -> Response {
    let View {
        error,
        status,
        before,
    } = view;
    let store = &c.state.store;
    let (mut pending, recent) = match (
        service::approvals(
            store,
            service::Reveal {
                key: Some(c.state.master_key()),
                snapshot: Some(&c.state.snapshot.load()),
            },
            false,
            before,
            PAGE + 1,
        )
        .await,
        store
            .audit(&crate::store::model::AuditQuery {
                quiet: true,
                limit: RECENT,
                ..Default::default()
            })
            .await,
    ) {
        (Ok(p), Ok(a)) => (p, a),
        (Err(e), _) => return unavailable("Approvals", &e),
        (_, Err(e)) => return unavailable("Approvals", &e),
    };
    let mut b = nav(c.is_admin(admin).await);
    let _ = write!(
        b,
        "<div class=muted>Signed in as <b>{}</b>. \
         <form class=inline method=post action=/ui/logout><input type=hidden name=csrf value=\"{}\">\
         <button type=submit>Sign out</button></form></div>",
        esc(admin),
        esc(csrf)
    );
    if let Some(e) = error {
        let _ = write!(b, "<p class=error role=alert>{}</p>", esc(e));
    }
    // One more than a page was asked for: whether a next page exists.
    let more = pending.len() as i64 > PAGE;
    pending.truncate(PAGE as usize);
    // What approvals that learn make of each pending tool call: what a
    // prediction would do now, and from what evidence (the built-in model,
    // from people's answers so far).
    let questions: Vec<crate::authz::predict::Question> = pending
        .iter()
        .map(|a| crate::authz::predict::Question {
            caller: a.key.caller.clone(),
            connection: a.key.connection.clone(),
            credential: a.credential.clone().unwrap_or_default(),
            tool: a.key.tool.clone(),
            rpc_method: a.key.rpc_method.clone(),
            shape: a.shape.clone().unwrap_or_else(|| "?".into()),
            arguments: None,
        })
        .collect();
    let predictions = c
        .state
        .prediction
        .explain(&questions, crate::telemetry::time::now_ms())
        .await
        .unwrap_or_default();
    b.push_str("<h2>Waiting for a person</h2>");
    if pending.is_empty() && before.is_none() {
        b.push_str("<p id=none>No calls are waiting for approval.</p>");
    } else {
        b.push_str(
            "<table id=pending><tr><th>Approval</th><th>Asked</th><th>Expires</th><th>Caller</th><th>Connection</th><th>Method</th>\
             <th>Tool</th><th>Path and query</th><th>Session</th><th>Params</th><th>Why</th><th>Prediction</th><th></th></tr>",
        );
        for (n, a) in pending.iter().enumerate() {
            let prediction = match predictions.get(n) {
                Some(p) if a.key.rpc_method == "tools/call" => format!(
                    "a new call like this: would {} ({})<br><span class=muted>shape <code>{}</code></span>",
                    p.action.as_str(),
                    esc(&p.grounds()),
                    esc(a.shape.as_deref().unwrap_or("not recorded"))
                ),
                _ => "-".to_string(),
            };
            let params = match (&a.shown.params, &a.arguments) {
                (Some(text), _) | (None, Some(text)) => format!("<code>{}</code>", esc(text)),
                (None, None) if a.key.arguments_sha256.is_empty() => "-".to_string(),
                (None, None) => format!(
                    "<span class=muted>key {}…</span>",
                    esc(a.key.arguments_sha256.get(..15).unwrap_or_default())
                ),
            };
            let target = match (&a.shown.sub_path, &a.shown.query) {
                // Recorded before calls were bound whole.
                (None, _) => "<span class=muted>not recorded</span>".to_string(),
                (Some(p), None) if p.is_empty() => "-".to_string(),
                (Some(p), q) => format!(
                    "<code>{}{}</code>",
                    esc(p),
                    q.as_deref()
                        .map(|q| format!("?{}", esc(q)))
                        .unwrap_or_default()
                ),
            };
            let session = match a.shown.session.as_deref() {
                None => "<span class=muted>not recorded</span>".to_string(),
                Some("") => "none".to_string(),
                Some(f) => format!("<code>{}</code>", esc(f)),
            };
            let id = esc(&a.id);
            let _ = write!(
                b,
                "<tr data-approval=\"{id}\"><td><code>{id}</code></td><td>{}</td><td class=expires>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td>\
                 <td><b>{}</b></td><td>{target}</td><td>{session}</td><td>{params}</td><td>{}</td><td class=prediction>{prediction}</td><td class=actions>\
                 <form class=inline method=post action=\"/ui/approvals/{id}/grant\">\
                 <input type=hidden name=csrf value=\"{csrf}\"><button type=submit class=grant>Grant</button></form> \
                 <form class=inline method=post action=\"/ui/approvals/{id}/deny\">\
                 <input type=hidden name=csrf value=\"{csrf}\"><button type=submit class=deny>Deny</button></form>\
                 </td></tr>",
                time(a.created_at),
                a.expires_at.map_or_else(|| "-".to_string(), time),
                esc(&a.key.caller),
                esc(&a.key.connection.chars().take(8).collect::<String>()),
                esc(&a.key.rpc_method),
                esc(&a.key.tool),
                esc(a.reason.as_deref().unwrap_or("-")),
                csrf = esc(csrf),
            );
        }
        b.push_str(
            "</table><p class=muted>A grant lets that exact call run once within 10 minutes: \
             the same tool, params, path, query and session.</p>",
        );
        b.push_str("<p id=pages>");
        if before.is_some() {
            b.push_str("<a href=\"/ui\">First page</a> ");
        }
        if let (true, Some(last)) = (more, pending.last()) {
            let _ = write!(
                b,
                "<a id=next href=\"/ui?before={}\">Next page</a>",
                esc(&urlencoding(&last.id))
            );
        }
        b.push_str("</p>");
    }
    b.push_str("<h2>Recent decisions</h2>");
    decisions_table(&mut b, recent.iter().rev());
    b.push_str(
        "<p class=muted><a href=\"/ui/decisions\">All decisions</a> \
         (initialize and notifications are left out here)</p>",
    );
    // A page showing an error stays put; otherwise it reloads itself.
    let head = match error {
        None => format!("<meta http-equiv=refresh content={REFRESH_S}>"),
        Some(_) => String::new(),
    };
    html(status, &layout_head("Approvals", &head, &b))
}

/// Links to the console's pages: the credential, caller and connection
/// pages only for an admin token (an approver sees approvals and the
/// decision trail).
fn nav(admin_role: bool) -> String {
    let mut n = String::from(
        "<nav><a href=\"/ui\">Approvals</a> · <a href=\"/ui/decisions\">Decisions</a>",
    );
    if admin_role {
        n.push_str(
            " · <a href=\"/ui/credentials\">Credentials</a> · <a href=\"/ui/callers\">Callers</a> · \
             <a href=\"/ui/connections\">Connections</a> · <a href=\"/ui/tools\">Tools</a>",
        );
    }
    n.push_str("</nav>");
    n
}

impl Console {
    /// Whether the admin token named `admin` has the admin role.
    async fn is_admin(&self, admin: &str) -> bool {
        self.state
            .store
            .admin_tokens()
            .await
            .ok()
            .and_then(|t| t.into_iter().find(|t| t.name == admin))
            .is_some_and(|t| t.role == service::Role::Admin.as_str())
    }
}

/// Audit records as a table, in the order given.
fn decisions_table<'a>(
    b: &mut String,
    records: impl Iterator<Item = &'a crate::store::model::AuditRecord>,
) {
    b.push_str(
        "<table id=audit><tr><th>Time</th><th>Caller</th><th>Connection</th>\
         <th>Method</th><th>Tool</th><th>Verdict</th><th>Status</th><th>Reason</th>\
         <th>Request</th></tr>",
    );
    for r in records {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>\
             <td class=\"v-{}\">{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            time(r.at),
            esc(&r.caller),
            esc(&r.connection.chars().take(8).collect::<String>()),
            esc(r.rpc_method.as_deref().unwrap_or(&r.http_method)),
            esc(r.tool.as_deref().unwrap_or("-")),
            esc(&r.verdict),
            esc(&r.verdict),
            r.status,
            esc(r.reason.as_deref().unwrap_or("-")),
            esc(r.request_id.as_deref().unwrap_or("-")),
        );
    }
    b.push_str("</table>");
}

/// `/ui/decisions?caller=NAME&all=1&before=ID`: the decision trail, newest
/// first, a page at a time; `initialize` and `notifications/*` hidden
/// unless `all`.
#[derive(Deserialize)]
struct DecisionsQuery {
    before: Option<i64>,
    caller: Option<String>,
    all: Option<String>,
}

async fn decisions_page(
    AxState(c): AxState<Console>,
    headers: HeaderMap,
    Query(q): Query<DecisionsQuery>,
) -> Response {
    let Some(who) = c.signed_in(&headers).await else {
        return Redirect::to("/ui/login").into_response();
    };
    let caller = q.caller.filter(|s| !s.trim().is_empty());
    let all = q.all.is_some();
    let query = crate::store::model::AuditQuery {
        caller: caller.clone(),
        before_id: q.before,
        quiet: !all,
        // One more than a page: whether an older page exists.
        limit: DECISIONS_PAGE + 1,
        ..Default::default()
    };
    let mut rows = match c.state.store.audit(&query).await {
        Ok(r) => r,
        Err(e) => return unavailable("Decisions", &e),
    };
    let older = rows.len() as i64 > DECISIONS_PAGE;
    if older {
        rows.remove(0);
    }
    let mut b = nav(who.admin_role);
    let _ = write!(
        b,
        "<form id=filter method=get action=/ui/decisions>\
         <label>Caller <input name=caller value=\"{}\"></label> \
         <label><input type=checkbox name=all value=1{}> Show initialize and notifications</label> \
         <button type=submit>Filter</button></form>",
        esc(caller.as_deref().unwrap_or("")),
        if all { " checked" } else { "" },
    );
    decisions_table(&mut b, rows.iter().rev());
    let keep = |before: Option<i64>| {
        let mut qs = url::form_urlencoded::Serializer::new(String::new());
        if let Some(c) = &caller {
            qs.append_pair("caller", c);
        }
        if all {
            qs.append_pair("all", "1");
        }
        if let Some(id) = before {
            qs.append_pair("before", &id.to_string());
        }
        esc(&qs.finish())
    };
    b.push_str("<p id=pages>");
    if q.before.is_some() {
        let _ = write!(b, "<a href=\"/ui/decisions?{}\">Newest</a> ", keep(None));
    }
    if let (true, Some(oldest)) = (older, rows.first()) {
        let _ = write!(
            b,
            "<a id=older href=\"/ui/decisions?{}\">Older</a>",
            keep(Some(oldest.id))
        );
    }
    b.push_str("</p>");
    html(StatusCode::OK, &layout("Decisions", &b))
}

/// A read-only table page for a signed-in person.
async fn listing(
    c: &Console,
    headers: &HeaderMap,
    title: &str,
    rows: Result<(Vec<&str>, Vec<Vec<String>>), service::AdminError>,
) -> Response {
    let Some(who) = c.signed_in(headers).await else {
        return Redirect::to("/ui/login").into_response();
    };
    if !who.admin_role {
        return html(
            StatusCode::FORBIDDEN,
            &layout(
                "Refused",
                "<p class=error role=alert>This admin token has the approver role: it sees the approvals and the decision trail only.</p><p><a href=/ui>Approvals</a></p>",
            ),
        );
    }
    let (head, rows) = match rows {
        Ok(r) => r,
        Err(e) => return unavailable(title, &e),
    };
    let mut b = nav(true);
    let _ = write!(b, "<table id=listing><tr>");
    for h in head {
        let _ = write!(b, "<th>{}</th>", esc(h));
    }
    b.push_str("</tr>");
    for row in &rows {
        b.push_str("<tr>");
        for cell in row {
            let _ = write!(b, "<td>{}</td>", esc(cell));
        }
        b.push_str("</tr>");
    }
    b.push_str("</table>");
    if rows.is_empty() {
        b.push_str("<p class=muted>None yet.</p>");
    }
    html(StatusCode::OK, &layout(title, &b))
}

async fn credentials_page(AxState(c): AxState<Console>, headers: HeaderMap) -> Response {
    let rows = service::credentials(&c.state.store).await.map(|rows| {
        let head = vec!["Name", "Upstream", "Scheme", "Created"];
        let rows = rows
            .into_iter()
            .map(|r| vec![r.name, r.upstream, r.scheme, time(r.created_at * 1000)])
            .collect();
        (head, rows)
    });
    listing(&c, &headers, "Credentials", rows).await
}

async fn callers_page(AxState(c): AxState<Console>, headers: HeaderMap) -> Response {
    let rows = service::callers(&c.state.store).await.map(|rows| {
        let head = vec!["Name", "State", "Groups", "Created"];
        let rows = rows
            .into_iter()
            .map(|r| {
                let state = if r.revoked_at.is_some() {
                    "revoked"
                } else {
                    "live"
                };
                vec![
                    r.name,
                    state.into(),
                    r.groups.join(", "),
                    time(r.created_at * 1000),
                ]
            })
            .collect();
        (head, rows)
    });
    listing(&c, &headers, "Callers", rows).await
}

async fn connections_page(AxState(c): AxState<Console>, headers: HeaderMap) -> Response {
    let public_url = &c.state.config.public_url;
    let rows = service::connections(&c.state.store, public_url)
        .await
        .map(|rows| {
            let head = vec!["URL", "Caller", "Credential", "State", "Created"];
            let rows = rows
                .into_iter()
                .map(|r| {
                    let state = r.state.as_str().to_string();
                    vec![
                        r.url,
                        r.caller,
                        r.credential,
                        state,
                        time(r.created_at * 1000),
                    ]
                })
                .collect();
            (head, rows)
        });
    listing(&c, &headers, "Connections", rows).await
}

/// `/ui/tools`: every tool awaiting review (changed, new, rejected), per
/// credential, with the diff of its pinned and offered definitions (as
/// text: definitions come from upstreams and may be hostile) and buttons
/// to accept or reject it. Admin role only.
async fn tools_page(AxState(c): AxState<Console>, headers: HeaderMap) -> Response {
    let Some(who) = c.signed_in(&headers).await else {
        return Redirect::to("/ui/login").into_response();
    };
    tools_view(&c, &who, None, StatusCode::OK).await
}

async fn tools_view(
    c: &Console,
    who: &SignedIn,
    error: Option<&str>,
    status: StatusCode,
) -> Response {
    if !who.admin_role {
        return html(
            StatusCode::FORBIDDEN,
            &layout(
                "Refused",
                "<p class=error role=alert>This admin token has the approver role: it sees the approvals and the decision trail only.</p><p><a href=/ui>Approvals</a></p>",
            ),
        );
    }
    let rows = match c.state.store.tool_pins().await {
        Ok(r) => r,
        Err(e) => return unavailable("Tools", &e),
    };
    let mut b = nav(true);
    if let Some(e) = error {
        let _ = write!(b, "<p class=error role=alert>{}</p>", esc(e));
    }
    let mut shown = 0;
    for r in rows.into_iter().filter(|r| r.status != "pinned") {
        shown += 1;
        let (credential, tool, status, seen, offered) = (
            r.credential.clone(),
            r.tool.clone(),
            r.status.clone(),
            time(r.last_seen),
            r.offered_digest.clone().unwrap_or_default(),
        );
        let d = crate::admin::tool_pins::diff_row(r);
        let _ = write!(
            b,
            "<section class=tool><h2>{} <small>on {}</small> <span class=\"s-{}\">{}</span></h2>\
             <p class=muted>last seen {} · offered digest <code>{}</code></p><pre>{}</pre>",
            esc(&tool),
            esc(&credential),
            esc(&status),
            esc(&status),
            esc(&seen),
            esc(&offered),
            esc(&d.diff),
        );
        for (decision, label) in [("accept", "Accept"), ("reject", "Reject")] {
            if decision == "reject" && status == "rejected" {
                continue;
            }
            let _ = write!(
                b,
                "<form method=post action=/ui/tools/{decision} class=inline>\
                 <input type=hidden name=csrf value=\"{}\">\
                 <input type=hidden name=credential value=\"{}\">\
                 <input type=hidden name=tool value=\"{}\">\
                 <input type=hidden name=digest value=\"{}\">\
                 <button type=submit>{label}</button></form> ",
                esc(&who.csrf),
                esc(&credential),
                esc(&tool),
                // Accept pins the definition shown above, not whatever
                // the upstream offers by the time of the click.
                esc(&offered),
            );
        }
        b.push_str("</section>");
    }
    if shown == 0 {
        b.push_str(
            "<p class=muted>No tool awaits review: every tool listed is the one pinned.</p>",
        );
    }
    html(status, &layout("Tools", &b))
}

#[derive(Deserialize)]
struct ToolForm {
    csrf: String,
    credential: String,
    tool: String,
    /// The offered digest of the definition the page showed.
    #[serde(default)]
    digest: String,
}

async fn review_tool(
    AxState(c): AxState<Console>,
    headers: HeaderMap,
    Path(decision): Path<String>,
    Form(f): Form<ToolForm>,
) -> Response {
    let Some(who) = c.signed_in(&headers).await else {
        return Redirect::to("/ui/login").into_response();
    };
    if !same_origin(&headers) || !ct_eq(&f.csrf, &who.csrf) {
        return forbidden();
    }
    if !who.admin_role {
        return tools_view(&c, &who, None, StatusCode::FORBIDDEN).await;
    }
    let admin = service::Admin::new(&c.state.store, &who.admin);
    let done = match decision.as_str() {
        // Only the definition the page showed: a form without its digest
        // (a page from before digests) accepts nothing.
        "accept" if f.digest.is_empty() => Err(
            "This page did not say which definition to accept: nothing was accepted. Review the tool below and accept again.".to_string(),
        ),
        "accept" => match admin
            .tool_accept(&f.credential, Some(&f.tool), Some(&f.digest))
            .await
        {
            Err(AdminError::Store(StoreError::Unchanged { .. }))
                if c.state.store.tool_pins_of(&f.credential).await.is_ok_and(|rows| {
                    rows.iter().any(|r| {
                        r.tool == f.tool
                            && r.status != "pinned"
                            && r.offered_digest.as_deref() != Some(f.digest.as_str())
                    })
                }) =>
            {
                Err(format!(
                    "The definition of tool {:?} on {:?} changed after this page showed it: nothing was accepted. Its new definition is below; review it and accept again.",
                    f.tool, f.credential
                ))
            }
            r => r.map(|_| ()).map_err(|e| e.to_string()),
        },
        "reject" => admin
            .tool_reject(&f.credential, Some(&f.tool))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => return (StatusCode::NOT_FOUND, "no such decision").into_response(),
    };
    match done {
        Ok(()) => Redirect::to("/ui/tools").into_response(),
        Err(e) => tools_view(&c, &who, Some(&e), StatusCode::CONFLICT).await,
    }
}

/// The database failed: say so, log why.
fn unavailable(title: &str, e: &dyn std::fmt::Display) -> Response {
    tracing::error!(error = %e, "console: the store failed");
    let body = "<p class=error role=alert>The database is unavailable; reload to try again.</p>";
    html(StatusCode::SERVICE_UNAVAILABLE, &layout(title, body))
}

fn time(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    let s = crate::telemetry::log::rfc3339(t);
    // Seconds are enough on a page.
    s.get(..19).map(|s| s.replace('T', " ")).unwrap_or(s)
}

fn forbidden() -> Response {
    html(
        StatusCode::FORBIDDEN,
        &layout(
            "Refused",
            "<p class=error role=alert>This form did not come from this console (its origin or CSRF token does not match). Reload the page and try again.</p>",
        ),
    )
}

fn html(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

fn layout(title: &str, body: &str) -> String {
    layout_head(title, "", body)
}

/// [`layout`] with extra `<head>` markup (tessera's own, never escaped).
fn layout_head(title: &str, head: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>{head}\
         <meta name=viewport content=\"width=device-width, initial-scale=1\">\
         <title>{t} · tessera</title><style>\
         body{{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:75rem;padding:0 1rem;color:#1b1b1b}}\
         h1{{font-size:1.3rem}}h2{{font-size:1.1rem;margin-top:2rem}}\
         table{{border-collapse:collapse;width:100%}}th,td{{text-align:left;padding:.35rem .5rem;border-bottom:1px solid #ddd;vertical-align:top}}\
         code{{font-size:.9em;word-break:break-all}}.muted{{color:#666}}.error{{color:#a00;font-weight:600}}\
         form.inline{{display:inline}}button{{font:inherit;padding:.2rem .8rem;cursor:pointer}}\
         .grant{{background:#1a7f37;color:#fff;border:0;border-radius:4px}}.deny{{background:#cf222e;color:#fff;border:0;border-radius:4px}}\
         .v-deny{{color:#a00}}.v-ask{{color:#9a6700}}.v-allow{{color:#1a7f37}}\
         nav{{margin-bottom:1rem}}#filter{{margin:1rem 0}}\
         </style></head><body><h1>tessera · {t}</h1>{body}</body></html>",
        t = esc(title),
    )
}

/// Percent-encode a query value (approval ids need none; this keeps any
/// other text from ending the value).
fn urlencoding(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// HTML-escape text for element content and quoted attributes.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn origin_must_name_the_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7471"));
        assert!(!same_origin(&h), "no Origin");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7471"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; tessera_ui=abc; b=2"),
        );
        assert_eq!(cookie(&h), Some("abc"));
    }
}
