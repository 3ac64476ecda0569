//! Dual-stack pods: a (PERMISSIVE, behind `svc-a`) and b (STRICT, behind `svc-b`), each with an
//! IPv6 and an IPv4 address and each service with a VIP of each family, in a cluster whose
//! primary family is IPv6 or IPv4 ([`Family`]): the pods' `status.podIPs` and the services'
//! `clusterIPs` list that family first, so endpoints are reached at their address of that
//! family, the other being the endpoints' `additional_addresses` and the `<VIP>_<port>`
//! listeners' additional address. Both pods have istio-init's default capture for both
//! families (`iptables` and `ip6tables`, and `::6` on `lo`) and the control plane serves
//! istiod's dual-stack shapes (`config.rs`). The IPv6 addresses are unique local ones
//! (`fd00:44::/64` for pods, `fd00:96::/112` for VIPs, `mesh.rs`) that exist only on the
//! test's bridge.
//!
//! Checked, with the same assertions whichever sidecar (revoy or Envoy) runs in each pod: a's
//! HTTP/1.1 and gRPC requests to svc-b by its IPv6 VIP and by its IPv4 VIP reach b over mTLS,
//! whose application sees them from the inbound cluster's source address of the primary family
//! (`::6`, its `extra_source_addresses`, or 127.0.0.6) with a's identity in XFCC; a TCP
//! connection to either VIP; the inbound passthrough (b's application to a port of a's that no
//! inbound chain names) over each family: a's application sees it from `::6` or 127.0.0.6,
//! through one upstream connection of `InboundPassthroughCluster` (a connection captured again
//! would make a second); and Happy Eyeballs: with the SYNs to the endpoint's first address
//! dropped inside the calling pod, a's TCP connection to svc-b and b's first HTTP request to
//! svc-a (a new connection pool) reach the peer at its other address after the 300 ms attempt
//! delay, its application seeing them from the other family's source address, and a's sidecar
//! counts two upstream connections (one per address tried) and no connect failure, as Envoy
//! counts a Happy Eyeballs connect. Before that, with HTTP/1.1, gRPC and TCP traffic running
//! from a to svc-b's IPv6 VIP, the control plane pushes a route change, a added to svc-b's
//! endpoints and a's removal, and no request fails (the IPv4 pods' live pushes).
//!
//! With revoy in both pods, Istio's own filters are in the config, and a's HTTP/1.1, gRPC and
//! TCP calls to svc-b's IPv6 VIP are counted in both sidecars' Istio metrics with the labels
//! Istio gives them, as in the IPv4 pods (`istio_metrics`).

use super::app::{self, Proto};
use super::config::{self, Mesh, Mtls, Outbound, Service, Workload};
use super::iptables::{self, Capture, Family};
use super::mesh::{Cluster, PodSpec, Sidecar};
use super::{
    POD_A, POD_B, SVC_A_VIP, SVC_B_VIP, TCP_MESSAGE, addr, all_revoy, endpoint_added,
    endpoint_removed, istio_metrics, logs, mesh_call_from, netns, oracle, route_change, stat,
    tcp_ok, under_load, workload,
};

const POD_A_V6: &str = "fd00:44::11";
const POD_B_V6: &str = "fd00:44::12";
const SVC_A_VIP_V6: &str = "fd00:96::10";
const SVC_B_VIP_V6: &str = "fd00:96::20";

/// A TCP echo port of a's application that no inbound chain names: what reaches it goes
/// through `virtualInbound`'s catch-all chain and `InboundPassthroughCluster`.
const PASSTHROUGH_PORT: u16 = 31700;

/// A pod's or service's addresses `(IPv6, IPv4)`, listed with `first`'s first.
fn ordered(first: Family, (v6, v4): (&str, &str)) -> [String; 2] {
    match first {
        Family::V6 => [v6.to_owned(), v4.to_owned()],
        Family::V4 => [v4.to_owned(), v6.to_owned()],
    }
}

/// The other family.
fn other(family: Family) -> Family {
    match family {
        Family::V6 => Family::V4,
        Family::V4 => Family::V6,
    }
}

