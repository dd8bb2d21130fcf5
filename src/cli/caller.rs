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
        /// The caller's name (letters, digits, '.', '_', '-').
        name: String,
        /// A group the caller belongs to, for policies (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
    },
    /// Give a caller a new token, printed once as the last line; the old
    /// token stops within a second.
    RotateToken {
        /// The caller's name.
        name: String,
    },
    /// Replace a caller's groups (policies see them within a second).
    Update {
        /// The caller's name.
        name: String,
        /// A group (repeatable): the caller's groups become exactly these.
        #[arg(long = "group", required_unless_present = "no_groups")]
        groups: Vec<String>,
        /// Remove the caller from every group.
        #[arg(long, conflicts_with = "groups")]
        no_groups: bool,
    },
    /// Revoke a caller: its token stops within a second, and with it every
    /// connection of the caller.
    Revoke {
        /// The caller's name.
        name: String,
    },
    /// Make a revoked caller live again under a new token, printed once as
    /// the last line (the old token stays dead).
    Restore {
        /// The caller's name.
        name: String,
    },
    /// Every caller: name, state, groups (never a token).
    List,
}

pub(crate) async fn caller(at: &Place, c: CallerCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        CallerCmd::Add { name, groups } => {
            let token = Admin::new(&store, CLI).caller_add(&name, &groups).await?;
            new_token(at, &name, "added", token);
        }
        CallerCmd::RotateToken { name } => {
            let token = Admin::new(&store, CLI).caller_rotate_token(&name).await?;
            new_token(at, &name, "has a new token", token);
        }
        CallerCmd::Restore { name } => {
            let token = Admin::new(&store, CLI).caller_restore(&name).await?;
            let url = url::Url::parse("http://127.0.0.1").expect("a URL");
            let live = service::connections(&store, &url)
                .await?
                .iter()
                .filter(|c| c.caller == name && c.state == service::ConnectionState::Live)
                .count();
            let what = format!("restored ({live} of its connections serve it again)");
            new_token(at, &name, &what, token);
        }
        CallerCmd::Update { name, groups, .. } => {
            Admin::new(&store, CLI)
                .caller_update(&name, &groups)
                .await?;
            at.say(
                format!("caller {name}: groups set to [{}]", groups.join(", ")),
                serde_json::json!({"updated": name, "groups": groups}),
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
                out!("{}", serde_json::to_string_pretty(&rows)?);
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

/// A caller's new token, printed once as the last line.
fn new_token(at: &Place, name: &str, what: &str, token: tessera::crypto::keyring::SecretString) {
    at.say(
        format!(
            "caller {name} {what}; its token is shown once, below:\n{}",
            token.expose_secret()
        ),
        serde_json::json!({"name": name, "token": token.expose_secret()}),
    );
}
