//! An upgraded (WebSocket) request's Istio metrics. Istio's stats filter records a request
//! from its access-log hook, when the stream ends: for an upgrade, when its tunnel closes, so
//! `istio_requests_total`'s `response_flags` and the duration and size histograms describe the
//! whole tunnel. Envoy 1.40 (an access log in place of the stats filter, which it lacks) runs
//! the same two exchanges, one closed by the downstream and one by the upstream, and says the
//! flags each stream ends with, how long it lasted and its wire bytes (which Istio's size
//! histograms read); revoy's metrics must agree with it.

use super::*;

/// How long each tunnel stays open, at least, after its payload has crossed both ways.
const HOLD: Duration = Duration::from_millis(300);
/// The bytes each tunnel carries each way.
const PAYLOAD: usize = 3000;
/// The paths: the downstream closes the first tunnel, the upstream the second.
const PATHS: [&str; 2] = ["/ws/down", "/ws/up"];

/// A WebSocket upstream: accepts the upgrade, echoes [`PAYLOAD`] bytes, then closes `/ws/up`'s
/// tunnel after [`HOLD`] and `/ws/down`'s once the downstream's side has closed.
fn ws_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || serve_ws(s));
        }
    });
    port
}

fn serve_ws(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let (head, mut data) = read_head(&mut s);
    let upstream_closes = head.split(' ').nth(1) == Some("/ws/up");
    if s.write_all(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
    )
    .is_err()
    {
        return;
    }
    let mut chunk = [0u8; 4096];
    while data.len() < PAYLOAD {
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => data.extend_from_slice(&chunk[..n]),
            _ => return,
        }
    }
    if s.write_all(&data).is_err() {
        return;
    }
    if upstream_closes {
        std::thread::sleep(HOLD);
    } else {
        while matches!(s.read(&mut chunk), Ok(n) if n > 0) {}
    }
}

/// Reads a message head: its text, and the bytes read past it.
fn read_head(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return (String::from_utf8_lossy(&buf).into_owned(), rest);
        }
        let n = s.read(&mut chunk).expect("a message head");
        assert!(
            n > 0,
            "the head ended early: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One upgrade through `port` to `path`: [`PAYLOAD`] bytes each way, then the tunnel held for
/// [`HOLD`] and closed by the client (`/ws/down`), or read until the upstream's close passes.
fn upgrade(port: u16, path: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: server.test\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    .unwrap();
    let (head, mut echoed) = read_head(&mut s);
    assert!(head.starts_with("HTTP/1.1 101"), "{path}: {head}");
    s.write_all(&[b'w'; PAYLOAD]).unwrap();
    let mut chunk = [0u8; 4096];
    while echoed.len() < PAYLOAD {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "{path}: the echo ended early");
        echoed.extend_from_slice(&chunk[..n]);
    }
    if path == "/ws/down" {
        std::thread::sleep(HOLD);
    } else {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
}

/// What Envoy logs of each exchange: path, response code, flags, `%DURATION%` and the
/// downstream wire bytes received and sent.
type Logged = (String, String, String, u64, u64, u64);

/// The two exchanges through Envoy 1.40 (`None` when Envoy is missing: skipped loudly).
fn envoy_logged(upstream: u16) -> Option<Vec<Logged>> {
    let envoy = oracle::envoy_or_skip("istio.stats of an upgrade: Envoy's view of its stream")?;
    let (admin, port) = (free_port(), free_port());
    let log = std::env::temp_dir().join(format!("revoy-ws-{}-{port}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let settings = format!(
        "upgrade_configs: [{{upgrade_type: websocket}}]\naccess_log: [{}]",
        file_access_log(
            &log,
            "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %DURATION% %DOWNSTREAM_WIRE_BYTES_RECEIVED% %DOWNSTREAM_WIRE_BYTES_SENT%"
        )
    );
    let yaml = bootstrap::with_admin(
        admin,
        &bootstrap::http_listener("envoy", port, &settings, "", &format!("[{ROUTE}]")),
        &bootstrap::cluster("up", upstream, ""),
    );
    let _envoy = envoy_flushing_logs(&envoy, &yaml, admin, port);
    for path in PATHS {
        upgrade(port, path);
    }
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    admin::wait_until("Envoy's access log has both upgrades", || {
        lines().lines().count() == PATHS.len()
    });
    let mut logged: Vec<Logged> = lines()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let number = |i: usize| f[i].parse().unwrap_or_else(|_| panic!("{l}"));
            let text = |i: usize| f[i].to_owned();
            (text(0), text(1), text(2), number(3), number(4), number(5))
        })
        .collect();
    logged.sort();
    let _ = std::fs::remove_file(&log);
    Some(logged)
}

/// The one route, to the WebSocket upstream.
const ROUTE: &str = "{match: {prefix: /ws}, route: {cluster: up}}";

