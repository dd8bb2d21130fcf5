//! Configuration of the data plane: a validated `ServeConfig` built by a
//! pure function from the values the command line and environment gave,
//! so that bad settings stop the process before any port is bound, with a
//! message naming the setting.

use std::net::SocketAddr;
use std::time::Duration;

use url::Url;

/// Defaults, in one place.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7470";
/// The admin API's listener: loopback, next to the data plane's port.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:7471";
/// The ops listener (`/livez`, `/readyz`, `/metrics`): loopback, the next
/// port. Always on unless set to `off`.
pub const DEFAULT_OPS_LISTEN: &str = "127.0.0.1:7472";
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
pub const DEFAULT_AUDIT_QUEUE: usize = 4096;
/// The default for `--db-timeout-ms`.
pub const DEFAULT_DB_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_AUTHORIZER_TIMEOUT_MS: u64 = 2_000;
pub const DEFAULT_TOOLS_LIST_MAX_BYTES: usize = 4 * 1024 * 1024;
/// The default for `--max-pending-approvals`: more calls than a person
/// reviews at one sitting, far fewer than would bury the console.
pub const DEFAULT_MAX_PENDING_APPROVALS: u32 = 50;
/// The default for `--approval-ttl` (see `authz::approvals::DEFAULT_TTL`).
pub const DEFAULT_APPROVAL_TTL: &str = "24h";

/// A setting that cannot be used, named by its flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--public-url {0:?} is not an absolute http(s) URL without path, query or fragment")]
    PublicUrl(String),
    #[error("--allowed-origin {0:?} is not an origin (scheme://host[:port])")]
    Origin(String),
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    #[error("--authorizer-url {0:?} is not an absolute http(s) URL")]
    AuthorizerUrl(String),
    #[error("--approval-ttl {0:?}: give a number and a unit: 30m, 24h, 7d")]
    ApprovalTtl(String),
    /// The URL is not echoed: a webhook URL often carries a secret.
    #[error("--approval-webhook is not an absolute http(s) URL with a host")]
    ApprovalWebhook,
    #[error("--authorizer-failure {0:?}: use deny or ask")]
    AuthorizerFailure(String),
    #[error("--caller-rate {0} must be a number of requests per second, 0 or more")]
    Rate(String),
    #[error("--upstream-roots {0:?}: use webpki (the Mozilla roots built in) or platform (the system's store)")]
    Roots(String),
    #[error(
        "--upstream-roots platform: no certificate could be read from the system's store ({0})"
    )]
    NoPlatformRoots(String),
    #[error("--upstream-ca-file {0}: {1}")]
    CaFile(String, String),
    #[error("--pin-tools {0:?}: use off (no pinning), tofu (the first tools/list answer of a credential pins its tools) or strict (an admin accepts every tool)")]
    PinTools(String),
    #[error("--forwarded {0:?}: use off (tessera says nothing of the caller) or set (tessera sets Forwarded and X-Forwarded-For)")]
    Forwarded(String),
    /// The costs' thresholds cross, or a cost is not a positive number
    /// (the message names the settings).
    #[error("{0}")]
    Costs(String),
    /// The URL is not echoed: it may carry a secret.
    #[error("--predictor-url is not an absolute http(s) URL with a host")]
    PredictorUrl,
    #[error("--predict-half-life {0:?}: give a number and a unit: 12h, 30d")]
    HalfLife(String),
    #[error("--max-body-memory {0} is less than --max-body-bytes {1}: a body of the largest size allowed could never be read")]
    BodyMemory(usize, usize),
}

/// Limits on one request and on one caller's use (see [`crate::limits`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLimits {
    /// Header fields in a request (431 above).
    pub max_headers: usize,
    /// Bytes of header names and values together (431 above).
    pub max_header_bytes: usize,
    /// Bytes of the request target (414 above).
    pub max_uri_bytes: usize,
    /// A request head that takes longer is cut off (the connection closed).
    pub header_timeout: Duration,
    /// A request body that takes longer is refused (408).
    pub body_timeout: Duration,
    /// Messages in a 2025-03-26 JSON-RPC batch (400 above).
    pub max_batch: usize,
    pub caller: crate::limits::CallerLimits,
}

pub const DEFAULT_MAX_HEADERS: usize = 100;
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
pub const DEFAULT_MAX_URI_BYTES: usize = 8 * 1024;
pub const DEFAULT_MAX_BATCH: usize = 100;
pub const DEFAULT_CALLER_MAX_IN_FLIGHT: u32 = 256;
pub const DEFAULT_CALLER_RATE: f64 = 100.0;
pub const DEFAULT_CALLER_BURST: u32 = 200;
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 90_000;
pub const DEFAULT_REFRESH_MS: u64 = 250;
pub const DEFAULT_TOKEN_MARGIN_S: u64 = 60;
pub const DEFAULT_TOKEN_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_FORWARDED: &str = "off";
pub const DEFAULT_PIN_TOOLS: &str = "tofu";
pub const DEFAULT_UPSTREAM_ROOTS: &str = "webpki";
pub const DEFAULT_AUTHORIZER_FAILURE: &str = "deny";
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_POLICY_CHECK_MS: u64 = 1_000;

/// What a failed external authorizer (timeout, connection error, non-2xx,
/// malformed answer) means. Never allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    Deny,
    Ask,
}

/// The external authorizer consulted after the policies allow or ask.
#[derive(Debug, Clone)]
pub struct AuthorizerConfig {
    pub url: Url,
    pub timeout: Duration,
    pub on_failure: OnFailure,
}

