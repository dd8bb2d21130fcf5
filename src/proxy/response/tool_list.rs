//! Filter (body): a `tools/list` answer lists only the tools this caller
//! may call on this connection.
//!
//! Each listed tool is checked as a `tools/call` of that name by the
//! policies (no arguments: a tool a policy would refuse for every call
//! disappears; one an `@ask` policy holds stays listed, since a person may
//! grant it). The external authorizer is not asked per listed tool: it
//! still decides each call.
//!
//! Which answers are read:
//! - the JSON answer to a POST that holds a `tools/list` request, read
//!   whole up to a configured size;
//! - every SSE answer, a POST's or the GET stream, event by event (holding
//!   at most one event of that size): the SDKs route a result by its
//!   JSON-RPC id whatever stream carries it, so a `tools/list` result that
//!   an upstream sends on a ping's stream or the GET stream is a list the
//!   caller reads. Any result with a `tools` array is filtered, wherever
//!   it travels: no per-session record of request ids is needed, which
//!   keeps replicas stateless and misses nothing a record would catch.
//!
//! Other JSON answers (one POST's answer to its own requests) stream
//! through unread. Anything that would have to be passed on unfiltered
//! (too large, not JSON, bad UTF-8, a lone surrogate, nesting too deep, a
//! byte-order mark, compressed) is refused instead: a JSON answer with a
//! 502, an SSE stream by breaking it before that event, so the client
//! never dispatches it (an SSE event counts only once its blank line
//! arrives).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Method};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::authz::canonical::fold_eq;
use crate::authz::cedar::CedarAuthorizer;
use crate::authz::pins::{read_tools, PinBook};
use crate::authz::{Authorizer, AuthzRequest, Verdict};
use crate::model::Caller;
use crate::proxy::response::body::{full, ProxyBody};
use crate::snapshot::Snapshot;
use crate::wire::BoxError;

/// Why a `tools/list` answer could not be filtered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListError {
    #[error("the upstream's tools/list answer is larger than tessera's limit of {0} bytes (--tools-list-max-bytes)")]
    TooLarge(usize),
    #[error("the upstream's tools/list answer is not JSON tessera can read")]
    Unreadable,
    /// The JSON answer to a POST holds a response to a request that POST
    /// did not send (`crate::proxy::response::own_answers`).
    #[error("the upstream's JSON answer holds a response to a request its POST did not send")]
    Foreign,
    // Neither message holds what the upstream sent: a header of its choosing
    // would otherwise reach the caller in tessera's own words.
    #[error("the upstream's tools/list answer is still content-coded; tessera must read it to filter it")]
    Encoded,
    #[error("the upstream's tools/list answer has a content type that is neither JSON nor SSE")]
    ContentType,
    #[error("reading the upstream's tools/list answer failed")]
    Body,
    /// An SSE stream's `endpoint` event tessera will not pass on
    /// (`crate::proxy::legacy_sse`).
    #[error(transparent)]
    Endpoint(#[from] crate::proxy::legacy_sse::EndpointError),
}

/// Who is listing: what a per-tool decision needs.
pub struct ToolFilter {
    authorizer: Arc<CedarAuthorizer>,
    snapshot: Arc<Snapshot>,
    caller: Arc<Caller>,
    connection_id: String,
    protocol_version: Option<String>,
    origin: Option<String>,
    time: SystemTime,
    max_bytes: usize,
    path: String,
    /// Read a success answer as SSE whatever its Content-Type says.
    sse: bool,
    /// Rewrite `endpoint` events (the 2024-11-05 transport) under the
    /// connection's address.
    endpoints: Option<crate::proxy::legacy_sse::Endpoints>,
    /// Tool pinning (`crate::authz::pins`): runs before the policies.
    pins: Option<Arc<PinBook>>,
}

