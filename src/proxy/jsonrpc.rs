//! JSON-RPC inspection of a POST body: the id, method and tool name a
//! policy needs, read without building a full JSON tree. The body itself is
//! forwarded byte for byte; this only looks.

use std::borrow::Cow;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use crate::authz::canonical::{self, CanonicalError};
use crate::proxy::error::ProxyError;

/// The member names of one object, kept to check them: inline up to
/// four (a message's `jsonrpc`, `id`, `method`, `params`; `params`'
/// `name`, `arguments`, `_meta`), so the usual message allocates none.
type Names<'a> = SmallVec<[Cow<'a, str>; 4]>;

/// One JSON-RPC message, as far as tessera cares.
///
/// Read member by member (not with serde's derive, which drops the names
/// it does not know): every name of the message, of `params` and of
/// `params._meta` is kept, so that [`peek`] can refuse a message an
/// upstream could read otherwise (see [`Message::check_unambiguous`]).
#[derive(Debug, Default)]
pub struct Message<'a> {
    pub id: Option<&'a RawValue>,
    pub method: Option<Cow<'a, str>>,
    params: Option<Params<'a>>,
    jsonrpc: Option<Cow<'a, str>>,
    names: Names<'a>,
}

#[derive(Debug, Default)]
struct Params<'a> {
    name: Option<Cow<'a, str>>,
    /// `params.uri` when it is a string (`resources/read`'s `Mcp-Name`).
    uri: Option<Cow<'a, str>>,
    arguments: Option<&'a RawValue>,
    meta: Option<Meta<'a>>,
    names: Names<'a>,
}

#[derive(Debug, Default)]
struct Meta<'a> {
    protocol_version: Option<Cow<'a, str>>,
    names: Names<'a>,
}

/// The `_meta` member naming the protocol version (2026-07-28).
const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// The members tessera reads in a message or its `params`. A name that
/// folds to one of them without being it (`METHOD`, `paramſ`, `Name`) is
/// read by Go as that member and ignored by tessera: refused, at either
/// level (no MCP message has such a name for another purpose).
const KNOWN_MEMBERS: [&str; 8] = [
    "jsonrpc",
    "id",
    "method",
    "params",
    "name",
    "arguments",
    "uri",
    "_meta",
];

/// A string borrowed from the body unless it holds an escape. serde
/// borrows a `Cow<str>` only when the type is exactly that; inside an
/// `Option` it would copy every string, an allocation each.
#[derive(Deserialize)]
struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);

fn string<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Cow<'de, str>>, A::Error> {
    Ok(map.next_value::<Option<Borrowed<'de>>>()?.map(|b| b.0))
}

