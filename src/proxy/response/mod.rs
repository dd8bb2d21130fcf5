//! The response side: what comes back from the upstream on its way to the
//! caller. [`headers`] filters the head, [`tool_list`] cuts `tools/list`
//! answers (JSON and SSE) to the tools a caller may call; the redactor
//! ([`crate::redact`]) replaces the injected secret in every byte.

pub mod headers;
pub mod tool_list;
