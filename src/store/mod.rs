//! Storage: one `Store` type over the database. SQLite in the data dir is
//! the embedded default; Postgres (`--database-url postgres://…`) lets
//! several replicas share one store. Both run the same SQL (`$N`
//! placeholders, which SQLite reads too) on typed pools ([`Dialect`]):
//! each statement is written once and compiled for each driver by
//! [`on!`]. Only the migrations (`migrations/<dialect>/`), the connect
//! options and the change notifications differ.
//!
//! Typed rather than sqlx's `Any` driver (issue 27): `Any` converts every
//! bound value and every cell through its own value type, and rebuilds
//! SQLite's connect options from a URL (only what a URL can say reaches
//! the driver; the busy timeout and `synchronous` here are set in code).
//!
//! Every change bumps the single `revision` row in the same transaction, so
//! a serving process can poll one integer (or, on Postgres, be told by
//! NOTIFY) and reload only when it moved.

use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Postgres, Row, Sqlite};

mod admin_audit;
mod admin_tokens;
mod approvals;
pub mod audit;
mod callers;
mod connections;
mod credentials;
pub mod evidence;
pub mod model;
pub mod oauth;
pub mod tool_pins;

use model::{
    AdminAction, AdminTokenRow, Approval, AuditQuery, AuditRecord, CallKey, CallerRow,
    ConnectionRow, CredentialRow, CredentialUpdate, NewApproval, NewCredential, Revision, Sealed,
    Shown, Status, StoredOAuth,
};

