//! The admin service: every admin action (credentials, callers,
//! connections, admin tokens, approvals, key rotation, policy reload), each
//! recorded in the admin audit by [`Admin`], and the listings. The CLI, the
//! admin API and the console all act through it. Separate from the data
//! plane: it writes to the store, and serving processes pick the change up
//! from the revision counter.

use url::Url;

use crate::credentials::injection;
use crate::crypto::keyring::{ExposeSecret, MasterKey, SecretString};
use crate::crypto::tokens::{new_caller_token, new_connection_id, token_digest};
use crate::store::model::NewCredential;
use crate::store::model::Scheme;
use crate::store::model::Sealed;
use crate::store::model::{Approval, Decision, Status};
use crate::store::{Store, StoreError};

/// Why an admin command failed: one line a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Credential(#[from] crate::credentials::CredentialError),
    // Not echoed: a token pasted where a name belongs would be shown and
    // kept in the admin audit.
    #[error("invalid name: use 1 to 64 letters, digits, '.', '_' or '-'")]
    BadName(String),
    #[error("invalid upstream URL {0:?}: {1}")]
    BadUpstream(String, &'static str),
    #[error("{0:?} is neither a connection id nor a tessera connection URL")]
    BadConnection(String),
    /// Explaining a call on a connection that is not the caller's: serve
    /// never gets that far.
    #[error("connection {connection} belongs to caller {owner:?}, not {caller:?}: serve answers {caller:?}'s calls on it 404 before any policy or prediction")]
    NotTheCallers {
        connection: String,
        owner: String,
        caller: String,
    },
    #[error("invalid --token-url {0:?}: {1}")]
    BadTokenUrl(String, &'static str),
    #[error("refused {0} {1:?}: {2}")]
    Egress(&'static str, String, crate::upstream::egress::EgressError),
    #[error("{0}")]
    OAuth(&'static str),
    #[error("{0}")]
    Key(String),
    #[error("invalid ttl {0:?}: give a number and a unit: 30s, 10m, 1h, 7d")]
    BadTtl(String),
    #[error("invalid uses {0}: a grant allows 1 or more uses")]
    BadUses(i64),
    #[error("invalid role {0:?}: use admin or approver")]
    BadRole(String),
    #[error("nothing to change")]
    NothingToChange,
    #[error("{0}")]
    Refused(&'static str),
    #[error("{0} does not apply to a credential of scheme {1}")]
    NotForScheme(&'static str, &'static str),
    // The value is not shown: a secret pasted in its place would be echoed
    // and kept in the admin audit.
    #[error("invalid scheme: use bearer, basic, header or oauth2")]
    BadScheme(String),
    #[error("{0}")]
    Policies(String),
    #[error(transparent)]
    Login(#[from] crate::credentials::login::LoginError),
    #[error("log level: {0}")]
    LogLevel(#[from] crate::telemetry::log::LogLevelError),
}

/// Who an admin action is recorded as done by: an admin token's name on
/// the admin API, `cli` for the command line.
pub const CLI: &str = "cli";

labelled! {
    /// Every admin action, by the name its `admin_audit` row carries.
    pub enum Action {
        CredentialAdd => "credential.add",
        CredentialSetSecret => "credential.set-secret",
        CredentialLogin => "credential.login",
        CallerAdd => "caller.add",
        CredentialUpdate => "credential.update",
        CredentialRemove => "credential.remove",
        CallerRevoke => "caller.revoke",
        CallerRotateToken => "caller.rotate-token",
        CallerUpdate => "caller.update",
        CallerRestore => "caller.restore",
        ConnectionAdd => "connection.add",
        ConnectionRevoke => "connection.revoke",
        AdminTokenAdd => "admin-token.add",
        AdminTokenRevoke => "admin-token.revoke",
        ApprovalGrant => "approval.grant",
        ApprovalDeny => "approval.deny",
        ApprovalRevoke => "approval.revoke",
        ApprovalForget => "approval.forget",
        KeyRotate => "key.rotate",
        PolicyReload => "policy.reload",
        LogLevel => "log-level.set",
        ToolAccept => "tool.accept",
        ToolReject => "tool.reject",
    }
}

/// The admin service as one actor uses it: every method that changes
/// something records itself in the admin audit (actor, action, target,
/// outcome). A success is recorded in the transaction that made the change;
/// a failure, which changed nothing, is recorded when it happens. A record
/// that cannot be written fails the call. The functions that do the work
/// are private to `admin`: there is no unrecorded way to act.
pub struct Admin<'a> {
    store: &'a Store,
    actor: &'a str,
}

impl<'a> Admin<'a> {
    /// `actor`: an admin token's name on the admin API, [`CLI`] for the
    /// command line.
    pub fn new(store: &'a Store, actor: &'a str) -> Self {
        Admin { store, actor }
    }

    /// Do `action` on `target` with a store that records it.
    pub(super) async fn record<T>(
        &self,
        action: Action,
        target: &str,
        work: impl AsyncFnOnce(&Store) -> Result<T, AdminError>,
    ) -> Result<T, AdminError> {
        let acting = self.store.acting(self.actor, action.as_str(), target);
        let done = work(&acting).await;
        let said = match &done {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        acting.record_action(&said).await?;
        done
    }

    pub async fn credential_add(
        &self,
        key: &MasterKey,
        spec: CredentialSpec<'_>,
    ) -> Result<(), AdminError> {
        let name = spec.name;
        self.record(Action::CredentialAdd, name, async |s| {
            credential_add(s, key, spec).await
        })
        .await
    }

    pub async fn credential_add_oauth(
        &self,
        key: &MasterKey,
        spec: OAuthSpec<'_>,
    ) -> Result<(), AdminError> {
        let name = spec.name;
        self.record(Action::CredentialAdd, name, async |s| {
            credential_add_oauth(s, key, spec).await
        })
        .await
    }

    pub async fn credential_set_secret(
        &self,
        key: &MasterKey,
        name: &str,
        secret: SecretString,
    ) -> Result<(), AdminError> {
        self.record(Action::CredentialSetSecret, name, async |s| {
            credential_set_secret(s, key, name, secret).await
        })
        .await
    }

    /// `tessera credential login`: the interactive OAuth flow, whose
    /// stored credential and token are recorded like any other change.
    pub async fn credential_login(
        &self,
        key: &MasterKey,
        client: &crate::upstream::pool::UpstreamClient,
        spec: crate::credentials::login::LoginSpec,
        say: impl FnMut(&str),
    ) -> Result<(), AdminError> {
        let name = spec.name.clone();
        self.record(Action::CredentialLogin, &name, async |s| {
            Ok(crate::credentials::login::login(s, key, client, spec, say).await?)
        })
        .await
    }

    pub async fn caller_add(
        &self,
        name: &str,
        groups: &[String],
    ) -> Result<SecretString, AdminError> {
        self.record(Action::CallerAdd, name, async |s| {
            caller_add(s, name, groups).await
        })
        .await
    }

    pub async fn credential_update(
        &self,
        key: &MasterKey,
        change: CredentialChange<'_>,
    ) -> Result<(), AdminError> {
        let name = change.name;
        self.record(Action::CredentialUpdate, name, async |s| {
            credential_update(s, key, change).await
        })
        .await
    }

    /// Returns how many connections (live or revoked) went with it.
    pub async fn credential_remove(&self, name: &str, cascade: bool) -> Result<u64, AdminError> {
        self.record(Action::CredentialRemove, name, async |s| {
            Ok(s.remove_credential(name, cascade).await?)
        })
        .await
    }

    /// A live caller's new token (the old one stops within a second).
    pub async fn caller_rotate_token(&self, name: &str) -> Result<SecretString, AdminError> {
        self.record(Action::CallerRotateToken, name, async |s| {
            let token = new_caller_token();
            s.set_caller_token(name, &token_digest(token.expose_secret().as_bytes()))
                .await?;
            Ok(token)
        })
        .await
    }

    /// A revoked caller live again, with a new token.
    pub async fn caller_restore(&self, name: &str) -> Result<SecretString, AdminError> {
        self.record(Action::CallerRestore, name, async |s| {
            let token = new_caller_token();
            s.restore_caller(name, &token_digest(token.expose_secret().as_bytes()))
                .await?;
            Ok(token)
        })
        .await
    }

    /// A live caller's groups, replaced by `groups`.
    pub async fn caller_update(&self, name: &str, groups: &[String]) -> Result<(), AdminError> {
        self.record(Action::CallerUpdate, name, async |s| {
            let groups = check_groups(groups)?;
            Ok(s.set_caller_groups(name, &groups).await?)
        })
        .await
    }

    pub async fn caller_revoke(&self, name: &str) -> Result<(), AdminError> {
        self.record(Action::CallerRevoke, name, async |s| {
            caller_revoke(s, name).await
        })
        .await
    }

    /// Returns the connection's URL.
    pub async fn connection_add(
        &self,
        public_url: &Url,
        caller: &str,
        credential: &str,
    ) -> Result<String, AdminError> {
        let target = format!("{caller} on {credential}");
        self.record(Action::ConnectionAdd, &target, async |s| {
            connection_add(s, public_url, caller, credential).await
        })
        .await
    }

    pub async fn connection_revoke(&self, id_or_url: &str) -> Result<(), AdminError> {
        self.record(Action::ConnectionRevoke, id_or_url, async |s| {
            connection_revoke(s, id_or_url).await
        })
        .await
    }

    pub async fn admin_token_add(
        &self,
        name: &str,
        role: Role,
    ) -> Result<SecretString, AdminError> {
        self.record(Action::AdminTokenAdd, name, async |s| {
            admin_token_add(s, name, role).await
        })
        .await
    }

    pub async fn admin_token_revoke(&self, name: &str) -> Result<(), AdminError> {
        self.record(Action::AdminTokenRevoke, name, async |s| {
            admin_token_revoke(s, name).await
        })
        .await
    }

    pub async fn approval_grant(&self, id: &str, ttl: &str, uses: i64) -> Result<(), AdminError> {
        self.record(Action::ApprovalGrant, id, async |s| {
            approval_grant(s, id, ttl, uses).await
        })
        .await
    }

    /// Deny a pending approval, or revoke a live grant: the state it
    /// moved to (`denied` or `revoked`).
    pub async fn approval_deny(&self, id: &str) -> Result<Status, AdminError> {
        self.record(Action::ApprovalDeny, id, async |s| {
            approval_decide(s, id, Decision::Deny).await
        })
        .await
    }

    /// End a live grant.
    pub async fn approval_revoke(&self, id: &str) -> Result<(), AdminError> {
        self.record(Action::ApprovalRevoke, id, async |s| {
            approval_decide(s, id, Decision::Revoke).await.map(drop)
        })
        .await
    }

    /// Drop the answers people gave that approvals that learn predict
    /// from: those of `caller` and/or about `tool`, or (`all`) every one.
    /// Returns how many were dropped.
    pub async fn approval_forget(
        &self,
        caller: Option<&str>,
        tool: Option<&str>,
        all: bool,
    ) -> Result<u64, AdminError> {
        let target = match (caller, tool) {
            (None, None) => "*".to_string(),
            (c, t) => format!("caller={} tool={}", c.unwrap_or("*"), t.unwrap_or("*")),
        };
        self.record(Action::ApprovalForget, &target, async |s| {
            if caller.is_none() && tool.is_none() && !all {
                return Err(AdminError::Refused(
                    "say whose answers to forget: --caller NAME, --tool T, or --all for every answer",
                ));
            }
            if all && (caller.is_some() || tool.is_some()) {
                return Err(AdminError::Refused(
                    "--all forgets every answer: give it alone, or name a caller or a tool",
                ));
            }
            Ok(s.forget_evidence(caller, tool).await?)
        })
        .await
    }

    pub async fn key_rotate(
        &self,
        key: &MasterKey,
        new_key: Option<String>,
        progress: impl FnMut(usize, usize),
    ) -> Result<Rotated, AdminError> {
        self.record(Action::KeyRotate, "*", async |s| {
            key_rotate(s, key, new_key, progress).await
        })
        .await
    }

    /// Change this process's log filter (`None`: it cannot change) to
    /// `text` (a level or `EnvFilter` directives). The filter is checked
    /// and the change recorded before it is put in force: an unrecorded
    /// change is never made.
    pub async fn log_level(
        &self,
        log: Option<&crate::telemetry::log::LogFilter>,
        text: &str,
    ) -> Result<(), AdminError> {
        use crate::telemetry::log::{Filter, LogLevelError};
        // The target as a person reads it, and bounded: a refused filter
        // may be anything.
        let shown: String = crate::telemetry::log::printable(text.trim())
            .chars()
            .take(200)
            .collect();
        let (log, filter) = self
            .record(Action::LogLevel, &shown, async |_| {
                let filter = Filter::parse(text)?;
                Ok((log.ok_or(LogLevelError::Unavailable)?, filter))
            })
            .await?;
        Ok(log.set(filter)?)
    }

    /// Ask every serving process on this database to read its policy
    /// folder again.
    pub async fn policy_reload(&self) -> Result<(), AdminError> {
        self.record(Action::PolicyReload, "*", async |s| {
            Ok(s.bump_policies().await?)
        })
        .await
    }
}

/// A credential as listed: never its secret.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct CredentialView {
    pub name: String,
    pub upstream: String,
    /// `bearer`, `basic`, `header` or `oauth2`.
    pub scheme: String,
    pub header_name: Option<String>,
    pub username: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
}

/// A caller as listed: never its token.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct CallerView {
    pub name: String,
    pub groups: Vec<String>,
    /// Unix seconds.
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A connection as listed.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ConnectionView {
    pub id: String,
    /// The URL an agent uses, on this process's public URL.
    pub url: String,
    pub caller: String,
    pub credential: String,
    /// What a request on it meets: `live`, `revoked` (the connection) or
    /// `caller-revoked` (its caller; the connection serves no one).
    pub state: ConnectionState,
    /// Unix seconds.
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A connection's effective state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ConnectionState {
    Live,
    Revoked,
    CallerRevoked,
}

impl ConnectionState {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionState::Live => "live",
            ConnectionState::Revoked => "revoked",
            ConnectionState::CallerRevoked => "caller-revoked",
        }
    }
}

pub async fn credentials(store: &Store) -> Result<Vec<CredentialView>, AdminError> {
    Ok(store
        .credentials()
        .await?
        .into_iter()
        .map(|r| CredentialView {
            scheme: if r.oauth.is_some() {
                "oauth2".to_string()
            } else {
                r.scheme.as_str().to_string()
            },
            name: r.name,
            upstream: r.upstream,
            header_name: r.header_name,
            username: r.username,
            created_at: r.created_at,
        })
        .collect())
}

pub async fn callers(store: &Store) -> Result<Vec<CallerView>, AdminError> {
    Ok(store
        .callers()
        .await?
        .into_iter()
        .map(|r| CallerView {
            name: r.name,
            groups: r.groups,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
        })
        .collect())
}

/// Every connection, with its URL on `public_url` and its effective state.
pub async fn connections(
    store: &Store,
    public_url: &Url,
) -> Result<Vec<ConnectionView>, AdminError> {
    Ok(store
        .connections()
        .await?
        .into_iter()
        .map(|r| ConnectionView {
            url: connection_url(public_url, &r.id),
            state: match (r.revoked_at, r.caller_revoked_at) {
                (Some(_), _) => ConnectionState::Revoked,
                (None, Some(_)) => ConnectionState::CallerRevoked,
                (None, None) => ConnectionState::Live,
            },
            id: r.id,
            caller: r.caller,
            credential: r.credential,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
        })
        .collect())
}

/// Grant a held call: the same call may run `uses` times within `ttl`
/// (`30s`, `10m`, `1h`, `7d`).
pub(super) async fn approval_grant(
    store: &Store,
    id: &str,
    ttl: &str,
    uses: i64,
) -> Result<(), AdminError> {
    let d = crate::audit::parse_since(ttl)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| AdminError::BadTtl(ttl.to_string()))?;
    if uses < 1 {
        return Err(AdminError::BadUses(uses));
    }
    let now = crate::telemetry::time::now_ms();
    let until = now.saturating_add(d.as_millis().min(i64::MAX as u128) as i64);
    store
        .decide_approval(id, Decision::Grant, now, Some((until, uses)))
        .await?;
    Ok(())
}

/// Apply a decision as the approval states allow ([`Status::next`]).
pub(super) async fn approval_decide(
    store: &Store,
    id: &str,
    decision: Decision,
) -> Result<Status, AdminError> {
    Ok(store
        .decide_approval(id, decision, crate::telemetry::time::now_ms(), None)
        .await?)
}

/// What opens and cleans the held calls an approver is shown: the master
/// key (`None`, or a key that does not open a call: not shown) and the
/// snapshot whose connections' redactors take their credentials out.
#[derive(Clone, Copy, Default)]
pub struct Reveal<'a> {
    pub key: Option<&'a MasterKey>,
    pub snapshot: Option<&'a crate::snapshot::Snapshot>,
}

/// Approvals as an approver sees them, newest first: each held call's
/// arguments opened from its sealed copy, the credential redacted.
pub async fn approvals(
    store: &Store,
    with: Reveal<'_>,
    all: bool,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<Approval>, AdminError> {
    let mut rows = store.approvals_page(all, before, limit).await?;
    for a in &mut rows {
        reveal(&with, a);
    }
    Ok(rows)
}

/// One approval, whatever its state, as [`approvals`] shows it.
pub async fn approval(store: &Store, with: Reveal<'_>, id: &str) -> Result<Approval, AdminError> {
    let mut a = store.approval(id).await?;
    reveal(&with, &mut a);
    Ok(a)
}

/// [`crate::authz::approvals::reveal`] with the redactor of the approval's
/// connection, from the snapshot.
fn reveal(with: &Reveal<'_>, a: &mut Approval) {
    let redactor = with
        .snapshot
        .and_then(|s| s.connections.get(&a.key.connection))
        .map(|c| c.upstream.redactor());
    crate::authz::approvals::reveal(with.key, redactor.as_deref(), a);
}

/// What an admin token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// List, show and decide approvals, and read the audit trail.
    Approver,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Approver => "approver",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = AdminError;
    fn from_str(s: &str) -> Result<Role, AdminError> {
        match s {
            "admin" => Ok(Role::Admin),
            "approver" => Ok(Role::Approver),
            other => Err(AdminError::BadRole(other.to_string())),
        }
    }
}

/// Create an admin token for the admin HTTP API with `role`; returns it,
/// the only time it exists in clear (the store keeps its SHA-256).
pub(super) async fn admin_token_add(
    store: &Store,
    name: &str,
    role: Role,
) -> Result<SecretString, AdminError> {
    check_name(name)?;
    let token = crate::crypto::tokens::new_admin_token();
    store
        .add_admin_token(
            name,
            &token_digest(token.expose_secret().as_bytes()),
            role.as_str(),
        )
        .await?;
    Ok(token)
}

pub(super) async fn admin_token_revoke(store: &Store, name: &str) -> Result<(), AdminError> {
    Ok(store.revoke_admin_token(name).await?)
}

/// A credential definition as given on the command line.
pub struct CredentialSpec<'a> {
    pub name: &'a str,
    /// Whether internal and plain-HTTP upstreams may be registered.
    pub egress: crate::upstream::egress::Egress,
    pub upstream: &'a str,
    pub scheme: Scheme,
    pub header_name: Option<&'a str>,
    pub username: Option<&'a str>,
    pub secret: SecretString,
}

