//! Tables, and secrets read from the environment or stdin.

use std::io::{IsTerminal, Read};

use anyhow::{bail, Context, Result};
use tessera::crypto::keyring::SecretString;

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
        println!("{}", out.trim_end());
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

pub(crate) fn read_secret(env_var: Option<&str>) -> Result<SecretString> {
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
