//! Forward: strip what the caller sent that must not travel, inject the
//! stored credential, and send the request on the one pooled upstream
//! client.
//!
//! Strip runs before inject in one function, so no path exists where the
//! caller's `Authorization` survives next to (or instead of) the stored one.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};

use crate::credentials::Injection;
use crate::model::Upstream;
use crate::proxy::error::ProxyError;
use crate::state::State;
use crate::telemetry::metrics::UpstreamOutcome;
use crate::telemetry::trace;
use crate::wire::headers::{
    is_trust_header, names_a_credential, remove_hop_by_hop_and, RANGE_REQUEST, STRIPPED_REQUEST,
};

pub use crate::upstream::pool::{SendError, UpstreamBody, UpstreamClient};

/// `Forwarded` and `X-Forwarded-For` as tessera sets them with
/// `--forwarded set`: the caller's address as tessera's socket saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    pub peer: std::net::IpAddr,
}

/// Set `Forwarded: for=<peer>;proto=http` (RFC 7239) and
/// `X-Forwarded-For: <peer>` after the caller's own were stripped. `proto`
/// is `http`: tessera's data plane serves plain HTTP (TLS, if any, ends in
/// front of it, and what is in front vouches for itself, not tessera).
pub fn set_forwarded(h: &mut HeaderMap, f: Forwarded) {
    let peer = f.peer.to_canonical();
    let node = match peer {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        // An IPv6 node is quoted and bracketed (RFC 7239 §6).
        std::net::IpAddr::V6(ip) => format!("\"[{ip}]\""),
    };
    // The caller's own were stripped: one present now is the injected
    // credential's header (an odd name for one, but the injection wins).
    if let Ok(v) = HeaderValue::from_str(&format!("for={node};proto=http")) {
        h.entry(HeaderName::from_static("forwarded")).or_insert(v);
    }
    if let Ok(v) = HeaderValue::from_str(&peer.to_string()) {
        h.entry(HeaderName::from_static("x-forwarded-for"))
            .or_insert(v);
    }
}

/// Strip the caller's credentials (and every header whose name names one),
/// the headers it could vouch for itself with, and hop-by-hop headers (and
/// `Range`, `If-Range` unless `allow_range`), ask for an uncoded answer,
/// then inject the stored credential.
/// Everything else (`Mcp-Session-Id`, `MCP-Protocol-Version`,
/// `Last-Event-ID`, `Accept`, `Content-Type`, `Mcp-Method`, `Mcp-Name`,
/// `Mcp-Param-*`, …) passes unchanged.
pub fn strip_and_inject(h: &mut HeaderMap, inj: &Injection, allow_range: bool) {
    remove_hop_by_hop_and(h, |n| {
        STRIPPED_REQUEST.contains(n)
            || (!allow_range && RANGE_REQUEST.contains(n))
            || is_trust_header(n)
            || names_a_credential(n)
    });
    // The answer is scanned for the secret, so it is asked for as plain
    // bytes (what still arrives coded is decoded: `crate::wire::decode`).
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    // `insert` replaces every value the caller may have sent under the
    // credential's header name (e.g. its own X-Api-Key).
    h.insert(inj.name.clone(), inj.value.clone());
}

/// The upstream URI: the credential's URL with the caller's sub-path
/// appended and the caller's query added. A sub-path with `.` or `..`
/// segments (plain or percent-encoded) is refused: it could climb out of
/// the upstream URL's path.
pub fn upstream_uri(up: &Upstream, sub_path: &str, query: Option<&str>) -> Result<Uri, ProxyError> {
    // `route` refused these already; kept so this function is safe alone.
    if sub_path.split('/').any(crate::proxy::route::is_dot_segment) {
        return Err(ProxyError::InvalidRequest(
            "the path may not contain '.' or '..' segments",
        ));
    }
    // A '#' (or '?') would end the path when the URI is parsed, and what
    // is left of it could end in a dot segment ("/..#x" → "/.."). hyper's
    // parser never hands one over; this keeps the function safe on its own
    // (found by fuzzing).
    if sub_path.contains(['#', '?']) {
        return Err(ProxyError::InvalidRequest(
            "the path may not contain '#' or '?'",
        ));
    }
    let base = up.url.as_str();
    let mut s = String::with_capacity(base.len() + sub_path.len() + query.map_or(0, str::len) + 1);
    let (base, base_query) = match base.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (base, None),
    };
    s.push_str(if sub_path.is_empty() {
        base
    } else {
        base.trim_end_matches('/')
    });
    s.push_str(sub_path);
    let mut sep = '?';
    for q in [base_query, query]
        .into_iter()
        .flatten()
        .filter(|q| !q.is_empty())
    {
        s.push(sep);
        s.push_str(q);
        sep = '&';
    }
    s.parse()
        .map_err(|_| ProxyError::InvalidRequest("the request path is not a valid URI"))
}

