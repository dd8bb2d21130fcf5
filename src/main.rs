//! The `tessera` binary: parses the command line, sets up tracing, and calls
//! the library. Errors end here as one line on stderr and a non-zero exit.

use std::io::{IsTerminal, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tessera::admin::service::{self, CredentialSpec};
use tessera::authz::cedar::Policies;
use tessera::config::{self, RawServe};
use tessera::crypto::keyring::{ExposeSecret, MasterKey, SecretString};
use tessera::store::model::Scheme;
use tessera::store::Store;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "A credential-holding MCP forwarding proxy"
)]
struct Cli {
    /// Folder holding the database and the master key file.
    #[arg(
        long,
        env = "TESSERA_DATA_DIR",
        default_value = "./tessera-data",
        global = true
    )]
    data_dir: PathBuf,
    /// The database: sqlite://PATH, or postgres://USER@HOST/DB for
    /// replicas sharing one store (default: tessera.db in the data dir).
    /// TESSERA_DATABASE_URL_FILE names a file holding it instead (a
    /// container secret: the URL may hold a password).
    #[arg(long, env = "TESSERA_DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// A settings file (TOML): one key per setting, named as its flag
    /// (`listen = "127.0.0.1:7470"`). Flags and environment variables win
    /// over it; it wins over the defaults.
    #[arg(long, env = "TESSERA_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Print JSON for scripts: one object per result (one per line for
    /// `audit` and `approval list`), never a table or a sentence.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where this process keeps its state: the data dir (the master key file,
/// and the SQLite database unless another database is named).
struct Place {
    data_dir: PathBuf,
    database: Option<tessera::store::DatabaseUrl>,
    /// `--json`: results as JSON for scripts.
    json: bool,
}

impl Place {
    /// Print a command's result: `json` with `--json`, else `text`.
    fn say(&self, text: impl std::fmt::Display, json: serde_json::Value) {
        if self.json {
            println!("{json}");
        } else {
            println!("{text}");
        }
    }
}

