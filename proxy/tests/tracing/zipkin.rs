//! Zipkin (`HTTP_JSON`) against Envoy 1.40: the spans a fake Zipkin collector receives, the
//! B3 headers the upstream sees and the trace headers of the response, for the same
//! requests through both proxies.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use super::tracing::{fakes, observe};
use super::{Edit, Which, bootstrap, child, compare, oracle, ports};

/// B3 ids the requests send (kept verbatim in the comparison).
const TRACE_64: &str = "463ac35c9f6413ad";
const TRACE_128: &str = "463ac35c9f6413ad48485a3953bb6124";
const SPAN: &str = "a2fb4a1d1a96d312";
const PARENT: &str = "0020000000000001";

/// The Zipkin provider with `extra` fields, for an HCM `tracing` block with `hcm`.
fn zipkin_tracing(hcm: &str, extra: &str) -> String {
    format!(
        "{{random_sampling: {{value: 100}}, {hcm} provider: {{name: envoy.tracers.zipkin, typed_config: {{\"@type\": type.googleapis.com/envoy.config.trace.v3.ZipkinConfig, collector_cluster: collector, collector_endpoint: /api/v2/spans, collector_endpoint_version: HTTP_JSON, {extra}}}}}}}"
    )
}

/// A GET with `headers`; the status and the response's trace-related headers.
fn get(addr: SocketAddr, path: &str, headers: &str) -> String {
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nhost: example.com\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
        .filter(|(n, _)| {
            n.starts_with("x-b3") || n == "b3" || n == "x-request-id" || n.contains("decorator")
        })
        .map(|(n, v)| match n.as_str() {
            "x-request-id" => format!("{n}={}", observe::request_id(&v)),
            _ => format!("{n}={v}"),
        })
        .collect();
    kept.sort();
    format!("{status} {}", kept.join(" "))
}

/// A B3 id as a label (ids the test sent kept), with its width.
fn id(labels: &mut observe::Labels, prefix: &str, v: &str) -> String {
    format!("{}/{}", labels.of(prefix, v), v.len())
}

