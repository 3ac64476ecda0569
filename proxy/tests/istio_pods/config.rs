//! The Istio-shaped xDS resources the test's control plane serves each pod, shaped after
//! what istiod sends a sidecar (the listener dump `istio/istio` keeps as
//! `pr-37071/listeners.json` in the corpus the project read, and Istio's
//! `pilot/pkg/networking/core` builders as `docs/istio-contract` notes describe them), with the
//! test's own addresses:
//!
//! - `virtualOutbound` on 15001 (`use_original_dst`): a `virtualOutbound-blackhole` chain for
//!   15001 itself and `virtualOutbound-catchall-tcp` to `PassthroughCluster` (ALLOW_ANY) or
//!   `BlackHoleCluster` (REGISTRY_ONLY);
//! - `0.0.0.0_80` (`bind_to_port: false`): the HTTP connection manager on RDS `80`, whose
//!   virtual hosts are the services' names and VIPs, plus `allow_any` (ALLOW_ANY only);
//! - `<VIP>_<port>` (`bind_to_port: false`) TCP proxies for the TCP service ports;
//! - `virtualInbound` on 15006 (`original_dst`, `tls_inspector`, `http_inspector`): per
//!   application port a chain for Istio's mTLS ALPNs and, PERMISSIVE only, one for plaintext;
//!   the `virtualInbound` catch-all chains to `InboundPassthroughCluster`;
//! - EDS clusters `outbound|<port>||<host>` whose endpoints carry `tlsMode: istio` and whose
//!   `transport_socket_matches` pick Istio's mTLS for them; `inbound|<port>||` ORIGINAL_DST
//!   clusters bound to 127.0.0.6; `PassthroughCluster`, `InboundPassthroughCluster`,
//!   `BlackHoleCluster`.
//!
//! A dual-stack workload (one with [`Workload::more_ips`]) gets the shapes istiod with
//! `ISTIO_DUAL_STACK` gives a `model.Dual` proxy (`pilot/pkg/networking/core`:
//! `getWildcardsAndLocalHost`, `buildInboundListener`, `buildVirtualOutboundListener`,
//! `buildInboundPassthroughCluster`, the inbound clusters' `passThroughBindIPs`,
//! `Service.GetExtraAddressesForProxy`): `virtualOutbound`, `virtualInbound` and `0.0.0.0_80`
//! with `[::]` as an additional address (no `ipv4_compat`: two sockets, one per family),
//! `<VIP>_<port>` with the service's other VIPs as additional addresses, EDS endpoints with the
//! pod's other addresses as `additional_addresses`, the `virtualInbound` catch-all chains
//! without prefix ranges (as istiod builds them now), and `InboundPassthroughCluster` and the
//! inbound clusters bound to 127.0.0.6 with `::6` as `extra_source_addresses`.
//!
//! Istio's own filters (`istio.alpn`, `istio.metadata_exchange`, `istio.stats`) stock Envoy
//! lacks, so they are in the config only of a pod that runs revoy, when
//! [`Mesh::istio_filters`] says so; without them a pod's clusters offer `istio` alone, as
//! istiod's do with the exchange off (`ALPNInMesh`). They are placed as istiod places them today (istio/istio
//! `pilot/pkg/networking/core/listener_builder.go`, `networkfilter.go`, `cluster_builder.go`,
//! `pilot/pkg/xds/filters/filters.go`): outbound HTTP `istio.metadata_exchange` (upstream
//! discovery and propagation), `grpc_stats`, `istio.alpn`, `fault`, `cors`, `istio.stats`;
//! inbound HTTP the same but downstream discovery and propagation, the RBAC filters after the
//! exchange and no `istio.alpn`; inbound
//! TCP the network `istio.metadata_exchange` and `istio.stats`, its mTLS offering
//! `istio-peer-exchange`; outbound TCP `istio.stats`, with the exchange as every outbound
//! cluster's upstream filter. The inbound HTTP port then takes the chains istiod gives a port
//! whose protocol it sniffs: HTTP only for the `istio-http/*` ALPNs `istio.alpn` offers, TCP for
//! other mTLS, so the chain a request reaches tells which ALPN its client offered — unless
//! [`Mesh::declared_http`] says the port is declared HTTP, whose one chain takes every Istio
//! mTLS ALPN.

use serde_json::{Value, json};

/// The trust domain of the mesh.
pub const TRUST_DOMAIN: &str = "cluster.local";

/// The Kubernetes namespace of every workload.
pub const NAMESPACE: &str = "default";

/// The application's HTTP port (a port `inbound-ports-include.golden` captures).
pub const HTTP_PORT: u16 = 32000;

/// The application's TCP echo port (the other port `inbound-ports-include.golden` captures).
pub const TCP_PORT: u16 = 31000;

/// The application's server-first TCP port.
pub const FIRST_PORT: u16 = 31500;

/// The HTTP service port (targeting [`HTTP_PORT`]).
pub const SERVICE_HTTP_PORT: u16 = 80;

/// How a pod's inbound side takes plaintext (PeerAuthentication's mTLS mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mtls {
    /// mTLS only.
    Strict,
    /// mTLS or plaintext.
    Permissive,
}

