//! `tessera policy`: check, reload and explain Cedar policies.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use tessera::admin::service::{Admin, CLI};
use tessera::authz::cedar::Policies;

use super::*;

#[derive(Subcommand)]
pub(crate) enum PolicyCmd {
    /// Validate a policy folder against its schema, as `serve` does at start.
    Check {
        /// The folder (default: ./policies when present, else the built-in set).
        dir: Option<PathBuf>,
    },
    /// Ask every serving process on this database (every replica) to read
    /// its policy folder again, as SIGHUP does for one process. A folder
    /// that does not validate leaves that process on its current set.
    Reload,
    /// Show the decision for a request, and the policies that made it.
    Explain {
        /// The caller's name.
        #[arg(long)]
        caller: String,
        /// The connection's id or URL (an id may begin with '-').
        #[arg(long, allow_hyphen_values = true)]
        connection: String,
        /// The JSON-RPC method (tools/call, tools/list, …).
        #[arg(long, required_unless_present = "http_method")]
        method: Option<String>,
        /// The tool's name, for tools/call.
        #[arg(long)]
        tool: Option<String>,
        /// The tool's arguments, as JSON.
        #[arg(long)]
        arguments: Option<String>,
        /// GET (stream/open) or DELETE (session/end) instead of a POST.
        #[arg(long, value_parser = ["POST", "GET", "DELETE"])]
        http_method: Option<String>,
        /// The sub-path after the connection address (`/files/x`), as
        /// policies see it in context.path (default: none).
        #[arg(long, default_value = "")]
        path: String,
        /// The policy folder (default: as `serve`).
        #[arg(long, env = "TESSERA_POLICIES")]
        policies: Option<PathBuf>,
    },
}

/// The policy folder `serve` uses: `dir`, else ./policies when it exists,
/// else none (the built-in set).
pub(crate) fn policy_dir(dir: Option<&std::path::Path>) -> Option<PathBuf> {
    match dir {
        Some(d) => Some(d.to_path_buf()),
        None if std::path::Path::new("policies").is_dir() => Some(PathBuf::from("policies")),
        None => None,
    }
}

/// The policies `serve` runs with (see [`policy_dir`]). An invalid set is
/// an error listing every problem.
pub(crate) fn load_policies(dir: Option<&std::path::Path>) -> Result<Policies> {
    let Some(dir) = policy_dir(dir) else {
        return Ok(Policies::builtin());
    };
    Policies::load_dir(&dir)
        .map_err(|e| anyhow::anyhow!("the policies in {} are not valid:\n{e}", dir.display()))
}

pub(crate) async fn policy(at: &Place, c: PolicyCmd) -> Result<()> {
    match c {
        PolicyCmd::Reload => {
            let store = at.store().await?;
            Admin::new(&store, CLI).policy_reload().await?;
            at.say(
                "asked every serving process to reload its policies",
                serde_json::json!({"reload": "asked"}),
            );
        }
        PolicyCmd::Check { dir } => {
            let p = load_policies(dir.as_deref())?;
            if at.json {
                let v = serde_json::json!({"origin": p.origin, "count": p.len(), "files": p.files, "ids": p.ids()});
                out!("{v}");
                return Ok(());
            }
            out!(
                "{}: {} {} valid against the schema ({})",
                p.origin,
                p.len(),
                if p.len() == 1 { "policy" } else { "policies" },
                p.files.join(", ")
            );
            for id in p.ids() {
                out!("  {id}");
            }
        }
        PolicyCmd::Explain {
            caller,
            connection,
            method,
            tool,
            arguments,
            http_method,
            path,
            policies,
        } => {
            let p = load_policies(policies.as_deref())?;
            let store = at.store().await?;
            let key = existing_master_key(&at.data_dir, &store).await?;
            let snap = tessera::snapshot::Snapshot::load(&store, &key, p.schema()).await?;
            let who = snap
                .callers
                .values()
                .find(|c| c.name == caller)
                .with_context(|| format!("no live caller named {caller:?}"))?;
            let connection = tessera::admin::service::connection_id(&connection)?.to_string();
            let conn = snap
                .connections
                .get(&connection)
                .with_context(|| format!("no live connection {connection:?}"))?;
            // What serve does before any policy: another caller's address
            // is unknown to this one (404).
            let not_theirs = (conn.caller_id != who.id).then(|| {
                format!("connection {connection} belongs to another caller: serve answers 404 before any policy runs")
            });
            if let Some(a) = arguments.as_deref() {
                match serde_json::from_str::<serde_json::Value>(a) {
                    Ok(v) if v.is_object() => {}
                    _ => bail!("--arguments must be a JSON object, as a tool call's arguments are"),
                }
            }
            if let Some(m) = method.as_deref() {
                let mcp =
                    tessera::authz::METHOD_ACTIONS.contains(&m) || m.starts_with("notifications/");
                if !mcp {
                    eprintln!(
                        "warning: {m:?} is no MCP method; policies see it as the action \"other\""
                    );
                }
            }
            let http_method: http::Method = http_method
                .as_deref()
                .unwrap_or("POST")
                .parse()
                .expect("clap allows only methods");
            let rpc_method = (http_method == http::Method::POST)
                .then_some(method.as_deref())
                .flatten();
            let req = tessera::authz::AuthzRequest {
                caller: who,
                connection_id: &connection,
                connection: conn,
                entities: &snap.entities,
                revision: snap.revision,
                http_method: &http_method,
                path: &path,
                rpc_method,
                tool: tool.as_deref(),
                arguments: arguments.as_deref(),
                protocol_version: None,
                origin: None,
                time: std::time::SystemTime::now(),
            };
            let e = p.evaluate(&req);
            let decision = match (e.allowed, e.ask, e.learn) {
                (true, false, _) => "allow",
                (true, true, false) => "ask (a person approves each call)",
                (true, true, true) if method.as_deref() == Some("tools/call") => {
                    "ask, learning (a prediction from people's answers may decide: tessera approval explain)"
                }
                (true, true, true) => "ask (a person approves each call: learning applies to tools/call only)",
                (false, _, _) => "deny",
            };
            if at.json {
                let v = serde_json::json!({
                    "decision": decision.split(' ').next(),
                    "action": tessera::authz::action_name(&http_method, rpc_method),
                    "caller": caller, "connection": connection, "tool": tool,
                    "determined_by": e.policies, "errors": e.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "note": not_theirs,
                });
                out!("{v}");
                return Ok(());
            }
            out!("decision: {decision}");
            out!(
                "action: {} (caller {caller}, connection {connection}{})",
                tessera::authz::action_name(&http_method, rpc_method),
                tool.map(|t| format!(", tool {t}")).unwrap_or_default()
            );
            if e.policies.is_empty() {
                out!("determined by: no policy permits it");
            } else {
                out!("determined by: {}", e.policies.join(", "));
            }
            for err in &e.errors {
                out!("error: {err}");
            }
            if let Some(n) = not_theirs {
                out!("note: {n}");
            }
        }
    }
    Ok(())
}
