//! Approvals: calls an `@ask` policy (or the external authorizer) holds for
//! a person.
//!
//! A held call is recorded once as a pending approval keyed by caller,
//! connection, JSON-RPC method, tool and a SHA-256 of the canonical
//! arguments, and the caller is told its id. A person grants it (for a
//! TTL, once unless more uses are given) or denies it with
//! `tessera approval grant|deny ID`. A retry of the *same* call then finds
//! the grant and goes through, using it up; any other call (other
//! arguments included) needs its own approval. A denial stands: the same
//! call is refused with the denial's id, and the record stays listed, so
//! an agent switching to something else leaves a visible trail of pending
//! requests rather than quietly getting its way.
//!
//! Only held calls touch the database here; allowed and denied requests
//! never do.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::store::{Store, StoreError};

/// What identifies one call. Absent tool or arguments are `""`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct CallKey {
    pub caller: String,
    pub connection: String,
    pub rpc_method: String,
    pub tool: String,
    pub arguments_sha256: String,
}

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Granted,
    Denied,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Granted => "granted",
            Status::Denied => "denied",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Status, StoreError> {
        Ok(match s {
            "pending" => Status::Pending,
            "granted" => Status::Granted,
            "denied" => Status::Denied,
            other => {
                return Err(StoreError::Db(sqlx::Error::Decode(
                    format!("approval status {other:?}").into(),
                )))
            }
        })
    }
}

impl serde::Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A new pending approval.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub id: String,
    pub created_at: i64,
    pub key: CallKey,
    /// The arguments themselves, only with `--audit-arguments`.
    pub arguments: Option<String>,
    /// Why it is held: the `@ask` policies or the authorizer's reason.
    pub reason: Option<String>,
}

/// An approval as stored.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Approval {
    pub id: String,
    /// Unix milliseconds.
    pub created_at: i64,
    #[serde(flatten)]
    pub key: CallKey,
    pub arguments: Option<String>,
    pub reason: Option<String>,
    pub status: Status,
    pub decided_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub uses_left: Option<i64>,
}

/// One held call of a request, to settle.
#[derive(Debug)]
pub struct Held {
    pub key: CallKey,
    pub arguments: Option<String>,
    pub reason: Option<String>,
}

/// What became of a held call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// A person granted this call; one use was taken.
    Granted(String),
    /// Waiting for a person.
    Pending(String),
    /// A person denied this call.
    Denied(String),
}

impl Settled {
    pub fn id(&self) -> &str {
        match self {
            Settled::Granted(id) | Settled::Pending(id) | Settled::Denied(id) => id,
        }
    }
}

/// Settle the held calls of one request. Grants are used only when every
/// held call has one (a batch goes through whole or not at all, and a
/// refused batch spends nothing); otherwise each call without a grant gets
/// its pending (or standing denied) record.
pub async fn settle(store: &Store, held: &[Held]) -> Result<Vec<Settled>, StoreError> {
    let now = now_ms();
    let mut grants = Vec::with_capacity(held.len());
    for h in held {
        grants.push(store.live_grant(&h.key, now).await?);
    }
    if grants.iter().all(Option::is_some) {
        let mut out = Vec::with_capacity(held.len());
        let mut all_taken = true;
        for id in grants.iter().flatten() {
            all_taken &= store.take_grant(id, now).await?;
            out.push(Settled::Granted(id.clone()));
        }
        if all_taken {
            return Ok(out);
        }
        // A concurrent request used a grant up first: fall through and
        // record the call as held again.
        grants.iter_mut().for_each(|g| *g = None);
    }
    let mut out = Vec::with_capacity(held.len());
    for (h, grant) in held.iter().zip(grants) {
        if let Some(id) = grant {
            out.push(Settled::Granted(id));
            continue;
        }
        out.push(match store.open_approval(&h.key).await? {
            Some((id, Status::Denied)) => Settled::Denied(id),
            Some((id, _)) => Settled::Pending(id),
            None => Settled::Pending(
                store
                    .add_approval(&NewApproval {
                        id: new_id(),
                        created_at: now,
                        key: h.key.clone(),
                        arguments: h.arguments.clone(),
                        reason: h.reason.clone(),
                    })
                    .await?,
            ),
        });
    }
    Ok(out)
}

/// A new approval id: `ap_` and 60 random bits, short enough to type.
pub fn new_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";
    let mut rng = rand::rngs::OsRng;
    let mut s = String::from("ap_");
    for _ in 0..12 {
        s.push(char::from(ALPHABET[rng.gen_range(0..32)]));
    }
    s
}

/// The SHA-256 (hex) of a tool's arguments in canonical form: object keys
/// sorted, no insignificant whitespace. The same arguments sent with other
/// spacing or key order are the same call. No arguments: `""`.
pub fn arguments_digest(arguments: Option<&str>) -> String {
    let Some(text) = arguments else {
        return String::new();
    };
    let canonical = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => {
            let mut out = String::with_capacity(text.len());
            canonical(&v, &mut out);
            out
        }
        // Not reachable for a peeked body (its arguments parsed as JSON);
        // the raw text is still a faithful key.
        Err(_) => text.to_string(),
    };
    crate::audit::sha256_hex(canonical.as_bytes())
}

fn canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut entries: Vec<_> = m.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ignores_spacing_and_key_order() {
        let a = arguments_digest(Some(r#"{"b":[1,{"y":2,"x":"s"}],"a":null}"#));
        let b = arguments_digest(Some(r#"{ "a" : null, "b" : [ 1, { "x": "s", "y": 2 } ] }"#));
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert_ne!(
            a,
            arguments_digest(Some(r#"{"a":null,"b":[1,{"x":"s","y":3}]}"#))
        );
        assert_eq!(arguments_digest(None), "");
        // Escapes are normalised too.
        assert_eq!(
            arguments_digest(Some(r#"{"k":"\u0061"}"#)),
            arguments_digest(Some(r#"{"k":"a"}"#))
        );
    }

    #[test]
    fn ids_are_distinct_and_typable() {
        let a = new_id();
        assert!(a.starts_with("ap_") && a.len() == 15);
        assert!(a[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(a, new_id());
    }
}