/// A span's annotations: their values, and whether each has a time.
fn annotations(o: &serde_json::Map<String, Value>) -> Vec<String> {
    o.get("annotations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| format!("{}@{}", a["value"], a["timestamp"].is_u64()))
        .collect()
}

/// One line per span: everything but times (their presence is kept) and ids (labelled).
fn zipkin_lines(body: &[u8], labels: &mut observe::Labels) -> Vec<String> {
    let spans: Vec<Value> = serde_json::from_slice(body).expect("a JSON array of spans");
    let mut out: Vec<String> = spans
        .iter()
        .map(|s| {
            let o = s.as_object().expect("a span object");
            let text = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("");
            let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
            keys.sort();
            let tags: Vec<String> = o
                .get("tags")
                .and_then(Value::as_object)
                .map(|t| {
                    t.iter()
                        .map(|(k, v)| {
                            let v = v.as_str().unwrap_or("<not a string>");
                            match k.as_str() {
                                "guid:x-request-id" => format!("{k}={}", observe::request_id(v)),
                                "upstream_address" | "peer.address" => {
                                    format!("{k}={}", v.split(':').next().unwrap_or(""))
                                }
                                _ => format!("{k}={v}"),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "span {:?} kind={} trace={} id={} parent={} shared={:?} local={} remote={:?} annotations={:?} timestamp={} duration={} keys={keys:?} tags: {}",
                text("name"),
                text("kind"),
                id(labels, "T", text("traceId")),
                id(labels, "S", text("id")),
                id(labels, "S", text("parentId")),
                o.get("shared"),
                o.get("localEndpoint").map(Value::to_string).unwrap_or_default(),
                o.get("remoteEndpoint"),
                annotations(o),
                o.get("timestamp").is_some_and(Value::is_u64),
                o.get("duration").is_some_and(Value::is_u64),
                tags.join(" ")
            )
        })
        .collect();
    // Which of a request's spans is finished first is a race in both proxies.
    out.sort();
    out
}

/// Runs `requests` through `which` traced by Zipkin per `tracing`, on the bootstrap as
/// `edit` leaves it; what the upstream, the client and the collector saw, as lines.
async fn zipkin_run(
    which: Which,
    tracing: &str,
    edit: &Edit<'_>,
    requests: &[(&str, String)],
) -> Vec<String> {
    let (up, up_log) = fakes::http_server(200).await;
    let (col, col_log) = fakes::http_server(202).await;
    let (admin, listener) = (ports::free_port(), ports::free_port());
    let yaml = edit(bootstrap(admin, listener, up, up, col, false, tracing, ""));
    let ready = || std::net::TcpStream::connect(("127.0.0.1", listener)).is_ok();
    let _p = match which {
        Which::Envoy => child::Proxy::envoy(&oracle::envoy_path().unwrap(), &yaml, 73, ready),
        Which::Revoy => child::Proxy::start(&yaml, ready),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], listener).into();
    let mut out = Vec::new();
    let mut labels = observe::Labels::default();
    labels.keep = [TRACE_64, TRACE_128, SPAN, PARENT]
        .map(str::to_owned)
        .to_vec();
    for (path, headers) in requests {
        let before = col_log.lock().unwrap().len();
        let ups = up_log.lock().unwrap().len();
        let (p, h) = (path.to_string(), headers.clone());
        let answer = tokio::task::spawn_blocking(move || get(addr, &p, &h))
            .await
            .unwrap();
        out.push(format!("request {path} {headers:?} -> {answer}"));
        // Every span is posted on its own (min_flush_spans 1); wait until they stop coming.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let mut last = before;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let n = col_log.lock().unwrap().len();
            if std::time::Instant::now() > deadline || (n > before && n == last) {
                break;
            }
            last = n;
        }
        for s in up_log.lock().unwrap()[ups..].iter() {
            // Labelled in a fixed order: the headers' own order is no part of the comparison.
            let b3: Vec<String> = [
                "b3",
                "x-b3-parentspanid",
                "x-b3-sampled",
                "x-b3-spanid",
                "x-b3-traceid",
            ]
            .iter()
            .filter_map(|n| Some((*n, s.headers.get(*n)?)))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .map(|(n, v)| {
                let v = v.to_str().unwrap();
                let v = match n {
                    "x-b3-traceid" => id(&mut labels, "T", v),
                    "x-b3-spanid" | "x-b3-parentspanid" => id(&mut labels, "S", v),
                    "b3" => v
                        .split('-')
                        .enumerate()
                        .map(|(i, p)| match i {
                            0 => id(&mut labels, "T", p),
                            1 | 3 => id(&mut labels, "S", p),
                            _ => p.to_owned(),
                        })
                        .collect::<Vec<_>>()
                        .join("-"),
                    _ => v.to_owned(),
                };
                format!("{n}={v}")
            })
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
            let rid = s.headers.get("x-request-id").map(|v| v.to_str().unwrap());
            out.push(format!(
                "upstream {} x-request-id={:?} force-trace={:?} {}",
                s.path,
                rid.map(observe::request_id),
                s.headers.get("x-envoy-force-trace"),
                b3.join(" ")
            ));
        }
        let posts = col_log.lock().unwrap()[before..].to_vec();
        let mut spans = Vec::new();
        for p in &posts {
            out.push(format!(
                "collector {} content-type={:?}",
                p.path,
                p.headers.get("content-type")
            ));
            spans.extend(zipkin_lines(&p.body, &mut labels));
        }
        spans.sort();
        out.extend(spans);
    }
    let admin: SocketAddr = ([127, 0, 0, 1], admin).into();
    let stats = tokio::task::spawn_blocking(move || {
        super::http1::get(None, admin, "/stats?filter=tracing")
            .unwrap()
            .1
    })
    .await
    .unwrap();
    out.extend(
        stats
            .lines()
            .filter(|l| !l.contains("timer_flushed"))
            .map(str::to_owned),
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zipkin_spans_and_b3_headers_match_envoy() {
    if oracle::envoy_or_skip("zipkin_spans_and_b3_headers_match_envoy").is_none() {
        return;
    }
    let requests = [
        ("/ok", "user-agent: ua\r\n".to_owned()),
        (
            "/ok",
            format!(
                "x-b3-traceid: {TRACE_64}\r\nx-b3-spanid: {SPAN}\r\nx-b3-parentspanid: {PARENT}\r\nx-b3-sampled: 1\r\n"
            ),
        ),
        (
            "/decorated",
            format!("b3: {TRACE_128}-{SPAN}-1-{PARENT}\r\n"),
        ),
        ("/ok", format!("b3: {TRACE_64}-{SPAN}\r\n")),
        ("/ok", "x-b3-sampled: 0\r\n".to_owned()),
        ("/nothing", String::new()),
        ("/empty", String::new()),
    ];
    let h2_backend = |y: String| {
        y.replace(
            "  - name: backend\n    connect_timeout: 1s",
            "  - name: backend\n    connect_timeout: 1s\n    typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {}}}}",
        )
    };
    let outbound = |y: String| {
        y.replace(
            "  - name: ingress\n",
            "  - name: ingress\n    traffic_direction: OUTBOUND\n",
        )
    };
    let configs: [(&str, String, &Edit<'_>); 3] = [
        ("defaults", zipkin_tracing("", ""), &|y| y),
        (
            "128-bit ids, own span ids, upstream spans over HTTP/2",
            zipkin_tracing(
                "spawn_upstream_span: true,",
                "trace_id_128bit: true, shared_span_context: false",
            ),
            &h2_backend,
        ),
        ("egress", zipkin_tracing("", ""), &outbound),
    ];
    let mut runs = Vec::new();
    for (name, tracing, edit) in configs {
        let envoy = zipkin_run(Which::Envoy, &tracing, edit, &requests).await;
        let revoy = zipkin_run(Which::Revoy, &tracing, edit, &requests).await;
        if std::env::var_os("REVOY_TRACE_VERBOSE").is_some() {
            for l in &envoy {
                println!("E {name}: {l}");
            }
        }
        runs.push((name, envoy, revoy));
    }
    for (name, envoy, revoy) in runs {
        compare(name, &envoy, &revoy);
    }
}

/// The bootstrap's server-wide Zipkin tracer under a connection manager that samples
/// nothing at random: a route's own sampling, `x-envoy-force-trace` from an edge client,
/// `x-client-trace-id`, and `max_path_tag_length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zipkin_sampling_decisions_and_the_bootstrap_tracer_match_envoy() {
    if oracle::envoy_or_skip("zipkin_sampling_decisions_and_the_bootstrap_tracer_match_envoy")
        .is_none()
    {
        return;
    }
    let requests = [
        ("/ok", String::new()),
        ("/sampled?a-long-query-string", String::new()),
        ("/ok", "x-envoy-force-trace: true\r\n".to_owned()),
        (
            "/ok",
            "x-forwarded-for: 127.0.0.1\r\nx-envoy-force-trace: true\r\n".to_owned(),
        ),
        ("/ok", "x-client-trace-id: abc\r\n".to_owned()),
        (
            "/ok",
            "x-client-trace-id: abc\r\nx-request-id: 5b4c1a2e-0d1f-4a39-8c6b-4e3f2a1b0c9d\r\n"
                .to_owned(),
        ),
    ];
    let tracing = "{random_sampling: {value: 0}, max_path_tag_length: 24}";
    let server_wide = |y: String| {
        y + "tracing:\n  http: {name: envoy.tracers.zipkin, typed_config: {\"@type\": type.googleapis.com/envoy.config.trace.v3.ZipkinConfig, collector_cluster: collector, collector_endpoint: /api/v2/spans, collector_endpoint_version: HTTP_JSON}}\n"
    };
    let internal = |y: String| {
        server_wide(y).replace(
            "stat_prefix: ingress",
            "stat_prefix: ingress\n          internal_address_config: {cidr_ranges: [{address_prefix: 127.0.0.1, prefix_len: 32}]}",
        )
    };
    let configs: [(&str, &Edit<'_>); 2] = [
        ("edge client", &server_wide),
        ("internal client", &internal),
    ];
    let mut runs = Vec::new();
    for (name, edit) in configs {
        let envoy = zipkin_run(Which::Envoy, tracing, edit, &requests).await;
        let revoy = zipkin_run(Which::Revoy, tracing, edit, &requests).await;
        if std::env::var_os("REVOY_TRACE_VERBOSE").is_some() {
            for l in &envoy {
                println!("E {name}: {l}");
            }
        }
        runs.push((name, envoy, revoy));
    }
    for (name, envoy, revoy) in runs {
        compare(name, &envoy, &revoy);
    }
}

/// A Zipkin collector that is not there: every request still succeeds, and the exports are
/// counted as Envoy 1.40 counts them. Envoy's async client answers a connection that fails
/// with its router's 503, which the reporter counts in `reports_dropped` (a collector that
/// answered other than 202); `reports_failed` is for a request that got no answer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_zipkin_collector_counts_dropped_reports() {
    let reports = [
        "tracing.zipkin.reports_sent",
        "tracing.zipkin.reports_dropped",
        "tracing.zipkin.reports_failed",
        "tracing.zipkin.reports_skipped_no_cluster",
    ];
    let tracing = zipkin_tracing("", "");
    let zipkin = |which| {
        super::dead_collector_stats(
            which,
            &tracing,
            false,
            "tracing.zipkin.spans_sent",
            &reports,
        )
    };
    let counted = |stats: &str| -> Vec<String> {
        reports
            .iter()
            .chain(&["cluster.collector.upstream_cx_connect_fail"])
            .map(|n| format!("{n} counted: {}", super::stat(stats, n).unwrap_or(0) > 0))
            .collect()
    };
    let revoy = zipkin(Which::Revoy).await;
    if oracle::envoy_or_skip("a_dead_zipkin_collector_counts_dropped_reports").is_none() {
        let seen = counted(&revoy);
        assert!(
            seen.contains(&"tracing.zipkin.reports_dropped counted: true".to_string())
                && seen.contains(&"tracing.zipkin.reports_failed counted: false".to_string()),
            "{revoy}"
        );
        return;
    }
    let envoy = zipkin(Which::Envoy).await;
    compare("dead Zipkin collector", &counted(&envoy), &counted(&revoy));
}