impl ToolFilter {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        authorizer: Arc<CedarAuthorizer>,
        snapshot: Arc<Snapshot>,
        caller: Arc<Caller>,
        connection_id: &str,
        protocol_version: Option<&str>,
        origin: Option<&str>,
        max_bytes: usize,
    ) -> ToolFilter {
        ToolFilter {
            authorizer,
            snapshot,
            caller,
            connection_id: connection_id.to_string(),
            protocol_version: protocol_version.map(str::to_string),
            origin: origin.map(str::to_string),
            time: SystemTime::now(),
            max_bytes,
            path: String::new(),
            sse: false,
            endpoints: None,
            pins: None,
        }
    }

    /// Hold the tools that tool pinning holds (before the policies filter
    /// the rest), and queue the definitions not recorded yet.
    pub fn with_pins(mut self, pins: Arc<PinBook>) -> ToolFilter {
        self.pins = Some(pins);
        self
    }

    /// Which of `tools` pinning lets through (all, without pinning).
    fn pinned(&self, tools: &[Value]) -> Vec<bool> {
        let Some(pins) = &self.pins else {
            return vec![true; tools.len()];
        };
        if pins.mode() == crate::config::PinMode::Off {
            return vec![true; tools.len()];
        }
        let Some(connection) = self.snapshot.connections.get(&self.connection_id) else {
            return vec![false; tools.len()];
        };
        let upstream = &connection.upstream;
        pins.list(
            &self.snapshot.pins,
            &upstream.credential,
            &upstream.redactor(),
            &read_tools(tools),
        )
    }

    /// Rewrite the `endpoint` events of an SSE answer with `e`.
    pub fn with_endpoints(mut self, e: crate::proxy::legacy_sse::Endpoints) -> ToolFilter {
        self.endpoints = Some(e);
        self
    }

    /// The sub-path of the request that asked: a tool is listed when it
    /// may be called there.
    pub fn with_path(mut self, path: &str) -> ToolFilter {
        self.path = path.to_string();
        self
    }

    /// Read a success answer as SSE whatever its Content-Type says (the
    /// answer to a GET: the TypeScript SDK reads it so).
    pub fn read_as_sse(mut self, sse: bool) -> ToolFilter {
        self.sse = sse;
        self
    }

    /// Whether this caller may (or may ask to) call `tool`.
    fn allows(&self, tool: &str) -> bool {
        let Some(connection) = self.snapshot.connections.get(&self.connection_id) else {
            return false;
        };
        let req = AuthzRequest {
            caller: &self.caller,
            connection_id: &self.connection_id,
            connection,
            entities: &self.snapshot.entities,
            revision: self.snapshot.revision,
            http_method: &Method::POST,
            path: &self.path,
            rpc_method: Some("tools/call"),
            tool: Some(tool),
            arguments: None,
            protocol_version: self.protocol_version.as_deref(),
            origin: self.origin.as_deref(),
            time: self.time,
        };
        !matches!(self.authorizer.authorize(&req), Verdict::Deny(_))
    }

    /// Filter the tools of every JSON-RPC result in `v` (one message or a
    /// batch) that lists tools. Returns how many such results it saw.
    fn filter_value(&self, v: &mut Value) -> usize {
        match v {
            Value::Array(items) => items.iter_mut().map(|m| self.filter_value(m)).sum(),
            // Go's `encoding/json` (Go MCP clients) reads `Result`,
            // `TOOLS`, `toolſ` and `Name` as `result`, `tools` and `name`
            // (`crate::authz::canonical`): every member that folds to one is read
            // (found by the attack review).
            Value::Object(m) => {
                let mut seen = 0;
                let results = m
                    .iter_mut()
                    .filter(|(k, _)| fold_eq(k, "result"))
                    .filter_map(|(_, r)| r.as_object_mut());
                for r in results {
                    let lists = r
                        .iter_mut()
                        .filter(|(k, _)| fold_eq(k, "tools"))
                        .filter_map(|(_, t)| t.as_array_mut());
                    for tools in lists {
                        // Pinning first: a held tool goes whatever the
                        // policies say.
                        let pinned = self.pinned(tools);
                        let mut i = 0;
                        // A tool without one string name cannot be
                        // checked: it goes.
                        tools.retain(|t| {
                            i += 1;
                            if !pinned[i - 1] {
                                return false;
                            }
                            let mut names = t
                                .as_object()
                                .into_iter()
                                .flatten()
                                .filter(|(k, _)| fold_eq(k, "name"));
                            match (names.next(), names.next()) {
                                (Some((_, Value::String(n))), None) => self.allows(n),
                                _ => false,
                            }
                        });
                        seen += 1;
                    }
                }
                seen
            }
            _ => 0,
        }
    }

    /// Rewrite one JSON text. `Ok(None)`: it lists no tools, pass it as is.
    fn rewrite(&mut self, json: &[u8]) -> Result<Option<Vec<u8>>, ListError> {
        let mut v: Value = serde_json::from_slice(json).map_err(|_| ListError::Unreadable)?;
        if self.filter_value(&mut v) == 0 {
            return Ok(None);
        }
        Ok(Some(
            serde_json::to_vec(&v).expect("a JSON value serializes"),
        ))
    }

    /// Filter an answer: a JSON body is read (bounded) and rewritten; an
    /// SSE body is wrapped to be rewritten event by event. Error statuses
    /// (no tools in them) pass through.
    pub async fn apply<B>(
        mut self,
        status: http::StatusCode,
        headers: &mut HeaderMap,
        body: B,
    ) -> Result<ProxyBody, ListError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        // Not only 2xx: the Python SDK (2.x) reads a 3xx answer's JSON as
        // messages too (found by the attack review). An error status's
        // body no client dispatches as an answer.
        if status.as_u16() >= 400 {
            return Ok(body.map_err(Into::into).boxed());
        }
        // Codings were undone before (`crate::wire::decode`); one left is a bug.
        if headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            return Err(ListError::Encoded);
        }
        let ctype = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let essence = ctype.split(';').next().unwrap_or("").trim();
        headers.remove(header::CONTENT_LENGTH);
        match essence {
            _ if self.sse || essence == "text/event-stream" => Ok(Sse::new(body, self).boxed()),
            "application/json" => {
                let bytes = collect(body, self.max_bytes).await?;
                // No body (a 202 under a JSON type) lists nothing.
                let out = match (!bytes.is_empty())
                    .then(|| self.rewrite(&bytes))
                    .transpose()?
                    .flatten()
                {
                    Some(v) => Bytes::from(v),
                    None => bytes,
                };
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
                Ok(full(out))
            }
            // A body no client reads as messages passes unread: a type
            // tessera reads that names neither JSON nor SSE (the 2024-11-05
            // transport's `202 Accepted` in text/plain).
            _ if status == http::StatusCode::ACCEPTED && plainly_neither(headers) => {
                Ok(body.map_err(Into::into).boxed())
            }
            // No body (a 202, a redirect's empty answer) lists nothing; a
            // body of a type tessera cannot read is not something it can
            // vouch for: Go's SDK reads a 202's body under a type it trims
            // of Unicode spaces, `\u{a0}application/json` (found by the
            // attack review).
            _ => {
                let bytes = collect(body, self.max_bytes).await?;
                if !bytes.is_empty() {
                    return Err(ListError::ContentType);
                }
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
                Ok(full(bytes))
            }
        }
    }
}

