//! The test's cluster: a "hub" namespace holding a bridge, one namespace per pod joined to it
//! by a veth pair (`eth0` in the pod), and a "control plane" namespace running `revoy
//! xds-server` twice per pod, as pilot-agent serves its proxy locally: ADS on the pod's
//! `./etc/istio/proxy/XDS` and SDS on `./var/run/secrets/workload-spiffe-uds/socket` (unix
//! sockets are reached by path, from any network namespace). Each pod gets istio-init's
//! iptables rules, its sidecar (revoy or Envoy) started as uid/gid 1337 in the pod's
//! directory with pilot-agent's argv and the bootstrap pilot-agent renders, and the echo
//! application as another uid. A dual-stack pod (a workload with more addresses) also gets its
//! IPv6 address, a route to the IPv6 service range, istio-init's `ip6tables` rules and the
//! `::6` it adds to `lo`, and its application listens on both families.
//!
//! Everything made is undone when the [`Cluster`] is dropped, also when a test fails:
//! processes are killed (by their own PIDs), then the namespaces (with their interfaces and
//! iptables rules) deleted, then the directory removed.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::{self, Mesh, Workload};
use super::iptables::{self, Capture, Family};
use crate::certs::Ca;
use crate::netns::{self, Netns};

/// The proxy's uid and gid, which istio-init's rules exempt from capture.
pub const PROXY_UID: u32 = 1337;

/// Services' VIPs are in this range (routed out of `eth0`, never assigned to anyone).
pub const SERVICE_RANGE: &str = "10.96.0.0/16";

/// Services' IPv6 VIPs are in this range: a unique local one (`fd00::/8`), like the pods'
/// `fd00:44::/64`, which exist only on the test's bridge.
pub const SERVICE_RANGE_V6: &str = "fd00:96::/112";

/// Hosts outside the mesh (no sidecar) are in this range, on the same bridge.
pub const OUTSIDE_RANGE: &str = "10.44.0.128/25";

/// Which proxy a pod runs as its sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sidecar {
    /// revoy (this repository's binary).
    Revoy,
    /// Stock Envoy (`ENVOY_BIN` or the `envoy` Python package).
    Envoy,
}

/// A pod to create.
pub struct PodSpec {
    /// The workload (name, address, service account, mTLS mode).
    pub workload: Workload,
    /// Its sidecar.
    pub sidecar: Sidecar,
    /// Its iptables capture.
    pub capture: Capture,
}

impl PodSpec {
    /// A pod for each service of `mesh`, in order: its first endpoint's workload, with the
    /// sidecar and the capture at the same place in `sidecars` and `captures`.
    pub fn per_service(mesh: &Mesh, sidecars: &[Sidecar], captures: &[Capture]) -> Vec<PodSpec> {
        let services = mesh.services.len();
        assert!(
            sidecars.len() == services && captures.len() == services,
            "{} sidecars and {} captures for {services} services: one of each per service",
            sidecars.len(),
            captures.len()
        );
        mesh.services
            .iter()
            .zip(sidecars.iter().zip(captures))
            .map(|(s, (&sidecar, &capture))| PodSpec {
                workload: s.endpoints[0].clone(),
                sidecar,
                capture,
            })
            .collect()
    }
}

/// A process the cluster started, killed by its PID when dropped.
pub struct Process {
    child: Child,
    what: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// Ends it with SIGKILL (it is reaped when dropped), as pilot-agent ends its proxy
    /// (`cmd.Process.Kill()`).
    pub fn kill(&self) {
        let pid = i32::try_from(self.child.id()).expect("a PID");
        // SAFETY: a signal to our own child, which is not reaped before `self` drops.
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(
            rc,
            0,
            "kill {}: {}",
            self.what,
            std::io::Error::last_os_error()
        );
    }

    /// Whether it is still running (else a description of how it ended).
    fn check(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited: {status}", self.what)),
            Err(e) => Err(format!("{}: {e}", self.what)),
        }
    }
}

/// A running pod.
pub struct Pod {
    /// Its sidecar (absent once stopped).
    pub proxy: Option<Process>,
    servers: Vec<Process>,
    /// The workload.
    pub workload: Workload,
    /// Its sidecar kind.
    pub sidecar: Sidecar,
    /// Its network namespace.
    pub ns: Netns,
    /// Its directory (the proxy's working directory, pilot-agent's `/`).
    pub dir: PathBuf,
}

impl Pod {
    /// The directory `revoy xds-server` serves this pod's ADS resources from.
    pub fn xds_dir(&self) -> PathBuf {
        self.dir.join("control-plane/xds")
    }