pub fn check_name(name: &str) -> Result<(), AdminError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    ok.then_some(())
        .ok_or_else(|| AdminError::BadName(name.to_string()))
}

/// Replace a credential's secret, checked against its scheme as at
/// registration and sealed to its row.
pub(super) async fn credential_set_secret(
    store: &Store,
    key: &MasterKey,
    name: &str,
    secret: SecretString,
) -> Result<(), AdminError> {
    let row = store
        .credentials()
        .await?
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| StoreError::NotFound {
            kind: "credential",
            name: name.to_string(),
        })?;
    let aad = Sealed::Credential.aad(name);
    let sealed = if row.oauth.is_some() {
        // An OAuth credential's secret is its client secret; the refresh
        // token sealed beside it stays.
        let opened = key.open(&aad, &row.sealed).map_err(|_| {
            AdminError::OAuth("the credential's sealed secrets do not open with this master key")
        })?;
        let mut secrets =
            crate::credentials::oauth::OAuthSecrets::parse(&opened).map_err(|_| {
                AdminError::OAuth("the credential's sealed OAuth secrets are unreadable")
            })?;
        secrets.client_secret = Some(secret.expose_secret().to_string());
        secrets.seal(key, &aad)
    } else {
        injection(
            row.scheme,
            row.header_name.as_deref(),
            row.username.as_deref(),
            &secret,
        )?;
        key.seal(&aad, &secret)
    };
    store.set_credential_secret(name, &sealed).await?;
    Ok(())
}

