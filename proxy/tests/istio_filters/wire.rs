//! `istio_request_bytes` and `istio_response_bytes` are each stream's downstream wire bytes,
//! which Istio's stats filter reads from Envoy's bytes meter: an HTTP/1.1 GET, an HTTP/1.1
//! POST of 1,000 bytes and an HTTP/2 GET (curl, prior knowledge), each answered by a direct
//! response of its own status, through Envoy 1.40 (its access log's
//! `%DOWNSTREAM_WIRE_BYTES_*%`) and through revoy with `istio.stats`. A histogram keeps a
//! sample in a bin of two significant digits, so revoy's `_sum` of each series must fall in
//! the bin of Envoy's value.

use super::*;

/// The routes: each path a direct response of its own status (the series' `response_code`;
/// not 201, to which Envoy adds a `location`).
const ROUTES: &str = "{match: {prefix: /get}, direct_response: {status: 200, body: {inline_string: abc}}}, {match: {prefix: /post}, direct_response: {status: 202, body: {inline_string: accepted}}}, {match: {prefix: /h2}, direct_response: {status: 203, body: {inline_string: h2}}}";

/// The requests, by status: what each sends.
fn send(port: u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /get HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(out.starts_with(b"HTTP/1.1 200"));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let post = [
        b"POST /post HTTP/1.1\r\nhost: h.test\r\ncontent-length: 1000\r\nconnection: close\r\n\r\n"
            .as_slice(),
        &[b'x'; 1000],
    ]
    .concat();
    s.write_all(&post).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(out.starts_with(b"HTTP/1.1 202"));
    let curl = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "--max-time",
            "10",
            "--http2-prior-knowledge",
        ])
        .args(["-w", "%{http_code}", "-H", "user-agent: test/1"])
        .arg(format!("http://127.0.0.1:{port}/h2"))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "203");
}

/// Envoy's `%RESPONSE_CODE%` and wire bytes received and sent of each request, by status
/// (`None` when Envoy or curl is missing: skipped loudly).
fn envoy_wire() -> Option<Vec<(String, u64, u64)>> {
    let test = "istio.stats: Envoy's wire bytes";
    let envoy = oracle::envoy_or_skip(test)?;
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        skip::skip(
            test,
            "curl not found",
            "Install curl (Debian: the curl package).",
        );
        return None;
    }
    let (admin, port) = (free_port(), free_port());
    let log = std::env::temp_dir().join(format!("revoy-wire-{}-{port}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let settings = format!(
        "access_log: [{}]",
        file_access_log(
            &log,
            "%RESPONSE_CODE% %DOWNSTREAM_WIRE_BYTES_RECEIVED% %DOWNSTREAM_WIRE_BYTES_SENT%"
        )
    );
    let yaml = bootstrap::with_admin(
        admin,
        &bootstrap::http_listener("envoy", port, &settings, "", &format!("[{ROUTES}]")),
        &bootstrap::cluster("unused", free_port(), ""),
    );
    let _envoy = envoy_flushing_logs(&envoy, &yaml, admin, port);
    send(port);
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    admin::wait_until("Envoy's access log has every request", || {
        lines().lines().count() == 3
    });
    let mut logged: Vec<_> = lines()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    logged.sort();
    let _ = std::fs::remove_file(&log);
    Some(logged)
}

/// The lower end of the histogram bin `value` falls in: two significant digits.
fn bin(value: f64) -> f64 {
    if value < 10.0 {
        return value.floor();
    }
    let scale = 10f64.powi(value.log10().floor() as i32 - 1);
    (value / scale).floor() * scale
}

/// A histogram's `_sum` per `response_code`.
fn sums(text: &str, histogram: &str) -> Vec<(String, f64)> {
    let mut sums: Vec<_> = prometheus::series(text, &format!("{histogram}_sum"))
        .into_iter()
        .map(|(labels, v)| {
            (
                prometheus::label(&labels, "response_code"),
                v.parse().unwrap(),
            )
        })
        .collect();
    sums.sort_by(|a, b| a.0.cmp(&b.0));
    sums
}

#[test]
fn istio_request_and_response_bytes_are_envoys_wire_bytes() {
    let Some(envoy) = envoy_wire() else {
        return;
    };
    let (admin, port) = (free_port(), free_port());
    let client = node_bootstrap(
        "client",
        &node_metadata("client_node_metadata.json.tmpl"),
        admin,
        &hcm_listener("client", "OUTBOUND", port, &format!("{STATS}, "), ROUTES),
        &bootstrap::cluster("unused", free_port(), ""),
    );
    let _client = listening(&client, &[port]);
    send(port);
    // Histograms show their samples once the stats flush merged them.
    admin::wait_until("every request recorded", || {
        let text = scrape(admin);
        ["istio_request_bytes", "istio_response_bytes"]
            .iter()
            .all(|h| {
                let s = sums(&text, h);
                s.len() == 3 && s.iter().all(|(_, v)| *v > 0.0)
            })
    });
    let text = scrape(admin);
    let (received, sent) = (
        sums(&text, "istio_request_bytes"),
        sums(&text, "istio_response_bytes"),
    );
    for (i, (code, wire_in, wire_out)) in envoy.iter().enumerate() {
        assert_eq!(&received[i].0, code);
        assert_eq!(&sent[i].0, code);
        assert_eq!(
            (bin(received[i].1), bin(sent[i].1)),
            (bin(*wire_in as f64), bin(*wire_out as f64)),
            "{code}: revoy's request and response bytes {} and {} against Envoy's {wire_in} and {wire_out}",
            received[i].1,
            sent[i].1
        );
    }
}
