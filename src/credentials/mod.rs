//! Upstream credentials: how a stored secret becomes the one header that is
//! injected into every forwarded request.

pub mod login;
pub mod oauth;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::{HeaderName, HeaderValue};

use crate::crypto::keyring::{ExposeSecret, SecretString};

use crate::store::model::Scheme;

/// Why a credential definition is unusable. Never carries the secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    #[error("--scheme header needs --header-name")]
    MissingHeaderName,
    #[error("--scheme basic needs --username")]
    MissingUsername,
    // The value is not shown: a secret pasted in its place would be echoed
    // and kept in the admin audit.
    #[error("invalid header name: use letters, digits and - (as X-Api-Key)")]
    BadHeaderName(String),
    #[error("header {0:?} cannot carry an upstream credential: tessera strips or sets it itself")]
    ReservedHeaderName(String),
    #[error("the secret is empty")]
    EmptySecret,
    #[error("the secret contains characters that cannot be sent in an HTTP header (control characters or newlines)")]
    BadSecret,
    #[error("basic-auth username must not contain ':' or control characters")]
    BadUsername,
}

/// The header a credential injects, with the value marked sensitive so that
/// hyper's HPACK encoder and any Debug output treat it as such, and the
/// redactor that keeps the secret out of what comes back.
#[derive(Clone)]
pub struct Injection {
    pub name: HeaderName,
    pub value: HeaderValue,
    pub redactor: std::sync::Arc<crate::redact::Redactor>,
}

impl std::fmt::Debug for Injection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Injection({}: <redacted>)", self.name)
    }
}

/// Validate a header name given for `--scheme header`.
pub fn parse_header_name(h: &str) -> Result<HeaderName, CredentialError> {
    let name = HeaderName::from_bytes(h.as_bytes())
        .map_err(|_| CredentialError::BadHeaderName(h.to_string()))?;
    if crate::wire::headers::is_reserved_request_header(&name) {
        return Err(CredentialError::ReservedHeaderName(h.to_string()));
    }
    Ok(name)
}

/// Build the injected header for a scheme and secret.
pub fn injection(
    scheme: Scheme,
    header_name: Option<&str>,
    username: Option<&str>,
    secret: &SecretString,
) -> Result<Injection, CredentialError> {
    injection_after(scheme, header_name, username, secret, None)
}

/// As [`injection`], for a credential that injected `previous` until now:
/// the same header is kept as it was (its redactor is not built again);
/// a new secret is injected, and the replaced one is still redacted for
/// [`crate::redact::RETIRED_GRACE`] (an upstream may echo a request made
/// with it, or show it later).
pub fn injection_after(
    scheme: Scheme,
    header_name: Option<&str>,
    username: Option<&str>,
    secret: &SecretString,
    previous: Option<&Injection>,
) -> Result<Injection, CredentialError> {
    let s = secret.expose_secret();
    if s.is_empty() {
        return Err(CredentialError::EmptySecret);
    }
    // What is redacted from responses: the secret in every form (see
    // `crate::redact`), and for basic also the encodings of the base64 the
    // header carries.
    let mut basic = None;
    let (name, raw) = match scheme {
        Scheme::Bearer => (http::header::AUTHORIZATION, format!("Bearer {s}")),
        Scheme::Basic => {
            let u = username.ok_or(CredentialError::MissingUsername)?;
            if u.contains(':') || u.chars().any(char::is_control) {
                return Err(CredentialError::BadUsername);
            }
            let enc = STANDARD.encode(format!("{u}:{s}"));
            let raw = format!("Basic {enc}");
            basic = Some(SecretString::from(enc));
            (http::header::AUTHORIZATION, raw)
        }
        Scheme::Header => {
            let h = header_name.ok_or(CredentialError::MissingHeaderName)?;
            (parse_header_name(h)?, s.to_string())
        }
    };
    let mut value = HeaderValue::from_str(&raw).map_err(|_| CredentialError::BadSecret)?;
    value.set_sensitive(true);
    if let Some(p) = previous.filter(|p| p.name == name && p.value == value) {
        return Ok(p.clone());
    }
    let redactor = match basic {
        Some(sent) => crate::redact::Redactor::sent_as(secret, sent),
        None => crate::redact::Redactor::new([secret]),
    };
    let redactor = match previous {
        Some(p) => p.redactor.succeeded_by(&redactor),
        None => redactor,
    };
    Ok(Injection {
        name,
        value,
        redactor: std::sync::Arc::new(redactor),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_string())
    }

    #[test]
    fn bearer_basic_and_header() {
        let b = injection(Scheme::Bearer, None, None, &secret("t0k")).unwrap();
        assert_eq!(b.name, "authorization");
        assert_eq!(b.value, "Bearer t0k");
        assert!(b.value.is_sensitive());
        let b = injection(Scheme::Basic, None, Some("al"), &secret("pw")).unwrap();
        assert_eq!(b.value, "Basic YWw6cHc=");
        let h = injection(Scheme::Header, Some("X-Api-Key"), None, &secret("k")).unwrap();
        assert_eq!(h.name, "x-api-key");
        assert_eq!(h.value, "k");
    }

    #[test]
    fn refusals_name_the_problem() {
        assert_eq!(
            injection(Scheme::Header, None, None, &secret("k")).unwrap_err(),
            CredentialError::MissingHeaderName
        );
        assert_eq!(
            injection(Scheme::Basic, None, None, &secret("k")).unwrap_err(),
            CredentialError::MissingUsername
        );
        assert_eq!(
            injection(Scheme::Bearer, None, None, &secret("a\nb")).unwrap_err(),
            CredentialError::BadSecret
        );
        assert_eq!(
            injection(Scheme::Header, Some("Host"), None, &secret("k")).unwrap_err(),
            CredentialError::ReservedHeaderName("Host".into())
        );
        assert_eq!(
            injection(Scheme::Bearer, None, None, &secret("")).unwrap_err(),
            CredentialError::EmptySecret
        );
    }

    #[test]
    fn debug_redacts_the_value() {
        let b = injection(Scheme::Bearer, None, None, &secret("t0psecret")).unwrap();
        assert!(!format!("{b:?}").contains("t0psecret"));
    }
}
