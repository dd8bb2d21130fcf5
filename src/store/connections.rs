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
        let sql = "SELECT id, revoked_at FROM callers WHERE name = $1";
        let c: Option<(i64, Option<i64>)> = on!(&mut tx, t => {
            sqlx::query_as(sql).bind(caller).fetch_optional(&mut **t).await?
        });
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
        let sql = "SELECT id FROM credentials WHERE name = $1";
        let credential_id: i64 = on!(&mut tx, t => {
            sqlx::query_scalar(sql).bind(credential).fetch_optional(&mut **t).await?
        })
        .ok_or_else(|| StoreError::NotFound {
            kind: "credential",
            name: credential.to_string(),
        })?;
        let sql =
            "INSERT INTO connections (id, caller_id, credential_id, created_at) VALUES ($1, $2, $3, $4)";
        let at = now();
        on!(&mut tx, t => {
            sqlx::query(sql)
                .bind(id)
                .bind(caller_id)
                .bind(credential_id)
                .bind(at)
                .execute(&mut **t)
                .await?;
        });
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Record the public URL a starting `serve` answers on (connection
    /// URLs are built on it). Not a data change: no revision.
    pub async fn record_served_url(&self, public_url: &str) -> Result<(), StoreError> {
        let sql = "INSERT INTO served (id, public_url, at) VALUES (1, $1, $2)
             ON CONFLICT (id) DO UPDATE SET public_url = excluded.public_url, at = excluded.at";
        let at = crate::telemetry::time::now_ms();
        on!(&self.db, p => {
            sqlx::query(sql).bind(public_url).bind(at).execute(p).await?;
        });
        Ok(())
    }

    /// The public URL the last `serve` to start recorded, if any.
    pub async fn served_url(&self) -> Result<Option<String>, StoreError> {
        let sql = "SELECT public_url FROM served WHERE id = 1";
        Ok(on!(&self.db, p => sqlx::query_scalar(sql).fetch_optional(p).await?))
    }

    pub async fn revoke_connection(&self, id: &str) -> Result<(), StoreError> {
        self.revoke(Revocable::Connection, id).await
    }

    pub async fn connections(&self) -> Result<Vec<ConnectionRow>, StoreError> {
        let sql =
            "SELECT c.id, c.caller_id, a.name AS caller, c.credential_id, k.name AS credential,
                    c.created_at, c.revoked_at, a.revoked_at AS caller_revoked_at
             FROM connections c
             JOIN callers a ON a.id = c.caller_id
             JOIN credentials k ON k.id = c.credential_id
             ORDER BY c.created_at, c.id";
        Ok(on!(&self.db, p => sqlx::query_as(sql).fetch_all(p).await?))
    }
}