impl Place {
    async fn store(&self) -> Result<Store> {
        Store::open(&self.data_dir, self.database.as_ref())
            .await
            .with_context(|| match &self.database {
                Some(url) => format!("opening the database {url}"),
                None => format!("opening the database in {}", self.data_dir.display()),
            })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the data plane.
    Serve(Box<ServeArgs>),
    /// Upstream MCP servers and their credentials.
    #[command(subcommand)]
    Credential(CredentialCmd),
    /// Agent identities and their tokens.
    #[command(subcommand)]
    Caller(CallerCmd),
    /// Addresses binding one caller to one credential.
    #[command(subcommand)]
    Connection(ConnectionCmd),
    /// Authorization policies (Cedar).
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Calls held for a person's approval by an @ask policy or the
    /// external authorizer.
    #[command(subcommand)]
    Approval(ApprovalCmd),
    /// The master key ring that seals stored secrets.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Tokens for the admin HTTP API (`serve --admin-listen`).
    #[command(subcommand)]
    AdminToken(AdminTokenCmd),
    /// The settings `serve` would run with.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Apply the database migrations (serve and every command also do at
    /// start) and print the schema version.
    Migrate,
    /// The audit trail of authorization decisions, oldest first.
    Audit {
        #[arg(long)]
        caller: Option<String>,
        /// A connection id (the last part of its URL; it may begin with '-').
        #[arg(long, allow_hyphen_values = true)]
        connection: Option<String>,
        /// Only records this recent: 30s, 15m, 1h, 7d.
        #[arg(long)]
        since: Option<String>,
        /// At most this many (the newest).
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Keep printing new records as they are written.
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Print the effective settings (flag > env > --config file > default)
    /// with where each came from, secrets redacted, and validate them as
    /// `serve` does at start; exits non-zero naming an invalid setting.
    Check(Box<ServeArgs>),
}

#[derive(Subcommand)]
enum AdminTokenCmd {
    /// Create an admin token; it is printed once, as the last line (the
    /// store keeps only its SHA-256). Restart serve to open the admin
    /// listener if this is the first token.
    Add {
        name: String,
    },
    /// Revoke an admin token: the admin API refuses it at once.
    Revoke {
        name: String,
    },
    List,
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Re-seal every stored secret under a new master key, in one
    /// transaction, while serve keeps serving. The new key comes from
    /// TESSERA_MASTER_KEY_NEW, or is generated into master.key.
    Rotate,
    /// Which key ids the stored secrets are sealed with, and which keys the
    /// ring holds.
    Status,
}

#[derive(Subcommand)]
enum ApprovalCmd {
    /// Pending approvals, newest first (with --all, granted and denied too).
    List {
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// The next page: those listed after this approval id (the last
        /// of the previous page).
        #[arg(long)]
        before: Option<String>,
    },
    /// Allow the held call (same tool, params, sub-path, query and session) to run.
    Grant {
        id: String,
        /// How long the grant lasts: 30s, 10m, 1h, 7d.
        #[arg(long, default_value = "10m")]
        ttl: String,
        /// How many times the call may run within the TTL.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
        uses: i64,
    },
    /// Refuse the held call; the record stays listed (--all).
    Deny { id: String },
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// Validate a policy folder against its schema, as `serve` does at start.
    Check {
        /// The folder (default: ./policies when present, else the built-in set).
        dir: Option<PathBuf>,
    },
    /// Ask every serving process on this database (every replica) to read
    /// its policy folder again, as SIGHUP does for one process. A folder
    /// that does not validate leaves that process on its current set.
    Reload,
    /// Show the decision for a request, and the policies that made it.
    Explain {
        #[arg(long)]
        caller: String,
        /// The connection id (the last part of its URL; it may begin with '-').
        #[arg(long, allow_hyphen_values = true)]
        connection: String,
        /// The JSON-RPC method (tools/call, tools/list, …).
        #[arg(long, required_unless_present = "http_method")]
        method: Option<String>,
        #[arg(long)]
        tool: Option<String>,
        /// The tool's arguments, as JSON.
        #[arg(long)]
        arguments: Option<String>,
        /// GET (stream/open) or DELETE (session/end) instead of a POST.
        #[arg(long, value_parser = ["POST", "GET", "DELETE"])]
        http_method: Option<String>,
        /// The sub-path after the connection address (`/files/x`), as
        /// policies see it in context.path (default: none).
        #[arg(long, default_value = "")]
        path: String,
        /// The policy folder (default: as `serve`).
        #[arg(long, env = "TESSERA_POLICIES")]
        policies: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ServeArgs {
    #[arg(long, env = "TESSERA_LISTEN", default_value = config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// The admin API, health and metrics listener. It opens only when at
    /// least one admin token exists (tessera admin-token add NAME).
    #[arg(long, env = "TESSERA_ADMIN_LISTEN", default_value = config::DEFAULT_ADMIN_LISTEN)]
    admin_listen: SocketAddr,
    /// Base of the connection URLs handed to agents (default: from --listen).
    #[arg(long, env = "TESSERA_PUBLIC_URL")]
    public_url: Option<String>,
    /// A browser origin allowed to call tessera (repeatable; env: comma-separated).
    #[arg(
        long = "allowed-origin",
        env = "TESSERA_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    #[arg(long, env = "TESSERA_MAX_BODY_BYTES", default_value_t = config::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Data-plane connections open at once (default: half the descriptor
    /// limit left after 64, at most 4096; 0: no limit). Over it, the
    /// oldest idle connection makes room, else new ones wait.
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Data-plane connections one source address (an IPv6 /64) may have
    /// open (default: half of --max-connections; 0: no limit). Over it,
    /// the source's oldest idle connection makes room, else 503.
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS_PER_SOURCE")]
    max_connections_per_source: Option<usize>,
    /// Bytes of request bodies held in memory at once, across all requests
    /// (default: 256 MiB, or --max-body-bytes if larger; 0: no limit).
    /// Over it, 503 with Retry-After.
    #[arg(long, env = "TESSERA_MAX_BODY_MEMORY")]
    max_body_memory: Option<usize>,
    /// Header fields a request may carry (431 above).
    #[arg(long, env = "TESSERA_MAX_HEADERS", default_value_t = config::DEFAULT_MAX_HEADERS)]
    max_headers: usize,
    /// Bytes of header names and values a request may carry (431 above).
    #[arg(long, env = "TESSERA_MAX_HEADER_BYTES", default_value_t = config::DEFAULT_MAX_HEADER_BYTES)]
    max_header_bytes: usize,
    /// Bytes of a request target (414 above).
    #[arg(long, env = "TESSERA_MAX_URI_BYTES", default_value_t = config::DEFAULT_MAX_URI_BYTES)]
    max_uri_bytes: usize,
    /// A request head not complete within this is cut off (connection
    /// closed): the slow-headers defence.
    #[arg(long, env = "TESSERA_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    header_timeout_ms: u64,
    /// On SIGTERM (or Ctrl-C): how long requests in flight may take to
    /// finish, after event streams were ended and new connections refused.
    /// A second signal exits at once.
    #[arg(long, env = "TESSERA_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    shutdown_grace_ms: u64,
    /// A request body not complete within this is refused (408).
    #[arg(long, env = "TESSERA_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    body_timeout_ms: u64,
    /// Messages in one JSON-RPC batch (2025-03-26; 400 above).
    #[arg(long, env = "TESSERA_MAX_BATCH", default_value_t = config::DEFAULT_MAX_BATCH)]
    max_batch: usize,
    /// Requests (streams included) one caller may have open at once (429
    /// above; 0: no limit).
    #[arg(long, env = "TESSERA_CALLER_MAX_IN_FLIGHT", default_value_t = config::DEFAULT_CALLER_MAX_IN_FLIGHT)]
    caller_max_in_flight: u32,
    /// Requests per second one caller may make, sustained (429 above; 0:
    /// no limit).
    #[arg(long, env = "TESSERA_CALLER_RATE", default_value_t = config::DEFAULT_CALLER_RATE)]
    caller_rate: f64,
    /// Requests one caller may make at once above its rate.
    #[arg(long, env = "TESSERA_CALLER_BURST", default_value_t = config::DEFAULT_CALLER_BURST)]
    caller_burst: u32,
    /// Upstream TCP (and TLS) connect timeout.
    #[arg(long, env = "TESSERA_CONNECT_TIMEOUT_MS", default_value_t = 5_000)]
    connect_timeout_ms: u64,
    /// How long to wait for an upstream's response headers (504 after).
    #[arg(long, env = "TESSERA_UPSTREAM_TIMEOUT_MS", default_value_t = 60_000)]
    upstream_timeout_ms: u64,
    /// How long an idle pooled upstream connection is kept.
    #[arg(long, env = "TESSERA_IDLE_TIMEOUT_MS", default_value_t = 90_000)]
    idle_timeout_ms: u64,
    /// How often the store is polled for changes made by other processes.
    #[arg(long, env = "TESSERA_REFRESH_MS", default_value_t = 250)]
    refresh_ms: u64,
    /// The policy folder (default: ./policies when present, else the
    /// built-in policy: a caller may use its own connections).
    #[arg(long, env = "TESSERA_POLICIES")]
    policies: Option<PathBuf>,
    /// Keep tool-call arguments in the audit trail (default: only their
    /// SHA-256).
    #[arg(long, env = "TESSERA_AUDIT_ARGUMENTS")]
    audit_arguments: bool,
    #[command(flatten)]
    egress: EgressArgs,
    /// Pass a caller's Range and If-Range headers to the upstream (default:
    /// stripped, so that slices of an answer cannot be joined around the
    /// redaction of the stored secret).
    #[arg(long, env = "TESSERA_ALLOW_RANGE")]
    allow_range: bool,
    /// Tell the upstream the caller's address: off (nothing), or set
    /// (tessera sets Forwarded: for=<peer>;proto=http and X-Forwarded-For:
    /// <peer>). A caller's own forwarding headers are stripped either way.
    #[arg(long, env = "TESSERA_FORWARDED", default_value = "off", value_parser = ["off", "set"])]
    forwarded: String,
    /// The certificate authorities upstream TLS trusts: webpki (the Mozilla
    /// roots built in) or platform (the system's store).
    #[arg(long, env = "TESSERA_UPSTREAM_ROOTS", default_value = "webpki")]
    upstream_roots: String,
    /// A PEM bundle of certificate authorities trusted for upstream TLS
    /// besides --upstream-roots (a private CA).
    #[arg(long, env = "TESSERA_UPSTREAM_CA_FILE")]
    upstream_ca_file: Option<String>,
    /// Audit records queued for the writer before requests wait for room.
    #[arg(long, env = "TESSERA_AUDIT_QUEUE", default_value_t = config::DEFAULT_AUDIT_QUEUE)]
    audit_queue: usize,
    /// The longest a database operation of the serving process may take
    /// before it counts as failed: held calls then get 503, the audit
    /// writer retries, and the snapshot in memory keeps serving.
    #[arg(long, env = "TESSERA_DB_TIMEOUT_MS", default_value_t = config::DEFAULT_DB_TIMEOUT_MS)]
    db_timeout_ms: u64,
    /// An external authorizer, asked after the policies allow or ask: it
    /// gets a JSON description of the request and answers
    /// {"decision": "allow"|"deny"|"ask", "reason": "..."}.
    #[arg(long, env = "TESSERA_AUTHORIZER_URL")]
    authorizer_url: Option<String>,
    /// How long to wait for the external authorizer's answer.
    #[arg(long, env = "TESSERA_AUTHORIZER_TIMEOUT_MS", default_value_t = config::DEFAULT_AUTHORIZER_TIMEOUT_MS)]
    authorizer_timeout_ms: u64,
    /// What a failed authorizer (timeout, error, non-2xx, bad answer)
    /// means: deny, or ask a person. Never allow.
    #[arg(long, env = "TESSERA_AUTHORIZER_FAILURE", default_value = "deny", value_parser = ["deny", "ask"])]
    authorizer_failure: String,
    /// Calls one caller may have waiting for a person's approval; a call
    /// that would wait beyond that is refused (429). 0: no limit.
    #[arg(long, env = "TESSERA_MAX_PENDING_APPROVALS", default_value_t = config::DEFAULT_MAX_PENDING_APPROVALS)]
    max_pending_approvals: u32,
    /// The largest tools/list answer tessera reads to filter it (502 above).
    #[arg(long, env = "TESSERA_TOOLS_LIST_MAX_BYTES", default_value_t = config::DEFAULT_TOOLS_LIST_MAX_BYTES)]
    tools_list_max_bytes: usize,
    /// Refresh an OAuth token when it expires within this many seconds.
    #[arg(long, env = "TESSERA_TOKEN_MARGIN_S", default_value_t = 60)]
    token_margin_s: u64,
    /// How long a token request may take (502 after).
    #[arg(long, env = "TESSERA_TOKEN_TIMEOUT_MS", default_value_t = 10_000)]
    token_timeout_ms: u64,
    /// How often the policy folder is checked for changes (SIGHUP reloads
    /// at once).
    #[arg(long, env = "TESSERA_POLICY_CHECK_MS", default_value_t = 1_000)]
    policy_check_ms: u64,
    /// Runtime worker threads (default: one per CPU core). A sidecar
    /// pinned to one core runs best with 1.
    #[arg(long, env = "TESSERA_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,
    /// The log's lines: logfmt text, or one JSON object each.
    #[arg(long, env = "TESSERA_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

/// Where a secret is read from: never the command line. (With --scheme
/// oauth2 it is the client secret, also spelt --client-secret-env/-stdin.)
#[derive(Args)]
struct SecretSource {
    /// An environment variable holding the secret.
    #[arg(long, alias = "client-secret-env", conflicts_with = "secret_stdin")]
    secret_env: Option<String>,
    /// Read the secret from stdin.
    #[arg(long, alias = "client-secret-stdin")]
    secret_stdin: bool,
}

impl SecretSource {
    fn given(&self) -> bool {
        self.secret_env.is_some() || self.secret_stdin
    }

    /// The secret, which must be given.
    fn read(&self) -> Result<SecretString> {
        if !self.given() {
            bail!("give the secret with --secret-env VAR or --secret-stdin");
        }
        read_secret(self.secret_env.as_deref())
    }
}

/// An OAuth 2.x credential's settings (`--scheme oauth2`).
#[derive(Args)]
struct OAuthArgs {
    /// The authorization server's token endpoint.
    #[arg(long)]
    token_url: Option<String>,
    #[arg(long)]
    client_id: Option<String>,
    /// A scope to ask for (repeatable).
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long)]
    audience: Option<String>,
    /// An environment variable holding a refresh token: the refresh-token
    /// grant is used (else client credentials).
    #[arg(long, conflicts_with = "refresh_token_stdin")]
    refresh_token_env: Option<String>,
    /// Read the refresh token from stdin.
    #[arg(long)]
    refresh_token_stdin: bool,
}

/// Whether upstreams may be internal (see `tessera::upstream::egress`).
#[derive(clap::Args, Debug, Clone, Copy)]
struct EgressArgs {
    /// Allow upstreams (and OAuth token URLs) on loopback, private,
    /// link-local or metadata addresses, and over plain http://. Off by
    /// default: a sidecar whose upstream runs on the same host needs it
    #[arg(long, env = "TESSERA_ALLOW_PRIVATE_UPSTREAMS")]
    allow_private_upstreams: bool,
}

impl EgressArgs {
    fn egress(self) -> tessera::upstream::egress::Egress {
        tessera::upstream::egress::Egress {
            allow_private: self.allow_private_upstreams,
        }
    }
}

#[derive(Subcommand)]
enum CredentialCmd {
    /// Register an upstream and its credential. The secret is read from an
    /// environment variable or stdin, never from the command line.
    Add {
        name: String,
        #[arg(long)]
        upstream: String,
        #[arg(long, default_value = "bearer", value_parser = ["bearer", "basic", "header", "oauth2"])]
        scheme: String,
        /// The header that carries the secret with --scheme header.
        #[arg(long)]
        header_name: Option<String>,
        /// The user name with --scheme basic.
        #[arg(long)]
        username: Option<String>,
        #[command(flatten)]
        secret: SecretSource,
        #[command(flatten)]
        oauth: Box<OAuthArgs>,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// Replace a credential's secret. Serving processes use it for new
    /// requests within one refresh (250 ms by default); requests already
    /// sent finish with the old one.
    SetSecret {
        name: String,
        #[command(flatten)]
        secret: SecretSource,
    },
    /// Register an upstream that needs a person's consent: discover its
    /// authorization server (MCP authorization spec), register a client
    /// when no --client-id is given, print a URL to authorize tessera, and
    /// store the resulting tokens sealed.
    Login {
        name: String,
        #[arg(long)]
        upstream: String,
        #[arg(long)]
        client_id: Option<String>,
        /// An environment variable holding the client secret, for a
        /// confidential client given with --client-id.
        #[arg(long, requires = "client_id")]
        client_secret_env: Option<String>,
        /// A scope to ask for (repeatable; default: the scopes the
        /// upstream's metadata lists).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// How long to wait for the authorization, in seconds.
        #[arg(long, default_value_t = 300)]
        wait_s: u64,
        #[command(flatten)]
        egress: EgressArgs,
    },
    List,
}

#[derive(Subcommand)]
enum CallerCmd {
    /// Create a caller; its token is printed once, as the last line.
    Add {
        name: String,
        /// A group the caller belongs to, for policies (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
    },
    Revoke {
        name: String,
    },
    List,
}

#[derive(Subcommand)]
enum ConnectionCmd {
    /// Allocate an address; its URL is printed as the last line.
    Add {
        #[arg(long)]
        caller: String,
        #[arg(long)]
        credential: String,
        #[arg(long, env = "TESSERA_PUBLIC_URL")]
        public_url: Option<String>,
    },
    Revoke {
        /// The connection's id or URL (an id may begin with '-').
        #[arg(allow_hyphen_values = true)]
        id_or_url: String,
    },
    List,
}

/// The settings file named by `--config FILE` (or `--config=FILE`) or
/// `TESSERA_CONFIG`, found before clap parses, since its values become
/// clap's defaults.
fn config_path() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        if a == "--" {
            break;
        }
        if a == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(v) = a.to_str().and_then(|a| a.strip_prefix("--config=")) {
            return Some(PathBuf::from(v));
        }
    }
    std::env::var_os("TESSERA_CONFIG").map(PathBuf::from)
}

/// A command's own settings (that a file may set): long name and clap id.
fn settings(cmd: &clap::Command) -> Vec<(String, String)> {
    cmd.get_arguments()
        .filter_map(|a| Some((a.get_long()?, a.get_id().as_str())))
        .filter(|(l, _)| !matches!(*l, "config" | "help" | "version"))
        .map(|(l, id)| (l.to_string(), id.to_string()))
        .collect()
}

/// The command line, with the settings file's values as defaults of the
/// global settings and of `serve` (and `config check`, which shows them).
/// Also the file's keys, to tell where a value came from.
fn parse_cli() -> Result<(Cli, clap::ArgMatches, Vec<String>)> {
    let mut cmd = Cli::command();
    let mut from_file = Vec::new();
    if let Some(path) = config_path() {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the settings file {name}"))?;
        let global = settings(&cmd);
        let serve = cmd
            .find_subcommand("serve")
            .map(settings)
            .unwrap_or_default();
        let known: Vec<String> = global.iter().chain(&serve).map(|s| s.0.clone()).collect();
        let file = config::parse_settings_file(&name, &text, &known)?;
        for (key, values) in file.values {
            let set = |a: clap::Arg| a.default_values(values.clone());
            if let Some((_, id)) = global.iter().find(|s| s.0 == key) {
                cmd = cmd.mut_arg(id, set);
            } else if let Some((_, id)) = serve.iter().find(|s| s.0 == key) {
                cmd = cmd
                    .mut_subcommand("serve", |s| s.mut_arg(id, set))
                    .mut_subcommand("config", |c| {
                        c.mut_subcommand("check", |s| s.mut_arg(id, set))
                    });
            }
            from_file.push(key);
        }
    }
    let matches = match cmd.try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind as K;
            let bad_value = matches!(e.kind(), K::ValueValidation | K::InvalidValue);
            if bad_value && !from_file.is_empty() {
                let _ = e.print();
                eprintln!(
                    "note: the settings file sets {}; a flag or environment variable overrides it",
                    from_file.join(", ")
                );
                std::process::exit(2);
            }
            e.exit()
        }
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    Ok((cli, matches, from_file))
}

fn main() {
    let (cli, matches, from_file) = match parse_cli() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tessera: {e:#}");
            std::process::exit(2);
        }
    };
    if let Cmd::Config(ConfigCmd::Check(a)) = &cli.cmd {
        let ok = config_check(&cli, a, &matches, &from_file);
        std::process::exit(if ok { 0 } else { 1 });
    }
    // One worker means one thread: a current-thread runtime runs every
    // connection on the main thread with no hand-off between threads.
    let workers = match &cli.cmd {
        Cmd::Serve(a) => a.worker_threads,
        _ => None,
    };
    let mut rt = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = rt.enable_all().build().expect("building the tokio runtime");
    if let Err(e) = rt.block_on(dispatch(cli)) {
        eprintln!("tessera: {e:#}");
        std::process::exit(1);
    }
}