/// What the mesh does with a destination it does not know (`outboundTrafficPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outbound {
    /// Forwarded to the original destination through `PassthroughCluster`.
    AllowAny,
    /// Refused through `BlackHoleCluster`.
    RegistryOnly,
}

/// A workload: its pod name, address, service account and inbound mTLS mode.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The pod's name.
    pub pod: &'static str,
    /// Its address (the first of the pod's `status.podIPs`).
    pub ip: String,
    /// The pod's other addresses: in a dual-stack pod, its address of the other family.
    pub more_ips: Vec<String>,
    /// Its service account (its SPIFFE identity's last part).
    pub service_account: &'static str,
    /// Its inbound mTLS mode.
    pub mtls: Mtls,
    /// Whether its pod intercepts inbound traffic with TPROXY (`virtualInbound` is then
    /// `transparent`, as istiod makes it for `INTERCEPTION_MODE: TPROXY`).
    pub tproxy: bool,
}

/// Every workload's `version` label and canonical revision.
pub const VERSION: &str = "v1";

/// The mesh's cluster (pilot-agent's `CLUSTER_ID`).
pub const CLUSTER_ID: &str = "Kubernetes";

impl Workload {
    /// Whether its pod has an address of each family (istiod's `model.Dual`).
    pub fn dual_stack(&self) -> bool {
        !self.more_ips.is_empty()
    }

    /// Its addresses, the first first.
    pub fn ips(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.ip.as_str()).chain(self.more_ips.iter().map(String::as_str))
    }

    /// Its `app` label and canonical service: its service account's name.
    pub fn app(&self) -> &'static str {
        self.service_account
    }

    /// Its deployment (`WORKLOAD_NAME`): `<app>-v1`.
    pub fn deployment(&self) -> String {
        format!("{}-{VERSION}", self.app())
    }

    /// What pilot-agent puts in its proxy's node metadata about it (the fields Istio's
    /// filters read; `POD_NAME` and `SERVICE_ACCOUNT` besides).
    pub fn node_metadata(&self) -> Value {
        let deployment = self.deployment();
        json!({
            "NAME": self.pod,
            "POD_NAME": self.pod,
            "NAMESPACE": NAMESPACE,
            "SERVICE_ACCOUNT": self.service_account,
            "WORKLOAD_NAME": deployment,
            "OWNER": format!("kubernetes://apis/apps/v1/namespaces/{NAMESPACE}/deployments/{deployment}"),
            "CLUSTER_ID": CLUSTER_ID,
            "LABELS": {
                "app": self.app(),
                "version": VERSION,
                "service.istio.io/canonical-name": self.app(),
                "service.istio.io/canonical-revision": VERSION,
            },
        })
    }
}

/// The SPIFFE identity of `service_account`:
/// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
pub fn spiffe(service_account: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/{service_account}")
}

/// A Kubernetes service: its short name, VIP and the workloads behind it (all its ports).
#[derive(Clone, Debug)]
pub struct Service {
    /// The short name (`svc-b`).
    pub name: &'static str,
    /// The cluster IP (the first of `spec.clusterIPs`).
    pub vip: String,
    /// Its other cluster IPs: in a dual-stack service, its VIP of the other family.
    pub more_vips: Vec<String>,
    /// The workloads selected.
    pub endpoints: Vec<Workload>,
}

impl Service {
    /// `<name>.<namespace>.svc.cluster.local`.
    pub fn host(&self) -> String {
        format!("{}.{NAMESPACE}.svc.{TRUST_DOMAIN}", self.name)
    }

    /// The service accounts of its workloads, each once (what its clients accept as the
    /// server's identity, as istiod lists them).
    fn service_accounts(&self) -> Vec<&str> {
        let mut accounts: Vec<&str> = self.endpoints.iter().map(|w| w.service_account).collect();
        accounts.sort();
        accounts.dedup();
        accounts
    }
}

