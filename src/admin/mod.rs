//! The control plane: the commands' shared operations ([`service`]), the
//! HTTP API ([`api`]), the console ([`console`]) and the ops listener's
//! health, readiness and metrics ([`ops`]).

pub mod api;
pub mod console;
pub mod ops;
pub mod service;
pub mod tool_pins;
