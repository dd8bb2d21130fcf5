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
    /// rejected), first and last seen (--json: with the pinned and offered
    /// digests).
    List {
        #[arg(long)]
        credential: String,
    },
    /// A unified diff of a tool's pinned definition and the one its
    /// upstream offers now, and the offered definition's digest (to accept
    /// exactly it: accept --digest).
    Diff {
        #[arg(long)]
        credential: String,
        /// The tool's name, exactly as listed.
        tool: String,
    },
    /// Pin the offered definition: the tool is listed and callable again
    /// within a second (one snapshot refresh). Prints each tool pinned and
    /// the digest it was pinned at.
    Accept {
        #[arg(long)]
        credential: String,
        /// The tool's name, exactly as listed.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        tool: Option<String>,
        /// The offered digest `tool diff` printed (all 64 hex digits):
        /// accept only if the upstream still offers that definition, the
        /// one reviewed; else nothing changes and the command fails.
        #[arg(long, conflicts_with = "all")]
        digest: Option<String>,
        /// Every tool of the credential that is changed or new, as offered
        /// now (rejected ones stay rejected: accept each by name).
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
            } else {
                if d.diff.is_empty() {
                    out!("tool {tool:?} of credential {credential:?} is {}: its offered definition is the pinned one", d.status);
                } else {
                    out!("tool {tool:?} of credential {credential:?} is {}", d.status);
                    // The definitions are the upstream's words: each line
                    // printable (no escape sequence reaches the terminal).
                    for line in d.diff.trim_end().lines() {
                        out!("{}", tessera::telemetry::log::printable(line));
                    }
                }
                if let Some(offered) = &d.offered_digest {
                    out!("offered digest: {offered}");
                    if d.status != "pinned" {
                        // The name is the upstream's words: quoted as the
                        // shell reads it back, and printable.
                        out!(
                            "accept exactly this definition: tessera tool accept --credential {credential} {} --digest {offered}",
                            shell_word(&tool)
                        );
                    }
                }
            }
        }
        ToolCmd::Accept {
            credential,
            tool,
            digest,
            all: _,
        } => {
            let done = Admin::new(&store, CLI)
                .tool_accept(&credential, tool.as_deref(), digest.as_deref())
                .await?;
            if tool.is_some() && digest.is_none() && !at.json {
                eprintln!(
                    "note: accepted without --digest: the definition pinned is the one offered at this moment; \
                     to accept only the one you reviewed, give --digest from `tessera tool diff`"
                );
            }
            let lines: Vec<String> = done
                .iter()
                .map(|p| {
                    format!(
                        "  {} {}",
                        tessera::telemetry::log::printable(&p.tool),
                        p.digest
                    )
                })
                .collect();
            let names: Vec<&str> = done.iter().map(|p| p.tool.as_str()).collect();
            at.say(
                format!(
                    "accepted for credential {credential}: {} (listed and callable within a second); pinned at:\n{}",
                    tessera::telemetry::log::printable(&names.join(", ")),
                    lines.join("\n")
                ),
                serde_json::json!({"credential": credential, "accepted": names, "pinned": done}),
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

/// `s` as one shell word: bare when it is plain, else single-quoted, and
/// printable either way (a name an upstream chose cannot colour the
/// terminal).
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@+=,".contains(&b));
    let s = if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    };
    tessera::telemetry::log::printable(&s).into_owned()
}
