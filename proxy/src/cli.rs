//! Envoy's command line. Every flag pilot-agent has ever passed is accepted; flags revoy has no
//! use for are parsed and logged, never fatal. Unknown flags are dropped with a warning.

use clap::{ArgAction, Parser, ValueEnum};

/// What to do with the configuration (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Load the configuration and serve traffic.
    Serve,
    /// Load and validate the configuration, print the result, exit 0 or 1.
    Validate,
    /// Load the configuration and initialise, then exit.
    #[value(name = "init_only", alias = "init-only")]
    InitOnly,
}

/// Envoy's command-line options, as parsed by revoy.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "revoy",
    disable_version_flag = true,
    about = "revoy: a pure-Rust proxy that runs Envoy configurations"
)]
pub struct Options {
    /// Path to the bootstrap (JSON if it ends in .json, else YAML).
    #[arg(short = 'c', long = "config-path", default_value = "")]
    pub config_path: String,
    /// A bootstrap fragment (YAML or JSON) merged over the config file.
    #[arg(long = "config-yaml", default_value = "")]
    pub config_yaml: String,
    /// serve, validate or init_only.
    #[arg(long, value_enum, default_value = "serve")]
    pub mode: Mode,
    /// Number of data-path worker threads (default: number of cores).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Log level: trace, debug, info, warning/warn, error, critical, off.
    #[arg(short = 'l', long = "log-level", default_value = "info")]
    pub log_level: String,
    /// Per-component log levels, `component:level,...`.
    #[arg(long = "component-log-level", default_value = "")]
    pub component_log_level: String,
    /// Envoy's log line format (accepted; revoy's format is fixed).
    #[arg(long = "log-format")]
    pub log_format: Option<String>,
    /// Whether to escape the log format (accepted).
    #[arg(long = "log-format-escaped", action = ArgAction::SetTrue)]
    pub log_format_escaped: bool,
    /// Pre-1.16 Istio flag (accepted).
    #[arg(long = "log-format-prefix-with-location")]
    pub log_format_prefix_with_location: Option<String>,
    /// Write logs to this file instead of stderr.
    #[arg(long = "log-path")]
    pub log_path: Option<String>,
    /// Seconds to drain listeners on shutdown or `/drain_listeners?graceful`.
    #[arg(long = "drain-time-s", default_value_t = 600)]
    pub drain_time_s: u64,
    /// `gradual` or `immediate` (anything else is refused, as by Envoy).
    #[arg(long = "drain-strategy", default_value = "gradual", value_parser = crate::drain::Strategy::parse)]
    pub drain_strategy: crate::drain::Strategy,
    /// Hot-restart parent shutdown time (accepted; revoy does not hot-restart).
    #[arg(long = "parent-shutdown-time-s")]
    pub parent_shutdown_time_s: Option<u64>,
    /// Hot-restart epoch (accepted).
    #[arg(long = "restart-epoch", default_value_t = 0)]
    pub restart_epoch: u64,
    /// Shared-memory base id (accepted).
    #[arg(long = "base-id")]
    pub base_id: Option<u64>,
    /// Pick a free base id (accepted).
    #[arg(long = "use-dynamic-base-id", action = ArgAction::SetTrue)]
    pub use_dynamic_base_id: bool,
    /// Where to write the dynamic base id (accepted).
    #[arg(long = "base-id-path")]
    pub base_id_path: Option<String>,
    /// Disable hot restart (revoy never hot-restarts).
    #[arg(long = "disable-hot-restart", action = ArgAction::SetTrue)]
    pub disable_hot_restart: bool,
    /// v4 or v6: the IP version of the local address.
    #[arg(long = "local-address-ip-version", default_value = "v4")]
    pub local_address_ip_version: String,
    /// Access log flush interval in milliseconds.
    #[arg(long = "file-flush-interval-msec")]
    pub file_flush_interval_msec: Option<u64>,
    /// Access log flush minimum size in KiB.
    #[arg(long = "file-flush-min-size-kb")]
    pub file_flush_min_size_kb: Option<u64>,
    /// Unknown fields in the bootstrap are warnings, not errors.
    #[arg(long = "allow-unknown-static-fields", action = ArgAction::SetTrue)]
    pub allow_unknown_static_fields: bool,
    /// Unknown fields in xDS resources are errors.
    #[arg(long = "reject-unknown-dynamic-fields", action = ArgAction::SetTrue)]
    pub reject_unknown_dynamic_fields: bool,
    /// Unknown fields in xDS resources are ignored silently.
    #[arg(long = "ignore-unknown-dynamic-fields", action = ArgAction::SetTrue)]
    pub ignore_unknown_dynamic_fields: bool,
    /// Node cluster (overrides `node.cluster`).
    #[arg(long = "service-cluster")]
    pub service_cluster: Option<String>,
    /// Node id (overrides `node.id`).
    #[arg(long = "service-node")]
    pub service_node: Option<String>,
    /// Node zone (overrides `node.locality.zone`).
    #[arg(long = "service-zone")]
    pub service_zone: Option<String>,
    /// Print the version and exit.
    #[arg(long = "version", action = ArgAction::SetTrue)]
    pub version: bool,
    /// Do not log deprecation warnings.
    #[arg(long = "skip-deprecated-logs", action = ArgAction::SetTrue)]
    pub skip_deprecated_logs: bool,
    /// Enable core dumps (accepted).
    #[arg(long = "enable-core-dump", action = ArgAction::SetTrue)]
    pub enable_core_dump: bool,
    /// Istio 1.0: max object name length (accepted).
    #[arg(long = "max-obj-name-len")]
    pub max_obj_name_len: Option<u64>,
    /// Istio 1.0: max number of stats (accepted).
    #[arg(long = "max-stats")]
    pub max_stats: Option<u64>,
    /// Istio 1.0 name of `--allow-unknown-static-fields`.
    #[arg(long = "allow-unknown-fields", action = ArgAction::SetTrue)]
    pub allow_unknown_fields: bool,
    /// Istio 1.0: v2 configuration only (accepted).
    #[arg(long = "v2-config-only", action = ArgAction::SetTrue)]
    pub v2_config_only: bool,
    /// Istio 1.8-1.10: bootstrap version (accepted; only v3 exists).
    #[arg(long = "bootstrap-version")]
    pub bootstrap_version: Option<u32>,
    /// Print the hot-restart compatibility version (accepted).
    #[arg(long = "hot-restart-version", action = ArgAction::SetTrue)]
    pub hot_restart_version: bool,
    /// Enable mutex contention tracing (accepted).
    #[arg(long = "enable-mutex-tracing", action = ArgAction::SetTrue)]
    pub enable_mutex_tracing: bool,
    /// Derive concurrency from the cpuset (accepted).
    #[arg(long = "cpuset-threads", action = ArgAction::SetTrue)]
    pub cpuset_threads: bool,
    /// Extensions to disable (accepted).
    #[arg(long = "disable-extensions")]
    pub disable_extensions: Option<String>,
    /// Fine-grained logging (accepted).
    #[arg(long = "enable-fine-grain-logging", action = ArgAction::SetTrue)]
    pub enable_fine_grain_logging: bool,
    /// Hot-restart socket path (accepted).
    #[arg(long = "socket-path")]
    pub socket_path: Option<String>,
    /// Hot-restart socket mode (accepted).
    #[arg(long = "socket-mode")]
    pub socket_mode: Option<String>,
    /// Extra stats tags `name:value` (accepted).
    #[arg(long = "stats-tag")]
    pub stats_tag: Vec<String>,
}

