//! xDS pieces of the benchmarks. For the xDS push benchmark (`src/bin/xds_push.rs`):
//! Istio-shaped resources for the in-process snapshot ADS server (EDS clusters of 3 loopback
//! endpoints each, one outbound HTTP listener whose RDS route configuration has a virtual host
//! per cluster) and the proxy processes. For both benchmarks: the ADS bootstrap, the admin
//! client, and an ADS server with its own runtime ([`AdsServer`]). For the load benchmark's
//! `revoy-xds` contender: a static bootstrap's resources turned into the snapshot that
//! delivers the same config over ADS ([`snapshot_of_static`]).
//!
//! In the push benchmark's mesh, cluster 0 is the one cluster with a live endpoint (the
//! bench's upstream), so traffic can flow through the listener while the other clusters'
//! endpoints change; nothing listens on the other endpoints and nothing is sent there.

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy,
};
use proto::pb::envoy::config::core::v3::address::Address as AddressKind;
use proto::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use proto::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use proto::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, Locality, SocketAddress,
};
use proto::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use proto::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use proto::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener};
use proto::pb::envoy::config::route::v3::route::Action;
use proto::pb::envoy::config::route::v3::route_action::{ClusterSpecifier, MaxStreamDuration};
use proto::pb::envoy::config::route::v3::route_match::PathSpecifier;
use proto::pb::envoy::config::route::v3::{
    RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use proto::pb::envoy::extensions::filters::http::router::v3::Router;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
};
use proto::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use xds_client::server::{ServeResult, Server, Snapshot};
use xds_client::{
    CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict,
};

use crate::contender::Kind;

/// The name of the outbound listener (Istio names its outbound listeners by address and port).
pub const LISTENER_NAME: &str = "0.0.0.0_80";

/// The RDS route configuration the listener uses (Istio names it by port).
pub const ROUTE_NAME: &str = "80";

/// The Kubernetes-style host of service `i`: 100 services per namespace.
pub fn host(i: usize) -> String {
    format!("svc-{i}.ns-{}.svc.cluster.local", i / 100)
}

/// The cluster (and EDS service) name of service `i`, as Istio spells outbound clusters.
pub fn cluster_name(i: usize) -> String {
    format!("outbound|80||{}", host(i))
}

fn ads_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

fn duration(seconds: i64) -> Option<PbDuration> {
    Some(PbDuration { seconds, nanos: 0 })
}

fn socket(addr: SocketAddr) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: addr.ip().to_string(),
            port_specifier: Some(PortSpecifier::PortValue(u32::from(addr.port()))),
            ..Default::default()
        })),
    }
}

/// Cluster `i`: EDS over ADS, least request, Istio's connect timeout.
pub fn cluster(i: usize) -> Cluster {
    let name = cluster_name(i);
    Cluster {
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ads_source()),
            service_name: name.clone(),
        }),
        name,
        connect_timeout: duration(10),
        lb_policy: LbPolicy::LeastRequest as i32,
        ..Default::default()
    }
}

