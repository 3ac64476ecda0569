//! One differential request case, built in one line:
//! `Case::get("name", "/path").host("a.test").header("x", "1").h2()`.
//!
//! Strings may hold template placeholders (`{{listener_0}}`, `{{upstream_a}}`), rendered per side.

use std::net::IpAddr;
use std::time::Duration;

/// Downstream protocol of an HTTP case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1 over plain TCP.
    H1,
    /// HTTP/2 with prior knowledge (h2c).
    H2,
}

/// The pause between the pieces of a [`Case::trickled`] request.
pub const TRICKLE: Duration = Duration::from_millis(100);

/// What the case sends.
#[derive(Clone, Debug)]
pub enum Kind {
    /// An HTTP request (`proto` decides the version).
    Http,
    /// A gRPC unary call over h2c carrying `message`.
    Grpc(String),
    /// A WebSocket upgrade, then one text frame carrying `message`.
    WebSocket(String),
    /// A TCP connection that sends one line and reads one line.
    Tcp(String),
    /// Raw bytes written to the connection, in pieces [`TRICKLE`] apart; the response is
    /// parsed as HTTP/1.x.
    Raw(Vec<Vec<u8>>),
    /// Raw bytes holding several HTTP/1.x requests written at once; every response is read
    /// until the connection closes or goes quiet.
    Conversation(Vec<u8>),
}

/// A load-balancing property observed over several requests, for policies whose host choice
/// cannot be compared request by request.
#[derive(Clone, Debug)]
pub enum Balance {
    /// `keys` distinct keys, each sent `repeat` times: observes whether every key stayed on
    /// one host and whether the keys reached more than one host (hashing policies).
    Sticky {
        key: StickyKey,
        keys: usize,
        repeat: usize,
    },
    /// One request held open for `hold_ms` (the upstream delays its answer) while `n` more are
    /// sent one after another: observes whether all of them avoided the held request's host.
    AvoidBusy { n: usize, hold_ms: u64 },
    /// `n` requests: observes the hosts reached and whether they came in strict rotation.
    Order { n: usize },
}

/// Where a [`Balance::Sticky`] case puts its key (`key-<n>`), for the route's hash policy.
#[derive(Clone, Debug)]
pub enum StickyKey {
    /// In this header.
    Header(String),
    /// In a cookie of this name.
    Cookie(String),
    /// In a query parameter of this name.
    Query(String),
    /// In the client's source address (`127.0.0.<n + 2>`).
    SourceIp,
}

/// A request sent identically to Envoy and to revoy.
#[derive(Clone, Debug)]
pub struct Case {
    /// Unique name within its config, shown in mismatch reports.
    pub name: &'static str,
    /// Index `N` of the `{{listener_N}}` placeholder the request goes to.
    pub listener: usize,
    /// Send to the admin port instead of a listener.
    pub admin: bool,
    /// What is sent.
    pub kind: Kind,
    /// HTTP method.
    pub method: String,
    /// Request target (path and query).
    pub path: String,
    /// Host header (HTTP/1.1) or authority (HTTP/2); `None` sends none.
    pub host: Option<String>,
    /// Extra request headers, in order.
    pub headers: Vec<(String, String)>,
    /// Request body.
    pub body: String,
    /// Downstream protocol.
    pub proto: Proto,
    /// Client source address (any 127.0.0.0/8 address), default 127.0.0.1.
    pub source: Option<IpAddr>,
    /// Connect to the listener over IPv6 loopback (`[::1]`) instead of 127.0.0.1.
    pub ipv6: bool,
    /// Speak TLS first: `Some(Some(sni))` with that SNI, `Some(None)` without SNI.
    pub tls: Option<Option<String>>,
    /// Send the request this many times and observe the set of upstreams reached.
    pub repeat: usize,
    /// Send the request this many times on one connection and observe the last answer.
    pub same_connection: usize,
    /// With `repeat`: observe how many requests each upstream answered.
    pub count: bool,
    /// TCP: after the reply, wait this long and observe whether the proxy closed the connection.
    pub watch_close: Option<Duration>,
    /// Observe a load-balancing property instead of one response.
    pub balance: Option<Balance>,
    /// Fields Envoy must show with these values (guards that the case tests what it says);
    /// revoy is then held to the same values by the comparison.
    pub expect: Vec<(String, String)>,
    /// Fields left out of the comparison (e.g. a body that revoy deliberately extends).
    pub ignore: Vec<String>,
    /// Known gaps (DIFFERENCES.md, README's "Known differences"): `(field, value)`s revoy shows
    /// instead of Envoy's; the field is held to that value and left out of the comparison,
    /// every other field is compared.
    pub known: Vec<(String, String)>,
    /// Compare whether the upstream connection was reused (left out by default, since it
    /// depends on every earlier case of the config).
    pub pooling: bool,
    /// Send on this named connection, opened by the first case that names it and kept open
    /// for later ones (`differential/held.rs`).
    pub held: Option<&'static str>,
    /// Wait this long before sending: only for what Envoy does on a timer (its stats flush
    /// updates `server.state`; a graceful drain stops listeners after `--drain-time-s`).
    pub pause: Option<Duration>,
}

