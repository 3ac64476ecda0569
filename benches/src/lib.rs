//! Shared pieces of the side-by-side load benchmark (`src/bin/load.rs`): the in-process
//! upstream, how the measured revoy is built (plain or profile-guided), the contenders and
//! their generated configs, the load generators, process sampling from /proc, and the report
//! writers.

pub mod build;
pub mod clients;
pub mod configs;
pub mod contender;
pub mod procfs;
pub mod report;
pub mod stats;
pub mod upstream;