/// An OAuth 2.x credential as given on the command line.
pub struct OAuthSpec<'a> {
    pub name: &'a str,
    /// Whether internal and plain-HTTP upstreams and token URLs may be
    /// registered.
    pub egress: crate::upstream::egress::Egress,
    pub upstream: &'a str,
    pub token_url: &'a str,
    pub client_id: &'a str,
    pub scopes: Vec<String>,
    pub audience: Option<String>,
    pub client_secret: Option<SecretString>,
    pub refresh_token: Option<SecretString>,
}

/// Register an OAuth 2.x credential: with a refresh token it uses the
/// refresh-token grant, else the client-credentials grant (which needs a
/// client secret). The secrets are sealed together; the first token is
/// fetched by `serve` at the first request.
pub(super) async fn credential_add_oauth(
    store: &Store,
    key: &MasterKey,
    spec: OAuthSpec<'_>,
) -> Result<(), AdminError> {
    use crate::credentials::oauth::{Grant, OAuthConfig, OAuthSecrets};
    check_name(spec.name)?;
    let url = check_upstream(spec.upstream)?;
    let token_url = check_upstream(spec.token_url).map_err(|e| match e {
        AdminError::BadUpstream(u, why) => AdminError::BadTokenUrl(u, why),
        e => e,
    })?;
    check_egress(spec.egress, "upstream URL", &url).await?;
    check_egress(spec.egress, "--token-url", &token_url).await?;
    if spec.client_id.is_empty() || spec.client_id.chars().any(char::is_control) {
        return Err(AdminError::OAuth(
            "--client-id must be a non-empty printable string",
        ));
    }
    let grant = match (&spec.refresh_token, &spec.client_secret) {
        (Some(_), _) => Grant::RefreshToken,
        (None, Some(_)) => Grant::ClientCredentials,
        (None, None) => {
            return Err(AdminError::OAuth(
                "give a client secret (--client-secret-env or --client-secret-stdin) for the client-credentials grant, or a refresh token (--refresh-token-env or --refresh-token-stdin)",
            ))
        }
    };
    let config = OAuthConfig {
        token_url,
        client_id: spec.client_id.to_string(),
        scopes: spec.scopes,
        audience: spec.audience,
        resource: None,
        grant,
    };
    let secrets = OAuthSecrets {
        client_secret: spec.client_secret.map(|s| s.expose_secret().to_string()),
        refresh_token: spec.refresh_token.map(|s| s.expose_secret().to_string()),
    };
    let sealed = secrets.seal(key, &Sealed::Credential.aad(spec.name));
    let config = serde_json::to_string(&config).expect("settings serialize");
    store
        .add_credential(NewCredential {
            name: spec.name,
            upstream: url.as_str(),
            scheme: Scheme::Bearer,
            header_name: None,
            username: None,
            sealed,
            oauth: Some(&config),
        })
        .await?;
    Ok(())
}

