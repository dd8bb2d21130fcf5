//! Tool pins (issue 29): per credential, each tool's accepted and last
//! offered definition (`crate::authz::pins` decides with them).

use super::*;
use model::{OfferedTool, PinChange, ToolPinRow};

/// The most tools kept per credential: an upstream that lists new names
/// on every answer fills no more than this (the rest stay held, unrecorded).
pub const MAX_TOOLS_PER_CREDENTIAL: usize = 10_000;

/// Who the admin audit names for what the serving process records itself.
pub const PIN_ACTOR: &str = "tessera";

const COLUMNS: &str = "credential, tool, status, pinned_digest, pinned_definition, \
                       offered_digest, offered_definition, first_seen, last_seen";

impl Store {
    /// Every pin of every credential (the snapshot's load).
    pub async fn tool_pins(&self) -> Result<Vec<ToolPinRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tool_pins ORDER BY credential, tool");
        Ok(on!(&self.db, p => sqlx::query_as(&sql).fetch_all(p).await?))
    }

    /// One credential's pins, by tool name.
    pub async fn tool_pins_of(&self, credential: &str) -> Result<Vec<ToolPinRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tool_pins WHERE credential = $1 ORDER BY tool");
        Ok(on!(&self.db, p => sqlx::query_as(&sql).bind(credential).fetch_all(p).await?))
    }

    /// Record the tools of a `tools/list` answer whose digests the
    /// serving process had not seen recorded. With `baseline` (trust on
    /// first use) and no pin yet for the credential, every tool is pinned
    /// as offered; otherwise a tool without a pin is `new` and one whose
    /// digest differs from its pin `changed` (a `rejected` one stays
    /// rejected until an admin accepts it). A digest already recorded as
    /// offered is no change: replicas that saw the same answer record it
    /// once. Each pin and each change is written to the admin audit in the
    /// same transaction; the revision moves when anything was written.
    pub async fn record_offered_tools(
        &self,
        credential: &str,
        offered: &[OfferedTool],
        baseline: bool,
    ) -> Result<Vec<PinChange>, StoreError> {
        let mut tx = self.begin().await?;
        let sql = "SELECT tool, status, pinned_digest, offered_digest FROM tool_pins WHERE credential = $1";
        type Known = (String, String, Option<String>, Option<String>);
        let rows: Vec<Known> = on!(&mut tx, t => {
            sqlx::query_as(sql).bind(credential).fetch_all(&mut **t).await?
        });
        let baseline = baseline && rows.is_empty();
        let mut count = rows.len();
        let known: std::collections::HashMap<String, (String, Option<String>, Option<String>)> =
            rows.into_iter()
                .map(|(t, s, p, o)| (t, (s, p, o)))
                .collect();
        let at = now_ms();
        let mut changes = Vec::new();
        for o in offered {
            match known.get(&o.tool) {
                None => {
                    if count >= MAX_TOOLS_PER_CREDENTIAL {
                        continue;
                    }
                    count += 1;
                    let (status, pinned) = if baseline {
                        ("pinned", Some(o))
                    } else {
                        ("new", None)
                    };
                    let sql = "INSERT INTO tool_pins (credential, tool, status, pinned_digest, \
                               pinned_definition, offered_digest, offered_definition, first_seen, last_seen) \
                               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)";
                    on!(&mut tx, t => {
                        sqlx::query(sql)
                            .bind(credential)
                            .bind(&o.tool)
                            .bind(status)
                            .bind(pinned.map(|p| p.digest.as_str()))
                            .bind(pinned.map(|p| p.definition.as_str()))
                            .bind(&o.digest)
                            .bind(&o.definition)
                            .bind(at)
                            .execute(&mut **t)
                            .await?;
                    });
                    changes.push(PinChange {
                        tool: o.tool.clone(),
                        status: status.to_string(),
                        digest: o.digest.clone(),
                    });
                }
                Some((_, _, offered)) if offered.as_deref() == Some(&o.digest) => {}
                Some((status, pinned, _)) => {
                    let status = if pinned.as_deref() == Some(&o.digest) {
                        "pinned"
                    } else if status == "rejected" {
                        "rejected"
                    } else if pinned.is_none() {
                        "new"
                    } else {
                        "changed"
                    };
                    let sql = "UPDATE tool_pins SET status = $1, offered_digest = $2, \
                               offered_definition = $3, last_seen = $4 WHERE credential = $5 AND tool = $6";
                    on!(&mut tx, t => {
                        sqlx::query(sql)
                            .bind(status)
                            .bind(&o.digest)
                            .bind(&o.definition)
                            .bind(at)
                            .bind(credential)
                            .bind(&o.tool)
                            .execute(&mut **t)
                            .await?;
                    });
                    changes.push(PinChange {
                        tool: o.tool.clone(),
                        status: status.to_string(),
                        digest: o.digest.clone(),
                    });
                }
            }
        }
        if changes.is_empty() {
            on!(tx, t => t.rollback().await?);
            return Ok(changes);
        }
        for c in &changes {
            let action = if c.status == "pinned" && baseline {
                "tool.pin"
            } else {
                "tool.change"
            };
            let target = format!("{credential}/{}", c.tool);
            let outcome = format!("{} {}", c.status, &c.digest[..c.digest.len().min(16)]);
            Self::insert_admin_audit(&mut tx, PIN_ACTOR, action, &target, &outcome).await?;
        }
        Self::bump(&mut tx).await?;
        on!(tx, t => t.commit().await?);
        Ok(changes)
    }

    /// Accept the offered definition of `tool` (every tool awaiting review,
    /// rejected ones aside, with `None`) as its pin. Returns the tools
    /// accepted; none is an error naming why.
    pub async fn accept_tools(
        &self,
        credential: &str,
        tool: Option<&str>,
    ) -> Result<Vec<String>, StoreError> {
        let (select, update) = match tool {
            Some(_) => (
                "SELECT tool FROM tool_pins WHERE credential = $1 AND tool = $2 \
                 AND offered_digest IS NOT NULL AND status <> 'pinned' ORDER BY tool",
                "UPDATE tool_pins SET status = 'pinned', pinned_digest = offered_digest, \
                 pinned_definition = offered_definition WHERE credential = $1 AND tool = $2 \
                 AND offered_digest IS NOT NULL AND status <> 'pinned'",
            ),
            None => (
                "SELECT tool FROM tool_pins WHERE credential = $1 AND (tool = $2 OR $2 = '') \
                 AND offered_digest IS NOT NULL AND status IN ('changed', 'new') ORDER BY tool",
                "UPDATE tool_pins SET status = 'pinned', pinned_digest = offered_digest, \
                 pinned_definition = offered_definition WHERE credential = $1 AND (tool = $2 OR $2 = '') \
                 AND offered_digest IS NOT NULL AND status IN ('changed', 'new')",
            ),
        };
        self.review(credential, tool, select, update).await
    }

    /// Keep `tool`'s offered definition hidden (every tool awaiting review
    /// with `None`): it stays held until accepted, unless the upstream
    /// offers its pinned definition again.
    pub async fn reject_tools(
        &self,
        credential: &str,
        tool: Option<&str>,
    ) -> Result<Vec<String>, StoreError> {
        let (select, update) = match tool {
            Some(_) => (
                "SELECT tool FROM tool_pins WHERE credential = $1 AND tool = $2 AND status <> 'rejected' ORDER BY tool",
                // A pinned tool rejected loses its pin: offered again as
                // it was, it stays hidden.
                "UPDATE tool_pins SET status = 'rejected', \
                 pinned_digest = CASE WHEN status = 'pinned' THEN NULL ELSE pinned_digest END, \
                 pinned_definition = CASE WHEN status = 'pinned' THEN NULL ELSE pinned_definition END \
                 WHERE credential = $1 AND tool = $2 AND status <> 'rejected'",
            ),
            None => (
                "SELECT tool FROM tool_pins WHERE credential = $1 AND (tool = $2 OR $2 = '') \
                 AND status IN ('changed', 'new') ORDER BY tool",
                "UPDATE tool_pins SET status = 'rejected' WHERE credential = $1 AND (tool = $2 OR $2 = '') \
                 AND status IN ('changed', 'new')",
            ),
        };
        self.review(credential, tool, select, update).await
    }

    async fn review(
        &self,
        credential: &str,
        tool: Option<&str>,
        select: &str,
        update: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut tx = self.begin().await?;
        let arg = tool.unwrap_or("");
        let tools: Vec<String> = on!(&mut tx, t => {
            sqlx::query_scalar(select).bind(credential).bind(arg).fetch_all(&mut **t).await?
        });
        if tools.is_empty() {
            let exists: Option<String> = on!(&mut tx, t => {
                sqlx::query_scalar("SELECT tool FROM tool_pins WHERE credential = $1 AND (tool = $2 OR $2 = '')")
                    .bind(credential)
                    .bind(arg)
                    .fetch_optional(&mut **t)
                    .await?
            });
            if exists.is_none() && !Self::credential_exists(&mut tx, credential).await? {
                on!(tx, t => t.rollback().await?);
                return Err(StoreError::NotFound {
                    kind: "credential",
                    name: credential.to_string(),
                });
            }
            on!(tx, t => t.rollback().await?);
            return Err(match (exists, tool) {
                (None, Some(t)) => StoreError::NotFound {
                    kind: "tool",
                    name: format!("{credential}/{t}"),
                },
                (None, None) => StoreError::NotFound {
                    kind: "pinned tool of credential",
                    name: credential.to_string(),
                },
                (Some(_), Some(t)) => StoreError::Unchanged {
                    what: format!(
                        "tool {t:?} of credential {credential:?} has nothing to review in that way"
                    ),
                },
                (Some(_), None) => StoreError::Unchanged {
                    what: format!("no tool of credential {credential:?} awaits review"),
                },
            });
        }
        on!(&mut tx, t => {
            sqlx::query(update).bind(credential).bind(arg).execute(&mut **t).await?;
        });
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(tools)
    }

    async fn credential_exists(tx: &mut Tx, credential: &str) -> Result<bool, StoreError> {
        let sql = "SELECT COUNT(*) FROM credentials WHERE name = $1";
        let n: i64 = on!(tx, t => {
            sqlx::query_scalar(sql).bind(credential).fetch_one(&mut **t).await?
        });
        Ok(n > 0)
    }

    /// One credential's pins, by tool name; an error if no credential has
    /// that name (a name mistyped is not a credential without tools).
    pub async fn tool_pins_of_credential(
        &self,
        credential: &str,
    ) -> Result<Vec<ToolPinRow>, StoreError> {
        let sql = "SELECT COUNT(*) FROM credentials WHERE name = $1";
        let n: i64 = on!(&self.db, p => {
            sqlx::query_scalar(sql).bind(credential).fetch_one(p).await?
        });
        if n == 0 {
            return Err(StoreError::NotFound {
                kind: "credential",
                name: credential.to_string(),
            });
        }
        let rows = self.tool_pins_of(credential).await?;
        Ok(rows)
    }
}
