//! The legacy HTTP+SSE transport (2024-11-05): the client opens a GET
//! stream, whose first event (`event: endpoint`) names the URL it must
//! POST its messages to (`/message?sessionId=…`, relative to the stream's
//! URL or absolute); the answers arrive on the GET stream.
//!
//! Passed on as the upstream wrote it, that endpoint would send the
//! client's POSTs to tessera's `/message`, outside any connection's
//! address (or, absolute, straight to the upstream without the stored
//! credential). So every `endpoint` event of every stream is rewritten
//! under the connection's address:
//!
//! ```text
//! announced  /message?sessionId=abc              (resolved against the upstream URL)
//! rewritten  /c/<id>/~sse/<tag>/message?sessionId=abc
//! tag        base64url(HMAC(key, caller, connection, upstream origin, path, query))[..128 bits]
//! ```
//!
//! A POST to `/c/<id>/~sse/<tag><path>?<query>` goes through every stage
//! like any other (authenticate, authorize, inject, redact) and is sent to
//! `<upstream origin><path>?<query>` only when the tag is this caller's on
//! this connection for exactly that path and query. So the only paths of
//! the upstream's origin a caller reaches this way are the ones the
//! upstream announced to that caller (a caller cannot walk the upstream's
//! origin with the stored credential), and the announced session goes on
//! only for the caller it was announced to, like `Mcp-Session-Id`
//! (`crate::proxy::session`). Nothing is stored: the key is derived from
//! the master key ring, so any replica checks it.
//!
//! An endpoint tessera will not vouch for ends the stream before its event
//! (the client never learns it): one on another origin (never followed),
//! one with a `.`/`..` segment or any form [`normalize_sub_path`] refuses
//! (servers and clients resolve them differently), one with a backslash,
//! a control character, a space or non-ASCII (clients strip or fold them
//! differently).

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use url::Url;

use crate::model::{Caller, Upstream};
use crate::proxy::path::{is_dot_segment, normalize_sub_path, PathRule};
use crate::state::State;

/// The sub-path under which announced endpoints live.
pub const PREFIX: &str = "/~sse/";
/// 128 bits in unpadded base64url.
pub(crate) const TAG_LEN: usize = 22;

/// Why an announced endpoint was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("the upstream announced a legacy SSE endpoint on another origin; tessera does not follow it")]
    OtherOrigin,
    #[error("the upstream announced a legacy SSE endpoint that is not a URL tessera can read alike with every client")]
    Unreadable,
    #[error("the upstream announced a legacy SSE endpoint whose path breaks tessera's path rule {}", .0.reason().as_str())]
    Path(PathRule),
    #[error("an endpoint event outside the first event of a stream opened at the connection's address; tessera does not vouch for it")]
    NotAnnounced,
}

/// What rewriting an endpoint needs: the key, who it is bound to, and
/// whether this answer may announce one at all.
pub struct Endpoints {
    state: Arc<State>,
    caller: Arc<Caller>,
    connection: String,
    upstream: Arc<Upstream>,
    /// Only a 2xx `text/event-stream` answer to a GET of the connection's
    /// address itself is the stream a 2024-11-05 server announces its
    /// endpoint on. Any other answer (a sub-path's, a POST's) may carry
    /// text a caller chose (an upstream that echoes a query), and an
    /// endpoint event in it would mint a tag for any path: it ends the
    /// stream instead.
    may_announce: bool,
    /// The stream's endpoint was announced: a second one ends the stream.
    announced: bool,
}

/// The MAC's message (each part length-prefixed by `MasterKey::mac`).
pub(crate) fn message<'a>(
    id: &'a [u8; 8],
    caller: &'a str,
    connection: &'a str,
    origin: &'a str,
    path: &'a str,
    query: &'a str,
) -> [&'a [u8]; 7] {
    [
        b"legacy-sse-endpoint v1",
        id,
        caller.as_bytes(),
        connection.as_bytes(),
        origin.as_bytes(),
        path.as_bytes(),
        query.as_bytes(),
    ]
}

impl Endpoints {
    pub fn new(
        state: Arc<State>,
        caller: Arc<Caller>,
        connection: &str,
        upstream: Arc<Upstream>,
        may_announce: bool,
    ) -> Self {
        Endpoints {
            state,
            caller,
            connection: connection.to_string(),
            upstream,
            may_announce,
            announced: false,
        }
    }

    /// The endpoint the caller is told: `announced` (resolved against the
    /// upstream URL, as the client would against the stream's URL) under
    /// the connection's address, as an absolute path (the client resolves
    /// it against the URL it connected to, on tessera's origin).
    pub fn rewrite(&self, announced: &str) -> Result<String, EndpointError> {
        let (path, query) = resolve(&self.upstream.url, announced)?;
        let origin = self.upstream.url.origin().ascii_serialization();
        let id = self.caller.id.to_be_bytes();
        let tag = self.state.master_key().mac(&message(
            &id,
            &self.caller.name,
            &self.connection,
            &origin,
            &path,
            query.as_deref().unwrap_or(""),
        ));
        let mut out = format!(
            "/c/{}{PREFIX}{}{path}",
            self.connection,
            URL_SAFE_NO_PAD.encode(tag)
        );
        if let Some(q) = query {
            out.push('?');
            out.push_str(&q);
        }
        Ok(out)
    }
}