/// Whether the Content-Type is absent (the 2024-11-05 transport's
/// `Accepted` in Node has none; no client reads an untyped body as
/// messages), or is one tessera reads (visible ASCII) and names neither
/// JSON nor an event stream anywhere in it, as the most lenient client's
/// test (`includes`) would look for them.
pub(crate) fn plainly_neither(headers: &HeaderMap) -> bool {
    let mut types = headers.get_all(header::CONTENT_TYPE).iter();
    let v = match (types.next(), types.next()) {
        (None, _) => return true,
        (Some(v), None) => v,
        (Some(_), Some(_)) => return false,
    };
    let Ok(v) = v.to_str() else {
        return false;
    };
    // The usual answer's type, without the scan below.
    if v == "application/json" {
        return false;
    }
    let v = v.as_bytes();
    let names = |needle: &[u8]| {
        memchr::memchr2_iter(needle[0], needle[0].to_ascii_uppercase(), v).any(|i| {
            v.get(i..i + needle.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(needle))
        })
    };
    !v.is_empty() && !names(b"json") && !names(b"event-stream")
}

/// `body` read whole into one buffer, at most `max` bytes. Copied as it
/// comes rather than kept frame by frame: an upstream sending one byte per
/// frame would make each byte cost a frame's bookkeeping (found by the
/// attack review: 1 MiB so kept cost 120 MB).
async fn collect<B>(body: B, max: usize) -> Result<Bytes, ListError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut body = body;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ListError::Body)?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(ListError::TooLarge(max));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// An SSE body rewritten event by event.
struct Sse<B> {
    inner: B,
    buf: BytesMut,
    filter: ToolFilter,
    done: bool,
}

