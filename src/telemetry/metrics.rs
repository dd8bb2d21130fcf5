//! Counters for `/metrics` (Prometheus text format), kept lock-free on the
//! request path: fixed arrays of atomics indexed by status code, refusal
//! reason and latency bucket, so a request costs a few relaxed increments
//! and never an allocation or a lock.
//!
//! The exposition is written by the `prometheus-client` crate: at each
//! scrape a [`Collector`] reads the atomics and hands the values to its
//! encoder (names, help, types, label escaping and histogram buckets are
//! the crate's), so the request path knows nothing of it.
//!
//! Labels are bounded by construction: verdicts and refusal reasons are
//! fixed sets, status codes are 100–599, and the only names used as labels
//! are credential names (token refreshes). Connection ids, tokens and tool
//! arguments never become labels.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// How a request ended, as the requests counter labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Sent to the upstream (its status is the one counted).
    Forwarded = 0,
    /// Answered by tessera itself (a refusal or an upstream failure).
    Refused = 1,
}

const OUTCOMES: [&str; 2] = ["forwarded", "refused"];
const STATUSES: usize = 500; // 100..=599

/// Upper bounds of the latency histograms (upstream, and the whole
/// request), in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

// The counters are an array indexed by the variant, so a new reason is
// counted from the moment it exists (there is no list to forget it in).
labelled! {
    /// Why tessera answered a request itself: one variant per reason, each
    /// with its label in the access log and in `tessera_refusals_total`.
    pub enum Reason {
        Method => "method",
        NotFound => "not_found",
        Origin => "origin",
        Host => "host",
        Unauthenticated => "unauthenticated",
        Denied => "denied",
        Held => "held",
        ApprovalUnavailable => "approval_unavailable",
        AuditUnavailable => "audit_unavailable",
        ToolsList => "tools_list",
        TokenEndpoint => "token_endpoint",
        TooLarge => "too_large",
        Parse => "parse",
        Invalid => "invalid",
        Ambiguous => "ambiguous",
        HeaderMismatch => "header_mismatch",
        VersionMismatch => "version_mismatch",
        SessionUnknown => "session_unknown",
        RequestBody => "request_body",
        UriTooLong => "uri_too_long",
        HeadersTooLarge => "headers_too_large",
        RequestTimeout => "request_timeout",
        Framing => "framing",
        CallerInFlight => "caller_in_flight",
        CallerRate => "caller_rate",
        AuthThrottled => "auth_throttled",
        ApprovalsPendingCap => "approvals_pending_cap",
        UpstreamUnreachable => "upstream_unreachable",
        UpstreamForbidden => "upstream_forbidden",
        UpstreamTls => "upstream_tls",
        UpstreamTimeout => "upstream_timeout",
        CredentialRejected => "credential_rejected",
        UpstreamProtocol => "upstream_protocol",
        UpstreamEncoding => "upstream_encoding",
        PathBackslash => "path_backslash",
        PathEncodedSeparator => "path_encoded_separator",
        PathDoubleEncoding => "path_double_encoding",
        PathBadEscape => "path_bad_escape",
        PathParameter => "path_parameter",
        PathDotSegment => "path_dot_segment",
        PathEmptySegment => "path_empty_segment",
        QueryCredential => "query_credential",
        BodyMemory => "body_memory",
        SourceConnections => "source_connections",
        ConnectionEvicted => "connection_evicted",
        // A `tools/call` of a tool held by pinning (`crate::authz::pins`).
        ToolPinning => "tool_pinning",
    }
}

/// How many reasons there are: the length of the counters' array.
const REASONS: usize = Reason::ALL.len();

