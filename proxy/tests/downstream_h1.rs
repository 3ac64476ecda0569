//! The HTTP/1.1 fast path against a running revoy and a scripted raw upstream: a client that
//! goes away cancels its exchange, whether it leaves before the response head or while the
//! body streams, and the upstream connection is closed instead of being read to its end; a
//! request body that arrives after its head streams upstream, and an answer given before it
//! has all arrived closes the connection as Envoy's does.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/ports.rs"]
mod ports;
use child::Proxy;
use ports::free_port;

/// How long the upstream waits to see its connection closed before the test fails.
const LIMIT: Duration = Duration::from_secs(5);

/// revoy with one listener routing everything to `upstream`; returns it and the listener port.
fn start(upstream: u16) -> (Proxy, u16) {
    start_with(upstream, "")
}

/// [`start`] with `hcm` added to the connection manager's settings (lines of YAML).
fn start_with(upstream: u16, hcm: &str) -> (Proxy, u16) {
    let (admin, listener) = (free_port(), free_port());
    let yaml = format!(
        "{}static_resources:\n  listeners:{}\n  clusters:{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener(
            "l",
            listener,
            hcm,
            "",
            "[{match: {prefix: /}, route: {cluster: up}}]"
        ),
        bootstrap::cluster("up", upstream, ""),
    );
    let revoy = Proxy::start(&yaml, || {
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

/// An upstream that answers each request on its connection after reading its whole
/// `content-length` body, echoing the request line and body; reports each request line.
fn echo_upstream() -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                match conn.read(&mut buf) {
                    Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
                    _ => return,
                }
                continue;
            };
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.parse().unwrap());
            while pending.len() < end + 4 + length {
                match conn.read(&mut buf) {
                    Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
                    _ => return,
                }
            }
            let body: Vec<u8> = pending.drain(..end + 4 + length).skip(end + 4).collect();
            let line = head.lines().next().unwrap().to_string();
            let reply = format!("{line} {}", String::from_utf8_lossy(&body));
            let _ = tx.send(line);
            let out = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{reply}",
                reply.len()
            );
            conn.write_all(out.as_bytes()).unwrap();
        }
    });
    (port, rx)
}

/// Reads one response with a `content-length` body; returns its head and body.
fn read_response(mut client: &TcpStream) -> (String, String) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        assert_eq!(
            client.read(&mut buf).expect("response bytes"),
            1,
            "revoy closed"
        );
        seen.push(buf[0]);
    }
    let head = String::from_utf8(seen).unwrap().to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    client.read_exact(&mut body).unwrap();
    (head, String::from_utf8(body).unwrap())
}

/// Whether revoy closed `client` (end of stream or reset) without sending anything more.
fn closed_quietly(mut client: &TcpStream) -> bool {
    let mut buf = [0u8; 256];
    match client.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn a_body_arriving_after_its_head_streams_upstream_and_the_next_request_follows() {
    let (up, lines) = echo_upstream();
    let (_revoy, port) = start(up);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello")
        .unwrap();
    assert_eq!(
        lines.recv_timeout(Duration::from_millis(300)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "the upstream has half the body and waits"
    );
    client
        .write_all(b"worldGET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&client);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    assert_eq!(body, "POST /upload HTTP/1.1 helloworld");
    let (_, body) = read_response(&client);
    assert_eq!(body, "GET /next HTTP/1.1 ");
}

#[test]
fn an_answer_before_the_body_has_arrived_closes_the_connection_as_envoys_does() {
    let up = upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly");
    let (_revoy, port) = start(up.port);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    client
        .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
        .unwrap();
    let (head, body) = read_response(&client);
    assert_eq!(body, "early");
    // Envoy 1.40: `connection: close`, and no upstream service time for a request that was not
    // complete when the response head came.
    assert!(head.contains("connection: close"), "{head}");
    assert!(!head.contains("x-envoy-upstream-service-time"), "{head}");
    // The rest of the body, shaped like a request, is never served as one.
    let _ = client.write_all(b"ABCDEFGHIJGET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        closed_quietly(&client),
        "revoy answered after the early response"
    );
    assert!(
        up.closed.recv_timeout(LIMIT * 2).unwrap(),
        "the upstream connection carrying the unfinished request stayed open"
    );
}

#[test]
fn an_upgrade_carrying_a_body_keeps_its_upgrade_answer() {
    let up = upstream(
        b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    );
    let (_revoy, port) = start_with(up.port, "upgrade_configs: [{upgrade_type: websocket}]");
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    client
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\
              Content-Length: 2\r\n\r\nhi",
        )
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(client.read(&mut byte).unwrap(), 1, "revoy closed");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
}
