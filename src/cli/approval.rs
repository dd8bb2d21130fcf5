//! `tessera approval`: calls held for a person.

use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{self, Admin, CLI};
use tessera::store::model::{Approval, Status};

use super::*;

#[derive(Subcommand)]
pub(crate) enum ApprovalCmd {
    /// Pending approvals, newest first (with --all, decided and expired
    /// ones too).
    List {
        /// Every state, not only pending ones.
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
    /// One approval in full: the held call with its arguments, its state,
    /// who decided and when.
    Show {
        /// The approval's id (the one the held call's answer quotes).
        id: String,
    },
    /// Allow the held call (same tool, params, sub-path, query and session)
    /// to run. Only a pending approval can be granted.
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
    /// Refuse a pending call (the denial stands and stays listed), or
    /// revoke a live grant.
    Deny {
        /// The approval's id.
        id: String,
    },
    /// End a live grant before its TTL or uses run out.
    Revoke {
        /// The approval's id.
        id: String,
    },
    /// What a call would get if an @ask("learn") permit held it now: the
    /// predicted probability that a person approves, the evidence at each
    /// level, the thresholds from the costs, and the action.
    Explain {
        /// The caller making the call.
        #[arg(long)]
        caller: String,
        /// The connection (id, or its URL) the call goes to.
        #[arg(long)]
        connection: String,
        /// The tool called.
        #[arg(long)]
        tool: String,
        /// The call's arguments as JSON (only their names and types count).
        #[arg(long)]
        arguments: Option<String>,
        #[command(flatten)]
        predict: tessera::config::PredictArgs,
    },
    /// Drop the answers people gave, which approvals that learn predict
    /// from (a person changed their mind about a class of calls).
    Forget {
        /// Only this caller's answers.
        #[arg(long)]
        caller: Option<String>,
        /// Only answers about this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Every answer (required when neither --caller nor --tool is given).
        #[arg(long, conflicts_with_all = ["caller", "tool"])]
        all: bool,
    },
}

/// A time as a person reads it (UTC, to the second).
fn when(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    let s = tessera::telemetry::log::rfc3339(t);
    s.get(..19).map(|s| format!("{s}Z")).unwrap_or(s)
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_string()
    } else {
        s.to_string()
    }
}

