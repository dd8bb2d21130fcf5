//! Calls held for a person, their grants and denials.

use super::*;

impl Store {
    /// The open record of a call: a pending request, or a denial (which
    /// stands). `None`: the call needs a new request.
    pub async fn open_approval(&self, k: &CallKey) -> Result<Option<(String, Status)>, StoreError> {
        let row = sqlx::query(
            "SELECT id, status FROM approvals \
             WHERE caller = $1 AND connection = $2 AND rpc_method = $3 AND tool = $4 \
               AND arguments_sha256 = $5 AND status IN ('pending', 'denied') \
             ORDER BY created_at DESC, id LIMIT 1",
        )
        .bind(&k.caller)
        .bind(&k.connection)
        .bind(&k.rpc_method)
        .bind(&k.tool)
        .bind(&k.arguments_sha256)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let status: String = r.try_get("status")?;
            Ok((r.try_get("id")?, Status::parse(&status)?))
        })
        .transpose()
    }

    /// A grant for this call that is still in force at `now_ms`.
    pub async fn live_grant(&self, k: &CallKey, now_ms: i64) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM approvals \
             WHERE caller = $1 AND connection = $2 AND rpc_method = $3 AND tool = $4 \
               AND arguments_sha256 = $5 AND status = 'granted' \
               AND expires_at > $6 AND uses_left > 0 \
             ORDER BY expires_at, id LIMIT 1",
        )
        .bind(&k.caller)
        .bind(&k.connection)
        .bind(&k.rpc_method)
        .bind(&k.tool)
        .bind(&k.arguments_sha256)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Use a grant once. False when it was used up or expired meanwhile
    /// (by a concurrent request): the call is then not granted.
    pub async fn take_grant(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE approvals SET uses_left = uses_left - 1 \
             WHERE id = $1 AND status = 'granted' AND expires_at > $2 AND uses_left > 0",
        )
        .bind(id)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Record a pending request for a call, or return the one a concurrent
    /// request recorded first (one pending request per call).
    pub async fn add_approval(&self, a: &NewApproval) -> Result<String, StoreError> {
        let r = sqlx::query(
            "INSERT INTO approvals (id, created_at, caller, connection, rpc_method, tool, \
             arguments_sha256, arguments, reason, status, sub_path, query, session, params) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, $11, $12, $13)",
        )
        .bind(&a.id)
        .bind(a.created_at)
        .bind(&a.key.caller)
        .bind(&a.key.connection)
        .bind(&a.key.rpc_method)
        .bind(&a.key.tool)
        .bind(&a.key.arguments_sha256)
        .bind(&a.arguments)
        .bind(&a.reason)
        .bind(&a.shown.sub_path)
        .bind(&a.shown.query)
        .bind(&a.shown.session)
        .bind(&a.shown.params)
        .execute(&self.pool)
        .await;
        match r {
            Ok(_) => Ok(a.id.clone()),
            Err(e) if unique_violation(&e) => match self.open_approval(&a.key).await? {
                Some((id, _)) => Ok(id),
                None => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Rebind a pending approval recorded under an older key (`old`) to
    /// the key `new` of the call now asking, showing what that call is
    /// (see `approvals::settle`). False when it is no longer pending under
    /// `old` (a concurrent request adopted it, or a person decided it), or
    /// when `new` already has a pending approval.
    pub async fn rebind_approval(
        &self,
        id: &str,
        old: &CallKey,
        new: &CallKey,
        shown: &Shown,
    ) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE approvals SET arguments_sha256 = $1, sub_path = $2, query = $3, \
             session = $4, params = COALESCE($5, params) \
             WHERE id = $6 AND arguments_sha256 = $7 AND status = 'pending'",
        )
        .bind(&new.arguments_sha256)
        .bind(&shown.sub_path)
        .bind(&shown.query)
        .bind(&shown.session)
        .bind(&shown.params)
        .bind(id)
        .bind(&old.arguments_sha256)
        .execute(&self.pool)
        .await;
        match r {
            Ok(r) => Ok(r.rows_affected() == 1),
            Err(e) if unique_violation(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// How many approvals of `caller` are pending (one indexed count:
    /// `approvals_pending_caller`).
    pub async fn pending_approvals_of(&self, caller: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM approvals WHERE caller = $1 AND status = 'pending'",
        )
        .bind(caller)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Approvals, newest first: pending ones only, or all.
    pub async fn approvals(&self, all: bool, limit: i64) -> Result<Vec<Approval>, StoreError> {
        self.approvals_page(all, None, limit).await
    }

    /// A page of [`Store::approvals`]: those listed after the approval
    /// `before` (the last of the previous page: older, or as old with a
    /// greater id; an unknown id lists none).
    pub async fn approvals_page(
        &self,
        all: bool,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        // Keyset paging in the listing's order (created_at descending,
        // then id): stable while approvals are added or decided.
        let query = match before {
            None => sqlx::query(
                "SELECT * FROM approvals WHERE $1 OR status = 'pending' \
                 ORDER BY created_at DESC, id LIMIT $2",
            )
            .bind(all),
            Some(before) => sqlx::query(
                "SELECT a.* FROM approvals a JOIN approvals c ON c.id = $2 \
                 WHERE ($1 OR a.status = 'pending') \
                   AND (a.created_at < c.created_at \
                        OR (a.created_at = c.created_at AND a.id > c.id)) \
                 ORDER BY a.created_at DESC, a.id LIMIT $3",
            )
            .bind(all)
            .bind(before),
        };
        let rows = query.bind(limit).fetch_all(&self.pool).await?;
        rows.into_iter()
            .map(|r| {
                let status: String = r.try_get("status")?;
                Ok(Approval {
                    id: r.try_get("id")?,
                    created_at: r.try_get("created_at")?,
                    key: CallKey {
                        caller: r.try_get("caller")?,
                        connection: r.try_get("connection")?,
                        rpc_method: r.try_get("rpc_method")?,
                        tool: r.try_get("tool")?,
                        arguments_sha256: r.try_get("arguments_sha256")?,
                    },
                    arguments: r.try_get("arguments")?,
                    reason: r.try_get("reason")?,
                    status: Status::parse(&status)?,
                    decided_at: r.try_get("decided_at")?,
                    expires_at: r.try_get("expires_at")?,
                    uses_left: r.try_get("uses_left")?,
                    shown: Shown {
                        sub_path: r.try_get("sub_path")?,
                        query: r.try_get("query")?,
                        session: r.try_get("session")?,
                        params: r.try_get("params")?,
                    },
                })
            })
            .collect()
    }

    /// Grant a pending (or denied) approval: its call is allowed `uses`
    /// times until `expires_at`.
    pub async fn grant_approval(
        &self,
        id: &str,
        now_ms: i64,
        expires_at: i64,
        uses: i64,
    ) -> Result<(), StoreError> {
        self.decide_approval(id, Status::Granted, now_ms, Some(expires_at), Some(uses))
            .await
    }

    /// Deny an approval (pending, or a grant not used up: that ends it).
    pub async fn deny_approval(&self, id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.decide_approval(id, Status::Denied, now_ms, None, None)
            .await
    }

    pub(super) async fn decide_approval(
        &self,
        id: &str,
        to: Status,
        now_ms: i64,
        expires_at: Option<i64>,
        uses: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let r = sqlx::query(
            "UPDATE approvals SET status = $1, decided_at = $2, expires_at = $3, uses_left = $4 \
             WHERE id = $5 AND status != $6",
        )
        .bind(to.as_str())
        .bind(now_ms)
        .bind(expires_at)
        .bind(uses)
        .bind(id)
        .bind(to.as_str())
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 1 {
            return self.commit(tx).await;
        }
        drop(tx);
        let exists: Option<String> =
            sqlx::query_scalar("SELECT status FROM approvals WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Err(match exists {
            None => StoreError::NotFound {
                kind: "approval",
                name: id.to_string(),
            },
            Some(_) => StoreError::Unchanged {
                what: format!("approval {id} is already {}", to.as_str()),
            },
        })
    }
}