/// A storage failure. Messages name the thing, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} already exists{}", duplicate_hint(kind))]
    Duplicate { kind: &'static str, name: String },
    #[error("no {kind} named {name:?}")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} is revoked")]
    Revoked { kind: &'static str, name: String },
    #[error("{kind} {name:?} exists, revoked: restore it (`tessera {kind} restore {name}`, a new token) to use the name again")]
    RevokedName { kind: &'static str, name: String },
    #[error("{kind} {name:?} is not revoked")]
    NotRevoked { kind: &'static str, name: String },
    #[error("credential {name:?} is used by {live} live connection(s): revoke them first, or remove it with its connections (--cascade; cascade=true in the admin API)")]
    InUse { name: String, live: i64 },
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
    #[error("database: {0}")]
    Sqlite(rusqlite::Error),
    #[error("the audit writer: {0}")]
    AuditWriter(String),
    #[error("database: no answer within {0} ms")]
    Timeout(u64),
    #[error("applying migrations: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    #[error("{0}")]
    Url(String),
    #[error("the database's schema is at migration {found}, newer than this tessera knows (up to {known}): run the newer tessera that migrated it, or restore a backup")]
    NewerSchema { found: i64, known: i64 },
}

/// What to do instead of adding a name again.
fn duplicate_hint(kind: &str) -> &'static str {
    match kind {
        "credential" => ": change it with `credential update` or `credential set-secret`",
        "caller" => ": `caller rotate-token` gives it a new token",
        _ => "",
    }
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

/// The rows that can be revoked.
enum Revocable {
    Caller,
    Connection,
    AdminToken,
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
        // The user name is kept (it says who connects); a password in the
        // query (`?password=`) is masked like the one in the authority.
        crate::wire::query::mask_query(&mut shown);
        f.write_str(shown.as_str())
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

/// One value per dialect: a pool ([`Db`]), a transaction ([`Tx`]).
#[derive(Clone)]
pub(crate) enum Dialect<S, P> {
    Sqlite(S),
    Postgres(P),
}

/// The pool of the store's database.
pub(crate) type Db = Dialect<SqlitePool, PgPool>;

/// A write transaction on the store's database.
pub(crate) type Tx =
    Dialect<sqlx::Transaction<'static, Sqlite>, sqlx::Transaction<'static, Postgres>>;

/// `$body`, written once and compiled for each dialect, with `$x` bound to
/// that dialect's value of `$v` (a [`Db`] or a [`Tx`], by reference).
/// Each arm's value must have one type: rows are read inside the body.
macro_rules! on {
    ($v:expr, $x:ident => $body:expr) => {
        match $v {
            $crate::store::Dialect::Sqlite($x) => $body,
            $crate::store::Dialect::Postgres($x) => $body,
        }
    };
}
pub(crate) use on;

/// How long a SQLite connection waits for another's write lock (admin
/// commands in another process write beside a serving one).
const SQLITE_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The database behind tessera.
#[derive(Clone)]
pub struct Store {
    db: Db,
    /// The Postgres URL, for the connection that listens for changes.
    url: Option<DatabaseUrl>,
    /// The admin action this handle does, if any (see [`Store::acting`]).
    acting: Option<Arc<Acting>>,
}

/// A database pool's connections (`Store::pool_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub open: u32,
    pub idle: u32,
    pub max: u32,
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
        Self::open_with_pool(data_dir, url, None).await
    }

    /// [`Store::open`] with at most `pool_size` connections (`None`: 8 on
    /// Postgres, 4 on SQLite; `serve --db-pool-size`).
    pub async fn open_with_pool(
        data_dir: &Path,
        url: Option<&DatabaseUrl>,
        pool_size: Option<u32>,
    ) -> Result<Self, StoreError> {
        let db = match url.map(|u| u.backend()) {
            Some(Backend::Postgres) => {
                let opts = PgConnectOptions::from_str(url.expect("matched").expose())?;
                // One plain connection first: a pool that cannot connect
                // only says it timed out; this says why (refused, no such
                // database, authentication failed).
                sqlx::Connection::close(opts.connect().await?).await?;
                let pool = PgPoolOptions::new()
                    .max_connections(pool_size.unwrap_or(8))
                    .acquire_timeout(std::time::Duration::from_secs(10))
                    .connect_with(opts)
                    .await?;
                Dialect::Postgres(pool)
            }
            Some(Backend::Sqlite) => {
                let u = url.expect("matched");
                let opts = SqliteConnectOptions::from_str(u.expose())?;
                let file = opts.get_filename();
                if file != Path::new(":memory:") {
                    create_private_file(file).map_err(|source| StoreError::DataDir {
                        path: file.display().to_string(),
                        source,
                    })?;
                }
                Dialect::Sqlite(Self::open_sqlite(opts, pool_size).await?)
            }
            None => {
                create_private_dir(data_dir).map_err(|source| StoreError::DataDir {
                    path: data_dir.display().to_string(),
                    source,
                })?;
                let file = data_dir.join("tessera.db");
                create_private_file(&file).map_err(|source| StoreError::DataDir {
                    path: file.display().to_string(),
                    source,
                })?;
                let opts = SqliteConnectOptions::new().filename(file);
                Dialect::Sqlite(Self::open_sqlite(opts, pool_size).await?)
            }
        };
        let store = Store {
            db,
            url: url.filter(|u| u.backend() == Backend::Postgres).cloned(),
            acting: None,
        };
        let migrated = on!(&store.db, p => store.migrator().run(p).await);
        match migrated {
            Err(sqlx::migrate::MigrateError::VersionMissing(found)) => {
                return Err(StoreError::NewerSchema {
                    found,
                    known: store.schema_version(),
                })
            }
            r => r?,
        }
        if let Dialect::Sqlite(pool) = &store.db {
            // A pooled SQLite connection opened before a migration that
            // rebuilt a table expands `SELECT *` with the old columns and
            // SQLite re-prepares it with the new ones: sqlx's row then
            // disagrees with SQLite's (a panic in its worker). Serve from
            // connections opened after the migrations.
            let fresh = Self::sqlite_pool(pool_size)
                .connect_with((*pool.connect_options()).clone())
                .await?;
            pool.close().await;
            return Ok(Store {
                db: Dialect::Sqlite(fresh),
                ..store
            });
        }
        Ok(store)
    }

    /// The SQLite pool's settings.
    fn sqlite_pool(pool_size: Option<u32>) -> SqlitePoolOptions {
        SqlitePoolOptions::new().max_connections(pool_size.unwrap_or(4))
    }

    /// The pool's connections now: open, idle, and the most it opens. No
    /// query: read for `/metrics`.
    pub fn pool_stats(&self) -> PoolStats {
        on!(&self.db, p => PoolStats {
            open: p.size(),
            idle: p.num_idle() as u32,
            max: p.options().get_max_connections(),
        })
    }

    /// A SQLite pool in WAL mode: admin commands in another process write
    /// while the server reads, and the busy timeout serialises concurrent
    /// writers. Foreign keys on; `synchronous = FULL`: a committed audit
    /// batch survives a power cut, not only a crash (with WAL, NORMAL may
    /// lose the last commits; the audit writer commits one batch at a
    /// time, so FULL costs one fsync per batch, not per record).
    async fn open_sqlite(
        opts: SqliteConnectOptions,
        pool_size: Option<u32>,
    ) -> Result<SqlitePool, StoreError> {
        let opts = opts
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(SQLITE_BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Full);
        let pool = Self::sqlite_pool(pool_size).connect_with(opts).await?;
        // WAL is kept in the file: set once here, not per connection in
        // the connect options (setting it takes a lock that the busy
        // timeout cannot wait for: an admin command opening the file
        // while the server writes would fail).
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
        match self.backend() {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        }
    }

    pub fn backend(&self) -> Backend {
        match self.db {
            Dialect::Sqlite(_) => Backend::Sqlite,
            Dialect::Postgres(_) => Backend::Postgres,
        }
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
        let sql = "SELECT value, policies FROM revision WHERE id = 1";
        let (data, policies) = on!(&self.db, p => sqlx::query_as(sql).fetch_one(p).await?);
        Ok(Revision { data, policies })
    }

    /// A write transaction. On SQLite it takes the write lock up front
    /// (`BEGIN IMMEDIATE`), waiting out the busy timeout for it: a deferred
    /// transaction that reads first takes the lock at its first write, and
    /// fails at once ("database is locked") if another connection, such as
    /// a serving process's audit writer, committed since it read.
    async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(match &self.db {
            Dialect::Sqlite(p) => Dialect::Sqlite(p.begin_with("BEGIN IMMEDIATE").await?),
            Dialect::Postgres(p) => Dialect::Postgres(p.begin().await?),
        })
    }

    /// Move the data revision, inside a write transaction.
    async fn bump(tx: &mut Tx) -> Result<(), StoreError> {
        let sql = "UPDATE revision SET value = value + 1 WHERE id = 1";
        on!(tx, t => { sqlx::query(sql).execute(&mut **t).await?; });
        Ok(())
    }

    /// Tell every serving process to read its policy folder again.
    pub async fn bump_policies(&self) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let sql = "UPDATE revision SET value = value + 1, policies = policies + 1 WHERE id = 1";
        on!(&mut tx, t => { sqlx::query(sql).execute(&mut **t).await?; });
        self.commit(tx).await
    }

    /// Mark one row revoked: not found and already revoked are errors that
    /// name the row, so a typo does not pass as success.
    async fn revoke(&self, what: Revocable, key: &str) -> Result<(), StoreError> {
        let update = match what {
            Revocable::Caller => "UPDATE callers SET revoked_at = $1 WHERE name = $2",
            Revocable::Connection => "UPDATE connections SET revoked_at = $1 WHERE id = $2",
            Revocable::AdminToken => "UPDATE admin_tokens SET revoked_at = $1 WHERE name = $2",
        };
        self.update_revocable(what, key, false, update, now()).await
    }

    /// `update` (binding `$1` to `value` and `$2` to `key`) on one row
    /// that is live, or revoked when `revoked`; else an error naming why.
    async fn update_revocable<T>(
        &self,
        what: Revocable,
        key: &str,
        revoked: bool,
        update: &str,
        value: T,
    ) -> Result<(), StoreError>
    where
        T: for<'q> sqlx::Encode<'q, Sqlite>
            + sqlx::Type<Sqlite>
            + for<'q> sqlx::Encode<'q, Postgres>
            + sqlx::Type<Postgres>
            + Send,
    {
        let (kind, select) = match what {
            Revocable::Caller => ("caller", "SELECT revoked_at FROM callers WHERE name = $1"),
            Revocable::Connection => (
                "connection",
                "SELECT revoked_at FROM connections WHERE id = $1",
            ),
            Revocable::AdminToken => (
                "admin token",
                "SELECT revoked_at FROM admin_tokens WHERE name = $1",
            ),
        };
        let name = || key.to_string();
        let mut tx = self.begin().await?;
        let found: Option<Option<i64>> = on!(&mut tx, t => {
            sqlx::query_scalar(select).bind(key).fetch_optional(&mut **t).await?
        });
        match (found, revoked) {
            (None, _) => return Err(StoreError::NotFound { kind, name: name() }),
            (Some(Some(_)), false) => return Err(StoreError::Revoked { kind, name: name() }),
            (Some(None), true) => return Err(StoreError::NotRevoked { kind, name: name() }),
            _ => {}
        }
        on!(&mut tx, t => { sqlx::query(update).bind(value).bind(key).execute(&mut **t).await?; });
        Self::bump(&mut tx).await?;
        self.commit(tx).await?;
        Ok(())
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
    async fn commit(&self, mut tx: Tx) -> Result<(), StoreError> {
        let a = self
            .acting
            .as_ref()
            .filter(|a| !a.recorded.load(Ordering::Relaxed));
        if let Some(a) = a {
            Self::insert_admin_audit(&mut tx, &a.actor, &a.action, &a.target, "ok").await?;
        }
        on!(tx, t => t.commit().await?);
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
        let mut tx = self.begin().await?;
        Self::insert_admin_audit(&mut tx, &a.actor, &a.action, &a.target, outcome).await?;
        on!(tx, t => t.commit().await?);
        Ok(())
    }

    async fn insert_admin_audit(
        tx: &mut Tx,
        actor: &str,
        action: &str,
        target: &str,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let sql =
            "INSERT INTO admin_audit (at, actor, action, target, outcome) VALUES ($1, $2, $3, $4, $5)";
        let at = now_ms();
        on!(tx, t => {
            sqlx::query(sql)
                .bind(at)
                .bind(actor)
                .bind(action)
                .bind(target)
                .bind(outcome)
                .execute(&mut **t)
                .await?;
        });
        Ok(())
    }
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

/// Create an empty file readable by its owner only (0600 on Unix), unless
/// it exists: a new SQLite database, whose `-wal` and `-shm` files SQLite
/// then creates with the same mode, in a folder that may be open to others.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    match o.open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r.map(drop),
    }
}