async fn dispatch(cli: Cli) -> Result<()> {
    let database = match (
        cli.database_url,
        std::env::var_os("TESSERA_DATABASE_URL_FILE"),
    ) {
        (Some(url), _) => Some(url),
        (None, Some(path)) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| {
                    format!(
                        "reading TESSERA_DATABASE_URL_FILE {}",
                        std::path::Path::new(&path).display()
                    )
                })?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    let at = Place {
        database: database.as_deref().map(str::parse).transpose()?,
        data_dir: cli.data_dir,
        json: cli.json,
    };
    match cli.cmd {
        Cmd::Serve(a) => serve(&at, *a).await,
        Cmd::Credential(c) => credential(&at, c).await,
        Cmd::Caller(c) => caller(&at, c).await,
        Cmd::Connection(c) => connection(&at, c).await,
        Cmd::Policy(c) => policy(&at, c).await,
        Cmd::Approval(c) => approval(&at, c).await,
        Cmd::Key(c) => key(&at, c).await,
        Cmd::AdminToken(c) => admin_token(&at, c).await,
        // Handled in main, before a runtime is built.
        Cmd::Config(_) => Ok(()),
        Cmd::Migrate => {
            let store = at.store().await?;
            let v = store.schema_version();
            at.say(
                format!("schema at migration {v}"),
                serde_json::json!({"schema_version": v}),
            );
            Ok(())
        }
        Cmd::Audit {
            caller,
            connection,
            since,
            limit,
            follow,
        } => {
            let since = match since {
                None => None,
                Some(s) => Some(tessera::audit::parse_since(&s).with_context(|| {
                    format!("--since {s:?}: give a number and a unit: 30s, 15m, 1h, 7d")
                })?),
            };
            let store = at.store().await?;
            let q = tessera::store::model::AuditQuery {
                caller,
                connection,
                since: since.map(|d| {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    now.saturating_sub(d).as_millis() as i64
                }),
                after_id: None,
                limit: limit.max(1),
            };
            audit(&store, q, at.json, follow).await
        }
    }
}