/// A URL as an error may show it: without the user name and password a
/// refused URL may carry (the error is stored in the admin audit and
/// shown to whoever reads it), parsed or not.
fn without_userinfo(s: &str) -> String {
    // A query or fragment may hold a secret too: shown as `?…`.
    let hidden = |had: bool| if had { "?…" } else { "" };
    if let Ok(mut u) = Url::parse(s) {
        if u.set_username("").is_ok() && u.set_password(None).is_ok() {
            let had = u.query().is_some() || u.fragment().is_some();
            u.set_query(None);
            u.set_fragment(None);
            return format!("{u}{}", hidden(had));
        }
    }
    // Unparsed: not shown (it may be a secret pasted in place of a URL).
    "(not shown)".to_string()
}

/// Validate an upstream URL: absolute http(s) with a host, no credentials
/// in it (they would travel outside the sealed store), no fragment.
pub fn check_upstream(s: &str) -> Result<Url, AdminError> {
    let bad = |why| AdminError::BadUpstream(without_userinfo(s), why);
    let u = Url::parse(s).map_err(|_| bad("not an absolute URL"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if u.host().is_none() {
        return Err(bad("it has no host"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("put credentials in the secret, not in the URL"));
    }
    if u.fragment().is_some() {
        return Err(bad("it has a fragment"));
    }
    if u.query().is_some_and(crate::wire::query::names_credential) {
        return Err(bad(
            "a query parameter names a credential: tessera would store and list it in clear; give the secret as the credential's (--scheme header sends it in a header)",
        ));
    }
    Ok(u)
}

/// Refuse a URL tessera may not connect to (see [`crate::upstream::egress`]): the
/// same rule `serve` applies again at every connection.
pub async fn check_egress(
    egress: crate::upstream::egress::Egress,
    what: &'static str,
    url: &Url,
) -> Result<(), AdminError> {
    egress
        .check_registration(url)
        .await
        .map_err(|e| AdminError::Egress(what, url.to_string(), e))
}

/// Register an upstream and its credential; the secret is sealed before it
/// leaves this function.
pub(super) async fn credential_add(
    store: &Store,
    key: &MasterKey,
    spec: CredentialSpec<'_>,
) -> Result<(), AdminError> {
    check_name(spec.name)?;
    let url = check_upstream(spec.upstream)?;
    check_egress(spec.egress, "upstream URL", &url).await?;
    // Build the header once now, so a bad secret or scheme is refused at
    // registration rather than at the first request.
    injection(spec.scheme, spec.header_name, spec.username, &spec.secret)?;
    let header_name = match spec.scheme {
        Scheme::Header => spec.header_name.map(str::to_ascii_lowercase),
        _ => None,
    };
    let sealed = key.seal(&Sealed::Credential.aad(spec.name), &spec.secret);
    store
        .add_credential(NewCredential {
            name: spec.name,
            upstream: url.as_str(),
            scheme: spec.scheme,
            header_name: header_name.as_deref(),
            username: if spec.scheme == Scheme::Basic {
                spec.username
            } else {
                None
            },
            sealed,
            oauth: None,
        })
        .await?;
    Ok(())
}

/// Create a caller in `groups` (names like a caller's; policies refer to
/// them as `Group::"name"`); returns its token, the only time it exists in
/// clear.
pub(super) async fn caller_add(
    store: &Store,
    name: &str,
    groups: &[String],
) -> Result<SecretString, AdminError> {
    check_name(name)?;
    let groups = check_groups(groups)?;
    let token = new_caller_token();
    store
        .add_caller(
            name,
            &token_digest(token.expose_secret().as_bytes()),
            &groups,
        )
        .await?;
    Ok(token)
}

/// Groups as stored: each a valid name, sorted, once.
fn check_groups(groups: &[String]) -> Result<Vec<String>, AdminError> {
    for g in groups {
        check_name(g)?;
    }
    let mut groups = groups.to_vec();
    groups.sort();
    groups.dedup();
    Ok(groups)
}

/// A change to a credential's definition: each field changed when given.
/// The secret changes with `set-secret`; the scheme with a new credential.
pub struct CredentialChange<'a> {
    pub name: &'a str,
    /// Whether internal and plain-HTTP upstreams may be registered.
    pub egress: crate::upstream::egress::Egress,
    pub upstream: Option<&'a str>,
    /// The header's name (`--scheme header` only).
    pub header_name: Option<&'a str>,
    /// The user name (`--scheme basic` only).
    pub username: Option<&'a str>,
    /// OAuth settings (`--scheme oauth2` only): the token endpoint, the
    /// scopes (replacing the old ones) and the audience. A change drops
    /// the cached access token, so the next request asks with them.
    pub token_url: Option<&'a str>,
    pub scopes: Option<Vec<String>>,
    pub audience: Option<&'a str>,
    /// A new secret (static schemes), replacing the stored one. Required
    /// to move the upstream to another origin: without it, whoever may
    /// change a credential could send its stored secret to a host of their
    /// choosing, and an admin could read back a secret it never held.
    pub secret: Option<SecretString>,
}

impl CredentialChange<'_> {
    /// Whether it changes anything.
    pub fn is_empty(&self) -> bool {
        self.upstream.is_none()
            && self.header_name.is_none()
            && self.username.is_none()
            && self.token_url.is_none()
            && self.scopes.is_none()
            && self.audience.is_none()
            && self.secret.is_none()
    }
}

pub(super) async fn credential_update(
    store: &Store,
    key: &MasterKey,
    c: CredentialChange<'_>,
) -> Result<(), AdminError> {
    if c.is_empty() {
        return Err(AdminError::NothingToChange);
    }
    let row = store
        .credentials()
        .await?
        .into_iter()
        .find(|r| r.name == c.name)
        .ok_or_else(|| StoreError::NotFound {
            kind: "credential",
            name: c.name.to_string(),
        })?;
    let upstream = match c.upstream {
        Some(u) => Some(check_upstream(u)?),
        None => None,
    };
    // Where the stored secrets are sent may change only with them: a new
    // origin takes a new secret given in the same change; an OAuth
    // credential's secrets are bound to its token endpoint and resource.
    let origin_of = |u: &str| Url::parse(u).map(|u| u.origin()).ok();
    let moved = upstream
        .as_ref()
        .is_some_and(|u| Some(u.origin()) != origin_of(&row.upstream));
    if let Some(doc) = &row.oauth {
        let token_origin = serde_json::from_str::<crate::credentials::oauth::OAuthConfig>(doc)
            .ok()
            .map(|c| c.token_url.origin());
        let token_moved = c
            .token_url
            .is_some_and(|t| origin_of(t).is_none() || origin_of(t) != token_origin);
        if moved || token_moved {
            return Err(AdminError::Refused(
                "an OAuth credential's secrets stay with the origins they were issued for: add a new credential for another upstream or token endpoint",
            ));
        }
        if c.secret.is_some() {
            return Err(AdminError::Refused(
                "an OAuth credential's secrets change with `credential set-secret`",
            ));
        }
    } else if moved && c.secret.is_none() {
        return Err(AdminError::Refused(
            "moving a credential to another origin sends its secret there: give the secret again in the same change (--secret-env or --secret-stdin; \"secret\" in the admin API)",
        ));
    }
    if let Some(url) = &upstream {
        check_egress(c.egress, "upstream URL", url).await?;
    }
    let upstream = upstream.map(|u| u.to_string());
    let scheme = match row.oauth {
        Some(_) => "oauth2",
        None => row.scheme.as_str(),
    };
    let not_for = |what: &'static str| AdminError::NotForScheme(what, scheme);
    if c.header_name.is_some() && scheme != "header" {
        return Err(not_for("a header name"));
    }
    if c.username.is_some() && scheme != "basic" {
        return Err(not_for("a user name"));
    }
    let oauth_change = c.token_url.is_some() || c.scopes.is_some() || c.audience.is_some();
    let oauth = match (&row.oauth, oauth_change) {
        (None, true) => return Err(not_for("a token URL, scopes or an audience")),
        (Some(doc), true) => {
            let mut config: crate::credentials::oauth::OAuthConfig = serde_json::from_str(doc)
                .map_err(|_| AdminError::OAuth("the credential's OAuth settings are unreadable"))?;
            if let Some(t) = c.token_url {
                let url = check_upstream(t).map_err(|e| match e {
                    AdminError::BadUpstream(u, why) => AdminError::BadTokenUrl(u, why),
                    e => e,
                })?;
                check_egress(c.egress, "--token-url", &url).await?;
                config.token_url = url;
            }
            if let Some(scopes) = c.scopes {
                config.scopes = scopes;
            }
            if let Some(a) = c.audience {
                config.audience = Some(a.to_string()).filter(|a| !a.is_empty());
            }
            Some(serde_json::to_string(&config).expect("settings serialize"))
        }
        (_, false) => None,
    };
    // The same checks as at registration (on a stand-in secret when the
    // secret stays).
    let stand_in = SecretString::from("x".to_string());
    injection(
        row.scheme,
        c.header_name.or(row.header_name.as_deref()),
        c.username.or(row.username.as_deref()),
        c.secret.as_ref().unwrap_or(&stand_in),
    )?;
    let sealed = c
        .secret
        .as_ref()
        .map(|s| key.seal(&Sealed::Credential.aad(c.name), s));
    let header_name = c.header_name.map(str::to_ascii_lowercase);
    Ok(store
        .update_credential(crate::store::model::CredentialUpdate {
            name: c.name,
            upstream: upstream.as_deref(),
            header_name: header_name.as_deref(),
            username: c.username,
            oauth: oauth.as_deref(),
            sealed: sealed.as_deref(),
            // A cached access token goes with any change of an OAuth
            // credential's settings or upstream.
            drop_token: oauth.is_some() || (row.oauth.is_some() && upstream.is_some()),
        })
        .await?)
}

pub(super) async fn caller_revoke(store: &Store, name: &str) -> Result<(), AdminError> {
    Ok(store.revoke_caller(name).await?)
}

/// The connection URL for an id.
pub fn connection_url(public_url: &Url, id: &str) -> String {
    format!("{}/c/{id}", public_url.as_str().trim_end_matches('/'))
}

/// Allocate an address binding `caller` to `credential`; returns its URL.
pub(super) async fn connection_add(
    store: &Store,
    public_url: &Url,
    caller: &str,
    credential: &str,
) -> Result<String, AdminError> {
    let id = new_connection_id();
    store.add_connection(&id, caller, credential).await?;
    Ok(connection_url(public_url, &id))
}

/// The id in `ID_OR_URL`: a bare id, or a URL whose path is `/c/<id>`.
pub fn connection_id(id_or_url: &str) -> Result<&str, AdminError> {
    let bad = || AdminError::BadConnection(id_or_url.to_string());
    let id = match id_or_url.find("/c/") {
        // The address, or one of its aliases for clients (`…/mcp`, `…/sse`).
        Some(i) if id_or_url.contains("://") => {
            let tail = id_or_url[i + 3..].trim_end_matches('/');
            tail.strip_suffix("/mcp")
                .or_else(|| tail.strip_suffix("/sse"))
                .unwrap_or(tail)
        }
        _ => id_or_url,
    };
    let ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(id).ok_or_else(bad)
}

/// What approvals that learn make of a call, as `approval explain` and
/// the admin API show it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Explanation {
    /// `allow`, `deny` or `ask`: what a prediction would do now.
    pub action: String,
    /// The bound the action rests on (the lower bound for allow, the upper
    /// for deny, the posterior mean for ask); null with too few answers.
    pub p: Option<f64>,
    /// The level that decides (`exact`, `caller-tool`, `tool`); null when
    /// none has enough answers.
    pub level: Option<String>,
    /// Each level's evidence, most specific first.
    pub levels: Vec<LevelEvidence>,
    pub thresholds: ShownThresholds,
    pub caller: String,
    /// The connection's full id.
    pub connection: String,
    pub credential: String,
    pub tool: String,
    /// The arguments' names and JSON types.
    pub shape: String,
    /// The line the audit trail would carry.
    pub reason: String,
    /// serve asks the operator's predictor (`--predictor-url`) instead of
    /// this model.
    pub predictor_url: bool,
}

