//! Policies: Cedar decides who may do what on which connection.
//!
//! The model (`policies/schema.cedarschema`): the principal is the
//! `Caller` (in its `Group`s), the resource the `Connection` (its owner,
//! credential name and upstream host), the action the JSON-RPC method (or
//! `stream/open` for a GET, `session/end` for a DELETE), and the context
//! the request's HTTP method, sub-path, tool, arguments, protocol version,
//! Origin and time. A policy set is a folder of `.cedar` files validated against the
//! schema (the folder's own `schema.cedarschema`, else the built-in one);
//! an invalid set is refused whole, with file, line and reason for each
//! problem, so a server never runs half a policy.
//!
//! Decisions fail closed: no permit means deny, and a policy that fails to
//! evaluate denies rather than being skipped (Cedar alone would skip it,
//! which for a `forbid` would allow).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use cedar_policy::{
    Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId, PolicySet,
    Request, RestrictedExpression, Schema, ValidationMode, Validator,
};
use miette::Diagnostic;

use crate::authz::{Authorizer, AuthzRequest, Grounds, Verdict};
use crate::model::{Caller, Connection};

/// The schema and default policy shipped in `policies/`.
pub const BUILTIN_SCHEMA: &str = include_str!("../../policies/schema.cedarschema");
pub const BUILTIN_DEFAULT: &str = include_str!("../../policies/default.cedar");

/// One problem in a policy set.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}: {reason}")]
    Invalid {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("{dir}: no .cedar policy files")]
    Empty { dir: String },
}

/// Every problem found in a policy set, one per line.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct PolicyErrors(pub Vec<PolicyError>);

/// A validated policy set.
pub struct Policies {
    set: PolicySet,
    schema: Schema,
    /// Where the set came from: a folder, or "built-in".
    pub origin: String,
    /// The files read, in order.
    pub files: Vec<String>,
    actions: foldhash::HashMap<&'static str, EntityUid>,
    /// The permit policies annotated `@ask`: a request they allow is held
    /// for a person's approval.
    asks: HashSet<String>,
    /// The `@ask` permits marked `@ask("learn")`: a prediction may answer
    /// for a person (`crate::authz::predict`).
    learns: HashSet<String>,
    /// The context attributes some policy may read; only these are built
    /// per request (building the whole context was most of a decision's
    /// cost).
    uses: ContextUse,
    /// Decisions already made, unless a policy reads the arguments: a
    /// decision depends only on caller, connection, action and the context
    /// attributes the policies read, which are small and repeat.
    cache: Option<std::sync::Mutex<DecisionCache>>,
    engine: cedar_policy::Authorizer,
}

/// Decisions for one snapshot revision and one time bucket, keyed by
/// caller, action and a hash of the connection id and the context
/// attributes read; the entry keeps those values, so a hash collision is a
/// miss, never someone else's decision.
#[derive(Default)]
struct DecisionCache {
    revision: i64,
    /// The time the decisions hold for (see [`Policies::time_bucket`]).
    time: i64,
    map: HashMap<(i64, u64, &'static str), (Keyed, Evaluation)>,
}

/// The values a cached decision was made on, besides caller and action.
type Keyed = Box<[Option<Box<str>>]>;

/// Entries kept before the cache starts over.
const CACHE_LIMIT: usize = 100_000;

/// Which context attributes the policies can read: a policy's text must
/// name an attribute to read it (record keys are literals in Cedar), so an
/// attribute no policy text mentions cannot change a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ContextUse {
    http_method: bool,
    rpc_method: bool,
    tool: bool,
    /// `context.tool_folded`, the tool name folded to lower case. Its
    /// text names `tool` too, so `tool` is set with it and the decision
    /// cache keys on the tool name, which it derives from.
    tool_folded: bool,
    arguments: bool,
    protocol_version: bool,
    origin: bool,
    path: bool,
    time: bool,
    /// `context.time.unix`: the time to the second. Without it the time
    /// attributes (hour, minute, weekday) change once a minute.
    time_unix: bool,
}

impl ContextUse {
    fn of<'a>(texts: impl IntoIterator<Item = &'a str>) -> ContextUse {
        let mut u = ContextUse::default();
        for t in texts.into_iter().filter(|t| t.contains("context")) {
            u.http_method |= t.contains("http_method");
            u.rpc_method |= t.contains("rpc_method");
            u.tool |= t.contains("tool");
            u.tool_folded |= t.contains("tool_folded");
            u.arguments |= t.contains("arguments");
            u.protocol_version |= t.contains("protocol_version");
            u.origin |= t.contains("origin");
            u.path |= t.contains("path");
            u.time |= t.contains("time");
            u.time_unix |= t.contains("unix");
        }
        u
    }
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("origin", &self.origin)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// What the policies made of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub allowed: bool,
    /// Allowed, but one of the permits that allowed it is marked `@ask`:
    /// a person decides. (When a plain permit and an `@ask` permit both
    /// apply, the request is asked: the stricter reading wins.)
    pub ask: bool,
    /// Asked, and every `@ask` permit that asks is `@ask("learn")` (one
    /// plain `@ask` among them: a person is asked, the stricter reading).
    pub learn: bool,
    /// The policies that determined it: the permits that allowed, or the
    /// forbids (and failed policies) that denied. Empty on a deny: nothing
    /// permitted it.
    pub policies: Vec<String>,
    /// Evaluation errors, each naming its policy.
    pub errors: Vec<String>,
}

