//! The `tessera` binary: parses the command line, builds the runtime and
//! hands the command to [`cli`]. Errors end here as one line on stderr and
//! a non-zero exit.

mod cli;

use cli::{
    config_check, dispatch, implicit_store, json_requested, parse_cli, report_error, Cmd, ConfigCmd,
};

fn main() {
    let (cli, matches, from_file) = match parse_cli() {
        Ok(p) => p,
        Err(e) => {
            report_error(&format!("{e:#}"), json_requested());
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
    let implicit = implicit_store(&matches, &from_file);
    let json = cli.json;
    if let Err(e) = rt.block_on(dispatch(cli, implicit)) {
        report_error(&format!("{e:#}"), json);
        std::process::exit(1);
    }
}

/// What returns glibc malloc's free pages to the system (see
/// `tessera::telemetry::memory`): the one unsafe call in tessera, kept in
/// the binary because the library forbids unsafe code.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free_memory() -> Option<fn()> {
    fn trim() {
        // SAFETY: malloc_trim takes no pointer and has no precondition; it
        // walks glibc's own heap under glibc's own locks.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    Some(trim)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() -> Option<fn()> {
    None
}
