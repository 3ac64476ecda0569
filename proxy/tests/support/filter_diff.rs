//! What the HTTP filters' differential tests against Envoy share: an upstream, one HTTP/1.1
//! request reduced to what a comparison looks at, the admin's stats by name, a proxy run
//! around the observations, and the comparison itself.
// Each test binary that includes this module uses only some of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

/// The connection manager's type URL.
pub const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
/// The router filter, as a flow-style YAML entry of `http_filters`.
pub const ROUTER: &str = "{name: envoy.filters.http.router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// Envoy (when `envoy` names it, as `base_id`) or revoy on `yaml`, once its admin on `admin`
/// says it is ready.
pub fn start(envoy: Option<&Path>, yaml: &str, base_id: u16, admin: u16) -> crate::child::Proxy {
    let ready = || self::ready(admin);
    match envoy {
        Some(path) => crate::child::Proxy::envoy(path, yaml, base_id, ready),
        None => crate::child::Proxy::start(yaml, ready),
    }
}

/// An upstream answering every request `200 ok` with an `x-upstream: yes` header.
pub fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut seen = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        seen.clear();
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nx-upstream: yes\r\ncontent-length: 2\r\n\r\nok",
                        );
                    }
                }
            });
        }
    });
    port
}

/// One HTTP/1.1 request: the status line, the response headers whose (lower-cased) names
/// start with one of `kept` (sorted, values as sent), and the body.
pub fn request(
    port: u16,
    method: &str,
    host: &str,
    path: &str,
    headers: &str,
    kept: &[&str],
) -> String {
    exchange(
        port,
        &format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n{headers}connection: close\r\n\r\n"),
        kept,
    )
}

/// Sends `raw` (a whole HTTP/1.1 request ending with `connection: close`) to 127.0.0.1:`port`
/// and returns what [`request`] returns (`x-envoy-upstream-service-time`, a timing, never
/// kept).
pub fn exchange(port: u16, raw: &str, kept: &[&str]) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    conn.write_all(raw.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut shown: Vec<String> = lines
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            let name = name.to_ascii_lowercase();
            // A duration: whether it is there is compared, not its value.
            let value = if name == "x-envoy-upstream-service-time" {
                " <present>"
            } else {
                value
            };
            kept.iter()
                .any(|k| name.starts_with(k))
                .then(|| format!("{name}:{value}"))
        })
        .collect();
    shown.sort();
    format!("{status}\n{}\n{body}", shown.join("\n"))
}

/// A request to send: (listener index, method, host, path, extra request headers).
pub type Case = (
    usize,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

/// What the listeners on `ports` answer to each case, each answer after its case.
pub fn answers(ports: &[u16], cases: &[Case], kept: &[&str]) -> Vec<String> {
    cases
        .iter()
        .map(|(l, method, host, path, headers)| {
            format!(
                "{l} {method} {host}{path} {headers:?}\n{}",
                request(ports[*l], method, host, path, headers, kept)
            )
        })
        .collect()
}

/// The admin's counters and gauges `names`, as `name: value` lines (`absent` when missing).
pub fn stats(admin: u16, names: &[&str]) -> String {
    stat_lines(admin, names).join("\n")
}

/// [`stats`], one line per name.
pub fn stat_lines(admin: u16, names: &[&str]) -> Vec<String> {
    let stats = request(admin, "GET", "admin", "/stats", "", &[]);
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

/// Whether the admin at `admin` answers `/ready` with 200.
pub fn ready(admin: u16) -> bool {
    request(admin, "GET", "admin", "/ready", "", &[]).contains(" 200 ")
}

/// Fails naming every observation where revoy (`got`) differs from Envoy (`expected`).
pub fn assert_same(expected: &[String], got: &[String]) {
    let differ: Vec<String> = expected
        .iter()
        .zip(got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("Envoy:\n{e}\nrevoy:\n{g}"))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n---\n"));
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
    let _proxy = start(envoy, yaml, base_id, admin);
    observe()
}
