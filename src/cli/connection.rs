//! `tessera connection`: addresses binding one caller to one credential.

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{self};
use tessera::admin::service::{Admin, CLI};

use super::*;

#[derive(Subcommand)]
pub(crate) enum ConnectionCmd {
    /// Allocate an address; its URL is printed as the last line.
    Add {
        #[arg(long)]
        caller: String,
        #[arg(long)]
        credential: String,
        #[arg(long, env = "TESSERA_PUBLIC_URL")]
        public_url: Option<String>,
    },
    Revoke {
        /// The connection's id or URL (an id may begin with '-').
        #[arg(allow_hyphen_values = true)]
        id_or_url: String,
    },
    List,
}

pub(crate) async fn connection(at: &Place, c: ConnectionCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        ConnectionCmd::Add {
            caller,
            credential,
            public_url,
        } => {
            let public_url = match public_url {
                Some(u) => tessera::config::parse_public_url(&u)?,
                None => {
                    tessera::config::default_public_url(tessera::config::DEFAULT_LISTEN.parse()?)
                }
            };
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
                "connection revoked",
                serde_json::json!({"revoked": service::connection_id(&id_or_url)?}),
            );
        }
        ConnectionCmd::List => {
            let rows = service::connections(&store).await?;
            if at.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.id, r.caller, r.credential, live(r.revoked_at).into()])
                    .collect();
                print_table(&["ID", "CALLER", "CREDENTIAL", "STATUS"], &table);
            }
        }
    }
    Ok(())
}