impl Policies {
    /// The built-in schema and default policy.
    pub fn builtin() -> Policies {
        Self::from_sources(
            "built-in",
            ("schema.cedarschema", BUILTIN_SCHEMA),
            vec![("default.cedar".to_string(), BUILTIN_DEFAULT.to_string())],
        )
        .expect("the built-in policies are valid")
    }

    /// Read and validate the `.cedar` files directly in `dir` (not its
    /// subfolders: `examples/` is for reading), against `dir`'s
    /// `schema.cedarschema` or the built-in schema.
    pub fn load_dir(dir: &Path) -> Result<Policies, PolicyErrors> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| {
                PolicyErrors(vec![PolicyError::Read {
                    path: p.display().to_string(),
                    source,
                }])
            })
        };
        let schema_path = dir.join("schema.cedarschema");
        let schema = if schema_path.exists() {
            read(&schema_path)?
        } else {
            BUILTIN_SCHEMA.to_string()
        };
        let entries = std::fs::read_dir(dir).map_err(|source| {
            PolicyErrors(vec![PolicyError::Read {
                path: dir.display().to_string(),
                source,
            }])
        })?;
        let mut paths: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "cedar"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(PolicyErrors(vec![PolicyError::Empty {
                dir: dir.display().to_string(),
            }]));
        }
        let mut files = Vec::with_capacity(paths.len());
        for p in &paths {
            files.push((p.display().to_string(), read(p)?));
        }
        Self::from_sources(
            &dir.display().to_string(),
            (&schema_path.display().to_string(), &schema),
            files,
        )
    }

    /// Validate policy texts (file name, text) as `load_dir` does a
    /// folder's, against `schema` or the built-in schema.
    pub fn from_texts(
        origin: &str,
        schema: Option<&str>,
        files: Vec<(String, String)>,
    ) -> Result<Policies, PolicyErrors> {
        if files.is_empty() {
            return Err(PolicyErrors(vec![PolicyError::Empty {
                dir: origin.to_string(),
            }]));
        }
        Self::from_sources(
            origin,
            ("schema.cedarschema", schema.unwrap_or(BUILTIN_SCHEMA)),
            files,
        )
    }

    /// Parse, name and validate policy files against a schema.
    fn from_sources(
        origin: &str,
        (schema_file, schema_text): (&str, &str),
        files: Vec<(String, String)>,
    ) -> Result<Policies, PolicyErrors> {
        let mut errors = Vec::new();
        let schema = match Schema::from_cedarschema_str(schema_text) {
            Ok((s, _warnings)) => Some(s),
            Err(e) => {
                errors.push(invalid(schema_file, schema_text, &e));
                None
            }
        };
        let mut set = PolicySet::new();
        // Which file each policy came from, to place validation errors.
        let mut home: HashMap<PolicyId, usize> = HashMap::new();
        let mut asks = HashSet::new();
        let mut learns = HashSet::new();
        for (i, (file, text)) in files.iter().enumerate() {
            let parsed = match PolicySet::from_str(text) {
                Ok(p) => p,
                Err(e) => {
                    errors.push(invalid(file, text, &e));
                    continue;
                }
            };
            if parsed.templates().next().is_some() {
                errors.push(PolicyError::Invalid {
                    file: file.clone(),
                    line: 1,
                    reason: "policy templates are not supported; write policies".into(),
                });
            }
            // Cedar numbers a file's policies policy0, policy1, … in order.
            let mut policies: Vec<_> = parsed.policies().collect();
            policies.sort_by_key(|p| {
                p.id()
                    .to_string()
                    .trim_start_matches("policy")
                    .parse::<usize>()
                    .unwrap_or(usize::MAX)
            });
            let stem = Path::new(file)
                .file_stem()
                .map_or_else(|| file.clone(), |s| s.to_string_lossy().into_owned());
            for (n, p) in policies.into_iter().enumerate() {
                let id = PolicyId::new(match p.annotation("id") {
                    Some(id) => id.to_string(),
                    None => format!("{stem}#{n}"),
                });
                if home.contains_key(&id) {
                    errors.push(PolicyError::Invalid {
                        file: file.clone(),
                        line: line_of(text, &format!("\"{id}\"")),
                        reason: format!("the policy id \"{id}\" is used twice"),
                    });
                    continue;
                }
                home.insert(id.clone(), i);
                if p.annotation("ask").is_some() {
                    if p.effect() == cedar_policy::Effect::Forbid {
                        errors.push(PolicyError::Invalid {
                            file: file.clone(),
                            line: line_of(text, "@ask"),
                            reason: format!(
                                "policy \"{id}\": @ask applies to permit policies only"
                            ),
                        });
                    }
                    match p.annotation("ask") {
                        Some("") => {}
                        Some("learn") => {
                            learns.insert(id.to_string());
                        }
                        Some(other) => errors.push(PolicyError::Invalid {
                            file: file.clone(),
                            line: line_of(text, "@ask"),
                            reason: format!(
                                "policy \"{id}\": @ask({other:?}) is not known: write @ask (a person decides) or @ask(\"learn\") (a prediction from people's answers may decide)"
                            ),
                        }),
                        None => unreachable!("checked above"),
                    }
                    asks.insert(id.to_string());
                }
                if let Err(e) = set.add(p.new_id(id)) {
                    errors.push(PolicyError::Invalid {
                        file: file.clone(),
                        line: 1,
                        reason: e.to_string(),
                    });
                }
            }
        }
        if let Some(schema) = &schema {
            let result = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
            for e in result.validation_errors() {
                let (file, text) = home
                    .get(e.policy_id())
                    .map_or(("?", ""), |&i| (files[i].0.as_str(), files[i].1.as_str()));
                errors.push(invalid(file, text, e));
            }
        }
        let Some(schema) = schema.filter(|_| errors.is_empty()) else {
            return Err(PolicyErrors(errors));
        };
        let actions = super::METHOD_ACTIONS
            .iter()
            .chain(&[
                "notification",
                "response",
                "other",
                "stream/open",
                "session/end",
            ])
            .map(|a| (*a, uid("Action", a)))
            .collect();
        // Read from the policies' JSON form, which has no comments: a
        // comment naming `arguments` must not turn the decision cache off.
        // Should a policy have no JSON form, the file texts stand in.
        let texts = set
            .policies()
            .map(|p| p.to_json().ok().map(|j| j.to_string()))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_else(|| files.iter().map(|(_, t)| t.clone()).collect());
        let uses = ContextUse::of(texts.iter().map(String::as_str));
        Ok(Policies {
            set,
            schema,
            uses,
            // Arguments can be megabytes and rarely repeat: not a key.
            cache: (!uses.arguments).then(Default::default),
            origin: origin.to_string(),
            files: files.into_iter().map(|(f, _)| f).collect(),
            actions,
            asks,
            learns,
            engine: cedar_policy::Authorizer::new(),
        })
    }

    /// The schema the policies were validated against; its action
    /// hierarchy (`Action::"mcp"`) goes into the entities.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The number of policies.
    pub fn len(&self) -> usize {
        self.set.policies().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The policy ids, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<_> = self.set.policies().map(|p| p.id().to_string()).collect();
        ids.sort();
        ids
    }

    /// Evaluate one request (from the cache when this caller, action,
    /// connection and the context attributes the policies read were
    /// decided before, on the same snapshot and in the same time bucket).
    pub fn evaluate(&self, req: &AuthzRequest<'_>) -> Evaluation {
        let Some(cache) = &self.cache else {
            return self.evaluate_uncached(req);
        };
        let name = super::action_name(req.http_method, req.rpc_method);
        let Some((&action, _)) = self.actions.get_key_value(name) else {
            return self.evaluate_uncached(req);
        };
        let values = self.keyed_values(req);
        let key = (req.caller.id, fx_hash(&values), action);
        let time = self.time_bucket(req.time);
        {
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            if c.revision != req.revision || c.time != time {
                c.map.clear();
                c.revision = req.revision;
                c.time = time;
            }
            if let Some((kept, e)) = c.map.get(&key) {
                if kept.iter().map(Option::as_deref).eq(values) {
                    return e.clone();
                }
            }
        }
        let e = self.evaluate_uncached(req);
        if e.errors.is_empty() {
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            if c.revision == req.revision && c.time == time {
                if c.map.len() >= CACHE_LIMIT {
                    c.map.clear();
                }
                let kept = values.iter().map(|v| v.map(Box::from)).collect();
                c.map.insert(key, (kept, e.clone()));
            }
        }
        e
    }

    /// What a decision depends on besides caller, action and time: the
    /// connection id and the context attributes the policies read (`None`
    /// for one they do not read).
    fn keyed_values<'a>(&self, req: &AuthzRequest<'a>) -> [Option<&'a str>; 7] {
        let u = self.uses;
        let read = |used: bool, v: Option<&'a str>| if used { v } else { None };
        [
            Some(req.connection_id),
            read(u.http_method, Some(req.http_method.as_str())),
            read(u.rpc_method, req.rpc_method),
            read(u.tool, req.tool),
            read(u.protocol_version, req.protocol_version),
            read(u.origin, req.origin),
            read(u.path, Some(req.path)),
        ]
    }

    /// The time a decision holds for: forever when no policy reads the
    /// time, the minute (what hour, minute and weekday derive from), or
    /// the second when a policy reads `unix`.
    fn time_bucket(&self, t: SystemTime) -> i64 {
        if !self.uses.time {
            return 0;
        }
        let unix = t
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if self.uses.time_unix {
            unix
        } else {
            unix.div_euclid(60)
        }
    }

    /// Evaluate one request without the cache: what a first decision
    /// costs (the micro-benchmark measures both).
    pub fn evaluate_uncached(&self, req: &AuthzRequest<'_>) -> Evaluation {
        let deny = |why: String| Evaluation {
            allowed: false,
            ask: false,
            learn: false,
            policies: Vec::new(),
            errors: vec![why],
        };
        let action = super::action_name(req.http_method, req.rpc_method);
        let Some(action) = self.actions.get(action) else {
            return deny(format!("no action {action:?}"));
        };
        let context = match context(req, self.uses) {
            Ok(c) => c,
            Err(e) => return deny(format!("the request context: {e}")),
        };
        let request = match Request::new(
            uid("Caller", &req.caller.name),
            action.clone(),
            uid("Connection", req.connection_id),
            context,
            None,
        ) {
            Ok(r) => r,
            Err(e) => return deny(format!("the request: {e}")),
        };
        let resp = self.engine.is_authorized(&request, &self.set, req.entities);
        let mut policies: Vec<String> = resp
            .diagnostics()
            .reason()
            .map(ToString::to_string)
            .collect();
        let mut errors = Vec::new();
        for e in resp.diagnostics().errors() {
            let cedar_policy::AuthorizationError::PolicyEvaluationError(e) = e;
            // Fail closed: a policy that cannot be evaluated denies.
            policies.push(e.policy_id().to_string());
            errors.push(e.to_string());
        }
        policies.sort();
        policies.dedup();
        let allowed = resp.decision() == Decision::Allow && errors.is_empty();
        let ask = allowed && policies.iter().any(|p| self.asks.contains(p));
        Evaluation {
            allowed,
            ask,
            learn: ask
                && policies
                    .iter()
                    .filter(|p| self.asks.contains(*p))
                    .all(|p| self.learns.contains(p)),
            policies,
            errors,
        }
    }
}