/// Flags that take no value; every other known long flag takes one.
const VALUELESS: &[&str] = &[
    "--log-format-escaped",
    "--use-dynamic-base-id",
    "--disable-hot-restart",
    "--allow-unknown-static-fields",
    "--reject-unknown-dynamic-fields",
    "--ignore-unknown-dynamic-fields",
    "--version",
    "--skip-deprecated-logs",
    "--enable-core-dump",
    "--allow-unknown-fields",
    "--v2-config-only",
    "--hot-restart-version",
    "--enable-mutex-tracing",
    "--cpuset-threads",
    "--enable-fine-grain-logging",
    "--help",
];

impl Options {
    /// Parses argv (program name first). Unknown `--flags` (and their value, when the next
    /// argument does not look like a flag) are removed and returned for logging.
    pub fn parse_lenient(args: Vec<String>) -> Result<(Options, Vec<String>), clap::Error> {
        let known: Vec<String> = <Options as clap::CommandFactory>::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .chain(["--help".to_owned()])
            .collect();
        let mut kept = Vec::with_capacity(args.len());
        let mut dropped = Vec::new();
        let mut it = args.into_iter().peekable();
        if let Some(program) = it.next() {
            kept.push(program);
        }
        while let Some(arg) = it.next() {
            let name = arg.split('=').next().unwrap_or(&arg).to_owned();
            let unknown = name.starts_with("--") && !known.contains(&name);
            if unknown {
                let mut desc = arg.clone();
                if !arg.contains('=') && it.peek().is_some_and(|next| !next.starts_with('-')) {
                    desc = format!("{arg} {}", it.next().unwrap_or_default());
                }
                dropped.push(desc);
                continue;
            }
            let takes_value = name.starts_with("--") && !VALUELESS.contains(&name.as_str());
            kept.push(arg.clone());
            if takes_value
                && !arg.contains('=')
                && let Some(value) = it.next()
            {
                kept.push(value);
            }
        }
        let opts = Options::try_parse_from(kept)?;
        Ok((opts, dropped))
    }

