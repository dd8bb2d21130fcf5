//! The admin audit, as listed (rows are written with each action: `Store::acting`).

use super::*;

impl Store {
    /// Admin actions, newest first, at most `limit`, before id `before`.
    pub async fn admin_audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AdminAction>, StoreError> {
        let sql = "SELECT id, at, actor, action, target, outcome FROM admin_audit \
                   WHERE id < $1 ORDER BY id DESC LIMIT $2";
        let before = before.unwrap_or(i64::MAX);
        Ok(on!(&self.db, p => {
            sqlx::query_as(sql).bind(before).bind(limit).fetch_all(p).await?
        }))
    }
}
