//! What is on the wire both ways: the header
//! tables and the content codings a body is read through.

pub mod decode;
pub mod headers;
pub mod query;

/// The boxed error of a body or a connection.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
