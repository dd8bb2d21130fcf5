//! The decision trail: batched inserts ([`AuditSink`]) and queries.

use std::path::PathBuf;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::oneshot;

use super::*;

/// The columns of an audit row an insert binds.
const COLUMNS: usize = 13;

/// The most audit rows one insert statement carries ([`COLUMNS`]
/// parameters each).
/// One statement holds a core for its whole run (on SQLite, the audit
/// writer's thread, which may share the proxy's core): at about 3 µs of CPU per row,
/// 64 rows hold it about 0.2 ms, where 256 held it about 0.8 ms (issue 27:
/// no write holds a core for more than 0.25 ms). The CPU per row barely
/// moves with the chunk (`cargo bench --bench micro -- "audit CPU"`).
const AUDIT_CHUNK_MAX: usize = 64;

/// `INSERT INTO audit … VALUES (…), (…)` for `rows` rows, each dialect's
/// placeholders written out (one text per size, built once). SQLite gets
/// plain `?`: it looks each `$N` up by name in a list, which made a batch
/// of 512 rows (6,144 parameters) cost 127 µs per row instead of 8 µs.
fn audit_insert_text(backend: Backend, rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO audit (at, caller, connection, http_method, rpc_method, tool, verdict, \
         reason, arguments_sha256, arguments, status, duration_us, request_id) VALUES ",
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

/// A batch as chunks of power-of-two sizes (its binary digits below
/// [`AUDIT_CHUNK_MAX`]: 300 rows are 4 × 64 + 32 + 8 + 4). So only seven
/// SQL texts ever exist, and each is prepared once per connection. A text
/// per batch size was parsed anew for nearly every batch: the parser made
/// 11 of SQLite's 21 allocations per row and cost more than the insert
/// (`cargo bench --bench micro -- audit`).
fn chunks(rows: &[AuditRecord]) -> impl Iterator<Item = &[AuditRecord]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let size = AUDIT_CHUNK_MAX.min(1 << rest.len().ilog2());
        let (chunk, after) = rest.split_at(size);
        rest = after;
        Some(chunk)
    })
}

/// The insert of `rows` audit rows (a power of two up to
/// [`AUDIT_CHUNK_MAX`]), built once per process.
fn audit_insert_sql(backend: Backend, rows: usize) -> &'static str {
    static SQLITE: OnceLock<Vec<String>> = OnceLock::new();
    static POSTGRES: OnceLock<Vec<String>> = OnceLock::new();
    let texts = match backend {
        Backend::Sqlite => &SQLITE,
        Backend::Postgres => &POSTGRES,
    };
    let texts = texts.get_or_init(|| {
        (0..=AUDIT_CHUNK_MAX.ilog2())
            .map(|l| audit_insert_text(backend, 1 << l))
            .collect()
    });
    &texts[rows.ilog2() as usize]
}

/// Where the audit writer's batches go. On SQLite, a thread and a
/// connection of its own ([`SqliteAuditWriter`]); on Postgres, the pool.
pub enum AuditSink {
    Sqlite(SqliteAuditWriter),
    Postgres(PgPool),
}

