//! Cached OAuth tokens, and the locked refresh that keeps one refresh in flight per credential.

use std::time::Duration;

use sqlx::postgres::PgConnection;

use super::*;

/// The first key of the advisory locks OAuth refreshes take on Postgres
/// (the second is the credential's id): ASCII "tess", so the two-int keys
/// stay clear of other applications' locks in the same database.
const OAUTH_LOCK_NAMESPACE: i32 = 0x7465_7373;

/// The `application_name` of a refresh's own connection, so an operator
/// can find it in `pg_stat_activity`.
pub const REFRESH_APPLICATION_NAME: &str = "tessera-oauth-refresh";

const PUT_TOKEN: &str = "INSERT INTO oauth_tokens (credential, sealed, expires_at) VALUES ($1, $2, $3) \
     ON CONFLICT (credential) DO UPDATE SET sealed = excluded.sealed, expires_at = excluded.expires_at";
const ROTATE_SECRETS: &str = "UPDATE credentials SET sealed = $1 WHERE name = $2";
const STORED_SECRETS: &str = "SELECT sealed FROM credentials WHERE name = $1";
const STORED_TOKEN: &str = "SELECT sealed, expires_at FROM oauth_tokens WHERE credential = $1";

/// An OAuth token refresh in progress (see [`Store::begin_oauth_refresh`]).
pub struct OAuthRefresh {
    store: Store,
    credential: String,
    /// Postgres: a connection of its own, outside the pool, in the
    /// transaction that holds the credential's advisory lock. Dropping it
    /// closes the socket: the server rolls back and the lock is released.
    held: Option<PgConnection>,
}