/// The process's counters.
pub struct Metrics {
    requests: Box<[[AtomicU64; STATUSES]; 2]>,
    refusals: [AtomicU64; REASONS],
    /// Time to the upstream's response headers.
    upstream_latency: Histogram,
    /// Time from the request's arrival to its answer's headers (when the
    /// access line is written).
    request_duration: Histogram,
    /// Time to write one batch of audit records (its transaction).
    audit_batches: Histogram,
    open_streams: AtomicI64,
    /// The most streams open at once since the last memory release.
    streams_peak: AtomicI64,
    memory_releases: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Token requests by credential and outcome (rare: a lock is fine).
    token_refreshes: Mutex<BTreeMap<(String, bool), u64>>,
    /// How upstream exchanges ended, per credential: read without a lock
    /// on the request path; a credential's first exchange adds its row.
    upstream_outcomes: arc_swap::ArcSwap<foldhash::HashMap<Box<str>, Arc<OutcomeCounts>>>,
    /// Tool definitions seen changed (or new), by credential (rare).
    tool_changes: Mutex<BTreeMap<String, u64>>,
    /// Authorization decisions by action and source ([`Decision`]).
    decisions: [[AtomicU64; DECISION_SOURCES.len()]; DECISION_ACTIONS.len()],
    /// Predictions that failed (and asked a person instead).
    prediction_failures: AtomicU64,
}

/// How an exchange with an upstream ended: the class of its answer's
/// status, or why there was none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// An answer, by its status (1xx and 2xx count as 2xx).
    Status(u16),
    Timeout,
    Unreachable,
    Tls,
    /// The egress rule refused the upstream's address.
    EgressRefused,
    /// A broken HTTP exchange.
    Protocol,
}

/// The `outcome` label of `tessera_upstream_responses`, by index.
const UPSTREAM_OUTCOMES: [&str; 9] = [
    "2xx",
    "3xx",
    "4xx",
    "5xx",
    "timeout",
    "unreachable",
    "tls",
    "egress_refused",
    "protocol",
];

type OutcomeCounts = [AtomicU64; UPSTREAM_OUTCOMES.len()];

impl UpstreamOutcome {
    fn index(self) -> usize {
        match self {
            UpstreamOutcome::Status(s) => match s {
                ..=299 => 0,
                300..=399 => 1,
                400..=499 => 2,
                _ => 3,
            },
            UpstreamOutcome::Timeout => 4,
            UpstreamOutcome::Unreachable => 5,
            UpstreamOutcome::Tls => 6,
            UpstreamOutcome::EgressRefused => 7,
            UpstreamOutcome::Protocol => 8,
        }
    }
}

/// What an authorization decision did, and who made it: the policies (or
/// the external authorizer composed behind them), a person (an approval
/// granted or denied), or a prediction of a person's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub action: DecisionAction,
    pub source: DecisionSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionAction {
    Allow = 0,
    Deny = 1,
    Ask = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionSource {
    Policy = 0,
    Person = 1,
    Prediction = 2,
    /// The external authorizer (`--authorizer-url`), when its answer is
    /// the verdict (it was as strict as the policies, or stricter).
    Authorizer = 3,
    /// Tool pinning: a call of a held tool, refused before the policies
    /// (`crate::authz::pins`).
    Pinning = 4,
}

const DECISION_ACTIONS: [&str; 3] = ["allow", "deny", "ask"];
const DECISION_SOURCES: [&str; 5] = ["policy", "person", "prediction", "authorizer", "pinning"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU64::new(0))
            })),
            refusals: std::array::from_fn(|_| AtomicU64::new(0)),
            upstream_latency: Histogram::default(),
            request_duration: Histogram::default(),
            audit_batches: Histogram::default(),
            open_streams: AtomicI64::new(0),
            streams_peak: AtomicI64::new(0),
            memory_releases: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            token_refreshes: Mutex::new(BTreeMap::new()),
            upstream_outcomes: Default::default(),
            tool_changes: Mutex::new(BTreeMap::new()),
            decisions: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            prediction_failures: AtomicU64::new(0),
        }
    }
}

