//! Loopback tests of the cluster manager and tcp_proxy against tiny in-test servers (each binds
//! port 0 and keeps its listener; a port that must stay closed comes from `support/ports.rs`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use revoy::config::cluster::compile_cluster;
use revoy::config::tcp_proxy::compile_tcp_proxy;
use revoy::stats::Store;
use revoy::tcp::TcpProxy;
use revoy::upstream::{ClusterManager, LbContext, UpstreamBody, UpstreamError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/ports.rs"]
mod ports;
use ports::free_port;

const LIMIT: Duration = Duration::from_secs(10);

fn decode<T: prost::Message + prost::Name + Default>(yaml: &str) -> T {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
    proto::Codec::new()
        .decode::<T>(value, false)
        .unwrap()
        .message
}

fn manager(yaml: &str) -> (ClusterManager, Store) {
    let store = Store::new();
    let cm = ClusterManager::new(store.clone(), Default::default());
    cm.update(vec![
        compile_cluster(
            &revoy::config::Context::new(&revoy::config::SystemIo),
            &decode(yaml),
            revoy::config::cluster::SourceAddresses::NONE,
        )
        .unwrap(),
    ]);
    (cm, store)
}

fn static_cluster(name: &str, extra: &str, addr: SocketAddr) -> String {
    format!(
        "name: {name}\n{extra}\nload_assignment:\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {{address: {{socket_address: {{address: \"{}\", port_value: {}}}}}}}\n",
        addr.ip(),
        addr.port()
    )
}

/// An HTTP server (h1 and h2c) answering with the request's version, path and peer address;
/// counts accepted connections.
async fn http_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| async move {
                    let body = format!("{:?} {} {}", req.version(), req.uri().path(), peer.ip());
                    Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                        bytes::Bytes::from(body),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, accepted)
}

fn get(path: &str) -> Request<revoy::body::Body> {
    Request::get(path)
        .header("host", "test")
        .body(revoy::body::empty())
        .unwrap()
}