/// Assemble the upstream request from the caller's parts, injecting `inj`
/// (the credential's stored header, or its current OAuth token);
/// `allow_range` is `--allow-range`; with `forwarded` (`--forwarded set`)
/// tessera says who the caller is ([`set_forwarded`]).
pub fn upstream_request(
    method: Method,
    uri: Uri,
    mut headers: HeaderMap,
    inj: &Injection,
    body: Bytes,
    allow_range: bool,
    forwarded: Option<Forwarded>,
) -> Request<Bytes> {
    strip_and_inject(&mut headers, inj, allow_range);
    if let Some(f) = forwarded {
        set_forwarded(&mut headers, f);
    }
    if let Some(host) = uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        headers.insert(header::HOST, host);
    }
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

/// Send on the pooled client within the upstream timeout. `credential` and
/// the host name the upstream in an error (copied only then).
pub(crate) async fn send(
    state: &State,
    mut req: Request<Bytes>,
    credential: &str,
) -> Result<Response<crate::proxy::forward::UpstreamBody>, ProxyError> {
    // A reference-counted copy, not an allocation.
    let authority = req.uri().authority().cloned();
    // With traces on, the exchange is a client span (until the answer's
    // head) and the upstream is told its context, not the caller's.
    let span = trace::Span::child_of_kind("upstream", opentelemetry::trace::SpanKind::Client);
    if span.is_on() {
        span.inject(req.headers_mut());
        span.set(|| upstream_span_attributes(&req));
    }
    let sent = Instant::now();
    // Pooled per credential: a connection that carried this credential
    // never carries another's requests.
    let sending = state.client.send(req, credential);
    let resp = tokio::time::timeout(state.config.upstream_timeout, sending).await;
    state.metrics.upstream_latency(sent.elapsed());
    if span.is_on() {
        match &resp {
            Ok(Ok(r)) => {
                let status = r.status();
                span.set(|| {
                    vec![opentelemetry::KeyValue::new(
                        "http.response.status_code",
                        i64::from(status.as_u16()),
                    )]
                });
                if status.is_server_error() {
                    span.error(|| format!("answered {}", status.as_u16()));
                }
            }
            Ok(Err(_)) => span.error(|| "no answer: the exchange failed".into()),
            Err(_) => span.error(|| "no answer within the upstream timeout".into()),
        }
    }
    drop(span);
    let counted = |o| state.metrics.upstream_outcome(credential, o);
    let credential = || credential.to_string();
    match resp {
        Ok(Ok(resp)) => {
            counted(UpstreamOutcome::Status(resp.status().as_u16()));
            Ok(resp)
        }
        Err(_) => {
            counted(UpstreamOutcome::Timeout);
            Err(ProxyError::UpstreamTimeout {
                credential: credential(),
            })
        }
        Ok(Err(SendError::Connect(e))) => {
            if let Some(refused) = crate::upstream::egress::refusal_in(&*e) {
                counted(UpstreamOutcome::EgressRefused);
                let credential = credential();
                tracing::warn!(credential, error = %refused, "upstream refused by the egress rule");
                return Err(ProxyError::UpstreamForbidden { credential });
            }
            if let Some(tls) = crate::upstream::pool::tls_failure(&*e) {
                counted(UpstreamOutcome::Tls);
                return Err(ProxyError::UpstreamTls {
                    credential: credential(),
                    host: authority.as_ref().map_or("", |a| a.host()).to_string(),
                    why: tls.to_string(),
                });
            }
            counted(UpstreamOutcome::Unreachable);
            Err(ProxyError::UpstreamUnreachable {
                credential: credential(),
            })
        }
        Ok(Err(SendError::Http(_))) => {
            counted(UpstreamOutcome::Protocol);
            Err(ProxyError::UpstreamProtocol {
                credential: credential(),
            })
        }
    }
}

/// Send with an OAuth credential's current token; on a 401, refresh the
/// token (unless another request already did) and send once more.
pub(crate) async fn send_oauth(
    state: &State,
    source: &crate::credentials::oauth::OAuthSource,
    credential: &str,
    parts: http::request::Parts,
    (uri, forwarded): (http::Uri, Option<crate::proxy::forward::Forwarded>),
    body: Bytes,
) -> Result<
    (
        Response<crate::proxy::forward::UpstreamBody>,
        Arc<crate::redact::Redactor>,
    ),
    ProxyError,
