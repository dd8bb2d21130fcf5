//! `tessera key`: the master key ring.

use std::io::IsTerminal;

use anyhow::Result;
use clap::Subcommand;
use tessera::admin::service::{self};
use tessera::admin::service::{Admin, CLI};

use super::*;

#[derive(Subcommand)]
pub(crate) enum KeyCmd {
    /// Re-seal every stored secret under a new master key, in one
    /// transaction, while serve keeps serving. The new key comes from
    /// TESSERA_MASTER_KEY_NEW, or is generated into master.key.
    Rotate,
    /// Which key ids the stored secrets are sealed with, and which keys the
    /// ring holds.
    Status,
}

pub(crate) async fn key(at: &Place, c: KeyCmd) -> Result<()> {
    let store = at.store().await?;
    let key = existing_master_key(&at.data_dir, &store).await?;
    match c {
        KeyCmd::Rotate => {
            let new = std::env::var("TESSERA_MASTER_KEY_NEW").ok();
            // On a terminal (and not for --json), a progress line on stderr.
            let show = !at.json && std::io::stderr().is_terminal();
            let r = Admin::new(&store, CLI)
                .key_rotate(&key, new, |done, total| {
                    if show {
                        eprint!("\rre-sealing secrets: {done}/{total}");
                        if done == total {
                            eprintln!();
                        }
                    }
                })
                .await?;
            if at.json {
                let v = serde_json::json!({"resealed": r.resealed, "new_key": r.new_id, "file": r.file});
                out!("{v}");
                return Ok(());
            }
            out!(
                "re-sealed {} {} under key {}",
                r.resealed,
                if r.resealed == 1 { "secret" } else { "secrets" },
                r.new_id
            );
            match r.file {
                Some(f) => out!(
                    "{} now holds the new key first; the old keys stay in it to open anything sealed meanwhile. Remove their lines once `tessera key status` shows them unused.",
                    f.display()
                ),
                None => out!(
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
                out!("{}", serde_json::Value::from(v));
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
