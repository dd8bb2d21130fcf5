//! The command line: the commands, their settings (flag > environment >
//! settings file > default, merged here) and where they keep state (the
//! data dir, the database, the master key). One file per command group;
//! the work is the library's, the printing is here.

/// `println!` that ends the command quietly when the reader has gone away
/// (`tessera audit | head -1`): see [`write_line`].
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::write_line(format_args!($($t)*))
    };
}

mod admin_token;
mod approval;
mod audit;
mod caller;
mod config;
mod connection;
mod credential;
mod key;
mod log_level;
mod output;
mod policy;
mod probe;
mod serve;
mod tool;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tessera::crypto::keyring::MasterKey;
use tessera::store::Store;

pub(crate) use self::admin_token::*;
pub(crate) use self::approval::*;
pub(crate) use self::audit::*;
pub(crate) use self::caller::*;
pub(crate) use self::config::*;
pub(crate) use self::connection::*;
pub(crate) use self::credential::*;
pub(crate) use self::key::*;
pub(crate) use self::log_level::*;
pub(crate) use self::output::*;
pub(crate) use self::policy::*;
pub(crate) use self::probe::*;
pub(crate) use self::serve::*;
pub(crate) use self::tool::*;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "A credential-holding MCP forwarding proxy"
)]
pub(crate) struct Cli {
    /// Folder holding the database and the master key file.
    #[arg(
        long,
        env = "TESSERA_DATA_DIR",
        default_value = IMPLICIT_DATA_DIR,
        global = true
    )]
    pub(crate) data_dir: PathBuf,
    /// The database: sqlite://PATH, or postgres://USER@HOST/DB for
    /// replicas sharing one store (default: tessera.db in the data dir).
    /// TESSERA_DATABASE_URL_FILE names a file holding it instead (a
    /// container secret: the URL may hold a password).
    #[arg(long, env = "TESSERA_DATABASE_URL", global = true)]
    pub(crate) database_url: Option<String>,
    /// A settings file (TOML): one key per setting, named as its flag
    /// (`listen = "127.0.0.1:7470"`). Flags and environment variables win
    /// over it; it wins over the defaults.
    #[arg(long, env = "TESSERA_CONFIG", global = true)]
    pub(crate) config: Option<PathBuf>,
    /// Print JSON for scripts: one object per result (one per line for
    /// `audit` and `approval list`), never a table or a sentence.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// Where this process keeps its state: the data dir (the master key file,
/// and the SQLite database unless another database is named).
pub(crate) struct Place {
    pub(crate) data_dir: PathBuf,
    pub(crate) database: Option<tessera::store::DatabaseUrl>,
    /// `--json`: results as JSON for scripts.
    pub(crate) json: bool,
}

/// The data dir when none was named: `serve` and `init` create it; every
/// other command refuses to, so that a command run from the wrong folder
/// cannot "succeed" into a store no `serve` reads.
pub(crate) const IMPLICIT_DATA_DIR: &str = "./tessera-data";

/// Whether the store is the implicit default: no data dir named (flag,
/// environment or settings file) and no database named.
pub(crate) fn implicit_store(matches: &clap::ArgMatches, from_file: &[String]) -> bool {
    let named = |id: &str, key: &str| {
        from_file.iter().any(|k| k == key)
            || matches!(
                matches.value_source(id),
                Some(
                    clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable
                )
            )
    };
    !named("data_dir", "data-dir")
        && !named("database_url", "database-url")
        && std::env::var_os("TESSERA_DATABASE_URL_FILE").is_none()
}

impl Place {
    /// Print a command's result: `json` with `--json`, else `text`.
    pub(crate) fn say(&self, text: impl std::fmt::Display, json: serde_json::Value) {
        if self.json {
            out!("{json}");
        } else {
            out!("{text}");
        }
    }
}

impl Place {
    pub(crate) async fn store(&self) -> Result<Store> {
        self.store_with_pool(None).await
    }

    /// The store, its pool at most `pool_size` connections (`None`: the
    /// default).
    pub(crate) async fn store_with_pool(&self, pool_size: Option<u32>) -> Result<Store> {
        Store::open_with_pool(&self.data_dir, self.database.as_ref(), pool_size)
            .await
            .with_context(|| match &self.database {
                Some(url) => format!("opening the database {url}"),
                None => format!("opening the database in {}", self.data_dir.display()),
            })
    }
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
    /// Tools pinned per credential: review what an upstream changed or
    /// added (tool pinning, serve --pin-tools).
    #[command(subcommand)]
    Tool(ToolCmd),
    /// The master key ring that seals stored secrets.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Tokens for the admin HTTP API (`serve --admin-listen`).
    #[command(subcommand)]
    AdminToken(AdminTokenCmd),
    /// The settings `serve` would run with.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Change a running serve's log filter at once, through its admin API
    /// (an admin token in TESSERA_ADMIN_TOKEN).
    LogLevel(LogLevelArgs),
    /// Ask a running serve's ops listener whether it is alive or ready
    /// (exit 0 on 200): for container healthchecks.
    Probe(ProbeArgs),
    /// Create the data dir (the SQLite database and the master key) or
    /// migrate the named database; other admin commands refuse to create
    /// the default ./tessera-data themselves.
    Init,
    /// Apply the database migrations (serve and every command also do at
    /// start) and print the schema version.
    Migrate,
    /// The audit trail of authorization decisions, oldest first.
    Audit {
        /// Only this caller's records.
        #[arg(long)]
        caller: Option<String>,
        /// A connection's id or URL (an id may begin with '-').
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
        /// Only one request's records: the id in its answer's
        /// X-Request-Id and its access line (the caller's trace id when it
        /// sent a traceparent).
        #[arg(long)]
        request_id: Option<String>,
    },
}

