//! The one place a request is decided: the policy engine, then the
//! external authorizer composed behind it.

use crate::authz::external::ExternalAuthorizer;
use crate::authz::{Authorizer, AuthzRequest, Verdict};

/// Every decision on a request: the policies' verdict (`policies`), then,
/// when one is configured, the external authorizer's second opinion on
/// what the policies allowed or asked; the stricter stands. (The external
/// exchange is boxed: it would otherwise make every request's future
/// larger.)
pub async fn verdict(
    policies: &dyn Authorizer,
    external: Option<&ExternalAuthorizer>,
    req: &AuthzRequest<'_>,
) -> Verdict {
    let v = policies.authorize(req);
    match external {
        Some(ext) => Box::pin(ext.consult(req, v)).await,
        None => v,
    }
}
