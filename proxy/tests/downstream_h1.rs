//! The HTTP/1.1 fast path against a running revoy and a scripted raw upstream: a client that
//! goes away cancels its exchange, whether it leaves before the response head or while the
//! body streams, and the upstream connection is closed instead of being read to its end.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

#[path = "support/child.rs"]
mod child;
#[path = "support/ports.rs"]
mod ports;
use child::Revoy;
use ports::free_port;

/// How long the upstream waits to see its connection closed before the test fails.
const LIMIT: Duration = Duration::from_secs(5);

/// revoy with one listener routing everything to `upstream`; returns it and the listener port.
fn start(upstream: u16) -> (Revoy, u16) {
    let (admin, listener) = (free_port(), free_port());
    let yaml = format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: l
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: up}}}}]}}]
  clusters:
  - name: up
    connect_timeout: 1s
    load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}
"#
    );
    let revoy = Revoy::start(&yaml, || {
        TcpStream::connect(("127.0.0.1", listener)).is_ok()
    });
    (revoy, listener)
}

/// An upstream that reads one request head, reports it, writes `reply`, then reports whether
/// the proxy closed the connection (end of stream) within [`LIMIT`].
struct Upstream {
    port: u16,
    asked: mpsc::Receiver<()>,
    closed: mpsc::Receiver<bool>,
}

fn upstream(reply: &'static [u8]) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (asked_tx, asked) = mpsc::channel();
    let (closed_tx, closed) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let _ = asked_tx.send(());
        conn.write_all(reply).unwrap();
        conn.set_read_timeout(Some(LIMIT)).unwrap();
        let closed = loop {
            match conn.read(&mut byte) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(_) => break false,
            }
        };
        let _ = closed_tx.send(closed);
    });
    Upstream {
        port,
        asked,
        closed,
    }
}

/// A client connection that has sent a GET.
fn get(port: u16) -> TcpStream {
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    client
}

/// Reads the response until `until` shows up in it.
fn read_until(mut client: &TcpStream, until: &[u8]) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(until.len()).any(|w| w == until) {
        let n = client.read(&mut buf).expect("response bytes");
        assert!(
            n > 0,
            "revoy closed before {:?}",
            String::from_utf8_lossy(until)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn a_client_leaving_while_the_body_streams_closes_the_upstream_connection() {
    let up = upstream(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n");
    let (_revoy, port) = start(up.port);
    let client = get(port);
    read_until(&client, b"first");
    drop(client);
    assert!(
        up.closed.recv_timeout(LIMIT * 2).unwrap(),
        "the upstream connection stayed open after the client left mid-body"
    );
}

#[test]
fn a_client_leaving_before_the_response_head_closes_the_upstream_connection() {
    let up = upstream(b"");
    let (_revoy, port) = start(up.port);
    let client = get(port);
    up.asked
        .recv_timeout(LIMIT)
        .expect("the request reached the upstream");
    drop(client);
    assert!(
        up.closed.recv_timeout(LIMIT * 2).unwrap(),
        "the upstream connection stayed open after the client left before the head"
    );
}
