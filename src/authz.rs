//! Authorize: the policy decision. The `Authorizer` trait is what a policy
//! engine implements; [`crate::policy::CedarAuthorizer`] is the one tessera
//! runs, over the built-in policy (a caller may use its own live
//! connections for every MCP method) or the admin's policy folder.
//!
//! Authorization runs after authentication (it needs to know who asks) and
//! after the body is peeked (policies decide on the JSON-RPC method and the
//! tool name), and before anything is sent upstream.

use std::time::SystemTime;

use http::Method;

use crate::snapshot::{Caller, Connection};

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

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, by these policies.
    Allow(Vec<String>),
    Deny(Denial),
}

/// Why a request was denied: the policies that forbade it (empty: no
/// policy permits it). Policy ids are the admin's names, never secrets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Denial {
    pub policies: Vec<String>,
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.policies.is_empty() {
            f.write_str("no policy permits it")
        } else {
            write!(f, "forbidden by policy {}", self.policies.join(", "))
        }
    }
}

/// A policy decision point.
pub trait Authorizer: Send + Sync + 'static {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict;
}
