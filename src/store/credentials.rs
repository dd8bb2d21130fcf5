//! Credentials: their sealed secrets, and every sealed value for key rotation.

use super::*;

impl Store {
    pub async fn add_credential(&self, c: NewCredential<'_>) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let r = sqlx::query(
            "INSERT INTO credentials (name, upstream, scheme, header_name, username, sealed, created_at, oauth)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(c.name)
        .bind(c.upstream)
        .bind(c.scheme.as_str())
        .bind(c.header_name)
        .bind(c.username)
        .bind(&c.sealed)
        .bind(now())
        .bind(c.oauth)
        .execute(&mut *tx)
        .await;
        match r {
            Err(e) if unique_violation(&e) => {
                return Err(StoreError::Duplicate {
                    kind: "credential",
                    name: c.name.to_string(),
                })
            }
            r => r?,
        };
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Replace a credential's sealed secret. Serving processes pick it up
    /// with the revision; requests already sent keep the old one.
    pub async fn set_credential_secret(&self, name: &str, sealed: &[u8]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let r = sqlx::query("UPDATE credentials SET sealed = $1 WHERE name = $2")
            .bind(sealed)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "credential",
                name: name.to_string(),
            });
        }
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// A credential's upstream and scheme options, each changed when given.
    /// New OAuth settings drop the cached access token.
    pub async fn update_credential(&self, c: CredentialUpdate<'_>) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let r = sqlx::query(
            "UPDATE credentials SET upstream = COALESCE($1, upstream),
                 header_name = COALESCE($2, header_name), username = COALESCE($3, username),
                 oauth = COALESCE($4, oauth), sealed = COALESCE($5, sealed)
             WHERE name = $6",
        )
        .bind(c.upstream)
        .bind(c.header_name)
        .bind(c.username)
        .bind(c.oauth)
        .bind(c.sealed)
        .bind(c.name)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                kind: "credential",
                name: c.name.to_string(),
            });
        }
        if c.drop_token {
            sqlx::query("DELETE FROM oauth_tokens WHERE credential = $1")
                .bind(c.name)
                .execute(&mut *tx)
                .await?;
        }
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Remove a credential, its cached OAuth token and its connections.
    /// Refused while a live connection (its caller live too) uses it,
    /// unless `cascade`. The audit trail keeps their names and ids.
    /// Returns how many connections went with it.
    pub async fn remove_credential(&self, name: &str, cascade: bool) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let id: i64 = sqlx::query_scalar("SELECT id FROM credentials WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: "credential",
                name: name.to_string(),
            })?;
        let live: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM connections c JOIN callers a ON a.id = c.caller_id
             WHERE c.credential_id = $1 AND c.revoked_at IS NULL AND a.revoked_at IS NULL",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        if live > 0 && !cascade {
            return Err(StoreError::InUse {
                name: name.to_string(),
                live,
            });
        }
        let removed = sqlx::query("DELETE FROM connections WHERE credential_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM credentials WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM oauth_tokens WHERE credential = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(removed)
    }

    pub async fn credentials(&self) -> Result<Vec<CredentialRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, upstream, scheme, header_name, username, sealed, created_at, oauth
             FROM credentials ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                let scheme: String = r.try_get("scheme")?;
                Ok(CredentialRow {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    upstream: r.try_get("upstream")?,
                    scheme: Scheme::from_str(&scheme).map_err(|e| sqlx::Error::Decode(e.into()))?,
                    header_name: r.try_get("header_name")?,
                    username: r.try_get("username")?,
                    sealed: r.try_get("sealed")?,
                    created_at: r.try_get("created_at")?,
                    oauth: r.try_get("oauth")?,
                })
            })
            .collect()
    }

    /// Every sealed value: (kind, row name, sealed blob). Credentials'
    /// secrets and cached OAuth tokens.
    pub async fn sealed_values(&self) -> Result<Vec<(Sealed, String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for r in sqlx::query("SELECT name, sealed FROM credentials ORDER BY name")
            .fetch_all(&self.pool)
            .await?
        {
            out.push((Sealed::Credential, r.try_get("name")?, r.try_get("sealed")?));
        }
        for r in sqlx::query("SELECT credential, sealed FROM oauth_tokens ORDER BY credential")
            .fetch_all(&self.pool)
            .await?
        {
            out.push((
                Sealed::OAuthToken,
                r.try_get("credential")?,
                r.try_get("sealed")?,
            ));
        }
        out.extend(self.sealed_approvals().await?);
        Ok(out)
    }

    /// Replace sealed values (as [`Store::sealed_values`] names them) in one
    /// transaction, and bump the revision so serving processes reload.
    pub async fn reseal(&self, values: &[(Sealed, String, Vec<u8>)]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        for (kind, name, sealed) in values {
            let sql = match kind {
                Sealed::Credential => "UPDATE credentials SET sealed = $1 WHERE name = $2",
                Sealed::OAuthToken => "UPDATE oauth_tokens SET sealed = $1 WHERE credential = $2",
                Sealed::Approval => "UPDATE approvals SET sealed_call = $1 WHERE id = $2",
            };
            sqlx::query(sql)
                .bind(sealed)
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }
}
