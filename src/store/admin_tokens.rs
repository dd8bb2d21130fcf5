//! Admin tokens for the admin API (digests only).

use super::*;

impl Store {
    /// Store an admin token's digest under its name.
    /// `role`: `admin` or `approver`.
    pub async fn add_admin_token(
        &self,
        name: &str,
        token_sha256: &[u8; 32],
        role: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let sql = "INSERT INTO admin_tokens (name, token_sha256, created_at, role) \
                   VALUES ($1, $2, $3, $4)";
        let at = now();
        let r = on!(&mut tx, t => {
            sqlx::query(sql)
                .bind(name)
                .bind(&token_sha256[..])
                .bind(at)
                .bind(role)
                .execute(&mut **t)
                .await
                .map(drop)
        });
        match r {
            Err(e) if unique_violation(&e) => Err(StoreError::Duplicate {
                kind: "admin token",
                name: name.to_string(),
            }),
            r => {
                r?;
                self.commit(tx).await
            }
        }
    }

    /// Revoke an admin token: the admin listener refuses it at once (it
    /// reads the table on each admin request).
    pub async fn revoke_admin_token(&self, name: &str) -> Result<(), StoreError> {
        self.revoke(Revocable::AdminToken, name).await
    }

    /// The live admin token with this digest, by name. Compared in SQL by
    /// an indexed equality on the digest: no timing signal about a token
    /// leaks from comparing digests of a 256-bit random value.
    pub async fn admin_token_by_digest(
        &self,
        token_sha256: &[u8; 32],
    ) -> Result<Option<String>, StoreError> {
        Ok(self.admin_token_role(token_sha256).await?.map(|(n, _)| n))
    }

    /// The live admin token with this digest: its name and role (`admin`
    /// or `approver`).
    pub async fn admin_token_role(
        &self,
        token_sha256: &[u8; 32],
    ) -> Result<Option<(String, String)>, StoreError> {
        let sql =
            "SELECT name, role FROM admin_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL";
        Ok(on!(&self.db, p => {
            sqlx::query_as(sql).bind(&token_sha256[..]).fetch_optional(p).await?
        }))
    }

    /// Every admin token (names and dates; digests stay in the database).
    pub async fn admin_tokens(&self) -> Result<Vec<AdminTokenRow>, StoreError> {
        let sql = "SELECT name, role, created_at, revoked_at FROM admin_tokens ORDER BY name";
        Ok(on!(&self.db, p => sqlx::query_as(sql).fetch_all(p).await?))
    }
}
