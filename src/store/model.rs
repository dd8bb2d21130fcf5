//! The rows the store reads and writes, in one place: the store depends on
//! no module above it, and the modules above speak of rows in these types.

/// How a secret is presented to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `Authorization: Bearer <secret>`
    Bearer,
    /// `Authorization: Basic base64(<username>:<secret>)`
    Basic,
    /// `<header-name>: <secret>`
    Header,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Bearer => "bearer",
            Scheme::Basic => "basic",
            Scheme::Header => "header",
        }
    }
}

impl std::str::FromStr for Scheme {
    type Err = UnknownScheme;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bearer" => Ok(Scheme::Bearer),
            "basic" => Ok(Scheme::Basic),
            "header" => Ok(Scheme::Header),
            _ => Err(UnknownScheme(s.to_string())),
        }
    }
}

impl TryFrom<String> for Scheme {
    type Error = UnknownScheme;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// What a sealed value is: where it is stored, and the associated data
/// that binds it to its row (a blob copied onto another row, or into the
/// other table, fails to open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// A credential's secret (`credentials.sealed`).
    Credential,
    /// A cached OAuth access token (`oauth_tokens.sealed`).
    OAuthToken,
    /// A held call's complete `params` (`approvals.sealed_call`), named
    /// by the approval id.
    Approval,
}

impl Sealed {
    /// The table holding it.
    pub fn table(self) -> &'static str {
        match self {
            Sealed::Credential => "credentials",
            Sealed::OAuthToken => "oauth_tokens",
            Sealed::Approval => "approvals",
        }
    }

    /// The associated data for the value of the credential `name`.
    pub fn aad(self, name: &str) -> String {
        match self {
            Sealed::Credential => format!("tessera:credential:{name}"),
            Sealed::OAuthToken => format!("tessera:oauth-token:{name}"),
            Sealed::Approval => format!("tessera:approval:{name}"),
        }
    }
}

/// A scheme name that is not `bearer`, `basic` or `header`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown scheme {0:?}: expected bearer, basic or header")]
pub struct UnknownScheme(pub String);

/// What identifies one call. Absent tool or arguments are `""`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct CallKey {
    pub caller: String,
    pub connection: String,
    pub rpc_method: String,
    pub tool: String,
    pub arguments_sha256: String,
}

/// Where an approval stands. The states and the only moves between them
/// ([`Status::next`] is the one table of them):
///
/// ```text
/// pending ──grant──▶ granted ──last use──▶ used
///    │                  │ └────ttl ends──▶ expired
///    │                  └─────deny/revoke─▶ revoked
///    ├──deny──▶ denied          (stands: the same call stays refused)
///    └──ttl ends (--approval-ttl)──▶ expired
/// ```
///
/// `denied`, `used`, `expired` and `revoked` are final: a decision is
/// never relabelled (a denial stands; a spent grant stays spent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Granted,
    Denied,
    Used,
    Expired,
    Revoked,
}

/// What a person (or time) does to an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// `approval grant`.
    Grant,
    /// `approval deny`: of a pending call, a denial; of a live grant, its
    /// revocation.
    Deny,
    /// `approval revoke`: ends a live grant.
    Revoke,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Grant => "grant",
            Decision::Deny => "deny",
            Decision::Revoke => "revoke",
        }
    }
}