/// The policy folder `serve` uses: `dir`, else ./policies when it exists,
/// else none (the built-in set).
fn policy_dir(dir: Option<&std::path::Path>) -> Option<PathBuf> {
    match dir {
        Some(d) => Some(d.to_path_buf()),
        None if std::path::Path::new("policies").is_dir() => Some(PathBuf::from("policies")),
        None => None,
    }
}

/// The policies `serve` runs with (see [`policy_dir`]). An invalid set is
/// an error listing every problem.
fn load_policies(dir: Option<&std::path::Path>) -> Result<Policies> {
    let Some(dir) = policy_dir(dir) else {
        return Ok(Policies::builtin());
    };
    Policies::load_dir(&dir)
        .map_err(|e| anyhow::anyhow!("the policies in {} are not valid:\n{e}", dir.display()))
}

async fn policy(at: &Place, c: PolicyCmd) -> Result<()> {
    match c {
        PolicyCmd::Reload => {
            let store = at.store().await?;
            let acting = store.acting(service::CLI, "policy.reload", "*");
            let done = acting.bump_policies().await.map_err(Into::into);
            service::audited(&acting, done).await?;
            at.say(
                "asked every serving process to reload its policies",
                serde_json::json!({"reload": "asked"}),
            );
        }
        PolicyCmd::Check { dir } => {
            let p = load_policies(dir.as_deref())?;
            if at.json {
                let v = serde_json::json!({"origin": p.origin, "count": p.len(), "files": p.files, "ids": p.ids()});
                println!("{v}");
                return Ok(());
            }
            println!(
                "{}: {} {} valid against the schema ({})",
                p.origin,
                p.len(),
                if p.len() == 1 { "policy" } else { "policies" },
                p.files.join(", ")
            );
            for id in p.ids() {
                println!("  {id}");
            }
        }
        PolicyCmd::Explain {
            caller,
            connection,
            method,
            tool,
            arguments,
            http_method,
            path,
            policies,
        } => {
            let p = load_policies(policies.as_deref())?;
            let store = at.store().await?;
            let key = existing_master_key(&at.data_dir, &store).await?;
            let snap = tessera::snapshot::Snapshot::load(&store, &key, p.schema()).await?;
            let who = snap
                .callers
                .values()
                .find(|c| c.name == caller)
                .with_context(|| format!("no live caller named {caller:?}"))?;
            let conn = snap
                .connections
                .get(&connection)
                .with_context(|| format!("no live connection {connection:?}"))?;
            let http_method: http::Method = http_method
                .as_deref()
                .unwrap_or("POST")
                .parse()
                .expect("clap allows only methods");
            let rpc_method = (http_method == http::Method::POST)
                .then_some(method.as_deref())
                .flatten();
            let req = tessera::authz::AuthzRequest {
                caller: who,
                connection_id: &connection,
                connection: conn,
                entities: &snap.entities,
                revision: snap.revision,
                http_method: &http_method,
                path: &path,
                rpc_method,
                tool: tool.as_deref(),
                arguments: arguments.as_deref(),
                protocol_version: None,
                origin: None,
                time: std::time::SystemTime::now(),
            };
            let e = p.evaluate(&req);
            let decision = match (e.allowed, e.ask) {
                (true, false) => "allow",
                (true, true) => "ask (a person approves each call)",
                (false, _) => "deny",
            };
            if at.json {
                let v = serde_json::json!({
                    "decision": decision.split(' ').next(),
                    "action": Policies::action_name(&http_method, rpc_method),
                    "caller": caller, "connection": connection, "tool": tool,
                    "determined_by": e.policies, "errors": e.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
                });
                println!("{v}");
                return Ok(());
            }
            println!("decision: {decision}");
            println!(
                "action: {} (caller {caller}, connection {connection}{})",
                Policies::action_name(&http_method, rpc_method),
                tool.map(|t| format!(", tool {t}")).unwrap_or_default()
            );
            if e.policies.is_empty() {
                println!("determined by: no policy permits it");
            } else {
                println!("determined by: {}", e.policies.join(", "));
            }
            for err in &e.errors {
                println!("error: {err}");
            }
        }
    }
    Ok(())
}