/// The settings `tessera serve` runs with.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// The base of every connection URL handed to agents.
    pub public_url: Url,
    /// Browser origins allowed to call tessera; requests with any other
    /// `Origin` get 403. Requests without `Origin` (non-browser) pass.
    pub allowed_origins: Vec<String>,
    pub max_body_bytes: usize,
    /// Data-plane connections open at once, in total and per source
    /// address (0: no limit; see [`crate::limits::capacity`]).
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    /// Bytes of request bodies held at once across all requests (503
    /// above; 0: no limit).
    pub max_body_memory: usize,
    /// Whether internal addresses and plain HTTP may be reached upstream
    /// (`--allow-private-upstreams`; see [`crate::upstream::egress`]).
    pub egress: crate::upstream::egress::Egress,
    /// Whether a caller's `Range` and `If-Range` reach the upstream
    /// (`--allow-range`; see [`crate::proxy::forward::strip_and_inject`]).
    pub allow_range: bool,
    /// Whether tessera tells the upstream the caller's address in
    /// `Forwarded` and `X-Forwarded-For` (`--forwarded set`; a caller's
    /// own are always stripped: see [`crate::proxy::forward::set_forwarded`]).
    pub forwarded: bool,
    pub limits: RequestLimits,
    /// The certificate authorities upstream TLS trusts (`--upstream-roots`
    /// and `--upstream-ca-file`).
    pub upstream_roots: std::sync::Arc<rustls::RootCertStore>,
    pub connect_timeout: Duration,
    /// How long to wait for an upstream's response headers (504 after).
    pub upstream_timeout: Duration,
    /// How long a pooled upstream connection may sit idle before closing.
    pub idle_timeout: Duration,
    /// How often the store's revision is polled for changes.
    pub refresh_interval: Duration,
    /// Keep tool arguments in the audit trail (else only their SHA-256).
    pub audit_arguments: bool,
    /// Audit records that may wait for the writer before requests wait.
    pub audit_queue: usize,
    /// The longest a database operation of the serving process may take
    /// (approvals, the audit writer, snapshot reloads) before it counts as
    /// failed: a database that hangs fails closed like one that refuses.
    pub db_timeout: Duration,
    pub authorizer: Option<AuthorizerConfig>,
    /// Approvals one caller may have pending; a call that would add one
    /// more is refused (429). 0: no limit.
    pub max_pending_approvals: u32,
    /// How long a pending approval waits for a person before it expires.
    pub approval_ttl: Duration,
    /// How long a held call waits for a decision before it is answered
    /// "pending" (zero: it is answered at once).
    pub approval_wait: Duration,
    /// Where each new pending approval is posted (`--approval-webhook`).
    pub approval_webhook: Option<Url>,
    /// The largest `tools/list` answer tessera parses to filter (502 above).
    pub tools_list_max_bytes: usize,
    /// Tool pinning (`--pin-tools`; see [`crate::authz::pins`]).
    pub pin_tools: PinMode,
    /// An OAuth token is refreshed when it expires within this.
    pub token_margin: Duration,
    /// The whole token request, connect to answer.
    pub token_timeout: Duration,
    /// Approvals that learn: costs, deadline, predictor, forgetting.
    pub predict: PredictSettings,
}

/// Tool pinning (`--pin-tools`; see [`crate::authz::pins`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinMode {
    /// Tools are listed and called as the upstream offers them.
    Off,
    /// Trust on first use: a credential's first tools/list answer pins
    /// its tools; later changes and additions wait for an admin.
    Tofu,
    /// Every tool waits for an admin.
    Strict,
}

impl PinMode {
    /// As `--pin-tools` spells it.
    pub fn name(self) -> &'static str {
        match self {
            PinMode::Off => "off",
            PinMode::Tofu => "tofu",
            PinMode::Strict => "strict",
        }
    }
}