/// The mesh as the control plane knows it.
#[derive(Clone, Debug)]
pub struct Mesh {
    /// Every service.
    pub services: Vec<Service>,
    /// The outbound traffic policy.
    pub outbound: Outbound,
    /// VirtualService-style splits: requests for the first service's path [`SPLIT_PATH`] go
    /// half to it, half to the second.
    pub splits: Vec<(&'static str, &'static str)>,
    /// VirtualService-style path routes: `(service, path prefix, to)` sends the service's
    /// requests under the prefix to service `to`.
    pub path_routes: Vec<(&'static str, &'static str, &'static str)>,
    /// Whether the config of the pods that run revoy has Istio's own filters (stock Envoy
    /// lacks them: a pod that runs Envoy gets the config istiod renders with them off).
    pub istio_filters: bool,
    /// Whether the services' HTTP port is declared HTTP (named `http`): istiod's inbound chain
    /// for it then takes every Istio mTLS ALPN to the connection manager. Else its protocol is
    /// sniffed, which with Istio's filters splits it into an HTTP chain for the `istio-http/*`
    /// ALPNs `istio.alpn` offers and a TCP chain for any other mTLS.
    pub declared_http: bool,
}

/// The path a split sends half to each service.
pub const SPLIT_PATH: &str = "/split";

/// The path prefix every pod's AuthorizationPolicy denies (a DENY rule).
pub const DENIED_PATH: &str = "/admin";

/// The path prefix every pod's AuthorizationPolicy allows only from pod a's service account
/// (an ALLOW policy whose other rule allows every other path from anyone).
pub const PRIVATE_PATH: &str = "/private";

/// The path prefix svc-b's VirtualService aborts with [`FAULT_STATUS`] (fault injection).
pub const FAULT_PATH: &str = "/fault";

/// The status of the injected abort.
pub const FAULT_STATUS: u16 = 418;

/// The origin svc-b's corsPolicy allows.
pub const CORS_ORIGIN: &str = "https://app.example";

/// The xDS resources for `workload`: `(file name, {resources: [...]})` documents for the
/// `revoy xds-server` directory of its pod, with Istio's own filters when `istio`.
pub fn resources(mesh: &Mesh, workload: &Workload, istio: bool) -> Vec<(&'static str, Value)> {
    let dual = workload.dual_stack();
    let mut listeners = vec![
        virtual_outbound(mesh.outbound, dual),
        http_outbound(istio, dual),
    ];
    let mut clusters = vec![blackhole(), passthrough(), inbound_passthrough(dual)];
    let mut endpoints = Vec::new();
    for service in &mesh.services {
        for port in [TCP_PORT, FIRST_PORT] {
            listeners.push(tcp_outbound(service, port, istio));
        }
        for port in [SERVICE_HTTP_PORT, TCP_PORT, FIRST_PORT] {
            clusters.push(outbound_cluster(service, port, istio));
            endpoints.push(load_assignment(service, port));
        }
    }
    let sniffed = istio && !mesh.declared_http;
    listeners.push(virtual_inbound(workload, istio, sniffed));
    let served: Vec<&Service> = mesh
        .services
        .iter()
        .filter(|s| s.endpoints.iter().any(|w| w.pod == workload.pod))
        .collect();
    for port in [HTTP_PORT, TCP_PORT, FIRST_PORT] {
        clusters.push(inbound_cluster(port, &served, dual));
    }
    vec![
        ("listeners.json", json!({ "resources": listeners })),
        ("clusters.json", json!({ "resources": clusters })),
        ("endpoints.json", json!({ "resources": endpoints })),
        ("routes.json", json!({ "resources": [route_80(mesh)] })),
    ]
}

/// The SDS resources of a workload: Istio's `default` (its certificate chain and key) and
/// `ROOTCA` (the mesh's root).
pub fn secrets(chain_pem: &str, key_pem: &str, root_pem: &str) -> Value {
    json!({ "resources": [
        {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": "default",
            "tls_certificate": {
                "certificate_chain": { "inline_string": chain_pem },
                "private_key": { "inline_string": key_pem },
            },
        },
        {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": "ROOTCA",
            "validation_context": { "trusted_ca": { "inline_string": root_pem } },
        },
    ]})
}

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const CLA: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const DOWNSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// The ALPN values Istio's inbound mTLS chains match for HTTP (`istio.alpn` sets the
/// `istio-http/*` ones; without it a client offers `istio-peer-exchange, istio`).
const MTLS_HTTP_ALPN: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The ALPN values Istio's outbound mTLS clusters offer with the metadata exchange on
/// (`ALPNInMeshWithMxc`), and its TCP inbound chains match.
const MTLS_TCP_ALPN: [&str; 2] = ["istio-peer-exchange", "istio"];

/// The ALPN Istio's outbound mTLS clusters offer with the metadata exchange off
/// (`ALPNInMesh`): a proxy without the exchange must not offer `istio-peer-exchange`, or a
/// server with it would start the exchange on the connection.
const MTLS_NO_MX_ALPN: [&str; 1] = ["istio"];

/// The ALPN values the inbound HTTP chain of a port whose protocol istiod sniffs matches
/// (`mtlsHTTPALPNs`): only what `istio.alpn` offers.
pub const ISTIO_HTTP_ALPN: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];

/// The ALPN an inbound TCP chain's mTLS offers when the metadata exchange is on
/// (`ALPNDownstreamWithMxc`).
const DOWNSTREAM_MX_ALPN: [&str; 3] = ["istio-peer-exchange", "h2", "http/1.1"];

const TYPED_STRUCT: &str = "type.googleapis.com/udpa.type.v1.TypedStruct";

/// The name istiod gives both metadata exchange filters (`MxFilterName`).
const MX: &str = "istio.metadata_exchange";

/// The HTTP `istio.metadata_exchange` (io.istio.http.peer_metadata.Config in a TypedStruct):
/// istiod's `SidecarOutboundMetadataFilter` (the upstream peer discovered, this proxy's
/// metadata sent upstream) or `SidecarInboundMetadataFilter` (the same downstream).
fn http_exchange(outbound: bool) -> Value {
    let discovery = json!([{ "istio_headers": {} }, { "workload_discovery": {} }]);
    let propagation = json!([{ "istio_headers": {} }]);
    let value = if outbound {
        json!({ "upstream_discovery": discovery, "upstream_propagation": propagation })
    } else {
        json!({ "downstream_discovery": discovery, "downstream_propagation": propagation })
    };
    json!({
        "name": MX,
        "typed_config": {
            "@type": TYPED_STRUCT,
            "type_url": "type.googleapis.com/io.istio.http.peer_metadata.Config",
            "value": value,
        },
    })
}