/// The policy decision point over a [`Policies`] set that can be swapped
/// while serving.
pub struct CedarAuthorizer {
    policies: arc_swap::ArcSwap<Policies>,
    reloads: tokio::sync::watch::Sender<Reloads>,
}

/// What reloading has done so far, for logs, tests and (later) metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloads {
    /// Bumped by every successful swap.
    pub generation: u64,
    /// Every reload tried, successful or not.
    pub attempts: u64,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
}

impl CedarAuthorizer {
    pub fn new(p: Policies) -> Self {
        CedarAuthorizer {
            policies: arc_swap::ArcSwap::from_pointee(p),
            reloads: tokio::sync::watch::Sender::new(Reloads::default()),
        }
    }

    /// The set in force.
    pub fn policies(&self) -> arc_swap::Guard<std::sync::Arc<Policies>> {
        self.policies.load()
    }

    /// Follow reloads: the receiver sees every attempt.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<Reloads> {
        self.reloads.subscribe()
    }

    /// Read `dir` again and swap the new set in atomically; an invalid set
    /// keeps the one in force, and the error is logged and kept.
    pub fn reload(&self, dir: &Path) -> Result<(), PolicyErrors> {
        let r = Policies::load_dir(dir);
        self.reloads.send_modify(|s| {
            s.attempts += 1;
            match &r {
                Ok(_) => {
                    s.generation += 1;
                    s.last_error = None;
                }
                Err(e) => s.last_error = Some(e.to_string()),
            }
        });
        match r {
            Ok(p) => {
                tracing::info!(policies = %p.origin, count = p.len(), "policies reloaded");
                self.policies.store(std::sync::Arc::new(p));
                Ok(())
            }
            Err(e) => {
                tracing::error!(
                    policies = %dir.display(),
                    errors = %e,
                    "the edited policies are not valid; keeping the last good set"
                );
                Err(e)
            }
        }
    }
}