/// The serve settings as given (flag > environment > settings file >
/// default; clap merged them), validated by [`parse_serve`]. The one list of
/// the data plane's settings: `tessera serve` and `tessera config check`
/// take their flags from it, and their defaults are the constants above.
/// The few settings of the process around it (admin listener, shutdown
/// grace, policy folder and its check interval, worker threads, log format)
/// are the binary's `ServeArgs`, handed to `serve::Process`.
#[derive(Debug, Clone, clap::Args)]
pub struct RawServe {
    /// The data plane's address: IP:PORT, or localhost:PORT (127.0.0.1).
    #[arg(long, env = "TESSERA_LISTEN", default_value = DEFAULT_LISTEN, value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Base of the connection URLs handed to agents (default: from --listen).
    #[arg(long, env = "TESSERA_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// A browser origin allowed to call tessera (repeatable; env: comma-separated).
    #[arg(
        long = "allowed-origin",
        env = "TESSERA_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// The largest request body read, in bytes; larger is refused (413).
    #[arg(long, env = "TESSERA_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Data-plane connections open at once (default: half the descriptor
    /// limit left after 64; 0: no limit). Over it, the
    /// oldest idle connection makes room, else new ones wait.
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Data-plane connections one source address (an IPv6 /64) may have
    /// open (default: half of --max-connections; 0: no limit). Over it,
    /// the source's oldest idle connection makes room, else 503.
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS_PER_SOURCE")]
    pub max_connections_per_source: Option<usize>,
    /// Bytes of request bodies held in memory at once, across all requests
    /// (default: 256 MiB, or --max-body-bytes if larger; 0: no limit).
    /// Over it, 503 with Retry-After.
    #[arg(long, env = "TESSERA_MAX_BODY_MEMORY")]
    pub max_body_memory: Option<usize>,
    /// Header fields a request may carry (431 above).
    #[arg(long, env = "TESSERA_MAX_HEADERS", default_value_t = DEFAULT_MAX_HEADERS)]
    pub max_headers: usize,
    /// Bytes of header names and values a request may carry (431 above).
    #[arg(long, env = "TESSERA_MAX_HEADER_BYTES", default_value_t = DEFAULT_MAX_HEADER_BYTES)]
    pub max_header_bytes: usize,
    /// Bytes of a request target (414 above).
    #[arg(long, env = "TESSERA_MAX_URI_BYTES", default_value_t = DEFAULT_MAX_URI_BYTES)]
    pub max_uri_bytes: usize,
    /// A request head not complete within this is cut off (connection
    /// closed): the slow-headers defence.
    #[arg(long, env = "TESSERA_HEADER_TIMEOUT_MS", default_value_t = DEFAULT_HEADER_TIMEOUT_MS)]
    pub header_timeout_ms: u64,
    /// A request body not complete within this is refused (408).
    #[arg(long, env = "TESSERA_BODY_TIMEOUT_MS", default_value_t = DEFAULT_BODY_TIMEOUT_MS)]
    pub body_timeout_ms: u64,
    /// Messages in one JSON-RPC batch (2025-03-26; 400 above).
    #[arg(long, env = "TESSERA_MAX_BATCH", default_value_t = DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// Requests (streams included) one caller may have open at once (429
    /// above; 0: no limit).
    #[arg(long, env = "TESSERA_CALLER_MAX_IN_FLIGHT", default_value_t = DEFAULT_CALLER_MAX_IN_FLIGHT)]
    pub caller_max_in_flight: u32,
    /// Requests per second one caller may make, sustained (429 above; 0:
    /// no limit).
    #[arg(long, env = "TESSERA_CALLER_RATE", default_value_t = DEFAULT_CALLER_RATE)]
    pub caller_rate: f64,
    /// Requests one caller may make at once above its rate.
    #[arg(long, env = "TESSERA_CALLER_BURST", default_value_t = DEFAULT_CALLER_BURST)]
    pub caller_burst: u32,
    /// Upstream TCP (and TLS) connect timeout.
    #[arg(long, env = "TESSERA_CONNECT_TIMEOUT_MS", default_value_t = DEFAULT_CONNECT_TIMEOUT_MS)]
    pub connect_timeout_ms: u64,
    /// How long to wait for an upstream's response headers (504 after).
    #[arg(long, env = "TESSERA_UPSTREAM_TIMEOUT_MS", default_value_t = DEFAULT_UPSTREAM_TIMEOUT_MS)]
    pub upstream_timeout_ms: u64,
    /// How long an idle pooled upstream connection is kept.
    #[arg(long, env = "TESSERA_IDLE_TIMEOUT_MS", default_value_t = DEFAULT_IDLE_TIMEOUT_MS)]
    pub idle_timeout_ms: u64,
    /// How often the store is polled for changes made by other processes.
    #[arg(long, env = "TESSERA_REFRESH_MS", default_value_t = DEFAULT_REFRESH_MS)]
    pub refresh_ms: u64,
    /// Keep tool-call arguments in the audit trail (default: only their
    /// SHA-256).
    #[arg(long, env = "TESSERA_AUDIT_ARGUMENTS", value_parser = clap::builder::BoolishValueParser::new())]
    pub audit_arguments: bool,
    /// Allow upstreams (and OAuth token URLs) on loopback, private,
    /// link-local or metadata addresses, and over plain http://. Off by
    /// default: a sidecar whose upstream runs on the same host needs it
    #[arg(long, env = "TESSERA_ALLOW_PRIVATE_UPSTREAMS", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_private_upstreams: bool,
    /// Pass a caller's Range and If-Range headers to the upstream (default:
    /// stripped, so that slices of an answer cannot be joined around the
    /// redaction of the stored secret).
    #[arg(long, env = "TESSERA_ALLOW_RANGE", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_range: bool,
    /// Tell the upstream the caller's address: off (nothing), or set
    /// (tessera sets Forwarded: for=<peer>;proto=http and X-Forwarded-For:
    /// <peer>). A caller's own forwarding headers are stripped either way.
    #[arg(long, env = "TESSERA_FORWARDED", default_value = DEFAULT_FORWARDED, value_parser = ["off", "set"])]
    pub forwarded: String,
    /// The certificate authorities upstream TLS trusts: webpki (the Mozilla
    /// roots built in) or platform (the system's store).
    #[arg(long, env = "TESSERA_UPSTREAM_ROOTS", default_value = DEFAULT_UPSTREAM_ROOTS)]
    pub upstream_roots: String,
    /// A PEM bundle of certificate authorities trusted for upstream TLS
    /// besides --upstream-roots (a private CA).
    #[arg(long, env = "TESSERA_UPSTREAM_CA_FILE")]
    pub upstream_ca_file: Option<String>,
    /// Audit records queued for the writer before requests wait for room.
    #[arg(long, env = "TESSERA_AUDIT_QUEUE", default_value_t = DEFAULT_AUDIT_QUEUE)]
    pub audit_queue: usize,
    /// The longest a database operation of the serving process may take
    /// before it counts as failed: held calls then get 503, the audit
    /// writer retries, and the snapshot in memory keeps serving.
    #[arg(long, env = "TESSERA_DB_TIMEOUT_MS", default_value_t = DEFAULT_DB_TIMEOUT_MS)]
    pub db_timeout_ms: u64,
    /// An external authorizer, asked after the policies allow or ask: it
    /// gets a JSON description of the request and answers
    /// {"decision": "allow"|"deny"|"ask", "reason": "..."}.
    #[arg(long, env = "TESSERA_AUTHORIZER_URL")]
    pub authorizer_url: Option<String>,
    /// How long to wait for the external authorizer's answer.
    #[arg(long, env = "TESSERA_AUTHORIZER_TIMEOUT_MS", default_value_t = DEFAULT_AUTHORIZER_TIMEOUT_MS)]
    pub authorizer_timeout_ms: u64,
    /// What a failed authorizer (timeout, error, non-2xx, bad answer)
    /// means: deny, or ask a person. Never allow.
    #[arg(long, env = "TESSERA_AUTHORIZER_FAILURE", default_value = DEFAULT_AUTHORIZER_FAILURE, value_parser = ["deny", "ask"])]
    pub authorizer_failure: String,
    /// Calls one caller may have waiting for a person's approval; a call
    /// that would wait beyond that is refused (429). 0: no limit.
    #[arg(long, env = "TESSERA_MAX_PENDING_APPROVALS", default_value_t = DEFAULT_MAX_PENDING_APPROVALS)]
    pub max_pending_approvals: u32,
    /// How long a pending approval waits for a person before it expires
    /// and can no longer be granted: 30m, 24h, 7d.
    #[arg(long, env = "TESSERA_APPROVAL_TTL", default_value = DEFAULT_APPROVAL_TTL)]
    pub approval_ttl: String,
    /// How long a held call waits for a person's decision before it is
    /// answered "pending" (0: at once). A grant within the wait runs the
    /// call; a denial is answered.
    #[arg(long, env = "TESSERA_APPROVAL_WAIT_MS", default_value_t = 0)]
    pub approval_wait_ms: u64,
    /// Post each new pending approval as JSON to this URL (Slack-compatible
    /// `text` plus structured fields). The upstream SSRF rule applies to it
    /// unless --allow-private-upstreams.
    #[arg(long, env = "TESSERA_APPROVAL_WEBHOOK")]
    pub approval_webhook: Option<String>,
    /// The largest tools/list answer tessera reads to filter it (502 above).
    #[arg(long, env = "TESSERA_TOOLS_LIST_MAX_BYTES", default_value_t = DEFAULT_TOOLS_LIST_MAX_BYTES)]
    pub tools_list_max_bytes: usize,
    /// Tool pinning: off; tofu (the first tools/list answer seen for a
    /// credential pins its tools, and a tool changed or added later is
    /// hidden and its calls refused until an admin accepts it); or strict
    /// (every tool waits for an admin: `tessera tool accept`).
    #[arg(long, env = "TESSERA_PIN_TOOLS", default_value = DEFAULT_PIN_TOOLS, value_parser = ["off", "tofu", "strict"])]
    pub pin_tools: String,
    /// Refresh an OAuth token when it expires within this many seconds.
    #[arg(long, env = "TESSERA_TOKEN_MARGIN_S", default_value_t = DEFAULT_TOKEN_MARGIN_S)]
    pub token_margin_s: u64,
    /// How long a token request may take (502 after).
    #[arg(long, env = "TESSERA_TOKEN_TIMEOUT_MS", default_value_t = DEFAULT_TOKEN_TIMEOUT_MS)]
    pub token_timeout_ms: u64,
    #[command(flatten)]
    pub predict: PredictArgs,
    /// The process's descriptor limit, when it has one (read by `serve`,
    /// not a setting).
    #[arg(skip)]
    pub open_files: Option<u64>,
}

