//! Cached OAuth tokens, and the locked refresh that keeps one refresh in flight per credential.

use super::*;

/// An OAuth token refresh in progress (see [`Store::begin_oauth_refresh`]).
pub struct OAuthRefresh {
    store: Store,
    credential: String,
    /// Postgres: the transaction holding the credential's row lock.
    tx: Option<Tx>,
}

impl OAuthRefresh {
    /// What is stored now: under the lock, what the last replica to
    /// refresh left.
    pub async fn stored(&mut self) -> Result<StoredOAuth, StoreError> {
        let secrets = "SELECT sealed FROM credentials WHERE name = $1";
        let token = "SELECT sealed, expires_at FROM oauth_tokens WHERE credential = $1";
        let name = &self.credential;
        let (sealed_secrets, token) = match &mut self.tx {
            Some(tx) => on!(tx, t => (
                sqlx::query_scalar(secrets).bind(name).fetch_one(&mut **t).await?,
                sqlx::query_as(token).bind(name).fetch_optional(&mut **t).await?,
            )),
            None => on!(&self.store.db, p => (
                sqlx::query_scalar(secrets).bind(name).fetch_one(p).await?,
                sqlx::query_as(token).bind(name).fetch_optional(p).await?,
            )),
        };
        Ok(StoredOAuth {
            sealed_secrets,
            token,
        })
    }

    /// Store the new token (and rotated secrets) and release the lock.
    pub async fn save(
        self,
        sealed_token: &[u8],
        expires_at: Option<i64>,
        sealed_secrets: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        match self.tx {
            Some(mut tx) => {
                write_oauth_token(
                    &mut tx,
                    &self.credential,
                    sealed_token,
                    expires_at,
                    sealed_secrets,
                )
                .await?;
                on!(tx, t => t.commit().await?);
                Ok(())
            }
            None => {
                self.store
                    .put_oauth_token(&self.credential, sealed_token, expires_at, sealed_secrets)
                    .await
            }
        }
    }
}

async fn write_oauth_token(
    tx: &mut Tx,
    credential: &str,
    sealed_token: &[u8],
    expires_at: Option<i64>,
    sealed_secrets: Option<&[u8]>,
) -> Result<(), StoreError> {
    let put = "INSERT INTO oauth_tokens (credential, sealed, expires_at) VALUES ($1, $2, $3) \
         ON CONFLICT (credential) DO UPDATE SET sealed = excluded.sealed, expires_at = excluded.expires_at";
    let rotate = "UPDATE credentials SET sealed = $1 WHERE name = $2";
    on!(tx, t => {
        sqlx::query(put)
            .bind(credential)
            .bind(sealed_token)
            .bind(expires_at)
            .execute(&mut **t)
            .await?;
        if let Some(sealed) = sealed_secrets {
            sqlx::query(rotate).bind(sealed).bind(credential).execute(&mut **t).await?;
        }
    });
    Ok(())
}

impl Store {
    /// Cache an OAuth credential's access token (sealed), and store its
    /// rotated secrets (sealed) in the same transaction. Not a change an
    /// admin made: the revision stays, so no reload follows.
    pub async fn put_oauth_token(
        &self,
        credential: &str,
        sealed_token: &[u8],
        expires_at: Option<i64>,
        sealed_secrets: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        write_oauth_token(
            &mut tx,
            credential,
            sealed_token,
            expires_at,
            sealed_secrets,
        )
        .await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Begin an OAuth credential's token refresh. On Postgres this locks
    /// the credential's row until [`OAuthRefresh::save`] commits (or the
    /// refresh is dropped), so replicas refresh one at a time and each
    /// reads what the one before it stored: a rotating refresh token is
    /// spent once. On SQLite nothing is locked: a file has one serving
    /// process, whose own single-flight suffices, and a write lock held
    /// for a token request would stall the audit writer.
    pub async fn begin_oauth_refresh(&self, credential: &str) -> Result<OAuthRefresh, StoreError> {
        let tx = match self.backend() {
            Backend::Sqlite => None,
            Backend::Postgres => {
                let mut tx = self.begin().await?;
                let sql = "SELECT id FROM credentials WHERE name = $1 FOR UPDATE";
                let found: Option<i64> = on!(&mut tx, t => {
                    sqlx::query_scalar(sql).bind(credential).fetch_optional(&mut **t).await?
                });
                if found.is_none() {
                    return Err(StoreError::NotFound {
                        kind: "credential",
                        name: credential.to_string(),
                    });
                }
                Some(tx)
            }
        };
        Ok(OAuthRefresh {
            store: self.clone(),
            credential: credential.to_string(),
            tx,
        })
    }

    /// Cached OAuth access tokens by credential name: sealed, and expiry.
    pub async fn oauth_tokens(
        &self,
    ) -> Result<std::collections::HashMap<String, (Vec<u8>, Option<i64>)>, StoreError> {
        let sql = "SELECT credential, sealed, expires_at FROM oauth_tokens";
        let rows: Vec<(String, Vec<u8>, Option<i64>)> =
            on!(&self.db, p => sqlx::query_as(sql).fetch_all(p).await?);
        Ok(rows
            .into_iter()
            .map(|(name, sealed, expires_at)| (name, (sealed, expires_at)))
            .collect())
    }
}
