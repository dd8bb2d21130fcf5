//! JSON-RPC inspection of a POST body: the id, method and tool name a
//! policy needs, read without building a full JSON tree. The body itself is
//! forwarded byte for byte; this only looks.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::error::ProxyError;

/// One JSON-RPC message, as far as tessera cares.
#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "borrowed")]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed")]
    jsonrpc: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct Params<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed")]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<Meta<'a>>,
}

#[derive(Debug, Deserialize)]
struct Meta<'a> {
    #[serde(
        borrow,
        default,
        rename = "io.modelcontextprotocol/protocolVersion",
        deserialize_with = "borrowed"
    )]
    protocol_version: Option<Cow<'a, str>>,
}

/// An optional string borrowed from the body unless it holds an escape.
/// serde borrows a `Cow<str>` field only when the field's type is exactly
/// that; inside an `Option` it would copy every string, an allocation
/// each.
fn borrowed<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(d)?.map(|b| b.0))
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
    }
    Ok(peek)
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