/// Reload the policies in `dir` when its files change (checked every
/// `every`) and whenever `poke` yields (SIGHUP, in `serve`).
pub async fn watch_dir(
    authz: std::sync::Arc<CedarAuthorizer>,
    dir: std::path::PathBuf,
    every: std::time::Duration,
    mut poke: impl futures_util::Stream<Item = ()> + Unpin,
) {
    use futures_util::StreamExt;
    let mut seen = fingerprint(&dir);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = fingerprint(&dir);
                if now == seen {
                    continue;
                }
                seen = now;
            }
            p = poke.next() => {
                if p.is_none() {
                    return;
                }
                seen = fingerprint(&dir);
            }
        }
        let _ = authz.reload(&dir);
    }
}

/// Names, sizes and modification times of the files a reload reads.
fn fingerprint(dir: &Path) -> Vec<(std::path::PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let p = e.path();
            let wanted = p
                .extension()
                .is_some_and(|x| x == "cedar" || x == "cedarschema");
            let m = e.metadata().ok()?;
            wanted.then(|| (p, m.len(), m.modified().ok()))
        })
        .collect();
    v.sort();
    v
}

impl Authorizer for CedarAuthorizer {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict {
        let e = self.policies.load().evaluate(req);
        if !e.errors.is_empty() {
            tracing::warn!(errors = ?e.errors, "a policy failed to evaluate; denied");
        }
        let grounds = Grounds {
            policies: e.policies,
            reason: None,
            learn: e.learn,
        };
        match (e.allowed, e.ask) {
            (true, false) => Verdict::Allow(grounds),
            (true, true) => Verdict::Ask(grounds),
            (false, _) => Verdict::Deny(grounds),
        }
    }
}

fn uid(kind: &str, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(type_name(kind), EntityId::new(id))
}

/// A fast non-cryptographic hash (FNV-1a) of the decision cache's values;
/// entries keep the values, so collisions only cost a miss.
fn fx_hash(values: &[Option<&str>]) -> u64 {
    let byte = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    values.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| match v {
        // A marker before each value: ("ab", "") and ("a", "b") differ.
        None => byte(h, 0),
        Some(s) => s.bytes().fold(byte(h, 1), byte),
    })
}

/// The schema's entity type names, parsed once: parsing one per request
/// showed in profiles.
fn type_name(kind: &str) -> EntityTypeName {
    static NAMES: std::sync::OnceLock<[(&str, EntityTypeName); 4]> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        ["Caller", "Connection", "Group", "Action"]
            .map(|k| (k, EntityTypeName::from_str(k).expect("a valid type name")))
    });
    match names.iter().find(|(k, _)| *k == kind) {
        Some((_, t)) => t.clone(),
        None => EntityTypeName::from_str(kind).expect("a valid type name"),
    }
}