/// The endpoints of cluster `i` at churn generation `generation` (0: the initial ones).
/// Cluster 0 is the bench's upstream; every other cluster has 3 endpoints on loopback
/// addresses where nothing listens, the first of which moves with each generation.
pub fn assignment(i: usize, upstream: SocketAddr, generation: u64) -> ClusterLoadAssignment {
    let port = 20_000 + (i % 40_000) as u16;
    let addrs: Vec<SocketAddr> = if i == 0 {
        vec![upstream]
    } else {
        (0..3u8)
            .map(|j| {
                let ip = if j == 0 && generation > 0 {
                    Ipv4Addr::new(127, 0, 1, 1 + (generation % 250) as u8)
                } else {
                    Ipv4Addr::new(127, 0, 0, 2 + j)
                };
                SocketAddr::from((ip, port))
            })
            .collect()
    };
    ClusterLoadAssignment {
        cluster_name: cluster_name(i),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(Locality {
                region: "bench".into(),
                zone: "bench-a".into(),
                ..Default::default()
            }),
            lb_endpoints: addrs
                .into_iter()
                .map(|a| LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket(a)),
                        ..Default::default()
                    })),
                    load_balancing_weight: Some(UInt32Value { value: 1 }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The outbound HTTP listener on `127.0.0.1:port`, routes from RDS [`ROUTE_NAME`].
pub fn listener(port: u16) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: format!("outbound_0.0.0.0_{port}"),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_source()),
            route_config_name: ROUTE_NAME.into(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(HttpFilterConfig::TypedConfig(proto::pack(
                &Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: LISTENER_NAME.into(),
        address: Some(socket(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(FilterConfig::TypedConfig(proto::pack(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Istio's outbound route for one service: every path to its cluster, no timeout, Istio's
/// default retry policy and `max_stream_duration`.
fn default_route(i: usize) -> Route {
    Route {
        name: "default".into(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster_name(i))),
            timeout: duration(0),
            retry_policy: Some(RetryPolicy {
                retry_on:
                    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
                        .into(),
                num_retries: Some(UInt32Value { value: 2 }),
                host_selection_retry_max_attempts: 5,
                retriable_status_codes: vec![503],
                ..Default::default()
            }),
            max_stream_duration: Some(MaxStreamDuration {
                max_stream_duration: duration(0),
                grpc_timeout_header_max: duration(0),
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The route configuration [`ROUTE_NAME`]: a virtual host per cluster, with the domains
/// Istio gives a service on port 80; service 0 also answers to `127.0.0.1:<listener_port>`
/// (the Host a load generator sends).
pub fn route_config(n: usize, listener_port: u16) -> RouteConfiguration {
    RouteConfiguration {
        name: ROUTE_NAME.into(),
        validate_clusters: Some(proto::pb::google::protobuf::BoolValue { value: false }),
        virtual_hosts: (0..n)
            .map(|i| {
                let fqdn = host(i);
                let short = format!("svc-{i}.ns-{}", i / 100);
                let mut domains = vec![
                    fqdn.clone(),
                    format!("{fqdn}:80"),
                    short.clone(),
                    format!("{short}:80"),
                ];
                if i == 0 {
                    domains.push(format!("127.0.0.1:{listener_port}"));
                }
                VirtualHost {
                    name: format!("{fqdn}:80"),
                    domains,
                    routes: vec![default_route(i)],
                    include_request_attempt_count: true,
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}

/// A mesh of `n` services: its snapshot, and the one-cluster endpoint changes of the churn.
pub struct Mesh {
    /// Number of clusters.
    pub n: usize,
    /// The live endpoint of cluster 0.
    pub upstream: SocketAddr,
    /// The snapshot being served (churn changes it in place).
    pub snapshot: Snapshot,
    /// Endpoint changes made so far.
    pub generation: u64,
}

impl Mesh {
    /// The snapshot of `n` clusters, their endpoints, the listener on `listener_port` and its
    /// route configuration, at `version`.
    pub fn new(n: usize, upstream: SocketAddr, listener_port: u16, version: &str) -> Mesh {
        let mut snapshot = Snapshot::new(version);
        for i in 0..n {
            snapshot.insert(CLUSTER_TYPE_URL, cluster_name(i), proto::pack(&cluster(i)));
            snapshot.insert(
                ENDPOINT_TYPE_URL,
                cluster_name(i),
                proto::pack(&assignment(i, upstream, 0)),
            );
        }
        snapshot.insert(
            LISTENER_TYPE_URL,
            LISTENER_NAME.into(),
            proto::pack(&listener(listener_port)),
        );
        snapshot.insert(
            ROUTE_TYPE_URL,
            ROUTE_NAME.into(),
            proto::pack(&route_config(n, listener_port)),
        );
        Mesh {
            n,
            upstream,
            snapshot,
            generation: 0,
        }
    }

    /// Moves one endpoint of one cluster (never cluster 0; a different cluster each time) and
    /// names the snapshot `version`; answers the snapshot to serve.
    pub fn churn(&mut self, version: &str) -> Snapshot {
        self.generation += 1;
        let others = (self.n - 1).max(1) as u64;
        let i = 1 + ((self.generation - 1) % others) as usize;
        self.snapshot.insert(
            ENDPOINT_TYPE_URL,
            cluster_name(i),
            proto::pack(&assignment(i, self.upstream, self.generation)),
        );
        self.snapshot.set_version(version);
        self.snapshot.clone()
    }
}

/// The resources of the static bootstrap `yaml` (Envoy's YAML), as a snapshot at `version`
/// that delivers the same config over ADS: every listener (an HTTP connection manager's inline
/// `route_config` becomes an RDS route configuration of the same name), every cluster (a
/// `STATIC` cluster's `load_assignment` becomes its EDS `ClusterLoadAssignment`; everything
/// else about the cluster is kept). The bootstrap's other parts (admin) are not resources.
pub fn snapshot_of_static(yaml: &str, version: &str) -> Result<Snapshot, String> {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).map_err(|e| e.to_string())?;
    let codec = proto::Codec::for_document("envoy.config.bootstrap.v3.Bootstrap", &value);
    let bootstrap = codec
        .decode::<Bootstrap>(value, false)
        .map_err(|e| e.to_string())?
        .message;
    let resources = bootstrap.static_resources.unwrap_or_default();
    let mut snapshot = Snapshot::new(version);
    for mut listener in resources.listeners {
        for chain in &mut listener.filter_chains {
            for filter in &mut chain.filters {
                let Some(FilterConfig::TypedConfig(any)) = &mut filter.config_type else {
                    continue;
                };
                let Ok(mut hcm) = proto::unpack::<HttpConnectionManager>(any) else {
                    continue;
                };
                let Some(RouteSpecifier::RouteConfig(routes)) = hcm.route_specifier.take() else {
                    continue;
                };
                hcm.route_specifier = Some(RouteSpecifier::Rds(Rds {
                    config_source: Some(ads_source()),
                    route_config_name: routes.name.clone(),
                }));
                *any = proto::pack(&hcm);
                snapshot.insert(ROUTE_TYPE_URL, routes.name.clone(), proto::pack(&routes));
            }
        }
        snapshot.insert(
            LISTENER_TYPE_URL,
            listener.name.clone(),
            proto::pack(&listener),
        );
    }
    let static_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32));
    for mut cluster in resources.clusters {
        if cluster.cluster_discovery_type == static_type
            && let Some(mut assignment) = cluster.load_assignment.take()
        {
            cluster.cluster_discovery_type =
                Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            cluster.eds_cluster_config = Some(EdsClusterConfig {
                eds_config: Some(ads_source()),
                service_name: cluster.name.clone(),
            });
            assignment.cluster_name.clone_from(&cluster.name);
            snapshot.insert(
                ENDPOINT_TYPE_URL,
                cluster.name.clone(),
                proto::pack(&assignment),
            );
        }
        snapshot.insert(
            CLUSTER_TYPE_URL,
            cluster.name.clone(),
            proto::pack(&cluster),
        );
    }
    Ok(snapshot)
}

/// An ADS server on a 127.0.0.1 port with a runtime thread of its own, for a caller that has
/// no runtime; it stops serving when dropped.
pub struct AdsServer {
    /// The server (its snapshot and the ACKs and NACKs received).
    pub server: Server,
    /// Where it listens.
    pub addr: SocketAddr,
    task: JoinHandle<ServeResult>,
    // Dropped after `task` is aborted; shuts the runtime thread down.
    _rt: Runtime,
}

impl AdsServer {
    /// Starts a server serving `snapshot` (clients get it as soon as they subscribe).
    pub fn start(snapshot: Snapshot) -> Result<AdsServer, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ads-server")
            .enable_all()
            .build()
            .map_err(|e| format!("ADS server runtime: {e}"))?;
        let server = Server::new();
        server.set(snapshot);
        let (addr, task) = rt
            .block_on(server.serve_tcp("127.0.0.1:0"))
            .map_err(|e| format!("ADS server: {e}"))?;
        Ok(AdsServer {
            server,
            addr,
            task,
            _rt: rt,
        })
    }

    /// The NACKs received so far, as `type URL: error detail`.
    pub fn nacks(&self) -> Vec<String> {
        self.server
            .events()
            .into_iter()
            .filter_map(|e| match e.verdict {
                Verdict::Nack(detail) => Some(format!("{}: {detail}", e.type_url)),
                Verdict::Ack => None,
            })
            .collect()
    }
}

impl Drop for AdsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bootstrap both proxies run: node `node_id`, admin on `admin_port`, CDS and LDS over
/// ADS (`GRPC` or `DELTA_GRPC`) from `xds`, initial fetches without a timeout.
pub fn bootstrap(node_id: &str, admin_port: u16, xds: SocketAddr, delta: bool) -> String {
    let api_type = if delta { "DELTA_GRPC" } else { "GRPC" };
    format!(
        r#"node: {{id: {node_id}, cluster: xds-bench}}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: {{cluster_name: xds-grpc}}
  cds_config: {{ads: {{}}, resource_api_version: V3, initial_fetch_timeout: 0s}}
  lds_config: {{ads: {{}}, resource_api_version: V3, initial_fetch_timeout: 0s}}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: xds-grpc
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {port}}}}}}}
"#,
        ip = xds.ip(),
        port = xds.port(),
    )
}

/// How a proxy is started.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Its `node.id` (how the server's events name it).
    pub node_id: String,
    /// Its admin port.
    pub admin: u16,
    /// The ADS server.
    pub xds: SocketAddr,
    /// Delta ADS (else SotW).
    pub delta: bool,
    /// Envoy's `--base-id`.
    pub base_id: u32,
}

/// A proxy connected to the bench's ADS server; killed by PID when dropped.
pub struct Proxy {
    /// Which proxy.
    pub kind: Kind,
    /// Its admin port.
    pub admin: u16,
    /// Its `node.id`.
    pub node_id: String,
    child: Child,
    log: PathBuf,
}

impl Proxy {
    /// Writes the bootstrap under `dir` and starts `binary` with `--concurrency 2`.
    pub fn start(kind: Kind, binary: &Path, dir: &Path, launch: &Launch) -> Result<Proxy, String> {
        let Launch {
            node_id,
            admin,
            xds,
            delta,
            base_id,
        } = launch.clone();
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config = dir.join("bootstrap.yaml");
        fs::write(&config, bootstrap(&node_id, admin, xds, delta))
            .map_err(|e| format!("{}: {e}", config.display()))?;
        let mut args: Vec<String> = vec![
            "-c".into(),
            config.to_string_lossy().into_owned(),
            "--concurrency".into(),
            "2".into(),
            "-l".into(),
            "error".into(),
        ];
        if kind == Kind::Envoy {
            args.extend([
                "--disable-hot-restart".into(),
                "--base-id".into(),
                base_id.to_string(),
            ]);
        }
        let log = dir.join("output.log");
        let out = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(binary);
        // SAFETY: prctl is async-signal-safe; the child dies with the bench even if the bench
        // is killed before its Drop guards run.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        Ok(Proxy {
            kind,
            admin,
            node_id,
            child,
            log,
        })
    }

    /// The proxy's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the log's tail when the proxy has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(format!(
                "{} exited with {status}: {}",
                self.kind.name(),
                self.log_tail()
            )),
            _ => Ok(()),
        }
    }

    /// The last 2,000 bytes of the proxy's output.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        format!(
            "log {}: {}",
            self.log.display(),
            text.get(start..).unwrap_or(&text)
        )
    }

    /// Waits until the admin says the ADS stream is up (`control_plane.connected_state` 1).
    pub fn wait_connected(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            self.check_alive()?;
            match admin_get(self.admin, "/stats?filter=control_plane.connected_state") {
                Ok((_, body)) if body.contains("control_plane.connected_state: 1") => {
                    return Ok(());
                }
                Ok((_, body)) => last = body,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "{} not connected to the ADS server after {limit:?}: {last}; {}",
            self.kind.name(),
            self.log_tail()
        ))
    }

    /// Whether `/ready` answers 200.
    pub fn ready(&self) -> bool {
        matches!(admin_get(self.admin, "/ready"), Ok((200, _)))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `GET` of the admin interface; answers the status code and body.
pub fn admin_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let code = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {text:.80}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((code, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn mesh_has_every_resource_and_churn_changes_one_assignment() {
        let up = SocketAddr::from(([127, 0, 0, 1], 9));
        let mut mesh = Mesh::new(10, up, 15001, "v1");
        assert_eq!(mesh.snapshot.resources(CLUSTER_TYPE_URL).len(), 10);
        assert_eq!(mesh.snapshot.resources(ENDPOINT_TYPE_URL).len(), 10);
        assert_eq!(mesh.snapshot.resources(LISTENER_TYPE_URL).len(), 1);
        let rc = &mesh.snapshot.resources(ROUTE_TYPE_URL)[ROUTE_NAME];
        let rc = RouteConfiguration::decode(rc.any.value.as_slice()).unwrap();
        assert_eq!(rc.virtual_hosts.len(), 10);
        let before = mesh.snapshot.resources(ENDPOINT_TYPE_URL).clone();
        let next = mesh.churn("c1");
        assert_eq!(next.version(), "c1");
        let after = next.resources(ENDPOINT_TYPE_URL);
        let changed: Vec<_> = after
            .iter()
            .filter(|(name, r)| before[*name].version != r.version)
            .map(|(name, _)| name.clone())
            .collect();
        assert_eq!(changed, vec![cluster_name(1)]);
        let second = mesh.churn("c2");
        assert_ne!(
            second.resources(ENDPOINT_TYPE_URL)[&cluster_name(2)].version,
            after[&cluster_name(2)].version
        );
    }

    #[test]
    fn static_config_becomes_rds_and_eds_over_ads() {
        let up = crate::upstream::Upstream {
            http: vec![SocketAddr::from(([127, 0, 0, 1], 1001))],
            tcp: SocketAddr::from(([127, 0, 0, 1], 2000)),
            https: SocketAddr::from(([127, 0, 0, 1], 1443)),
            pki: std::sync::Arc::new(crate::tls::Pki::generate().unwrap()),
        };
        let listen = crate::configs::Listen {
            http: 3000,
            h2: 3000,
            tcp: 3002,
            admin: 3003,
        };
        let yaml = crate::configs::envoy_standard(&listen, &up);
        let snapshot = snapshot_of_static(&yaml, "v1").unwrap();
        let names =
            |type_url| -> Vec<String> { snapshot.resources(type_url).keys().cloned().collect() };
        assert_eq!(names(LISTENER_TYPE_URL), ["http", "tcp"]);
        assert_eq!(names(ROUTE_TYPE_URL), ["local"]);
        assert_eq!(names(CLUSTER_TYPE_URL), ["h1", "h2", "tcp"]);
        assert_eq!(names(ENDPOINT_TYPE_URL), ["h1", "h2", "tcp"]);
        let http = &snapshot.resources(LISTENER_TYPE_URL)["http"];
        let http: Listener = proto::unpack(&http.any).unwrap();
        let Some(FilterConfig::TypedConfig(any)) = &http.filter_chains[0].filters[0].config_type
        else {
            panic!("typed config");
        };
        let hcm: HttpConnectionManager = proto::unpack(any).unwrap();
        assert!(
            matches!(&hcm.route_specifier, Some(RouteSpecifier::Rds(rds)) if rds.route_config_name == "local")
        );
        let routes = &snapshot.resources(ROUTE_TYPE_URL)["local"];
        let routes: RouteConfiguration = proto::unpack(&routes.any).unwrap();
        assert_eq!(routes.virtual_hosts[0].routes.len(), 3);
        let h2 = &snapshot.resources(CLUSTER_TYPE_URL)["h2"];
        let h2: Cluster = proto::unpack(&h2.any).unwrap();
        assert_eq!(
            h2.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
        );
        assert!(h2.load_assignment.is_none());
        assert_eq!(h2.typed_extension_protocol_options.len(), 1);
        let tcp = &snapshot.resources(ENDPOINT_TYPE_URL)["tcp"];
        let tcp: ClusterLoadAssignment = proto::unpack(&tcp.any).unwrap();
        assert_eq!(tcp.cluster_name, "tcp");
        assert_eq!(tcp.endpoints[0].lb_endpoints.len(), 1);
    }

    #[test]
    fn bootstrap_names_the_server_and_the_api() {
        let text = bootstrap("n1", 9901, SocketAddr::from(([127, 0, 0, 1], 18000)), true);
        assert!(text.contains("api_type: DELTA_GRPC"));
        assert!(text.contains("port_value: 18000"));
        assert!(text.contains("id: n1"));
    }
}