/// The network metadata exchange's config (istiod's `TCPListenerMx` / `TCPClusterMx`).
fn tcp_exchange() -> Value {
    json!({
        "@type": TYPED_STRUCT,
        "type_url": "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
        "value": { "protocol": "istio-peer-exchange", "enable_discovery": true },
    })
}

/// `istio.stats` (HTTP or network) as istiod's default Telemetry makes it: an inbound
/// listener's does not take `destination_service` from the Host header.
fn istio_stats(inbound: bool) -> Value {
    let mut config = json!({ "@type": "type.googleapis.com/stats.PluginConfig" });
    if inbound {
        config["disable_host_header_fallback"] = true.into();
    }
    json!({ "name": "istio.stats", "typed_config": config })
}

/// istiod's `istio.alpn`: the `istio-http/*` ALPN per upstream protocol.
fn istio_alpn() -> Value {
    json!({
        "name": "istio.alpn",
        "typed_config": {
            "@type": "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
            "alpn_override": [
                { "alpn_override": ["istio-http/1.0", "istio", "http/1.0"] },
                { "upstream_protocol": "HTTP11", "alpn_override": ["istio-http/1.1", "istio", "http/1.1"] },
                { "upstream_protocol": "HTTP2", "alpn_override": ["istio-h2", "istio", "h2"] },
            ],
        },
    })
}

/// An HTTP connection manager's filters in istiod's order: on an inbound listener the
/// AuthorizationPolicies' RBAC; `grpc_stats`; `fault` and `cors` for the routes' configs;
/// with Istio's filters, the metadata exchange first, `istio.alpn` (outbound only) after
/// `grpc_stats` and, last before the router, `istio.stats`.
fn http_filters(istio: bool, inbound: bool) -> Vec<Value> {
    let mut filters = Vec::new();
    if istio {
        filters.push(http_exchange(!inbound));
    }
    if inbound {
        filters.extend(authorization_policies());
    }
    filters.push(grpc_stats());
    if istio && !inbound {
        filters.push(istio_alpn());
    }
    filters.extend([
        http_filter(FAULT, "fault.v3.HTTPFault"),
        http_filter(CORS, "cors.v3.Cors"),
    ]);
    if istio {
        filters.push(istio_stats(inbound));
    }
    filters.push(router());
    filters
}

/// An inbound TCP chain's filters: with Istio's, the exchange and `istio.stats` first.
fn inbound_tcp_filters(istio: bool, cluster: &str) -> Vec<Value> {
    let mut filters = Vec::new();
    if istio {
        filters.push(json!({ "name": MX, "typed_config": tcp_exchange() }));
        filters.push(istio_stats(true));
    }
    filters.push(tcp_proxy(cluster));
    filters
}

fn address(ip: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": ip, "port_value": port } })
}

/// A listener's `additional_addresses`, one per address in `ips`, on `port`.
fn additional_addresses<'a>(ips: impl IntoIterator<Item = &'a str>, port: u16) -> Value {
    ips.into_iter()
        .map(|ip| json!({ "address": address(ip, port) }))
        .collect()
}

/// What istiod adds to a dual-stack proxy's wildcard listener: `[::]` beside `0.0.0.0`.
fn wildcard_v6(listener: &mut Value, dual: bool, port: u16) {
    if dual {
        listener["additional_addresses"] = additional_addresses(["::"], port);
    }
}

fn tcp_proxy(cluster: &str) -> Value {
    json!({
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": { "@type": TCP_PROXY, "stat_prefix": cluster, "cluster": cluster },
    })
}

/// Istio's `SdsSecretConfig` for `name` from pilot-agent's socket (the `sds-grpc` cluster).
fn sds(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "sds-grpc" } }],
            },
            "initial_fetch_timeout": "0s",
            "resource_api_version": "V3",
        },
    })
}

/// Istio's `common_tls_context`: `default` presented, peers checked against `ROOTCA` and the
/// URI SAN matchers `sans` (any of them), ALPN `alpn`.
fn mesh_tls(sans: Vec<Value>, alpn: &[&str]) -> Value {
    let sans: Vec<Value> = sans
        .into_iter()
        .map(|matcher| json!({ "san_type": "URI", "matcher": matcher }))
        .collect();
    json!({
        "alpn_protocols": alpn,
        "tls_certificate_sds_secret_configs": [sds("default")],
        "combined_validation_context": {
            "default_validation_context": {
                "match_typed_subject_alt_names": sans,
            },
            "validation_context_sds_secret_config": sds("ROOTCA"),
        },
    })
}

/// The inbound mTLS transport socket: a client certificate from the trust domain required.
fn inbound_tls(alpn: &[&str]) -> Value {
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": DOWNSTREAM_TLS,
            "common_tls_context": mesh_tls(vec![json!({ "prefix": format!("spiffe://{TRUST_DOMAIN}/") })], alpn),
            "require_client_certificate": true,
        },
    })
}

