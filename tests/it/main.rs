//! tessera's integration tests, compiled as one binary: real sockets, a
//! real upstream, the real data plane and the real CLI.

mod admin_api;
mod approval_loop;
mod approvals;
mod attack;
mod audit;
mod capacity;
mod cli;
mod clients;
mod config_file;
mod console;
mod console_views;
mod crash;
mod db_faults;
mod differentials;
mod doors;
mod egress;
mod ext_authz;
mod first_day;
mod forwarding;
mod hostile;
mod keys;
mod learning;
mod oauth;
mod ops;
mod pinning;
mod policies;
mod pool;
mod redaction;
mod refusals;
mod rmcp_peers;
mod shutdown;
mod sse;
mod support;
mod tool_list;
mod upstream_faults;
