//! The admin audit, as listed (rows are written with each action: `Store::acting`).

use super::*;

impl Store {
    /// Admin actions, newest first, at most `limit`, before id `before`.
    pub async fn admin_audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AdminAction>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, actor, action, target, outcome FROM admin_audit WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(AdminAction {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    outcome: r.try_get("outcome")?,
                })
            })
            .collect()
    }
}
