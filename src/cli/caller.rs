//! `tessera caller`: agent identities and their tokens.

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{self};
use tessera::admin::service::{Admin, CLI};
use tessera::crypto::keyring::ExposeSecret;

use super::*;

#[derive(Subcommand)]
pub(crate) enum CallerCmd {
    /// Create a caller; its token is printed once, as the last line.
    Add {
        name: String,
        /// A group the caller belongs to, for policies (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
    },
    Revoke {
        name: String,
    },
    List,
}

pub(crate) async fn caller(at: &Place, c: CallerCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        CallerCmd::Add { name, groups } => {
            let token = Admin::new(&store, CLI).caller_add(&name, &groups).await?;
            at.say(
                format!(
                    "caller {name} added; its token is shown once, below:\n{}",
                    token.expose_secret()
                ),
                serde_json::json!({"name": name, "token": token.expose_secret()}),
            );
        }
        CallerCmd::Revoke { name } => {
            Admin::new(&store, CLI).caller_revoke(&name).await?;
            at.say(
                format!("caller {name} revoked"),
                serde_json::json!({"revoked": name}),
            );
        }
        CallerCmd::List => {
            let rows = service::callers(&store).await?;
            if at.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.name, live(r.revoked_at).into(), r.groups.join(",")])
                    .collect();
                print_table(&["NAME", "STATUS", "GROUPS"], &table);
            }
        }
    }
    Ok(())
}