async fn approval(at: &Place, c: ApprovalCmd) -> Result<()> {
    use tessera::telemetry::time::now_ms;
    let store = at.store().await?;
    match c {
        ApprovalCmd::List { all, limit, before } => {
            let rows = store
                .approvals_page(all, before.as_deref(), limit.max(1))
                .await?;
            let mut table = Vec::with_capacity(rows.len());
            for a in rows {
                if at.json {
                    println!("{}", serde_json::to_string(&a)?);
                    continue;
                }
                let at = std::time::UNIX_EPOCH + Duration::from_millis(a.created_at.max(0) as u64);
                let status = match (a.status, a.expires_at, a.uses_left) {
                    (tessera::store::model::Status::Granted, Some(exp), Some(uses))
                        if exp <= now_ms() || uses <= 0 =>
                    {
                        "spent"
                    }
                    (s, _, _) => s.as_str(),
                };
                let or_dash = |s: &str| {
                    if s.is_empty() {
                        "-".to_string()
                    } else {
                        s.to_string()
                    }
                };
                table.push(vec![
                    a.id,
                    status.to_string(),
                    tessera::telemetry::log::rfc3339(at),
                    a.key.caller,
                    a.key.connection.chars().take(8).collect(),
                    a.key.rpc_method,
                    or_dash(&a.key.tool),
                    // Rows recorded before calls were bound whole: `?`.
                    a.shown.sub_path.as_deref().map_or("?".into(), |p| {
                        or_dash(&match &a.shown.query {
                            Some(q) => format!("{p}?{q}"),
                            None => p.to_string(),
                        })
                    }),
                    a.shown.session.as_deref().map_or("?".into(), or_dash),
                    or_dash(a.key.arguments_sha256.get(..15).unwrap_or_default()),
                    a.reason.unwrap_or_else(|| "-".into()),
                ]);
            }
            if !at.json {
                let head = [
                    "ID", "STATUS", "ASKED", "CALLER", "CONN", "METHOD", "TOOL", "PATH", "SESSION",
                    "KEY", "REASON",
                ];
                print_table(&head, &table);
            }
        }
        ApprovalCmd::Grant { id, ttl, uses } => {
            let acting = store.acting(service::CLI, "approval.grant", &id);
            let done = service::approval_grant(&acting, &id, &ttl, uses).await;
            service::audited(&acting, done).await?;
            at.say(
                format!(
                    "granted {id}: the same call may run {uses} {} within {ttl}",
                    if uses == 1 { "time" } else { "times" }
                ),
                serde_json::json!({"granted": id, "uses": uses, "ttl": ttl}),
            );
        }
        ApprovalCmd::Deny { id } => {
            let acting = store.acting(service::CLI, "approval.deny", &id);
            let done = service::approval_deny(&acting, &id).await;
            service::audited(&acting, done).await?;
            at.say(format!("denied {id}"), serde_json::json!({"denied": id}));
        }
    }
    Ok(())
}

/// The master key ring given outside the data dir: `TESSERA_MASTER_KEY`
/// (keys separated by commas, the current first), else the file named by
/// `TESSERA_MASTER_KEY_FILE` (one key per line: a container secret).
fn master_key_setting() -> Result<Option<String>> {
    if let Ok(v) = std::env::var("TESSERA_MASTER_KEY") {
        return Ok(Some(v));
    }
    match std::env::var_os("TESSERA_MASTER_KEY_FILE") {
        None => Ok(None),
        Some(path) => std::fs::read_to_string(&path).map(Some).with_context(|| {
            format!(
                "reading TESSERA_MASTER_KEY_FILE {}",
                std::path::Path::new(&path).display()
            )
        }),
    }
}

fn master_key(data_dir: &std::path::Path) -> Result<MasterKey> {
    let env = master_key_setting()?;
    Ok(MasterKey::load(env.as_deref(), data_dir)?)
}

/// The master key for a store that may already hold sealed secrets: then a
/// missing key is an error, never a new key that would open none of them.
async fn existing_master_key(data_dir: &std::path::Path, store: &Store) -> Result<MasterKey> {
    if store.sealed_values().await?.is_empty() {
        return master_key(data_dir);
    }
    let env = master_key_setting()?;
    MasterKey::load_existing(env.as_deref(), data_dir).with_context(|| {
        "the database holds sealed secrets but no master key was found: set TESSERA_MASTER_KEY (or TESSERA_MASTER_KEY_FILE) or restore master.key in the data dir"
    })
}

async fn admin_token(at: &Place, c: AdminTokenCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        AdminTokenCmd::Add { name } => {
            let acting = store.acting(service::CLI, "admin-token.add", &name);
            let done = service::admin_token_add(&acting, &name).await;
            let token = service::audited(&acting, done).await?;
            at.say(
                format!(
                    "admin token {name} added; it is shown once, below:\n{}",
                    token.expose_secret()
                ),
                serde_json::json!({"name": name, "token": token.expose_secret()}),
            );
        }
        AdminTokenCmd::Revoke { name } => {
            let acting = store.acting(service::CLI, "admin-token.revoke", &name);
            let done = service::admin_token_revoke(&acting, &name).await;
            service::audited(&acting, done).await?;
            at.say(
                format!("admin token {name} revoked"),
                serde_json::json!({"revoked": name}),
            );
        }
        AdminTokenCmd::List => {
            let rows = store.admin_tokens().await?;
            if at.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.name, live(r.revoked_at).into()])
                    .collect();
                print_table(&["NAME", "STATUS"], &table);
            }
        }
    }
    Ok(())
}