fn virtual_outbound(outbound: Outbound, dual: bool) -> Value {
    let catchall = match outbound {
        Outbound::AllowAny => "PassthroughCluster",
        Outbound::RegistryOnly => "BlackHoleCluster",
    };
    let mut listener = json!({
        "@type": LISTENER,
        "name": "virtualOutbound",
        "address": address("0.0.0.0", 15001),
        "use_original_dst": true,
        "traffic_direction": "OUTBOUND",
        "filter_chains": [
            {
                "name": "virtualOutbound-blackhole",
                "filter_chain_match": { "destination_port": 15001 },
                "filters": [tcp_proxy("BlackHoleCluster")],
            },
            { "name": "virtualOutbound-catchall-tcp", "filters": [tcp_proxy(catchall)] },
        ],
    });
    wildcard_v6(&mut listener, dual, 15001);
    listener
}

fn http_outbound(istio: bool, dual: bool) -> Value {
    let mut listener = json!({
        "@type": LISTENER,
        "name": format!("0.0.0.0_{SERVICE_HTTP_PORT}"),
        "address": address("0.0.0.0", SERVICE_HTTP_PORT),
        "bind_to_port": false,
        "traffic_direction": "OUTBOUND",
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": HCM,
                    "stat_prefix": format!("outbound_0.0.0.0_{SERVICE_HTTP_PORT}"),
                    "rds": {
                        "route_config_name": SERVICE_HTTP_PORT.to_string(),
                        "config_source": {
                            "ads": {},
                            "initial_fetch_timeout": "0s",
                            "resource_api_version": "V3",
                        },
                    },
                    "http_filters": http_filters(istio, false),
                    "use_remote_address": false,
                    "normalize_path": true,
                    "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
                    "stream_idle_timeout": "0s",
                },
            }],
        }],
    });
    wildcard_v6(&mut listener, dual, SERVICE_HTTP_PORT);
    listener
}

const FAULT: &str = "envoy.filters.http.fault";
const CORS: &str = "envoy.filters.http.cors";
const RBAC: &str = "envoy.filters.http.rbac";

/// An HTTP filter `name` with an empty config of type `envoy.extensions.filters.http.<ty>`
/// (what istiod puts in every connection manager; routes carry the real configs).
fn http_filter(name: &str, ty: &str) -> Value {
    json!({
        "name": name,
        "typed_config": { "@type": format!("type.googleapis.com/envoy.extensions.filters.http.{ty}") },
    })
}

/// `envoy.filters.http.grpc_stats` as istiod configures it (no per-method stats).
fn grpc_stats() -> Value {
    json!({
        "name": "envoy.filters.http.grpc_stats",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
            "emit_filter_state": true,
            "stats_for_all_methods": false,
        },
    })
}

/// The RBAC filter istiod makes for every pod's AuthorizationPolicies: a DENY policy for
/// [`DENIED_PATH`] from anyone, and an ALLOW policy with two rules — every path but
/// [`PRIVATE_PATH`] from anyone, that one from pod a's service account only — each in
/// istiod's shape (`and_rules`/`or_rules`, `and_ids`/`or_ids`, the peer's SPIFFE identity as
/// an `authenticated` principal).
fn authorization_policies() -> [Value; 2] {
    let path = |prefix: &str| json!({ "url_path": { "path": { "prefix": prefix } } });
    let rbac = |action: &str, policies: Value| {
        json!({
            "name": RBAC,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
                "rules": { "action": action, "policies": policies },
            },
        })
    };
    let anyone = json!([{ "and_ids": { "ids": [{ "any": true }] } }]);
    let from_a = json!([{ "and_ids": { "ids": [{ "or_ids": { "ids": [
        { "authenticated": { "principal_name": { "exact": spiffe("svc-a") } } },
    ]}}]}}]);
    [
        rbac(
            "DENY",
            json!({
                format!("ns[{NAMESPACE}]-policy[deny-admin]-rule[0]"): {
                    "permissions": [{ "and_rules": { "rules": [{ "or_rules": { "rules": [path(DENIED_PATH)] } }] } }],
                    "principals": anyone,
                },
            }),
        ),
        rbac(
            "ALLOW",
            json!({
                format!("ns[{NAMESPACE}]-policy[private]-rule[0]"): {
                    "permissions": [{ "and_rules": { "rules": [{ "not_rule": { "or_rules": { "rules": [path(PRIVATE_PATH)] } } }] } }],
                    "principals": anyone,
                },
                format!("ns[{NAMESPACE}]-policy[private]-rule[1]"): {
                    "permissions": [{ "and_rules": { "rules": [{ "or_rules": { "rules": [path(PRIVATE_PATH)] } }] } }],
                    "principals": from_a,
                },
            }),
        ),
    ]
}

fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
    })
}

fn outbound_name(service: &Service, port: u16) -> String {
    format!("outbound|{port}||{}", service.host())
}

