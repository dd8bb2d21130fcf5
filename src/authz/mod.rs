//! Authorize: the policy decision. The `Authorizer` trait is what a policy
//! engine implements; [`crate::authz::cedar::CedarAuthorizer`] is the one tessera
//! runs, over the built-in policy (a caller may use its own live
//! connections for every MCP method) or the admin's policy folder.
//!
//! Authorization runs after authentication (it needs to know who asks) and
//! after the body is peeked (policies decide on the JSON-RPC method and the
//! tool name), and before anything is sent upstream.

pub mod approvals;
pub mod canonical;
pub mod cedar;
pub mod decide;
pub mod external;
pub mod pins;
pub mod predict;

use std::time::SystemTime;

use http::Method;

use crate::model::{Caller, Connection};

/// What a policy sees of a request.
#[derive(Debug)]
pub struct AuthzRequest<'a> {
    pub caller: &'a Caller,
    pub connection_id: &'a str,
    pub connection: &'a Connection,
    /// The snapshot's callers, groups and connections, as policy entities,
    /// and the snapshot's revision (decisions are cached per revision).
    pub entities: &'a cedar_policy::Entities,
    pub revision: i64,
    pub http_method: &'a Method,
    /// The sub-path after the connection address, normalized as it is
    /// forwarded (`""` or `/…`: see [`crate::proxy::route::normalize_sub_path`]).
    pub path: &'a str,
    /// The JSON-RPC method of a POST (`tools/call`, `initialize`, …); for a
    /// 2025-03-26 batch, each message is authorized in turn.
    pub rpc_method: Option<&'a str>,
    /// The tool name of a `tools/call`, and its arguments as JSON text.
    pub tool: Option<&'a str>,
    pub arguments: Option<&'a str>,
    /// `MCP-Protocol-Version`, or the message's `_meta` protocol version.
    pub protocol_version: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub time: SystemTime,
}

/// A decision, with its grounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, by these policies.
    Allow(Grounds),
    /// Allowed once a person approves: an `@ask` policy (or the external
    /// authorizer) holds it.
    Ask(Grounds),
    Deny(Grounds),
}

impl Verdict {
    pub fn grounds(&self) -> &Grounds {
        match self {
            Verdict::Allow(g) | Verdict::Ask(g) | Verdict::Deny(g) => g,
        }
    }

    /// "allow", "ask" or "deny", as the audit trail stores it.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Allow(_) => "allow",
            Verdict::Ask(_) => "ask",
            Verdict::Deny(_) => "deny",
        }
    }

    /// How strict a verdict is: combining two verdicts keeps the stricter.
    fn rank(&self) -> u8 {
        match self {
            Verdict::Allow(_) => 0,
            Verdict::Ask(_) => 1,
            Verdict::Deny(_) => 2,
        }
    }

    /// The stricter of the policies' verdict and a second opinion (the
    /// external authorizer's). On a tie the second opinion's grounds are
    /// kept (they carry its reason), so a refusal names who refused.
    pub fn and(self, other: Verdict) -> Verdict {
        if other.rank() >= self.rank() {
            other
        } else {
            self
        }
    }
}

/// Why: the policies that determined a verdict (the permits that allowed
/// or asked, the forbids that denied; none on a deny means nothing
/// permitted it), and the external authorizer's reason, if it decided.
/// Policy ids and the authorizer's reason are the admin's words, never
/// secrets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grounds {
    pub policies: Vec<String>,
    pub reason: Option<String>,
    /// For an ask: every `@ask` permit that holds it is `@ask("learn")`,
    /// so a prediction may answer instead of a person
    /// ([`crate::authz::predict`]).
    pub learn: bool,
}

impl Grounds {
    /// The authorizer's reason.
    pub fn authorizer(reason: impl Into<String>) -> Grounds {
        Grounds {
            policies: Vec::new(),
            reason: Some(reason.into()),
            learn: false,
        }
    }

    /// One line for the audit trail: policy ids, then the reason.
    pub fn summary(&self) -> Option<String> {
        match (self.policies.is_empty(), &self.reason) {
            (true, None) => None,
            (false, None) => Some(self.policies.join(", ")),
            (true, Some(r)) => Some(format!("authorizer: {r}")),
            (false, Some(r)) => Some(format!("{}; authorizer: {r}", self.policies.join(", "))),
        }
    }
}

/// Shown as why a request was refused.
impl std::fmt::Display for Grounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.reason, self.policies.is_empty()) {
            (Some(r), _) => write!(f, "the external authorizer refused it ({r})"),
            (None, true) => f.write_str("no policy permits it"),
            (None, false) => write!(f, "forbidden by policy {}", self.policies.join(", ")),
        }
    }
}

/// A policy decision point.
pub trait Authorizer: Send + Sync + 'static {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict;
}

/// The actions the schema declares for JSON-RPC methods by name; any other
/// method is `notification` (a `notifications/…` method) or `other`. Also
/// the methods whose other spellings `jsonrpc::peek` refuses.
pub const METHOD_ACTIONS: [&str; 19] = [
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
    "subscriptions/listen",
];

/// The action a message (or a bodiless GET/DELETE) is, as policies and
/// the external authorizer name it.
pub fn action_name(http_method: &Method, rpc_method: Option<&str>) -> &'static str {
    match (http_method, rpc_method) {
        (&Method::GET, _) => "stream/open",
        (&Method::DELETE, _) => "session/end",
        (_, None) => "response",
        (_, Some(m)) => match METHOD_ACTIONS.iter().find(|a| **a == m) {
            Some(a) => a,
            None if m.starts_with("notifications/") => "notification",
            None => "other",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(p: &str) -> Grounds {
        Grounds {
            policies: vec![p.into()],
            reason: None,
            learn: false,
        }
    }

    #[test]
    fn the_stricter_verdict_stands() {
        let (allow, ask, deny) = (
            Verdict::Allow(g("a")),
            Verdict::Ask(g("b")),
            Verdict::Deny(Grounds::authorizer("no")),
        );
        assert_eq!(allow.clone().and(deny.clone()), deny);
        assert_eq!(deny.clone().and(allow.clone()), deny);
        assert_eq!(ask.clone().and(allow.clone()), ask);
        assert_eq!(allow.clone().and(ask.clone()), ask);
        // On a tie, the second opinion's grounds (its reason) are kept.
        let second = Verdict::Allow(Grounds::authorizer("fine"));
        assert_eq!(allow.and(second.clone()), second);
    }

    #[test]
    fn grounds_read_well() {
        assert_eq!(Grounds::default().to_string(), "no policy permits it");
        assert_eq!(g("x").to_string(), "forbidden by policy x");
        let both = Grounds {
            policies: vec!["own".into()],
            reason: Some("late".into()),
            learn: false,
        };
        assert_eq!(
            both.to_string(),
            "the external authorizer refused it (late)"
        );
        assert_eq!(both.summary().as_deref(), Some("own; authorizer: late"));
        assert_eq!(Grounds::default().summary(), None);
    }
}
