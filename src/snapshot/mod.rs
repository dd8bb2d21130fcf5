//! The in-memory view of callers, connections and credentials that the data
//! plane reads on every request, and the task that keeps it fresh.
//!
//! Requests never touch the database: they read an `Arc<Snapshot>` swapped
//! in atomically. A background task reads the store's revision counter
//! every `refresh_interval`, and at once when Postgres notifies a change
//! (`crate::snapshot::pg_notify`), and rebuilds the snapshot only when the counter
//! moved. A change made by the CLI or another replica is so served within
//! one interval (250 ms by default) at the cost of one tiny query per
//! interval, not one per request.

pub mod pg_notify;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use url::Url;

use crate::authz::cedar::CedarAuthorizer;
use crate::credentials::{injection_after, Injection};
use crate::crypto::keyring::MasterKey;
use crate::model::{Auth, Caller, Connection, Upstream};
use crate::store::model::Sealed;
use crate::store::{Store, StoreError};

/// Everything a request needs, indexed for one hash lookup each.
#[derive(Debug)]
pub struct Snapshot {
    pub revision: i64,
    /// Live callers by the SHA-256 of their token. Looking a digest up in a
    /// map reveals nothing about a token's bytes: an attacker who times the
    /// lookup learns at most about digests, which they cannot invert.
    /// foldhash, not SipHash: the keys are an admin's, and a request's
    /// lookups are the hot path's (an attacker chooses what is looked up,
    /// never what is stored).
    pub callers: foldhash::HashMap<[u8; 32], Arc<Caller>>,
    /// Live connections by address id.
    pub connections: foldhash::HashMap<String, Connection>,
    /// The callers, their groups and the connections, as policy entities.
    pub entities: cedar_policy::Entities,
    /// Each credential's tool pins (`crate::authz::pins`).
    pub pins: crate::authz::pins::PinTable,
}

impl Snapshot {
    /// Build a snapshot from the store, opening every sealed secret. A
    /// secret that fails to open (wrong master key, tampered row) fails the
    /// whole load: serving without a credential, or with another key's
    /// idea of it, is worse than not starting.
    pub async fn load(
        store: &Store,
        key: &MasterKey,
        schema: &cedar_policy::Schema,
    ) -> Result<Self, StoreError> {
        Self::load_after(store, key, schema, None).await
    }

    /// As [`Snapshot::load`], keeping the OAuth token sources of
    /// `previous` for credentials whose settings did not change: a source
    /// holds the newest (possibly just rotated) refresh token and the one
    /// refresh in flight, and a fresh source would race it with a refresh
    /// token the server may already have retired.
    pub async fn load_after(
        store: &Store,
        key: &MasterKey,
        schema: &cedar_policy::Schema,
        previous: Option<&Snapshot>,
    ) -> Result<Self, StoreError> {
        let kept: HashMap<&str, &Arc<crate::credentials::oauth::OAuthSource>> = previous
            .into_iter()
            .flat_map(|p| p.connections.values())
            .filter_map(|c| match &c.upstream.auth {
                Auth::OAuth(o) => Some((c.upstream.credential.as_str(), o)),
                Auth::Static(_) => None,
            })
            .collect();
        // Static credentials' headers as they were: kept when unchanged,
        // and a replaced secret stays redacted for a while.
        let injected: HashMap<&str, &Injection> = previous
            .into_iter()
            .flat_map(|p| p.connections.values())
            .filter_map(|c| match &c.upstream.auth {
                Auth::Static(i) => Some((c.upstream.credential.as_str(), i)),
                Auth::OAuth(_) => None,
            })
            .collect();
        // Read the revision first: a change racing with the load then bumps
        // it past what we record and triggers another load.
        let revision = store.revision().await?.data;
        // A key rotation writes the new key into the key file before it
        // re-seals; re-reading the ring here lets this load open both.
        if let Err(e) = key.reload() {
            tracing::warn!(error = %e, "re-reading the master key file failed; keeping the keys in force");
        }
        let mut upstreams = HashMap::new();
        let mut tokens = store.oauth_tokens().await?;
        for c in store.credentials().await? {
            // A secret that does not open means the wrong master key: no
            // snapshot rather than one without credentials (at start,
            // serve refuses to start; while serving, the last one stays).
            let secret = key
                .open(&Sealed::Credential.aad(&c.name), &c.sealed)
                .map_err(|_| StoreError::Sealed {
                    credential: c.name.clone(),
                })?;
            let cached = tokens.remove(&c.name);
            let built = Url::parse(&c.upstream)
                .map_err(|e| e.to_string())
                .and_then(|url| {
                    let auth = match &c.oauth {
                        None => injection_after(
                            c.scheme,
                            c.header_name.as_deref(),
                            c.username.as_deref(),
                            &secret,
                            injected.get(c.name.as_str()).copied(),
                        )
                        .map(Auth::Static)
                        .map_err(|e| e.to_string())?,
                        Some(config) => {
                            let fresh = oauth_source(&c.name, config, &secret, cached, key)?;
                            Auth::OAuth(match kept.get(c.name.as_str()) {
                                Some(old) if old.same_settings(&fresh) => {
                                    old.take_client_secret(&fresh);
                                    (*old).clone()
                                }
                                _ => Arc::new(fresh),
                            })
                        }
                    };
                    Ok((url, auth))
                });
            match built {
                Ok((url, auth)) => {
                    let up = Upstream {
                        credential: c.name,
                        url,
                        auth,
                    };
                    upstreams.insert(c.id, Arc::new(up));
                }
                Err(e) => tracing::error!(credential = %c.name, error = %e, "credential left out"),
            }
        }
        let usage: HashMap<i64, &Arc<crate::limits::CallerUse>> = previous
            .into_iter()
            .flat_map(|p| p.callers.values())
            .map(|c| (c.id, &c.usage))
            .collect();
        let mut callers = foldhash::HashMap::default();
        let mut live = std::collections::HashSet::new();
        for c in store.callers().await? {
            if c.revoked_at.is_none() {
                live.insert(c.id);
                callers.insert(
                    c.token_sha256,
                    Arc::new(Caller {
                        usage: usage
                            .get(&c.id)
                            .map_or_else(Default::default, |u| (*u).clone()),
                        id: c.id,
                        name: c.name,
                        groups: c.groups,
                    }),
                );
            }
        }
        let mut connections = foldhash::HashMap::default();
        for c in store.connections().await? {
            if c.revoked_at.is_some() || !live.contains(&c.caller_id) {
                continue;
            }
            if let Some(up) = upstreams.get(&c.credential_id) {
                connections.insert(
                    c.id,
                    Connection {
                        caller_id: c.caller_id,
                        upstream: up.clone(),
                    },
                );
            }
        }
        let pins = crate::authz::pins::PinTable::from_rows(store.tool_pins().await?);
        let entities = crate::authz::cedar::entities(
            callers.values().map(|c| &**c),
            connections.iter().map(|(id, c)| (id.as_str(), c)),
            schema,
        );
        Ok(Snapshot {
            revision,
            callers,
            connections,
            entities,
            pins,
        })
    }
}

