//! Tables, and secrets read from the environment or stdin.

use std::io::{IsTerminal, Read};

use anyhow::{bail, Context, Result};
use tessera::crypto::keyring::SecretString;

/// One line on stdout. A reader that went away (`tessera audit | head -1`,
/// a closed pipe) ends the command quietly with success, as Unix tools do;
/// any other write error ends it with that error.
pub(crate) fn write_line(line: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}") {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("tessera: writing to stdout: {e}");
            std::process::exit(1);
        }
    }
}

/// A command's failure on stderr: `tessera: …` for a person, one JSON
/// object `{"error": "…"}` with `--json`.
pub(crate) fn report_error(message: &str, json: bool) {
    if json {
        eprintln!("{}", serde_json::json!({ "error": message }));
    } else {
        eprintln!("tessera: {message}");
    }
}

/// A command-line error with every quoted value that looks like a secret
/// hidden: a token pasted where a flag or a variable's name belongs
/// (`--secret-stdin "$TOKEN"`) is echoed by the parser as "unexpected
/// argument '…'", and an error goes to logs and terminals.
pub(crate) fn hide_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('\'');
    out.push_str(parts.next().unwrap_or_default());
    for (i, part) in parts.enumerate() {
        out.push('\'');
        // Odd pieces are inside quotes. A stray value the parser did not
        // expect (`--secret-stdin "$TOKEN"`) is hidden whatever it looks
        // like; a flag's name is shown.
        let stray = out.ends_with("unexpected argument '") && !part.starts_with('-');
        if i % 2 == 0 && (stray || looks_secret(part)) {
            out.push_str("[not shown: it looks like a secret]");
        } else {
            out.push_str(part);
        }
    }
    out
}

/// A value shaped like a token or key rather than a name, flag, path or
/// URL: long, one word, letters and digits mixed.
pub(crate) fn looks_secret(s: &str) -> bool {
    s.len() >= 16
        && !s.chars().any(char::is_whitespace)
        && !s.starts_with(['-', '/', '.', '<', '['])
        && !s.contains("://")
        && s.chars().any(|c| c.is_ascii_digit())
        && s.chars().any(|c| c.is_ascii_alphabetic())
}

/// Whether `--json` is among the arguments: for errors found before the
/// command line is parsed.
pub(crate) fn json_requested() -> bool {
    std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

/// Rows under a header, each column as wide as its widest cell (names of
/// any length stay aligned), the last column unpadded. Cells are shown
/// printable (`tessera::telemetry::log::printable`): a tool name an agent chose cannot
/// colour the table or split a row in two.
pub(crate) fn print_table(header: &[&str], rows: &[Vec<String>]) {
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
        out!("{}", out.trim_end());
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

/// `live` or `revoked`, from a revocation time.
pub(crate) fn live(revoked_at: Option<i64>) -> &'static str {
    if revoked_at.is_some() {
        "revoked"
    } else {
        "live"
    }
}

/// Whether `s` reads as the conventional name of an environment variable
/// (`GITHUB_TOKEN`: upper-case letters, digits and `_`, not starting with a
/// digit) and may be echoed in an error. Anything else given to a `--*-env`
/// flag may be a secret pasted in place of its variable's name
/// (`--secret-env "$TOKEN"`), and is never echoed.
pub(crate) fn env_var_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

pub(crate) fn read_secret(env_var: Option<&str>) -> Result<SecretString> {
    let s = match env_var {
        Some(var) => match std::env::var(var) {
            Ok(v) => v,
            Err(e) if env_var_name(var) => bail!(
                "environment variable {var} {}",
                match e {
                    std::env::VarError::NotPresent => "is not set",
                    std::env::VarError::NotUnicode(_) => "is not UTF-8",
                }
            ),
            Err(_) => bail!(
                "the --*-env flags take the name of an environment variable (like GITHUB_TOKEN), not its value; the one given is not set, and is not shown, since it may be the secret itself"
            ),
        },
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

#[cfg(test)]
mod tests {
    use super::env_var_name;

    #[test]
    fn a_pasted_token_is_hidden_from_a_parse_error() {
        let short = super::hide_secrets("error: unexpected argument 'hunter2pass' found");
        assert!(!short.contains("hunter2pass"), "{short}");
        let pasted = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
        let e = format!("error: unexpected argument '{pasted}' found\n\nUsage: tessera credential add [OPTIONS] --upstream <UPSTREAM> <NAME>");
        let shown = super::hide_secrets(&e);
        assert!(!shown.contains(pasted), "{shown}");
        assert!(
            shown.contains("'[not shown: it looks like a secret]'"),
            "{shown}"
        );
        for kept in [
            "error: invalid value 'maybe' for '--allow-private-upstreams'",
            "error: unexpected argument '--secret' found",
            "error: invalid value 'http://127.0.0.1:7470/c/abc123def456ghi789' for '--public-url <PUBLIC_URL>'",
            "error: invalid value 'localhost:99999' for '--listen <LISTEN>'",
        ] {
            assert_eq!(super::hide_secrets(kept), kept);
        }
    }

    #[test]
    fn only_a_conventional_variable_name_is_echoed() {
        for name in [
            "GITHUB_TOKEN",
            "TEST_SECRET",
            "_X1",
            "TESSERA_MAX_PENDING_APPROVALS",
        ] {
            assert!(env_var_name(name), "{name}");
        }
        for value in [
            "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "hunter2pass",
            "ghp_short",
            "my_token",
            "sk-live-123",
            "secret with spaces",
            "1ABC",
            "",
        ] {
            assert!(!env_var_name(value), "{value}");
        }
    }
}
