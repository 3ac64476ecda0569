//! `revoy xds-server --listen ADDR --dir DIR`: serves the resources of a directory over ADS
//! (SotW and Delta) and reloads them when the directory changes; logs what it loaded, each
//! reload and each client's ACK or NACK with the reason.

use std::path::PathBuf;

use clap::Parser;
use xds_client::server::files::{self, LoadError, WatchError};
use xds_client::server::{Server, Snapshot};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "revoy xds-server",
    about = "Serve the xDS resources of a directory over ADS (SotW and Delta)"
)]
pub struct Args {
    /// Where to listen: `host:port`, or `unix:/path` for a Unix socket.
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// The directory of `*.yaml`, `*.yml` and `*.json` resource files (reloaded on change).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Log level (trace, debug, info, warn, error), or a tracing filter.
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A TCP `host:port`.
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Listen {
    /// Reads `unix:/path` as a Unix socket, anything else as `host:port`.
    pub fn parse(addr: &str) -> Self {
        match addr.strip_prefix("unix:") {
            Some(path) => Listen::Unix(path.into()),
            None => Listen::Tcp(addr.to_owned()),
        }
    }
}

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum XdsServerError {
    /// The directory did not load at start-up.
    #[error("loading the resources of {dir}: {source}")]
    Load {
        /// The directory.
        dir: String,
        /// What was wrong.
        source: LoadError,
    },
    /// The directory cannot be watched.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `--listen`.
        addr: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving ADS on {addr}: {source}")]
    Serve {
        /// The address served.
        addr: String,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// The runtime could not start or the serving task panicked.
    #[error("{0}")]
    Runtime(String),
}

/// Runs `revoy xds-server` with `args` (what follows `xds-server` on the command line);
/// answers the exit code.
pub fn main(args: Vec<String>) -> i32 {
    let argv = std::iter::once("revoy xds-server".to_owned()).chain(args);
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&args.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("invalid --log-level {}: {e}", args.log_level);
            return 2;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => Err(XdsServerError::Runtime(format!("cannot start tokio: {e}"))),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            1
        }
    }
}

/// Loads the directory, serves it, watches it; returns on SIGINT or SIGTERM.
pub async fn run(args: Args) -> Result<(), XdsServerError> {
    let snapshot = files::load_dir(&args.dir).map_err(|source| XdsServerError::Load {
        dir: args.dir.display().to_string(),
        source,
    })?;
    log_loaded(&args.dir, &snapshot);
    let server = Server::new();
    server.set(snapshot);
    let _watch = files::watch(&args.dir, server.clone())?;
    let bind_err = |source| XdsServerError::Bind {
        addr: args.listen.clone(),
        source,
    };
    let (addr, task) = match Listen::parse(&args.listen) {
        Listen::Tcp(hostport) => {
            let (bound, task) = server.serve_tcp(hostport).await.map_err(bind_err)?;
            (bound.to_string(), task)
        }
        Listen::Unix(path) => {
            let task = server.serve_unix(&path).await.map_err(bind_err)?;
            (format!("unix:{}", path.display()), task)
        }
    };
    tracing::info!(%addr, dir = %args.dir.display(), "serving ADS (SotW and Delta)");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| XdsServerError::Runtime(format!("cannot handle SIGTERM: {e}")))?;
    tokio::select! {
        joined = task => match joined {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(XdsServerError::Serve { addr, source }),
            Err(e) => Err(XdsServerError::Runtime(format!("serving task: {e}"))),
        },
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("SIGINT: exiting");
            Ok(())
        }
        _ = term.recv() => {
            tracing::info!("SIGTERM: exiting");
            Ok(())
        }
    }
}

/// Logs the snapshot's version and its types with their counts.
fn log_loaded(dir: &std::path::Path, snapshot: &Snapshot) {
    tracing::info!(dir = %dir.display(), version = %snapshot.version(), "snapshot loaded");
    for (type_url, count) in snapshot.counts() {
        tracing::info!(%type_url, count, "  resources");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_are_tcp_or_unix() {
        assert_eq!(
            Listen::parse("127.0.0.1:18000"),
            Listen::Tcp("127.0.0.1:18000".into())
        );
        assert_eq!(
            Listen::parse("unix:/tmp/xds.sock"),
            Listen::Unix("/tmp/xds.sock".into())
        );
    }
}
