//! `tessera connection`: addresses binding one caller to one credential.

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{self};
use tessera::admin::service::{Admin, CLI};

use super::*;

/// Where `serve` answers, from the settings `serve` reads (flag,
/// environment, settings file, default), so that a printed URL is the one
/// served.
#[derive(clap::Args)]
pub(crate) struct Address {
    /// Base of connection URLs, as `serve --public-url` (default: from
    /// --listen).
    #[arg(long, env = "TESSERA_PUBLIC_URL")]
    public_url: Option<String>,
    /// `serve`'s --listen, for the URL when no --public-url is given
    /// (default: the URL the last `serve` to start on this store answers
    /// on, else 127.0.0.1:7470).
    #[arg(long, env = "TESSERA_LISTEN", value_parser = tessera::config::parse_listen)]
    listen: Option<std::net::SocketAddr>,
}

impl Address {
    /// The base of connection URLs: as given (flag, environment, settings
    /// file), else what the last `serve` recorded, else the default.
    async fn public_url(&self, store: &Store) -> Result<url::Url> {
        if self.public_url.is_none() && self.listen.is_none() {
            if let Some(u) = store.served_url().await? {
                return Ok(tessera::config::parse_public_url(&u)?);
            }
        }
        let listen = match self.listen {
            Some(l) => l,
            None => tessera::config::DEFAULT_LISTEN.parse()?,
        };
        Ok(tessera::config::public_url(
            listen,
            self.public_url.as_deref(),
        )?)
    }
}

#[derive(Subcommand)]
pub(crate) enum ConnectionCmd {
    /// Allocate an address; its URL is printed as the last line.
    Add {
        /// The caller (agent identity) that may use it.
        #[arg(long)]
        caller: String,
        /// The credential its requests carry upstream.
        #[arg(long)]
        credential: String,
        #[command(flatten)]
        address: Address,
    },
    /// Revoke a connection: its URL stops answering within a second.
    Revoke {
        /// The connection's id or URL (an id may begin with '-').
        #[arg(allow_hyphen_values = true)]
        id_or_url: String,
    },
    /// Every connection: its URL, caller, credential and effective state
    /// (`live`, `revoked`, `caller-revoked`).
    List {
        #[command(flatten)]
        address: Address,
    },
}

pub(crate) async fn connection(at: &Place, c: ConnectionCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        ConnectionCmd::Add {
            caller,
            credential,
            address,
        } => {
            let public_url = address.public_url(&store).await?;
            let url = Admin::new(&store, CLI)
                .connection_add(&public_url, &caller, &credential)
                .await?;
            let id = service::connection_id(&url)?;
            let v = serde_json::json!({"id": id, "url": url, "caller": caller, "credential": credential});
            at.say(
                format!("connection added for caller {caller} on credential {credential}:\n{url}"),
                v,
            );
        }
        ConnectionCmd::Revoke { id_or_url } => {
            Admin::new(&store, CLI)
                .connection_revoke(&id_or_url)
                .await?;
            at.say(
                format!("connection {} revoked", service::connection_id(&id_or_url)?),
                serde_json::json!({"revoked": service::connection_id(&id_or_url)?}),
            );
        }
        ConnectionCmd::List { address } => {
            let rows = service::connections(&store, &address.public_url(&store).await?).await?;
            if at.json {
                out!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.url, r.caller, r.credential, r.state.as_str().into()])
                    .collect();
                print_table(&["URL", "CALLER", "CREDENTIAL", "STATUS"], &table);
            }
        }
    }
    Ok(())
}