/// The public URL from the listen address when none was given: an
/// unspecified bind address (0.0.0.0, ::) is shown as loopback.
pub fn default_public_url(listen: SocketAddr) -> Url {
    let host = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    Url::parse(&format!("http://{host}:{}", listen.port())).expect("a socket address is a URL host")
}

/// The base of connection URLs: `--public-url` when given, else from
/// `--listen`. `serve` and `connection add` both take it from here, from
/// the same settings, so the URL printed is the one served.
pub fn public_url(listen: SocketAddr, given: Option<&str>) -> Result<Url, ConfigError> {
    match given {
        Some(s) => parse_public_url(s),
        None => Ok(default_public_url(listen)),
    }
}

/// A listen address: `IP:PORT`, or `localhost:PORT`, which is loopback
/// (127.0.0.1) without asking a resolver: a listener's address is decided
/// here, not by whatever `/etc/hosts` says.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{s:?}: the port must be a number from 0 to 65535"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| {
        format!("{s:?}: give IP:PORT (127.0.0.1:7470, [::1]:7470, 0.0.0.0:7470) or localhost:PORT")
    })
}

/// A listener that may be turned off: an address as [`parse_listen`] reads
/// it, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalListen(pub Option<SocketAddr>);

/// `off`, or an address as [`parse_listen`] reads it.
pub fn parse_optional_listen(s: &str) -> Result<OptionalListen, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(OptionalListen(None));
    }
    parse_listen(s)
        .map(|a| OptionalListen(Some(a)))
        .map_err(|e| format!("{e}, or off"))
}

/// Validate a public URL: http(s), a host, no path beyond `/`, no query.
pub fn parse_public_url(s: &str) -> Result<Url, ConfigError> {
    let err = || ConfigError::PublicUrl(crate::wire::query::shown_str(s));
    let u = Url::parse(s.trim_end_matches('/')).map_err(|_| err())?;
    let ok = matches!(u.scheme(), "http" | "https")
        && u.host().is_some()
        && u.path() == "/"
        && u.query().is_none()
        && u.fragment().is_none()
        && u.username().is_empty()
        && u.password().is_none();
    ok.then_some(u).ok_or_else(err)
}

/// Normalise an origin to `scheme://host[:port]`, lowercase.
fn parse_origin(s: &str) -> Result<String, ConfigError> {
    let err = || ConfigError::Origin(crate::wire::query::shown_str(s));
    let u = Url::parse(s).map_err(|_| err())?;
    if u.path() != "/" || u.query().is_some() || u.host().is_none() {
        return Err(err());
    }
    Ok(u.origin().ascii_serialization())
}

/// The roots upstream TLS trusts: the built-in Mozilla set (`webpki`) or
/// the system's store (`platform`), plus every certificate of `ca_file`
/// (PEM), for upstreams behind a private CA.
pub fn upstream_roots(
    which: &str,
    ca_file: Option<&str>,
) -> Result<rustls::RootCertStore, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    match which {
        "webpki" => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        "platform" => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or("none found".to_string(), |e| e.to_string());
                return Err(ConfigError::NoPlatformRoots(why));
            }
        }
        other => return Err(ConfigError::Roots(other.to_string())),
    }
    if let Some(path) = ca_file {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let bad = |why: String| ConfigError::CaFile(path.to_string(), why);
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in it".into()));
        }
        for c in certs {
            roots.add(c).map_err(|e| bad(e.to_string()))?;
        }
    }
    Ok(roots)
}