fn string(s: &str) -> RestrictedExpression {
    RestrictedExpression::new_string(s.to_string())
}

/// The request's context record, as the schema declares it, with only the
/// attributes in `uses`.
fn context(req: &AuthzRequest<'_>, uses: ContextUse) -> Result<Context, String> {
    let mut pairs = Vec::new();
    if uses.time {
        let unix = req
            .time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let days = unix.div_euclid(86_400);
        let time = RestrictedExpression::new_record([
            ("unix".to_string(), RestrictedExpression::new_long(unix)),
            (
                "hour".to_string(),
                RestrictedExpression::new_long(unix.rem_euclid(86_400) / 3600),
            ),
            (
                "minute".to_string(),
                RestrictedExpression::new_long(unix.rem_euclid(3600) / 60),
            ),
            // 1970-01-01 was a Thursday (ISO weekday 4).
            (
                "weekday".to_string(),
                RestrictedExpression::new_long((days + 3).rem_euclid(7) + 1),
            ),
        ])
        .expect("distinct keys");
        pairs.push(("time".to_string(), time));
    }
    let fields = [
        (
            "http_method",
            uses.http_method,
            Some(req.http_method.as_str()),
        ),
        ("rpc_method", uses.rpc_method, req.rpc_method),
        ("tool", uses.tool, req.tool),
        (
            "protocol_version",
            uses.protocol_version,
            req.protocol_version,
        ),
        ("origin", uses.origin, req.origin),
        ("path", uses.path, Some(req.path)),
    ];
    for (k, used, v) in fields {
        if let (true, Some(v)) = (used, v) {
            pairs.push((k.to_string(), string(v)));
        }
    }
    // A case-insensitive form of the tool name for policy authors
    // (`context.tool_folded like "delete*"` catches `Delete_repo`): tool
    // names themselves compare exactly, as the upstream sees them.
    if let (true, Some(tool)) = (uses.tool_folded, req.tool) {
        pairs.push((
            "tool_folded".to_string(),
            string(&crate::authz::canonical::fold(tool)),
        ));
    }
    // The arguments as the upstream decodes them, not as the caller
    // escaped them: `\/etc\/passwd` and `\u002fetc` are `/etc/…` here, so
    // a rule on `"*/etc/*"` sees what will run. Text that has no single
    // reading (peek refuses it before this) fails the decision closed.
    if let (true, Some(arguments)) = (uses.arguments, req.arguments) {
        let canonical = crate::authz::canonical::canonical(arguments)
            .map_err(|e| format!("the arguments: {e}"))?;
        pairs.push((
            "arguments".to_string(),
            RestrictedExpression::new_string(canonical),
        ));
    }
    if pairs.is_empty() {
        return Ok(Context::empty());
    }
    Context::from_pairs(pairs).map_err(|e| e.to_string())
}

/// The entities policies see: every live caller (in its groups), every
/// group, every live connection, and the schema's actions. Built with each
/// snapshot, not per request.
pub fn entities<'a>(
    callers: impl IntoIterator<Item = &'a Caller>,
    connections: impl IntoIterator<Item = (&'a str, &'a Connection)>,
    schema: &Schema,
) -> Entities {
    let mut out = Vec::new();
    let mut groups = HashSet::new();
    let mut names = HashMap::new();
    for c in callers {
        names.insert(c.id, c.name.as_str());
        let parents: HashSet<_> = c.groups.iter().map(|g| uid("Group", g)).collect();
        groups.extend(parents.iter().cloned());
        let attrs = HashMap::from([("name".to_string(), string(&c.name))]);
        match Entity::new(uid("Caller", &c.name), attrs, parents) {
            Ok(e) => out.push(e),
            Err(e) => tracing::error!(caller = %c.name, error = %e, "caller left out of policies"),
        }
    }
    out.extend(
        groups
            .into_iter()
            .map(|g| Entity::new_no_attrs(g, HashSet::new())),
    );
    for (id, c) in connections {
        let Some(owner) = names.get(&c.caller_id) else {
            continue;
        };
        let attrs = HashMap::from([
            (
                "owner".to_string(),
                RestrictedExpression::new_entity_uid(uid("Caller", owner)),
            ),
            ("credential".to_string(), string(&c.upstream.credential)),
            (
                "upstream_host".to_string(),
                string(c.upstream.url.host_str().unwrap_or_default()),
            ),
        ]);
        match Entity::new(uid("Connection", id), attrs, HashSet::new()) {
            Ok(e) => out.push(e),
            Err(e) => tracing::error!(error = %e, "connection left out of policies"),
        }
    }
    Entities::from_entities(out, Some(schema)).unwrap_or_else(|e| {
        tracing::error!(error = %e, "policy entities could not be built; every request is denied");
        Entities::empty()
    })
}

