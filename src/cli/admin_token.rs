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
        /// admin (everything) or approver (list, show and decide
        /// approvals and read the audit trail, on the API and the console).
        #[arg(long, default_value = "admin", value_parser = ["admin", "approver"])]
        role: String,
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
        AdminTokenCmd::Add { name, role } => {
            let role: tessera::admin::service::Role = role.parse()?;
            let token = Admin::new(&store, CLI).admin_token_add(&name, role).await?;
            at.say(
                format!(
                    "admin token {name} ({}) added; it is shown once, below:\n{}",
                    role.as_str(),
                    token.expose_secret()
                ),
                serde_json::json!({"name": name, "role": role.as_str(), "token": token.expose_secret()}),
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
                    .map(|r| vec![r.name, r.role, live(r.revoked_at).into()])
                    .collect();
                print_table(&["NAME", "ROLE", "STATUS"], &table);
            }
        }
    }
    Ok(())
}