/// A decision the approval's state does not allow: the sentence says why
/// and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("approval {id} is {from}: {why}")]
pub struct Refused {
    pub id: String,
    pub from: &'static str,
    pub why: &'static str,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Granted => "granted",
            Status::Denied => "denied",
            Status::Used => "used",
            Status::Expired => "expired",
            Status::Revoked => "revoked",
        }
    }

    /// Where an approval stored as `self` stands at `now_ms`: a pending
    /// request or a grant whose `expires_at` has passed has expired; a
    /// grant with no use left is used (time moves these; the store writes
    /// them when it next touches the row).
    pub fn at(self, expires_at: Option<i64>, uses_left: Option<i64>, now_ms: i64) -> Status {
        match self {
            Status::Granted if uses_left.is_some_and(|u| u <= 0) => Status::Used,
            Status::Pending | Status::Granted if expires_at.is_some_and(|e| e <= now_ms) => {
                Status::Expired
            }
            s => s,
        }
    }

    /// The transition table: the state `decision` moves an approval in
    /// state `self` (as [`Status::at`] gives it) to, or why it may not.
    pub fn next(self, decision: Decision, id: &str) -> Result<Status, Refused> {
        use Decision as D;
        use Status as S;
        let refuse = |why| {
            Err(Refused {
                id: id.to_string(),
                from: self.as_str(),
                why,
            })
        };
        match (self, decision) {
            (S::Pending, D::Grant) => Ok(S::Granted),
            (S::Pending, D::Deny) => Ok(S::Denied),
            (S::Granted, D::Deny | D::Revoke) => Ok(S::Revoked),
            (S::Pending, D::Revoke) => {
                refuse("nothing was granted to revoke; deny it to refuse the call")
            }
            (S::Granted, D::Grant) => refuse("it is already granted"),
            (S::Denied, D::Grant) => {
                refuse("a denial stands; the agent's same call stays refused")
            }
            (S::Denied, _) => refuse("it is already denied"),
            (S::Used, _) => refuse(
                "its grant was used; a decision made is not changed (the call's next try asks anew)",
            ),
            (S::Expired, _) => {
                refuse("it expired before it was decided or used; the call's next try asks anew")
            }
            (S::Revoked, _) => refuse("its grant was revoked; that decision is final"),
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Status, sqlx::Error> {
        Ok(match s {
            "pending" => Status::Pending,
            "granted" => Status::Granted,
            "denied" => Status::Denied,
            "used" => Status::Used,
            "expired" => Status::Expired,
            "revoked" => Status::Revoked,
            other => {
                return Err(sqlx::Error::Decode(
                    format!("approval status {other:?}").into(),
                ))
            }
        })
    }
}

/// A stored status, as a row is read (`#[sqlx(try_from = "String")]`).
impl TryFrom<String> for Status {
    type Error = sqlx::Error;
    fn try_from(s: String) -> Result<Status, sqlx::Error> {
        Status::parse(&s)
    }
}

impl serde::Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What the approver is shown of a call besides its key: the parts of
/// the call the key binds that a person needs to judge it. Never a secret:
/// the session appears only as a fingerprint.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema, sqlx::FromRow,
)]
pub struct Shown {
    /// The sub-path after the connection address (`""`: none).
    pub sub_path: Option<String>,
    /// The query string as sent, without `?` (absent: none).
    pub query: Option<String>,
    /// The first 12 hex digits of the SHA-256 of the `Mcp-Session-Id` the
    /// caller sent (`""`: none), to tell sessions apart.
    pub session: Option<String>,
    /// The call's complete `params` as sent (opened from the sealed copy;
    /// absent when it cannot be opened, or on rows recorded before calls
    /// were kept, which kept it only with `--audit-arguments`).
    pub params: Option<String>,
}

/// A new pending approval.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub id: String,
    pub created_at: i64,
    /// When it expires undecided (`--approval-ttl`), unix milliseconds.
    pub expires_at: i64,
    pub key: CallKey,
    /// The complete `params`, sealed to the approval id ([`Sealed::Approval`]).
    pub sealed_call: Option<Vec<u8>>,
    /// Why it is held: the `@ask` policies or the authorizer's reason.
    pub reason: Option<String>,
    pub shown: Shown,
    /// The connection's credential and the arguments' shape (names and
    /// JSON types), for approvals that learn (`crate::authz::predict`).
    pub credential: Option<String>,
    pub shape: Option<String>,
}

/// An approval as stored. Rows recorded before calls were bound whole
/// (their `arguments_sha256` has no `v2:`) show no sub-path, query or
/// session.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct Approval {
    pub id: String,
    /// Unix milliseconds.
    pub created_at: i64,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub key: CallKey,
    /// A tool call's `arguments` (from the sealed call, opened for the
    /// approver; on rows recorded before, only with `--audit-arguments`).
    pub arguments: Option<String>,
    pub reason: Option<String>,
    /// Where it stands now ([`Status::at`]).
    #[sqlx(try_from = "String")]
    pub status: Status,
    pub decided_at: Option<i64>,
    /// The admin token's name that decided it, or `cli`.
    pub decided_by: Option<String>,
    /// Pending: when it expires undecided; granted: when the grant ends.
    pub expires_at: Option<i64>,
    pub uses_left: Option<i64>,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub shown: Shown,
    /// The sealed call, opened into `shown.params` by whoever holds the
    /// master key; never listed itself.
    #[serde(skip)]
    pub sealed_call: Option<Vec<u8>>,
    /// The connection's credential and the arguments' shape, when recorded
    /// (approvals since approvals learn).
    pub credential: Option<String>,
    pub shape: Option<String>,
}