> {
    let cx = state.oauth_context();
    let no_token = |error: crate::credentials::oauth::TokenError| {
        // What the token endpoint said beyond a standard code goes to the
        // log only, redacted (`TokenError::detail`).
        tracing::warn!(credential, error = %error, detail = error.detail(), "no OAuth token");
        ProxyError::TokenEndpoint {
            credential: credential.to_string(),
            error,
        }
    };
    let token = source.current(&cx).await.map_err(no_token)?;
    let first = upstream_request(
        parts.method.clone(),
        uri.clone(),
        parts.headers.clone(),
        &token.injection,
        body.clone(),
        state.config.allow_range,
        forwarded,
    );
    let resp = send(state, first, credential).await?;
    if resp.status() != http::StatusCode::UNAUTHORIZED {
        return Ok((resp, token.injection.redactor.clone()));
    }
    drop(resp);
    let token = source.refresh(&cx, Some(&token)).await.map_err(no_token)?;
    let again = upstream_request(
        parts.method,
        uri,
        parts.headers,
        &token.injection,
        body,
        state.config.allow_range,
        forwarded,
    );
    let resp = send(state, again, credential).await?;
    Ok((resp, token.injection.redactor.clone()))
}

/// What an upstream span says of its request: the upstream's host and
/// port and the method, never its path, query or any header.
fn upstream_span_attributes(req: &Request<Bytes>) -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::KeyValue;
    let uri = req.uri();
    let mut a = vec![KeyValue::new(
        "http.request.method",
        req.method().as_str().to_string(),
    )];
    if let Some(host) = uri.host() {
        a.push(KeyValue::new("server.address", host.to_string()));
    }
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    a.push(KeyValue::new("server.port", i64::from(port)));
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::injection;
    use crate::crypto::keyring::SecretString;
    use crate::store::model::Scheme;

    fn upstream(url: &str) -> Upstream {
        Upstream {
            credential: "gh".into(),
            url: url.parse().unwrap(),
            auth: crate::model::Auth::Static(
                injection(
                    Scheme::Bearer,
                    None,
                    None,
                    &SecretString::from("stored".to_string()),
                )
                .unwrap(),
            ),
        }
    }

    #[test]
    fn strips_the_callers_token_and_injects_the_stored_one() {
        let mut h = HeaderMap::new();
        let v = HeaderValue::from_static;
        h.insert(header::AUTHORIZATION, v("Bearer caller-token"));
        h.insert(header::PROXY_AUTHORIZATION, v("Basic x"));
        h.insert(header::COOKIE, v("c=1"));
        h.insert(header::CONNECTION, v("x-hop"));
        h.insert("x-hop", v("1"));
        h.insert(header::TE, v("trailers"));
        for n in [
            "host",
            "origin",
            "content-length",
            "keep-alive",
            "proxy-connection",
            "expect",
            "range",
            "if-range",
            "accept-charset",
        ] {
            h.insert(n, v("1"));
        }
        for n in ["trailer", "transfer-encoding", "upgrade"] {
            h.append(n, v("1"));
            h.append(n, v("2"));
        }
        h.insert(header::ACCEPT_ENCODING, v("gzip, deflate, br"));
        for keep in [
            "mcp-session-id",
            "mcp-protocol-version",
            "last-event-id",
            "accept",
            "content-type",
            "mcp-method",
            "mcp-name",
            "mcp-param-owner",
        ] {
            h.insert(HeaderName::from_static(keep), v("k"));
        }
        let up = upstream("http://127.0.0.1:9/mcp");
        let crate::model::Auth::Static(inj) = &up.auth else {
            unreachable!()
        };
        let mut allowed = h.clone();
        strip_and_inject(&mut h, inj, false);
        assert_eq!(
            h.get_all(header::AUTHORIZATION).iter().collect::<Vec<_>>(),
            ["Bearer stored"]
        );
        assert!(h.get(header::AUTHORIZATION).unwrap().is_sensitive());
        for gone in [
            "proxy-authorization",
            "cookie",
            "connection",
            "x-hop",
            "te",
            "host",
            "origin",
            "content-length",
            "keep-alive",
            "proxy-connection",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "expect",
            "range",
            "if-range",
            "accept-charset",
        ] {
            assert!(!h.contains_key(gone), "{gone}");
        }
        // The answer is asked for uncoded, whatever the caller accepts.
        assert_eq!(h[header::ACCEPT_ENCODING], "identity");
        assert_eq!(h.len(), 10);
        // --allow-range: the range headers pass, nothing else changes.
        strip_and_inject(&mut allowed, inj, true);
        assert_eq!(allowed.len(), 12);
        assert!(allowed.contains_key("range") && allowed.contains_key("if-range"));
        assert!(!allowed.contains_key("expect"));
    }

    #[test]
    fn trust_and_credential_named_headers_never_travel() {
        let inj = injection(
            Scheme::Header,
            Some("x-auth-token"),
            None,
            &SecretString::from("s".to_string()),
        )
        .unwrap();
        let mut h = HeaderMap::new();
        let gone = [
            "x-forwarded-for",
            "x-forwarded-host",
            "x-forwarded-proto",
            "x-forwarded-user",
            "x-forwarded-prefix",
            "forwarded",
            "x-real-ip",
            "x-original-url",
            "x-rewrite-url",
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
            "x-client-ip",
            "true-client-ip",
            "cf-connecting-ip",
            "x-api-key",
            "api-key",
            "x-access-token",
            "x-session-id",
            "x-client-secret",
            "x-db-password",
            "x-aws-credential",
            "x-apikey",
            "x-user-passwd",
            "x-my-api_key",
            "x-auth-key",
            "tokens",
            "x-session",
        ];
        for n in gone {
            h.insert(HeaderName::from_static(n), HeaderValue::from_static("1"));
        }
        h.insert("x-auth-token", HeaderValue::from_static("forged"));
        h.insert("mcp-session-id", HeaderValue::from_static("m"));
        h.insert("x-request-id", HeaderValue::from_static("r"));
        strip_and_inject(&mut h, &inj, false);
        for n in gone {
            assert!(!h.contains_key(n), "{n}");
        }
        assert_eq!(h["x-auth-token"], "s", "the injection wins");
        assert_eq!(h["mcp-session-id"], "m");
        assert_eq!(h["x-request-id"], "r");
        for kept in [
            "content-type",
            "accept",
            "user-agent",
            "mcp-protocol-version",
            "x-space",
            "x-pass",
            "x-api",
            "last-event-id",
        ] {
            let n = HeaderName::from_static(kept);
            assert!(!names_a_credential(&n), "{kept}");
        }

        let mut h = HeaderMap::new();
        set_forwarded(
            &mut h,
            Forwarded {
                peer: "::ffff:192.0.2.7".parse().unwrap(),
            },
        );
        assert_eq!(h["forwarded"], "for=192.0.2.7;proto=http");
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        let mut h = HeaderMap::new();
        set_forwarded(
            &mut h,
            Forwarded {
                peer: "2001:db8::1".parse().unwrap(),
            },
        );
        assert_eq!(h["forwarded"], "for=\"[2001:db8::1]\";proto=http");
    }

    #[test]
    fn header_scheme_replaces_a_callers_copy() {
        let inj = injection(
            Scheme::Header,
            Some("x-api-key"),
            None,
            &SecretString::from("s".to_string()),
        )
        .unwrap();
        let mut h = HeaderMap::new();
        h.append("x-api-key", HeaderValue::from_static("forged1"));
        h.append("x-api-key", HeaderValue::from_static("forged2"));
        strip_and_inject(&mut h, &inj, false);
        assert_eq!(h.get_all("x-api-key").iter().collect::<Vec<_>>(), ["s"]);
    }

    #[test]
    fn uri_joins_path_and_query() {
        let up = upstream("http://h:1/mcp");
        assert_eq!(upstream_uri(&up, "", None).unwrap(), "http://h:1/mcp");
        assert_eq!(
            upstream_uri(&up, "/x/y", Some("a=1")).unwrap(),
            "http://h:1/mcp/x/y?a=1"
        );
        let up = upstream("http://h:1/mcp/?k=v");
        assert_eq!(
            upstream_uri(&up, "/x", Some("a=1")).unwrap(),
            "http://h:1/mcp/x?k=v&a=1"
        );
        for bad in ["/..", "/a/../b", "/%2e%2E", "/.", "/.%2e/x", "/%2E"] {
            assert!(upstream_uri(&up, bad, None).is_err(), "{bad}");
        }
        for ok in ["/...", "/.x", "/%2e%2e%2e", "/a.b"] {
            assert!(upstream_uri(&up, ok, None).is_ok(), "{ok}");
        }
    }
}