    /// The directory `revoy xds-server` serves this pod's secrets from.
    pub fn sds_dir(&self) -> PathBuf {
        self.dir.join("control-plane/sds")
    }

    /// Whether its config has Istio's own filters: when `mesh` has them and its sidecar is
    /// revoy (stock Envoy lacks them).
    pub fn istio_filters(&self, mesh: &Mesh) -> bool {
        mesh.istio_filters && self.sidecar == Sidecar::Revoy
    }

    /// The proxy's log so far (stdout and stderr).
    pub fn proxy_log(&self) -> String {
        ["proxy.out", "proxy.err"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The test's cluster. Field order is drop order: processes, then namespaces, then files.
pub struct Cluster {
    /// The pods, in the order given.
    pub pods: Vec<Pod>,
    /// Hosts outside the mesh: a namespace each, with the echo application and no sidecar.
    pub outside: Vec<(Netns, String)>,
    /// The control plane's namespace (it runs the `xds-server`s, whose processes are the pods').
    pub control_plane: Netns,
    /// The namespace with the bridge.
    pub hub: Netns,
    /// The mesh CA.
    pub ca: Ca,
    /// Whether the revoy pods' config has Istio's own filters ([`Mesh::istio_filters`]).
    pub istio_filters: bool,
    root: TempDir,
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `value` to `dir/name` as JSON, through a rename, so a watcher never reads half.
pub fn write_json(dir: &Path, name: &str, value: &Value) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(value).expect("JSON")).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
    chown(&dir.join(name));
}

fn chown(path: &Path) {
    std::os::unix::fs::chown(path, Some(PROXY_UID), Some(PROXY_UID))
        .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

/// Makes `dir` and its parents under `root`, each owned by the proxy's uid.
fn make_dir(root: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    let mut d = dir;
    while d != root {
        chown(d);
        d = d.parent().expect("under the root");
    }
}

/// The bootstrap pilot-agent renders (`tests/data/istio-bootstrap/default_golden.json`, the
/// output of Istio's own bootstrap test) for `workload`: its node id, cluster, instance IP and
/// the node metadata pilot-agent gives a pod's proxy (`Workload::node_metadata`),
/// and the two sockets where pilot-agent puts them by default (the golden's test points them
/// elsewhere: `/tmp/XDS` and a `WORKLOAD_IDENTITY_SOCKET_FILE` of `test.sock`), and the stats
/// the test reads included as pilot-agent renders a pod's `proxyStatsMatcher`
/// `inclusionPrefixes` (appended to the inclusion list); with `istio_filters`, the pod's
/// [`STATS_FLUSH_INTERVAL`] annotation as pilot-agent renders it (Istio's
/// `stats_flush_interval_golden.json`).
pub fn bootstrap(workload: &Workload, istio_filters: bool) -> Value {
    let text = include_str!("../data/istio-bootstrap/default_golden.json");
    let mut b: Value = serde_json::from_str(text).expect("the golden bootstrap is JSON");
    let ns = config::NAMESPACE;
    b["node"]["id"] = format!(
        "sidecar~{}~{}.{ns}~{ns}.svc.cluster.local",
        workload.ip, workload.pod
    )
    .into();
    b["node"]["cluster"] = format!("{}.{ns}", workload.service_account).into();
    let meta = &mut b["node"]["metadata"];
    meta["INSTANCE_IPS"] = workload.ips().collect::<Vec<_>>().join(",").into();
    if let (Some(meta), Value::Object(fields)) = (meta.as_object_mut(), workload.node_metadata()) {
        meta.extend(fields);
    }
    meta["WORKLOAD_IDENTITY_SOCKET_FILE"] = "socket".into();
    if istio_filters {
        let annotation = "sidecar.istio.io/statsFlushInterval";
        meta["ANNOTATIONS"] = serde_json::json!({ annotation: STATS_FLUSH_INTERVAL });
        meta[annotation] = STATS_FLUSH_INTERVAL.into();
    }
    meta["INTERCEPTION_MODE"] = if workload.tproxy {
        "TPROXY"
    } else {
        "REDIRECT"
    }
    .into();
    if istio_filters {
        b["stats_flush_interval"] = STATS_FLUSH_INTERVAL.into();
    }
    let patterns = b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
        .as_array_mut()
        .expect("the golden's stats inclusion list");
    for prefix in STATS_INCLUDED {
        patterns.push(serde_json::json!({ "prefix": prefix }));
    }
    let clusters = b["static_resources"]["clusters"]
        .as_array_mut()
        .expect("static clusters");
    for c in clusters {
        let path = match c["name"].as_str() {
            Some("xds-grpc") => "./etc/istio/proxy/XDS",
            Some("sds-grpc") => "./var/run/secrets/workload-spiffe-uds/socket",
            _ => continue,
        };
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["pipe"]["path"] =
            path.into();
    }
    b
}

/// The `sidecar.istio.io/statsFlushInterval` of the pods when Istio's own filters are in the
/// config: the test reads Istio's histograms (request durations and sizes), which a flush
/// brings up to date, and Envoy's default interval (5 s) would keep it waiting.
const STATS_FLUSH_INTERVAL: &str = "1s";

/// The stat prefixes the test reads (`proxyStatsMatcher.inclusionPrefixes`).
const STATS_INCLUDED: &[&str] = &[
    "listener.10.96.",
    "cluster.PassthroughCluster.",
    "cluster.InboundPassthroughCluster.",
    "cluster.outbound|80||svc-b.",
    "cluster.outbound|31000||svc-b.",
    "cluster.inbound|",
    "http.inbound_0.0.0.0_",
];

/// pilot-agent's argv for Envoy (`pkg/envoy/proxy.go`, defaults: drain 45 s, log level
/// `warning`, `misc:error`), with `--concurrency 2`.
pub const PILOT_AGENT_ARGV: &str = "-c ./etc/istio/proxy/envoy-rev.json --drain-time-s 45 \
    --drain-strategy immediate --local-address-ip-version v4 --file-flush-interval-msec 1000 \
    --disable-hot-restart --allow-unknown-static-fields -l warning --component-log-level misc:error \
    --concurrency 2";

/// Spawns `cmd` in `ns` as `uid` and `gid` (from a thread that entered the namespace: the
/// child inherits it).
fn spawn_in(ns: &Netns, mut cmd: Command, uid: u32, gid: u32, what: String) -> Process {
    cmd.uid(uid).gid(gid);
    let child = ns
        .enter(move || cmd.spawn())
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    Process { child, what }
}

fn log_files(dir: &Path, name: &str) -> (Stdio, Stdio) {
    let open = |ext: &str| {
        let path = dir.join(format!("{name}.{ext}"));
        let f = std::fs::File::create(&path).expect("log file");
        // The proxy reopens its own stdout (Istio's access logs write to `/dev/stdout`).
        chown(&path);
        Stdio::from(f)
    };
    (open("out"), open("err"))
}

/// Removes what a killed earlier run with `tag` left (a run's Drop guards do not run when it
/// is killed): its namespaces, their `/etc/netns` folders and its directory, for runs whose
/// process is gone.
fn sweep(tag: &str) {
    let prefix = format!("netcov-{tag}-");
    let names = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten();
    for name in names.filter_map(|e| e.file_name().into_string().ok()) {
        let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = netns::run("ip", &["netns", "del", &name]);
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(&name));
        let _ =
            std::fs::remove_dir_all(std::env::temp_dir().join(format!("revoy-pods-{tag}-{pid}")));
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

impl Cluster {
    /// Builds the cluster: namespaces, links, rules, control plane, sidecars, applications.
    /// `tag` keeps parallel tests' namespaces apart; `envoy` is Envoy's binary (needed when a
    /// pod runs Envoy); `outside` are the addresses of hosts outside the mesh.
    pub fn start(
        tag: &str,
        mesh: &Mesh,
        pods: Vec<PodSpec>,
        outside: &[&str],
        envoy: Option<&Path>,
    ) -> Cluster {
        sweep(tag);
        let root = std::env::temp_dir().join(format!("revoy-pods-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("the cluster's directory");
        let root = TempDir(root);
        let hub = Netns::create(
            &format!("{tag}-hub"),
            &["ip link add br0 type bridge", "ip link set br0 up"],
        );
        let control_plane = Netns::create(&format!("{tag}-cp"), &[]);
        let mut cluster = Cluster {
            pods: Vec::new(),
            outside: Vec::new(),
            control_plane,
            hub,
            ca: Ca::new(config::TRUST_DOMAIN),
            istio_filters: mesh.istio_filters,
            root,
        };
        let mut index = 0;
        for ip in outside {
            index += 1;
            let ns = Netns::create(&format!("{tag}-x{index}"), &[]);
            cluster.link(&ns, index, &[ip]);
            super::app::serve(&ns, "outside", false);
            cluster.outside.push((ns, (*ip).to_owned()));
        }
        let envoy_bin = envoy.map(|e| {
            // Envoy's package lives under /root, which uid 1337 cannot enter: a hard link (or
            // a copy) in the cluster's directory can be run.
            let bin = cluster.root.0.join("envoy");
            if std::fs::hard_link(e, &bin).is_err() {
                std::fs::copy(e, &bin).expect("copy Envoy");
            }
            bin
        });
        for spec in pods {
            index += 1;
            let pod = spec.workload.pod;
            let ns = Netns::create(&format!("{tag}-{pod}"), &[]);
            let dual = spec.workload.dual_stack();
            cluster.link(&ns, index, &spec.workload.ips().collect::<Vec<_>>());
            let mut routes = vec![SERVICE_RANGE];
            if dual {
                routes.push(SERVICE_RANGE_V6);
            }
            for range in routes {
                netns::run(
                    "ip",
                    &["-n", ns.name(), "route", "add", range, "dev", "eth0"],
                )
                .expect("route to the services");
            }
            let ranges = iptables::ranges_rewrite(SERVICE_RANGE, OUTSIDE_RANGE);
            iptables::apply(
                ns.name(),
                Family::V4,
                &iptables::rules(spec.capture, &ranges),
            );
            if dual {
                assert_eq!(
                    spec.capture,
                    Capture::Redirect,
                    "dual-stack pods have the injector's default capture"
                );
                iptables::apply(ns.name(), Family::V6, &iptables::ipv6_rules());
                // What istio-init adds with IPv6 enabled (`configureIPv6Addresses`): the
                // source address of the inbound clusters' IPv6 connections, which its rules
                // exempt.
                netns::run(
                    "ip",
                    &["-n", ns.name(), "-6", "addr", "add", "::6/128", "dev", "lo"],
                )
                .expect("::6 on lo");
            }
            if spec.capture == Capture::Tproxy {
                // What istio-iptables adds for TPROXY besides the rules: marked packets are
                // delivered locally.
                for args in [
                    ["rule", "add", "fwmark", "1337", "lookup", "133"].as_slice(),
                    &[
                        "route", "add", "local", "default", "dev", "lo", "table", "133",
                    ],
                ] {
                    let args: Vec<&str> = ["-n", ns.name()].iter().chain(args).copied().collect();
                    netns::run("ip", &args).expect("TPROXY routing");
                }
            }
            let dir = cluster.root.0.join(pod);
            let pod = Pod {
                proxy: None,
                servers: Vec::new(),
                workload: spec.workload,
                sidecar: spec.sidecar,
                ns,
                dir,
            };
            cluster.pods.push(pod);
            let i = cluster.pods.len() - 1;
            cluster.configure(i, mesh);
            cluster.serve_control_plane(i);
            let binary = match spec.sidecar {
                Sidecar::Revoy => PathBuf::from(env!("CARGO_BIN_EXE_revoy")),
                Sidecar::Envoy => envoy_bin.clone().expect("Envoy's binary for an Envoy pod"),
            };
            // The injector runs a TPROXY pod's sidecar as root (NET_ADMIN, for its transparent
            // listener) in group 1337, which the rules exempt.
            let uid = if spec.capture == Capture::Tproxy {
                0
            } else {
                PROXY_UID
            };
            cluster.start_proxy(i, &binary, uid);
            let p = &cluster.pods[i];
            super::app::serve(&p.ns, p.workload.pod, dual);
        }
        cluster
    }

    /// Joins `ns` to the bridge as `eth0` with addresses `ips` (an IPv4 one in a /24, an IPv6
    /// one in a /64, usable at once: no duplicate address detection).
    fn link(&self, ns: &Netns, index: usize, ips: &[&str]) {
        let veth = format!("v{index}");
        let hub = self.hub.name();
        for args in [
            vec![
                "-n",
                hub,
                "link",
                "add",
                &veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns.name(),
            ],
            vec!["-n", hub, "link", "set", &veth, "master", "br0"],
            vec!["-n", hub, "link", "set", &veth, "up"],
            vec!["-n", ns.name(), "link", "set", "eth0", "up"],
        ] {
            netns::run("ip", &args).expect("link a namespace to the bridge");
        }
        for ip in ips {
            let (cidr, more) = match ip.contains(':') {
                true => (format!("{ip}/64"), ["nodad"].as_slice()),
                false => (format!("{ip}/24"), [].as_slice()),
            };
            let args: Vec<&str> = ["-n", ns.name(), "addr", "add", &cidr, "dev", "eth0"]
                .into_iter()
                .chain(more.iter().copied())
                .collect();
            netns::run("ip", &args).expect("an address on eth0");
        }
    }

    /// Writes pod `i`'s directory: the bootstrap, its xDS resources for `mesh` and its
    /// secrets (a workload certificate for its service account).
    pub fn configure(&self, i: usize, mesh: &Mesh) {
        let pod = &self.pods[i];
        for d in [
            pod.dir.join("etc/istio/proxy"),
            pod.dir.join("var/run/secrets/workload-spiffe-uds"),
            pod.xds_dir(),
            pod.sds_dir(),
        ] {
            make_dir(&self.root.0, &d);
        }
        write_json(
            &pod.dir.join("etc/istio/proxy"),
            "envoy-rev.json",
            &bootstrap(&pod.workload, pod.istio_filters(mesh)),
        );
        self.push(i, mesh);
        self.rotate(i);
    }

    /// Serves pod `i` the resources of `mesh` (the control plane reloads and pushes them).
    pub fn push(&self, i: usize, mesh: &Mesh) {
        let pod = &self.pods[i];
        for (file, doc) in config::resources(mesh, &pod.workload, pod.istio_filters(mesh)) {
            write_json(&pod.xds_dir(), file, &doc);
        }
    }

    /// Serves every pod the resources of `mesh`.
    pub fn push_all(&self, mesh: &Mesh) {
        (0..self.pods.len()).for_each(|i| self.push(i, mesh));
    }

    /// Issues pod `i` a fresh workload certificate and serves it (with the root) over SDS;
    /// answers its serial number in lowercase hex, as `/certs` shows it.
    pub fn rotate(&self, i: usize) -> String {
        let pod = &self.pods[i];
        let cert = self
            .ca
            .workload(config::NAMESPACE, pod.workload.service_account)
            .issue();
        let secrets = config::secrets(&cert.chain_pem, &cert.key_pem, self.ca.root_pem());
        write_json(&pod.sds_dir(), "secrets.json", &secrets);
        let (_, parsed) =
            x509_parser::parse_x509_certificate(&cert.cert_der).expect("the certificate parses");
        parsed
            .tbs_certificate
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Starts pod `i`'s ADS and SDS servers in the control plane's namespace (as uid 1337,
    /// as pilot-agent runs in the pod), and waits for their sockets.
    fn serve_control_plane(&mut self, i: usize) {
        let pod = &self.pods[i];
        let mut servers = Vec::new();
        for (what, socket, dir) in [
            ("xds", pod.dir.join("etc/istio/proxy/XDS"), pod.xds_dir()),
            (
                "sds",
                pod.dir.join("var/run/secrets/workload-spiffe-uds/socket"),
                pod.sds_dir(),
            ),
        ] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_revoy"));
            cmd.arg("xds-server")
                .arg("--listen")
                .arg(format!("unix:{}", socket.display()))
                .arg("--dir")
                .arg(&dir)
                .args(["--log-level", "warn"]);
            let (out, err) = log_files(&pod.dir, what);
            cmd.stdout(out).stderr(err);
            let name = format!("{what}-server of {}", pod.workload.pod);
            let mut server = spawn_in(&self.control_plane, cmd, PROXY_UID, PROXY_UID, name.clone());
            wait_for(&name, || {
                if let Err(e) = server.check() {
                    panic!("{e}");
                }
                socket
                    .exists()
                    .then_some(())
                    .ok_or_else(|| "no socket".to_owned())
            });
            servers.push(server);
        }
        self.pods[i].servers = servers;
    }

    /// Starts pod `i`'s sidecar (`binary`) as uid `uid` and gid 1337 in the pod's directory
    /// with pilot-agent's argv, and waits until its admin says LIVE.
    pub fn start_proxy(&mut self, i: usize, binary: &Path, uid: u32) {
        let pod = &self.pods[i];
        let mut cmd = Command::new(binary);
        cmd.args(PILOT_AGENT_ARGV.split_whitespace())
            .current_dir(&pod.dir);
        let (out, err) = log_files(&pod.dir, "proxy");
        cmd.stdout(out).stderr(err);
        let what = format!("{:?} sidecar of {}", pod.sidecar, pod.workload.pod);
        let mut proxy = spawn_in(&pod.ns, cmd, uid, PROXY_UID, what.clone());
        let ns = &pod.ns;
        wait_for(&what, || {
            if let Err(e) = proxy.check() {
                panic!("{e}\n{}", pod.proxy_log());
            }
            match ns.get(None, netns::ADMIN, "/ready") {
                Ok((200, body)) if body.trim() == "LIVE" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        self.pods[i].proxy = Some(proxy);
    }

    /// The namespace of pod `name`, or of the host outside the mesh for `"outside"`.
    pub fn ns(&self, name: &str) -> &Netns {
        match name {
            "outside" => &self.outside.first().expect("a host outside the mesh").0,
            pod => &self.pod(pod).ns,
        }
    }

    /// The pod named `name`.
    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.workload.pod == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }
}