impl<B> Sse<B> {
    fn new(inner: B, filter: ToolFilter) -> Self {
        Sse {
            inner,
            buf: BytesMut::new(),
            filter,
            done: false,
        }
    }
}

/// The end of the first complete event in `b` (after its blank line).
fn event_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < b.len() {
        let eol = match b[i] {
            b'\n' => 1,
            // A \r at the end may still become \r\n.
            b'\r' if i + 1 == b.len() => return None,
            b'\r' if b[i + 1] == b'\n' => 2,
            b'\r' => 1,
            _ => {
                i += 1;
                continue;
            }
        };
        let next = i + eol;
        match (b.get(next), b.get(next + 1)) {
            (Some(b'\n'), _) => return Some(next + 1),
            (Some(b'\r'), Some(b'\n')) => return Some(next + 2),
            (Some(b'\r'), Some(_)) => return Some(next + 1),
            (Some(b'\r'), None) | (None, _) => return None,
            _ => i = next,
        }
    }
    None
}

/// Whether `b` holds `tool` in any letter case.
pub(crate) fn names_tools(b: &[u8]) -> bool {
    memchr::memchr2_iter(b'l', b'L', b).any(|i| tool_ends_at(b, i))
}

/// Whether the `l` at `i` ends `tool` in any letter case. Searches stop at
/// `l`/`L` rather than `t`/`T`: JSON and English hold fewer of them.
pub(crate) fn tool_ends_at(b: &[u8], i: usize) -> bool {
    i >= 3 && b[i - 3..i].eq_ignore_ascii_case(b"too")
}

/// Rewrite one event: its data lines, joined, are one JSON text; a
/// rewritten one becomes a single `data:` line where the first was.
/// `Ok(None)`: pass it as it is. An event that could hold a `tools`
/// member but cannot be read is an error: the stream ends before it.
fn rewrite_event(event: &[u8], f: &mut ToolFilter) -> Result<Option<Vec<u8>>, ListError> {
    // An `endpoint` event names a URL, not JSON: rewritten, and nothing
    // else is read of it.
    if let Some(e) = &mut f.endpoints {
        if let Some((lines, new)) = crate::proxy::legacy_sse::rewrite_event(event, e)? {
            return Ok(Some(with_data(&lines, new.as_bytes())));
        }
    }
    // A member named `tools` is spelled so in the bytes, or with an
    // escape (`tool\u0073`); an event with neither cannot list tools, and
    // is passed unparsed (most progress and log events).
    // Ignoring letter case, as a Go client reads it (`toolſ` too: no
    // other character folds to `t`, `o` or `l`).
    if !names_tools(event) && memchr::memchr(b'\\', event).is_none() {
        return Ok(None);
    }
    // Bad UTF-8 would reach a client as U+FFFD: not something tessera read.
    let text = std::str::from_utf8(event).map_err(|_| ListError::Unreadable)?;
    // A byte-order mark hides the first field from this reading, not from
    // a client's (which drops one at the start of a stream).
    if text.starts_with('\u{feff}') {
        return Err(ListError::Unreadable);
    }
    let lines: Vec<&str> = text
        .split('\n')
        .flat_map(|l| l.split('\r'))
        .filter(|l| !l.is_empty())
        .collect();
    let data: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("data"))
        .filter_map(|rest| match rest.strip_prefix(':') {
            Some(v) => Some(v.strip_prefix(' ').unwrap_or(v)),
            None if rest.is_empty() => Some(""),
            None => None,
        })
        .collect();
    if data.iter().all(|d| d.trim().is_empty()) {
        // No data (a comment, a priming event with an empty `data`): the
        // client dispatches nothing it could read as a list.
        return Ok(None);
    }
    let json = data.join("\n");
    let Some(new) = f.rewrite(json.as_bytes())? else {
        return Ok(None);
    };
    Ok(Some(with_data(&lines, &new)))
}