/// The settings file named by `--config FILE` (or `--config=FILE`) or
/// `TESSERA_CONFIG`, found before clap parses, since its values become
/// clap's defaults.
pub(crate) fn config_path() -> Option<PathBuf> {
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
pub(crate) fn settings(cmd: &clap::Command) -> Vec<(String, String)> {
    cmd.get_arguments()
        .filter_map(|a| Some((a.get_long()?, a.get_id().as_str())))
        .filter(|(l, _)| !matches!(*l, "config" | "help" | "version" | "json"))
        .map(|(l, id)| (l.to_string(), id.to_string()))
        .collect()
}

/// The commands that read `serve`'s settings from the settings file:
/// `serve` itself, `config check` (which shows them), and the connection
/// commands (whose URLs are built from `listen` and `public-url`).
const READS_SERVE_SETTINGS: &[&[&str]] = &[
    &["serve"],
    &["config", "check"],
    &["connection", "add"],
    &["connection", "list"],
    &["approval", "explain"],
    &["log-level"],
    &["probe"],
];

/// `cmd` with the setting `key` (a long flag name) of the subcommand at
/// `path` defaulted by `set`, when that subcommand has the setting.
fn with_setting(
    cmd: clap::Command,
    path: &[&str],
    key: &str,
    set: &dyn Fn(clap::Arg) -> clap::Arg,
) -> clap::Command {
    let Some((first, rest)) = path.split_first() else {
        let id = settings(&cmd).into_iter().find(|s| s.0 == key).map(|s| s.1);
        return match id {
            Some(id) => cmd.mut_arg(id, set),
            None => cmd,
        };
    };
    if cmd.find_subcommand(first).is_none() {
        return cmd;
    }
    cmd.mut_subcommand(*first, |c| with_setting(c, rest, key, set))
}

/// For a refused value, where it came from when not from the command line:
/// the environment variable or the settings file that set it (clap's
/// message names only the flag).
fn value_source_note(e: &clap::Error, cmd: &clap::Command, from_file: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind as K};
    if !matches!(e.kind(), K::ValueValidation | K::InvalidValue) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let on_line =
        std::env::args().any(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")));
    if on_line {
        return None;
    }
    fn find<'a>(cmd: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
        cmd.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .or_else(|| cmd.get_subcommands().find_map(|s| find(s, long)))
    }
    let env = find(cmd, long)
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .filter(|v| std::env::var_os(v).is_some());
    match env {
        Some(var) => Some(format!("note: the value comes from the environment variable {var}")),
        None if from_file.iter().any(|k| k == long) => Some(format!(
            "note: the value comes from the settings file ({long}); a flag or environment variable overrides it"
        )),
        None => None,
    }
}

/// The command line, with the settings file's values as defaults of the
/// global settings and of `serve` (and `config check`, which shows them).
/// Also the file's keys, to tell where a value came from.
pub(crate) fn parse_cli() -> Result<(Cli, clap::ArgMatches, Vec<String>)> {
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
        let file = tessera::config::parse_settings_file(&name, &text, &known)?;
        for (key, values) in file.values {
            let set = |a: clap::Arg| a.default_values(values.clone());
            if let Some((_, id)) = global.iter().find(|s| s.0 == key) {
                cmd = cmd.mut_arg(id, set);
            }
            for path in READS_SERVE_SETTINGS {
                cmd = with_setting(cmd, path, &key, &set);
            }
            from_file.push(key);
        }
    }
    let matches = match cmd.clone().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind as K;
            let shown = matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            );
            if shown {
                e.exit()
            }
            let note = value_source_note(&e, &cmd, &from_file);
            let text = hide_secrets(&e, e.render().to_string().trim());
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            if json_requested() {
                // The message alone: the usage lines are for a person.
                let end = ["\n\nUsage:", "\n\nFor more information"]
                    .iter()
                    .filter_map(|m| text.find(m))
                    .min()
                    .unwrap_or(text.len());
                let text = match &note {
                    Some(n) => format!("{}\n{n}", &text[..end]),
                    None => text[..end].to_string(),
                };
                report_error(&text, true);
            } else {
                eprintln!("tessera: {text}");
                if let Some(n) = note {
                    eprintln!("{n}");
                }
            }
            std::process::exit(e.exit_code())
        }
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    Ok((cli, matches, from_file))
}

