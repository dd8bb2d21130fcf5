//! Storage: one `Store` type over the database. SQLite in the data dir is
//! the embedded default; Postgres (`--database-url postgres://…`) lets
//! several replicas share one store. Both run the same SQL (`$N`
//! placeholders, which SQLite reads too) through sqlx's `Any` driver; only
//! the migrations (`migrations/<dialect>/`) and the change notifications
//! differ.
//!
//! Every change bumps the single `revision` row in the same transaction, so
//! a serving process can poll one integer (or, on Postgres, be told by
//! NOTIFY) and reload only when it moved.

use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AnyPool, ConnectOptions, Row};

pub mod model;

use model::{
    Approval, AuditQuery, AuditRecord, CallKey, NewApproval, Scheme, Sealed, Shown, Status,
};

/// A storage failure. Messages name the thing, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} already exists")]
    Duplicate { kind: &'static str, name: String },
    #[error("no {kind} named {name:?}")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} is revoked")]
    Revoked { kind: &'static str, name: String },
    #[error("creating the data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("{what}")]
    Unchanged { what: String },
    #[error("the sealed secret of credential {credential:?} does not open with the master key in use: give the right key (TESSERA_MASTER_KEY, or master.key in the data dir)")]
    Sealed { credential: String },
    // The cause is in the message and not chained as a source, so an
    // error report (anyhow's `{:#}`) does not print it twice.
    #[error("database: {0}")]
    Db(sqlx::Error),
    #[error("database: no answer within {0} ms")]
    Timeout(u64),
    #[error("applying migrations: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    #[error("{0}")]
    Url(String),
    #[error("the database's schema is at migration {found}, newer than this tessera knows (up to {known}): run the newer tessera that migrated it, or restore a backup")]
    NewerSchema { found: i64, known: i64 },
}

/// `f`, or a [`StoreError::Timeout`] once `limit` has passed: a database
/// that hangs fails like one that refuses. (Dropping `f` abandons its
/// statement; a write that was committing may still land.)
pub async fn timed<T>(
    limit: std::time::Duration,
    f: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or(Err(StoreError::Timeout(limit.as_millis() as u64)))
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Db(e)
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate(e)
    }
}

/// A credential row. `sealed` is the AEAD blob; it is opened only when a
/// snapshot is built.
#[derive(Debug, Clone)]
pub struct CredentialRow {
    pub id: i64,
    pub name: String,
    pub upstream: String,
    pub scheme: Scheme,
    pub header_name: Option<String>,
    pub username: Option<String>,
    pub sealed: Vec<u8>,
    pub created_at: i64,
    /// For an OAuth credential: its `OAuthConfig` as JSON.
    pub oauth: Option<String>,
}

/// A caller row: its token exists here only as a digest.
#[derive(Debug, Clone)]
pub struct CallerRow {
    pub id: i64,
    pub name: String,
    pub token_sha256: [u8; 32],
    /// Group names, for policies.
    pub groups: Vec<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A connection row, with the names it refers to.
#[derive(Debug, Clone)]
pub struct ConnectionRow {
    pub id: String,
    pub caller_id: i64,
    pub caller: String,
    pub credential_id: i64,
    pub credential: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// New credential fields, with the secret already sealed.
pub struct NewCredential<'a> {
    pub name: &'a str,
    pub upstream: &'a str,
    pub scheme: Scheme,
    pub header_name: Option<&'a str>,
    pub username: Option<&'a str>,
    pub sealed: Vec<u8>,
    /// For an OAuth credential: its `OAuthConfig` as JSON.
    pub oauth: Option<&'a str>,
}

/// The rows that can be revoked.
enum Revocable {
    Caller,
    Connection,
    AdminToken,
}

/// An admin token as listed: never its value or digest.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdminTokenRow {
    pub name: String,
    /// Unix seconds.
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// One admin action, as recorded.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct AdminAction {
    pub id: i64,
    /// Unix milliseconds.
    pub at: i64,
    /// The admin token's name, or `cli`.
    pub actor: String,
    /// e.g. `caller.add`, `approval.grant`.
    pub action: String,
    /// The name or id acted on.
    pub target: String,
    /// `ok`, or the error the action met.
    pub outcome: String,
}