/// The address a pod's inbound clusters hand connections to its application from, over
/// `family` (istio-init exempts both from capture).
fn inbound_source(family: Family) -> &'static str {
    match family {
        Family::V6 => "::6",
        Family::V4 => "127.0.0.6",
    }
}

/// A dual-stack workload: pod `pod` with `service_account` and addresses `ips`, the first
/// first.
fn dual(
    pod: &'static str,
    service_account: &'static str,
    ips: [String; 2],
    mtls: Mtls,
) -> Workload {
    let [ip, more] = ips;
    Workload {
        more_ips: vec![more],
        ..workload(pod, &ip, service_account, mtls)
    }
}

/// svc-a (pod a) and svc-b (pod b), each with its VIP and pod address of `first` first;
/// Istio's own filters in the config when `istio_filters`.
fn mesh(first: Family, istio_filters: bool) -> Mesh {
    let service = |name, vips, w| {
        let [vip, more] = ordered(first, vips);
        Service {
            name,
            vip,
            more_vips: vec![more],
            endpoints: vec![w],
        }
    };
    let a = ordered(first, (POD_A_V6, POD_A));
    let b = ordered(first, (POD_B_V6, POD_B));
    Mesh {
        services: vec![
            service(
                "svc-a",
                (SVC_A_VIP_V6, SVC_A_VIP),
                dual("a", "svc-a", a, Mtls::Permissive),
            ),
            service(
                "svc-b",
                (SVC_B_VIP_V6, SVC_B_VIP),
                dual("b", "svc-b", b, Mtls::Strict),
            ),
        ],
        outbound: Outbound::AllowAny,
        splits: Vec::new(),
        path_routes: Vec::new(),
        istio_filters,
        declared_http: false,
    }
}

/// Starts pods a and b, `first` the cluster's primary family, with `sidecars` (a's, b's), or
/// `None` after a loud skip.
fn cluster(test: &str, tag: &str, first: Family, sidecars: [Sidecar; 2]) -> Option<Cluster> {
    // Envoy is needed only where a pod runs it.
    let envoy = match sidecars.contains(&Sidecar::Envoy) {
        true => Some(oracle::envoy_or_skip(test)?),
        false => None,
    };
    if !netns::tools_or_skip_with(test, &["ip6tables"]) {
        return None;
    }
    let mesh = mesh(first, all_revoy(&sidecars));
    let pods = PodSpec::per_service(&mesh, &sidecars, &[Capture::Redirect; 2]);
    Some(Cluster::start(tag, &mesh, pods, &[], envoy.as_deref()))
}