/// A value kept when it is a string, skipped otherwise.
struct MaybeString<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for MaybeString<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeString<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(MaybeString(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(MaybeString(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(MaybeString(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(MaybeString(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(MaybeString(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(MaybeString(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(MaybeString(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                s: A,
            ) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(s).map(|_| MaybeString(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_map(m).map(|_| MaybeString(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Message<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = Message::default();
                while let Some(Borrowed(k)) = map.next_key()? {
                    // A repeated member overwrites here; the check refuses
                    // the message anyway.
                    match &*k {
                        "id" => m.id = map.next_value()?,
                        "method" => m.method = string(&mut map)?,
                        "params" => m.params = map.next_value()?,
                        "jsonrpc" => m.jsonrpc = string(&mut map)?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    m.names.push(k);
                }
                Ok(m)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Params<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Params<'de>;
            // MCP's params are always an object; serde's derive would also
            // have read an array by position (`["delete_repo"]` as a name).
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("params as an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut p = Params::default();
                while let Some(Borrowed(k)) = map.next_key()? {
                    match &*k {
                        "name" => p.name = string(&mut map)?,
                        "uri" => p.uri = map.next_value::<MaybeString>()?.0,
                        "arguments" => p.arguments = map.next_value()?,
                        "_meta" => p.meta = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    p.names.push(k);
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Meta<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Meta<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("_meta as an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = Meta::default();
                while let Some(Borrowed(k)) = map.next_key()? {
                    if k == PROTOCOL_VERSION {
                        m.protocol_version = string(&mut map)?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                    m.names.push(k);
                }
                Ok(m)
            }
        }
        d.deserialize_map(V)
    }
}

/// Refuse an object whose names are not distinct once folded, or which
/// holds a name that folds to one of `known` without being it.
fn unambiguous(names: &[Cow<str>], known: &[&str], what: &'static str) -> Result<(), ProxyError> {
    if canonical::distinct_members(names).is_err() {
        return Err(ProxyError::Ambiguous(what));
    }
    for n in names {
        // A known name itself folds to no other known one (they are
        // distinct folded): the usual member costs one comparison per
        // known name, not a fold of each.
        if known.contains(&n.as_ref()) {
            continue;
        }
        if known.iter().any(|k| canonical::folds_to(n, k)) {
            return Err(ProxyError::Ambiguous(
                "a member name differs from a JSON-RPC or MCP member only in letter case",
            ));
        }
    }
    Ok(())
}

impl Message<'_> {
    /// The tool name of a `tools/call`.
    pub fn tool(&self) -> Option<&str> {
        if self.method.as_deref() == Some("tools/call") {
            self.params.as_ref()?.name.as_deref()
        } else {
            None
        }
    }

    /// The arguments of a `tools/call`, as the JSON text the caller sent.
    pub fn arguments(&self) -> Option<&str> {
        if self.method.as_deref() == Some("tools/call") {
            Some(self.params.as_ref()?.arguments?.get())
        } else {
            None
        }
    }

    /// `params.name`, whatever the method (`Mcp-Name`'s source).
    fn name(&self) -> Option<&str> {
        self.params.as_ref()?.name.as_deref()
    }

    /// `params.uri`, when a string.
    fn uri(&self) -> Option<&str> {
        self.params.as_ref()?.uri.as_deref()
    }

    /// Refuse a message some upstream could read otherwise than tessera
    /// does. tessera forwards the caller's bytes, so what it decided on
    /// must be the only reading of them:
    /// - in the message, its `params`, `params._meta` and the `arguments`
    ///   at every depth, no two member names equal ignoring letter case
    ///   (Unicode folding) and no name twice: Go's `encoding/json` matches
    ///   names ignoring case and lets the last win, where tessera read the
    ///   exact name (`{"name":"list_files","Name":"delete_repo"}`);
    /// - no member that folds to one tessera reads without being it
    ///   (`METHOD`, `paramſ`): Go reads it, tessera would not;
    /// - no unpaired surrogate escape in the arguments (Go reads U+FFFD,
    ///   Python and JavaScript the surrogate);
    /// - no method that differs from a known MCP method only in letter
    ///   case (`Tools/call`): see [`known_method_in_other_case`].
    ///
    /// Refusing, rather than forwarding a canonical form tessera writes
    /// itself, keeps what the upstream gets byte for byte what was
    /// authorized, and no re-serialization can re-emit something else.
    fn check_unambiguous(&self) -> Result<(), ProxyError> {
        unambiguous(
            &self.names,
            &KNOWN_MEMBERS,
            "two members of the message have names equal ignoring letter case",
        )?;
        if let Some(p) = &self.params {
            unambiguous(
                &p.names,
                &KNOWN_MEMBERS,
                "two members of params have names equal ignoring letter case",
            )?;
            if let Some(m) = &p.meta {
                unambiguous(
                    &m.names,
                    &[PROTOCOL_VERSION],
                    "two members of params._meta have names equal ignoring letter case",
                )?;
            }
            if let Some(a) = p.arguments {
                canonical::check(a.get()).map_err(|e| {
                    ProxyError::Ambiguous(match e {
                        CanonicalError::AmbiguousMembers => "two members of an object in the arguments have names equal ignoring letter case",
                        CanonicalError::LoneSurrogate => "a string in the arguments holds an unpaired surrogate escape",
                        CanonicalError::TooDeep => "the arguments nest too deep to be read one way",
                        CanonicalError::Syntax => "the arguments cannot be read",
                    })
                })?;
            }
        }
        if let Some(m) = &self.method {
            if known_method_in_other_case(m) {
                return Err(ProxyError::Ambiguous(
                    "the method differs from a known MCP method only in letter case or padding",
                ));
            }
        }
        Ok(())
    }

    /// The protocol version the message's `_meta` names (2026-07-28).
    pub fn protocol_version(&self) -> Option<&str> {
        self.params
            .as_ref()?
            .meta
            .as_ref()?
            .protocol_version
            .as_deref()
    }
}

/// A POST body: one message, or a batch (allowed by 2025-03-26 only).
// A lone message is held inline on the request's stack (about 0.5 KiB
// with its member names); boxing it would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Peek<'a> {
    One(Message<'a>),
    Batch(Vec<Message<'a>>),
}

impl<'a> Peek<'a> {
    pub fn messages(&self) -> &[Message<'a>] {
        match self {
            Peek::One(m) => std::slice::from_ref(m),
            Peek::Batch(v) => v,
        }
    }

    /// The id to put on an error answer: a single request's id.
    pub fn id(&self) -> Option<&'a RawValue> {
        match self {
            Peek::One(m) => m.id,
            Peek::Batch(_) => None,
        }
    }
}

/// Read the messages of a POST body. Invalid JSON is a parse error; JSON
/// that is not a JSON-RPC 2.0 message (or batch of them) is an invalid
/// request. Responses from the client (no method) are valid messages.
pub fn peek(body: &[u8]) -> Result<Peek<'_>, ProxyError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    let peek = match first {
        Some(b'[') => {
            let v: Vec<Message> = serde_json::from_slice(body).map_err(classify)?;
            if v.is_empty() {
                return Err(ProxyError::InvalidRequest("an empty JSON-RPC batch"));
            }
            Peek::Batch(v)
        }
        Some(b'{') => Peek::One(serde_json::from_slice(body).map_err(classify)?),
        Some(_) => {
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                    Ok(_) => ProxyError::InvalidRequest("the body must be a JSON-RPC 2.0 object"),
                    Err(_) => ProxyError::ParseError,
                },
            )
        }
        None => return Err(ProxyError::InvalidRequest("the POST body is empty")),
    };
    for m in peek.messages() {
        if m.jsonrpc.as_deref() != Some("2.0") {
            return Err(ProxyError::InvalidRequest(
                "each message needs \"jsonrpc\": \"2.0\"",
            ));
        }
        m.check_unambiguous()?;
    }
    Ok(peek)
}

/// Whether `method` equals a method MCP defines (or a `notifications/`
/// one) ignoring letter case, without being it.
///
/// Refused rather than decided as that method: an upstream that matches
/// methods exactly (the SDKs do) would not run it, one that folds case
/// would, and tessera cannot know which it forwards to; deciding it as
/// `tools/call` would also have to carry the spelling through approvals,
/// the audit trail and the tools/list filter. A refusal is one answer for
/// every upstream, and no client sends such a method.
///
/// So is a known method padded with white space or control characters
/// (`"tools/call "`): an upstream that trims the name would run the call,
/// which tessera would have decided as an unknown method (found by a new
/// user's trial).
pub fn known_method_in_other_case(method: &str) -> bool {
    const NOTIFICATIONS: &str = "notifications/";
    if crate::authz::METHOD_ACTIONS.contains(&method) || method.starts_with(NOTIFICATIONS) {
        return false;
    }
    let method = method.trim_matches(|c: char| c.is_whitespace() || c.is_control());
    crate::authz::METHOD_ACTIONS
        .iter()
        .any(|k| canonical::fold_eq(method, k))
        || canonical::fold_starts_with(method, NOTIFICATIONS)
}

/// Refuse a request whose routing headers (2026-07-28) disagree with its
/// body: an intermediary (or the upstream's router) acting on the headers
/// and the upstream running the body would act on different calls.
///
/// `Mcp-Method` must equal the message's method; `Mcp-Name` its tool or
/// prompt name (`tools/call`, `prompts/get`), its resource URI
/// (`resources/read`), and for any other method its `params.name`. Either
/// header twice, either on a batch, a bodiless GET or DELETE, or `Mcp-Name`
/// on a message that names nothing, is refused. Values compare exactly
/// (they are case-sensitive); a value in the revision's `=?base64?…?=`
/// form is compared decoded.
pub fn check_routing_headers(
    headers: &http::HeaderMap,
    peek: Option<&Peek<'_>>,
) -> Result<(), ProxyError> {
    use crate::wire::headers::{MCP_METHOD, MCP_NAME};
    let one = |name: http::HeaderName, twice: &'static str| {
        let mut all = headers.get_all(name).iter();
        match (all.next(), all.next()) {
            (v, None) => Ok(v),
            _ => Err(ProxyError::HeaderMismatch(twice)),
        }
    };
    let method = one(MCP_METHOD, "Mcp-Method appears more than once")?;
    let name = one(MCP_NAME, "Mcp-Name appears more than once")?;
    check_version(headers, peek)?;
    // `Mcp-Param-*` headers are rare; finding none is one pass over the
    // (few) header names.
    let params = headers.keys().any(|n| n.as_str().starts_with("mcp-param-"));
    if method.is_none() && name.is_none() && !params {
        return Ok(());
    }
    let Some(Peek::One(m)) = peek else {
        return Err(ProxyError::HeaderMismatch(
            "Mcp-Method and Mcp-Name go with a body of one JSON-RPC message",
        ));
    };
    if let Some(h) = method {
        if m.method.as_deref().map(str::as_bytes) != Some(h.as_bytes()) {
            return Err(ProxyError::HeaderMismatch(
                "Mcp-Method does not match the body's method",
            ));
        }
    }
    if let Some(h) = name {
        let named = match m.method.as_deref() {
            Some("resources/read") => m.uri(),
            _ => m.name(),
        };
        let Some(named) = named else {
            return Err(ProxyError::HeaderMismatch(
                "Mcp-Name on a message that names no tool, prompt or resource",
            ));
        };
        if !header_says(h.as_bytes(), named) {
            return Err(ProxyError::HeaderMismatch(
                "Mcp-Name does not match the name in the body",
            ));
        }
    }
    if params {
        check_param_headers(headers, m)?;
    }
    Ok(())
}

/// `Mcp-Param-{Name}` headers mirror a tool's arguments (the name comes
/// from an `x-mcp-header` mark in the tool's schema, which tessera does
/// not keep: it is stateless per request). What can be checked without the
/// schema is checked: such headers go only with a `tools/call`, each
/// appears once, and each value (plain, or in the `=?base64?…?=` form)
/// is the value of one of the call's top-level primitive arguments — so
/// a header cannot steer an intermediary or upstream to a value the
/// policies never saw. (Which argument it mirrors needs the schema; the
/// server, which has it, must check that, as the revision requires.)
fn check_param_headers(headers: &http::HeaderMap, m: &Message<'_>) -> Result<(), ProxyError> {
    if m.method.as_deref() != Some("tools/call") {
        return Err(ProxyError::HeaderMismatch(
            "Mcp-Param-* headers go with a tools/call only",
        ));
    }
    let arguments: serde_json::Map<String, serde_json::Value> = m
        .arguments()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    let mirrored = |value: &[u8]| {
        arguments.values().any(|a| match a {
            serde_json::Value::String(s) => header_says(value, s),
            serde_json::Value::Bool(b) => value == if *b { &b"true"[..] } else { b"false" },
            serde_json::Value::Number(n) => {
                let text = n.to_string();
                value == text.as_bytes()
                    || std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse::<f64>().ok())
                        .is_some_and(|v| Some(v) == n.as_f64())
            }
            _ => false,
        })
    };
    for name in headers.keys() {
        if !name.as_str().starts_with("mcp-param-") {
            continue;
        }
        let mut all = headers.get_all(name).iter();
        let (Some(v), None) = (all.next(), all.next()) else {
            return Err(ProxyError::HeaderMismatch(
                "an Mcp-Param-* header appears more than once",
            ));
        };
        if !mirrored(v.as_bytes()) {
            return Err(ProxyError::HeaderMismatch(
                "an Mcp-Param-* header holds a value that is not among the call's arguments",
            ));
        }
    }
    Ok(())
}

/// `MCP-Protocol-Version` and the body's `_meta` protocol version
/// (2026-07-28) must agree where both are given: policies see one
/// revision, and an upstream that reads the other would act on a request
/// decided under rules it does not follow. Refused as the revision says
/// a server refuses it (400, -32020).
fn check_version(headers: &http::HeaderMap, peek: Option<&Peek<'_>>) -> Result<(), ProxyError> {
    let Some(header) = headers.get(crate::wire::headers::MCP_PROTOCOL_VERSION) else {
        return Ok(());
    };
    for m in peek.map(Peek::messages).unwrap_or_default() {
        if let Some(meta) = m.protocol_version() {
            if meta.as_bytes() != header.as_bytes() {
                return Err(ProxyError::VersionMismatch {
                    header: String::from_utf8_lossy(header.as_bytes()).into_owned(),
                    meta: meta.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Whether results carry `resultType` in revision `version` (2026-07-28
/// and later; revisions are dates, so their text orders them).
pub fn results_carry_type(version: &str) -> bool {
    version.len() == 10 && version >= "2026-07-28"
}

/// Whether a routing header's value is `s`: as is, or in the revision's
/// `=?base64?…?=` form for values a header cannot carry plainly.
fn header_says(value: &[u8], s: &str) -> bool {
    if value == s.as_bytes() {
        return true;
    }
    let Some(encoded) = value
        .strip_prefix(b"=?base64?")
        .and_then(|v| v.strip_suffix(b"?="))
    else {
        return false;
    };
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .is_ok_and(|d| d == s.as_bytes())
}

fn classify(e: serde_json::Error) -> ProxyError {
    match e.classify() {
        serde_json::error::Category::Data => {
            ProxyError::InvalidRequest("the body is JSON but not a JSON-RPC 2.0 message")
        }
        _ => ProxyError::ParseError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_method_tool_and_id() {
        let b = br#"{"jsonrpc":"2.0","id":"a1","method":"tools/call","params":{"name":"echo","arguments":{"x":[1,{"y":2}]}}}"#;
        let p = peek(b).unwrap();
        let m = &p.messages()[0];
        assert_eq!(m.method.as_deref(), Some("tools/call"));
        assert_eq!(m.tool(), Some("echo"));
        assert_eq!(m.arguments(), Some(r#"{"x":[1,{"y":2}]}"#));
        assert_eq!(p.id().unwrap().get(), "\"a1\"");
    }

    #[test]
    fn reads_the_meta_protocol_version() {
        let b = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        let p = peek(b).unwrap();
        assert_eq!(p.messages()[0].protocol_version(), Some("2026-07-28"));
        assert_eq!(p.messages()[0].arguments(), None);
    }

    #[test]
    fn tool_only_for_tools_call() {
        let p = peek(br#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p"}}"#)
            .unwrap();
        assert_eq!(p.messages()[0].tool(), None);
    }

    #[test]
    fn strings_are_borrowed_from_the_body() {
        let b = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        let p = peek(b).unwrap();
        let m = &p.messages()[0];
        let params = m.params.as_ref().unwrap();
        let meta = params.meta.as_ref().unwrap();
        for s in [&m.jsonrpc, &m.method, &params.name, &meta.protocol_version] {
            assert!(matches!(s, Some(Cow::Borrowed(_))), "{s:?} was copied");
        }
    }

    #[test]
    fn escaped_names_are_unescaped() {
        let p =
            peek(br#"{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"a\u0062"}}"#)
                .unwrap();
        assert_eq!(p.messages()[0].tool(), Some("ab"));
    }

    #[test]
    fn batches_and_notifications() {
        let p = peek(br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"result":{}}]"#).unwrap();
        assert_eq!(p.messages().len(), 2);
        assert!(p.id().is_none());
    }

    fn ambiguous(body: &str) -> bool {
        matches!(peek(body.as_bytes()), Err(ProxyError::Ambiguous(_)))
    }

    #[test]
    fn names_equal_ignoring_case_are_refused() {
        for b in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","PARAMS":{"name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","param\u017f":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"ID":2,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","JSONRPC":"1.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"x":1,"X":2}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_META":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"io.modelcontextprotocol/protocolversion":"1"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"a":{"b":[{"\u212a":1,"k":2}]}}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":"\udc00"}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","Params":{}}]"#,
        ] {
            assert!(ambiguous(b), "{b}");
        }
        // Unknown members are fine when distinct; so is the same name in
        // sibling objects.
        assert!(peek(br#"{"jsonrpc":"2.0","id":1,"method":"x","extra":1,"params":{"cursor":"c","arguments":{"a":{"k":1},"b":{"k":2}}}}"#).is_ok());
    }

    #[test]
    fn methods_in_another_case_are_refused() {
        for m in [
            "Tools/call",
            "TOOLS/LIST",
            "toolſ/call",
            "Initialize",
            "logging/setlevel",
            "Notifications/initialized",
            "tools/call ",
            " tools/call",
            "tools/call\t",
            "\u{a0}Tools/call\u{0}",
        ] {
            assert!(known_method_in_other_case(m), "{m}");
            let m = serde_json::to_string(m).unwrap();
            let b = format!(r#"{{"jsonrpc":"2.0","id":1,"method":{m}}}"#);
            assert!(ambiguous(&b), "{b}");
        }
        for m in [
            "tools/call",
            "logging/setLevel",
            "notifications/Whatever",
            "custom/Method",
            "tools/calls",
        ] {
            assert!(!known_method_in_other_case(m), "{m}");
        }
    }

    #[test]
    fn params_must_be_an_object() {
        for b in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["delete_repo",{}]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":[1]}}"#,
        ] {
            assert!(
                matches!(peek(b.as_bytes()), Err(ProxyError::InvalidRequest(_))),
                "{b}"
            );
        }
        // Absent or null params are no params.
        assert!(peek(br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":null}"#).is_ok());
    }

    #[test]
    fn names_are_borrowed_and_uri_read_only_when_a_string() {
        let p = peek(
            br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}"#,
        )
        .unwrap();
        let m = &p.messages()[0];
        assert!(m.names.iter().all(|n| matches!(n, Cow::Borrowed(_))));
        assert_eq!(m.uri(), Some("file:///a"));
        let p =
            peek(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"uri":{"a":[1]}}}"#).unwrap();
        assert_eq!(p.messages()[0].uri(), None);
    }

    #[test]
    fn routing_headers_agree_with_the_body() {
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"}}"#;
        let read = br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///\u00e9"}}"#;
        let check = |body: Option<&[u8]>, headers: &[(&'static str, &str)]| {
            let mut h = http::HeaderMap::new();
            for (k, v) in headers {
                h.append(*k, http::HeaderValue::from_str(v).unwrap());
            }
            let p = body.map(|b| peek(b).unwrap());
            check_routing_headers(&h, p.as_ref()).is_ok()
        };
        assert!(check(Some(call), &[]));
        assert!(check(None, &[]));
        assert!(check(
            Some(call),
            &[("mcp-method", "tools/call"), ("mcp-name", "search")]
        ));
        assert!(!check(
            Some(call),
            &[("mcp-method", "tools/call"), ("mcp-name", "delete_repo")]
        ));
        assert!(!check(Some(call), &[("mcp-method", "Tools/call")]));
        assert!(!check(
            Some(call),
            &[("mcp-name", "search"), ("mcp-name", "search")]
        ));
        assert!(!check(None, &[("mcp-method", "tools/call")]));
        // A URI a header cannot carry plainly comes base64-encoded.
        assert!(check(
            Some(read),
            &[("mcp-name", "=?base64?ZmlsZTovLy/DqQ==?=")]
        ));
        assert!(!check(
            Some(read),
            &[("mcp-name", "=?base64?ZmlsZTovLy9h?=")]
        ));
        let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert!(!check(Some(list), &[("mcp-name", "x")]));
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#;
        assert!(!check(Some(batch), &[("mcp-method", "tools/list")]));
    }

    #[test]
    fn refusals() {
        assert!(matches!(peek(b"{not json"), Err(ProxyError::ParseError)));
        assert!(matches!(peek(b"\xff\xfe"), Err(ProxyError::ParseError)));
        assert!(matches!(peek(b"42"), Err(ProxyError::InvalidRequest(_))));
        assert!(matches!(peek(b"[]"), Err(ProxyError::InvalidRequest(_))));
        assert!(matches!(peek(b""), Err(ProxyError::InvalidRequest(_))));
        assert!(matches!(
            peek(br#"{"method":"x"}"#),
            Err(ProxyError::InvalidRequest(_))
        ));
        assert!(matches!(
            peek(br#"{"jsonrpc":"2.0","method":5}"#),
            Err(ProxyError::InvalidRequest(_))
        ));
    }
}