async fn key(at: &Place, c: KeyCmd) -> Result<()> {
    let store = at.store().await?;
    let key = existing_master_key(&at.data_dir, &store).await?;
    match c {
        KeyCmd::Rotate => {
            let new = std::env::var("TESSERA_MASTER_KEY_NEW").ok();
            // On a terminal (and not for --json), a progress line on stderr.
            let show = !at.json && std::io::stderr().is_terminal();
            let acting = store.acting(service::CLI, "key.rotate", "*");
            let done = service::key_rotate(&acting, &key, new, |done, total| {
                if show {
                    eprint!("\rre-sealing secrets: {done}/{total}");
                    if done == total {
                        eprintln!();
                    }
                }
            })
            .await;
            let r = service::audited(&acting, done).await?;
            if at.json {
                let v = serde_json::json!({"resealed": r.resealed, "new_key": r.new_id, "file": r.file});
                println!("{v}");
                return Ok(());
            }
            println!(
                "re-sealed {} {} under key {}",
                r.resealed,
                if r.resealed == 1 { "secret" } else { "secrets" },
                r.new_id
            );
            match r.file {
                Some(f) => println!(
                    "{} now holds the new key first; the old keys stay in it to open anything sealed meanwhile. Remove their lines once `tessera key status` shows them unused.",
                    f.display()
                ),
                None => println!(
                    "set TESSERA_MASTER_KEY for every process to the new key, then the old ones (comma-separated), until `tessera key status` shows the old ones unused"
                ),
            }
        }
        KeyCmd::Status => {
            let uses = service::key_status(&store, &key).await?;
            if at.json {
                let v: Vec<_> = uses
                    .iter()
                    .map(|u| serde_json::json!({"key": u.id, "in_ring": u.in_ring, "current": u.current, "sealed": u.sealed}))
                    .collect();
                println!("{}", serde_json::Value::from(v));
                return Ok(());
            }
            let table: Vec<Vec<String>> = uses
                .into_iter()
                .map(|u| {
                    let ring = if u.in_ring { "yes" } else { "MISSING" };
                    let current = if u.current { "yes" } else { "" };
                    vec![u.id, ring.into(), current.into(), u.sealed.to_string()]
                })
                .collect();
            print_table(&["KEY", "RING", "CURRENT", "SEALED"], &table);
        }
    }
    Ok(())
}

async fn serve(at: &Place, a: ServeArgs) -> Result<()> {
    let log = tessera::telemetry::log::Buffered::stderr();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(log.clone());
    match a.log_format.as_str() {
        "json" => fmt.event_format(tessera::telemetry::log::JsonLines).init(),
        _ => fmt.event_format(tessera::telemetry::log::Logfmt).init(),
    }
    // Whatever ends serving, the buffered lines are written out first.
    let served = serve_logged(at, a, &log).await;
    log.flush();
    served
}

/// Returns glibc malloc's free pages to the system (see `tessera::telemetry::memory`).
/// The one unsafe call in tessera, kept in the binary: the library forbids
/// unsafe code.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: malloc_trim takes no pointer and has no precondition; it
    // walks glibc's own heap under glibc's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

async fn serve_logged(
    at: &Place,
    a: ServeArgs,
    log: &tessera::telemetry::log::Buffered,
) -> Result<()> {
    // Validate everything before binding a port.
    let cfg = config::parse_serve(raw_serve(&a))?;
    let policies = load_policies(a.policies.as_deref()).context("not serving")?;
    let store = at.store().await?;
    let key = existing_master_key(&at.data_dir, &store)
        .await
        .context("not serving")?;
    tracing::info!(policies = %policies.origin, count = policies.len(), "policies loaded");
    let (state, _refresher) =
        tessera::state::State::start(cfg.clone(), store, key, policies).await?;
    reload_policies_on_change(&state, a.policies.as_deref(), a.policy_check_ms)?;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(tessera::telemetry::memory::release_after_waves(
        state.metrics.clone(),
        Duration::from_secs(1),
        release_free_memory,
    ));
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let (stop_admin, admin_stopped) = tokio::sync::watch::channel(());
    serve_admin(&state, a.admin_listen, admin_stopped).await?;
    tracing::info!(
        listen = %listener.local_addr()?,
        public_url = %cfg.public_url,
        max_connections = cfg.max_connections,
        max_connections_per_source = cfg.max_connections_per_source,
        "tessera serving"
    );
    // Start-up lines are shown at once, not a second later.
    log.flush();
    let stopping = async {
        shutdown_signal().await;
        // A second signal while draining: exit now.
        tokio::spawn(async {
            shutdown_signal().await;
            tracing::warn!("second signal: exiting without waiting for requests in flight");
            std::process::exit(1);
        });
    };
    tessera::proxy::listener::run(
        listener,
        state.clone(),
        stopping,
        Duration::from_millis(a.shutdown_grace_ms),
    )
    .await;
    drop(stop_admin);
    // Every decision made is on disk before the process ends; a database
    // that does not take them within the grace period is an error exit.
    let grace = Duration::from_millis(a.shutdown_grace_ms);
    if !state.audit.flush(grace).await {
        anyhow::bail!(
            "the audit trail could not be written within {} ms ({} records still queued): the database did not take them",
            grace.as_millis(),
            state.audit.queued()
        );
    }
    Ok(())
}

/// Rows under a header, each column as wide as its widest cell (names of
/// any length stay aligned), the last column unpadded. Cells are shown
/// printable (`logging::printable`): a tool name an agent chose cannot
/// colour the table or split a row in two.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| tessera::telemetry::log::printable(c).into_owned())
                .collect()
        })
        .collect();
    let rows = &rows;
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(cell);
            let pad = width[i].saturating_sub(cell.chars().count());
            out.extend(std::iter::repeat_n(' ', pad));
        }
        println!("{}", out.trim_end());
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

/// `live` or `revoked`, from a revocation time.
fn live(revoked_at: Option<i64>) -> &'static str {
    if revoked_at.is_some() {
        "revoked"
    } else {
        "live"
    }
}

/// The serve settings as given, for [`config::parse_serve`].
fn raw_serve(a: &ServeArgs) -> RawServe {
    RawServe {
        listen: a.listen,
        public_url: a.public_url.clone(),
        allowed_origins: a.allowed_origins.clone(),
        max_body_bytes: a.max_body_bytes,
        max_connections: a.max_connections,
        max_connections_per_source: a.max_connections_per_source,
        max_body_memory: a.max_body_memory,
        open_files: tessera::limits::capacity::open_files_limit(),
        allow_private_upstreams: a.egress.allow_private_upstreams,
        allow_range: a.allow_range,
        forwarded: a.forwarded.clone(),
        upstream_roots: a.upstream_roots.clone(),
        upstream_ca_file: a.upstream_ca_file.clone(),
        max_headers: a.max_headers,
        max_header_bytes: a.max_header_bytes,
        max_uri_bytes: a.max_uri_bytes,
        header_timeout_ms: a.header_timeout_ms,
        body_timeout_ms: a.body_timeout_ms,
        max_batch: a.max_batch,
        caller_max_in_flight: a.caller_max_in_flight,
        caller_rate: a.caller_rate,
        caller_burst: a.caller_burst,
        connect_timeout_ms: a.connect_timeout_ms,
        upstream_timeout_ms: a.upstream_timeout_ms,
        idle_timeout_ms: a.idle_timeout_ms,
        refresh_ms: a.refresh_ms,
        audit_arguments: a.audit_arguments,
        audit_queue: a.audit_queue,
        db_timeout_ms: a.db_timeout_ms,
        authorizer_url: a.authorizer_url.clone(),
        authorizer_timeout_ms: a.authorizer_timeout_ms,
        authorizer_failure: a.authorizer_failure.clone(),
        max_pending_approvals: a.max_pending_approvals,
        tools_list_max_bytes: a.tools_list_max_bytes,
        token_margin_s: a.token_margin_s,
        token_timeout_ms: a.token_timeout_ms,
    }
}

