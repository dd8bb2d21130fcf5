//! `tessera credential`: upstreams and their credentials.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use tessera::admin::service::{self, CredentialSpec};
use tessera::admin::service::{Admin, CLI};
use tessera::crypto::keyring::SecretString;
use tessera::store::model::Scheme;
use tessera::store::Store;

use super::*;

/// Whether upstreams may be internal (see `tessera::upstream::egress`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub(crate) struct EgressArgs {
    /// Allow upstreams (and OAuth token URLs) on loopback, private,
    /// link-local or metadata addresses, and over plain http://. Off by
    /// default: a sidecar whose upstream runs on the same host needs it.
    #[arg(long, env = "TESSERA_ALLOW_PRIVATE_UPSTREAMS", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) allow_private_upstreams: bool,
}

impl EgressArgs {
    pub(crate) fn egress(self) -> tessera::upstream::egress::Egress {
        tessera::upstream::egress::Egress {
            allow_private: self.allow_private_upstreams,
        }
    }
}

/// Where a secret is read from: never the command line. (With --scheme
/// oauth2 it is the client secret, also spelt --client-secret-env/-stdin.)
#[derive(Args)]
pub(crate) struct SecretSource {
    /// An environment variable holding the secret.
    #[arg(long, alias = "client-secret-env", conflicts_with = "secret_stdin")]
    pub(crate) secret_env: Option<String>,
    /// Read the secret from stdin.
    #[arg(long, alias = "client-secret-stdin")]
    pub(crate) secret_stdin: bool,
}

impl SecretSource {
    pub(crate) fn given(&self) -> bool {
        self.secret_env.is_some() || self.secret_stdin
    }

    /// The secret, which must be given.
    pub(crate) fn read(&self) -> Result<SecretString> {
        if !self.given() {
            bail!("give the secret with --secret-env VAR or --secret-stdin");
        }
        read_secret(self.secret_env.as_deref())
    }
}

/// An OAuth 2.x credential's settings (`--scheme oauth2`).
#[derive(Args)]
pub(crate) struct OAuthArgs {
    /// The authorization server's token endpoint.
    #[arg(long)]
    pub(crate) token_url: Option<String>,
    /// The client id tessera authenticates as at the token endpoint.
    #[arg(long)]
    pub(crate) client_id: Option<String>,
    /// A scope to ask for (repeatable).
    #[arg(long = "scope")]
    pub(crate) scopes: Vec<String>,
    /// The `audience` parameter some authorization servers want.
    #[arg(long)]
    pub(crate) audience: Option<String>,
    /// An environment variable holding a refresh token: the refresh-token
    /// grant is used (else client credentials).
    #[arg(long, conflicts_with = "refresh_token_stdin")]
    pub(crate) refresh_token_env: Option<String>,
    /// Read the refresh token from stdin.
    #[arg(long)]
    pub(crate) refresh_token_stdin: bool,
}