async fn body_text(resp: Response<UpstreamBody>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn http1_pool_reuses_one_connection() {
    let (addr, accepted) = http_server().await;
    let (cm, store) = manager(&static_cluster("web", "", addr));
    let cluster = cm.get("web").unwrap();
    let host = cluster.host_set().hosts()[0].clone();
    for i in 0..3 {
        let resp = tokio::time::timeout(
            LIMIT,
            cluster.request(get(&format!("/r{i}")), &LbContext::default()),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(body_text(resp).await, format!("HTTP/1.1 /r{i} 127.0.0.1"));
        // The connection returns to the pool once the response is fully read.
        tokio::time::timeout(LIMIT, async {
            while host.idle_http1_connections() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(store.counter("cluster.web.upstream_cx_total").value(), 1);
    assert_eq!(store.counter("cluster.web.upstream_rq_total").value(), 3);
    assert_eq!(store.counter("cluster.web.upstream_rq_200").value(), 3);
    assert_eq!(store.counter("cluster.web.upstream_rq_2xx").value(), 3);
    assert_eq!(store.gauge("cluster.web.upstream_cx_active").value(), 1);
    assert!(
        cm.render_text()
            .contains(&format!("web::{addr}::rq_success::3\n"))
    );
}

#[tokio::test]
async fn http2_upstream_multiplexes_on_one_connection() {
    let (addr, accepted) = http_server().await;
    let extra = r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http2_protocol_options: {}}"#;
    let (cm, store) = manager(&static_cluster("grpc", extra, addr));
    let cluster = cm.get("grpc").unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let resp = cluster
                    .request(get(&format!("/s{i}")), &LbContext::default())
                    .await
                    .unwrap();
                body_text(resp).await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let body = tokio::time::timeout(LIMIT, t).await.unwrap().unwrap();
        assert_eq!(body, format!("HTTP/2.0 /s{i} 127.0.0.1"));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        store
            .counter("cluster.grpc.upstream_cx_http2_total")
            .value(),
        1
    );
}

#[tokio::test]
async fn refused_connection_gives_envoys_reset_text() {
    let closed = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (cm, store) = manager(&static_cluster("closed", "", closed));
    let err = cm
        .get("closed")
        .unwrap()
        .request(get("/"), &LbContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, UpstreamError::ConnectFailure { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.local_reply_body(),
        "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
    );
    assert_eq!(
        store
            .counter("cluster.closed.upstream_cx_connect_fail")
            .value(),
        1
    );
    // Real Envoy 1.40's /clusters for the same cluster after the same request.
    let envoy = "closed::observability_name::closed
closed::default_priority::max_connections::1024
closed::default_priority::max_pending_requests::1024
closed::default_priority::max_requests::1024
closed::default_priority::max_retries::3
closed::high_priority::max_connections::1024
closed::high_priority::max_pending_requests::1024
closed::high_priority::max_requests::1024
closed::high_priority::max_retries::3
closed::added_via_api::false
closed::ADDR::cx_active::0
closed::ADDR::cx_connect_fail::1
closed::ADDR::cx_total::1
closed::ADDR::rq_active::0
closed::ADDR::rq_error::1
closed::ADDR::rq_pending_active::0
closed::ADDR::rq_success::0
closed::ADDR::rq_timeout::0
closed::ADDR::rq_total::0
closed::ADDR::hostname::
closed::ADDR::health_flags::healthy
closed::ADDR::weight::1
closed::ADDR::region::
closed::ADDR::zone::
closed::ADDR::sub_zone::
closed::ADDR::canary::false
closed::ADDR::priority::0
closed::ADDR::success_rate::-1
closed::ADDR::local_origin_success_rate::-1
";
    assert_eq!(cm.render_text(), envoy.replace("ADDR", &closed.to_string()));
    let json = cm.render_json();
    let host = &json["cluster_statuses"][0]["host_statuses"][0];
    assert_eq!(
        host["stats"][0],
        serde_json::json!({"value": "1", "name": "cx_connect_fail"})
    );
    assert_eq!(host["stats"][3], serde_json::json!({"name": "rq_success"}));
    assert_eq!(
        host["stats"][6],
        serde_json::json!({"type": "GAUGE", "name": "cx_active"})
    );
    assert_eq!(host["health_status"]["eds_health_status"], "HEALTHY");
    assert_eq!(host["locality"], serde_json::json!({}));
}

#[tokio::test]
async fn empty_cluster_has_no_healthy_upstream() {
    let (cm, _) = manager("name: empty\n");
    let err = cm
        .get("empty")
        .unwrap()
        .request(get("/"), &LbContext::default())
        .await
        .unwrap_err();
    assert_eq!(err.local_reply_body(), "no healthy upstream");
}

#[tokio::test]
async fn strict_dns_cluster_resolves_localhost() {
    let (addr, _) = http_server().await;
    let yaml = format!(
        "name: dns\ntype: STRICT_DNS\ndns_lookup_family: V4_ONLY\nload_assignment:\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {{address: {{socket_address: {{address: localhost, port_value: {}}}}}}}\n",
        addr.port()
    );
    let (cm, store) = manager(&yaml);
    tokio::time::timeout(LIMIT, cm.wait_initialized())
        .await
        .unwrap();
    let cluster = cm.get("dns").unwrap();
    let hosts = cluster.host_set();
    assert_eq!(hosts.hosts()[0].addr, addr);
    assert_eq!(hosts.hosts()[0].hostname, "localhost");
    assert_eq!(store.gauge("cluster.dns.membership_total").value(), 1);
    let resp = cluster
        .request(get("/d"), &LbContext::default())
        .await
        .unwrap();
    assert_eq!(body_text(resp).await, "HTTP/1.1 /d 127.0.0.1");
}

#[tokio::test]
async fn original_dst_and_source_address() {
    let (addr, _) = http_server().await;
    let yaml = "name: passthrough\ntype: ORIGINAL_DST\nlb_policy: CLUSTER_PROVIDED\nupstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}}\n";
    let (cm, _) = manager(yaml);
    let cluster = cm.get("passthrough").unwrap();
    let none = cluster
        .request(get("/"), &LbContext::default())
        .await
        .unwrap_err();
    assert!(matches!(none, UpstreamError::NoHealthyUpstream));
    let ctx = LbContext {
        original_dst: Some(addr),
        ..Default::default()
    };
    let resp = cluster.request(get("/o"), &ctx).await.unwrap();
    assert_eq!(body_text(resp).await, "HTTP/1.1 /o 127.0.0.6");
}

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// A listener whose connections are served by `proxy`; returns its address.
async fn tcp_front(proxy: TcpProxy, cm: ClusterManager) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = Arc::new(proxy);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (proxy, cm) = (proxy.clone(), cm.clone());
            tokio::spawn(async move {
                proxy
                    .serve(s, &cm, LbContext::default(), None, None, None)
                    .await
            });
        }
    });
    addr
}

#[tokio::test]
async fn tcp_proxy_echoes_and_passes_half_close() {
    let echo = echo_server().await;
    let (cm, store) = manager(&static_cluster("echo", "", echo));
    let cfg = compile_tcp_proxy(
        &revoy::config::Context::new(&revoy::config::context::FakeIo::new()),
        &decode("stat_prefix: t\ncluster: echo\n"),
        &mut revoy::config::Warnings::new(),
    )
    .unwrap();
    let front = tcp_front(TcpProxy::new(cfg, &store), cm).await;
    let mut client = TcpStream::connect(front).await.unwrap();
    client.write_all(b"hello").await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(LIMIT, client.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"hello");
    assert_eq!(store.counter("tcp.t.downstream_cx_total").value(), 1);
    assert_eq!(
        store.counter("tcp.t.downstream_cx_rx_bytes_total").value(),
        5
    );
}