/// An OAuth credential's token source, from its config, its opened
/// secrets and its cached token (a cached token that fails to open is
/// dropped: a new one is fetched).
fn oauth_source(
    name: &str,
    config: &str,
    secret: &crate::crypto::keyring::SecretString,
    cached: Option<(Vec<u8>, Option<i64>)>,
    key: &MasterKey,
) -> Result<crate::credentials::oauth::OAuthSource, String> {
    use crate::credentials::oauth::{OAuthConfig, OAuthSecrets, OAuthSource};
    let config: OAuthConfig =
        serde_json::from_str(config).map_err(|e| format!("its OAuth settings: {e}"))?;
    let secrets = OAuthSecrets::parse(secret)?;
    let cached = cached.and_then(|(sealed, exp)| {
        let t = key.open(&Sealed::OAuthToken.aad(name), &sealed).ok()?;
        let exp = exp.map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
        Some((t, exp))
    });
    Ok(OAuthSource::new(name, config, secrets, cached))
}

/// The shared, atomically swapped snapshot.
pub type SharedSnapshot = Arc<ArcSwap<Snapshot>>;

/// What the refresh task is told and tells.
pub struct Refresh {
    /// How often the revision is read without being told.
    pub interval: Duration,
    /// Woken when the store says something changed (Postgres NOTIFY, or a
    /// notification connection that was lost and is back).
    pub wake: Arc<tokio::sync::Notify>,
    /// The store's policy epoch: moves on `tessera policy reload`, when
    /// every serving process reads its policy folder again.
    pub policy_epoch: tokio::sync::watch::Sender<i64>,
    /// A read that takes longer has failed (a database that hangs).
    pub db_timeout: Duration,
    /// Told the revision of each snapshot swapped in (held calls waiting
    /// for a decision watch it: `authz::approvals::hold`).
    pub swapped: tokio::sync::watch::Sender<i64>,
}

/// Read the store's revision (every interval, and when woken) and swap in a
/// new snapshot when it moved. A failed read keeps serving the last good
/// snapshot and tries again.
///
/// The snapshot's policy entities follow the schema of the policies in
/// force, so a policy reload rebuilds the snapshot too.
pub async fn refresh_loop(
    store: Store,
    key: Arc<MasterKey>,
    authz: Arc<CedarAuthorizer>,
    shared: SharedSnapshot,
    refresh: Refresh,
) {
    let mut reloads = authz.reloads();
    let mut tick = tokio::time::interval(refresh.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A policy reload may change the schema the entities follow: it wakes
    // the task too, rather than waiting for the next tick.
    let mut policies_changed = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = refresh.wake.notified() => {}
            r = reloads.changed() => policies_changed |= r.is_ok(),
        }
        policies_changed |= reloads.has_changed().unwrap_or(false);
        let limit = refresh.db_timeout;
        match crate::store::timed(limit, store.revision()).await {
            Ok(r) => {
                refresh.policy_epoch.send_if_modified(|e| {
                    let moved = *e != r.policies;
                    *e = r.policies;
                    moved
                });
                if r.data == shared.load().revision && !policies_changed {
                    continue;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's revision failed; serving the last snapshot");
                continue;
            }
        }
        reloads.mark_unchanged();
        policies_changed = false;
        let policies = authz.policies();
        let previous = shared.load_full();
        let loading = Snapshot::load_after(&store, &key, policies.schema(), Some(&previous));
        match crate::store::timed(limit, loading).await {
            Ok(s) => {
                tracing::debug!(revision = s.revision, "snapshot reloaded");
                let revision = s.revision;
                shared.store(Arc::new(s));
                refresh.swapped.send_replace(revision);
            }
            Err(e) => tracing::warn!(error = %e, "reloading failed; serving the last snapshot"),
        }
    }
}
