//! Shared pieces of the side-by-side load benchmark (`src/bin/load.rs`): the in-process
//! upstream, how the measured revoy is built (plain or profile-guided), the contenders and
//! their generated configs, the order they take turns in, the load generators, the TLS scenarios' certificates and client,
//! process sampling from /proc, and the report writers; and the xDS push benchmark's
//! resources and proxies (`src/bin/xds_push.rs`).

pub mod build;
pub mod clients;
pub mod configs;
pub mod contender;
pub mod order;
pub mod procfs;
pub mod report;
pub mod stats;
pub mod tls;
pub mod upstream;
pub mod xds;