impl Store {
    /// A sink for audit batches. On SQLite this starts the writer's
    /// thread, which ends when the sink is dropped.
    pub fn audit_sink(&self) -> Result<AuditSink, StoreError> {
        Ok(match &self.db {
            Dialect::Sqlite(pool) => {
                let file = pool.connect_options().get_filename().to_path_buf();
                AuditSink::Sqlite(SqliteAuditWriter::start(file)?)
            }
            Dialect::Postgres(pool) => AuditSink::Postgres(pool.clone()),
        })
    }
    /// Audit records matching `q`, oldest first: the newest `q.limit`, or
    /// with `after_id` the first `q.limit` after it.
    pub async fn audit(&self, q: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        // After an id: the oldest following it; else the newest. Two
        // texts, so each walks the primary key in its own direction and
        // stops at the limit (one text ordered by `id * ±1` made both
        // databases sort every matching row for each page).
        // A request id narrows to its own rows through its index (a text
        // of its own: `$8 IS NULL OR request_id = $8` would walk the
        // primary key instead).
        macro_rules! matching {
            ($and:literal) => {
                concat!(
                    "SELECT * FROM audit \
                     WHERE ($1 IS NULL OR caller = $1) AND ($2 IS NULL OR connection = $2) \
                       AND ($3 IS NULL OR at >= $3) AND id > $4 AND id < $6 \
                       AND ($7 = 0 OR rpc_method IS NULL \
                            OR (rpc_method <> 'initialize' AND rpc_method NOT LIKE 'notifications/%'))",
                    $and
                )
            };
        }
        macro_rules! texts {
            ($and:literal) => {
                match q.after_id {
                    Some(_) => concat!(matching!($and), " ORDER BY id LIMIT $5"),
                    None => concat!(
                        "SELECT * FROM (",
                        matching!($and),
                        " ORDER BY id DESC LIMIT $5) AS newest ORDER BY id"
                    ),
                }
            };
        }
        let sql = match q.request_id {
            Some(_) => texts!(" AND request_id = $8"),
            None => texts!(""),
        };
        Ok(on!(&self.db, p => {
            let mut query = sqlx::query_as(sql)
                .bind(&q.caller)
                .bind(&q.connection)
                .bind(q.since)
                .bind(q.after_id.unwrap_or(0))
                .bind(q.limit)
                .bind(q.before_id.unwrap_or(i64::MAX))
                .bind(i64::from(q.quiet));
            if let Some(r) = &q.request_id {
                query = query.bind(r);
            }
            query.fetch_all(p).await?
        }))
    }
}

impl AuditSink {
    pub fn backend(&self) -> Backend {
        match self {
            AuditSink::Sqlite(_) => Backend::Sqlite,
            AuditSink::Postgres(_) => Backend::Postgres,
        }
    }

    /// Write audit records in one transaction: all land or none. `rows`
    /// holds them again when this returns, written or not.
    pub async fn write(&self, rows: &mut Vec<AuditRecord>) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let pool = match self {
            AuditSink::Sqlite(w) => return w.write(rows).await,
            AuditSink::Postgres(pool) => pool,
        };
        // In a transaction: the chunks land together, and a write the
        // audit writer abandons (no answer from a partitioned server) is
        // rolled back, not left to land after its retry.
        let mut tx = pool.begin().await?;
        for chunk in chunks(rows) {
            let mut q = sqlx::query(audit_insert_sql(Backend::Postgres, chunk.len()));
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
                    .bind(r.duration_us)
                    .bind(&r.request_id);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

// ---- the SQLite writer: a connection of its own, on a thread of its own ---
//
// Why not the pool (issue 27): through sqlx every bound value of a batch
// was copied into an owned buffer and every statement was handed to
// sqlx's worker thread and back, and the binding ran on the proxy's
// runtime. Here the batch moves to this thread (no copy), the statements
// are prepared once and bound in place, and the proxy's runtime only
// hands the batch over and waits for the answer. CPU per record at 512
// records a batch: BENCHMARKS.md ("audit CPU").
//
// SQLite serialises writers with its file lock; this connection waits
// for it up to the store's busy timeout, as the pool's connections do,
// and takes it at `BEGIN` (`IMMEDIATE`), as admin transactions do.

/// A batch to write, and where to send it back with the outcome.
struct Job {
    rows: Vec<AuditRecord>,
    done: oneshot::Sender<(Vec<AuditRecord>, Result<(), StoreError>)>,
}

/// The handle a sink keeps; the thread ends when it is dropped.
pub struct SqliteAuditWriter {
    jobs: mpsc::Sender<Job>,
}

impl SqliteAuditWriter {
    /// Start the thread for the database file at `path` (created and
    /// migrated already). It opens its connection on its first batch, and
    /// again after a batch that could not open it.
    fn start(path: PathBuf) -> Result<Self, StoreError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tessera-audit".into())
            .spawn(move || run(&path, rx))
            .map_err(|e| StoreError::AuditWriter(format!("starting its thread: {e}")))?;
        Ok(SqliteAuditWriter { jobs })
    }

    /// Write `rows` in one transaction. They are back in `rows` when this
    /// returns, written or not (the caller retries a failed batch).
    async fn write(&self, rows: &mut Vec<AuditRecord>) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        let job = Job {
            rows: std::mem::take(rows),
            done,
        };
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            *rows = job.rows;
            return Err(StoreError::AuditWriter("its thread has stopped".into()));
        }
        // The thread answers every job it takes, a panic included; a
        // missing answer means the thread is gone with the batch.
        let (back, result) = answer
            .await
            .map_err(|_| StoreError::AuditWriter("its thread stopped mid-batch".into()))?;
        *rows = back;
        result
    }
}

