//! The decision trail: batched inserts and queries.

use super::*;

/// The most audit rows one insert statement carries (12 parameters each).
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

/// A batch as chunks of power-of-two sizes (its binary digits below
/// [`AUDIT_CHUNK_MAX`]: 300 rows are 4 × 64 + 32 + 8 + 4). So only seven
/// SQL texts ever exist, and each is prepared once per connection. A text
/// per batch size was parsed anew for nearly every batch: the parser made
/// 11 of SQLite's 21 allocations per row and cost more than the insert
/// (`cargo bench --bench micro -- audit`).
pub(super) fn chunks(rows: &[AuditRecord]) -> impl Iterator<Item = &[AuditRecord]> {
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
pub(super) fn audit_insert_sql(backend: Backend, rows: usize) -> &'static str {
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

impl Store {
    /// Write audit records in one transaction: all land or none. `rows`
    /// holds them again when this returns, written or not.
    ///
    /// On SQLite the store's audit writer does it, on its own connection
    /// and thread ([`super::audit_sqlite`]), started with the first batch.
    pub async fn insert_audit(&self, rows: &mut Vec<AuditRecord>) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let pool = match &self.db {
            Dialect::Sqlite(pool) => {
                let writer = self
                    .audit_writer
                    .get_or_try_init(|| async {
                        let file = pool.connect_options().get_filename().to_path_buf();
                        super::audit_sqlite::SqliteAuditWriter::start(file)
                    })
                    .await?;
                return writer.write(rows).await;
            }
            Dialect::Postgres(pool) => pool,
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
                    .bind(r.duration_us);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
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
                   AND ($3 IS NULL OR at >= $3) AND id > $4 AND id < $6 \
                   AND ($7 = 0 OR rpc_method IS NULL \
                        OR (rpc_method <> 'initialize' AND rpc_method NOT LIKE 'notifications/%'))"
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
        Ok(on!(&self.db, p => {
            sqlx::query_as(sql)
                .bind(&q.caller)
                .bind(&q.connection)
                .bind(q.since)
                .bind(q.after_id.unwrap_or(0))
                .bind(q.limit)
                .bind(q.before_id.unwrap_or(i64::MAX))
                .bind(i64::from(q.quiet))
                .fetch_all(p)
                .await?
        }))
    }
}
