//! The `revoy` binary: Envoy's command line, plus `revoy router-check` and `revoy xds-server`.

use std::process::ExitCode;

use revoy::cli::{Mode, Options, version_line};
use revoy::config::bootstrap::compile_bootstrap;
use revoy::config::{Context, Severity, SystemIo, Warnings};

/// The default example (`revoy example`): a front proxy that needs no other server.
const EXAMPLE: &str = include_str!("../../examples/front-proxy.yaml");

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("xds-server") {
        let code = revoy::xds_server::main(args[2..].to_vec());
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if args.get(1).map(String::as_str) == Some("router-check") {
        let code = revoy::router_check::main(args[2..].to_vec());
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let example = args.get(1).map(String::as_str) == Some("example");
    if example {
        args.remove(1);
    }
    let (mut opts, dropped) = match Options::parse_lenient(args) {
        Ok(v) => v,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    if example {
        opts.config_yaml = EXAMPLE.to_owned();
    }
    if opts.version {
        println!("\n{}\n", version_line());
        return ExitCode::SUCCESS;
    }
    match revoy::logging::init(
        &opts.log_level,
        &opts.component_log_level,
        opts.log_path.as_deref(),
    ) {
        Ok(unmapped) => {
            for c in unmapped {
                tracing::info!(component = %c, "--component-log-level: Envoy has no logger by this name; level not applied");
            }
        }
        Err(e) => {
            eprintln!("error initializing logging: {e}");
            return ExitCode::FAILURE;
        }
    }
    for flag in dropped {
        tracing::warn!(%flag, "unknown command-line flag ignored");
    }
    let loaded = match revoy::load::load(&opts) {
        Ok(l) => l,
        Err(e) => return fail(&opts, &e.to_string()),
    };
    for (path, type_url) in &loaded.unknown_types {
        tracing::warn!(%path, %type_url, "unknown extension type kept as an opaque config");
    }
    let mut warnings = Warnings::new();
    let compiled =
        match compile_bootstrap(&Context::new(&SystemIo), &loaded.bootstrap, &mut warnings) {
            Ok(c) => c,
            Err(e) => return fail(&opts, &e.to_string()),
        };
    for w in &warnings {
        match w.severity {
            Severity::FailsClosed => tracing::error!("{w}"),
            _ => tracing::warn!("{w}"),
        }
    }
    drop(loaded);
    revoy::memory::release_idle_pages();
    match opts.mode {
        Mode::Validate => validate_verdict(&opts, &warnings),
        Mode::InitOnly => ExitCode::SUCCESS,
        Mode::Serve => match revoy::server::run(compiled, opts) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `--mode validate`'s answer for a config that compiled: every feature it uses that revoy
/// does not implement is listed on stdout, and the exit is 1 when one of them fails closed
/// (revoy would refuse traffic that Envoy serves), else 0 with Envoy's "OK" line.
fn validate_verdict(opts: &Options, warnings: &Warnings) -> ExitCode {
    let unimplemented: Vec<_> = warnings
        .iter()
        .filter(|w| w.severity != Severity::Note)
        .collect();
    for w in &unimplemented {
        println!("{w}");
    }
    if warnings.any_fails_closed() {
        let n = unimplemented
            .iter()
            .filter(|w| w.severity == Severity::FailsClosed)
            .count();
        eprintln!(
            "configuration '{}' uses {n} feature(s) revoy does not implement and refuses traffic for (fails closed)",
            opts.config_path
        );
        return ExitCode::FAILURE;
    }
    println!("configuration '{}' OK", opts.config_path);
    ExitCode::SUCCESS
}

/// Reports a configuration error the way Envoy does and exits 1.
fn fail(opts: &Options, msg: &str) -> ExitCode {
    tracing::error!(
        "error initializing configuration '{}': {msg}",
        opts.config_path
    );
    eprintln!(
        "error initializing configuration '{}': {msg}",
        opts.config_path
    );
    ExitCode::FAILURE
}
