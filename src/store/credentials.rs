//! Credentials: their sealed secrets, and every sealed value for key rotation.

use super::*;

impl Store {
    pub async fn add_credential(&self, c: NewCredential<'_>) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let sql = "INSERT INTO credentials (name, upstream, scheme, header_name, username, sealed, created_at, oauth)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
        let at = now();
        let r = on!(&mut tx, t => {
            sqlx::query(sql)
                .bind(c.name)
                .bind(c.upstream)
                .bind(c.scheme.as_str())
                .bind(c.header_name)
                .bind(c.username)
                .bind(&c.sealed)
                .bind(at)
                .bind(c.oauth)
                .execute(&mut **t)
                .await
                .map(drop)
        });
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
        let sql = "UPDATE credentials SET sealed = $1 WHERE name = $2";
        let n = on!(&mut tx, t => {
            sqlx::query(sql).bind(sealed).bind(name).execute(&mut **t).await?.rows_affected()
        });
        if n == 0 {
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
        let sql = "UPDATE credentials SET upstream = COALESCE($1, upstream),
                 header_name = COALESCE($2, header_name), username = COALESCE($3, username),
                 oauth = COALESCE($4, oauth), sealed = COALESCE($5, sealed)
             WHERE name = $6";
        let n = on!(&mut tx, t => {
            sqlx::query(sql)
                .bind(c.upstream)
                .bind(c.header_name)
                .bind(c.username)
                .bind(c.oauth)
                .bind(c.sealed)
                .bind(c.name)
                .execute(&mut **t)
                .await?
                .rows_affected()
        });
        if n == 0 {
            return Err(StoreError::NotFound {
                kind: "credential",
                name: c.name.to_string(),
            });
        }
        if c.drop_token {
            let sql = "DELETE FROM oauth_tokens WHERE credential = $1";
            on!(&mut tx, t => { sqlx::query(sql).bind(c.name).execute(&mut **t).await?; });
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
        let sql = "SELECT id FROM credentials WHERE name = $1";
        let id: i64 = on!(&mut tx, t => {
            sqlx::query_scalar(sql).bind(name).fetch_optional(&mut **t).await?
        })
        .ok_or_else(|| StoreError::NotFound {
            kind: "credential",
            name: name.to_string(),
        })?;
        let sql = "SELECT COUNT(*) FROM connections c JOIN callers a ON a.id = c.caller_id
             WHERE c.credential_id = $1 AND c.revoked_at IS NULL AND a.revoked_at IS NULL";
        let live: i64 = on!(&mut tx, t => {
            sqlx::query_scalar(sql).bind(id).fetch_one(&mut **t).await?
        });
        if live > 0 && !cascade {
            return Err(StoreError::InUse {
                name: name.to_string(),
                live,
            });
        }
        let removed = on!(&mut tx, t => {
            let sql = "DELETE FROM connections WHERE credential_id = $1";
            let n = sqlx::query(sql).bind(id).execute(&mut **t).await?.rows_affected();
            let sql = "DELETE FROM credentials WHERE id = $1";
            sqlx::query(sql).bind(id).execute(&mut **t).await?;
            let sql = "DELETE FROM oauth_tokens WHERE credential = $1";
            sqlx::query(sql).bind(name).execute(&mut **t).await?;
            n
        });
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(removed)
    }

    pub async fn credentials(&self) -> Result<Vec<CredentialRow>, StoreError> {
        let sql =
            "SELECT id, name, upstream, scheme, header_name, username, sealed, created_at, oauth
             FROM credentials ORDER BY name";
        Ok(on!(&self.db, p => sqlx::query_as(sql).fetch_all(p).await?))
    }

    /// Every sealed value: (kind, row name, sealed blob). Credentials'
    /// secrets and cached OAuth tokens.
    pub async fn sealed_values(&self) -> Result<Vec<(Sealed, String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for (kind, sql) in [
            (
                Sealed::Credential,
                "SELECT name, sealed FROM credentials ORDER BY name",
            ),
            (
                Sealed::OAuthToken,
                "SELECT credential, sealed FROM oauth_tokens ORDER BY credential",
            ),
        ] {
            let rows: Vec<(String, Vec<u8>)> =
                on!(&self.db, p => sqlx::query_as(sql).fetch_all(p).await?);
            out.extend(rows.into_iter().map(|(name, sealed)| (kind, name, sealed)));
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
            on!(&mut tx, t => { sqlx::query(sql).bind(sealed).bind(name).execute(&mut **t).await?; });
        }
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }
}