/// Runs the dual-stack scenario, `first` the cluster's primary family, with `sidecars` in pods
/// a and b.
pub fn run(test: &str, tag: &str, first: Family, sidecars: [Sidecar; 2]) {
    let Some(cluster) = cluster(test, tag, first, sidecars) else {
        return;
    };
    let vips_b = ordered(first, (SVC_B_VIP_V6, SVC_B_VIP));
    let meshed = inbound_source(first);
    // HTTP by either VIP: the IPv4 one reaches `0.0.0.0:15001` and `0.0.0.0_80`, the IPv6 one
    // `[::]:15001` and `0.0.0.0_80`'s additional `[::]:80`; the route names both VIPs. Both go
    // to b's address of the primary family over mTLS, and b's inbound cluster hands them on
    // from its source address of that family.
    for vip in &vips_b {
        for proto in [Proto::H1, Proto::Grpc] {
            mesh_call_from(&cluster, "a", "b", vip, proto, meshed);
        }
    }
    // TCP by either VIP: the listener `<first VIP>_31000`, whose additional address is the
    // other VIP.
    for vip in &vips_b {
        assert_eq!(
            tcp_ok(&cluster, "a", addr(vip, config::TCP_PORT), false),
            format!("b from {meshed}: {TCP_MESSAGE}"),
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
    if all_revoy(&sidecars) {
        // Istio's own filters, over svc-b's IPv6 VIP.
        let services = mesh(first, true).services;
        istio_metrics(&cluster, &services[1], SVC_B_VIP_V6, meshed);
    }
    live_push(&cluster, first, sidecars);
    happy_eyeballs(&cluster, first);
}

/// With HTTP/1.1, gRPC and TCP traffic running from a to svc-b's IPv6 VIP, the control plane
/// pushes a route change (svc-b's `/moved` to svc-a, while b alone serves svc-b, so that only
/// the route sends it to a), a added to svc-b's endpoints (a's sidecar then reaches its own
/// pod, which Istio's rules capture again as inbound traffic) and a's removal: no request
/// fails.
fn live_push(cluster: &Cluster, first: Family, sidecars: [Sidecar; 2]) {
    under_load(cluster, SVC_B_VIP_V6, |phase| {
        let mut mesh = mesh(first, all_revoy(&sidecars));
        let a = mesh.services[0].endpoints[0].clone();
        route_change(cluster, &mut mesh, SVC_B_VIP_V6, phase);
        endpoint_added(cluster, &mut mesh, SVC_B_VIP_V6, a, phase);
        endpoint_removed(cluster, &mut mesh, SVC_B_VIP_V6, phase);
    });
}

/// Drops, inside `pod`'s namespace, the SYNs sent to `ip`:`port` (`ip` of `family`, the
/// first address of a peer's endpoint), with a rule in that family's `filter` table: that
/// address never answers, while connections already made, and the other address, are
/// untouched.
fn silence(cluster: &Cluster, pod: &str, family: Family, ip: &str, port: u16) {
    let rule = format!("-A OUTPUT -p tcp -d {ip} --dport {port} --syn -j DROP");
    iptables::apply(
        cluster.ns(pod).name(),
        family,
        &[("filter".to_owned(), vec![rule])],
    );
}

/// The counter `name` of cluster `cluster_name` in `pod`'s sidecar (0 when absent), looked up
/// by a filter without the cluster's name, whose `|` the admin's regex filter would take as
/// an alternation.
fn cluster_stat(cluster: &Cluster, pod: &str, cluster_name: &str, name: &str) -> u64 {
    let line = format!("cluster.{cluster_name}.{name}: ");
    let (_, body) = cluster
        .pod(pod)
        .ns
        .get(None, netns::ADMIN, &format!("/stats?filter={name}$"))
        .unwrap_or_else(|e| panic!("{pod}'s /stats: {e}"));
    body.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse().unwrap_or(0))
}

/// With each endpoint's first address silenced for its caller, the callers' sidecars fall
/// back to the endpoint's additional address (Happy Eyeballs): a's TCP connection to svc-b
/// (a new upstream connection of a's TCP proxy, counted once per address tried) and b's first HTTP/1.1 request to svc-a (b's
/// first connection to a) reach their peer over the other family, whose application sees
/// them from that family's inbound source address.
fn happy_eyeballs(cluster: &Cluster, first: Family) {
    let fallback = inbound_source(other(first));
    let [b_first, _] = ordered(first, (POD_B_V6, POD_B));
    let [a_first, _] = ordered(first, (POD_A_V6, POD_A));
    let [vip_b, _] = ordered(first, (SVC_B_VIP_V6, SVC_B_VIP));
    let [vip_a, _] = ordered(first, (SVC_A_VIP_V6, SVC_A_VIP));

    silence(cluster, "a", first, &b_first, config::TCP_PORT);
    let tcp_b = format!(
        "outbound|{}||svc-b.{}.svc.{}",
        config::TCP_PORT,
        config::NAMESPACE,
        config::TRUST_DOMAIN
    );
    let counts = || {
        ["upstream_cx_total", "upstream_cx_connect_fail"]
            .map(|name| cluster_stat(cluster, "a", &tcp_b, name))
    };
    let [total, failed] = counts();
    assert_eq!(
        tcp_ok(cluster, "a", addr(&vip_b, config::TCP_PORT), false),
        format!("b from {fallback}: {TCP_MESSAGE}"),
        "TCP to {vip_b} with {b_first} silent"
    );
    assert_eq!(
        counts(),
        [total + 2, failed],
        "a's connections to svc-b's TCP port (total, connect failures): a Happy Eyeballs \
         connect counts each address it tried and no failure\n{}",
        logs(cluster)
    );

    silence(cluster, "b", first, &a_first, config::HTTP_PORT);
    mesh_call_from(cluster, "b", "a", &vip_a, Proto::H1, fallback);
}