/// The upper bound (`le`) of the bucket `value` falls in, among `bounds`.
fn bucket_of(bounds: &[f64], value: f64) -> f64 {
    bounds
        .iter()
        .copied()
        .filter(|le| *le >= value)
        .fold(f64::INFINITY, f64::min)
}

/// One histogram's cumulative buckets (`le`, count) for the series whose `response_flags` is
/// `flags`, from the admin on `admin`.
fn buckets(admin: u16, histogram: &str, flags: &str) -> Vec<(f64, u64)> {
    let text = super::scrape(admin);
    prometheus::series(&text, &format!("{histogram}_bucket"))
        .into_iter()
        .filter(|(labels, _)| {
            labels
                .iter()
                .any(|(n, v)| n == "response_flags" && v == flags)
        })
        .map(|(labels, count)| {
            let le = labels.iter().find(|(n, _)| n == "le").unwrap().1.as_str();
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            (le, count.parse().unwrap())
        })
        .collect()
}

/// [`buckets`] once the histogram's sample has been flushed to them (as Envoy's, at the stats
/// flush interval).
fn flushed(admin: u16, histogram: &str, flags: &str) -> Vec<(f64, u64)> {
    admin::wait_until(histogram, || {
        buckets(admin, histogram, flags)
            .iter()
            .any(|(_, count)| *count > 0)
    });
    buckets(admin, histogram, flags)
}

/// The upper bound of the bucket holding a histogram's one sample.
fn sample_bucket(buckets: &[(f64, u64)]) -> f64 {
    assert_eq!(
        buckets.iter().map(|(_, c)| *c).max(),
        Some(1),
        "one sample: {buckets:?}"
    );
    buckets
        .iter()
        .filter(|(_, c)| *c == 1)
        .map(|(le, _)| *le)
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn an_upgrade_is_recorded_when_its_tunnel_closes_with_the_flags_envoy_gives_it() {
    let upstream = ws_upstream();
    let envoy = envoy_logged(upstream);
    if let Some(logged) = &envoy {
        for (path, code, flags, ms, _, _) in logged {
            assert_eq!(code, "101", "{path}");
            assert!(*ms >= HOLD.as_millis() as u64, "{path}: Envoy's {ms} ms");
            let expected = if path == "/ws/down" { "DC" } else { "UC" };
            assert_eq!(flags, expected, "{path}: Envoy's flags");
        }
    }
    let (admin, port) = (free_port(), free_port());
    let listener = bootstrap::http_listener(
        "client",
        port,
        "upgrade_configs: [{upgrade_type: websocket}]",
        &format!("{MX_OUTBOUND}, {STATS}, "),
        &format!("[{ROUTE}]"),
    )
    .replacen(
        "- name: client\n",
        "- name: client\n    traffic_direction: OUTBOUND\n",
        1,
    );
    let client = node_bootstrap(
        "client",
        &node_metadata("client_node_metadata.json.tmpl"),
        admin,
        &listener,
        &bootstrap::cluster("up", upstream, ""),
    );
    let _client = listening(&client, &[port]);
    for path in PATHS {
        upgrade(port, path);
    }
    let series = || {
        let text = super::scrape(admin);
        let mut seen: Vec<_> = prometheus::series(&text, "istio_requests_total")
            .into_iter()
            .map(|(labels, value)| {
                (
                    prometheus::label(&labels, "response_code"),
                    prometheus::label(&labels, "response_flags"),
                    value,
                )
            })
            .collect();
        seen.sort();
        seen
    };
    admin::wait_until("both upgrades counted", || {
        series()
            .iter()
            .map(|(_, _, n)| n.parse::<usize>().unwrap())
            .sum::<usize>()
            == PATHS.len()
    });
    let flags: Vec<&str> = match &envoy {
        Some(logged) => logged.iter().map(|l| l.2.as_str()).collect(),
        None => vec!["DC", "UC"],
    };
    let expected: Vec<_> = flags
        .iter()
        .map(|f| ("101".to_owned(), f.to_string(), "1".to_owned()))
        .collect();
    assert_eq!(series(), expected, "istio_requests_total");
    for (i, flags) in flags.iter().enumerate() {
        let duration = flushed(admin, "istio_request_duration_milliseconds", flags);
        let hold = HOLD.as_millis() as f64;
        let under_hold = duration.iter().filter(|(le, _)| *le < hold);
        for (le, count) in under_hold {
            assert_eq!(*count, 0, "{flags}: a duration under {le} ms: {duration:?}");
        }
        sample_bucket(&duration);
        let Some(logged) = &envoy else { continue };
        let (_, _, _, _, received, sent) = &logged[i];
        for (histogram, wire) in [
            ("istio_request_bytes", received),
            ("istio_response_bytes", sent),
        ] {
            let b = flushed(admin, histogram, flags);
            let bounds: Vec<f64> = b.iter().map(|(le, _)| *le).collect();
            assert_eq!(
                sample_bucket(&b),
                bucket_of(&bounds, *wire as f64),
                "{flags}: {histogram} against Envoy's {wire} wire bytes: {b:?}"
            );
        }
    }
}