/// Build the validated config.
pub fn parse_serve(raw: RawServe) -> Result<ServeConfig, ConfigError> {
    let public_url = public_url(raw.listen, raw.public_url.as_deref())?;
    let allowed_origins = raw
        .allowed_origins
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_origin)
        .collect::<Result<_, _>>()?;
    let ms = |v: u64, name| {
        if v == 0 {
            Err(ConfigError::Zero(name))
        } else {
            Ok(Duration::from_millis(v))
        }
    };
    if raw.max_body_bytes == 0 {
        return Err(ConfigError::Zero("--max-body-bytes"));
    }
    if raw.tools_list_max_bytes == 0 {
        return Err(ConfigError::Zero("--tools-list-max-bytes"));
    }
    let max_connections = raw
        .max_connections
        .unwrap_or_else(|| crate::limits::capacity::default_max_connections(raw.open_files));
    let max_body_memory = raw
        .max_body_memory
        .unwrap_or(crate::limits::capacity::DEFAULT_BODY_MEMORY.max(raw.max_body_bytes));
    if max_body_memory != 0 && max_body_memory < raw.max_body_bytes {
        return Err(ConfigError::BodyMemory(max_body_memory, raw.max_body_bytes));
    }
    for (v, name) in [
        (raw.max_headers, "--max-headers"),
        (raw.max_header_bytes, "--max-header-bytes"),
        (raw.max_uri_bytes, "--max-uri-bytes"),
        (raw.max_batch, "--max-batch"),
    ] {
        if v == 0 {
            return Err(ConfigError::Zero(name));
        }
    }
    if !(raw.caller_rate.is_finite() && raw.caller_rate >= 0.0) {
        return Err(ConfigError::Rate(raw.caller_rate.to_string()));
    }
    let limits = RequestLimits {
        max_headers: raw.max_headers,
        max_header_bytes: raw.max_header_bytes,
        max_uri_bytes: raw.max_uri_bytes,
        header_timeout: ms(raw.header_timeout_ms, "--header-timeout-ms")?,
        body_timeout: ms(raw.body_timeout_ms, "--body-timeout-ms")?,
        max_batch: raw.max_batch,
        caller: crate::limits::CallerLimits {
            max_in_flight: raw.caller_max_in_flight,
            rate: raw.caller_rate,
            burst: raw.caller_burst,
        },
    };
    let authorizer = match raw.authorizer_url.as_deref() {
        None => None,
        Some(u) => Some(AuthorizerConfig {
            url: Url::parse(u)
                .ok()
                .filter(|x| matches!(x.scheme(), "http" | "https") && x.host().is_some())
                .ok_or_else(|| ConfigError::AuthorizerUrl(crate::wire::query::shown_str(u)))?,
            timeout: ms(raw.authorizer_timeout_ms, "--authorizer-timeout-ms")?,
            on_failure: match raw.authorizer_failure.as_str() {
                "deny" => OnFailure::Deny,
                "ask" => OnFailure::Ask,
                other => return Err(ConfigError::AuthorizerFailure(other.to_string())),
            },
        }),
    };
    Ok(ServeConfig {
        listen: raw.listen,
        public_url,
        allowed_origins,
        max_body_bytes: raw.max_body_bytes,
        max_connections,
        max_connections_per_source: raw.max_connections_per_source.unwrap_or_else(|| {
            crate::limits::capacity::default_max_connections_per_source(
                max_connections,
                raw.listen.ip().is_loopback(),
            )
        }),
        max_body_memory,
        egress: crate::upstream::egress::Egress {
            allow_private: raw.allow_private_upstreams,
        },
        allow_range: raw.allow_range,
        forwarded: match raw.forwarded.as_str() {
            "off" => false,
            "set" => true,
            other => return Err(ConfigError::Forwarded(other.to_string())),
        },
        limits,
        upstream_roots: std::sync::Arc::new(upstream_roots(
            &raw.upstream_roots,
            raw.upstream_ca_file.as_deref(),
        )?),
        connect_timeout: ms(raw.connect_timeout_ms, "--connect-timeout-ms")?,
        upstream_timeout: ms(raw.upstream_timeout_ms, "--upstream-timeout-ms")?,
        idle_timeout: ms(raw.idle_timeout_ms, "--idle-timeout-ms")?,
        refresh_interval: ms(raw.refresh_ms, "--refresh-ms")?,
        audit_arguments: raw.audit_arguments,
        audit_queue: if raw.audit_queue == 0 {
            return Err(ConfigError::Zero("--audit-queue"));
        } else {
            raw.audit_queue
        },
        db_timeout: ms(raw.db_timeout_ms, "--db-timeout-ms")?,
        authorizer,
        max_pending_approvals: raw.max_pending_approvals,
        approval_ttl: crate::telemetry::time::parse_since(&raw.approval_ttl)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| ConfigError::ApprovalTtl(raw.approval_ttl.clone()))?,
        approval_wait: Duration::from_millis(raw.approval_wait_ms),
        approval_webhook: match raw.approval_webhook.as_deref() {
            None | Some("") => None,
            Some(u) => Some(
                Url::parse(u)
                    .ok()
                    .filter(|x| matches!(x.scheme(), "http" | "https") && x.host().is_some())
                    .ok_or(ConfigError::ApprovalWebhook)?,
            ),
        },
        tools_list_max_bytes: raw.tools_list_max_bytes,
        pin_tools: match raw.pin_tools.as_str() {
            "off" => PinMode::Off,
            "tofu" => PinMode::Tofu,
            "strict" => PinMode::Strict,
            other => return Err(ConfigError::PinTools(other.to_string())),
        },
        token_margin: Duration::from_secs(raw.token_margin_s),
        token_timeout: ms(raw.token_timeout_ms, "--token-timeout-ms")?,
        predict: predict_settings(&raw.predict)?,
    })
}

// Approvals that learn (`crate::authz::predict`): the costs, the thresholds
// they give, and the settings. Here, below the model, because a setting that
// cannot be used stops the process before any port is bound.

/// The default `--predict-timeout-ms`.
pub const DEFAULT_PREDICT_TIMEOUT: Duration = Duration::from_millis(50);
/// The default `--predict-half-life`.
pub const DEFAULT_HALF_LIFE: &str = "30d";
/// What the organization pays for each kind of mistake, in any one unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// A call allowed that a person would have denied.
    pub wrong_allow: f64,
    /// A call refused that a person would have approved.
    pub wrong_deny: f64,
    /// A person's time, answering.
    pub ask: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            wrong_allow: 100.0,
            wrong_deny: 5.0,
            ask: 1.0,
        }
    }
}

/// The probabilities of approval past which allowing, or below which
/// denying, costs less than asking.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Thresholds {
    pub allow: f64,
    pub deny: f64,
}

