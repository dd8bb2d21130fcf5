//! `tessera admin-token`: tokens for the admin API.

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{Admin, CLI};
use tessera::crypto::keyring::ExposeSecret;

use super::*;

#[derive(Subcommand)]
pub(crate) enum AdminTokenCmd {
    /// Create an admin token; it is printed once, as the last line (the
    /// store keeps only its SHA-256). Restart serve to open the admin
    /// listener if this is the first token.
    Add {
        /// The token's name, as the admin audit records its actions.
        name: String,
    },
    /// Revoke an admin token: the admin API refuses it at once.
    Revoke {
        /// The token's name.
        name: String,
    },
    /// Every admin token: name and state (never the token).
    List,
}

pub(crate) async fn admin_token(at: &Place, c: AdminTokenCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        AdminTokenCmd::Add { name } => {
            let token = Admin::new(&store, CLI).admin_token_add(&name).await?;
            at.say(
                format!(
                    "admin token {name} added; it is shown once, below:\n{}",
                    token.expose_secret()
                ),
                serde_json::json!({"name": name, "token": token.expose_secret()}),
            );
        }
        AdminTokenCmd::Revoke { name } => {
            Admin::new(&store, CLI).admin_token_revoke(&name).await?;
            at.say(
                format!("admin token {name} revoked"),
                serde_json::json!({"revoked": name}),
            );
        }
        AdminTokenCmd::List => {
            let rows = store.admin_tokens().await?;
            if at.json {
                out!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.name, live(r.revoked_at).into()])
                    .collect();
                print_table(&["NAME", "STATUS"], &table);
            }
        }
    }
    Ok(())
}
