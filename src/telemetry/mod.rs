//! What tessera tells its operators: the log ([`log`]), the counters of
//! `/metrics` ([`metrics`]), time ([`time`]) and memory returned to the
//! system ([`memory`]), traces ([`trace`]) and the W3C trace context
//! ([`traceparent`]).

pub mod log;
pub mod memory;
pub mod metrics;
pub mod time;
pub mod trace;
pub mod traceparent;