/// One decision, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct AuditRecord {
    pub id: i64,
    /// Unix milliseconds.
    pub at: i64,
    pub caller: String,
    pub connection: String,
    pub http_method: String,
    pub rpc_method: Option<String>,
    pub tool: Option<String>,
    /// `allow` or `deny`.
    pub verdict: String,
    /// The determining policy ids, or why a request was refused.
    pub reason: Option<String>,
    /// Hex SHA-256 of the tool arguments' JSON text.
    pub arguments_sha256: Option<String>,
    /// The arguments themselves, only with `--audit-arguments`.
    pub arguments: Option<String>,
    /// The status the caller got (the upstream's, or tessera's own).
    #[sqlx(try_from = "i64")]
    pub status: u16,
    pub duration_us: i64,
    /// The request's id (32 hex digits): its access line's and its
    /// answer's `X-Request-Id`. The caller's trace id when it sent a
    /// `traceparent`, so two callers may send the same one. `None`:
    /// recorded before request ids.
    pub request_id: Option<String>,
}

/// Which records `tessera audit` shows.
#[derive(Debug, Default, Clone)]
pub struct AuditQuery {
    pub caller: Option<String>,
    pub connection: Option<String>,
    /// Unix milliseconds: records at or after.
    pub since: Option<i64>,
    /// Records with a larger id only (for following).
    pub after_id: Option<i64>,
    /// Records with a smaller id only (the next page back).
    pub before_id: Option<i64>,
    /// Leave out the protocol's chatter: `initialize` and
    /// `notifications/*` (the console's default view).
    pub quiet: bool,
    /// Only the records of this request id.
    pub request_id: Option<String>,
    pub limit: i64,
}

/// A credential row. `sealed` is the AEAD blob; it is opened only when a
/// snapshot is built.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CredentialRow {
    pub id: i64,
    pub name: String,
    pub upstream: String,
    #[sqlx(try_from = "String")]
    pub scheme: Scheme,
    pub header_name: Option<String>,
    pub username: Option<String>,
    pub sealed: Vec<u8>,
    pub created_at: i64,
    /// For an OAuth credential: its `OAuthConfig` as JSON.
    pub oauth: Option<String>,
}

/// A caller row: its token exists here only as a digest.
#[derive(Debug, Clone)]
pub struct CallerRow {
    pub id: i64,
    pub name: String,
    pub token_sha256: [u8; 32],
    /// Group names, for policies.
    pub groups: Vec<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A connection row, with the names it refers to.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ConnectionRow {
    pub id: String,
    pub caller_id: i64,
    pub caller: String,
    pub credential_id: i64,
    pub credential: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// When its caller was revoked: the connection then serves no one.
    pub caller_revoked_at: Option<i64>,
}

/// A credential's changed fields; `None` keeps a field as it is.
pub struct CredentialUpdate<'a> {
    pub name: &'a str,
    pub upstream: Option<&'a str>,
    pub header_name: Option<&'a str>,
    pub username: Option<&'a str>,
    /// The OAuth settings document, whole.
    pub oauth: Option<&'a str>,
    /// A new sealed secret.
    pub sealed: Option<&'a [u8]>,
    /// Drop the cached OAuth access token.
    pub drop_token: bool,
}

/// New credential fields, with the secret already sealed.
pub struct NewCredential<'a> {
    pub name: &'a str,
    pub upstream: &'a str,
    pub scheme: Scheme,
    pub header_name: Option<&'a str>,
    pub username: Option<&'a str>,
    pub sealed: Vec<u8>,
    /// For an OAuth credential: its `OAuthConfig` as JSON.
    pub oauth: Option<&'a str>,
}

/// An admin token as listed: never its value or digest.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct AdminTokenRow {
    pub name: String,
    /// `admin` or `approver`.
    pub role: String,
    /// Unix seconds.
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// One admin action, as recorded.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct AdminAction {
    pub id: i64,
    /// Unix milliseconds.
    pub at: i64,
    /// The admin token's name, or `cli`.
    pub actor: String,
    /// e.g. `caller.add`, `approval.grant`.
    pub action: String,
    /// The name or id acted on.
    pub target: String,
    /// `ok`, or the error the action met.
    pub outcome: String,
}