/// A problem with its place: the first labelled span of the diagnostic,
/// as a line of `text`.
fn invalid(file: &str, text: &str, d: &(impl Diagnostic + std::fmt::Display)) -> PolicyError {
    let offset = d
        .labels()
        .and_then(|mut l| l.next())
        .map(|l| l.offset())
        .or_else(|| {
            d.related()
                .and_then(|mut r| r.next())
                .and_then(|r| r.labels())
                .and_then(|mut l| l.next())
                .map(|l| l.offset())
        });
    let mut reason = d.to_string();
    if let Some(help) = d.help() {
        reason.push_str(&format!(" ({help})"));
    }
    // A parse error's own message is often general; its related errors
    // say what was wrong.
    if let Some(related) = d.related() {
        for r in related {
            let r = r.to_string();
            if !reason.contains(&r) {
                reason.push_str(&format!("; {r}"));
            }
        }
    }
    PolicyError::Invalid {
        file: file.to_string(),
        line: offset.map_or(1, |o| text[..o.min(text.len())].matches('\n').count() + 1),
        reason,
    }
}

/// The 1-based line where `needle` first occurs in `text` (1 if nowhere).
fn line_of(text: &str, needle: &str) -> usize {
    text.find(needle)
        .map_or(1, |o| text[..o].matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::credentials::injection;
    use crate::crypto::keyring::SecretString;
    use crate::model::Upstream;
    use crate::store::model::Scheme;

    /// Callers: agent (no group), reader (readers), bot (ci-bots). One
    /// connection each: agent's and reader's to example.com, bot's to
    /// api.githubcopilot.com and a second one to example.com.
    struct World {
        callers: Vec<Caller>,
        connections: Vec<(String, Connection)>,
        entities: Entities,
    }

    fn world(p: &Policies) -> World {
        let caller = |id, name: &str, groups: &[&str]| Caller {
            id,
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            usage: Default::default(),
        };
        let callers = vec![
            caller(1, "agent", &[]),
            caller(2, "reader", &["readers"]),
            caller(3, "bot", &["ci-bots"]),
        ];
        let up = |url: &str| {
            Arc::new(Upstream {
                credential: "cred".into(),
                url: url.parse().unwrap(),
                auth: crate::model::Auth::Static(
                    injection(
                        Scheme::Bearer,
                        None,
                        None,
                        &SecretString::from("s".to_string()),
                    )
                    .unwrap(),
                ),
            })
        };
        let conn = |caller_id, url: &str| Connection {
            caller_id,
            upstream: up(url),
        };
        let connections = vec![
            ("c-agent".to_string(), conn(1, "https://example.com/mcp")),
            ("c-reader".to_string(), conn(2, "https://example.com/mcp")),
            (
                "c-bot-gh".to_string(),
                conn(3, "https://api.githubcopilot.com/mcp"),
            ),
            (
                "c-bot-other".to_string(),
                conn(3, "https://example.com/mcp"),
            ),
        ];
        let entities = entities(
            &callers,
            connections.iter().map(|(id, c)| (id.as_str(), c)),
            p.schema(),
        );
        World {
            callers,
            connections,
            entities,
        }
    }

    /// 2026-12-07 was a Monday.
    fn monday_at(hour: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_796_601_600 + hour * 3600)
    }

    fn ask(
        p: &Policies,
        w: &World,
        caller: &str,
        conn: &str,
        method: &str,
        tool: Option<&str>,
        time: SystemTime,
    ) -> Evaluation {
        let caller = w.callers.iter().find(|c| c.name == caller).unwrap();
        let (id, connection) = w.connections.iter().find(|(id, _)| id == conn).unwrap();
        p.evaluate(&AuthzRequest {
            caller,
            connection_id: id,
            connection,
            entities: &w.entities,
            revision: 1,
            http_method: &http::Method::POST,
            path: "",
            rpc_method: Some(method),
            tool,
            arguments: tool.map(|_| "{}"),
            protocol_version: Some("2025-11-25"),
            origin: None,
            time,
        })
    }

    /// The shipped default plus the named examples, loaded from a folder
    /// the way `serve --policies` does.
    /// Whether the agent may list tools on its own connection at `t`.
    fn lists(p: &Policies, w: &World, t: SystemTime) -> bool {
        ask(p, w, "agent", "c-agent", "tools/list", None, t).allowed
    }

    fn with_examples(names: &[&str]) -> Policies {
        let dir = tempfile::tempdir().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        std::fs::copy(root.join("default.cedar"), dir.path().join("default.cedar")).unwrap();
        for n in names {
            let f = format!("{n}.cedar");
            std::fs::copy(root.join("examples").join(&f), dir.path().join(&f)).unwrap();
        }
        Policies::load_dir(dir.path()).unwrap()
    }

    #[test]
    fn default_allows_own_connections_only() {
        let p = Policies::builtin();
        let w = world(&p);
        let t = monday_at(3);
        for m in ["initialize", "tools/list", "resources/read", "x/unknown"] {
            let e = ask(&p, &w, "agent", "c-agent", m, None, t);
            assert!(e.allowed, "{m}");
            assert_eq!(e.policies, ["own-connections"]);
        }
        let e = ask(&p, &w, "agent", "c-reader", "tools/list", None, t);
        assert!(!e.allowed);
        assert!(e.policies.is_empty(), "denied because nothing permits it");
    }

    #[test]
    fn cached_decisions_are_per_caller_and_connection() {
        let p = Policies::builtin();
        assert!(p.cache.is_some(), "the default policy reads no context");
        let w = world(&p);
        let t = monday_at(3);
        for _ in 0..2 {
            assert!(ask(&p, &w, "agent", "c-agent", "tools/list", None, t).allowed);
            assert!(!ask(&p, &w, "reader", "c-agent", "tools/list", None, t).allowed);
            assert!(!ask(&p, &w, "agent", "c-reader", "tools/list", None, t).allowed);
        }
        let cached = p.cache.as_ref().unwrap().lock().unwrap().map.len();
        assert_eq!(cached, 3);
    }

    #[test]
    fn cached_decisions_follow_the_context_the_policies_read() {
        let p = with_examples(&["tool-deny-list", "business-hours"]);
        let w = world(&p);
        let call = |tool, t| ask(&p, &w, "agent", "c-agent", "tools/call", Some(tool), t).allowed;
        // Twice each, in turn: a cached allow never answers another tool,
        // and a cached decision never outlives its minute.
        for _ in 0..2 {
            assert!(call("update_issue", monday_at(10)));
            assert!(!call("delete_repo", monday_at(10)));
            assert!(
                !call("update_issue", monday_at(3)),
                "outside business hours"
            );
            assert!(call("update_issue", monday_at(10)));
            let late = monday_at(17) + Duration::from_secs(59 * 60);
            assert!(call("update_issue", late));
            assert!(!call("update_issue", late + Duration::from_secs(60)));
        }
        // A policy that reads the time to the second (here: forbids the
        // second after Monday 10:00) is decided per second.
        let dir = tempfile::tempdir().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        std::fs::copy(root.join("default.cedar"), dir.path().join("default.cedar")).unwrap();
        std::fs::write(
            dir.path().join("odd.cedar"),
            "@id(\"one-second\")\nforbid (principal, action, resource)\n\
             when { context.time.unix == 1796637601 };\n",
        )
        .unwrap();
        let p = Policies::load_dir(dir.path()).unwrap();
        let w = world(&p);
        let at = |s| lists(&p, &w, monday_at(10) + Duration::from_secs(s));
        assert_eq!(
            [at(0), at(1), at(2), at(1), at(0)],
            [true, false, true, false, true]
        );
        // Every example is cached, although one's comment names the
        // arguments; policies that read them are never cached.
        let all = with_examples(&[
            "read-only",
            "tool-deny-list",
            "group-one-upstream",
            "business-hours",
            "ask-for-writes",
        ]);
        assert!(all.cache.is_some(), "{:?}", all.uses);
        std::fs::write(
            dir.path().join("args.cedar"),
            "@id(\"no-secrets\")\nforbid (principal, action, resource)\n\
             when { context has arguments && context.arguments like \"*secret*\" };\n",
        )
        .unwrap();
        assert!(Policies::load_dir(dir.path()).unwrap().cache.is_none());
    }

    #[test]
    fn read_only_example() {
        let p = with_examples(&["read-only"]);
        let w = world(&p);
        let t = monday_at(10);
        let e = ask(&p, &w, "reader", "c-reader", "tools/call", Some("x"), t);
        assert!(!e.allowed);
        assert_eq!(e.policies, ["readers-read-only"]);
        assert!(ask(&p, &w, "reader", "c-reader", "tools/list", None, t).allowed);
        assert!(ask(&p, &w, "agent", "c-agent", "tools/call", Some("x"), t).allowed);
    }

    #[test]
    fn tool_deny_list_example() {
        let p = with_examples(&["tool-deny-list"]);
        let w = world(&p);
        let t = monday_at(10);
        for tool in [
            "delete_repo",
            "repo_delete_branch",
            "drop_table",
            "merge_pull_request",
        ] {
            let e = ask(&p, &w, "agent", "c-agent", "tools/call", Some(tool), t);
            assert!(!e.allowed, "{tool}");
            assert_eq!(e.policies, ["no-destructive-tools"]);
        }
        for tool in ["update_issue", "undelete"] {
            assert!(ask(&p, &w, "agent", "c-agent", "tools/call", Some(tool), t).allowed);
        }
    }

    #[test]
    fn group_one_upstream_example() {
        let p = with_examples(&["group-one-upstream"]);
        let w = world(&p);
        let t = monday_at(10);
        assert!(ask(&p, &w, "bot", "c-bot-gh", "tools/call", Some("x"), t).allowed);
        let e = ask(&p, &w, "bot", "c-bot-other", "tools/list", None, t);
        assert!(!e.allowed);
        assert_eq!(e.policies, ["ci-bots-github-only"]);
        assert!(ask(&p, &w, "agent", "c-agent", "tools/list", None, t).allowed);
    }

    #[test]
    fn business_hours_example() {
        let p = with_examples(&["business-hours"]);
        let w = world(&p);
        let call = |t| ask(&p, &w, "agent", "c-agent", "tools/call", Some("x"), t);
        assert!(call(monday_at(8)).allowed);
        assert!(call(monday_at(17)).allowed);
        assert!(!call(monday_at(7)).allowed);
        assert!(!call(monday_at(18)).allowed);
        // Saturday 10:00.
        let e = call(monday_at(5 * 24 + 10));
        assert!(!e.allowed);
        assert_eq!(e.policies, ["tools-in-business-hours"]);
        // Outside hours, listing is still fine.
        assert!(lists(&p, &w, monday_at(22)));
    }

    #[test]
    fn ask_for_writes_example() {
        let p = with_examples(&["ask-for-writes"]);
        let w = world(&p);
        let t = monday_at(10);
        for tool in ["write_file", "create_issue", "send_mail"] {
            let e = ask(&p, &w, "agent", "c-agent", "tools/call", Some(tool), t);
            assert!(e.allowed && e.ask, "{tool}");
            assert!(e.policies.contains(&"ask-for-writes".to_string()));
        }
        let e = ask(&p, &w, "agent", "c-agent", "tools/call", Some("search"), t);
        assert!(e.allowed && !e.ask);
        // Not on someone else's connection: nothing permits it, no asking.
        let e = ask(
            &p,
            &w,
            "agent",
            "c-reader",
            "tools/call",
            Some("write_file"),
            t,
        );
        assert!(!e.allowed && !e.ask);
    }

    #[test]
    fn ask_on_a_forbid_is_refused() {
        let errs = errors_of(&[(
            "a.cedar",
            "@id(\"x\")\n@ask\nforbid (principal, action, resource);\n",
        )]);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].ends_with("a.cedar:2: policy \"x\": @ask applies to permit policies only"),
            "{errs:?}"
        );
    }

    #[test]
    fn ask_learn_lets_a_prediction_answer_unless_a_plain_ask_also_holds() {
        let p = with_examples(&["learn-from-approvals"]);
        let w = world(&p);
        let t = monday_at(10);
        let e = ask(
            &p,
            &w,
            "agent",
            "c-agent",
            "tools/call",
            Some("run_tests"),
            t,
        );
        assert!(e.allowed && e.ask && e.learn, "{e:?}");
        let e = ask(&p, &w, "agent", "c-agent", "tools/call", Some("search"), t);
        assert!(e.allowed && !e.ask && !e.learn, "{e:?}");
        // A plain @ask that also holds the call: a person is asked.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.cedar"),
            "@id(\"plain\")\n@ask\npermit (principal, action, resource);\n\
             @id(\"learnt\")\n@ask(\"learn\")\npermit (principal, action, resource);\n",
        )
        .unwrap();
        let p = Policies::load_dir(dir.path()).unwrap();
        let w = world(&p);
        let e = ask(&p, &w, "agent", "c-agent", "tools/call", Some("x"), t);
        assert!(e.ask && !e.learn, "{e:?}");
    }

    #[test]
    fn an_unknown_ask_value_is_refused() {
        let errs = errors_of(&[(
            "a.cedar",
            "@id(\"x\")\n@ask(\"lern\")\npermit (principal, action, resource);\n",
        )]);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("a.cedar:2: policy \"x\": @ask(\"lern\") is not known"),
            "{errs:?}"
        );
    }

    #[test]
    fn every_example_validates_together() {
        let p = with_examples(&[
            "read-only",
            "tool-deny-list",
            "group-one-upstream",
            "business-hours",
            "ask-for-writes",
            "learn-from-approvals",
        ]);
        assert_eq!(p.len(), 7);
    }

    #[test]
    fn only_the_context_policies_name_is_built() {
        let u = ContextUse::of([BUILTIN_DEFAULT]);
        assert_eq!(u, ContextUse::default());
        let u = ContextUse::of([
            BUILTIN_DEFAULT,
            "forbid (principal, action, resource) when { context has tool && context.tool like \"x*\" };",
        ]);
        assert!(u.tool && !u.time && !u.arguments);
        // The built-in schema itself mentions everything.
        assert!(ContextUse::of([BUILTIN_SCHEMA]).time);
    }

    #[test]
    fn actions_of_requests() {
        use http::Method;
        let a = crate::authz::action_name;
        assert_eq!(a(&Method::GET, None), "stream/open");
        assert_eq!(a(&Method::DELETE, None), "session/end");
        assert_eq!(a(&Method::POST, None), "response");
        assert_eq!(a(&Method::POST, Some("tools/call")), "tools/call");
        assert_eq!(
            a(&Method::POST, Some("notifications/initialized")),
            "notification"
        );
        assert_eq!(a(&Method::POST, Some("sampling/whatever")), "other");
    }

    fn errors_of(files: &[(&str, &str)]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        match Policies::load_dir(dir.path()) {
            Ok(_) => panic!("accepted {files:?}"),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn invalid_sets_are_refused_with_file_line_and_reason() {
        // A syntax error on line 3.
        let e = errors_of(&[(
            "a.cedar",
            "// ok\n\npermit (principal, action, resource) when { };\n",
        )]);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("a.cedar:3: "), "{e:?}");
        // A type error on line 2: an optional attribute read without `has`.
        let e = errors_of(&[(
            "b.cedar",
            "permit (principal, action == Action::\"tools/call\", resource)\nwhen { context.tool == \"x\" };\n",
        )]);
        assert!(e[0].contains("b.cedar:2: "), "{e:?}");
        assert!(e[0].contains("tool"), "{e:?}");
        // An action the schema does not declare, in a second file.
        let e = errors_of(&[
            ("a.cedar", BUILTIN_DEFAULT),
            (
                "c.cedar",
                "\n\nforbid (principal, action == Action::\"tools/cal\", resource);\n",
            ),
        ]);
        assert!(e.iter().any(|l| l.contains("c.cedar:3: ")), "{e:?}");
        // The same @id twice.
        let e = errors_of(&[("a.cedar", BUILTIN_DEFAULT), ("d.cedar", BUILTIN_DEFAULT)]);
        assert!(
            e[0].contains("d.cedar:3: ") && e[0].contains("\"own-connections\" is used twice"),
            "{e:?}"
        );
        // Nothing to load.
        let e = errors_of(&[("notes.txt", "")]);
        assert!(e[0].contains("no .cedar policy files"), "{e:?}");
    }
}