/// The call's arguments (a tool call's `arguments`, else its `params`),
/// cut to `max` characters for a table (`show` prints them whole).
fn arguments(a: &Approval, max: usize) -> String {
    let text = a
        .arguments
        .as_deref()
        .or(a.shown.params.as_deref())
        .unwrap_or("?");
    let mut out: String = text.chars().take(max).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Pending: when it expires; granted: when the grant ends; otherwise `-`.
fn expires(a: &Approval) -> String {
    match (a.status, a.expires_at) {
        (Status::Pending | Status::Granted, Some(e)) => when(e),
        _ => "-".into(),
    }
}

pub(crate) async fn approval(at: &Place, c: ApprovalCmd) -> Result<()> {
    let store = at.store().await?;
    // The held calls are sealed: opened with the master key when there is
    // one (never created here); without it they show as `?`.
    let key = tessera::crypto::keyring::MasterKey::load_existing(
        master_key_setting()?.as_deref(),
        &at.data_dir,
    )
    .ok();
    // The credentials, to redact from what is shown (as serve does).
    let snapshot = match &key {
        Some(k) => {
            let schema = tessera::authz::cedar::Policies::builtin();
            tessera::snapshot::Snapshot::load(&store, k, schema.schema())
                .await
                .ok()
        }
        None => None,
    };
    let with = service::Reveal {
        key: key.as_ref(),
        snapshot: snapshot.as_ref(),
    };
    match c {
        ApprovalCmd::List { all, limit, before } => {
            let rows =
                service::approvals(&store, with, all, before.as_deref(), limit.max(1)).await?;
            let mut table = Vec::with_capacity(rows.len());
            for a in rows {
                if at.json {
                    out!("{}", serde_json::to_string(&a)?);
                    continue;
                }
                table.push(vec![
                    a.id.clone(),
                    a.status.as_str().to_string(),
                    when(a.created_at),
                    expires(&a),
                    a.key.caller.clone(),
                    a.key.connection.chars().take(8).collect(),
                    a.key.rpc_method.clone(),
                    or_dash(&a.key.tool),
                    arguments(&a, 60),
                    // Rows recorded before calls were bound whole: `?`.
                    a.shown.sub_path.as_deref().map_or("?".into(), |p| {
                        or_dash(&match &a.shown.query {
                            Some(q) => format!("{p}?{q}"),
                            None => p.to_string(),
                        })
                    }),
                    a.shown.session.as_deref().map_or("?".into(), or_dash),
                    a.decided_by.clone().unwrap_or_else(|| "-".into()),
                    a.reason.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            if !at.json {
                let head = [
                    "ID", "STATUS", "ASKED", "EXPIRES", "CALLER", "CONN", "METHOD", "TOOL", "ARGS",
                    "PATH", "SESSION", "BY", "REASON",
                ];
                print_table(&head, &table);
            }
        }
        ApprovalCmd::Show { id } => {
            let a = service::approval(&store, with, &id).await?;
            if at.json {
                out!("{}", serde_json::to_string_pretty(&a)?);
                return Ok(());
            }
            let mut rows = vec![
                vec!["id".into(), a.id.clone()],
                vec!["status".into(), a.status.as_str().into()],
                vec!["asked".into(), when(a.created_at)],
                vec!["expires".into(), expires(&a)],
                vec!["caller".into(), a.key.caller.clone()],
                vec!["connection".into(), a.key.connection.clone()],
                vec!["method".into(), a.key.rpc_method.clone()],
                vec!["tool".into(), or_dash(&a.key.tool)],
                vec!["arguments".into(), arguments(&a, usize::MAX)],
                vec![
                    "params".into(),
                    a.shown.params.clone().unwrap_or_else(|| "?".into()),
                ],
                vec![
                    "path".into(),
                    match (&a.shown.sub_path, &a.shown.query) {
                        (None, _) => "?".into(),
                        (Some(p), Some(q)) => format!("{p}?{q}"),
                        (Some(p), None) => or_dash(p),
                    },
                ],
                vec![
                    "session".into(),
                    a.shown.session.as_deref().map_or("?".into(), or_dash),
                ],
                vec![
                    "reason".into(),
                    a.reason.clone().unwrap_or_else(|| "-".into()),
                ],
                vec!["key".into(), a.key.arguments_sha256.clone()],
                vec![
                    "decided".into(),
                    match (&a.decided_by, a.decided_at) {
                        (Some(by), Some(t)) => format!("{} by {by}", when(t)),
                        (None, Some(t)) => when(t),
                        _ => "-".into(),
                    },
                ],
            ];
            if let Some(u) = a.uses_left.filter(|_| a.status == Status::Granted) {
                rows.push(vec!["uses left".into(), u.to_string()]);
            }
            print_table(&["FIELD", "VALUE"], &rows);
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
            let to = Admin::new(&store, CLI).approval_deny(&id).await?;
            if to == Status::Revoked {
                at.say(
                    format!("revoked the grant {id}"),
                    serde_json::json!({"revoked": id}),
                );
            } else {
                at.say(format!("denied {id}"), serde_json::json!({"denied": id}));
            }
        }
        ApprovalCmd::Explain {
            caller,
            connection,
            tool,
            arguments,
            predict,
        } => {
            explain(at, &store, caller, connection, tool, arguments, predict).await?;
        }
        ApprovalCmd::Forget { caller, tool, all } => {
            let n = Admin::new(&store, CLI)
                .approval_forget(caller.as_deref(), tool.as_deref(), all)
                .await?;
            let said = format!("forgot {n} {}", if n == 1 { "answer" } else { "answers" });
            at.say(
                if n == 0 {
                    format!("{said}: none matched (names and tools compare exactly, letter case included)")
                } else {
                    said
                },
                serde_json::json!({"forgotten": n}),
            );
        }
        ApprovalCmd::Revoke { id } => {
            Admin::new(&store, CLI).approval_revoke(&id).await?;
            at.say(
                format!("revoked the grant {id}"),
                serde_json::json!({"revoked": id}),
            );
        }
    }
    Ok(())
}

/// `approval explain`: the built-in model's view of a call, from every
/// answer in the store, with the costs and half-life `serve` would use.
async fn explain(
    at: &Place,
    store: &tessera::store::Store,
    caller: String,
    connection: String,
    tool: String,
    arguments: Option<String>,
    predict: tessera::config::PredictArgs,
) -> Result<()> {
    use tessera::authz::predict::model;
    let settings = tessera::config::predict_settings(&predict)?;
    if let Some(a) = &arguments {
        serde_json::from_str::<serde_json::Value>(a)
            .map_err(|e| anyhow::anyhow!("--arguments is not JSON: {e}"))?;
    }
    let e = service::explain(
        store,
        &settings,
        &caller,
        &connection,
        &tool,
        arguments.as_deref(),
        |s| s.to_string(),
    )
    .await?;
    if at.json {
        out!("{}", serde_json::to_string(&e)?);
        return Ok(());
    }
    out!(
        "call: caller {}, credential {}, tool {}, shape {}",
        e.caller,
        e.credential,
        e.tool,
        e.shape
    );
    out!(
        "thresholds: allow above p = {}, deny below p = {} (costs: wrong allow {}, wrong deny {}, ask {})",
        model::prob(e.thresholds.allow),
        model::prob(e.thresholds.deny),
        settings.costs.wrong_allow,
        settings.costs.wrong_deny,
        settings.costs.ask
    );
    let rows: Vec<Vec<String>> = e
        .levels
        .iter()
        .map(|l| {
            vec![
                l.level.clone(),
                model::count(l.grants),
                model::count(l.denials),
                l.lower.map_or("-".into(), |x| format!("{x:.3}")),
                l.upper.map_or("-".into(), |x| format!("{x:.3}")),
                if l.decides {
                    "decides".into()
                } else if l.answers < model::MIN_EVIDENCE {
                    "too few answers".into()
                } else {
                    "-".into()
                },
            ]
        })
        .collect();
    print_table(&["LEVEL", "GRANTS", "DENIALS", "LOWER", "UPPER", ""], &rows);
    out!("{}", e.reason);
    if e.predictor_url {
        out!(
            "action: decided by the predictor at --predictor-url (this model would: {})",
            e.action
        );
    } else {
        out!("action: {}", e.action);
    }
    out!(
        "(if an @ask(\"learn\") permit holds the call: `tessera policy explain --caller {} --connection {} --method tools/call --tool {}` tells whether one does)",
        e.caller,
        &e.connection,
        e.tool
    );
    Ok(())
}
