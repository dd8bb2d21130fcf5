//! Change notifications between replicas. On Postgres every change bumps
//! the revision row, and a trigger (`migrations/postgres/0006_changes.sql`)
//! sends `NOTIFY tessera_changes` when that transaction commits. Each
//! serving process listens on one connection of its own and wakes its
//! refresh task, so a change made anywhere is served everywhere within
//! milliseconds rather than one poll interval.
//!
//! A notification sent while the listening connection was down is lost, so
//! whenever the connection is (re-)established the refresh task is woken
//! too: it compares the revision and reloads in full if anything moved.
//! The refresh task's poll stays on as the last line of defence.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;

use crate::store::DatabaseUrl;

/// The channel the trigger notifies.
pub const CHANNEL: &str = "tessera_changes";

/// The `application_name` of the listening connection, so an operator (or
/// a test) can find it in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "tessera-listen";

/// Listen for changes on `url` until the process ends, waking `wake` on
/// every notification and after every (re)connection.
pub async fn listen(url: DatabaseUrl, wake: Arc<Notify>) {
    let mut target = url::Url::parse(url.expose()).expect("a parsed database URL parses");
    target
        .query_pairs_mut()
        .append_pair("application_name", APPLICATION_NAME);
    let mut backoff = Duration::from_millis(100);
    loop {
        match connect(target.as_str()).await {
            Ok(mut listener) => {
                tracing::debug!(database = %url, "listening for changes");
                backoff = Duration::from_millis(100);
                // Whatever changed while no one listened is read now.
                wake.notify_one();
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => wake.notify_one(),
                        // The connection was lost and is back (sqlx
                        // re-listens before returning): notifications in
                        // between are gone, so look.
                        Ok(None) => {
                            tracing::warn!(database = %url, "the change notification connection was lost and is back; reloading");
                            wake.notify_one();
                        }
                        Err(e) => {
                            tracing::warn!(database = %url, error = %e, "the change notification connection failed");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(database = %url, error = %e, "cannot listen for changes; polling only until it works");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn connect(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut l = PgListener::connect(url).await?;
    l.listen(CHANNEL).await?;
    Ok(l)
}
