//! The request body: a POST's body read within `--max-body-bytes` and the
//! process's body-memory budget, before anything is decided on it.

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::proxy::error::ProxyError;

/// Read a request body up to `max` bytes: a declared `Content-Length` over
/// the limit is refused before reading; a body that grows past it is
/// refused when it does. Its bytes are reserved from `memory` (a declared
/// length before reading, a chunked body's bytes as they arrive); over
/// the budget, 503 and the rest is not read.
pub(crate) async fn read_bounded<'m>(
    headers: &HeaderMap,
    body: Incoming,
    max: usize,
    memory: &'m crate::limits::capacity::BodyMemory,
) -> Result<(Bytes, crate::limits::capacity::Held<'m>), ProxyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ProxyError::PayloadTooLarge(max));
    }
    let mut held = memory
        .reserve(declared.map_or(0, |n| n as usize))
        .ok_or(ProxyError::BodyMemory)?;
    let mut body = Limited::new(body, max);
    // The first frame is kept as it is (most bodies are one); from the
    // second on, frames are copied into one buffer. Kept one by one, a
    // body sent in one-byte chunks would cost a frame's bookkeeping per
    // byte, a hundred times what the budget above counts.
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ProxyError::PayloadTooLarge(max)
            } else {
                ProxyError::RequestBody
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read += data.len();
        if read > held.bytes() && !held.grow(read - held.bytes()) {
            return Err(ProxyError::BodyMemory);
        }
        match &mut joined {
            Some(buf) => buf.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut buf = BytesMut::with_capacity(held.bytes().max(read));
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&data);
                first = Bytes::new();
                joined = Some(buf);
            }
        }
    }
    let bytes = joined.map_or(first, BytesMut::freeze);
    Ok((bytes, held))
}
