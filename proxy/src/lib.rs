//! revoy: a data-plane proxy that runs Envoy's configuration.
//!
//! See ARCHITECTURE.md at the repository root for how the modules fit together.

pub mod body;
pub mod cli;
pub mod config;
pub mod load;
pub mod route;
pub mod stats;
pub mod tcp;
pub mod upstream;