/// A latency histogram: a count per bucket ([`BUCKETS`], then +Inf) and
/// the sum in microseconds; observing is two relaxed additions.
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us
            .fetch_add(d.as_micros().min(u128::from(u64::MAX)) as u64, Relaxed);
    }

    fn encode(&self, e: &mut DescriptorEncoder, name: &str, help: &str) -> std::fmt::Result {
        let mut buckets = [(0.0, 0); BUCKETS.len() + 1];
        let mut count = 0;
        for (i, b) in buckets.iter_mut().enumerate() {
            let n = self.buckets[i].load(Relaxed);
            *b = (BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), n);
            count += n;
        }
        let sum = self.sum_us.load(Relaxed) as f64 / 1e6;
        e.encode_descriptor(name, help, None, MetricType::Histogram)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }
}

/// The database pool's connections (read from the pool, no query).
#[derive(Debug, Clone, Copy)]
pub struct PoolGauges {
    pub open: u32,
    pub idle: u32,
    pub max: u32,
}

/// Gauges read from elsewhere when `/metrics` is rendered.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    pub audit_queue_depth: usize,
    /// Whether the audit writer's last attempt failed.
    pub audit_failing: bool,
    /// Data-plane connections open, and the cap (`--max-connections`; 0:
    /// none).
    pub connections_open: usize,
    pub connections_max: usize,
    /// Request-body memory held, and the cap (`--max-body-memory`; 0: none).
    pub body_memory_bytes: usize,
    pub body_memory_max_bytes: usize,
}

impl Metrics {
    /// Count one prediction that failed (a person was asked instead).
    pub fn prediction_failed(&self) {
        self.prediction_failures.fetch_add(1, Relaxed);
    }

    /// Count one authorization decision.
    pub fn decision(&self, d: Decision) {
        self.decisions[d.action as usize][d.source as usize].fetch_add(1, Relaxed);
    }

    /// Count one finished request.
    pub fn request(&self, outcome: Outcome, status: u16, refusal: Option<Reason>) {
        if let Some(i) = status
            .checked_sub(100)
            .filter(|&i| usize::from(i) < STATUSES)
        {
            self.requests[outcome as usize][usize::from(i)].fetch_add(1, Relaxed);
        }
        if let Some(r) = refusal {
            self.refusals[r as usize].fetch_add(1, Relaxed);
        }
    }

    /// Time from sending to the upstream until its response headers.
    pub fn upstream_latency(&self, d: Duration) {
        self.upstream_latency.observe(d);
    }

    /// Time from a request's arrival to its answer's headers.
    /// One batch of audit records written, in `d`.
    pub fn audit_batch(&self, d: Duration) {
        self.audit_batches.observe(d);
    }

    pub fn request_duration(&self, d: Duration) {
        self.request_duration.observe(d);
    }

