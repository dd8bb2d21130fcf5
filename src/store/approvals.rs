//! Calls held for a person, their grants and denials.

use super::*;
use model::Decision;

impl Store {
    /// The open record of a call: a pending request, or a denial (which
    /// stands). `None`: the call needs a new request. A pending request
    /// that expired (`--approval-ttl`) is marked `expired` here and is no
    /// longer open.
    pub async fn open_approval(
        &self,
        k: &CallKey,
        now_ms: i64,
    ) -> Result<Option<(String, Status)>, StoreError> {
        let sql = "SELECT id, status, expires_at FROM approvals \
             WHERE caller = $1 AND connection = $2 AND rpc_method = $3 AND tool = $4 \
               AND arguments_sha256 = $5 AND status IN ('pending', 'denied') \
             ORDER BY created_at DESC, id LIMIT 1";
        let row: Option<(String, String, Option<i64>)> = on!(&self.db, p => {
            sqlx::query_as(sql)
                .bind(&k.caller)
                .bind(&k.connection)
                .bind(&k.rpc_method)
                .bind(&k.tool)
                .bind(&k.arguments_sha256)
                .fetch_optional(p)
                .await?
        });
        let Some((id, status, expires_at)) = row else {
            return Ok(None);
        };
        let stored = Status::parse(&status)?;
        if stored.at(expires_at, None, now_ms) == Status::Expired {
            self.expire_approval(&id, now_ms).await?;
            // Whatever else holds this call (a denial) is found anew.
            return Box::pin(self.open_approval(k, now_ms)).await;
        }
        Ok(Some((id, stored)))
    }

    /// Write `expired` on a pending approval whose time has passed (which
    /// [`Status::at`] already reads as expired).
    async fn expire_approval(&self, id: &str, now_ms: i64) -> Result<(), StoreError> {
        let sql = "UPDATE approvals SET status = 'expired' \
             WHERE id = $1 AND status = 'pending' AND expires_at <= $2";
        on!(&self.db, p => { sqlx::query(sql).bind(id).bind(now_ms).execute(p).await?; });
        Ok(())
    }

