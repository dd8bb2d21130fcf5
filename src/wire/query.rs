//! Query parameters that carry a credential: refused from callers (the
//! caller's token belongs in `Authorization`, the upstream's is tessera's to
//! inject) and in a registered upstream URL (a secret there would be stored
//! and listed in clear).

/// Query parameter names that name a credential (compared in lower case,
/// `-` read as `_`). Exact names, not parts of names: `max_tokens` and
/// `page_token` are everyday parameters that carry none.
const CREDENTIAL_PARAMS: [&str; 17] = [
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "token",
    "api_key",
    "apikey",
    "x_api_key",
    "key",
    "secret",
    "client_secret",
    "password",
    "passwd",
    "auth",
    "authorization",
    "credential",
    "credentials",
];

/// Whether a query has a parameter named like a credential. Names are
/// percent-decoded (`%74oken`) and `+` is a space, as a form parser reads
/// them; `;` separates pairs too.
pub fn names_credential(query: &str) -> bool {
    query.split(['&', ';']).any(|pair| {
        let name = pair.split('=').next().unwrap_or("");
        let name: String = url::form_urlencoded::parse(name.as_bytes())
            .next()
            .map(|(k, _)| k.into_owned())
            .unwrap_or_default();
        let name = name.trim().to_ascii_lowercase().replace('-', "_");
        CREDENTIAL_PARAMS.contains(&name.as_str())
    })
}