/// Costs that cannot be used, named by their settings.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CostError {
    #[error("{0} must be a finite number greater than zero")]
    NotPositive(&'static str),
    #[error("--cost-wrong-allow {wrong_allow}, --cost-wrong-deny {wrong_deny} and --cost-ask {ask} make the thresholds cross (allow above {allow:.3}, deny below {deny:.3}): asking a person would never be the cheapest action. Lower --cost-ask or raise the costs of a wrong answer")]
    Cross {
        wrong_allow: f64,
        wrong_deny: f64,
        ask: f64,
        allow: f64,
        deny: f64,
    },
}

impl Costs {
    /// With p the probability that a person approves: allowing costs
    /// (1 − p) × wrong_allow, denying p × wrong_deny, asking `ask`. Allow
    /// is cheapest above `max(1 − ask/wrong_allow, tie)` and deny below
    /// `min(ask/wrong_deny, tie)`, where `tie = wrong_allow / (wrong_allow +
    /// wrong_deny)`. Refused when they meet or cross (asking would never be
    /// cheapest).
    pub fn thresholds(&self) -> Result<Thresholds, CostError> {
        for (v, name) in [
            (self.wrong_allow, "--cost-wrong-allow"),
            (self.wrong_deny, "--cost-wrong-deny"),
            (self.ask, "--cost-ask"),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(CostError::NotPositive(name));
            }
        }
        let tie = self.wrong_allow / (self.wrong_allow + self.wrong_deny);
        let allow = (1.0 - self.ask / self.wrong_allow).max(tie);
        let deny = (self.ask / self.wrong_deny).min(tie);
        if allow <= deny {
            return Err(CostError::Cross {
                wrong_allow: self.wrong_allow,
                wrong_deny: self.wrong_deny,
                ask: self.ask,
                allow,
                deny,
            });
        }
        Ok(Thresholds { allow, deny })
    }
}

/// How predictions are made (`serve` settings).
#[derive(Debug, Clone, PartialEq)]
pub struct PredictSettings {
    /// `--cost-wrong-allow`, `--cost-wrong-deny`, `--cost-ask`.
    pub costs: Costs,
    /// `--predict-timeout-ms`: a prediction not made within it asks.
    pub timeout: Duration,
    /// `--predictor-url`: the operator's own model, instead of the built-in.
    pub url: Option<url::Url>,
    /// `--predict-half-life`: an answer this old weighs half.
    pub half_life: Duration,
}

impl Default for PredictSettings {
    fn default() -> Self {
        PredictSettings {
            costs: Costs::default(),
            timeout: DEFAULT_PREDICT_TIMEOUT,
            url: None,
            half_life: Duration::from_secs(30 * 86_400),
        }
    }
}

/// The settings of approvals that learn, as `serve` and `approval
/// explain` take them.
#[derive(Debug, Clone, clap::Args)]
pub struct PredictArgs {
    /// Approvals that learn (`@ask("learn")`): what a call allowed that a
    /// person would have denied costs the organization, in any unit.
    #[arg(long, env = "TESSERA_COST_WRONG_ALLOW", default_value_t = 100.0)]
    pub cost_wrong_allow: f64,
    /// What a call refused that a person would have approved costs.
    #[arg(long, env = "TESSERA_COST_WRONG_DENY", default_value_t = 5.0)]
    pub cost_wrong_deny: f64,
    /// What asking a person costs (their time). With the defaults a
    /// prediction allows above p = 0.99 and denies below p = 0.2.
    #[arg(long, env = "TESSERA_COST_ASK", default_value_t = 1.0)]
    pub cost_ask: f64,
    /// How long a prediction may take; a late one asks a person.
    #[arg(long, env = "TESSERA_PREDICT_TIMEOUT_MS", default_value_t = 50)]
    pub predict_timeout_ms: u64,
    /// The operator's own predictor instead of the built-in model: it gets
    /// a POST of the call's description (no argument values unless
    /// --audit-arguments) and answers {"p": 0.97, "reason": "..."}. Any
    /// failure asks a person.
    #[arg(long, env = "TESSERA_PREDICTOR_URL")]
    pub predictor_url: Option<String>,
    /// How fast people's answers are forgotten: an answer this old weighs
    /// half as much as one given now (12h, 30d).
    #[arg(long, env = "TESSERA_PREDICT_HALF_LIFE", default_value = DEFAULT_HALF_LIFE)]
    pub predict_half_life: String,
}

impl Default for PredictArgs {
    fn default() -> Self {
        PredictArgs {
            cost_wrong_allow: 100.0,
            cost_wrong_deny: 5.0,
            cost_ask: 1.0,
            predict_timeout_ms: 50,
            predictor_url: None,
            predict_half_life: DEFAULT_HALF_LIFE.into(),
        }
    }
}

/// The settings of approvals that learn: costs whose thresholds cross are
/// refused here, naming them.
pub fn predict_settings(raw: &PredictArgs) -> Result<PredictSettings, ConfigError> {
    let costs = Costs {
        wrong_allow: raw.cost_wrong_allow,
        wrong_deny: raw.cost_wrong_deny,
        ask: raw.cost_ask,
    };
    costs
        .thresholds()
        .map_err(|e| ConfigError::Costs(e.to_string()))?;
    Ok(PredictSettings {
        costs,
        timeout: match raw.predict_timeout_ms {
            0 => return Err(ConfigError::Zero("--predict-timeout-ms")),
            n => Duration::from_millis(n),
        },
        url: match raw.predictor_url.as_deref() {
            None | Some("") => None,
            Some(u) => Some(
                Url::parse(u)
                    .ok()
                    .filter(|x| matches!(x.scheme(), "http" | "https") && x.host().is_some())
                    .ok_or(ConfigError::PredictorUrl)?,
            ),
        },
        half_life: crate::telemetry::time::parse_since(&raw.predict_half_life)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| ConfigError::HalfLife(raw.predict_half_life.clone()))?,
    })
}

impl ServeConfig {
    /// A config for tests and embedding: the given listen address, defaults
    /// for everything else.
    pub fn for_listen(listen: SocketAddr) -> Self {
        parse_serve(RawServe::defaults(listen)).expect("defaults are valid")
    }
}

