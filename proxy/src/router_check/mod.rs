//! `revoy router-check`: a drop-in for Envoy's `router_check_tool`. It compiles the route
//! configuration with the proxy's compiler and routes every test request through the proxy's
//! own [`crate::route::RouteTable::select`].

mod case;
mod input;

use std::io::Write;

use proto::Codec;
use proto::pb::envoy::config::route::v3::HeaderMatcher as PbHeaderMatcher;
use serde_json::Value;

pub use case::{CaseResult, format_duration, run_case};
pub use input::{load_route_config, strip_trailing_commas};

const USAGE: &str = "usage: revoy router-check -c <route config> -t <tests> [-d|--details] [--only-show-failures] \
[--disable-deprecation-check] [-f|--fail-under <percent>] [--covall] [--detailed-coverage] [-o|--output-path <file>]";

/// Parsed command line.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Options {
    /// `-c/--config-path`.
    pub config_path: String,
    /// `-t/--test-path`.
    pub test_path: String,
    /// `-d/--details`.
    pub details: bool,
    /// `--only-show-failures`.
    pub only_show_failures: bool,
    /// `--disable-deprecation-check` (accepted; revoy does not warn on deprecated fields).
    pub disable_deprecation_check: bool,
    /// `-f/--fail-under`.
    pub fail_under: f64,
    /// `--covall`: comprehensive coverage.
    pub covall: bool,
    /// `--detailed-coverage`: list uncovered routes.
    pub detailed_coverage: bool,
    /// `-o/--output-path`: also write the results as JSON here.
    pub output_path: Option<String>,
}

/// Parses the arguments (program and subcommand excluded). Positional `<config> <tests>` is
/// accepted like the legacy tool.
pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{name} needs a value"))
        };
        match flag {
            "-c" | "--config-path" => o.config_path = value(flag)?,
            "-t" | "--test-path" => o.test_path = value(flag)?,
            "-d" | "--details" => o.details = true,
            "--only-show-failures" => o.only_show_failures = true,
            "--disable-deprecation-check" => o.disable_deprecation_check = true,
            "-f" | "--fail-under" => {
                o.fail_under = value(flag)?
                    .parse()
                    .map_err(|_| format!("{flag}: not a number"))?
            }
            "--covall" => o.covall = true,
            "--detailed-coverage" => o.detailed_coverage = true,
            "-o" | "--output-path" => o.output_path = Some(value(flag)?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            f if f.starts_with('-') && f.len() > 1 => {
                return Err(format!("unknown flag {f}\n{USAGE}"));
            }
            p => positional.push(p.to_owned()),
        }
    }
    let mut positional = positional.into_iter();
    if o.config_path.is_empty() {
        o.config_path = positional.next().unwrap_or_default();
    }
    if o.test_path.is_empty() {
        o.test_path = positional.next().unwrap_or_default();
    }
    if o.config_path.is_empty() || o.test_path.is_empty() {
        return Err(USAGE.to_owned());
    }
    Ok(o)
}

/// The result of a whole run.
#[derive(Debug)]
pub struct Report {
    /// `(test name, failures)` in file order.
    pub tests: Vec<(String, Vec<String>)>,
    /// Route coverage in percent.
    pub coverage: f64,
    /// Routes never covered, as `vhost/route-index[:name]`.
    pub uncovered: Vec<String>,
}

impl Report {
    /// Whether every test passed.
    pub fn all_passed(&self) -> bool {
        self.tests.iter().all(|(_, f)| f.is_empty())
    }
}

