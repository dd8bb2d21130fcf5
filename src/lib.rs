//! tessera: a credential-holding MCP forwarding proxy.
//!
//! # Layout
//! A request to `/c/<id>` flows through one module per stage, in
//! [`proxy::handle`]:
//! - [`route`]: the method (POST, GET, DELETE) and the address, before
//!   anything is loaded;
//! - [`server`]: Origin and Host checks (DNS rebinding), the accept loop
//!   ([`raw_head`]: 408 for a head that does not arrive in time, 400 for
//!   one that frames its body twice);
//! - [`authn`]: the caller's bearer token against the in-memory snapshot,
//!   and the address checked as that caller's;
//! - [`jsonrpc`]: a bounded peek at the POST body for method and tool,
//!   refusing messages upstreams could read otherwise ([`canonical`]:
//!   folded names, the canonical arguments policies read);
//! - [`authz`]: the `Authorizer` decision ([`policy`]: Cedar; [`ext_authz`]:
//!   the external authorizer; [`approvals`]: calls held for a person);
//! - [`forward`]: strip the caller's credentials, inject the stored one
//!   (or the current [`oauth`] token), send on the one pooled client
//!   ([`pool`], [`h1`]);
//! - [`filter`]: response headers and upstream 401/403 on the way back;
//!   [`redact`]: the injected secret replaced wherever it comes back;
//!   [`tool_list`]: `tools/list` answers cut to the tools a caller may call;
//! - [`error`]: the one error type and its HTTP/JSON-RPC rendering.
//!
//! Around them: [`snapshot`] (callers, connections and opened credentials
//! in memory, refreshed from the store off the hot path), [`store`] (the
//! database: SQLite or Postgres), [`changes`] (Postgres NOTIFY between
//! replicas), [`secrets`] (sealing and token generation), [`credentials`]
//! (how a secret becomes a header), [`admin`] (the CLI's commands),
//! [`login`] (the interactive OAuth flow of `credential login`), [`audit`]
//! (the decision trail),
//! [`config`] (validated settings), [`logging`] (the buffered logfmt log),
//! [`metrics`] (the counters of `/metrics`), [`memory`] (free memory
//! returned after a wave of streams closes).

#![forbid(unsafe_code)]

pub mod admin;
pub mod admin_api;
pub mod approvals;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod body;
pub mod canonical;
pub mod capacity;
pub mod changes;
pub mod config;
pub mod console;
pub mod credentials;
pub mod decode;
pub mod egress;
pub mod error;
pub mod ext_authz;
pub mod filter;
pub mod forward;
#[doc(hidden)]
pub mod fuzzing;
pub mod h1;
pub mod jsonrpc;
#[doc(hidden)]
pub mod leaks;
pub mod limits;
pub mod logging;
pub mod login;
pub mod memory;
pub mod metrics;
pub mod oauth;
pub mod policy;
pub mod pool;
pub mod proxy;
pub mod raw_head;
pub mod redact;
pub mod route;
pub mod secrets;
pub mod server;
pub mod session;
pub mod snapshot;
pub mod store;
pub mod tool_list;
