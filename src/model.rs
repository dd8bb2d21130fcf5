//! What the data plane knows of a caller and where its connection leads:
//! the entities the snapshot holds and the authorizers read.

use std::sync::Arc;

use url::Url;

use crate::credentials::Injection;

/// A live caller.
#[derive(Debug)]
pub struct Caller {
    pub id: i64,
    pub name: String,
    pub groups: Vec<String>,
    /// Its requests in flight and rate bucket: the same object from one
    /// snapshot to the next, so a reload never resets a limit.
    pub usage: Arc<crate::limits::CallerUse>,
}

/// An upstream and the credential injected into requests to it.
#[derive(Debug)]
pub struct Upstream {
    /// The credential's name: safe to show, unlike its value.
    pub credential: String,
    pub url: Url,
    pub auth: Auth,
}

impl Upstream {
    /// What keeps this credential's secrets out of what reaches a caller.
    pub fn redactor(&self) -> Arc<crate::redact::Redactor> {
        match &self.auth {
            Auth::Static(inj) => inj.redactor.clone(),
            Auth::OAuth(source) => source.redactor(),
        }
    }
}

/// Where the injected header comes from.
#[derive(Debug)]
pub enum Auth {
    /// A stored secret: the same header on every request.
    Static(Injection),
    /// An OAuth access token, fetched and refreshed as needed.
    OAuth(Arc<crate::credentials::oauth::OAuthSource>),
}

/// A live connection: one caller, one upstream.
#[derive(Debug)]
pub struct Connection {
    pub caller_id: i64,
    pub upstream: Arc<Upstream>,
}