pub(crate) async fn dispatch(cli: Cli, implicit: bool) -> Result<()> {
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
    // The commands that reach a running serve, not the store.
    match cli.cmd {
        Cmd::LogLevel(a) => return log_level(&at, a).await,
        Cmd::Probe(a) => return probe(&at, a).await,
        _ => {}
    }
    let creates = matches!(cli.cmd, Cmd::Serve(_) | Cmd::Init);
    if implicit && !creates && !at.data_dir.exists() {
        let here = std::env::current_dir()
            .map(|d| d.join("tessera-data").display().to_string())
            .unwrap_or_else(|_| IMPLICIT_DATA_DIR.to_string());
        anyhow::bail!(
            "no tessera data dir at {here}: run this where `tessera serve` runs, or name its store with --data-dir DIR (TESSERA_DATA_DIR) or --database-url URL (TESSERA_DATABASE_URL), or create one here with `tessera init`"
        );
    }
    match cli.cmd {
        Cmd::Serve(a) => serve(&at, *a).await,
        Cmd::Init => {
            let store = at.store().await?;
            // The master key too: created beside a new SQLite database.
            existing_master_key(&at.data_dir, &store).await?;
            let v = store.schema_version();
            let place = match &at.database {
                Some(url) => url.to_string(),
                None => at.data_dir.display().to_string(),
            };
            let named = match (&at.database, at.data_dir.as_path()) {
                (Some(_), _) => " --database-url …".to_string(),
                (None, d) if d == std::path::Path::new(IMPLICIT_DATA_DIR) => String::new(),
                (None, d) => format!(" --data-dir {}", d.display()),
            };
            at.say(
                format!("tessera store ready at {place} (schema at migration {v}); next: tessera{named} serve (with --allow-private-upstreams for an upstream on this machine or a private network)"),
                serde_json::json!({"store": place, "schema_version": v}),
            );
            Ok(())
        }
        Cmd::Credential(c) => credential(&at, c).await,
        Cmd::Caller(c) => caller(&at, c).await,
        Cmd::Connection(c) => connection(&at, c).await,
        Cmd::Policy(c) => policy(&at, c).await,
        Cmd::Approval(c) => approval(&at, c).await,
        Cmd::Tool(c) => tool(&at, c).await,
        Cmd::Key(c) => key(&at, c).await,
        Cmd::AdminToken(c) => admin_token(&at, c).await,
        // Handled in main, before a runtime is built; and above.
        Cmd::Config(_) | Cmd::LogLevel(_) | Cmd::Probe(_) => Ok(()),
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
            request_id,
        } => {
            let since = match since {
                None => None,
                Some(s) => Some(tessera::audit::parse_since(&s).with_context(|| {
                    format!("--since {s:?}: give a number and a unit: 30s, 15m, 1h, 7d")
                })?),
            };
            let connection = connection
                .map(|c| tessera::admin::service::connection_id(&c).map(str::to_string))
                .transpose()?;
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
                request_id,
                ..Default::default()
            };
            audit(&store, q, at.json, follow).await
        }
    }
}

/// The master key ring given outside the data dir: `TESSERA_MASTER_KEY`
/// (keys separated by commas, the current first), else the file named by
/// `TESSERA_MASTER_KEY_FILE` (one key per line: a container secret).
pub(crate) fn master_key_setting() -> Result<Option<String>> {
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

pub(crate) fn master_key(data_dir: &std::path::Path) -> Result<MasterKey> {
    let env = master_key_setting()?;
    Ok(MasterKey::load(env.as_deref(), data_dir)?)
}

/// The master key for a store that may already hold sealed secrets: then a
/// missing key is an error, never a new key that would open none of them.
pub(crate) async fn existing_master_key(
    data_dir: &std::path::Path,
    store: &Store,
) -> Result<MasterKey> {
    if store.sealed_values().await?.is_empty() {
        return master_key(data_dir);
    }
    let env = master_key_setting()?;
    MasterKey::load_existing(env.as_deref(), data_dir).with_context(|| {
        "the database holds sealed secrets but no master key was found: set TESSERA_MASTER_KEY (or TESSERA_MASTER_KEY_FILE) or restore master.key in the data dir"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand and every flag or argument says what it is for in
    /// `--help`.
    #[test]
    fn every_command_and_flag_has_a_help_line() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.get_help().is_none() && !matches!(id, "help" | "version") {
                    missing.push(format!("{path} {id}"));
                }
            }
            for s in cmd.get_subcommands() {
                let path = format!("{path} {}", s.get_name());
                if s.get_about().is_none() && s.get_name() != "help" {
                    missing.push(path.clone());
                }
                walk(s, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "tessera", &mut missing);
        assert!(missing.is_empty(), "no help line: {missing:#?}");
    }
}
