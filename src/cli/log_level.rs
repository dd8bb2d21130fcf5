//! `tessera log-level LEVEL`: change a running `serve`'s log filter through
//! its admin API (`PUT /v1/log-level`), without a restart.
//!
//! The filter lives in the serving process's memory, not in the store, so
//! this is the one command that talks to a running `serve` rather than to
//! the database: over HTTP to its admin listener (the `admin-listen`
//! setting, read as `serve` reads it), with an admin token from the
//! environment, never from a flag (a flag shows in `ps`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};

use super::*;

#[derive(Args)]
pub(crate) struct LogLevelArgs {
    /// A level (error, warn, info, debug, trace) or EnvFilter directives
    /// (info,tessera::access=warn).
    pub(crate) level: String,
    /// The running serve's admin listener (serve's --admin-listen).
    #[arg(long, env = "TESSERA_ADMIN_LISTEN", default_value = tessera::config::DEFAULT_ADMIN_LISTEN, value_parser = tessera::config::parse_listen)]
    pub(crate) admin_listen: SocketAddr,
    /// The environment variable that holds an admin token (tsa_…, made by
    /// tessera admin-token add NAME with the admin role).
    #[arg(long, default_value = "TESSERA_ADMIN_TOKEN")]
    pub(crate) admin_token_env: String,
}

/// How long the whole exchange may take.
const TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn log_level(at: &Place, a: LogLevelArgs) -> Result<()> {
    let token = std::env::var(&a.admin_token_env).with_context(|| {
        format!(
            "no admin token in the environment variable {}: set it to a token from tessera admin-token add NAME",
            a.admin_token_env
        )
    })?;
    let addr = reachable(a.admin_listen);
    let body = serde_json::json!({ "level": a.level }).to_string();
    let (status, answer) = tokio::time::timeout(TIMEOUT, put(addr, &token, body))
        .await
        .with_context(|| format!("the admin API at {addr} did not answer within 10 s"))??;
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    if status != 200 {
        let why = v["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&answer).into_owned());
        bail!("the admin API at {addr} answered {status}: {why}");
    }
    let level = v["level"].as_str().unwrap_or_default();
    at.say(
        format!("log filter in force: {level}"),
        serde_json::json!({ "level": level }),
    );
    Ok(())
}

/// `PUT /v1/log-level` on one HTTP/1.1 connection: status and body.
async fn put(addr: SocketAddr, token: &str, body: String) -> Result<(u16, Bytes)> {
    let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| {
        format!("connecting to the admin API at {addr} (is serve running, with an admin token, on --admin-listen?)")
    })?;
    let mut auth = http::HeaderValue::from_str(&format!("Bearer {token}"))
        .context("the admin token is not a valid header value")?;
    auth.set_sensitive(true);
    let req = http::Request::put("/v1/log-level")
        .header(http::header::HOST, addr.to_string())
        .header(http::header::AUTHORIZATION, auth)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    exchange(tcp, req).await
}

/// One request on a fresh HTTP/1.1 connection: status and body.
pub(crate) async fn exchange(
    tcp: tokio::net::TcpStream,
    req: http::Request<Full<Bytes>>,
) -> Result<(u16, Bytes)> {
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let resp = send.send_request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

/// A wildcard listen address (`0.0.0.0`, `[::]`) as reached from this
/// host: loopback.
pub(crate) fn reachable(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}
