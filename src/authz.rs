//! Authorize: the policy decision. The `Authorizer` trait is what a policy
//! engine implements; `OwnConnections` lets a caller do anything on its own
//! live connections.
//!
//! Authorization runs after authentication (it needs to know who asks) and
//! after the body is peeked (policies decide on the JSON-RPC method and the
//! tool name), and before anything is sent upstream.

use http::Method;

use crate::snapshot::{Caller, Connection};

/// What a policy sees of a request.
#[derive(Debug)]
pub struct AuthzRequest<'a> {
    pub caller: &'a Caller,
    pub connection_id: &'a str,
    pub connection: &'a Connection,
    pub http_method: &'a Method,
    /// The JSON-RPC method of a POST (`tools/call`, `initialize`, …); for a
    /// 2025-03-26 batch, each message is authorized in turn.
    pub rpc_method: Option<&'a str>,
    /// The tool name of a `tools/call`.
    pub tool: Option<&'a str>,
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Denied, with a reason a person can read (never a secret).
    Deny(&'static str),
}

/// A policy decision point.
pub trait Authorizer: Send + Sync + 'static {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict;
}

/// A caller may use its own live connections for every MCP method.
#[derive(Debug, Default)]
pub struct OwnConnections;

impl Authorizer for OwnConnections {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict {
        if req.connection.caller_id == req.caller.id {
            Verdict::Allow
        } else {
            Verdict::Deny("this connection belongs to another caller")
        }
    }
}
