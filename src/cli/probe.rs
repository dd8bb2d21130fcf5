//! `tessera probe [livez|readyz]`: ask a running `serve`'s ops listener
//! whether it is alive or ready; exit 0 when it answers 200, else 1. For
//! container healthchecks: the runtime image has no shell and no curl.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use http_body_util::Full;

use super::*;

#[derive(Args)]
pub(crate) struct ProbeArgs {
    /// livez (the process answers) or readyz (database, policies, master
    /// key).
    #[arg(default_value = "readyz", value_parser = ["livez", "readyz"])]
    pub(crate) check: String,
    /// The running serve's ops listener (serve's --ops-listen).
    #[arg(long, env = "TESSERA_OPS_LISTEN", default_value = tessera::config::DEFAULT_OPS_LISTEN, value_parser = tessera::config::parse_listen)]
    pub(crate) ops_listen: SocketAddr,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub(crate) timeout_ms: u64,
}

pub(crate) async fn probe(at: &Place, a: ProbeArgs) -> Result<()> {
    let addr = reachable(a.ops_listen);
    let ask = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to the ops listener at {addr}"))?;
        let req = http::Request::get(format!("/{}", a.check))
            .header(http::header::HOST, addr.to_string())
            .body(Full::new(Bytes::new()))?;
        exchange(tcp, req).await
    };
    let (status, body) = tokio::time::timeout(Duration::from_millis(a.timeout_ms), ask)
        .await
        .with_context(|| format!("the ops listener at {addr} did not answer in time"))??;
    let body = String::from_utf8_lossy(&body);
    if status != 200 {
        bail!("/{} answered {status}: {}", a.check, body.trim());
    }
    at.say(
        format!("/{}: {}", a.check, body.trim()),
        serde_json::from_str(&body).unwrap_or(serde_json::json!({"status": "ok"})),
    );
    Ok(())
}
