//! The control plane: the commands' shared operations ([`service`]), the
//! HTTP API ([`api`]) and the console ([`console`]).

pub mod api;
pub mod console;
pub mod service;
