//! The database fails under a serving tessera: on Postgres it stops
//! answering (a partition, made by a TCP forwarder the test controls), on
//! SQLite another connection holds the write lock. Requests the snapshot
//! in memory can serve go on while the audit queue has room; a held call,
//! which needs the database, is refused at once (503) and never reaches
//! the upstream; once the queue is full every request is refused (503)
//! before it is forwarded; when the database is back, tessera recovers by
//! itself and every record of a forwarded request is written, once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const DB_TIMEOUT: Duration = Duration::from_millis(300);
const AUDIT_QUEUE: usize = 4;

/// Between tessera and Postgres: passes bytes both ways until cut. While
/// cut nothing passes and every connection stays open, unanswered; when
/// healed those connections are closed (as after a database restart) and
/// new ones pass again.
pub(crate) struct Partition {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl Partition {
    async fn start(target: SocketAddr) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let (mut client, _) = listener.accept().await.unwrap();
                let mut rx = rx.clone();
                tokio::spawn(async move {
                    if !*rx.borrow() {
                        let Ok(mut server) = TcpStream::connect(target).await else {
                            return;
                        };
                        let copied = tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => true,
                            _ = rx.wait_for(|cut| *cut) => false,
                        };
                        if copied {
                            return;
                        }
                    }
                    let _ = rx.wait_for(|cut| !*cut).await;
                });
            }
        });
        Partition { addr, cut }
    }
}

/// What fails: the Postgres partition, or a SQLite write lock.
pub(crate) enum Fault {
    Postgres {
        partition: Partition,
        url: String,
    },
    Sqlite {
        path: std::path::PathBuf,
        holder: Option<sqlx::SqliteConnection>,
    },
}

impl Fault {
    pub(crate) async fn new(dir: &std::path::Path) -> Fault {
        match database_url(dir) {
            Some(direct) => {
                let mut url = url::Url::parse(&direct).unwrap();
                let target = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
                let partition = Partition::start(target.parse().unwrap()).await;
                url.set_port(Some(partition.addr.port())).unwrap();
                Fault::Postgres {
                    partition,
                    url: url.to_string(),
                }
            }
            None => Fault::Sqlite {
                path: dir.join("tessera.db"),
                holder: None,
            },
        }
    }

    /// The store URL tessera is started with.
    pub(crate) fn url(&self) -> Option<String> {
        match self {
            Fault::Postgres { url, .. } => Some(url.clone()),
            Fault::Sqlite { .. } => None,
        }
    }

    pub(crate) async fn fail(&mut self) {
        match self {
            Fault::Postgres { partition, .. } => {
                partition.cut.send_replace(true);
            }
            Fault::Sqlite { path, holder } => {
                use sqlx::Connection;
                let url = format!("sqlite://{}", path.display());
                let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut c)
                    .await
                    .unwrap();
                *holder = Some(c);
            }
        }
    }

    pub(crate) async fn heal(&mut self) {
        match self {
            Fault::Postgres { partition, .. } => {
                partition.cut.send_replace(false);
            }
            Fault::Sqlite { holder, .. } => {
                let mut c = holder.take().unwrap();
                sqlx::query("ROLLBACK").execute(&mut c).await.unwrap();
            }
        }
    }
}

fn call(id: u32, tool: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"path":"a.txt"}}}}}}"#
    )
}

/// POST as the agent: status, `Retry-After`, JSON answer.
async fn post(a: &Agent, body: String) -> (u16, Option<String>, serde_json::Value) {
    let (status, headers, v) = post_json_headers(a, body).await;
    let retry = headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, v)
}