/// One level's evidence: decayed answers and the 95% bounds on p.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct LevelEvidence {
    pub level: String,
    pub grants: f64,
    pub denials: f64,
    /// The answers recorded, whole (3 or more for a level to decide).
    pub answers: u32,
    pub lower: Option<f64>,
    pub upper: Option<f64>,
    /// This level decides.
    pub decides: bool,
}

/// The prediction's thresholds, from the costs.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ShownThresholds {
    /// Allow above this p.
    pub allow: f64,
    /// Deny below this p.
    pub deny: f64,
}

/// What the built-in model makes now of `caller` calling `tool` with
/// `arguments` (JSON text; only names and types count) on the connection
/// `connection` (id or URL), with `settings`' costs and half-life, from
/// every answer in the store. The tool and argument names are shown
/// redacted with `redact` (the connection's secrets, when known).
pub async fn explain(
    store: &Store,
    settings: &crate::config::PredictSettings,
    caller: &str,
    connection: &str,
    tool: &str,
    arguments: Option<&str>,
    redact: impl Fn(&str) -> String,
) -> Result<Explanation, AdminError> {
    use crate::authz::predict::{self, model};
    let id = connection_id(connection)?;
    // The full id, or the first eight characters or more of it as listings
    // and the agent's messages show it, when no other id starts so.
    let mut found: Vec<_> = store
        .connections()
        .await?
        .into_iter()
        .filter(|c| c.id == id || (id.len() >= 8 && c.id.starts_with(id)))
        .collect();
    let conn = match found.len() {
        1 => found.remove(0),
        _ => match found.into_iter().find(|c| c.id == id) {
            Some(c) => c,
            None => {
                return Err(StoreError::NotFound {
                    kind: "connection",
                    name: id.to_string(),
                }
                .into())
            }
        },
    };
    if conn.caller != caller {
        return Err(AdminError::NotTheCallers {
            connection: conn.id.chars().take(8).collect(),
            owner: conn.caller,
            caller: caller.to_string(),
        });
    }
    let q = predict::Question {
        caller: caller.to_string(),
        connection: conn.id.clone(),
        credential: conn.credential.clone(),
        tool: redact(tool),
        rpc_method: "tools/call".into(),
        shape: redact(&model::shape(arguments)),
        arguments: None,
    };
    let p = predict::explain(store, settings, &q, crate::telemetry::time::now_ms()).await?;
    Ok(Explanation {
        action: p.action.as_str().into(),
        p: p.p,
        level: p.level.map(|l| l.as_str().into()),
        levels: p
            .levels
            .iter()
            .map(|e| LevelEvidence {
                level: e.level.as_str().into(),
                grants: e.grants,
                denials: e.denials,
                answers: e.answers,
                lower: e.lower,
                upper: e.upper,
                decides: Some(e.level) == p.level,
            })
            .collect(),
        thresholds: ShownThresholds {
            allow: p.thresholds.allow,
            deny: p.thresholds.deny,
        },
        reason: predict::Outcome::Model(p).reason(&q),
        caller: q.caller,
        connection: q.connection,
        credential: q.credential,
        tool: q.tool,
        shape: q.shape,
        predictor_url: settings.url.is_some(),
    })
}

