//! The answers people gave to pending approvals, which approvals that
//! learn predict from (`crate::authz::predict`), and the calls denied by
//! prediction.

use super::*;

/// One recorded answer, with its row id (answers are read in id order,
/// and only those after the last one read).
#[derive(Debug, Clone, PartialEq)]
pub struct EvidenceRow {
    pub id: i64,
    pub at: i64,
    pub caller: String,
    pub credential: Option<String>,
    pub tool: String,
    pub shape: Option<String>,
    pub granted: bool,
}

impl Store {
    /// The evidence generation: it moves when evidence is forgotten.
    pub async fn evidence_generation(&self) -> Result<i64, StoreError> {
        let sql = "SELECT generation FROM evidence_state WHERE id = 1";
        Ok(on!(&self.db, p => sqlx::query_scalar(sql).fetch_one(p).await?))
    }

    /// The answers recorded after row `after`, in id order. Each is written
    /// in the transaction that decides its approval, after the revision row
    /// is locked, so ids are handed out in commit order on Postgres as on
    /// SQLite: none committed later can carry an id already passed.
    pub async fn evidence_after(&self, after: i64) -> Result<Vec<EvidenceRow>, StoreError> {
        let sql = "SELECT id, at, caller, credential, tool, shape, answer FROM approval_evidence \
             WHERE id > $1 ORDER BY id";
        on!(&self.db, p => sqlx::query(sql).bind(after).fetch_all(p).await?.iter()
            .map(|r| {
                Ok(EvidenceRow {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    caller: r.try_get("caller")?,
                    credential: r.try_get("credential")?,
                    tool: r.try_get("tool")?,
                    shape: r.try_get("shape")?,
                    granted: r.try_get::<String, _>("answer")? == "grant",
                })
            })
            .collect())
    }

    /// Write the answer a person gave to approval `id` (a grant or a
    /// denial of a pending tool call), inside the transaction deciding it.
    pub(super) async fn record_answer(
        tx: &mut Tx,
        id: &str,
        granted: bool,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let sql =
            "INSERT INTO approval_evidence (at, caller, credential, tool, shape, answer, approval) \
             SELECT $1, caller, credential, tool, shape, $2, id FROM approvals \
             WHERE id = $3 AND rpc_method = 'tools/call' AND tool <> ''";
        let answer = if granted { "grant" } else { "deny" };
        on!(tx, t => {
            sqlx::query(sql).bind(now_ms).bind(answer).bind(id).execute(&mut **t).await?;
        });
        Ok(())
    }

    /// Drop the answers of `caller` and/or about `tool` (both `None`:
    /// every answer); returns how many. Serving processes read the
    /// evidence again whole at their next prediction.
    pub async fn forget_evidence(
        &self,
        caller: Option<&str>,
        tool: Option<&str>,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        // A text per combination, each binding only what it names: with
        // `$1 IS NULL OR caller = $1` SQLite plans before the values are
        // known and scans the whole table, the write lock held (found by
        // review).
        let sql = match (caller, tool) {
            (Some(_), Some(_)) => "DELETE FROM approval_evidence WHERE caller = $1 AND tool = $2",
            (Some(_), None) => "DELETE FROM approval_evidence WHERE caller = $1",
            (None, Some(_)) => "DELETE FROM approval_evidence WHERE tool = $1",
            (None, None) => "DELETE FROM approval_evidence",
        };
        let next = "UPDATE evidence_state SET generation = generation + 1 WHERE id = 1";
        let n = on!(&mut tx, t => {
            let mut q = sqlx::query(sql);
            for v in [caller, tool].into_iter().flatten() {
                q = q.bind(v);
            }
            q.execute(&mut **t).await?.rows_affected()
        });
        Self::bump(&mut tx).await?;
        on!(&mut tx, t => { sqlx::query(next).execute(&mut **t).await?; });
        self.commit(tx).await?;
        Ok(n)
    }

    /// Remember that this call was denied by prediction, and forget those
    /// denied at or before `expired_ms` (which no longer count: found by the
    /// attack review, the table grew by a row per new call otherwise).
    pub async fn add_predicted_denial(
        &self,
        k: &CallKey,
        now_ms: i64,
        expired_ms: i64,
    ) -> Result<(), StoreError> {
        let prune = "DELETE FROM predicted_denials WHERE at <= $1";
        let add = "INSERT INTO predicted_denials (caller, connection, tool, arguments_sha256, at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (caller, connection, tool, arguments_sha256) DO UPDATE SET at = $5";
        on!(&self.db, p => {
            sqlx::query(prune).bind(expired_ms).execute(p).await?;
            sqlx::query(add)
                .bind(&k.caller)
                .bind(&k.connection)
                .bind(&k.tool)
                .bind(&k.arguments_sha256)
                .bind(now_ms)
                .execute(p)
                .await?;
        });
        Ok(())
    }

    /// Whether this call was denied by prediction since `since_ms`.
    pub async fn predicted_denial(&self, k: &CallKey, since_ms: i64) -> Result<bool, StoreError> {
        let sql = "SELECT COUNT(*) FROM predicted_denials WHERE caller = $1 AND connection = $2 \
               AND tool = $3 AND arguments_sha256 = $4 AND at > $5";
        let n: i64 = on!(&self.db, p => {
            sqlx::query_scalar(sql)
                .bind(&k.caller)
                .bind(&k.connection)
                .bind(&k.tool)
                .bind(&k.arguments_sha256)
                .bind(since_ms)
                .fetch_one(p)
                .await?
        });
        Ok(n > 0)
    }

    /// Whether a person's record of this very call stands: a pending
    /// request, a denial, a grant in force, or a grant a person revoked (a
    /// "no" to this call, later). A prediction never speaks over one.
    pub async fn call_has_record(&self, k: &CallKey, now_ms: i64) -> Result<bool, StoreError> {
        if self.open_approval(k, now_ms).await?.is_some()
            || self.live_grant(k, now_ms).await?.is_some()
        {
            return Ok(true);
        }
        let sql = "SELECT COUNT(*) FROM approvals \
             WHERE caller = $1 AND connection = $2 AND rpc_method = $3 AND tool = $4 \
               AND arguments_sha256 = $5 AND status = 'revoked'";
        let revoked: i64 = on!(&self.db, p => {
            sqlx::query_scalar(sql)
                .bind(&k.caller)
                .bind(&k.connection)
                .bind(&k.rpc_method)
                .bind(&k.tool)
                .bind(&k.arguments_sha256)
                .fetch_one(p)
                .await?
        });
        Ok(revoked > 0)
    }
}
