//! What tessera tells its operators: the log ([`log`]), the counters of
//! `/metrics` ([`metrics`]), time ([`time`]) and memory returned to the
//! system ([`memory`]).

pub mod log;
pub mod memory;
pub mod metrics;
pub mod time;
