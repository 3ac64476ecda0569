//! Shared pieces of the side-by-side load benchmark (`src/bin/load.rs`): the in-process
//! upstream, the contenders and their generated configs, the load generators, process
//! sampling from /proc, and the report writers.

pub mod clients;
pub mod configs;
pub mod contender;
pub mod procfs;
pub mod report;
pub mod stats;
pub mod upstream;