#[tokio::test]
async fn a_failing_database_fails_closed_and_tessera_recovers_by_itself() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let mut fault = Fault::new(dir.path()).await;
    let url = fault.url();
    let p = Proxy::start_on(
        dir,
        url,
        |c| {
            c.db_timeout = DB_TIMEOUT;
            c.audit_queue = AUDIT_QUEUE;
        },
        policies_with(&["ask-for-writes"]),
    )
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let mut forwarded = 0;
    assert_eq!(post(&a, call(1, "search")).await.0, 200);
    forwarded += 1;

    fault.fail().await;

    // Served from the snapshot: no database needed while the queue has room.
    let (s, _, v) = post(&a, call(2, "search")).await;
    assert_eq!(s, 200, "{v}");
    forwarded += 1;

    // A held call needs the database: 503 within the timeout, not a hang.
    let asked = Instant::now();
    let (s, retry, v) = post(&a, call(3, "write_file")).await;
    assert_eq!((s, v["error"]["code"].as_i64()), (503, Some(-32012)), "{v}");
    assert_eq!(retry.as_deref(), Some("2"));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("approval"),
        "{v}"
    );
    assert!(asked.elapsed() < DB_TIMEOUT * 10, "{:?}", asked.elapsed());

    // The writer notices; then the queue fills, and from there on requests
    // are refused before they are forwarded.
    let state = p.state.clone();
    within(Duration::from_secs(10), || {
        let state = state.clone();
        async move { state.audit.failing() }
    })
    .await;
    let mut refused = None;
    for id in 10..10 + AUDIT_QUEUE as u32 + 1 {
        let answered = tokio::time::timeout(Duration::from_secs(10), post(&a, call(id, "search")));
        let (s, retry, v) = answered
            .await
            .expect("a request waited for the failing database instead of being refused");
        if s == 200 {
            forwarded += 1;
            continue;
        }
        refused = Some((s, retry, v));
        break;
    }
    let (s, retry, v) = refused.expect("a full queue refused nothing");
    assert_eq!((s, v["error"]["code"].as_i64()), (503, Some(-32013)), "{v}");
    assert_eq!(retry.as_deref(), Some("2"));
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("audit trail") && message.contains("not forwarded"),
        "{message}"
    );
    let seen_before_heal = up.seen().len();
    assert_eq!(
        seen_before_heal, forwarded,
        "a refused request was forwarded"
    );
    let metrics = p
        .state
        .metrics
        .render(&tessera::telemetry::metrics::Gauges {
            audit_queue_depth: p.state.audit.queued(),
            audit_failing: p.state.audit.failing(),
            ..Default::default()
        });
    for line in [
        "tessera_audit_write_failing 1",
        "reason=\"audit_unavailable\"} 1",
        "reason=\"approval_unavailable\"} 1",
    ] {
        assert!(metrics.contains(line), "no {line:?} in:\n{metrics}");
    }

    fault.heal().await;

    // Recovered without a restart: the queue drains, requests are served
    // and a held call is recorded again.
    within(Duration::from_secs(15), || {
        let state = state.clone();
        async move { !state.audit.failing() && state.audit.queued() == 0 }
    })
    .await;
    let (s, _, v) = post(&a, call(30, "search")).await;
    assert_eq!(s, 200, "{v}");
    forwarded += 1;
    let (s, _, v) = post(&a, call(31, "write_file")).await;
    assert_eq!(
        (s, v["result"]["isError"].as_bool()),
        (200, Some(true)),
        "{v}"
    );
    assert!(v["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("pending"));
    // Changes made now are served: the snapshot reloads again.
    let b = p.agent("gh2", &up.url("/mcp"), "agent-two").await;
    assert_eq!(post(&b, call(40, "search")).await.0, 200);
    forwarded += 1;

    // Every forwarded request's decision is in the trail, once; the held
    // and the refused ones never reached the upstream.
    assert_eq!(up.seen().len(), forwarded);
    let rows = audit_rows(&p).await;
    let allowed = rows
        .iter()
        .filter(|r| r.tool.as_deref() == Some("search") && r.verdict == "allow")
        .count();
    assert_eq!(allowed, forwarded, "{rows:#?}");
}

/// One number from the data dir's database, behind tessera's back.
async fn count(dir: &std::path::Path, sql: &str) -> i64 {
    sqlx::any::install_default_drivers();
    let url = database_url(dir)
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("tessera.db").display()));
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let n: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
    pool.close().await;
    n
}

/// Make every write to `table` fail inside the database (a trigger), as a
/// fault that strikes an admin command half-way through its writes.
async fn break_table(dir: &std::path::Path, table: &str, op: &str) {
    if on_postgres() {
        raw_sql(
            dir,
            "CREATE OR REPLACE FUNCTION injected_fault() RETURNS trigger AS $$ \
             BEGIN RAISE EXCEPTION 'injected fault'; END $$ LANGUAGE plpgsql",
        )
        .await;
        let sql = format!(
            "CREATE TRIGGER broken_{table} BEFORE {op} ON {table} \
             FOR EACH ROW EXECUTE FUNCTION injected_fault()"
        );
        raw_sql(dir, &sql).await;
    } else {
        let sql = format!(
            "CREATE TRIGGER broken_{table} BEFORE {op} ON {table} \
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
        );
        raw_sql(dir, &sql).await;
    }
}

async fn mend_table(dir: &std::path::Path, table: &str) {
    let on = if on_postgres() {
        format!(" ON {table}")
    } else {
        String::new()
    };
    raw_sql(dir, &format!("DROP TRIGGER broken_{table}{on}")).await;
}

/// An admin command writes its change, the revision that tells serving
/// processes, and its admin-audit record in one transaction: when any of
/// the three fails, none is left behind, and the command says it failed.
#[tokio::test]
async fn an_admin_command_that_fails_half_way_leaves_nothing_written() {
    let d = Proxy::dir();
    let dir = d.path();
    let ok = cli(dir, &["caller", "add", "first"]);
    assert!(ok.status.success());
    let revision = || count(dir, "SELECT value FROM revision WHERE id = 1");
    let callers = || count(dir, "SELECT COUNT(*) FROM callers");
    let records = || count(dir, "SELECT COUNT(*) FROM admin_audit");
    let mut before = (revision().await, callers().await, records().await);
    assert_eq!((before.1, before.2), (1, 1));

    for (table, op) in [("admin_audit", "INSERT"), ("revision", "UPDATE")] {
        break_table(dir, table, op).await;
        let o = cli(dir, &["caller", "add", "second"]);
        assert!(!o.status.success(), "{table}: the command said it worked");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("injected fault"), "{table}: {err}");
        mend_table(dir, table).await;
        let after = (revision().await, callers().await, records().await);
        // The refusal itself is recorded when the record can be written.
        let recorded = usize::from(table != "admin_audit") as i64;
        assert_eq!(
            after,
            (before.0, before.1, before.2 + recorded),
            "{table}: half written"
        );
        before.2 = after.2;
    }

    // Mended, the same command writes all three.
    let o = cli(dir, &["caller", "add", "second"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(callers().await, 2);
    assert!(revision().await > before.0);
    let ok_rows = count(
        dir,
        "SELECT COUNT(*) FROM admin_audit WHERE action = 'caller.add' AND target = 'second' AND outcome = 'ok'",
    )
    .await;
    assert_eq!(ok_rows, 1);
}