impl Case {
    fn new(name: &'static str, kind: Kind, method: &str, path: &str) -> Case {
        Case {
            name,
            listener: 0,
            admin: false,
            kind,
            method: method.to_string(),
            path: path.to_string(),
            host: Some("example.com".to_string()),
            headers: Vec::new(),
            body: String::new(),
            proto: Proto::H1,
            source: None,
            ipv6: false,
            tls: None,
            repeat: 1,
            same_connection: 1,
            count: false,
            watch_close: None,
            balance: None,
            expect: Vec::new(),
            ignore: Vec::new(),
            known: Vec::new(),
            pooling: false,
            held: None,
            pause: None,
        }
    }

    /// An HTTP GET of `path` with `Host: example.com`.
    pub fn get(name: &'static str, path: &str) -> Case {
        Case::new(name, Kind::Http, "GET", path)
    }

    /// An HTTP request with a method and a body.
    pub fn send(name: &'static str, method: &str, path: &str, body: &str) -> Case {
        Case {
            body: body.to_string(),
            ..Case::new(name, Kind::Http, method, path)
        }
    }

    /// An HTTP/1.1 request to the admin port.
    pub fn admin(name: &'static str, method: &str, path: &str) -> Case {
        Case {
            admin: true,
            host: Some("127.0.0.1".to_string()),
            ..Case::new(name, Kind::Http, method, path)
        }
    }

    /// A gRPC unary call to `path` (e.g. `/echo.Echo/Say`) carrying `message`.
    pub fn grpc(name: &'static str, path: &str, message: &str) -> Case {
        Case {
            proto: Proto::H2,
            ..Case::new(name, Kind::Grpc(message.to_string()), "POST", path)
        }
    }

    /// A WebSocket upgrade of `path`, then `message` echoed.
    pub fn websocket(name: &'static str, path: &str, message: &str) -> Case {
        Case::new(name, Kind::WebSocket(message.to_string()), "GET", path)
    }

    /// A TCP connection sending `line`.
    pub fn tcp(name: &'static str, line: &str) -> Case {
        Case::new(name, Kind::Tcp(line.to_string()), "", "")
    }

    /// Raw bytes on an HTTP listener.
    pub fn raw(name: &'static str, bytes: &[u8]) -> Case {
        Case::trickled(name, &[bytes])
    }

    /// Raw bytes on an HTTP listener, written in `pieces` [`TRICKLE`] apart (a request line
    /// cut short, as a slow client or a busy machine delivers it).
    pub fn trickled(name: &'static str, pieces: &[&[u8]]) -> Case {
        let pieces = pieces.iter().map(|p| p.to_vec()).collect();
        Case::new(name, Kind::Raw(pieces), "", "")
    }

    /// Several raw requests sent at once on one connection (pipelined).
    pub fn conversation(name: &'static str, bytes: &[u8]) -> Case {
        Case::new(name, Kind::Conversation(bytes.to_vec()), "", "")
    }

    /// Sets the Host header / authority.
    pub fn host(self, host: &str) -> Case {
        Case {
            host: Some(host.to_string()),
            ..self
        }
    }

