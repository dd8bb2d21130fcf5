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

/// `url` as it may be shown (an error, `config check`, a log line): its
/// user name and password, and the values of its credential-named query
/// parameters, become `***`.
pub fn shown(url: &url::Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() {
        let _ = u.set_username("***");
    }
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    mask_query(&mut u);
    u.to_string()
}

/// The values of `u`'s credential-named query parameters become `***`.
pub fn mask_query(u: &mut url::Url) {
    if let Some(q) = u.query().filter(|q| names_credential(q)) {
        let masked: Vec<String> = q
            .split(['&', ';'])
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if names_credential(name) => format!("{name}=***"),
                _ => pair.to_string(),
            })
            .collect();
        u.set_query(Some(&masked.join("&")));
    }
}

/// A URL setting as it may be shown: [`shown`] when it parses and holds a
/// credential, else as given (a value that is no URL has no user,
/// password or query to keep back).
pub fn shown_str(s: &str) -> String {
    match url::Url::parse(s) {
        Ok(u)
            if !u.username().is_empty()
                || u.password().is_some()
                || u.query().is_some_and(names_credential) =>
        {
            shown(&u)
        }
        _ => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_url_keeps_no_credential() {
        for (url, secret) in [
            ("https://admin:hunter2pw@proxy.example/", "hunter2pw"),
            (
                "postgres://u:p4ss@h/x?password=s3cret&sslmode=require",
                "s3cret",
            ),
            ("http://a.example/check?api_key=k3y&x=1", "k3y"),
        ] {
            let s = shown_str(url);
            assert!(!s.contains(secret), "{s}");
            assert!(s.contains("***"), "{s}");
        }
        assert_eq!(
            shown_str("http://a.example/x?q=1"),
            "http://a.example/x?q=1"
        );
    }
}
