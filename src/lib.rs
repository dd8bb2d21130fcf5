//! tessera: a credential-holding MCP forwarding proxy.
//!
//! # Layout
//! Folders are planes; each uses only the ones listed after it
//! (`tests/layout.rs` holds this: no cycles, uses go downward).
//!
//! - [`serve`]: the `serve` process assembled ([`serve::run`]): what the
//!   binary runs and the integration tests start.
//! - [`admin`]: the control plane: [`admin::service`] (every admin action,
//!   each recording itself in the admin audit), the HTTP API and the
//!   console.
//! - [`proxy`]: the data plane, one file per stage in request order, read
//!   top to bottom in [`proxy::handle`]:
//!   [`proxy::listener`] (accept loop, connection caps, drain;
//!   [`proxy::raw_head`]: 408/400 for heads hyper would not answer) →
//!   [`proxy::route`] (method and address) → [`proxy::origin`] (Host and
//!   Origin, DNS rebinding) → [`proxy::authn`] (the caller's token) →
//!   limits → [`proxy::body`] and [`proxy::jsonrpc`] (a bounded peek at
//!   method and tool) → tool pinning ([`authz::pins`]) → authorize
//!   ([`authz`]) → [`proxy::forward`] (strip,
//!   inject, send) → [`proxy::response`] (header filter, `tools/list`
//!   filtering) with the redactor on every byte; [`proxy::session`] binds
//!   MCP sessions to their caller; [`proxy::error`] is the one error type
//!   and its HTTP/JSON-RPC rendering.
//! - [`state`]: what every request shares.
//! - [`snapshot`]: callers, connections and opened credentials in memory,
//!   refreshed off the hot path ([`snapshot::pg_notify`] between replicas).
//! - [`authz`]: decisions: the `Authorizer` trait and the MCP action
//!   names, [`authz::decide`] (the one verdict: policies, then the external
//!   authorizer), Cedar ([`authz::cedar`]), approvals, the canonical
//!   reading of a call policies see ([`authz::canonical`]), and tool
//!   pinning ([`authz::pins`]: what a server may list and have called).
//! - [`model`]: the caller, connection and upstream a request resolves to.
//! - [`credentials`]: how a stored secret becomes a header; OAuth and the
//!   interactive login.
//! - [`audit`]: the decision trail's writer.
//! - [`config`]: validated settings.
//! - [`limits`]: per-caller limits and the capacity of the process.
//! - [`upstream`]: outbound networking: the pool, HTTP/1.1, egress.
//! - [`store`]: the database (SQLite or Postgres), one file per table
//!   group; every row type in [`store::model`].
//! - [`redact`]: the injected secret found in every form it could leave in.
//! - leaves: [`wire`] (header tables, content codings), [`crypto`] (the
//!   key ring, sealed values, tokens), [`telemetry`] (log, metrics, time,
//!   memory).

#![forbid(unsafe_code)]

/// An enum of fixed, labelled variants: each variant and its label written
/// once, with `ALL` (every variant, in order: `v as usize` indexes it) and
/// `as_str`. Refusal reasons and admin actions are such lists, where a
/// second list to keep in step would be a place to forget one.
macro_rules! labelled {
    ($(#[$meta:meta])* pub enum $name:ident { $($variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The variant's label, stable (logs, metrics and records key on it).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod admin;
pub mod audit;
pub mod authz;
pub mod config;
pub mod credentials;
pub mod crypto;
#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
pub mod model;
pub mod proxy;
pub mod redact;
pub mod serve;
pub mod snapshot;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod upstream;
pub mod wire;