/// Runs the tests in `opts.test_path` against `opts.config_path`.
pub fn run(opts: &Options) -> Result<Report, String> {
    let codec = Codec::new();
    let rc = load_route_config(&codec, &opts.config_path)?;
    let ctx = crate::config::Context::new(&crate::config::SystemIo);
    // What a compile leaves out concerns tracing, not the routing checked here.
    let mut left_out = crate::config::Warnings::new();
    let table = crate::config::route::compile_route_config(&ctx, &rc, None, &mut left_out)
        .map_err(|e| format!("{}: {e}", opts.config_path))?;
    let text =
        std::fs::read_to_string(&opts.test_path).map_err(|e| format!("{}: {e}", opts.test_path))?;
    let tests = input::parse(&text, &opts.test_path)?;
    let cases = tests
        .get("tests")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{}: no \"tests\" array", opts.test_path))?;
    let compile = |v: &Value| -> Result<crate::route::matcher::HeaderMatcher, String> {
        let m = codec
            .decode::<PbHeaderMatcher>(v.clone(), false)
            .map_err(|e| e.to_string())?;
        crate::config::route::header_matcher(&ctx, &m.message).map_err(|e| e.to_string())
    };
    let mut covered = std::collections::HashSet::new();
    let mut results = Vec::with_capacity(cases.len());
    for c in cases {
        let r = run_case(&table, c, &compile);
        if let Some(k) = r.covered {
            covered.insert(k);
        }
        let name = c
            .get("test_name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        results.push((name, r.failures));
    }
    let mut total = 0usize;
    let mut uncovered = Vec::new();
    for (v, vh) in table.virtual_hosts().iter().enumerate() {
        for (i, r) in vh.routes.iter().enumerate() {
            total += 1;
            if !covered.contains(&(v, i)) {
                uncovered.push(format!(
                    "{}/{i}{}{}",
                    vh.name,
                    if r.name.is_empty() { "" } else { ":" },
                    r.name
                ));
            }
        }
    }
    let coverage = if total == 0 {
        100.0
    } else {
        100.0 * (total - uncovered.len()) as f64 / total as f64
    };
    Ok(Report {
        tests: results,
        coverage,
        uncovered,
    })
}

/// Formats a percentage like C++ `std::cout << double` (6 significant digits).
fn format_percent(p: f64) -> String {
    let s = format!(
        "{:.*}",
        6usize.saturating_sub(p.abs().max(1.0).log10().floor() as usize + 1),
        p
    );
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Entry point of `revoy router-check`; returns the process exit code.
pub fn main(args: Vec<String>) -> i32 {
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let report = match run(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (name, failures) in &report.tests {
        let show = (opts.details && !opts.only_show_failures)
            || (opts.only_show_failures && !failures.is_empty());
        if !show {
            continue;
        }
        if name.is_empty() {
            eprintln!("missing test name");
        } else {
            let _ = writeln!(out, "{name}");
        }
        for f in failures {
            let _ = writeln!(out, "{f}");
        }
    }
    if let Some(path) = &opts.output_path {
        let json = serde_json::json!({
            "tests": report.tests.iter().map(|(n, f)| serde_json::json!({"test_name": n, "passed": f.is_empty(), "failures": f})).collect::<Vec<_>>(),
            "coverage": report.coverage,
        });
        if let Err(e) = std::fs::write(
            path,
            serde_json::to_string_pretty(&json).unwrap_or_default(),
        ) {
            eprintln!("{path}: {e}");
            return 1;
        }
    }
    if !report.all_passed() {
        return 1;
    }
    let _ = writeln!(
        out,
        "Current route coverage: {}%",
        format_percent(report.coverage)
    );
    if opts.detailed_coverage {
        for r in &report.uncovered {
            let _ = writeln!(out, "Missing test for route: {r}");
        }
    }
    if report.coverage < opts.fail_under {
        let _ = writeln!(
            out,
            "Failed to meet coverage requirement: {}%",
            format_percent(opts.fail_under)
        );
        return 1;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args() {
        let a = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let o = parse_args(&a("-c r.yaml -t t.json --details -f 50 --covall")).unwrap();
        assert_eq!(
            (o.config_path.as_str(), o.test_path.as_str()),
            ("r.yaml", "t.json")
        );
        assert!(o.details && o.covall);
        assert_eq!(o.fail_under, 50.0);
        let o = parse_args(&a("r.yaml t.json --fail-under=10")).unwrap();
        assert_eq!(o.fail_under, 10.0);
        assert!(parse_args(&a("-c r.yaml")).is_err());
        assert!(parse_args(&a("-c r.yaml -t t --bogus")).is_err());
    }

    #[test]
    fn percent_format() {
        assert_eq!(format_percent(100.0), "100");
        assert_eq!(format_percent(200.0 / 3.0), "66.6667");
        assert_eq!(format_percent(50.0), "50");
    }

    #[test]
    fn durations() {
        assert_eq!(
            format_duration(Some(std::time::Duration::from_secs(120))),
            "120s"
        );
        assert_eq!(
            format_duration(Some(std::time::Duration::from_millis(1500))),
            "1.5s"
        );
        assert_eq!(format_duration(None), "0s");
    }
}