pub(super) async fn connection_revoke(store: &Store, id_or_url: &str) -> Result<(), AdminError> {
    Ok(store.revoke_connection(connection_id(id_or_url)?).await?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refused_url_is_shown_without_its_credentials() {
        for s in [
            "https://bot:hunter2@api.example/mcp",
            "https://bot:hunter2@/mcp",
            "https://bot:hunter2@api.example:99999/mcp",
            "ftp://bot:hunter2@api.example/",
        ] {
            let e = super::check_upstream(s).unwrap_err().to_string();
            assert!(!e.contains("hunter2") && !e.contains("bot"), "{e}");
        }
    }

    use super::*;

    #[test]
    fn names_and_urls() {
        assert!(check_name("github-prod_1.x").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err());
        }
        assert!(check_upstream("https://api.example/mcp").is_ok());
        for bad in [
            "api.example",
            "ftp://a",
            "https://u:p@a/",
            "http://a/#f",
            "file:///etc",
        ] {
            assert!(check_upstream(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn connection_ids() {
        assert_eq!(connection_id("abc").unwrap(), "abc");
        assert_eq!(
            connection_id("http://127.0.0.1:7470/c/abc_-1").unwrap(),
            "abc_-1"
        );
        assert!(connection_id("http://h/c/a/b").is_err());
        assert!(connection_id("a b").is_err());
    }
}

/// What `key rotate` did.
#[derive(Debug)]
pub struct Rotated {
    pub new_id: String,
    pub resealed: usize,
    /// The key file now holding the new key first, if the ring is a file.
    pub file: Option<std::path::PathBuf>,
}

/// Re-seal every secret under a new master key, in one transaction, while
/// `serve` keeps serving. With a key file: the new key is first added to
/// the file as an extra key (serving processes re-read the file at their
/// next reload, which the re-seal triggers, so they open both), then every
/// secret is re-sealed, then the new key becomes the current one; the old
/// keys stay in the file to open anything sealed meanwhile, until `key
/// status` shows them unused. With `TESSERA_MASTER_KEY`, the new key comes
/// from `new_key` and the environment of serving processes is the admin's
/// to update.
///
/// `progress(done, total)` is called as each secret is re-sealed (before
/// the one transaction that stores them all commits).
pub(super) async fn key_rotate(
    store: &Store,
    key: &MasterKey,
    new_key: Option<String>,
    mut progress: impl FnMut(usize, usize),
) -> Result<Rotated, AdminError> {
    use crate::crypto::keyring::{key_id_hex, new_key_base64, SealError};
    let file = key.file().map(std::path::Path::to_path_buf);
    let new_b64 = match (new_key, &file) {
        (Some(k), _) => k.trim().to_string(),
        (None, Some(_)) => new_key_base64(),
        (None, None) => {
            return Err(AdminError::Key(
                "TESSERA_MASTER_KEY is set: give the new key in TESSERA_MASTER_KEY_NEW".into(),
            ))
        }
    };
    let old: Vec<String> = match &file {
        Some(f) => std::fs::read_to_string(f)
            .map_err(|e| AdminError::Key(format!("reading {}: {e}", f.display())))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
        None => Vec::new(),
    };
    let next = MasterKey::load(
        Some(&format!("{new_b64},{}", old.join(","))),
        std::path::Path::new("."),
    )
    .or_else(|_| MasterKey::load(Some(&new_b64), std::path::Path::new(".")))
    .map_err(|e: SealError| AdminError::Key(format!("TESSERA_MASTER_KEY_NEW: {e}")))?;
    let new_id = next.ids()[0];
    if key.ids().contains(&new_id) && key.ids()[0] == new_id {
        return Err(AdminError::Key(
            "the new key is already the current key".into(),
        ));
    }
    if let Some(f) = &file {
        // Serving processes learn the new key before anything uses it.
        let mut lines = old.clone();
        lines.retain(|l| *l != new_b64);
        lines.push(new_b64.clone());
        replace_key_file(f, &lines)?;
    }
    let sealed_values = store.sealed_values().await?;
    let total = sealed_values.len();
    let mut resealed = Vec::with_capacity(total);
    for (kind, name, sealed) in sealed_values {
        let aad = kind.aad(&name);
        let secret = key.open(&aad, &sealed).map_err(|_| StoreError::Sealed {
            credential: name.clone(),
        })?;
        resealed.push((kind, name, next.seal(&aad, &secret)));
        progress(resealed.len(), total);
    }
    store.reseal(&resealed).await?;
    if let Some(f) = &file {
        let mut lines = vec![new_b64.clone()];
        lines.extend(old.into_iter().filter(|l| *l != new_b64));
        replace_key_file(f, &lines)?;
        // Serving processes reload the ring now and seal with the new key.
        store.reseal(&[]).await?;
    }
    Ok(Rotated {
        new_id: key_id_hex(&new_id),
        resealed: resealed.len(),
        file,
    })
}

/// Write the key file whole: a private temporary file renamed over it.
fn replace_key_file(path: &std::path::Path, lines: &[String]) -> Result<(), AdminError> {
    use std::io::Write;
    let tmp = path.with_extension("key.tmp");
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(format!("{}\n", lines.join("\n")).as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| AdminError::Key(format!("writing {}: {e}", path.display())))
}

/// One key id and what uses it.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyUse {
    pub id: String,
    pub in_ring: bool,
    pub current: bool,
    /// Sealed values under this key.
    pub sealed: usize,
}

/// Which key ids seal the stored secrets, and which keys the ring holds.
/// Values sealed before key ids are counted under id "legacy".
pub async fn key_status(store: &Store, key: &MasterKey) -> Result<Vec<KeyUse>, AdminError> {
    use crate::crypto::keyring::{key_id_hex, sealed_key_id};
    let ring: Vec<String> = key.ids().iter().map(key_id_hex).collect();
    let mut uses: Vec<KeyUse> = ring
        .iter()
        .enumerate()
        .map(|(i, id)| KeyUse {
            id: id.clone(),
            in_ring: true,
            current: i == 0,
            sealed: 0,
        })
        .collect();
    for (_, _, sealed) in store.sealed_values().await? {
        let id = sealed_key_id(&sealed).map_or_else(|| "legacy".to_string(), |i| key_id_hex(&i));
        match uses.iter_mut().find(|u| u.id == id) {
            Some(u) => u.sealed += 1,
            None => uses.push(KeyUse {
                id,
                in_ring: false,
                current: false,
                sealed: 1,
            }),
        }
    }
    Ok(uses)
}
