//! Network namespaces for tests that need addresses, routes, iptables rules or name resolution
//! of their own: the proxies run inside one (`ip netns exec`), and the test's own upstreams and
//! clients run on threads that entered it (`setns(2)`), so nothing leaves the namespace.
//!
//! `ip netns exec` bind-mounts the files of `/etc/netns/<name>/` over `/etc/`, so a namespace
//! made here has its own `hosts` and `resolv.conf` (a resolver that answers nothing:
//! `127.0.0.1`, where nobody listens on port 53 inside the namespace).
//!
//! The test crate declares `support/http1.rs` as `http1` and `support/skip.rs` as `skip`
//! beside this module.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether this process may create namespaces and has the tools; otherwise the skip of
/// `test` is recorded (`support/skip.rs`, which the test crate declares as `skip`), or under
/// `CI=true` the test fails.
pub fn tools_or_skip(test: &str) -> bool {
    tools_or_skip_with(test, &[])
}

/// [`tools_or_skip`], with the programs `more` (each answering `--version`) needed too, such
/// as `ip6tables`.
pub fn tools_or_skip_with(test: &str, more: &[&str]) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut missing: Vec<&str> = [("ip", "-V"), ("iptables", "--version")]
        .into_iter()
        .chain(more.iter().map(|t| (*t, "--version")))
        .filter(|(t, version)| {
            !Command::new(t)
                .arg(version)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(t, _)| t)
        .collect();
    if !root {
        missing.insert(0, "root");
    }
    if missing.is_empty() {
        return true;
    }
    crate::skip::skip(
        test,
        &format!("missing {}", missing.join(", ")),
        "Run as root with iproute2 and iptables (with ip6tables) installed (`.ci/run` installs them).",
    );
    false
}

/// A network namespace with loopback up, deleted (with its `/etc/netns` folder) when dropped.
pub struct Netns {
    name: String,
    etc: PathBuf,
}

impl Netns {
    /// Creates `netcov-<tag>-<pid>` and runs each of `setup` (commands such as `ip addr add
    /// ...` or `iptables ...`) inside it.
    pub fn create(tag: &str, setup: &[&str]) -> Netns {
        let name = format!("netcov-{tag}-{}", std::process::id());
        let etc = Path::new("/etc/netns").join(&name);
        // A namespace left by a killed run of the same PID would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name]).expect("ip netns add");
        let ns = Netns { name, etc };
        std::fs::create_dir_all(&ns.etc).expect("/etc/netns/<name>");
        ns.write_etc("hosts", "127.0.0.1 localhost\n");
        ns.write_etc(
            "resolv.conf",
            "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n",
        );
        for cmd in std::iter::once("ip link set lo up").chain(setup.iter().copied()) {
            let mut words = cmd.split(' ');
            let program = words.next().expect("a program");
            let args: Vec<&str> = ["netns", "exec", &ns.name, program]
                .into_iter()
                .chain(words)
                .collect();
            run("ip", &args).expect("namespace setup");
        }
        ns
    }

    /// The namespace's name (for `ip netns exec <name>` and `ip -n <name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rewrites `/etc/<file>` as the namespace's processes see it. The file is rewritten in
    /// place (same inode): `ip netns exec` bind-mounted it, and a replaced file would not be
    /// seen through the mount.
    pub fn write_etc(&self, file: &str, text: &str) {
        std::fs::write(self.etc.join(file), text).expect("write /etc/netns file");
    }

    /// Runs `f` on a thread that entered the namespace; sockets it creates stay in there.
    pub fn enter<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = Path::new("/run/netns").join(&self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open /run/netns/<name>");
            // SAFETY: `file` is an open namespace descriptor; CLONE_NEWNET moves only this
            // thread's network namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread")
    }

    /// Starts an HTTP/1.1 server on `addr` inside the namespace that answers every request
    /// with 200 and the address it was reached at (its local address) as the body. It runs
    /// until the test process exits.
    pub fn upstream(&self, addr: &str) {
        self.serve(addr, false);
    }

    /// Like [`Netns::upstream`], but the body also names the IP address the connection came
    /// from: `<local address> from <peer IP>`.
    pub fn upstream_showing_peer(&self, addr: &str) {
        self.serve(addr, true);
    }