impl RawServe {
    pub fn defaults(listen: SocketAddr) -> Self {
        RawServe {
            listen,
            public_url: None,
            allowed_origins: vec![],
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_connections: None,
            max_connections_per_source: None,
            max_body_memory: None,
            open_files: None,
            allow_private_upstreams: false,
            allow_range: false,
            forwarded: DEFAULT_FORWARDED.into(),
            upstream_roots: DEFAULT_UPSTREAM_ROOTS.into(),
            upstream_ca_file: None,
            max_headers: DEFAULT_MAX_HEADERS,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_uri_bytes: DEFAULT_MAX_URI_BYTES,
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
            body_timeout_ms: DEFAULT_BODY_TIMEOUT_MS,
            max_batch: DEFAULT_MAX_BATCH,
            caller_max_in_flight: DEFAULT_CALLER_MAX_IN_FLIGHT,
            caller_rate: DEFAULT_CALLER_RATE,
            caller_burst: DEFAULT_CALLER_BURST,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            upstream_timeout_ms: DEFAULT_UPSTREAM_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            refresh_ms: DEFAULT_REFRESH_MS,
            audit_arguments: false,
            audit_queue: DEFAULT_AUDIT_QUEUE,
            db_timeout_ms: DEFAULT_DB_TIMEOUT_MS,
            authorizer_url: None,
            authorizer_timeout_ms: DEFAULT_AUTHORIZER_TIMEOUT_MS,
            authorizer_failure: DEFAULT_AUTHORIZER_FAILURE.into(),
            max_pending_approvals: DEFAULT_MAX_PENDING_APPROVALS,
            approval_ttl: DEFAULT_APPROVAL_TTL.into(),
            approval_wait_ms: 0,
            approval_webhook: None,
            tools_list_max_bytes: DEFAULT_TOOLS_LIST_MAX_BYTES,
            pin_tools: DEFAULT_PIN_TOOLS.into(),
            token_margin_s: DEFAULT_TOKEN_MARGIN_S,
            token_timeout_ms: DEFAULT_TOKEN_TIMEOUT_MS,
            predict: PredictArgs::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_that_may_be_off() {
        assert_eq!(parse_optional_listen("off"), Ok(OptionalListen(None)));
        assert_eq!(parse_optional_listen("OFF"), Ok(OptionalListen(None)));
        assert_eq!(
            parse_optional_listen(DEFAULT_OPS_LISTEN),
            Ok(OptionalListen(Some("127.0.0.1:7472".parse().unwrap())))
        );
        assert_eq!(
            parse_optional_listen("localhost:9"),
            Ok(OptionalListen(Some("127.0.0.1:9".parse().unwrap())))
        );
        let e = parse_optional_listen("nowhere").unwrap_err();
        assert!(e.contains("IP:PORT") && e.ends_with("or off"), "{e}");
    }

    #[test]
    fn thresholds_come_from_the_costs() {
        let th = Costs::default().thresholds().unwrap();
        assert!((th.allow - 0.99).abs() < 1e-12, "{th:?}");
        assert!((th.deny - 0.2).abs() < 1e-12, "{th:?}");
        let th = Costs {
            wrong_allow: 4.0,
            wrong_deny: 5.0,
            ask: 1.0,
        }
        .thresholds()
        .unwrap();
        assert!((th.allow - 0.75).abs() < 1e-12 && (th.deny - 0.2).abs() < 1e-12);
        // Asking costs as much as a wrong allow: never the cheapest.
        let crossed = Costs {
            ask: 10.0,
            ..Costs::default()
        }
        .thresholds()
        .unwrap_err();
        let text = crossed.to_string();
        assert!(
            text.contains("--cost-ask 10") && text.contains("cross"),
            "{text}"
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let c = Costs {
                wrong_deny: bad,
                ..Costs::default()
            };
            assert_eq!(
                c.thresholds(),
                Err(CostError::NotPositive("--cost-wrong-deny"))
            );
        }
    }

    fn raw() -> RawServe {
        RawServe::defaults("127.0.0.1:7470".parse().unwrap())
    }

    #[test]
    fn defaults() {
        let c = parse_serve(raw()).unwrap();
        assert_eq!(c.public_url.as_str(), "http://127.0.0.1:7470/");
        let c = parse_serve(RawServe::defaults("0.0.0.0:80".parse().unwrap())).unwrap();
        assert_eq!(c.public_url.as_str(), "http://127.0.0.1/");
        let c = parse_serve(RawServe::defaults("[::]:9".parse().unwrap())).unwrap();
        assert_eq!(c.public_url.as_str(), "http://[::1]:9/");
    }

    #[test]
    fn public_url_and_origins_validated() {
        let mut r = raw();
        r.public_url = Some("https://proxy.example/".into());
        r.allowed_origins = vec!["https://App.example:8443, http://localhost:3000".into()];
        let c = parse_serve(r).unwrap();
        assert_eq!(c.public_url.as_str(), "https://proxy.example/");
        assert_eq!(
            c.allowed_origins,
            ["https://app.example:8443", "http://localhost:3000"]
        );
        for bad in [
            "proxy.example",
            "ftp://x",
            "https://x/path",
            "https://x/?q=1",
        ] {
            let mut r = raw();
            r.public_url = Some(bad.into());
            assert_eq!(
                parse_serve(r).unwrap_err(),
                ConfigError::PublicUrl(bad.into())
            );
        }
        let mut r = raw();
        r.allowed_origins = vec!["https://a/x".into()];
        assert!(matches!(parse_serve(r), Err(ConfigError::Origin(_))));
    }

    #[test]
    fn authorizer_settings() {
        let mut r = raw();
        r.authorizer_url = Some("http://127.0.0.1:9/authorize".into());
        r.authorizer_failure = "ask".into();
        let a = parse_serve(r).unwrap().authorizer.unwrap();
        assert_eq!(
            (a.timeout.as_millis(), a.on_failure),
            (2000, OnFailure::Ask)
        );
        let mut r = raw();
        r.authorizer_url = Some("unix:/run/authz".into());
        assert!(matches!(parse_serve(r), Err(ConfigError::AuthorizerUrl(_))));
        let mut r = raw();
        r.authorizer_url = Some("http://a/".into());
        r.authorizer_failure = "allow".into();
        assert_eq!(
            parse_serve(r).unwrap_err().to_string(),
            "--authorizer-failure \"allow\": use deny or ask"
        );
        assert!(parse_serve(raw()).unwrap().authorizer.is_none());
    }

    #[test]
    fn capacity_defaults_and_checks() {
        let mut r = raw();
        r.open_files = Some(1024);
        let c = parse_serve(r).unwrap();
        // On loopback every caller is one source: the total applies.
        assert_eq!(
            (c.max_connections, c.max_connections_per_source),
            (480, 480)
        );
        let mut r = RawServe::defaults("0.0.0.0:7470".parse().unwrap());
        r.open_files = Some(1024);
        let c = parse_serve(r).unwrap();
        assert_eq!(
            (c.max_connections, c.max_connections_per_source),
            (480, 240)
        );
        assert_eq!(c.max_body_memory, 256 * 1024 * 1024);
        let mut r = raw();
        r.max_connections = Some(0);
        r.max_body_bytes = 512 * 1024 * 1024;
        let c = parse_serve(r).unwrap();
        assert_eq!((c.max_connections, c.max_connections_per_source), (0, 0));
        assert_eq!(c.max_body_memory, 512 * 1024 * 1024);
        let mut r = raw();
        r.max_body_memory = Some(1024);
        assert_eq!(
            parse_serve(r).unwrap_err(),
            ConfigError::BodyMemory(1024, DEFAULT_MAX_BODY_BYTES)
        );
    }

    #[test]
    fn zero_durations_refused() {
        let mut r = raw();
        r.upstream_timeout_ms = 0;
        assert_eq!(
            parse_serve(r).unwrap_err(),
            ConfigError::Zero("--upstream-timeout-ms")
        );
    }
}

/// A settings file (`--config tessera.toml`): one key per setting, named as
/// its flag without the dashes (`listen`, `max-body-bytes`,
/// `allowed-origin`, …). Each value becomes that setting's default, so a
/// flag or an environment variable still wins: flag > env > file > default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsFile {
    /// Setting → its values as a flag would give them (several for a
    /// repeatable setting given as an array).
    pub values: std::collections::BTreeMap<String, Vec<String>>,
}

/// Why a settings file cannot be used; names the file and the setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FileError {
    #[error("{file}: {reason}")]
    Syntax { file: String, reason: String },
    #[error("{file}: unknown setting {key:?} (known: {known})")]
    Unknown {
        file: String,
        key: String,
        known: String,
    },
    #[error("{file}: setting {key:?} must be a string, a number, a boolean, or an array of them")]
    Shape { file: String, key: String },
    #[error("{file}: {key:?} is a secret and is never read from a settings file: give it with {instead}")]
    Secret {
        file: String,
        key: String,
        instead: &'static str,
    },
}