/// The path (normalized) and query of an announced endpoint on the
/// upstream's origin.
fn resolve(upstream: &Url, announced: &str) -> Result<(String, Option<String>), EndpointError> {
    // What a WHATWG parser would strip or fold (tabs, newlines, spaces,
    // `\`) and non-ASCII are read otherwise by Python's `urljoin`.
    if announced.is_empty()
        || !announced
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'\\')
    {
        return Err(EndpointError::Unreadable);
    }
    // A dot segment is resolved by the client's URL parser, but a server
    // may read the raw path otherwise; the path is refused, not resolved.
    let raw_path = announced.split(['?', '#']).next().unwrap_or("");
    if raw_path.split('/').any(is_dot_segment) {
        return Err(EndpointError::Path(PathRule::DotSegment));
    }
    let url = upstream
        .join(announced)
        .map_err(|_| EndpointError::Unreadable)?;
    if url.origin() != upstream.origin() || !url.origin().is_tuple() {
        return Err(EndpointError::OtherOrigin);
    }
    let path = normalize_sub_path(url.path()).map_err(EndpointError::Path)?;
    let query = url.query().filter(|q| !q.is_empty()).map(str::to_string);
    Ok((path.into_owned(), query))
}

/// Rewrite one SSE event if it is an `endpoint` event with data.
/// `Ok(None)`: pass it as it is. The fields are read as an `EventSource`
/// reads them (the last `event` field names the type; `data` fields are
/// joined with newlines; a byte-order mark at the start is dropped).
/// `Ok(Some((lines, data)))`: the event's lines, and the rewritten
/// endpoint to put in place of its data (`response::tool_list` writes it).
pub fn rewrite_event<'a>(
    event: &'a [u8],
    e: &mut Endpoints,
) -> Result<Option<(Vec<&'a str>, String)>, EndpointError> {
    // The type is spelled so in the bytes (SSE has no escapes).
    if memchr::memmem::find(event, b"endpoint").is_none() {
        return Ok(None);
    }
    let text = std::str::from_utf8(event).map_err(|_| EndpointError::Unreadable)?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text
        .split('\n')
        .flat_map(|l| l.split('\r'))
        .filter(|l| !l.is_empty())
        .collect();
    let field = |l: &str| -> (String, String) {
        match l.split_once(':') {
            Some((name, value)) => (
                name.to_string(),
                value.strip_prefix(' ').unwrap_or(value).to_string(),
            ),
            None => (l.to_string(), String::new()),
        }
    };
    let fields: Vec<(String, String)> = lines
        .iter()
        .filter(|l| !l.starts_with(':'))
        .map(|l| field(l))
        .collect();
    let kind = fields.iter().rev().find(|(n, _)| n == "event");
    if kind.is_none_or(|(_, v)| v != "endpoint") {
        return Ok(None);
    }
    let data: Vec<&str> = fields
        .iter()
        .filter(|(n, _)| n == "data")
        .map(|(_, v)| v.as_str())
        .collect();
    if data.is_empty() {
        // An event without data is never dispatched.
        return Ok(None);
    }
    if !e.may_announce || e.announced {
        return Err(EndpointError::NotAnnounced);
    }
    let new = e.rewrite(&data.join("\n"))?;
    e.announced = true;
    Ok(Some((lines, new)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up() -> Url {
        Url::parse("http://up.example:8080/sse").unwrap()
    }

    #[test]
    fn resolves_relative_and_absolute_on_the_upstream_origin() {
        for (a, path, q) in [
            ("/message?sessionId=1", "/message", Some("sessionId=1")),
            ("message?sessionId=1", "/message", Some("sessionId=1")),
            ("http://up.example:8080/m/x", "/m/x", None),
            ("//up.example:8080/m", "/m", None),
            (
                "/messages/?session_id=ab",
                "/messages/",
                Some("session_id=ab"),
            ),
            ("/%6Dessage", "/message", None),
        ] {
            assert_eq!(
                resolve(&up(), a).unwrap(),
                (path.to_string(), q.map(str::to_string)),
                "{a}"
            );
        }
    }

    #[test]
    fn refuses_what_it_cannot_vouch_for() {
        use EndpointError::*;
        for (a, e) in [
            ("http://evil.example/message", OtherOrigin),
            ("//evil.example/message", OtherOrigin),
            ("https://up.example:8080/message", OtherOrigin),
            ("http://up.example:8081/message", OtherOrigin),
            ("http://up.example.evil.example:8080/m", OtherOrigin),
            ("/a/../message", Path(PathRule::DotSegment)),
            ("/a/%2e%2E/message", Path(PathRule::DotSegment)),
            ("../message", Path(PathRule::DotSegment)),
            ("/a%2fb", Path(PathRule::EncodedSeparator)),
            ("/a;b", Path(PathRule::Parameter)),
            ("/a%252e", Path(PathRule::DoubleEncoding)),
            ("/a\\b", Unreadable),
            ("/mess\nage", Unreadable),
            ("/mess age", Unreadable),
            ("", Unreadable),
            ("/é", Unreadable),
            ("javascript:alert(1)", OtherOrigin),
        ] {
            assert_eq!(resolve(&up(), a), Err(e), "{a}");
        }
    }
}
