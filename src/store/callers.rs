//! Callers: agent identities, their token digests and groups.

use super::*;

impl Store {
    pub async fn add_caller(
        &self,
        name: &str,
        token_sha256: &[u8; 32],
        groups: &[String],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let sql =
            "INSERT INTO callers (name, token_sha256, groups, created_at) VALUES ($1, $2, $3, $4)";
        let (groups, at) = (groups.join(","), now());
        let r = on!(&mut tx, t => {
            sqlx::query(sql)
                .bind(name)
                .bind(&token_sha256[..])
                .bind(&groups)
                .bind(at)
                .execute(&mut **t)
                .await
                .map(drop)
        });
        match r {
            Err(e) if unique_violation(&e) => {
                drop(tx);
                let revoked = self
                    .callers()
                    .await?
                    .iter()
                    .any(|c| c.name == name && c.revoked_at.is_some());
                let (kind, name) = ("caller", name.to_string());
                return Err(match revoked {
                    true => StoreError::RevokedName { kind, name },
                    false => StoreError::Duplicate { kind, name },
                });
            }
            r => r?,
        };
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Revoke a caller; its connections stop working with it.
    pub async fn revoke_caller(&self, name: &str) -> Result<(), StoreError> {
        self.revoke(Revocable::Caller, name).await
    }

    /// A live caller's new token digest: the old token stops with the
    /// revision.
    pub async fn set_caller_token(
        &self,
        name: &str,
        token_sha256: &[u8; 32],
    ) -> Result<(), StoreError> {
        let sql = "UPDATE callers SET token_sha256 = $1 WHERE name = $2";
        self.update_revocable(Revocable::Caller, name, false, sql, token_sha256.to_vec())
            .await
    }

    /// A revoked caller live again, under a new token digest (its old
    /// token stays dead). Its connections serve it again, except those
    /// revoked one by one.
    pub async fn restore_caller(
        &self,
        name: &str,
        token_sha256: &[u8; 32],
    ) -> Result<(), StoreError> {
        let sql = "UPDATE callers SET token_sha256 = $1, revoked_at = NULL WHERE name = $2";
        self.update_revocable(Revocable::Caller, name, true, sql, token_sha256.to_vec())
            .await
    }

    /// A live caller's groups, replaced.
    pub async fn set_caller_groups(&self, name: &str, groups: &[String]) -> Result<(), StoreError> {
        let sql = "UPDATE callers SET groups = $1 WHERE name = $2";
        self.update_revocable(Revocable::Caller, name, false, sql, groups.join(","))
            .await
    }

    pub async fn callers(&self) -> Result<Vec<CallerRow>, StoreError> {
        let sql =
            "SELECT id, name, token_sha256, groups, created_at, revoked_at FROM callers ORDER BY name";
        on!(&self.db, p => sqlx::query(sql).fetch_all(p).await?.into_iter()
            .map(|r| {
                let digest: Vec<u8> = r.try_get("token_sha256")?;
                let groups: String = r.try_get("groups")?;
                Ok(CallerRow {
                    groups: groups
                        .split(',')
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect(),
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    token_sha256: digest
                        .try_into()
                        .map_err(|_| sqlx::Error::Decode("token digest is not 32 bytes".into()))?,
                    created_at: r.try_get("created_at")?,
                    revoked_at: r.try_get("revoked_at")?,
                })
            })
            .collect())
    }
}