impl OAuthRefresh {
    /// What is stored now: under the lock, what the last replica to
    /// refresh left.
    pub async fn stored(&mut self) -> Result<StoredOAuth, StoreError> {
        let name = &self.credential;
        let (sealed_secrets, token) = match &mut self.held {
            Some(c) => (
                sqlx::query_scalar(STORED_SECRETS)
                    .bind(name)
                    .fetch_one(&mut *c)
                    .await?,
                sqlx::query_as(STORED_TOKEN)
                    .bind(name)
                    .fetch_optional(&mut *c)
                    .await?,
            ),
            None => on!(&self.store.db, p => (
                sqlx::query_scalar(STORED_SECRETS).bind(name).fetch_one(p).await?,
                sqlx::query_as(STORED_TOKEN).bind(name).fetch_optional(p).await?,
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
        let Some(mut c) = self.held else {
            return self
                .store
                .put_oauth_token(&self.credential, sealed_token, expires_at, sealed_secrets)
                .await;
        };
        sqlx::query(PUT_TOKEN)
            .bind(&self.credential)
            .bind(sealed_token)
            .bind(expires_at)
            .execute(&mut c)
            .await?;
        if let Some(sealed) = sealed_secrets {
            sqlx::query(ROTATE_SECRETS)
                .bind(sealed)
                .bind(&self.credential)
                .execute(&mut c)
                .await?;
        }
        sqlx::query("COMMIT").execute(&mut c).await?;
        // Committed: a failure to say goodbye changes nothing (the socket
        // closes either way).
        let _ = sqlx::Connection::close(c).await;
        Ok(())
    }
}

/// Take the refresh lock of the credential with `id` in `c`'s
/// transaction; the statements after it are bounded by `db_timeout`.
async fn advisory_lock(
    c: &mut PgConnection,
    id: i64,
    db_timeout: Duration,
) -> Result<(), StoreError> {
    let sql = "SELECT pg_advisory_xact_lock($1, $2), set_config('statement_timeout', $3, true)";
    sqlx::query(sql)
        .bind(OAUTH_LOCK_NAMESPACE)
        // Any int4 is a key: ids past 2^31 wrap, and two credentials that
        // share a key only refresh in turn.
        .bind(id as i32)
        .bind(db_timeout.as_millis().max(1).to_string())
        .execute(c)
        .await?;
    Ok(())
}

async fn write_oauth_token(
    tx: &mut Tx,
    credential: &str,
    sealed_token: &[u8],
    expires_at: Option<i64>,
    sealed_secrets: Option<&[u8]>,
) -> Result<(), StoreError> {
    on!(tx, t => {
        sqlx::query(PUT_TOKEN)
            .bind(credential)
            .bind(sealed_token)
            .bind(expires_at)
            .execute(&mut **t)
            .await?;
        if let Some(sealed) = sealed_secrets {
            sqlx::query(ROTATE_SECRETS).bind(sealed).bind(credential).execute(&mut **t).await?;
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
    /// the credential until [`OAuthRefresh::save`] commits (or the refresh
    /// is dropped), so replicas refresh one at a time and each reads what
    /// the one before it stored: a rotating refresh token is spent once.
    ///
    /// The lock is an advisory transaction lock taken on a connection of
    /// the refresh's own, outside the pool: the token request it is held
    /// across may take `token_timeout`, and a pooled connection held that
    /// long is one the audit writer and approvals cannot have. So each
    /// credential refreshing costs one more database connection per
    /// replica (refreshes are single-flight per credential).
    ///
    /// Bounds: connecting and finding the credential take at most
    /// `db_timeout`; waiting for another replica's refresh at most
    /// `token_timeout + db_timeout` (its token request and its save); the
    /// server ends the session, releasing the lock, when it idles in the
    /// transaction longer than that (a replica cut off mid-refresh). The
    /// statements after the lock are bounded by `db_timeout`.
    ///
    /// On SQLite nothing is locked: a file has one serving process, whose
    /// own single-flight suffices, and a write lock held for a token
    /// request would stall the audit writer.
    pub async fn begin_oauth_refresh(
        &self,
        credential: &str,
        db_timeout: Duration,
        token_timeout: Duration,
    ) -> Result<OAuthRefresh, StoreError> {
        let held = match self.backend() {
            Backend::Sqlite => None,
            Backend::Postgres => {
                let wait = token_timeout + db_timeout;
                let (mut c, id) =
                    timed(db_timeout, self.refresh_connection(credential, wait)).await?;
                // The lock wait is bounded by the server (`lock_timeout`);
                // the client's bound only covers a server that stops
                // answering.
                timed(wait + db_timeout, advisory_lock(&mut c, id, db_timeout)).await?;
                Some(c)
            }
        };
        Ok(OAuthRefresh {
            store: self.clone(),
            credential: credential.to_string(),
            held,
        })
    }

    /// A connection outside the pool for a refresh of `credential`, in a
    /// transaction, and the credential's id. Its statements (the lock wait
    /// among them) end after `wait`, and so does the session when it idles
    /// in the transaction that long.
    async fn refresh_connection(
        &self,
        credential: &str,
        wait: Duration,
    ) -> Result<(PgConnection, i64), StoreError> {
        let url = self
            .postgres_url()
            .expect("a store on Postgres knows its URL");
        let ms = wait.as_millis().max(1).to_string();
        let mut c = PgConnectOptions::from_str(url.expose())?
            .application_name(REFRESH_APPLICATION_NAME)
            .options([
                ("idle_in_transaction_session_timeout", ms.as_str()),
                ("lock_timeout", ms.as_str()),
                ("statement_timeout", ms.as_str()),
            ])
            .connect()
            .await?;
        // Read committed: each statement after the lock sees what the
        // refresh before it committed.
        sqlx::query("BEGIN ISOLATION LEVEL READ COMMITTED")
            .execute(&mut c)
            .await?;
        let sql = "SELECT id FROM credentials WHERE name = $1";
        let id: Option<i64> = sqlx::query_scalar(sql)
            .bind(credential)
            .fetch_optional(&mut c)
            .await?;
        let id = id.ok_or_else(|| StoreError::NotFound {
            kind: "credential",
            name: credential.to_string(),
        })?;
        Ok((c, id))
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