/// One tool of one credential, as pinned (issue 29, `crate::authz::pins`).
/// Definitions are canonical JSON, redacted of the credential's secret.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct ToolPinRow {
    pub credential: String,
    pub tool: String,
    /// `pinned`, `changed`, `new` or `rejected`.
    pub status: String,
    pub pinned_digest: Option<String>,
    pub pinned_definition: Option<String>,
    pub offered_digest: Option<String>,
    pub offered_definition: Option<String>,
    /// Unix milliseconds.
    pub first_seen: i64,
    /// Unix milliseconds: when a new digest of it was last recorded.
    pub last_seen: i64,
}

/// One tool definition seen in a `tools/list` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedTool {
    pub tool: String,
    /// SHA-256 (hex) of the canonical definition.
    pub digest: String,
    /// The canonical definition, redacted.
    pub definition: String,
}

/// What recording an answer's tools changed, per tool: its status now,
/// and whether it was pinned by trust on first use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinChange {
    pub tool: String,
    pub status: String,
    pub digest: String,
}

/// The store's change counters (see `migrations/*/0006_changes.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revision {
    /// Moves on every change to credentials, callers and connections.
    pub data: i64,
    /// Moves on `tessera policy reload`.
    pub policies: i64,
}

/// What is stored for an OAuth credential: its sealed secrets, and its
/// cached token (sealed) with the expiry in unix milliseconds.
pub struct StoredOAuth {
    pub sealed_secrets: Vec<u8>,
    pub token: Option<(Vec<u8>, Option<i64>)>,
}

#[cfg(test)]
mod tests {
    use super::{Decision, Sealed, Status};

    /// The whole transition table: every (state, decision) pair.
    #[test]
    fn approval_states_move_only_as_the_table_says() {
        use Decision::*;
        use Status::*;
        let all = [Pending, Granted, Denied, Used, Expired, Revoked];
        let allowed = [
            (Pending, Grant, Granted),
            (Pending, Deny, Denied),
            (Granted, Deny, Revoked),
            (Granted, Revoke, Revoked),
        ];
        for from in all {
            for d in [Grant, Deny, Revoke] {
                let want = allowed
                    .iter()
                    .find(|(f, dd, _)| *f == from && *dd == d)
                    .map(|t| t.2);
                match (from.next(d, "ap_x"), want) {
                    (Ok(to), Some(w)) => assert_eq!(to, w),
                    (Err(e), None) => {
                        let m = e.to_string();
                        assert!(
                            m.starts_with(&format!("approval ap_x is {}: ", from.as_str())),
                            "{m}"
                        );
                    }
                    (got, want) => panic!("{from:?} {d:?}: {got:?}, want {want:?}"),
                }
            }
        }
        assert!(Denied
            .next(Grant, "a")
            .unwrap_err()
            .why
            .contains("a denial stands"));
        // Time and use move states too.
        assert_eq!(Pending.at(Some(10), None, 10), Expired);
        assert_eq!(Pending.at(Some(11), None, 10), Pending);
        assert_eq!(Granted.at(Some(11), Some(0), 10), Used);
        assert_eq!(Granted.at(Some(10), Some(1), 10), Expired);
        assert_eq!(Denied.at(Some(1), None, 10), Denied);
        assert_eq!(Pending.at(None, None, 10), Pending);
    }
    use crate::crypto::keyring::{ExposeSecret, MasterKey, SecretString};

    #[test]
    fn a_sealed_value_opens_only_as_its_kind_and_row() {
        let key = MasterKey::load(
            Some(&crate::crypto::keyring::new_key_base64()),
            std::path::Path::new("/nonexistent"),
        )
        .unwrap();
        let blob = key.seal(&Sealed::Credential.aad("gh"), &SecretString::from("s3cret"));
        let opened = key.open(&Sealed::Credential.aad("gh"), &blob).unwrap();
        assert_eq!(opened.expose_secret(), "s3cret");
        assert!(key.open(&Sealed::OAuthToken.aad("gh"), &blob).is_err());
        assert!(key.open(&Sealed::Credential.aad("gl"), &blob).is_err());
        assert_ne!(Sealed::Credential.table(), Sealed::OAuthToken.table());
    }
}