/// Which database holds the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A file in the data dir: one process serves from it (admin commands
    /// may write beside it).
    Sqlite,
    /// A server shared by every replica.
    Postgres,
}

/// Where the store lives: `sqlite://PATH` or `postgres://USER@HOST/DB`.
/// It may hold a password, so it prints with the password masked.
#[derive(Clone)]
pub struct DatabaseUrl {
    url: url::Url,
    backend: Backend,
}

impl FromStr for DatabaseUrl {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        let bad = |why: &str| {
            StoreError::Url(format!(
                "the database URL {why}: give sqlite://PATH or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
            ))
        };
        let url = url::Url::parse(s).map_err(|_| bad("does not parse"))?;
        let backend = match url.scheme() {
            "sqlite" => Backend::Sqlite,
            "postgres" | "postgresql" => Backend::Postgres,
            other => return Err(bad(&format!("has the scheme {other:?}"))),
        };
        Ok(DatabaseUrl { url, backend })
    }
}

impl DatabaseUrl {
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL, password included: for connecting, never for printing.
    pub fn expose(&self) -> &str {
        self.url.as_str()
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.url.clone();
        if shown.password().is_some() {
            let _ = shown.set_password(Some("***"));
        }
        f.write_str(shown.as_str())
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

/// The store's change counters (see `migrations/*/0006_changes.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revision {
    /// Moves on every change to credentials, callers and connections.
    pub data: i64,
    /// Moves on `tessera policy reload`.
    pub policies: i64,
}

/// The most audit rows one insert statement carries (12 parameters each).
const AUDIT_CHUNK_MAX: usize = 256;

/// `INSERT INTO audit … VALUES (…), (…)` for `rows` rows. Placeholders are
/// written out here: sqlx's query builder writes `?` for the Any driver,
/// which Postgres does not read. SQLite gets plain `?`: it looks each `$N`
/// up by name in a list, which made a batch of 512 rows (6,144
/// parameters) cost 127 µs per row instead of 8 µs.
fn audit_insert_text(backend: Backend, rows: usize) -> String {
    const COLUMNS: usize = 12;
    let mut sql = String::from(
        "INSERT INTO audit (at, caller, connection, http_method, rpc_method, tool, verdict, \
         reason, arguments_sha256, arguments, status, duration_us) VALUES ",
    );
    let mut n = itoa::Buffer::new();
    for i in 0..rows {
        sql.push_str(if i == 0 { "(" } else { ", (" });
        for c in 1..=COLUMNS {
            if c > 1 {
                sql.push_str(", ");
            }
            match backend {
                Backend::Sqlite => sql.push('?'),
                Backend::Postgres => {
                    sql.push('$');
                    sql.push_str(n.format(i * COLUMNS + c));
                }
            }
        }
        sql.push(')');
    }
    sql
}

/// The database behind tessera.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// The Postgres URL, for the connection that listens for changes.
    url: Option<DatabaseUrl>,
    /// The admin action this handle does, if any (see [`Store::acting`]).
    acting: Option<Arc<Acting>>,
}

/// An admin action under way: its `admin_audit` row is written in the
/// transaction that makes its change, so the change and its record land
/// together or not at all.
#[derive(Debug)]
struct Acting {
    actor: String,
    action: String,
    target: String,
    /// Set once a transaction carrying the record has committed.
    recorded: AtomicBool,
}

/// Each dialect's migrations, applied at start and by `tessera migrate`.
/// Both folders carry the same versions with the same meaning.
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

impl Store {
    /// Open the SQLite database in `data_dir` (creating both when absent)
    /// and apply migrations.
    pub async fn open_data_dir(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open(data_dir, None).await
    }

