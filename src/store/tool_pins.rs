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
    /// rejected ones aside, with `None`) as its pin. With `digest`, only
    /// while the definition offered is still the one of that digest: the
    /// check and the pin are one `UPDATE`, so a definition the upstream
    /// changed after it was reviewed is never pinned in its place. Returns
    /// the tools pinned with the digest each was pinned at (the `UPDATE`'s
    /// own rows); none is an error naming why, and changes nothing.
    pub async fn accept_tools(
        &self,
        credential: &str,
        tool: Option<&str>,
        digest: Option<&str>,
    ) -> Result<Vec<PinnedTool>, StoreError> {
        let update = match tool {
            Some(_) => {
                "UPDATE tool_pins SET status = 'pinned', pinned_digest = offered_digest, \
                 pinned_definition = offered_definition WHERE credential = $1 AND tool = $2 \
                 AND offered_digest IS NOT NULL AND status <> 'pinned' \
                 AND (offered_digest = $3 OR $3 = '') RETURNING tool, pinned_digest"
            }
            None => {
                "UPDATE tool_pins SET status = 'pinned', pinned_digest = offered_digest, \
                 pinned_definition = offered_definition WHERE credential = $1 AND (tool = $2 OR $2 = '') \
                 AND offered_digest IS NOT NULL AND status IN ('changed', 'new') \
                 AND (offered_digest = $3 OR $3 = '') RETURNING tool, pinned_digest"
            }
        };
        let mut tx = self.begin().await?;
        let arg = tool.unwrap_or("");
        let mut pinned: Vec<(String, String)> = on!(&mut tx, t => {
            sqlx::query_as(update)
                .bind(credential)
                .bind(arg)
                .bind(digest.unwrap_or(""))
                .fetch_all(&mut **t)
                .await?
        });
        if pinned.is_empty() {
            let why = self.why_nothing(&mut tx, credential, tool, digest).await;
            on!(tx, t => t.rollback().await?);
            return Err(why?);
        }
        pinned.sort();
        // The admin audit names each tool with the digest it was pinned
        // at, in the transaction that pinned it.
        let acting = self
            .acting
            .as_ref()
            .filter(|a| !a.recorded.load(Ordering::Relaxed));
        if let Some(a) = acting {
            for (tool, digest) in &pinned {
                let target = format!("{credential}/{tool}");
                let outcome = format!("ok: pinned {digest}");
                Self::insert_admin_audit(&mut tx, &a.actor, &a.action, &target, &outcome).await?;
            }
        }
        Self::bump(&mut tx).await?;
        on!(tx, t => t.commit().await?);
        if let Some(a) = acting {
            a.recorded.store(true, Ordering::Relaxed);
        }
        Ok(pinned
            .into_iter()
            .map(|(tool, digest)| PinnedTool { tool, digest })
            .collect())
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
            let why = self.why_nothing(&mut tx, credential, tool, None).await;
            on!(tx, t => t.rollback().await?);
            return Err(why?);
        }
        on!(&mut tx, t => {
            sqlx::query(update).bind(credential).bind(arg).execute(&mut **t).await?;
        });
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(tools)
    }

    /// Why a review changed nothing: no such credential or tool, a
    /// definition offered now that is not the one of `digest`, or nothing
    /// to review in that way.
    async fn why_nothing(
        &self,
        tx: &mut Tx,
        credential: &str,
        tool: Option<&str>,
        digest: Option<&str>,
    ) -> Result<StoreError, StoreError> {
        let arg = tool.unwrap_or("");
        let sql = "SELECT status, offered_digest FROM tool_pins WHERE credential = $1 \
                   AND (tool = $2 OR $2 = '') ORDER BY tool";
        let rows: Vec<(String, Option<String>)> = on!(tx, t => {
            sqlx::query_as(sql).bind(credential).bind(arg).fetch_all(&mut **t).await?
        });
        if rows.is_empty() && !Self::credential_exists(tx, credential).await? {
            return Ok(StoreError::NotFound {
                kind: "credential",
                name: credential.to_string(),
            });
        }
        let awaiting = |r: &&(String, Option<String>)| match tool {
            Some(_) => r.0 != "pinned",
            None => r.0 == "changed" || r.0 == "new",
        };
        let offered_other = |d: &str| {
            rows.iter()
                .filter(awaiting)
                .any(|r| r.1.as_deref().is_some_and(|o| o != d))
        };
        Ok(match (rows.is_empty(), tool, digest) {
            (true, Some(t), _) => StoreError::NotFound {
                kind: "tool",
                name: format!("{credential}/{t}"),
            },
            (true, None, _) => StoreError::NotFound {
                kind: "pinned tool of credential",
                name: credential.to_string(),
            },
            (false, Some(t), Some(d)) if offered_other(d) => StoreError::Unchanged {
                what: format!(
                    "tool {t:?} of credential {credential:?} is no longer offered with digest {d}: \
                     its definition changed after it was reviewed, and nothing was accepted; \
                     review it again (tessera tool diff --credential {credential} {t})"
                ),
            },
            (false, Some(t), _) => StoreError::Unchanged {
                what: format!(
                    "tool {t:?} of credential {credential:?} has nothing to review in that way"
                ),
            },
            (false, None, _) => StoreError::Unchanged {
                what: format!("no tool of credential {credential:?} awaits review"),
            },
        })
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

/// A tool an acceptance pinned, and the digest of the definition pinned.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct PinnedTool {
    pub tool: String,
    /// Hex SHA-256 of the canonical definition pinned.
    pub digest: String,
}