    fn serve(&self, addr: &str, show_peer: bool) {
        let addr: SocketAddr = addr.parse().expect("upstream address");
        let listener = self.enter(move || TcpListener::bind(addr).expect("bind upstream"));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || serve_own_address(conn, show_peer));
            }
        });
    }

    /// A GET of `path` from `addr` (with `connection: close`) inside the namespace, from
    /// `source` when given: the status and the body, or what went wrong.
    pub fn get(
        &self,
        source: Option<&str>,
        addr: &str,
        path: &str,
    ) -> Result<(u16, String), String> {
        let addr: SocketAddr = addr.parse().expect("address");
        let source: Option<SocketAddr> = source.map(|s| format!("{s}:0").parse().expect("source"));
        let path = path.to_owned();
        self.enter(move || crate::http1::get(source, addr, &path))
    }

    /// Like [`Netns::get`] (from no set source), answering the response head too (status
    /// line and headers, lower-cased) between the status and the body.
    pub fn get_head(&self, addr: &str, path: &str) -> Result<(u16, String, String), String> {
        let addr: SocketAddr = addr.parse().expect("address");
        let path = path.to_owned();
        self.enter(move || crate::http1::get_head(None, addr, &path, ""))
    }

    /// Starts `binary` (revoy or Envoy) on `config` inside the namespace with `--concurrency
    /// 1`, and waits until its admin (`127.0.0.1:15000` inside the namespace) answers `/ready`
    /// with `LIVE`.
    pub fn proxy(&self, binary: &Path, config: &Path) -> Proxy {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name])
            .arg(binary)
            .arg("-c")
            .arg(config)
            .args(["--concurrency", "1", "-l", "error"]);
        if !binary.ends_with("revoy") {
            cmd.arg("--disable-hot-restart");
        }
        let proxy = Proxy(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the proxy"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = self.get(None, ADMIN, "/ready")
                && body.trim() == "LIVE"
            {
                return proxy;
            }
            assert!(Instant::now() < deadline, "{} not ready", binary.display());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The value of the stat `name` of the proxy running in the namespace (`None` when it
    /// has no such stat).
    pub fn stat(&self, name: &str) -> Option<u64> {
        let (_, body) = self
            .get(
                None,
                ADMIN,
                &format!("/stats?filter=^{}$", name.replace('.', "\\.")),
            )
            .ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// The proxies' admin address inside a namespace.
pub const ADMIN: &str = "127.0.0.1:15000";

/// A bootstrap for a proxy in a namespace: the admin at [`ADMIN`], `top` (more top-level
/// fields, whole lines), an HTTP listener `front` at `listener` (`listener_extra`: more of
/// its fields, whole lines indented by four) whose connection manager has `hcm_extra` (more
/// fields, whole lines indented by ten) and `route_config` (a YAML flow value), and
/// `clusters` (the cluster list's items, whole lines).
pub fn http_bootstrap(
    top: &str,
    listener: &str,
    listener_extra: &str,
    hcm_extra: &str,
    route_config: &str,
    clusters: &str,
) -> String {
    let (host, port) = listener.rsplit_once(':').expect("host:port");
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 15000}}}}
{top}static_resources:
  listeners:
  - name: front
    address: {{socket_address: {{address: {host}, port_value: {port}}}}}
{listener_extra}    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
{hcm_extra}          http_filters: [{{name: envoy.filters.http.router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config: {route_config}
  clusters:
{clusters}"#
    )
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

/// A proxy started by [`Netns::proxy`], stopped when dropped.
pub struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        // `ip netns exec` execs the proxy, so this is the proxy's own PID.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A config file written for one proxy run, removed when dropped.
pub struct ConfigFile(pub PathBuf);

impl ConfigFile {
    /// Writes `yaml` to a file named after `tag` in the temporary directory.
    pub fn new(tag: &str, yaml: &str) -> ConfigFile {
        let path = std::env::temp_dir().join(format!("netcov-{tag}-{}.yaml", std::process::id()));
        std::fs::write(&path, yaml).expect("write config");
        ConfigFile(path)
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `program` with `args` to completion: `Ok` when it exits with success, else what it
/// printed on stderr.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    out.status.success().then_some(()).ok_or_else(|| {
        format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn serve_own_address(mut conn: TcpStream, show_peer: bool) {
    let mut body = conn.local_addr().map(|a| a.to_string()).unwrap_or_default();
    if show_peer && let Ok(peer) = conn.peer_addr() {
        body = format!("{body} from {}", peer.ip());
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = find(&buf, b"\r\n\r\n") {
            buf.drain(..end + 4);
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