#[tokio::test]
async fn tcp_proxy_idle_timeout_closes_both_sides() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let upstream_side = tokio::spawn(async move {
        let (mut s, _) = silent.accept().await.unwrap();
        let mut buf = [0u8; 1];
        s.read(&mut buf).await.unwrap()
    });
    let (cm, store) = manager(&static_cluster("silent", "", silent_addr));
    let cfg = compile_tcp_proxy(
        &revoy::config::Context::new(&revoy::config::context::FakeIo::new()),
        &decode("stat_prefix: idle\ncluster: silent\nidle_timeout: 0.2s\n"),
        &mut revoy::config::Warnings::new(),
    )
    .unwrap();
    let front = tcp_front(TcpProxy::new(cfg, &store), cm).await;
    let mut client = TcpStream::connect(front).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(LIMIT, client.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "downstream closed");
    let n = tokio::time::timeout(LIMIT, upstream_side)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "upstream closed");
    assert_eq!(store.counter("tcp.idle.idle_timeout").value(), 1);
}

#[tokio::test]
async fn tcp_proxy_unknown_cluster_counts_no_route() {
    let store = Store::new();
    let cm = ClusterManager::new(store.clone(), Default::default());
    let cfg = compile_tcp_proxy(
        &revoy::config::Context::new(&revoy::config::context::FakeIo::new()),
        &decode("stat_prefix: nr\ncluster: missing\n"),
        &mut revoy::config::Warnings::new(),
    )
    .unwrap();
    let front = tcp_front(TcpProxy::new(cfg, &store), cm).await;
    let mut client = TcpStream::connect(front).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(LIMIT, client.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0);
    assert_eq!(store.counter("tcp.nr.downstream_cx_no_route").value(), 1);
}

#[tokio::test]
async fn unchanged_cluster_keeps_state_across_updates() {
    let (addr, _) = http_server().await;
    let yaml = static_cluster("keep", "", addr);
    let (cm, _) = manager(&yaml);
    let before = cm.get("keep").unwrap();
    cm.update(vec![
        compile_cluster(
            &revoy::config::Context::new(&revoy::config::SystemIo),
            &decode(&yaml),
            revoy::config::cluster::SourceAddresses::NONE,
        )
        .unwrap(),
    ]);
    assert!(Arc::ptr_eq(&before, &cm.get("keep").unwrap()));
    cm.update(vec![
        compile_cluster(
            &revoy::config::Context::new(&revoy::config::SystemIo),
            &decode(&format!("{yaml}connect_timeout: 1s\n")),
            revoy::config::cluster::SourceAddresses::NONE,
        )
        .unwrap(),
    ]);
    assert!(!Arc::ptr_eq(&before, &cm.get("keep").unwrap()));
    cm.update(Vec::new());
    assert!(cm.get("keep").is_none());
}

#[tokio::test]
async fn logical_dns_cluster_is_one_host() {
    let (addr, _) = http_server().await;
    let yaml = format!(
        "name: logical\ntype: LOGICAL_DNS\ndns_lookup_family: V4_ONLY\nload_assignment:\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {{address: {{socket_address: {{address: localhost, port_value: {}}}}}}}\n",
        addr.port()
    );
    let (cm, _) = manager(&yaml);
    tokio::time::timeout(LIMIT, cm.wait_initialized())
        .await
        .unwrap();
    let cluster = cm.get("logical").unwrap();
    assert_eq!(cluster.host_set().hosts().len(), 1);
    let resp = cluster
        .request(get("/l"), &LbContext::default())
        .await
        .unwrap();
    assert_eq!(body_text(resp).await, "HTTP/1.1 /l 127.0.0.1");
}

#[tokio::test]
async fn use_downstream_protocol_follows_the_downstream() {
    let (addr, _) = http_server().await;
    let extra = r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    use_downstream_protocol_config: {}"#;
    let (cm, _) = manager(&static_cluster("follow", extra, addr));
    let cluster = cm.get("follow").unwrap();
    let h2 = LbContext {
        downstream_h2: true,
        ..Default::default()
    };
    let resp = cluster.request(get("/a"), &h2).await.unwrap();
    assert_eq!(body_text(resp).await, "HTTP/2.0 /a 127.0.0.1");
    let resp = cluster
        .request(get("/b"), &LbContext::default())
        .await
        .unwrap();
    assert_eq!(body_text(resp).await, "HTTP/1.1 /b 127.0.0.1");
}