    /// Whether unknown fields in the bootstrap are tolerated.
    pub fn allow_unknown_static(&self) -> bool {
        self.allow_unknown_static_fields || self.allow_unknown_fields
    }
}

/// The `--version` line, in Envoy's shape (`<name>  version: <sha>/<version>/<state>/<mode>/<ssl>`).
pub fn version_line() -> String {
    format!(
        "revoy  version: {}/{}/Clean/{}/rustls",
        option_env!("REVOY_GIT_SHA").unwrap_or("0000000000000000000000000000000000000000"),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "RELEASE"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> (Options, Vec<String>) {
        let mut v = vec!["revoy".to_owned()];
        v.extend(args.iter().map(|s| s.to_string()));
        Options::parse_lenient(v).unwrap()
    }

    #[test]
    fn refuses_a_drain_strategy_envoy_does_not_know() {
        let args = ["revoy", "--drain-strategy", "Immediate"].map(str::to_owned);
        assert!(Options::parse_lenient(args.to_vec()).is_err());
    }

    #[test]
    fn accepts_pilot_agent_argv() {
        let (o, dropped) = parse(&[
            "-c",
            "/etc/istio/proxy/envoy-rev.json",
            "--drain-time-s",
            "45",
            "--drain-strategy",
            "immediate",
            "--local-address-ip-version",
            "v4",
            "--file-flush-interval-msec",
            "1000",
            "--disable-hot-restart",
            "--allow-unknown-static-fields",
            "--file-flush-min-size-kb",
            "64",
            "-l",
            "warning",
            "--component-log-level",
            "misc:error",
            "--skip-deprecated-logs",
            "--enable-core-dump",
            "--config-yaml",
            "{}",
            "--concurrency",
            "2",
        ]);
        assert!(dropped.is_empty());
        assert_eq!(o.config_path, "/etc/istio/proxy/envoy-rev.json");
        assert_eq!(o.drain_time_s, 45);
        assert_eq!(o.drain_strategy, crate::drain::Strategy::Immediate);
        assert_eq!(o.concurrency, Some(2));
        assert!(o.allow_unknown_static());
    }

    #[test]
    fn accepts_istio_1_0_argv() {
        let (o, dropped) = parse(&[
            "-c",
            "envoy-rev0.json",
            "--restart-epoch",
            "0",
            "--drain-time-s",
            "45",
            "--parent-shutdown-time-s",
            "60",
            "--service-cluster",
            "productpage",
            "--service-node",
            "sidecar~10.0.0.1~pp.default~default.svc.cluster.local",
            "--max-obj-name-len",
            "189",
            "--allow-unknown-fields",
            "-l",
            "warn",
            "--v2-config-only",
            "--bootstrap-version",
            "3",
        ]);
        assert!(dropped.is_empty());
        assert_eq!(o.service_cluster.as_deref(), Some("productpage"));
        assert!(o.allow_unknown_static());
    }

    #[test]
    fn modes_use_envoys_spelling() {
        assert_eq!(parse(&["--mode", "init_only"]).0.mode, Mode::InitOnly);
        assert_eq!(parse(&["--mode", "validate"]).0.mode, Mode::Validate);
        assert_eq!(parse(&["--mode", "serve"]).0.mode, Mode::Serve);
    }

    #[test]
    fn drops_unknown_flags_with_their_values() {
        let (o, dropped) = parse(&[
            "--mode",
            "validate",
            "--frobnicate",
            "7",
            "--wat=1",
            "--bare",
            "-c",
            "x.yaml",
        ]);
        assert_eq!(o.mode, Mode::Validate);
        assert_eq!(o.config_path, "x.yaml");
        assert_eq!(dropped, vec!["--frobnicate 7", "--wat=1", "--bare"]);
    }
}