/// `tessera config check`: print every setting `serve` would use, where it
/// came from, secrets redacted; then validate as `serve` does at start.
fn config_check(cli: &Cli, a: &ServeArgs, root: &clap::ArgMatches, from_file: &[String]) -> bool {
    let check = root
        .subcommand_matches("config")
        .and_then(|c| c.subcommand_matches("check"))
        .expect("config check was parsed");
    let source = |m: &clap::ArgMatches, id: &str, key: &str| match m.value_source(id) {
        Some(clap::parser::ValueSource::CommandLine) => "flag",
        Some(clap::parser::ValueSource::EnvVariable) => "env",
        Some(clap::parser::ValueSource::DefaultValue) if from_file.iter().any(|k| k == key) => {
            "file"
        }
        Some(_) => "default",
        None => "unset",
    };
    let mut rows = Vec::new();
    let mut push = |m: &clap::ArgMatches, cmd: &clap::Command| {
        for (key, id) in settings(cmd) {
            let values: Vec<String> = m
                .get_raw(&id)
                .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            let shown = values
                .iter()
                .map(|v| redact_setting(&key, v))
                .collect::<Vec<_>>()
                .join(",");
            rows.push((key.clone(), shown, source(m, &id, &key)));
        }
    };
    let cmd = Cli::command();
    push(root, &cmd);
    if let Some(serve) = cmd.find_subcommand("serve") {
        push(check, serve);
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (key, value, source) in &rows {
        println!("{key:<width$}  {value:<40}  ({source})");
    }
    let mut ok = true;
    let mut fail = |e: String| {
        eprintln!("tessera: invalid configuration: {e}");
        ok = false;
    };
    if let Some(url) = &cli.database_url {
        if let Err(e) = url.parse::<tessera::store::DatabaseUrl>() {
            fail(format!("--database-url: {e}"));
        }
    }
    if let Err(e) = config::parse_serve(raw_serve(a)) {
        fail(e.to_string());
    }
    if let Err(e) = load_policies(a.policies.as_deref()) {
        fail(format!("--policies: {e:#}"));
    }
    if ok {
        println!("configuration valid");
    }
    ok
}

/// A setting's value as `config check` shows it: a database password or
/// URL credentials become `***`.
fn redact_setting(key: &str, value: &str) -> String {
    if key == "database-url" {
        return match value.parse::<tessera::store::DatabaseUrl>() {
            Ok(u) => u.to_string(),
            Err(_) => "(unreadable; not shown)".to_string(),
        };
    }
    match url::Url::parse(value) {
        Ok(mut u) if u.password().is_some() || !u.username().is_empty() => {
            let _ = u.set_username("***");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => value.to_string(),
    }
}

/// Open the admin listener when at least one live admin token exists; it
/// closes when `stop` is dropped.
async fn serve_admin(
    state: &std::sync::Arc<tessera::state::State>,
    addr: SocketAddr,
    mut stop: tokio::sync::watch::Receiver<()>,
) -> Result<()> {
    let tokens = state.store.admin_tokens().await?;
    if tokens.iter().all(|t| t.revoked_at.is_some()) {
        tracing::info!(
            "admin listener off: no admin token (tessera admin-token add NAME, then restart)"
        );
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin listener {addr}"))?;
    tracing::info!(admin_listen = %listener.local_addr()?, "admin API serving");
    let app = tessera::admin::api::router(state.clone());
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.changed().await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "the admin listener failed");
        }
    });
    Ok(())
}

/// Reload the policy folder when its files change, on SIGHUP, and when
/// `tessera policy reload` asks. With the built-in set there is nothing to
/// reload, but SIGHUP is still caught so it does not end the process.
fn reload_policies_on_change(
    state: &tessera::state::State,
    dir: Option<&std::path::Path>,
    check_ms: u64,
) -> Result<()> {
    #[cfg(unix)]
    let hup = {
        let sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("installing the SIGHUP handler")?;
        Box::pin(futures_util::stream::unfold(sig, |mut s| async move {
            s.recv().await.map(|()| ((), s))
        }))
    };
    #[cfg(not(unix))]
    let hup = futures_util::stream::pending::<()>();
    // `tessera policy reload`, from any host, pokes like SIGHUP.
    let hup = futures_util::stream::select(hup, state.policy_reloads());
    match policy_dir(dir) {
        Some(dir) => {
            tokio::spawn(tessera::authz::cedar::watch_dir(
                state.authorizer.clone(),
                dir,
                Duration::from_millis(check_ms.max(1)),
                hup,
            ));
        }
        None => {
            tokio::spawn(async move {
                use futures_util::StreamExt;
                let mut hup = hup;
                while hup.next().await.is_some() {
                    tracing::info!(
                        "asked to reload: the built-in policies are in force; nothing to reload"
                    );
                }
            });
        }
    }
    Ok(())
}