fn run(path: &std::path::Path, jobs: mpsc::Receiver<Job>) {
    let mut conn: Option<Connection> = None;
    for Job { rows, done } in jobs {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let c = match &mut conn {
                Some(c) => c,
                None => conn.insert(open(path)?),
            };
            insert(c, &rows)
        }))
        .unwrap_or_else(|_| Err(StoreError::AuditWriter("a batch panicked".into())));
        if result.is_err() {
            // Open afresh next time: the connection may be what failed.
            conn = None;
        }
        let _ = done.send((rows, result));
    }
}

fn open(path: &std::path::Path) -> Result<Connection, StoreError> {
    // No mutex of SQLite's own: this thread is the connection's only user.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = Connection::open_with_flags(path, flags)?;
    c.busy_timeout(SQLITE_BUSY_TIMEOUT)?;
    // As the pool's connections: a committed batch survives a power cut.
    c.pragma_update(None, "synchronous", "FULL")?;
    // The seven chunk texts stay prepared (rusqlite's default cache holds 16).
    Ok(c)
}

fn insert(c: &mut Connection, rows: &[AuditRecord]) -> Result<(), StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for chunk in chunks(rows) {
        let mut st = tx.prepare_cached(audit_insert_sql(Backend::Sqlite, chunk.len()))?;
        for (i, r) in chunk.iter().enumerate() {
            let at = |c: usize| i * COLUMNS + c;
            st.raw_bind_parameter(at(1), r.at)?;
            st.raw_bind_parameter(at(2), &r.caller)?;
            st.raw_bind_parameter(at(3), &r.connection)?;
            st.raw_bind_parameter(at(4), &r.http_method)?;
            st.raw_bind_parameter(at(5), &r.rpc_method)?;
            st.raw_bind_parameter(at(6), &r.tool)?;
            st.raw_bind_parameter(at(7), &r.verdict)?;
            st.raw_bind_parameter(at(8), &r.reason)?;
            st.raw_bind_parameter(at(9), &r.arguments_sha256)?;
            st.raw_bind_parameter(at(10), &r.arguments)?;
            st.raw_bind_parameter(at(11), i64::from(r.status))?;
            st.raw_bind_parameter(at(12), r.duration_us)?;
            st.raw_bind_parameter(at(13), &r.request_id)?;
        }
        st.raw_execute()?;
    }
    // Dropped uncommitted (an error above), the transaction rolls back.
    tx.commit()?;
    Ok(())
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e)
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::{AuditQuery, AuditRecord};
    use super::super::Store;

    fn record(i: i64, verdict: &str) -> AuditRecord {
        AuditRecord {
            id: 0,
            at: 1_796_300_000_000 + i,
            caller: format!("agent-{i}"),
            connection: "c0ffee".into(),
            http_method: "POST".into(),
            rpc_method: Some("tools/call".into()),
            tool: Some("run".into()),
            verdict: verdict.into(),
            reason: None,
            arguments_sha256: None,
            arguments: None,
            status: 200,
            duration_us: 1,
            request_id: Some(format!("{i:032x}")),
        }
    }

    async fn count(store: &Store) -> usize {
        let q = AuditQuery {
            limit: 10_000,
            ..Default::default()
        };
        store.audit(&q).await.unwrap().len()
    }

    /// A row the table refuses (a verdict outside its CHECK) in the last
    /// chunk of a batch: the batch fails whole, its earlier chunks are
    /// rolled back, every record is handed back for the retry, and the
    /// writer goes on writing the next batch.
    #[tokio::test]
    async fn a_failed_batch_lands_nowhere_and_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_data_dir(dir.path()).await.unwrap();
        let mut batch: Vec<_> = (0..100).map(|i| record(i, "allow")).collect();
        batch[99].verdict = "maybe".into();
        let sent = batch.clone();
        let sink = store.audit_sink().unwrap();
        let e = sink.write(&mut batch).await.unwrap_err();
        assert!(e.to_string().contains("CHECK constraint"), "{e}");
        assert_eq!(batch, sent, "the batch comes back as it went");
        assert_eq!(count(&store).await, 0, "no chunk of it landed");
        batch[99].verdict = "deny".into();
        sink.write(&mut batch).await.unwrap();
        assert_eq!(count(&store).await, 100);
    }
}