/// One event again from its non-empty `lines`, with `data` as its only
/// `data:` line, where the first was; the other fields and comments are
/// kept in order.
pub(crate) fn with_data(lines: &[&str], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum::<usize>() + data.len());
    let mut wrote = false;
    for l in lines {
        if *l == "data" || l.starts_with("data:") {
            if !wrote {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(data);
                out.push(b'\n');
                wrote = true;
            }
        } else {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
    }
    out.push(b'\n');
    out
}

impl<B> Body for Sse<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(end) = event_end(&this.buf) {
                let event = this.buf.split_to(end).freeze();
                let out = match rewrite_event(&event, &mut this.filter) {
                    Ok(Some(v)) => Bytes::from(v),
                    Ok(None) => event,
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                };
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            if this.done {
                if this.buf.is_empty() {
                    return Poll::Ready(None);
                }
                // An unterminated last event: clients drop it, but filter
                // it anyway rather than pass tools through.
                let event = this.buf.split().freeze();
                let out = match rewrite_event(&event, &mut this.filter) {
                    Ok(Some(v)) => Bytes::from(v),
                    Ok(None) => event,
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                };
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => this.done = true,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if this.buf.len() + data.len() > this.filter.max_bytes {
                            let max = this.filter.max_bytes;
                            return Poll::Ready(Some(Err(ListError::TooLarge(max).into())));
                        }
                        this.buf.extend_from_slice(&data);
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }
}

/// For the SSE fuzz target ([`crate::fuzzing::sse`]): split `data` into
/// events as the body does and rewrite each with a filter that lists no
/// tool (an empty snapshot). Every event found is a non-empty prefix, and
/// every rewritten event is again exactly one complete event.
#[doc(hidden)]
pub fn fuzz_events(data: &[u8]) {
    use std::sync::OnceLock;
    type Parts = (Arc<CedarAuthorizer>, Arc<Snapshot>, Arc<Caller>);
    static PARTS: OnceLock<Parts> = OnceLock::new();
    let (authorizer, snapshot, caller) = PARTS.get_or_init(|| {
        let snapshot = Snapshot {
            revision: 0,
            callers: Default::default(),
            connections: Default::default(),
            entities: cedar_policy::Entities::empty(),
            pins: Default::default(),
        };
        let caller = Caller {
            id: 1,
            name: "fuzz".into(),
            groups: vec![],
            usage: Default::default(),
        };
        (
            Arc::new(CedarAuthorizer::new(
                crate::authz::cedar::Policies::builtin(),
            )),
            Arc::new(snapshot),
            Arc::new(caller),
        )
    });
    let mut f = ToolFilter::new(
        authorizer.clone(),
        snapshot.clone(),
        caller.clone(),
        "fuzz",
        None,
        None,
        1 << 20,
    );
    let mut rest = data;
    while let Some(end) = event_end(rest) {
        assert!(end > 0 && end <= rest.len());
        let (event, tail) = rest.split_at(end);
        if let Ok(Some(out)) = rewrite_event(event, &mut f) {
            assert_eq!(event_end(&out), Some(out.len()), "{out:?}");
        }
        rest = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_boundaries() {
        assert_eq!(event_end(b"data: x\n\nrest"), Some(9));
        assert_eq!(event_end(b"data: x\r\n\r\nrest"), Some(11));
        assert_eq!(event_end(b"data: x\r\rrest"), Some(9));
        assert_eq!(event_end(b"data: x\n"), None);
        assert_eq!(event_end(b"data: x\r\n\r"), None);
        assert_eq!(event_end(b"data: x\r"), None);
        assert_eq!(event_end(b"id: 1\ndata: x\n\n"), Some(15));
    }
}