fn tcp_outbound(service: &Service, port: u16, istio: bool) -> Value {
    let mut filters = Vec::new();
    if istio {
        filters.push(istio_stats(false));
    }
    filters.push(tcp_proxy(&outbound_name(service, port)));
    let mut listener = json!({
        "@type": LISTENER,
        "name": format!("{}_{port}", service.vip),
        "address": address(&service.vip, port),
        "bind_to_port": false,
        "traffic_direction": "OUTBOUND",
        "filter_chains": [{ "filters": filters }],
    });
    if !service.more_vips.is_empty() {
        listener["additional_addresses"] =
            additional_addresses(service.more_vips.iter().map(String::as_str), port);
    }
    listener
}

/// An address as a Host header names it: an IPv6 one in brackets.
fn bracketed(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    }
}

fn route_80(mesh: &Mesh) -> Value {
    let mut hosts: Vec<Value> = mesh
        .services
        .iter()
        .map(|s| {
            let host = s.host();
            let names = [
                host.clone(),
                s.name.to_owned(),
                format!("{}.{NAMESPACE}.svc", s.name),
                format!("{}.{NAMESPACE}", s.name),
            ]
            .into_iter()
            .chain(
                std::iter::once(&s.vip)
                    .chain(&s.more_vips)
                    .map(|v| bracketed(v)),
            );
            let domains: Vec<String> = names
                .flat_map(|n| [n.clone(), format!("{n}:{SERVICE_HTTP_PORT}")])
                .collect();
            let moved = mesh
                .path_routes
                .iter()
                .filter(|(from, _, _)| *from == s.name)
                .filter_map(|(_, path, to)| {
                    let to = mesh.services.iter().find(|o| o.name == *to)?;
                    Some(json!({
                        "name": format!("to-{}", to.name),
                        "match": { "prefix": path },
                        "route": {
                            "cluster": outbound_name(to, SERVICE_HTTP_PORT),
                            "timeout": "0s",
                            "max_grpc_timeout": "0s",
                            "retry_policy": retry_policy(),
                        },
                    }))
                });
            let mut routes: Vec<Value> = mesh
                .splits
                .iter()
                .filter(|(from, _)| *from == s.name)
                .filter_map(|(_, to)| mesh.services.iter().find(|o| o.name == *to))
                .map(|other| {
                    json!({
                        "name": "split",
                        "match": { "prefix": SPLIT_PATH },
                        "route": {
                            "weighted_clusters": { "clusters": [
                                { "name": outbound_name(s, SERVICE_HTTP_PORT), "weight": 50 },
                                { "name": outbound_name(other, SERVICE_HTTP_PORT), "weight": 50 },
                            ]},
                            "timeout": "0s",
                            "max_grpc_timeout": "0s",
                            "retry_policy": retry_policy(),
                        },
                    })
                })
                .chain(moved)
                .collect();
            let mut default = json!({
                "name": "default",
                "match": { "prefix": "/" },
                "route": {
                    "cluster": outbound_name(s, SERVICE_HTTP_PORT),
                    "timeout": "0s",
                    "max_grpc_timeout": "0s",
                    "retry_policy": retry_policy(),
                },
            });
            if s.name == "svc-b" {
                // svc-b's VirtualService: a fault abort on FAULT_PATH and a corsPolicy, each
                // as istiod puts it on the route.
                let mut fault = default.clone();
                fault["name"] = json!("fault");
                fault["match"] = json!({ "prefix": FAULT_PATH });
                fault["typed_per_filter_config"] = json!({ FAULT: {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
                    "abort": {
                        "http_status": FAULT_STATUS,
                        "percentage": { "numerator": 1_000_000, "denominator": "MILLION" },
                    },
                }});
                routes.push(fault);
                default["typed_per_filter_config"] = json!({ CORS: {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
                    "allow_origin_string_match": [{ "exact": CORS_ORIGIN }],
                    "allow_methods": "GET,POST",
                    "allow_headers": "content-type",
                    "max_age": "600",
                }});
            }
            routes.push(default);
            json!({
                "name": format!("{host}:{SERVICE_HTTP_PORT}"),
                "domains": domains,
                "routes": routes,
                "include_request_attempt_count": true,
            })
        })
        .collect();
    if mesh.outbound == Outbound::AllowAny {
        hosts.push(json!({
            "name": "allow_any",
            "domains": ["*"],
            "routes": [{
                "name": "allow_any",
                "match": { "prefix": "/" },
                "route": { "cluster": "PassthroughCluster", "timeout": "0s" },
            }],
            "include_request_attempt_count": true,
        }));
    }
    json!({
        "@type": ROUTE,
        "name": SERVICE_HTTP_PORT.to_string(),
        "virtual_hosts": hosts,
        "validate_clusters": false,
        "max_direct_response_body_size_bytes": 1_048_576,
        "ignore_port_in_host_matching": true,
    })
}

/// The retry policy istiod gives outbound routes by default (as in the `productpage`
/// config dump of `istioctl/cmd/testdata/authz/`, the predicate with its typed config).
fn retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,resource-exhausted,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate" },
        }],
        "host_selection_retry_max_attempts": 3,
        "retriable_status_codes": [503],
    })
}

fn inbound_name(port: u16) -> String {
    format!("inbound|{port}||")
}

