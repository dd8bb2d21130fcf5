//! The response side: what comes back from the upstream on its way to the
//! caller. [`headers`] filters the head, [`tool_list`] cuts `tools/list`
//! answers (JSON and SSE) to the tools a caller may call, [`own_answers`]
//! keeps a POST's JSON answer to that POST's own requests; the redactor
//! ([`crate::redact`]) replaces the injected secret in every byte.

pub mod body;
pub mod headers;
pub mod own_answers;
pub mod tool_list;

use http::{header, HeaderName};

/// The content codings of an upstream answer, to be undone (in that
/// order), with the headers that described the coded bytes removed: the
/// caller gets the answer uncoded. A slice of a coded answer (206) cannot
/// be decoded alone, so it is refused like an unknown coding.
pub(crate) fn undo_codings(
    parts: &mut http::response::Parts,
) -> Result<Vec<crate::wire::decode::Coding>, crate::wire::decode::DecodeError> {
    let codings = crate::wire::decode::codings(&parts.headers)?;
    parts.headers.remove(header::CONTENT_ENCODING);
    if codings.is_empty() {
        return Ok(codings);
    }
    if parts.status == http::StatusCode::PARTIAL_CONTENT
        || parts.headers.contains_key(header::CONTENT_RANGE)
    {
        return Err(crate::wire::decode::DecodeError::Unsupported(
            "a coded byte range".into(),
        ));
    }
    // The length, the entity tag and any digest were of the coded bytes.
    for h in [
        header::CONTENT_LENGTH,
        header::ETAG,
        HeaderName::from_static("content-md5"),
        HeaderName::from_static("digest"),
        HeaderName::from_static("content-digest"),
        HeaderName::from_static("repr-digest"),
    ] {
        parts.headers.remove(h);
    }
    Ok(codings)
}
