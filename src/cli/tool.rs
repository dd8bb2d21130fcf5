//! `tessera tool`: reviewing the tools pinned per credential (tool
//! pinning, `tessera::authz::pins`).

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{Admin, CLI};
use tessera::admin::tool_pins;

use super::*;

#[derive(Subcommand)]
pub(crate) enum ToolCmd {
    /// A credential's tools: name, status (pinned, changed, new,
    /// rejected), first and last seen.
    List {
        #[arg(long)]
        credential: String,
    },
    /// A unified diff of a tool's pinned definition and the one its
    /// upstream offers now.
    Diff {
        #[arg(long)]
        credential: String,
        /// The tool's name, exactly as listed.
        tool: String,
    },
    /// Pin the offered definition: the tool is listed and callable again
    /// within a second (one snapshot refresh).
    Accept {
        #[arg(long)]
        credential: String,
        /// The tool's name, exactly as listed.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        tool: Option<String>,
        /// Every tool of the credential that is changed or new (rejected
        /// ones stay rejected: accept each by name).
        #[arg(long)]
        all: bool,
    },
    /// Keep the offered definition hidden: the tool stays out of lists and
    /// its calls refused until accepted.
    Reject {
        #[arg(long)]
        credential: String,
        /// The tool's name, exactly as listed.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        tool: Option<String>,
        /// Every tool of the credential that is changed or new.
        #[arg(long)]
        all: bool,
    },
}

/// A time as a person reads it (UTC, to the second).
fn when(secs: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64);
    let s = tessera::telemetry::log::rfc3339(t);
    s.get(..19).map(|s| format!("{s}Z")).unwrap_or(s)
}

pub(crate) async fn tool(at: &Place, c: ToolCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        ToolCmd::List { credential } => {
            let rows = tool_pins::tools(&store, &credential).await?;
            if at.json {
                out!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.tool, r.status, when(r.first_seen), when(r.last_seen)])
                    .collect();
                print_table(&["TOOL", "STATUS", "FIRST SEEN", "LAST SEEN"], &table);
            }
        }
        ToolCmd::Diff { credential, tool } => {
            let d = tool_pins::tool_diff(&store, &credential, &tool).await?;
            if at.json {
                out!("{}", serde_json::to_string_pretty(&d)?);
            } else if d.diff.is_empty() {
                out!("tool {tool:?} of credential {credential:?} is {}: its offered definition is the pinned one", d.status);
            } else {
                out!("tool {tool:?} of credential {credential:?} is {}", d.status);
                out!("{}", d.diff.trim_end());
            }
        }
        ToolCmd::Accept {
            credential,
            tool,
            all: _,
        } => {
            let done = Admin::new(&store, CLI)
                .tool_accept(&credential, tool.as_deref())
                .await?;
            at.say(
                format!(
                    "accepted for credential {credential}: {} (listed and callable within a second)",
                    done.join(", ")
                ),
                serde_json::json!({"credential": credential, "accepted": done}),
            );
        }
        ToolCmd::Reject {
            credential,
            tool,
            all: _,
        } => {
            let done = Admin::new(&store, CLI)
                .tool_reject(&credential, tool.as_deref())
                .await?;
            at.say(
                format!(
                    "rejected for credential {credential}: {} (kept hidden)",
                    done.join(", ")
                ),
                serde_json::json!({"credential": credential, "rejected": done}),
            );
        }
    }
    Ok(())
}
