//! Dual-stack pods: a (PERMISSIVE, behind `svc-a`) and b (STRICT, behind `svc-b`), each with an
//! IPv6 and an IPv4 address and each service with a VIP of each family, IPv6 first (a cluster
//! whose primary family is IPv6, so endpoints are reached over IPv6 and the IPv4 VIPs are the
//! listeners' additional addresses). Both pods have istio-init's default capture for both
//! families (`iptables` and `ip6tables`, and `::6` on `lo`) and the control plane serves
//! istiod's dual-stack shapes (`config.rs`). The IPv6 addresses are unique local ones
//! (`fd00:44::/64` for pods, `fd00:96::/112` for VIPs, `mesh.rs`) that exist only on the
//! test's bridge.
//!
//! Checked, with the same assertions for revoy and for Envoy in every pod: a's HTTP/1.1 and
//! gRPC requests to svc-b by its IPv6 VIP and by its IPv4 VIP reach b over mTLS, whose
//! application sees them from `::6` (the inbound cluster's `extra_source_addresses`) with a's
//! identity in XFCC; a TCP connection to svc-b's IPv6 VIP and to its IPv4 VIP; and the inbound
//! passthrough (b's application to a port of a's that no inbound chain names) over each family:
//! a's application sees it from `::6` or 127.0.0.6, through one upstream connection of
//! `InboundPassthroughCluster` (a connection captured again would make a second).

use super::app::{self, Proto};
use super::config::{self, Mesh, Mtls, Outbound, Service, Workload};
use super::iptables::Capture;
use super::mesh::{Cluster, PodSpec, Sidecar};
use super::{
    POD_A, POD_B, SVC_A_VIP, SVC_B_VIP, TCP_MESSAGE, addr, mesh_call_from, netns, oracle, stat,
    tcp_ok, workload,
};

const POD_A_V6: &str = "fd00:44::11";
const POD_B_V6: &str = "fd00:44::12";
const SVC_A_VIP_V6: &str = "fd00:96::10";
const SVC_B_VIP_V6: &str = "fd00:96::20";

/// A TCP echo port of a's application that no inbound chain names: what reaches it goes
/// through `virtualInbound`'s catch-all chain and `InboundPassthroughCluster`.
const PASSTHROUGH_PORT: u16 = 31700;

/// A dual-stack workload: pod `pod` with `service_account`, `ip6` first, then `ip4`.
fn dual(
    pod: &'static str,
    service_account: &'static str,
    ip6: &str,
    ip4: &str,
    mtls: Mtls,
) -> Workload {
    Workload {
        more_ips: vec![ip4.to_owned()],
        ..workload(pod, ip6, service_account, mtls)
    }
}

/// svc-a (pod a) and svc-b (pod b), each with its IPv6 VIP first; Istio's own filters in the
/// config when `istio_filters`.
fn mesh(istio_filters: bool) -> Mesh {
    let service = |name, vip6: &str, vip4: &str, w| Service {
        name,
        vip: vip6.to_owned(),
        more_vips: vec![vip4.to_owned()],
        endpoints: vec![w],
    };
    Mesh {
        services: vec![
            service(
                "svc-a",
                SVC_A_VIP_V6,
                SVC_A_VIP,
                dual("a", "svc-a", POD_A_V6, POD_A, Mtls::Permissive),
            ),
            service(
                "svc-b",
                SVC_B_VIP_V6,
                SVC_B_VIP,
                dual("b", "svc-b", POD_B_V6, POD_B, Mtls::Strict),
            ),
        ],
        outbound: Outbound::AllowAny,
        splits: Vec::new(),
        path_routes: Vec::new(),
        istio_filters,
    }
}

/// Starts pods a and b with `sidecar` in both, or `None` after a loud skip.
fn cluster(test: &str, tag: &str, sidecar: Sidecar) -> Option<Cluster> {
    let envoy = match sidecar {
        Sidecar::Envoy => Some(oracle::envoy_or_skip(test)?),
        Sidecar::Revoy => None,
    };
    if !netns::tools_or_skip_with(test, &["ip6tables"]) {
        return None;
    }
    let mesh = mesh(sidecar == Sidecar::Revoy);
    let pods = mesh
        .services
        .iter()
        .map(|s| PodSpec {
            workload: s.endpoints[0].clone(),
            sidecar,
            capture: Capture::Redirect,
        })
        .collect();
    Some(Cluster::start(tag, &mesh, pods, &[], envoy.as_deref()))
}

/// Runs the dual-stack scenario with `sidecar` in both pods.
pub fn run(test: &str, tag: &str, sidecar: Sidecar) {
    let Some(cluster) = cluster(test, tag, sidecar) else {
        return;
    };
    // HTTP by either VIP: the IPv4 one reaches `0.0.0.0:15001` and `0.0.0.0_80`, the IPv6 one
    // `[::]:15001` and `0.0.0.0_80`'s additional `[::]:80`; the route names both VIPs. Both go
    // to b's IPv6 address over mTLS, and b's inbound cluster hands them on from `::6`.
    for vip in [SVC_B_VIP_V6, SVC_B_VIP] {
        for proto in [Proto::H1, Proto::Grpc] {
            mesh_call_from(&cluster, "a", "b", vip, proto, "::6");
        }
    }
    // TCP by either VIP: the listener `<IPv6 VIP>_31000`, whose additional address is the
    // IPv4 VIP.
    for vip in [SVC_B_VIP_V6, SVC_B_VIP] {
        assert_eq!(
            tcp_ok(&cluster, "a", addr(vip, config::TCP_PORT), false),
            format!("b from ::6: {TCP_MESSAGE}"),
            "TCP to {vip}"
        );
    }
    // The inbound passthrough, over each family: b's sidecar sends the connection to a's
    // address through PassthroughCluster (plaintext: a is PERMISSIVE), a's `virtualInbound`
    // has no chain for the port, and InboundPassthroughCluster hands it to a's application
    // from the address of its family that istio-init's rules exempt.
    let a = cluster.pod("a");
    app::serve_tcp(&a.ns, "a", PASSTHROUGH_PORT, true, false);
    let upstream = "cluster.InboundPassthroughCluster.upstream_cx_total";
    for (ip, source) in [(POD_A_V6, "::6"), (POD_A, "127.0.0.6")] {
        let before = stat(&cluster, "a", upstream);
        assert_eq!(
            tcp_ok(&cluster, "b", addr(ip, PASSTHROUGH_PORT), false),
            format!("a from {source}: {TCP_MESSAGE}"),
            "the inbound passthrough to {ip}"
        );
        assert_eq!(
            stat(&cluster, "a", upstream),
            before + 1,
            "one connection to {ip} made one upstream connection"
        );
    }
}