    /// Sends no Host header.
    pub fn no_host(self) -> Case {
        Case { host: None, ..self }
    }

    /// Adds a request header.
    pub fn header(mut self, name: &str, value: &str) -> Case {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Uses HTTP/2 prior knowledge downstream.
    pub fn h2(self) -> Case {
        Case {
            proto: Proto::H2,
            ..self
        }
    }

    /// Sends to `{{listener_N}}`.
    pub fn listener(self, listener: usize) -> Case {
        Case { listener, ..self }
    }

    /// Connects from this loopback source address.
    pub fn from(self, source: &str) -> Case {
        Case {
            source: Some(source.parse().expect("source address")),
            ..self
        }
    }

    /// Sends the request `n` times on one connection (keep-alive / h2 reuse).
    pub fn same_connection(self, n: usize) -> Case {
        Case {
            same_connection: n,
            ..self
        }
    }

    /// Speaks TLS with this SNI (`None`: no SNI) before HTTP; ALPN follows the HTTP version.
    pub fn tls(self, sni: Option<&str>) -> Case {
        Case {
            tls: Some(sni.map(str::to_string)),
            ..self
        }
    }

    /// Connects to `[::1]` instead of 127.0.0.1.
    pub fn ipv6(self) -> Case {
        Case { ipv6: true, ..self }
    }

    /// Repeats the request `n` times, observing the set of upstreams reached.
    pub fn spread(self, n: usize) -> Case {
        Case { repeat: n, ..self }
    }

    /// Repeats the request `n` times, observing how many each upstream answered.
    pub fn spread_counts(self, n: usize) -> Case {
        Case {
            repeat: n,
            count: true,
            ..self
        }
    }

    /// TCP: after the reply, waits up to `ms` for the proxy to close the connection.
    pub fn watch_close(self, ms: u64) -> Case {
        Case {
            watch_close: Some(Duration::from_millis(ms)),
            ..self
        }
    }

    /// Sends `keys` distinct keys, each `repeat` times ([`Balance::Sticky`]).
    pub fn sticky(self, key: StickyKey, keys: usize, repeat: usize) -> Case {
        Case {
            balance: Some(Balance::Sticky { key, keys, repeat }),
            ..self
        }
    }

    /// Holds one request open for `hold_ms` while `n` more are sent ([`Balance::AvoidBusy`]).
    pub fn avoid_busy(self, n: usize, hold_ms: u64) -> Case {
        Case {
            balance: Some(Balance::AvoidBusy { n, hold_ms }),
            ..self
        }
    }

    /// Sends `n` requests, observing the hosts and their order ([`Balance::Order`]).
    pub fn order(self, n: usize) -> Case {
        Case {
            balance: Some(Balance::Order { n }),
            ..self
        }
    }

    /// Sends to the admin port instead of a listener.
    pub fn at_admin(self) -> Case {
        Case {
            admin: true,
            ..self
        }
    }

    /// Compares whether the upstream connection was reused for the (last) request.
    pub fn pooling(self) -> Case {
        Case {
            pooling: true,
            ..self
        }
    }

    /// Sends on the connection `name`, kept open across cases (opened by its first case).
    pub fn held(self, name: &'static str) -> Case {
        Case {
            held: Some(name),
            ..self
        }
    }

    /// Waits `ms` before sending (see [`Case::pause`]).
    pub fn after_ms(self, ms: u64) -> Case {
        Case {
            pause: Some(Duration::from_millis(ms)),
            ..self
        }
    }

    /// Leaves `field` out of the comparison.
    pub fn ignore(mut self, field: &str) -> Case {
        self.ignore.push(field.to_string());
        self
    }

    /// Marks a known gap (DIFFERENCES.md): revoy shows `field` with `value` where Envoy
    /// differs; the rest of the case is still compared.
    pub fn known_gap(mut self, field: &str, value: &str) -> Case {
        self.known.push((field.to_string(), value.to_string()));
        self
    }

    /// Asserts Envoy shows `field` with `value` (and so, through the comparison, revoy).
    pub fn expect(mut self, field: &str, value: &str) -> Case {
        self.expect.push((field.to_string(), value.to_string()));
        self
    }
}