    /// Open the store at `url`, or with none the SQLite database in
    /// `data_dir`, and apply migrations.
    pub async fn open(data_dir: &Path, url: Option<&DatabaseUrl>) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let (pool, backend) = match url.map(|u| u.backend()) {
            Some(Backend::Postgres) => {
                let opts = AnyConnectOptions::from_str(url.expect("matched").expose())?;
                // One plain connection first: a pool that cannot connect
                // only says it timed out; this says why (refused, no such
                // database, authentication failed).
                sqlx::Connection::close(opts.connect().await?).await?;
                let pool = AnyPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(std::time::Duration::from_secs(10))
                    .connect_with(opts)
                    .await?;
                (pool, Backend::Postgres)
            }
            Some(Backend::Sqlite) => {
                let u = url.expect("matched");
                let opts = SqliteConnectOptions::from_str(u.expose())?.create_if_missing(true);
                (Self::open_sqlite(opts).await?, Backend::Sqlite)
            }
            None => {
                create_private_dir(data_dir).map_err(|source| StoreError::DataDir {
                    path: data_dir.display().to_string(),
                    source,
                })?;
                let opts = SqliteConnectOptions::new()
                    .filename(data_dir.join("tessera.db"))
                    .create_if_missing(true);
                (Self::open_sqlite(opts).await?, Backend::Sqlite)
            }
        };
        let store = Store {
            pool,
            backend,
            url: url.filter(|u| u.backend() == Backend::Postgres).cloned(),
            acting: None,
        };
        match store.migrator().run(&store.pool).await {
            Err(sqlx::migrate::MigrateError::VersionMissing(found)) => {
                return Err(StoreError::NewerSchema {
                    found,
                    known: store.schema_version(),
                })
            }
            r => r?,
        }
        Ok(store)
    }

    /// A SQLite pool in WAL mode: admin commands in another process write
    /// while the server reads, and sqlx's 5 s busy timeout serialises
    /// concurrent writers. (Foreign keys are on: sqlx's default.)
    async fn open_sqlite(opts: SqliteConnectOptions) -> Result<AnyPool, StoreError> {
        let opts = AnyConnectOptions::from_url(&opts.to_url_lossy())?;
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await?;
        // WAL is kept in the file: set once, not per connection (setting it
        // takes a lock that the busy timeout cannot wait for).
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await?;
        if !mode.eq_ignore_ascii_case("wal") {
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        Ok(pool)
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The Postgres URL, when the store is on Postgres.
    pub fn postgres_url(&self) -> Option<&DatabaseUrl> {
        self.url.as_ref()
    }

    /// The newest migration this build knows for this store's dialect.
    pub fn schema_version(&self) -> i64 {
        self.migrator().iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// The change counters; `data` moves on every write.
    pub async fn revision(&self) -> Result<Revision, StoreError> {
        let (data, policies) = sqlx::query_as("SELECT value, policies FROM revision WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        Ok(Revision { data, policies })
    }

    /// A write transaction. On SQLite it takes the write lock up front
    /// (`BEGIN IMMEDIATE`), waiting out the busy timeout for it: a deferred
    /// transaction that reads first takes the lock at its first write, and
    /// fails at once ("database is locked") if another connection, such as
    /// a serving process's audit writer, committed since it read.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        Ok(match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        })
    }

    async fn bump(tx: &mut sqlx::AnyConnection) -> Result<(), StoreError> {
        sqlx::query("UPDATE revision SET value = value + 1 WHERE id = 1")
            .execute(tx)
            .await?;
        Ok(())
    }

    /// Tell every serving process to read its policy folder again.
    pub async fn bump_policies(&self) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("UPDATE revision SET value = value + 1, policies = policies + 1 WHERE id = 1")
            .execute(&mut *tx)
            .await?;
        self.commit(tx).await
    }

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
        let tx = match self.backend {
            Backend::Sqlite => None,
            Backend::Postgres => {
                let mut tx = self.begin().await?;
                let found: Option<i64> =
                    sqlx::query_scalar("SELECT id FROM credentials WHERE name = $1 FOR UPDATE")
                        .bind(credential)
                        .fetch_optional(&mut *tx)
                        .await?;
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

    /// Cached OAuth access tokens by credential name: sealed, and expiry.
    pub async fn oauth_tokens(
        &self,
    ) -> Result<std::collections::HashMap<String, (Vec<u8>, Option<i64>)>, StoreError> {
        let rows = sqlx::query("SELECT credential, sealed, expires_at FROM oauth_tokens")
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok((
                    r.try_get("credential")?,
                    (r.try_get("sealed")?, r.try_get("expires_at")?),
                ))
            })
            .collect()
    }

    pub async fn add_caller(
        &self,
        name: &str,
        token_sha256: &[u8; 32],
        groups: &[String],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let r = sqlx::query(
            "INSERT INTO callers (name, token_sha256, groups, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(&token_sha256[..])
        .bind(groups.join(","))
        .bind(now())
        .execute(&mut *tx)
        .await;
        match r {
            Err(e) if unique_violation(&e) => {
                return Err(StoreError::Duplicate {
                    kind: "caller",
                    name: name.to_string(),
                })
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

    /// Mark one row revoked: not found and already revoked are errors that
    /// name the row, so a typo does not pass as success.
    async fn revoke(&self, what: Revocable, key: &str) -> Result<(), StoreError> {
        let (kind, select, update) = match what {
            Revocable::Caller => (
                "caller",
                "SELECT revoked_at FROM callers WHERE name = $1",
                "UPDATE callers SET revoked_at = $1 WHERE name = $2",
            ),
            Revocable::Connection => (
                "connection",
                "SELECT revoked_at FROM connections WHERE id = $1",
                "UPDATE connections SET revoked_at = $1 WHERE id = $2",
            ),
            Revocable::AdminToken => (
                "admin token",
                "SELECT revoked_at FROM admin_tokens WHERE name = $1",
                "UPDATE admin_tokens SET revoked_at = $1 WHERE name = $2",
            ),
        };
        let name = || key.to_string();
        let mut tx = self.begin().await?;
        let revoked: Option<Option<i64>> = sqlx::query_scalar(select)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
        match revoked {
            None => return Err(StoreError::NotFound { kind, name: name() }),
            Some(Some(_)) => return Err(StoreError::Revoked { kind, name: name() }),
            Some(None) => {}
        }
        sqlx::query(update)
            .bind(now())
            .bind(key)
            .execute(&mut *tx)
            .await?;
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
    }

    /// Store an admin token's digest under its name.
    pub async fn add_admin_token(
        &self,
        name: &str,
        token_sha256: &[u8; 32],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let r = sqlx::query(
            "INSERT INTO admin_tokens (name, token_sha256, created_at) VALUES ($1, $2, $3)",
        )
        .bind(name)
        .bind(&token_sha256[..])
        .bind(now())
        .execute(&mut *tx)
        .await;
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
        Ok(sqlx::query_scalar(
            "SELECT name FROM admin_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL",
        )
        .bind(&token_sha256[..])
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Every admin token (names and dates; digests stay in the database).
    pub async fn admin_tokens(&self) -> Result<Vec<AdminTokenRow>, StoreError> {
        let rows =
            sqlx::query("SELECT name, created_at, revoked_at FROM admin_tokens ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter()
            .map(|r| {
                Ok(AdminTokenRow {
                    name: r.try_get("name")?,
                    created_at: r.try_get("created_at")?,
                    revoked_at: r.try_get("revoked_at")?,
                })
            })
            .collect()
    }

    /// This store, doing one admin action: every transaction it commits
    /// carries the action's `admin_audit` row (outcome `ok`), written once.
    pub fn acting(&self, actor: &str, action: &str, target: &str) -> Store {
        Store {
            acting: Some(Arc::new(Acting {
                actor: actor.to_string(),
                action: action.to_string(),
                target: target.to_string(),
                recorded: AtomicBool::new(false),
            })),
            ..self.clone()
        }
    }

    /// Commit an admin write's transaction, with the action's record when
    /// this store acts for one.
    async fn commit(&self, mut tx: sqlx::Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
        let a = self
            .acting
            .as_ref()
            .filter(|a| !a.recorded.load(Ordering::Relaxed));
        if let Some(a) = a {
            Self::insert_admin_audit(&mut tx, &a.actor, &a.action, &a.target, "ok").await?;
        }
        tx.commit().await?;
        if let Some(a) = a {
            a.recorded.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Record how the admin action this store acts for ended, unless its
    /// `ok` record went in with its change. Panics on a store not acting.
    pub async fn record_action(&self, outcome: &str) -> Result<(), StoreError> {
        let a = self
            .acting
            .as_ref()
            .expect("a store acting for an admin action");
        if outcome == "ok" && a.recorded.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut c = self.pool.acquire().await?;
        Self::insert_admin_audit(&mut c, &a.actor, &a.action, &a.target, outcome).await
    }

    async fn insert_admin_audit(
        c: &mut sqlx::AnyConnection,
        actor: &str,
        action: &str,
        target: &str,
        outcome: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO admin_audit (at, actor, action, target, outcome) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(now_ms())
        .bind(actor)
        .bind(action)
        .bind(target)
        .bind(outcome)
        .execute(c)
        .await?;
        Ok(())
    }

    /// Admin actions, newest first, at most `limit`, before id `before`.
    pub async fn admin_audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AdminAction>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, actor, action, target, outcome FROM admin_audit WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(AdminAction {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    outcome: r.try_get("outcome")?,
                })
            })
            .collect()
    }

    pub async fn callers(&self) -> Result<Vec<CallerRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, token_sha256, groups, created_at, revoked_at FROM callers ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
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
            .collect()
    }

    /// Write audit records in one transaction.
    ///
    /// The batch goes in as chunks of power-of-two sizes (its binary
    /// digits: 300 rows are 256 + 32 + 8 + 4), at most one statement per
    /// size. So only ten SQL texts ever exist, and each is prepared once
    /// per connection. A text per batch size was parsed anew for nearly
    /// every batch: the parser made 11 of SQLite's 21 allocations per row
    /// and cost more than the insert (`cargo bench --bench micro -- audit`).
    pub async fn insert_audit(&self, rows: &[AuditRecord]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        // In a transaction: the chunks land together. On Postgres this
        // also means a write the audit writer abandons (no answer from a
        // partitioned server) is rolled back, not left to land after its
        // retry. SQLite bounds its wait for the write lock (the busy
        // timeout), so a write there is never abandoned. The lock is held
        // across the chunks' round trips to sqlx's worker; admin
        // transactions take it up front (`begin`), so they wait for it
        // rather than fail.
        let mut tx = self.begin().await?;
        let mut rest = rows;
        while !rest.is_empty() {
            let size = AUDIT_CHUNK_MAX.min(1 << rest.len().ilog2());
            let (chunk, after) = rest.split_at(size);
            let mut q = sqlx::query(self.audit_insert_sql(size.ilog2() as usize));
            for r in chunk {
                q = q
                    .bind(r.at)
                    .bind(&r.caller)
                    .bind(&r.connection)
                    .bind(&r.http_method)
                    .bind(&r.rpc_method)
                    .bind(&r.tool)
                    .bind(&r.verdict)
                    .bind(&r.reason)
                    .bind(&r.arguments_sha256)
                    .bind(&r.arguments)
                    .bind(i64::from(r.status))
                    .bind(r.duration_us);
            }
            q.execute(&mut *tx).await?;
            rest = after;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The insert of `2^log2` audit rows, built once per process.
    fn audit_insert_sql(&self, log2: usize) -> &'static str {
        static SQLITE: OnceLock<Vec<String>> = OnceLock::new();
        static POSTGRES: OnceLock<Vec<String>> = OnceLock::new();
        let texts = match self.backend {
            Backend::Sqlite => &SQLITE,
            Backend::Postgres => &POSTGRES,
        };
        let texts = texts.get_or_init(|| {
            (0..=AUDIT_CHUNK_MAX.ilog2())
                .map(|l| audit_insert_text(self.backend, 1 << l))
                .collect()
        });
        &texts[log2]
    }

    /// Audit records matching `q`, oldest first: the newest `q.limit`, or
    /// with `after_id` the first `q.limit` after it.
    pub async fn audit(&self, q: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        // After an id: the oldest following it; else the newest. Two
        // texts, so each walks the primary key in its own direction and
        // stops at the limit (one text ordered by `id * ±1` made both
        // databases sort every matching row for each page).
        macro_rules! matching {
            () => {
                "SELECT * FROM audit \
                 WHERE ($1 IS NULL OR caller = $1) AND ($2 IS NULL OR connection = $2) \
                   AND ($3 IS NULL OR at >= $3) AND id > $4"
            };
        }
        let sql = match q.after_id {
            Some(_) => concat!(matching!(), " ORDER BY id LIMIT $5"),
            None => concat!(
                "SELECT * FROM (",
                matching!(),
                " ORDER BY id DESC LIMIT $5) AS newest ORDER BY id"
            ),
        };
        let rows = sqlx::query(sql)
            .bind(&q.caller)
            .bind(&q.connection)
            .bind(q.since)
            .bind(q.after_id.unwrap_or(0))
            .bind(q.limit)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                Ok(AuditRecord {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    caller: r.try_get("caller")?,
                    connection: r.try_get("connection")?,
                    http_method: r.try_get("http_method")?,
                    rpc_method: r.try_get("rpc_method")?,
                    tool: r.try_get("tool")?,
                    verdict: r.try_get("verdict")?,
                    reason: r.try_get("reason")?,
                    arguments_sha256: r.try_get("arguments_sha256")?,
                    arguments: r.try_get("arguments")?,
                    status: u16::try_from(r.try_get::<i64, _>("status")?).unwrap_or(0),
                    duration_us: r.try_get("duration_us")?,
                })
            })
            .collect()
    }

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

    async fn decide_approval(
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

    pub async fn revoke_connection(&self, id: &str) -> Result<(), StoreError> {
        self.revoke(Revocable::Connection, id).await
    }

    pub async fn connections(&self) -> Result<Vec<ConnectionRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT c.id, c.caller_id, a.name AS caller, c.credential_id, k.name AS credential,
                    c.created_at, c.revoked_at
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
                })
            })
            .collect()
    }
}

/// An OAuth token refresh in progress (see [`Store::begin_oauth_refresh`]).
pub struct OAuthRefresh {
    store: Store,
    credential: String,
    /// Postgres: the transaction holding the credential's row lock.
    tx: Option<sqlx::Transaction<'static, sqlx::Any>>,
}

/// What is stored for an OAuth credential: its sealed secrets, and its
/// cached token (sealed) with the expiry in unix milliseconds.
pub struct StoredOAuth {
    pub sealed_secrets: Vec<u8>,
    pub token: Option<(Vec<u8>, Option<i64>)>,
}

impl OAuthRefresh {
    /// What is stored now: under the lock, what the last replica to
    /// refresh left.
    pub async fn stored(&mut self) -> Result<StoredOAuth, StoreError> {
        let secrets = "SELECT sealed FROM credentials WHERE name = $1";
        let token = "SELECT sealed, expires_at FROM oauth_tokens WHERE credential = $1";
        let (sealed_secrets, token) = match &mut self.tx {
            Some(tx) => (
                sqlx::query_scalar(secrets)
                    .bind(&self.credential)
                    .fetch_one(&mut **tx)
                    .await?,
                sqlx::query_as(token)
                    .bind(&self.credential)
                    .fetch_optional(&mut **tx)
                    .await?,
            ),
            None => (
                sqlx::query_scalar(secrets)
                    .bind(&self.credential)
                    .fetch_one(&self.store.pool)
                    .await?,
                sqlx::query_as(token)
                    .bind(&self.credential)
                    .fetch_optional(&self.store.pool)
                    .await?,
            ),
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
                tx.commit().await?;
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
    tx: &mut sqlx::AnyConnection,
    credential: &str,
    sealed_token: &[u8],
    expires_at: Option<i64>,
    sealed_secrets: Option<&[u8]>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO oauth_tokens (credential, sealed, expires_at) VALUES ($1, $2, $3) \
         ON CONFLICT (credential) DO UPDATE SET sealed = excluded.sealed, expires_at = excluded.expires_at",
    )
    .bind(credential)
    .bind(sealed_token)
    .bind(expires_at)
    .execute(&mut *tx)
    .await?;
    if let Some(sealed) = sealed_secrets {
        sqlx::query("UPDATE credentials SET sealed = $1 WHERE name = $2")
            .bind(sealed)
            .bind(credential)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// Create a directory readable by its owner only (0700 on Unix).
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(path)
}
