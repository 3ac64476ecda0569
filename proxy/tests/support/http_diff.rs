//! What tests comparing revoy with Envoy over HTTP/1.1 read and compare: one exchange's
//! answer as text, stat values from the admin endpoint, a proxy run around the observations,
//! and the comparison itself (the including test has the `child` support module too).
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use super::child::Proxy;

/// Sends `request` (a whole HTTP/1.1 request, `connection: close`) to 127.0.0.1:`port` and
/// returns the status line, the response headers starting with one of `keep` (lowercased,
/// sorted; `x-envoy-upstream-service-time`, a timing, never), and the body.
pub fn exchange(port: u16, request: &str, keep: &[&str]) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    conn.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = lines
        .map(str::to_ascii_lowercase)
        .filter(|l| {
            keep.iter().any(|h| l.starts_with(h))
                && !l.starts_with("x-envoy-upstream-service-time:")
        })
        .collect();
    kept.sort();
    format!("{status}\n{}\n{body}", kept.join("\n"))
}

/// `name: value` for each of `names` in the admin's `/stats` (`absent` when missing).
pub fn stats(admin: u16, names: &[&str]) -> Vec<String> {
    let stats = exchange(
        admin,
        "GET /stats HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
        &[],
    );
    names
        .iter()
        .map(|name| {
            let value = stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .unwrap_or("absent");
            format!("{name}: {value}")
        })
        .collect()
}

/// Fails naming every line where revoy's observations (`got`) differ from Envoy's.
pub fn assert_same(expected: &[String], got: &[String]) {
    let differences: Vec<String> = expected
        .iter()
        .zip(got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("Envoy:\n{e}\nrevoy:\n{g}\n"))
        .collect();
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    assert_eq!(got.len(), expected.len());
}

/// Starts Envoy at `envoy` (with `base_id`), else revoy, on `yaml` whose admin listens on
/// `admin`; once it is ready, returns what `observe` saw, and stops it.
pub fn observe_with(
    envoy: Option<&Path>,
    base_id: u16,
    yaml: &str,
    admin: u16,
    observe: impl FnOnce() -> Vec<String>,
) -> Vec<String> {
    let ready = || {
        exchange(
            admin,
            "GET /ready HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
            &[],
        )
        .contains(" 200 ")
    };
    let _proxy = match envoy {
        Some(path) => Proxy::envoy(path, yaml, base_id, ready),
        None => Proxy::start(yaml, ready),
    };
    observe()
}