#[derive(Subcommand)]
pub(crate) enum CredentialCmd {
    /// Register an upstream and its credential. The secret is read from an
    /// environment variable or stdin, never from the command line.
    Add {
        /// The credential's name (letters, digits, '.', '_', '-').
        name: String,
        /// The upstream MCP server's URL (https; http and internal hosts
        /// need --allow-private-upstreams).
        #[arg(long)]
        upstream: String,
        /// How the secret is sent: bearer (Authorization: Bearer), basic,
        /// header (--header-name), or oauth2 (a token from --token-url).
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
        /// The credential's name.
        name: String,
        #[command(flatten)]
        secret: SecretSource,
    },
    /// Register an upstream that needs a person's consent: discover its
    /// authorization server (MCP authorization spec), register a client
    /// when no --client-id is given, print a URL to authorize tessera, and
    /// store the resulting tokens sealed.
    Login {
        /// The credential's name.
        name: String,
        /// The upstream MCP server's URL.
        #[arg(long)]
        upstream: String,
        /// A client id registered with the authorization server (default:
        /// dynamic client registration).
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
        /// The certificate authorities the login's TLS trusts, as serve's:
        /// webpki (the Mozilla roots built in) or platform.
        #[arg(long, env = "TESSERA_UPSTREAM_ROOTS", default_value = tessera::config::DEFAULT_UPSTREAM_ROOTS)]
        upstream_roots: String,
        /// A PEM bundle of certificate authorities trusted besides
        /// --upstream-roots (an authorization server behind a private CA).
        #[arg(long, env = "TESSERA_UPSTREAM_CA_FILE")]
        upstream_ca_file: Option<String>,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// Change a credential's upstream URL or scheme options; requests use
    /// the change within one refresh. (The secret: set-secret.)
    Update {
        /// The credential's name.
        name: String,
        /// A new upstream URL.
        #[arg(long)]
        upstream: Option<String>,
        /// A new header name (--scheme header credentials).
        #[arg(long)]
        header_name: Option<String>,
        /// A new user name (--scheme basic credentials).
        #[arg(long)]
        username: Option<String>,
        /// A new token endpoint (oauth2 credentials).
        #[arg(long)]
        token_url: Option<String>,
        /// The scopes to ask for, replacing the old ones (repeatable;
        /// oauth2 credentials).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// A new audience; "" removes it (oauth2 credentials).
        #[arg(long)]
        audience: Option<String>,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// Remove a credential and its sealed secret. Refused while a live
    /// connection uses it, unless --cascade.
    Remove {
        /// The credential's name.
        name: String,
        /// Also remove the connections that use it.
        #[arg(long)]
        cascade: bool,
    },
    /// Every credential: name, upstream, scheme (never a secret).
    List,
}

pub(crate) async fn credential(at: &Place, c: CredentialCmd) -> Result<()> {
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
            Admin::new(&store, CLI).credential_add(&key, spec).await?;
            at.say(
                format!("credential {name} added for {upstream}"),
                serde_json::json!({"added": name, "upstream": upstream}),
            );
        }
        CredentialCmd::Update {
            name,
            upstream,
            header_name,
            username,
            token_url,
            scopes,
            audience,
            egress,
        } => {
            let change = service::CredentialChange {
                name: &name,
                egress: egress.egress(),
                upstream: upstream.as_deref(),
                header_name: header_name.as_deref(),
                username: username.as_deref(),
                token_url: token_url.as_deref(),
                scopes: (!scopes.is_empty()).then_some(scopes),
                audience: audience.as_deref(),
            };
            if change.is_empty() {
                bail!("nothing to change: give --upstream, --header-name, --username, --token-url, --scope or --audience");
            }
            Admin::new(&store, CLI).credential_update(change).await?;
            at.say(
                format!("credential {name} updated"),
                serde_json::json!({"updated": name}),
            );
        }
        CredentialCmd::Remove { name, cascade } => {
            let n = Admin::new(&store, CLI)
                .credential_remove(&name, cascade)
                .await?;
            at.say(
                format!("credential {name} removed, with its {n} connection(s)"),
                serde_json::json!({"removed": name, "connections_removed": n}),
            );
        }
        CredentialCmd::SetSecret { name, secret } => {
            let secret = secret.read()?;
            let key = existing_master_key(&at.data_dir, &store).await?;
            Admin::new(&store, CLI)
                .credential_set_secret(&key, &name, secret)
                .await?;
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
            upstream_roots,
            upstream_ca_file,
            egress,
        } => {
            let roots =
                tessera::config::upstream_roots(&upstream_roots, upstream_ca_file.as_deref())?;
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
            let client = tessera::upstream::client_with_roots(
                Duration::from_secs(10),
                Duration::from_secs(30),
                egress.egress(),
                roots,
            );
            let spec = tessera::credentials::login::LoginSpec {
                name,
                upstream,
                client_id,
                client_secret,
                scopes,
                wait: Duration::from_secs(wait_s.max(1)),
            };
            Admin::new(&store, CLI)
                .credential_login(&key, &client, spec, |line| {
                    use std::io::Write;
                    out!("{line}");
                    let _ = std::io::stdout().flush();
                })
                .await?;
        }
        CredentialCmd::List => {
            let rows = service::credentials(&store).await?;
            if at.json {
                out!("{}", serde_json::to_string_pretty(&rows)?);
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
pub(crate) async fn credential_add_oauth(
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
    Admin::new(store, CLI)
        .credential_add_oauth(
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
        .await?;
    at.say(
        format!("credential {name} added for {upstream} (OAuth 2)"),
        serde_json::json!({"added": name, "upstream": upstream, "scheme": "oauth2"}),
    );
    Ok(())
}