/// The inbound HTTP connection manager for `port`: XFCC appended with the peer's subject,
/// URI and DNS SANs, everything routed to `inbound|<port>||`.
fn inbound_hcm(port: u16, istio: bool) -> Value {
    let cluster = inbound_name(port);
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": HCM,
            "stat_prefix": format!("inbound_0.0.0.0_{port}"),
            "route_config": {
                "name": cluster,
                "validate_clusters": false,
                "virtual_hosts": [{
                    "name": format!("inbound|http|{port}"),
                    "domains": ["*"],
                    "routes": [{
                        "name": "default",
                        "match": { "prefix": "/" },
                        "route": { "cluster": cluster, "timeout": "0s", "max_grpc_timeout": "0s" },
                    }],
                }],
            },
            "http_filters": http_filters(istio, true),
            "forward_client_cert_details": "APPEND_FORWARD",
            "set_current_client_cert_details": { "subject": true, "dns": true, "uri": true },
            "use_remote_address": false,
            "normalize_path": true,
            "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
            "server_name": "istio-envoy",
            "stream_idle_timeout": "0s",
        },
    })
}

/// `virtualInbound`'s chains for the application's ports, with Istio's filters when `istio`.
/// When `sniffed`, the HTTP port's mTLS chains are those of a port whose protocol istiod
/// sniffs: the connection manager for the `istio-http/*` ALPNs, a TCP proxy for any other
/// mTLS.
fn virtual_inbound(workload: &Workload, istio: bool, sniffed: bool) -> Value {
    let mut chains = vec![json!({
        "name": "virtualInbound-blackhole",
        "filter_chain_match": { "destination_port": 15006 },
        "filters": [tcp_proxy("BlackHoleCluster")],
    })];
    let name = |port: u16| format!("0.0.0.0_{port}");
    let http_alpn: &[&str] = if sniffed {
        &ISTIO_HTTP_ALPN
    } else {
        &MTLS_HTTP_ALPN
    };
    let tcp_alpn: &[&str] = if istio { &DOWNSTREAM_MX_ALPN } else { &[] };
    chains.push(json!({
        "name": name(HTTP_PORT),
        "filter_chain_match": {
            "destination_port": HTTP_PORT,
            "transport_protocol": "tls",
            "application_protocols": http_alpn,
        },
        "filters": [inbound_hcm(HTTP_PORT, istio)],
        "transport_socket": inbound_tls(&["h2", "http/1.1"]),
    }));
    if sniffed {
        chains.push(json!({
            "name": name(HTTP_PORT),
            "filter_chain_match": { "destination_port": HTTP_PORT, "transport_protocol": "tls" },
            "filters": inbound_tcp_filters(istio, &inbound_name(HTTP_PORT)),
            "transport_socket": inbound_tls(tcp_alpn),
        }));
    }
    if workload.mtls == Mtls::Permissive {
        chains.push(json!({
            "name": name(HTTP_PORT),
            "filter_chain_match": { "destination_port": HTTP_PORT, "transport_protocol": "raw_buffer" },
            "filters": [inbound_hcm(HTTP_PORT, istio)],
        }));
    }
    for port in [TCP_PORT, FIRST_PORT] {
        chains.push(json!({
            "name": name(port),
            "filter_chain_match": {
                "destination_port": port,
                "transport_protocol": "tls",
                "application_protocols": MTLS_TCP_ALPN,
            },
            "filters": inbound_tcp_filters(istio, &inbound_name(port)),
            "transport_socket": inbound_tls(tcp_alpn),
        }));
        if workload.mtls == Mtls::Permissive {
            chains.push(json!({
                "name": name(port),
                "filter_chain_match": { "destination_port": port, "transport_protocol": "raw_buffer" },
                "filters": inbound_tcp_filters(istio, &inbound_name(port)),
            }));
        }
    }
    // The catch-all chains. A dual-stack proxy's have no prefix range, as istiod builds them
    // today (`0.0.0.0/0` would not match IPv6); an IPv4 one's keep the dump's `0.0.0.0/0`.
    let catch_all = |transport: &str| {
        let mut m = json!({ "transport_protocol": transport });
        if !workload.dual_stack() {
            m["prefix_ranges"] = json!([{ "address_prefix": "0.0.0.0", "prefix_len": 0 }]);
        }
        m
    };
    let mut tls_match = catch_all("tls");
    tls_match["application_protocols"] = json!(MTLS_TCP_ALPN);
    chains.push(json!({
        "name": "virtualInbound",
        "filter_chain_match": tls_match,
        "filters": [tcp_proxy("InboundPassthroughCluster")],
        "transport_socket": inbound_tls(&[]),
    }));
    if workload.mtls == Mtls::Permissive {
        chains.push(json!({
            "name": "virtualInbound",
            "filter_chain_match": catch_all("raw_buffer"),
            "filters": [tcp_proxy("InboundPassthroughCluster")],
        }));
    }
    let mut listener = json!({
        "@type": LISTENER,
        "name": "virtualInbound",
        "address": address("0.0.0.0", 15006),
        "traffic_direction": "INBOUND",
        "transparent": workload.tproxy.then_some(true),
        "continue_on_listener_filters_timeout": true,
        "listener_filters": [
            {
                "name": "envoy.filters.listener.original_dst",
                "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst" },
            },
            {
                "name": "envoy.filters.listener.tls_inspector",
                "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" },
            },
        ],
        "filter_chains": chains,
    });
    wildcard_v6(&mut listener, workload.dual_stack(), 15006);
    listener
}

