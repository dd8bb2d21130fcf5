//! Connections: one caller, one credential, an unguessable id.

use super::*;

impl Store {
    /// Allocate a connection for a live caller on a credential.
    pub async fn add_connection(
        &self,
        id: &str,
        caller: &str,
        credential: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let c: Option<(i64, Option<i64>)> =
            sqlx::query_as("SELECT id, revoked_at FROM callers WHERE name = $1")
                .bind(caller)
                .fetch_optional(&mut *tx)
                .await?;
        let caller_id = match c {
            None => {
                return Err(StoreError::NotFound {
                    kind: "caller",
                    name: caller.to_string(),
                })
            }
            Some((_, Some(_))) => {
                return Err(StoreError::Revoked {
                    kind: "caller",
                    name: caller.to_string(),
                })
            }
            Some((id, None)) => id,
        };
        let credential_id: i64 = sqlx::query_scalar("SELECT id FROM credentials WHERE name = $1")
            .bind(credential)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "credential",
                name: credential.to_string(),
            })?;
        sqlx::query(
            "INSERT INTO connections (id, caller_id, credential_id, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(caller_id)
        .bind(credential_id)
        .bind(now())
        .execute(&mut *tx)
        .await?;
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Record the public URL a starting `serve` answers on (connection
    /// URLs are built on it). Not a data change: no revision.
    pub async fn record_served_url(&self, public_url: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO served (id, public_url, at) VALUES (1, $1, $2)
             ON CONFLICT (id) DO UPDATE SET public_url = excluded.public_url, at = excluded.at",
        )
        .bind(public_url)
        .bind(crate::telemetry::time::now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The public URL the last `serve` to start recorded, if any.
    pub async fn served_url(&self) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT public_url FROM served WHERE id = 1")
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    pub async fn revoke_connection(&self, id: &str) -> Result<(), StoreError> {
        self.revoke(Revocable::Connection, id).await
    }

    pub async fn connections(&self) -> Result<Vec<ConnectionRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT c.id, c.caller_id, a.name AS caller, c.credential_id, k.name AS credential,
                    c.created_at, c.revoked_at, a.revoked_at AS caller_revoked_at
             FROM connections c
             JOIN callers a ON a.id = c.caller_id
             JOIN credentials k ON k.id = c.credential_id
             ORDER BY c.created_at, c.id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(ConnectionRow {
                    id: r.try_get("id")?,
                    caller_id: r.try_get("caller_id")?,
                    caller: r.try_get("caller")?,
                    credential_id: r.try_get("credential_id")?,
                    credential: r.try_get("credential")?,
                    created_at: r.try_get("created_at")?,
                    revoked_at: r.try_get("revoked_at")?,
                    caller_revoked_at: r.try_get("caller_revoked_at")?,
                })
            })
            .collect()
    }
}
