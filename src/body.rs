//! The one response body type the data plane returns: either a streamed
//! upstream body passed through frame by frame, or a small buffer tessera
//! wrote itself.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

/// A response body: boxed so upstream streams and tessera's own answers
/// share one type.
pub type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A body from a buffer tessera produced.
pub fn full(b: Bytes) -> ProxyBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}
