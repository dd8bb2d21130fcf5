//! The integration suite again, on Postgres: every module of tests/it/,
//! compiled into this second test binary, and the replica tests. `support::on_postgres` tells the
//! two apart by crate name; here each data dir gets a fresh database on the
//! server named by `TESSERA_TEST_POSTGRES` (default
//! postgres://postgres@127.0.0.1:5432/test), dropped after the test. A
//! server that cannot be reached fails the tests: it is never skipped.

#[path = "it/admin_api.rs"]
mod admin_api;
#[path = "it/approval_loop.rs"]
mod approval_loop;
#[path = "it/approvals.rs"]
mod approvals;
#[path = "it/attack.rs"]
mod attack;
#[path = "it/audit.rs"]
mod audit;
#[path = "it/capacity.rs"]
mod capacity;
#[path = "it/cli.rs"]
mod cli;
#[path = "it/clients.rs"]
mod clients;
#[path = "it/config_file.rs"]
mod config_file;
#[path = "it/console.rs"]
mod console;
#[path = "it/console_views.rs"]
mod console_views;
#[path = "it/crash.rs"]
mod crash;
#[path = "it/db_faults.rs"]
mod db_faults;
#[path = "it/differentials.rs"]
mod differentials;
#[path = "it/doors.rs"]
mod doors;
#[path = "it/egress.rs"]
mod egress;
#[path = "it/ext_authz.rs"]
mod ext_authz;
#[path = "it/first_day.rs"]
mod first_day;
#[path = "it/forwarding.rs"]
mod forwarding;
#[path = "it/hostile.rs"]
mod hostile;
#[path = "it/keys.rs"]
mod keys;
#[path = "it/learning.rs"]
mod learning;
#[path = "it/oauth.rs"]
mod oauth;
#[path = "it/ops.rs"]
mod ops;
#[path = "it/pinning.rs"]
mod pinning;
#[path = "it/policies.rs"]
mod policies;
#[path = "it/pool.rs"]
mod pool;
#[path = "it/redaction.rs"]
mod redaction;
#[path = "it/refusals.rs"]
mod refusals;
#[path = "it/replicas.rs"]
mod replicas;
#[path = "it/request_id.rs"]
mod request_id;
#[path = "it/rmcp_peers.rs"]
mod rmcp_peers;
#[path = "it/shutdown.rs"]
mod shutdown;
#[path = "it/sse.rs"]
mod sse;
#[path = "it/support.rs"]
mod support;
#[path = "it/tool_list.rs"]
mod tool_list;
#[path = "it/traces.rs"]
mod traces;
#[path = "it/upstream_faults.rs"]
mod upstream_faults;

/// This list names tests/it/main.rs's modules and `replicas` (several
/// serving processes over one database: Postgres only), so neither leg
/// quietly runs fewer tests than the other.
#[test]
fn both_legs_run_every_module() {
    let mods = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .map(str::to_string)
            .collect()
    };
    let mut it = mods(include_str!("it/main.rs"));
    it.push("replicas".into());
    it.sort();
    let mut here = mods(include_str!("postgres.rs"));
    here.sort();
    assert!(it.len() > 10, "{it:?}");
    assert_eq!(it, here);
}