/// Parse a settings file's text. `known` lists the settings it may set;
/// any other key is an error naming it (a typo must not pass silently).
pub fn parse_settings_file(
    file: &str,
    text: &str,
    known: &[String],
) -> Result<SettingsFile, FileError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| FileError::Syntax {
            file: file.to_string(),
            reason: e.message().to_string(),
        })?;
    let mut values = std::collections::BTreeMap::new();
    for (key, v) in table {
        let key = key.replace('_', "-");
        if matches!(key.as_str(), "master-key" | "master-key-file") {
            return Err(FileError::Secret {
                file: file.to_string(),
                key,
                instead: "TESSERA_MASTER_KEY or TESSERA_MASTER_KEY_FILE",
            });
        }
        if !known.contains(&key) {
            return Err(FileError::Unknown {
                file: file.to_string(),
                known: known.join(", "),
                key,
            });
        }
        let shape = || FileError::Shape {
            file: file.to_string(),
            key: key.clone(),
        };
        let scalar = |v: &toml::Value| match v {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::Float(f) => Some(f.to_string()),
            toml::Value::Boolean(b) => Some(b.to_string()),
            _ => None,
        };
        let list = match &v {
            toml::Value::Array(items) => items
                .iter()
                .map(|i| scalar(i).ok_or_else(shape))
                .collect::<Result<Vec<_>, _>>()?,
            v => vec![scalar(v).ok_or_else(shape)?],
        };
        values.insert(key, list);
    }
    Ok(SettingsFile { values })
}

#[cfg(test)]
mod file_tests {
    use super::*;

    fn known() -> Vec<String> {
        [
            "listen",
            "max-body-bytes",
            "allowed-origin",
            "audit-arguments",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn values_arrays_and_underscores() {
        let f = parse_settings_file(
            "t.toml",
            "listen = \"0.0.0.0:1\"\nmax_body_bytes = 1024\nallowed-origin = [\"http://a\", \"http://b\"]\naudit-arguments = true\n",
            &known(),
        )
        .unwrap();
        assert_eq!(f.values["listen"], ["0.0.0.0:1"]);
        assert_eq!(f.values["max-body-bytes"], ["1024"]);
        assert_eq!(f.values["allowed-origin"], ["http://a", "http://b"]);
        assert_eq!(f.values["audit-arguments"], ["true"]);
    }

    #[test]
    fn unknown_keys_secrets_shapes_and_syntax_are_named() {
        let e = parse_settings_file("t.toml", "lisen = \"x\"", &known()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.toml: unknown setting \"lisen\""),
            "{e}"
        );
        let e = parse_settings_file("t.toml", "master_key = \"x\"", &known()).unwrap_err();
        assert!(matches!(e, FileError::Secret { .. }), "{e}");
        assert!(!e.to_string().contains("\"x\""), "{e}");
        let e = parse_settings_file("t.toml", "[listen]\na = 1", &known()).unwrap_err();
        assert!(matches!(e, FileError::Shape { .. }), "{e}");
        let e = parse_settings_file("t.toml", "listen = ", &known()).unwrap_err();
        assert!(e.to_string().starts_with("t.toml: "), "{e}");
    }
}