/// Print audit records; with `follow`, keep polling for new ones.
async fn audit(
    store: &Store,
    mut q: tessera::store::model::AuditQuery,
    json: bool,
    follow: bool,
) -> Result<()> {
    if !json {
        println!(
            "{:<27} {:<16} {:<8} {:<6} {:<16} {:<20} {:<7} {:<6} REASON",
            "TIME", "CALLER", "CONN", "HTTP", "METHOD", "TOOL", "VERDICT", "STATUS"
        );
    }
    loop {
        let rows = store.audit(&q).await?;
        for r in &rows {
            if json {
                println!("{}", serde_json::to_string(r)?);
            } else {
                let at = std::time::UNIX_EPOCH + Duration::from_millis(r.at.max(0) as u64);
                // Method, tool and reason are an agent's words: printable.
                let p = |s: Option<&str>| {
                    tessera::telemetry::log::printable(s.unwrap_or("-")).into_owned()
                };
                println!(
                    "{:<27} {:<16} {:<8} {:<6} {:<16} {:<20} {:<7} {:<6} {}",
                    tessera::telemetry::log::rfc3339(at),
                    r.caller,
                    r.connection.chars().take(8).collect::<String>(),
                    r.http_method,
                    p(r.rpc_method.as_deref()),
                    p(r.tool.as_deref()),
                    r.verdict,
                    r.status,
                    p(r.reason.as_deref()),
                );
            }
        }
        if let Some(last) = rows.last() {
            q.after_id = Some(last.id);
        }
        if !follow {
            return Ok(());
        }
        if q.after_id.is_none() {
            q.after_id = Some(0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

fn read_secret(env_var: Option<&str>) -> Result<SecretString> {
    let s = match env_var {
        Some(var) => std::env::var(var)
            .with_context(|| format!("environment variable {var} is not set (or not UTF-8)"))?,
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the secret from stdin (end with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the secret from stdin")?;
            s
        }
    };
    // One trailing newline is what `echo` and editors add; it is not part
    // of the secret.
    let s = s
        .strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&s);
    if s.is_empty() {
        bail!("the secret is empty");
    }
    Ok(SecretString::from(s.to_string()))
}

async fn credential(at: &Place, c: CredentialCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        CredentialCmd::Add {
            name,
            upstream,
            scheme,
            header_name,
            username,
            secret,
            oauth,
            egress,
        } => {
            if scheme == "oauth2" {
                if header_name.is_some() || username.is_some() {
                    bail!("--header-name and --username do not apply to --scheme oauth2");
                }
                let given = (name.as_str(), upstream.as_str());
                return credential_add_oauth(at, &store, given, &secret, *oauth, egress.egress())
                    .await;
            }
            let secret = secret.read()?;
            let key = master_key(&at.data_dir)?;
            let spec = CredentialSpec {
                name: &name,
                egress: egress.egress(),
                upstream: &upstream,
                scheme: scheme.parse::<Scheme>()?,
                header_name: header_name.as_deref(),
                username: username.as_deref(),
                secret,
            };
            let acting = store.acting(service::CLI, "credential.add", &name);
            let done = service::credential_add(&acting, &key, spec).await;
            service::audited(&acting, done).await?;
            at.say(
                format!("credential {name} added for {upstream}"),
                serde_json::json!({"added": name, "upstream": upstream}),
            );
        }
        CredentialCmd::SetSecret { name, secret } => {
            let secret = secret.read()?;
            let key = existing_master_key(&at.data_dir, &store).await?;
            let acting = store.acting(service::CLI, "credential.set-secret", &name);
            let done = service::credential_set_secret(&acting, &key, &name, secret).await;
            service::audited(&acting, done).await?;
            at.say(
                format!("credential {name}: secret replaced"),
                serde_json::json!({"secret_replaced": name}),
            );
        }
        CredentialCmd::Login {
            name,
            upstream,
            client_id,
            client_secret_env,
            scopes,
            wait_s,
            egress,
        } => {
            service::check_name(&name)?;
            let upstream = service::check_upstream(&upstream)?;
            service::check_egress(egress.egress(), "upstream URL", &upstream).await?;
            let client_secret = client_secret_env
                .as_deref()
                .map(|v| read_secret(Some(v)))
                .transpose()?;
            let key = master_key(&at.data_dir)?;
            // Every URL the flow fetches (metadata, registration, token) was
            // chosen by the upstream or its authorization server: the same
            // egress rule applies to them.
            let client = tessera::upstream::client(
                Duration::from_secs(10),
                Duration::from_secs(30),
                egress.egress(),
            );
            let spec = tessera::credentials::login::LoginSpec {
                name,
                upstream,
                client_id,
                client_secret,
                scopes,
                wait: Duration::from_secs(wait_s.max(1)),
            };
            tessera::credentials::login::login(&store, &key, &client, spec, |line| {
                use std::io::Write;
                println!("{line}");
                let _ = std::io::stdout().flush();
            })
            .await?;
        }
        CredentialCmd::List => {
            let rows = service::credentials(&store).await?;
            if at.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.name, r.scheme, r.upstream])
                    .collect();
                print_table(&["NAME", "SCHEME", "UPSTREAM"], &table);
            }
        }
    }
    Ok(())
}

/// `credential add --scheme oauth2`.
async fn credential_add_oauth(
    at: &Place,
    store: &Store,
    (name, upstream): (&str, &str),
    secret: &SecretSource,
    oauth: OAuthArgs,
    egress: tessera::upstream::egress::Egress,
) -> Result<()> {
    if secret.secret_stdin && oauth.refresh_token_stdin {
        bail!("only one of the client secret and the refresh token can come from stdin");
    }
    let client_secret = secret.given().then(|| secret.read()).transpose()?;
    let refresh_token = (oauth.refresh_token_env.is_some() || oauth.refresh_token_stdin)
        .then(|| read_secret(oauth.refresh_token_env.as_deref()))
        .transpose()?;
    let key = master_key(&at.data_dir)?;
    let acting = store.acting(service::CLI, "credential.add", name);
    let done = service::credential_add_oauth(
        &acting,
        &key,
        service::OAuthSpec {
            name,
            egress,
            upstream,
            token_url: oauth
                .token_url
                .as_deref()
                .context("--scheme oauth2 needs --token-url")?,
            client_id: oauth
                .client_id
                .as_deref()
                .context("--scheme oauth2 needs --client-id")?,
            scopes: oauth.scopes,
            audience: oauth.audience,
            client_secret,
            refresh_token,
        },
    )
    .await;
    service::audited(&acting, done).await?;
    at.say(
        format!("credential {name} added for {upstream} (OAuth 2)"),
        serde_json::json!({"added": name, "upstream": upstream, "scheme": "oauth2"}),
    );
    Ok(())
}

async fn caller(at: &Place, c: CallerCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        CallerCmd::Add { name, groups } => {
            let acting = store.acting(service::CLI, "caller.add", &name);
            let done = service::caller_add(&acting, &name, &groups).await;
            let token = service::audited(&acting, done).await?;
            at.say(
                format!(
                    "caller {name} added; its token is shown once, below:\n{}",
                    token.expose_secret()
                ),
                serde_json::json!({"name": name, "token": token.expose_secret()}),
            );
        }
        CallerCmd::Revoke { name } => {
            let acting = store.acting(service::CLI, "caller.revoke", &name);
            let done = service::caller_revoke(&acting, &name).await;
            service::audited(&acting, done).await?;
            at.say(
                format!("caller {name} revoked"),
                serde_json::json!({"revoked": name}),
            );
        }
        CallerCmd::List => {
            let rows = service::callers(&store).await?;
            if at.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.name, live(r.revoked_at).into(), r.groups.join(",")])
                    .collect();
                print_table(&["NAME", "STATUS", "GROUPS"], &table);
            }
        }
    }
    Ok(())
}

async fn connection(at: &Place, c: ConnectionCmd) -> Result<()> {
    let store = at.store().await?;
    match c {
        ConnectionCmd::Add {
            caller,
            credential,
            public_url,
        } => {
            let public_url = match public_url {
                Some(u) => config::parse_public_url(&u)?,
                None => config::default_public_url(config::DEFAULT_LISTEN.parse()?),
            };
            let target = format!("{caller} on {credential}");
            let acting = store.acting(service::CLI, "connection.add", &target);
            let done = service::connection_add(&acting, &public_url, &caller, &credential).await;
            let url = service::audited(&acting, done).await?;
            let id = service::connection_id(&url)?;
            let v = serde_json::json!({"id": id, "url": url, "caller": caller, "credential": credential});
            at.say(
                format!("connection added for caller {caller} on credential {credential}:\n{url}"),
                v,
            );
        }
        ConnectionCmd::Revoke { id_or_url } => {
            let acting = store.acting(service::CLI, "connection.revoke", &id_or_url);
            let done = service::connection_revoke(&acting, &id_or_url).await;
            service::audited(&acting, done).await?;
            at.say(
                "connection revoked",
                serde_json::json!({"revoked": service::connection_id(&id_or_url)?}),
            );
        }
        ConnectionCmd::List => {
            let rows = service::connections(&store).await?;
            if at.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                let table: Vec<Vec<String>> = rows
                    .into_iter()
                    .map(|r| vec![r.id, r.caller, r.credential, live(r.revoked_at).into()])
                    .collect();
                print_table(&["ID", "CALLER", "CREDENTIAL", "STATUS"], &table);
            }
        }
    }
    Ok(())
}