    pub fn bytes_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Relaxed);
    }

    pub fn bytes_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Relaxed);
    }

    /// One more open event stream until the guard is dropped.
    pub fn stream_opened(self: &std::sync::Arc<Self>) -> StreamGuard {
        let open = self.open_streams.fetch_add(1, Relaxed) + 1;
        self.streams_peak.fetch_max(open, Relaxed);
        StreamGuard(self.clone())
    }

    /// One token request for `credential`, and whether it succeeded.
    /// How an exchange with `credential`'s upstream ended. The label set
    /// is bounded by the credentials an admin registered (a deleted one's
    /// row stays until the process restarts).
    pub fn upstream_outcome(&self, credential: &str, outcome: UpstreamOutcome) {
        let i = outcome.index();
        if let Some(c) = self.upstream_outcomes.load().get(credential) {
            c[i].fetch_add(1, Relaxed);
            return;
        }
        // A credential's first exchange since start: add its row (rare;
        // concurrent first exchanges agree on one row).
        self.upstream_outcomes.rcu(|m| {
            let mut m = foldhash::HashMap::clone(m);
            m.entry(credential.into())
                .or_insert_with(|| Arc::new(std::array::from_fn(|_| AtomicU64::new(0))));
            m
        });
        if let Some(c) = self.upstream_outcomes.load().get(credential) {
            c[i].fetch_add(1, Relaxed);
        }
    }

    pub fn token_refresh(&self, credential: &str, ok: bool) {
        let mut m = self
            .token_refreshes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *m.entry((credential.to_string(), ok)).or_default() += 1;
    }

    /// One tool definition of `credential` seen changed or new (once per
    /// digest: `crate::authz::pins`).
    pub fn tool_change(&self, credential: &str) {
        let mut m = self.tool_changes.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(credential.to_string()).or_default() += 1;
    }

    /// Open event streams now.
    pub fn open_streams(&self) -> i64 {
        self.open_streams.load(Relaxed)
    }

    /// The most streams open at once since the last reset, and now.
    pub fn streams_peak(&self) -> (i64, i64) {
        let now = self.open_streams();
        (self.streams_peak.load(Relaxed).max(now), now)
    }

    /// The high-water mark starts again from the streams open now.
    pub fn reset_streams_peak(&self) {
        self.streams_peak.store(self.open_streams(), Relaxed);
    }

    /// Free memory was returned to the system (`memory`).
    pub fn memory_released(&self) {
        self.memory_releases.fetch_add(1, Relaxed);
    }

    /// The Prometheus text exposition (format 0.0.4), written by
    /// `prometheus-client` from the counters as they are now.
    pub fn render(self: &Arc<Self>, g: &Gauges) -> String {
        self.render_with_pool(g, None)
    }

    /// [`Metrics::render`], with the database pool's gauges.
    pub fn render_with_pool(self: &Arc<Self>, g: &Gauges, pool: Option<PoolGauges>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape {
            metrics: self.clone(),
            gauges: g.clone(),
            pool,
        }));
        let mut o = String::with_capacity(8192);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut o, &registry);
        o
    }

    fn encode(&self, e: &mut DescriptorEncoder, g: &Gauges) -> std::fmt::Result {
        let mut m = e.encode_descriptor(
            "tessera_requests",
            "Requests to connection addresses, by outcome and the status answered.",
            None,
            MetricType::Counter,
        )?;
        for (k, row) in self.requests.iter().enumerate() {
            for (i, c) in row.iter().enumerate() {
                let n = c.load(Relaxed);
                if n > 0 {
                    let mut status = itoa::Buffer::new();
                    let labels = [("outcome", OUTCOMES[k]), ("status", status.format(i + 100))];
                    ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        let mut m = e.encode_descriptor(
            "tessera_refusals",
            "Requests tessera answered itself, by reason.",
            None,
            MetricType::Counter,
        )?;
        for (r, c) in Reason::ALL.iter().zip(&self.refusals) {
            ConstCounter::new(c.load(Relaxed))
                .encode(m.encode_family(&[("reason", r.as_str())])?)?;
        }
        self.upstream_latency.encode(
            e,
            "tessera_upstream_latency_seconds",
            "Time from sending a request upstream to its response headers.",
        )?;
        self.request_duration.encode(
            e,
            "tessera_request_duration_seconds",
            "Time from a request's arrival to its answer's headers (a stream's own length not included), refusals too.",
        )?;
        self.audit_batches.encode(
            e,
            "tessera_audit_batch_duration_seconds",
            "Time to write one batch of audit records (one transaction), written ones only: failed attempts are in tessera_audit_write_failing and the log.",
        )?;
        gauge(
            e,
            "tessera_open_streams",
            "Event streams (SSE) open through tessera.",
            self.open_streams(),
        )?;
        counter(
            e,
            "tessera_memory_releases",
            "Times free memory was returned to the system after a wave of streams closed.",
            self.memory_releases.load(Relaxed),
        )?;
        let mut m = e.encode_descriptor(
            "tessera_bytes",
            "Body bytes: requests in from callers, responses out to them.",
            None,
            MetricType::Counter,
        )?;
        for (direction, c) in [("in", &self.bytes_in), ("out", &self.bytes_out)] {
            ConstCounter::new(c.load(Relaxed))
                .encode(m.encode_family(&[("direction", direction)])?)?;
        }
        let mut m = e.encode_descriptor(
            "tessera_token_refreshes",
            "OAuth token requests, by credential and outcome.",
            None,
            MetricType::Counter,
        )?;
        let refreshes: Vec<((String, bool), u64)> = self
            .token_refreshes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        for ((cred, ok), n) in &refreshes {
            let outcome = if *ok { "ok" } else { "failed" };
            let labels = [("credential", cred.as_str()), ("outcome", outcome)];
            ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
        }
        let mut m = e.encode_descriptor(
            "tessera_upstream_responses",
            "Exchanges with upstreams, by credential and outcome: the answer's status class, or why there was none (timeout, unreachable, tls, egress_refused, protocol).",
            None,
            MetricType::Counter,
        )?;
        let outcomes = self.upstream_outcomes.load();
        let mut credentials: Vec<&Box<str>> = outcomes.keys().collect();
        credentials.sort();
        for cred in credentials {
            for (o, c) in UPSTREAM_OUTCOMES.iter().zip(outcomes[cred].iter()) {
                let n = c.load(Relaxed);
                if n > 0 {
                    let labels = [("credential", &**cred), ("outcome", *o)];
                    ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        let mut m = e.encode_descriptor(
            "tessera_tool_changes",
            "Tool definitions seen differing from their pin (or new), by credential: each is held until an admin reviews it.",
            None,
            MetricType::Counter,
        )?;
        let changes: Vec<(String, u64)> = self
            .tool_changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        for (cred, n) in &changes {
            ConstCounter::new(*n).encode(m.encode_family(&[("credential", cred.as_str())])?)?;
        }
        let mut m = e.encode_descriptor(
            "tessera_decisions",
            "Authorization decisions, by action (allow, deny, ask) and source (policy, person, prediction, authorizer, pinning).",
            None,
            MetricType::Counter,
        )?;
        for (a, row) in DECISION_ACTIONS.iter().zip(&self.decisions) {
            for (s, c) in DECISION_SOURCES.iter().zip(row) {
                let labels = [("action", *a), ("source", *s)];
                ConstCounter::new(c.load(Relaxed)).encode(m.encode_family(&labels)?)?;
            }
        }
        counter(
            e,
            "tessera_prediction_failures",
            "Predictions of a person's answer that failed (deadline, predictor, database): each asked a person instead.",
            self.prediction_failures.load(Relaxed),
        )?;
        gauge(
            e,
            "tessera_audit_queue_depth",
            "Audit records queued for the writer.",
            g.audit_queue_depth as i64,
        )?;
        gauge(
            e,
            "tessera_audit_write_failing",
            "1 while the audit writer's last write to the database failed.",
            i64::from(g.audit_failing),
        )
    }
}

/// One scrape: the counters, read as the encoder asks, and the gauges
/// read from elsewhere just before.
struct Scrape {
    metrics: Arc<Metrics>,
    gauges: Gauges,
    pool: Option<PoolGauges>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape")
            .field("gauges", &self.gauges)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        self.metrics.encode(&mut e, &self.gauges)?;
        for (name, help, v) in [
            (
                "tessera_connections_open",
                "Data-plane connections open now.",
                self.gauges.connections_open,
            ),
            (
                "tessera_connections_max",
                "The cap on data-plane connections (--max-connections; 0: none).",
                self.gauges.connections_max,
            ),
            (
                "tessera_body_memory_bytes",
                "Memory held by request bodies being read, across all requests.",
                self.gauges.body_memory_bytes,
            ),
            (
                "tessera_body_memory_max_bytes",
                "The cap on request-body memory (--max-body-memory; 0: none).",
                self.gauges.body_memory_max_bytes,
            ),
        ] {
            gauge(&mut e, name, help, v as i64)?;
        }
        if let Some(p) = self.pool {
            gauge(
                &mut e,
                "tessera_db_pool_connections",
                "Connections the database pool holds open (in use and idle).",
                i64::from(p.open),
            )?;
            gauge(
                &mut e,
                "tessera_db_pool_idle_connections",
                "Connections the database pool holds idle.",
                i64::from(p.idle),
            )?;
            gauge(
                &mut e,
                "tessera_db_pool_max_connections",
                "The most connections the database pool opens (--db-pool-size).",
                i64::from(p.max),
            )?;
        }
        Ok(())
    }
}

/// Keeps one stream counted as open.
pub struct StreamGuard(std::sync::Arc<Metrics>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.open_streams.fetch_sub(1, Relaxed);
    }
}

/// A counter without labels; `name` without `_total`, which the encoder adds.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_and_label() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r}");
        }
        let labels: std::collections::BTreeSet<_> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), Reason::ALL.len(), "two reasons share a label");
        let m = Arc::new(Metrics::default());
        for r in Reason::ALL {
            m.request(Outcome::Refused, 400, Some(*r));
        }
        let text = m.render(&Gauges {
            audit_queue_depth: 0,
            audit_failing: false,
            ..Default::default()
        });
        for r in Reason::ALL {
            assert!(
                text.contains(&format!("tessera_refusals_total{{reason=\"{r}\"}} 1\n")),
                "{r} uncounted"
            );
        }
    }

    #[test]
    fn renders_counts_buckets_and_gauges() {
        let m = std::sync::Arc::new(Metrics::default());
        m.request(Outcome::Forwarded, 200, None);
        m.request(Outcome::Forwarded, 200, None);
        m.request(Outcome::Refused, 401, Some(Reason::Unauthenticated));
        m.request(Outcome::Refused, 999, None); // out of range: dropped
        m.upstream_latency(Duration::from_micros(700));
        m.upstream_latency(Duration::from_secs(60));
        m.request_duration(Duration::from_millis(3));
        m.bytes_in(10);
        m.bytes_out(25);
        m.token_refresh("gh", true);
        m.token_refresh("gh", false);
        m.decision(Decision {
            action: DecisionAction::Allow,
            source: DecisionSource::Prediction,
        });
        m.prediction_failed();
        let guard = m.stream_opened();
        let text = m.render(&Gauges {
            audit_queue_depth: 3,
            audit_failing: false,
            connections_open: 2,
            connections_max: 100,
            body_memory_bytes: 4096,
            body_memory_max_bytes: 1 << 20,
        });
        for line in [
            "tessera_requests_total{outcome=\"forwarded\",status=\"200\"} 2",
            "tessera_requests_total{outcome=\"refused\",status=\"401\"} 1",
            "tessera_refusals_total{reason=\"unauthenticated\"} 1",
            "tessera_refusals_total{reason=\"denied\"} 0",
            "tessera_upstream_latency_seconds_bucket{le=\"0.0005\"} 0",
            "tessera_upstream_latency_seconds_bucket{le=\"0.001\"} 1",
            "tessera_upstream_latency_seconds_bucket{le=\"10\"} 1",
            "tessera_upstream_latency_seconds_bucket{le=\"+Inf\"} 2",
            "tessera_upstream_latency_seconds_count 2",
            "# TYPE tessera_request_duration_seconds histogram",
            "tessera_request_duration_seconds_bucket{le=\"0.0025\"} 0",
            "tessera_request_duration_seconds_bucket{le=\"0.005\"} 1",
            "tessera_request_duration_seconds_bucket{le=\"+Inf\"} 1",
            "tessera_request_duration_seconds_sum 0.003",
            "tessera_request_duration_seconds_count 1",
            "# TYPE tessera_requests_total counter",
            "tessera_open_streams 1",
            "tessera_bytes_total{direction=\"in\"} 10",
            "tessera_bytes_total{direction=\"out\"} 25",
            "tessera_token_refreshes_total{credential=\"gh\",outcome=\"ok\"} 1",
            "tessera_token_refreshes_total{credential=\"gh\",outcome=\"failed\"} 1",
            "tessera_audit_queue_depth 3",
            "tessera_connections_open 2",
            "tessera_connections_max 100",
            "tessera_body_memory_bytes 4096",
            "tessera_body_memory_max_bytes 1048576",
            "tessera_decisions_total{action=\"allow\",source=\"prediction\"} 1",
            "tessera_decisions_total{action=\"allow\",source=\"policy\"} 0",
            "tessera_prediction_failures_total 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("status=\"999\""));
        drop(guard);
        assert_eq!(m.open_streams(), 0);
    }
}
