//! revoy: a data-plane proxy that runs Envoy's configuration.
//!
//! See ARCHITECTURE.md at the repository root for how the modules fit together.

pub mod access_log;
pub mod admin;
pub mod apply;
pub mod body;
pub mod cli;
pub mod config;
pub mod drain;
pub mod filter_state;
#[cfg(fuzzing)]
pub mod fuzzing;
pub mod http;
pub mod istio_metrics;
pub mod jwt;
pub mod lifecycle;
pub mod limits;
pub mod listener;
pub mod load;
pub mod loggers;
pub mod logging;
pub mod memory;
pub mod process;
pub mod process_stats;
pub mod rbac;
pub mod route;
pub mod router_check;
pub mod runtime;
pub mod server;
pub mod shared;
pub mod snapshot;
pub mod spawn;
pub mod stats;
pub mod tcp;
pub mod thread_handles;
pub mod timer_anchor;
pub mod tls;
pub mod trace;
pub mod upstream;
pub mod wire;
pub mod xds;
pub mod xds_server;
