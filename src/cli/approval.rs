//! `tessera approval`: calls held for a person.

use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{Admin, CLI};

use super::*;

#[derive(Subcommand)]
pub(crate) enum ApprovalCmd {
    /// Pending approvals, newest first (with --all, granted and denied too).
    List {
        /// Granted and denied approvals too.
        #[arg(long)]
        all: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// The next page: those listed after this approval id (the last
        /// of the previous page).
        #[arg(long)]
        before: Option<String>,
    },
    /// Allow the held call (same tool, params, sub-path, query and session) to run.
    Grant {
        /// The approval's id (the one the held call's answer quotes).
        id: String,
        /// How long the grant lasts: 30s, 10m, 1h, 7d.
        #[arg(long, default_value = "10m")]
        ttl: String,
        /// How many times the call may run within the TTL.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
        uses: i64,
    },
    /// Refuse the held call; the record stays listed (--all).
    Deny {
        /// The approval's id.
        id: String,
    },
}

pub(crate) async fn approval(at: &Place, c: ApprovalCmd) -> Result<()> {
    use tessera::telemetry::time::now_ms;
    let store = at.store().await?;
    match c {
        ApprovalCmd::List { all, limit, before } => {
            let rows = store
                .approvals_page(all, before.as_deref(), limit.max(1))
                .await?;
            let mut table = Vec::with_capacity(rows.len());
            for a in rows {
                if at.json {
                    out!("{}", serde_json::to_string(&a)?);
                    continue;
                }
                let at = std::time::UNIX_EPOCH + Duration::from_millis(a.created_at.max(0) as u64);
                let status = match (a.status, a.expires_at, a.uses_left) {
                    (tessera::store::model::Status::Granted, Some(exp), Some(uses))
                        if exp <= now_ms() || uses <= 0 =>
                    {
                        "spent"
                    }
                    (s, _, _) => s.as_str(),
                };
                let or_dash = |s: &str| {
                    if s.is_empty() {
                        "-".to_string()
                    } else {
                        s.to_string()
                    }
                };
                table.push(vec![
                    a.id,
                    status.to_string(),
                    tessera::telemetry::log::rfc3339(at),
                    a.key.caller,
                    a.key.connection.chars().take(8).collect(),
                    a.key.rpc_method,
                    or_dash(&a.key.tool),
                    // Rows recorded before calls were bound whole: `?`.
                    a.shown.sub_path.as_deref().map_or("?".into(), |p| {
                        or_dash(&match &a.shown.query {
                            Some(q) => format!("{p}?{q}"),
                            None => p.to_string(),
                        })
                    }),
                    a.shown.session.as_deref().map_or("?".into(), or_dash),
                    or_dash(a.key.arguments_sha256.get(..15).unwrap_or_default()),
                    a.reason.unwrap_or_else(|| "-".into()),
                ]);
            }
            if !at.json {
                let head = [
                    "ID", "STATUS", "ASKED", "CALLER", "CONN", "METHOD", "TOOL", "PATH", "SESSION",
                    "KEY", "REASON",
                ];
                print_table(&head, &table);
            }
        }
        ApprovalCmd::Grant { id, ttl, uses } => {
            Admin::new(&store, CLI)
                .approval_grant(&id, &ttl, uses)
                .await?;
            at.say(
                format!(
                    "granted {id}: the same call may run {uses} {} within {ttl}",
                    if uses == 1 { "time" } else { "times" }
                ),
                serde_json::json!({"granted": id, "uses": uses, "ttl": ttl}),
            );
        }
        ApprovalCmd::Deny { id } => {
            Admin::new(&store, CLI).approval_deny(&id).await?;
            at.say(format!("denied {id}"), serde_json::json!({"denied": id}));
        }
    }
    Ok(())
}