/// An ORIGINAL_DST cluster (Istio's passthrough and inbound clusters), bound to 127.0.0.6
/// when `inbound`, so its connections to the application escape iptables' capture, and for a
/// `dual` stack proxy to `::6` when the application's address is IPv6.
fn original_dst(name: &str, inbound: bool, dual: bool) -> Value {
    let mut cluster = json!({
        "@type": CLUSTER,
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
        "cleanup_interval": "60s",
    });
    if inbound {
        cluster["upstream_bind_config"] =
            json!({ "source_address": { "address": "127.0.0.6", "port_value": 0 } });
        if dual {
            cluster["upstream_bind_config"]["extra_source_addresses"] =
                json!([{ "address": { "address": "::6", "port_value": 0 } }]);
        }
    }
    cluster
}

fn passthrough() -> Value {
    original_dst("PassthroughCluster", false, false)
}

fn inbound_passthrough(dual: bool) -> Value {
    original_dst("InboundPassthroughCluster", true, dual)
}

/// The inbound cluster of `port`, its `istio` metadata naming the services the pod serves
/// there (what `istio.stats` reads `destination_service` from).
fn inbound_cluster(port: u16, served: &[&Service], dual: bool) -> Value {
    let mut cluster = original_dst(&inbound_name(port), true, dual);
    let services: Vec<Value> = served.iter().map(|s| service_metadata(s)).collect();
    cluster["metadata"] = json!({ "filter_metadata": { "istio": { "services": services } } });
    if port == HTTP_PORT {
        follow_downstream_protocol(&mut cluster);
    }
    cluster
}

/// Istio's HTTP options for a port whose protocol is sniffed: HTTP/2 upstream for HTTP/2
/// downstream (gRPC among it), HTTP/1.1 for HTTP/1.1.
fn follow_downstream_protocol(cluster: &mut Value) {
    cluster["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "use_downstream_protocol_config": { "http_protocol_options": {}, "http2_protocol_options": {} },
        },
    });
}

fn blackhole() -> Value {
    json!({ "@type": CLUSTER, "name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s" })
}

/// A service as istiod describes it in a cluster's `istio` metadata (`buildServiceMetadata`).
fn service_metadata(service: &Service) -> Value {
    json!({ "host": service.host(), "name": service.name, "namespace": NAMESPACE })
}

/// The EDS cluster of `service`'s `port`, with its `istio` metadata and, with Istio's filters,
/// the metadata exchange as its upstream filter.
fn outbound_cluster(service: &Service, port: u16, istio: bool) -> Value {
    let name = outbound_name(service, port);
    let mut cluster = json!({
        "@type": CLUSTER,
        "name": name,
        "type": "EDS",
        "metadata": { "filter_metadata": { "istio": {
            "services": [service_metadata(service)],
            "default_original_port": port,
        }}},
        "eds_cluster_config": {
            "service_name": name,
            "eds_config": { "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" },
        },
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "transport_socket_matches": [
            {
                "name": "tlsMode-istio",
                "match": { "tlsMode": "istio" },
                "transport_socket": {
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": UPSTREAM_TLS,
                        "common_tls_context": mesh_tls(
                            service.service_accounts().into_iter().map(|sa| json!({ "exact": spiffe(sa) })).collect(),
                            if istio { &MTLS_TCP_ALPN } else { &MTLS_NO_MX_ALPN },
                        ),
                        "sni": format!("outbound_.{port}_._.{}", service.host()),
                    },
                },
            },
            {
                "name": "tlsMode-disabled",
                "match": {},
                "transport_socket": {
                    "name": "envoy.transport_sockets.raw_buffer",
                    "typed_config": { "@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer" },
                },
            },
        ],
    });
    if istio {
        cluster["filters"] = json!([{ "name": MX, "typed_config": tcp_exchange() }]);
    }
    if port == SERVICE_HTTP_PORT {
        follow_downstream_protocol(&mut cluster);
    }
    cluster
}

fn load_assignment(service: &Service, port: u16) -> Value {
    let target = if port == SERVICE_HTTP_PORT {
        HTTP_PORT
    } else {
        port
    };
    let endpoints: Vec<Value> = service
        .endpoints
        .iter()
        .map(|w| {
            let mut endpoint = json!({ "address": address(&w.ip, target) });
            if w.dual_stack() {
                endpoint["additional_addresses"] =
                    additional_addresses(w.more_ips.iter().map(String::as_str), target);
            }
            json!({
                "endpoint": endpoint,
                "metadata": { "filter_metadata": {
                    "envoy.transport_socket_match": { "tlsMode": "istio" },
                    "istio": { "workload": format!("{};{NAMESPACE};{};{VERSION};{CLUSTER_ID}", w.deployment(), w.app()) },
                }},
                "load_balancing_weight": 1,
            })
        })
        .collect();
    json!({
        "@type": CLA,
        "cluster_name": outbound_name(service, port),
        "endpoints": [{ "locality": {}, "lb_endpoints": endpoints }],
    })
}