    /// A grant for this call that is still in force at `now_ms`.
    pub async fn live_grant(&self, k: &CallKey, now_ms: i64) -> Result<Option<String>, StoreError> {
        let sql = "SELECT id FROM approvals \
             WHERE caller = $1 AND connection = $2 AND rpc_method = $3 AND tool = $4 \
               AND arguments_sha256 = $5 AND status = 'granted' \
               AND expires_at > $6 AND uses_left > 0 \
             ORDER BY expires_at, id LIMIT 1";
        Ok(on!(&self.db, p => {
            sqlx::query_scalar(sql)
                .bind(&k.caller)
                .bind(&k.connection)
                .bind(&k.rpc_method)
                .bind(&k.tool)
                .bind(&k.arguments_sha256)
                .bind(now_ms)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Use a grant once; its last use marks it `used`. False when it was
    /// used up, expired or revoked meanwhile (by a concurrent request or a
    /// person): the call is then not granted.
    pub async fn take_grant(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let sql = "UPDATE approvals SET uses_left = uses_left - 1, \
               status = CASE WHEN uses_left <= 1 THEN 'used' ELSE status END \
             WHERE id = $1 AND status = 'granted' AND expires_at > $2 AND uses_left > 0";
        let n = on!(&self.db, p => {
            sqlx::query(sql).bind(id).bind(now_ms).execute(p).await?.rows_affected()
        });
        Ok(n == 1)
    }

    /// Record a pending request for a call, or return the one a concurrent
    /// request recorded first (one pending request per call). The call's
    /// `params` are stored only sealed (`a.sealed_call`), never in clear.
    pub async fn add_approval(&self, a: &NewApproval) -> Result<String, StoreError> {
        let sql = "INSERT INTO approvals (id, created_at, caller, connection, rpc_method, tool, \
             arguments_sha256, reason, status, expires_at, sub_path, query, session, \
             sealed_call, credential, shape) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9, $10, $11, $12, $13, $14, $15)";
        let r = on!(&self.db, p => {
            sqlx::query(sql)
                .bind(&a.id)
                .bind(a.created_at)
                .bind(&a.key.caller)
                .bind(&a.key.connection)
                .bind(&a.key.rpc_method)
                .bind(&a.key.tool)
                .bind(&a.key.arguments_sha256)
                .bind(&a.reason)
                .bind(a.expires_at)
                .bind(&a.shown.sub_path)
                .bind(&a.shown.query)
                .bind(&a.shown.session)
                .bind(&a.sealed_call)
                .bind(&a.credential)
                .bind(&a.shape)
                .execute(p)
                .await
                .map(drop)
        });
        match r {
            Ok(_) => Ok(a.id.clone()),
            Err(e) if unique_violation(&e) => match self.open_approval(&a.key, a.created_at).await?
            {
                Some((id, _)) => Ok(id),
                None => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Rebind a pending approval recorded under an older key (`old`) to
    /// the key `new` of the call now asking, showing what that call is
    /// (see `approvals::settle`) and keeping it sealed (`sealed_call`,
    /// sealed to `id`). False when it is no longer pending under `old` (a
    /// concurrent request adopted it, or a person decided it), or when
    /// `new` already has a pending approval.
    pub async fn rebind_approval(
        &self,
        id: &str,
        old: &CallKey,
        new: &CallKey,
        shown: &Shown,
        sealed_call: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE approvals SET arguments_sha256 = $1, sub_path = $2, query = $3, \
             session = $4, sealed_call = COALESCE($5, sealed_call) \
             WHERE id = $6 AND arguments_sha256 = $7 AND status = 'pending'";
        let r = on!(&self.db, p => {
            sqlx::query(sql)
                .bind(&new.arguments_sha256)
                .bind(&shown.sub_path)
                .bind(&shown.query)
                .bind(&shown.session)
                .bind(sealed_call)
                .bind(id)
                .bind(&old.arguments_sha256)
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        });
        match r {
            Ok(n) => Ok(n == 1),
            Err(e) if unique_violation(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// How many approvals of `caller` are pending and not expired at
    /// `now_ms` (an indexed count: `approvals_pending_caller`).
    pub async fn pending_approvals_of(&self, caller: &str, now_ms: i64) -> Result<i64, StoreError> {
        let sql = "SELECT COUNT(*) FROM approvals WHERE caller = $1 AND status = 'pending' \
               AND (expires_at IS NULL OR expires_at > $2)";
        Ok(on!(&self.db, p => {
            sqlx::query_scalar(sql).bind(caller).bind(now_ms).fetch_one(p).await?
        }))
    }

    /// Approvals, newest first: pending ones only, or all.
    pub async fn approvals(&self, all: bool, limit: i64) -> Result<Vec<Approval>, StoreError> {
        self.approvals_page(all, None, limit).await
    }

    /// A page of [`Store::approvals`]: those listed after the approval
    /// `before` (the last of the previous page: older, or as old with a
    /// greater id; an unknown id lists none). Pending ones only: those not
    /// expired.
    pub async fn approvals_page(
        &self,
        all: bool,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        let now = now_ms();
        // Keyset paging in the listing's order (created_at descending,
        // then id): stable while approvals are added or decided.
        let first = "SELECT * FROM approvals WHERE $1 OR (status = 'pending' \
                   AND (expires_at IS NULL OR expires_at > $2)) \
                 ORDER BY created_at DESC, id LIMIT $3";
        let next = "SELECT a.* FROM approvals a JOIN approvals c ON c.id = $3 \
                 WHERE ($1 OR (a.status = 'pending' \
                        AND (a.expires_at IS NULL OR a.expires_at > $2))) \
                   AND (a.created_at < c.created_at \
                        OR (a.created_at = c.created_at AND a.id > c.id)) \
                 ORDER BY a.created_at DESC, a.id LIMIT $4";
        let rows: Vec<Approval> = on!(&self.db, p => {
            let query = match before {
                None => sqlx::query_as(first).bind(all).bind(now),
                Some(before) => sqlx::query_as(next).bind(all).bind(now).bind(before),
            };
            query.bind(limit).fetch_all(p).await?
        });
        Ok(rows.into_iter().map(|a| as_of(a, now)).collect())
    }

    /// One approval, whatever its state.
    pub async fn approval(&self, id: &str) -> Result<Approval, StoreError> {
        let sql = "SELECT * FROM approvals WHERE id = $1";
        let row: Option<Approval> =
            on!(&self.db, p => sqlx::query_as(sql).bind(id).fetch_optional(p).await?);
        match row {
            Some(a) => Ok(as_of(a, now_ms())),
            None => Err(StoreError::NotFound {
                kind: "approval",
                name: id.to_string(),
            }),
        }
    }

    /// Every sealed held call, for key rotation (named by approval id).
    pub(super) async fn sealed_approvals(
        &self,
    ) -> Result<Vec<(Sealed, String, Vec<u8>)>, StoreError> {
        let sql = "SELECT id, sealed_call FROM approvals WHERE sealed_call IS NOT NULL ORDER BY id";
        let rows: Vec<(String, Vec<u8>)> =
            on!(&self.db, p => sqlx::query_as(sql).fetch_all(p).await?);
        Ok(rows
            .into_iter()
            .map(|(id, sealed)| (Sealed::Approval, id, sealed))
            .collect())
    }

    /// Grant a pending approval: its call is allowed `uses` times until
    /// `expires_at`.
    pub async fn grant_approval(
        &self,
        id: &str,
        now_ms: i64,
        expires_at: i64,
        uses: i64,
    ) -> Result<(), StoreError> {
        self.decide_approval(id, Decision::Grant, now_ms, Some((expires_at, uses)))
            .await
            .map(drop)
    }

    /// Deny a pending approval, or revoke a live grant.
    pub async fn deny_approval(&self, id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.decide_approval(id, Decision::Deny, now_ms, None)
            .await
            .map(drop)
    }

    /// Apply `decision` to the approval `id` as the transition table
    /// ([`Status::next`]) allows, recording who decided (the admin action's
    /// actor) and when; returns the new state. A move the table refuses is
    /// [`StoreError::Unchanged`] with its reason. The revision moves with
    /// it, so every serving process (a held call waiting for this decision
    /// included) learns of it.
    pub async fn decide_approval(
        &self,
        id: &str,
        decision: Decision,
        now_ms: i64,
        grant: Option<(i64, i64)>,
    ) -> Result<Status, StoreError> {
        let by = self.acting.as_ref().map(|a| a.actor.clone());
        // A concurrent change (a use, another person's decision) makes
        // the guarded update miss: read again and decide on what is there.
        for _ in 0..4 {
            let sql = "SELECT status, expires_at, uses_left FROM approvals WHERE id = $1";
            let row: Option<(String, Option<i64>, Option<i64>)> =
                on!(&self.db, p => sqlx::query_as(sql).bind(id).fetch_optional(p).await?);
            let Some((status, expires_at, uses_left)) = row else {
                return Err(StoreError::NotFound {
                    kind: "approval",
                    name: id.to_string(),
                });
            };
            let stored = Status::parse(&status)?;
            let now = stored.at(expires_at, uses_left, now_ms);
            let to = now.next(decision, id).map_err(|r| StoreError::Unchanged {
                what: r.to_string(),
            })?;
            let (new_expires, new_uses) = match to {
                Status::Granted => match grant {
                    Some((e, u)) => (Some(e), Some(u)),
                    None => (expires_at, uses_left),
                },
                // A revoked grant keeps its terms, for the record.
                Status::Revoked => (expires_at, uses_left),
                _ => (None, None),
            };
            let mut tx = self.begin().await?;
            let sql = "UPDATE approvals SET status = $1, decided_at = $2, decided_by = $3, \
                   expires_at = $4, uses_left = $5 \
                 WHERE id = $6 AND status = $7 \
                   AND (expires_at IS NULL OR expires_at > $2) \
                   AND (uses_left IS NULL OR uses_left > 0)";
            let n = on!(&mut tx, t => {
                sqlx::query(sql)
                    .bind(to.as_str())
                    .bind(now_ms)
                    .bind(&by)
                    .bind(new_expires)
                    .bind(new_uses)
                    .bind(id)
                    .bind(stored.as_str())
                    .execute(&mut **t)
                    .await?
                    .rows_affected()
            });
            if n == 1 {
                Self::bump(&mut tx).await?;
                // A person's answer to a pending call is evidence for
                // approvals that learn; written after the revision row is
                // locked (see `Store::evidence_after`).
                if stored == Status::Pending && matches!(to, Status::Granted | Status::Denied) {
                    Self::record_answer(&mut tx, id, to == Status::Granted, now_ms).await?;
                }
                self.commit(tx).await?;
                return Ok(to);
            }
        }
        Err(StoreError::Unchanged {
            what: format!("approval {id} kept changing while it was decided; try again"),
        })
    }
}

/// An approval as read, its status as it stands at `now` ([`Status::at`]).
fn as_of(mut a: Approval, now: i64) -> Approval {
    a.status = a.status.at(a.expires_at, a.uses_left, now);
    a
}
