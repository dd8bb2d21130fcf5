//! The master key ring and sealed values ([`keyring`]); the tokens, ids
//! and digests tessera hands out ([`tokens`]).

pub mod keyring;
pub mod tokens;
