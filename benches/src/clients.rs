//! Load generators: wrk (HTTP/1.1, plaintext or over TLS, closed loop), h2load (HTTP/2, and
//! paced HTTP/1.1 or h2 for latency), a TCP bulk reader, and the bench's own TLS client (a new
//! connection per request with a full handshake each, and idle TLS connections).

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{ClientConnection, HandshakeKind, StreamOwned};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use crate::stats::quantile;
use crate::tls::TlsClient;

/// `n` HTTP/1.1 keep-alive connections to `port`, each left open and idle after one `GET /`
/// answered (one connection at a time, so no request is in flight while the next opens).
pub fn idle_connections(port: u16, n: usize) -> Result<Vec<TcpStream>, String> {
    let mut conns = Vec::with_capacity(n);
    let mut buf = [0u8; 4096];
    for _ in 0..n {
        let mut c = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        c.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let got = c
            .read(&mut buf)
            .map_err(|e| format!("idle connection: {e}"))?;
        if !buf[..got].starts_with(b"HTTP/1.1 200") {
            return Err(format!(
                "idle connection: unexpected answer {:?}",
                String::from_utf8_lossy(&buf[..got.min(40)])
            ));
        }
        conns.push(c);
    }
    Ok(conns)
}

/// What a closed-loop run achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Throughput {
    /// Completed requests (for TCP: bytes).
    pub count: u64,
    /// Wall time of the measurement, seconds.
    pub seconds: f64,
    /// Failed requests: socket errors, non-2xx/3xx, h2load failures.
    pub errors: u64,
}

impl Throughput {
    /// Completed units per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.count as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Latency percentiles of a paced run, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Number of samples.
    pub samples: usize,
}

fn run(program: &str, args: &[String]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!(
            "{program} {}: {}\n{stdout}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(stdout)
}

/// Runs wrk with one thread, `connections` keep-alive connections for `seconds`.
pub fn wrk(
    url: &str,
    connections: u32,
    seconds: u32,
    headers: &[&str],
    script: Option<&Path>,
) -> Result<Throughput, String> {
    let mut args = vec![
        "-t1".to_string(),
        format!("-c{connections}"),
        format!("-d{seconds}s"),
    ];
    for header in headers {
        args.extend(["-H".to_string(), header.to_string()]);
    }
    if let Some(script) = script {
        args.extend(["-s".to_string(), script.to_string_lossy().into_owned()]);
    }
    args.push(url.to_string());
    counted("wrk", url, &run("wrk", &args)?, parse_wrk)
}

/// `parse`'s reading of a load client's `summary`, which is also printed on stderr when the
/// client counted errors, so a run's log says what they were (socket errors, status codes).
fn counted(
    program: &str,
    url: &str,
    summary: &str,
    parse: fn(&str) -> Result<Throughput, String>,
) -> Result<Throughput, String> {
    let result = parse(summary)?;
    if result.errors > 0 {
        eprintln!("{program} {url}: {} errors:\n{summary}", result.errors);
    }
    Ok(result)
}

/// Parses wrk's summary.
pub fn parse_wrk(text: &str) -> Result<Throughput, String> {
    let mut result = Throughput::default();
    let mut seen = false;
    for line in text.lines().map(str::trim) {
        if let Some((count, rest)) = line.split_once(" requests in ") {
            result.count = count
                .trim()
                .parse()
                .map_err(|_| format!("wrk count in {line:?}"))?;
            let secs = rest.split(',').next().unwrap_or_default();
            result.seconds =
                parse_duration(secs).ok_or_else(|| format!("wrk duration in {line:?}"))?;
            seen = true;
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            result.errors += rest
                .split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        } else if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            result.errors += rest.trim().parse::<u64>().unwrap_or(0);
        }
    }
    if seen {
        Ok(result)
    } else {
        Err(format!("no wrk summary in:\n{text}"))
    }
}

fn parse_duration(text: &str) -> Option<f64> {
    let text = text.trim();
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|v| v / 1000.0);
    }
    if let Some(m) = text.strip_suffix('m') {
        return m.parse::<f64>().ok().map(|v| v * 60.0);
    }
    text.strip_suffix('s')?.parse().ok()
}

/// Runs h2load closed-loop for `seconds`: `clients` connections with `streams` concurrent
/// streams each. `extra` are further h2load arguments (headers, data file).
pub fn h2load(
    url: &str,
    clients: u32,
    streams: u32,
    seconds: u32,
    extra: &[String],
) -> Result<Throughput, String> {
    let mut args = vec![
        "-t1".to_string(),
        format!("-c{clients}"),
        format!("-m{streams}"),
        // No --warm-up-time: the caller's CPU reading spans the whole run, so every request
        // must be counted (the contender is already warm from its earlier runs).
        format!("-D{seconds}"),
    ];
    args.extend_from_slice(extra);
    args.push(url.to_string());
    counted("h2load", url, &run("h2load", &args)?, parse_h2load)
}

/// Parses h2load's summary.
pub fn parse_h2load(text: &str) -> Result<Throughput, String> {
    let mut rate = None;
    let mut result = Throughput::default();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in ") {
            rate = rest
                .split(", ")
                .nth(1)
                .and_then(|r| r.strip_suffix(" req/s"))
                .and_then(|r| r.parse::<f64>().ok());
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            result.errors += count_of(rest, "failed");
        } else if let Some(rest) = line.strip_prefix("status codes: ") {
            result.count = count_of(rest, "2xx") + count_of(rest, "3xx");
            result.errors += count_of(rest, "4xx") + count_of(rest, "5xx");
        }
    }
    let rate = rate.ok_or_else(|| format!("no h2load summary in:\n{text}"))?;
    result.seconds = if rate > 0.0 {
        result.count as f64 / rate
    } else {
        0.0
    };
    Ok(result)
}

/// The number before `what` in a ", "-separated h2load list ("10 2xx, 0 3xx").
fn count_of(list: &str, what: &str) -> u64 {
    list.split(", ")
        .find_map(|part| {
            let (n, name) = part.trim().split_once(' ')?;
            (name == what).then(|| n.parse().ok()).flatten()
        })
        .unwrap_or(0)
}

/// Paced (open-loop) run: `clients` connections each sending `rps_per_client` requests per
/// second for `seconds`; latency from h2load's per-request log. `h1` selects HTTP/1.1;
/// `extra` are further h2load arguments (a data file to POST).
pub fn paced_latency(
    url: &str,
    h1: bool,
    clients: u32,
    rps_per_client: u32,
    seconds: u32,
    log: &Path,
    extra: &[String],
) -> Result<Latency, String> {
    let mut args = vec![
        "-t1".to_string(),
        format!("-c{clients}"),
        format!("--rps={rps_per_client}"),
        format!("-D{seconds}"),
    ];
    if h1 {
        args.push("--h1".into());
    }
    args.push(format!("--log-file={}", log.display()));
    args.extend_from_slice(extra);
    args.push(url.to_string());
    let summary = parse_h2load(&run("h2load", &args)?)?;
    let text = fs::read_to_string(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut micros = parse_latency_log(&text);
    micros.sort_by(f64::total_cmp);
    if summary.errors > 0 {
        return Err(format!(
            "{} failed requests in the paced run",
            summary.errors
        ));
    }
    Ok(Latency {
        p50: quantile(&micros, 0.5).unwrap_or(f64::NAN),
        p99: quantile(&micros, 0.99).unwrap_or(f64::NAN),
        p999: quantile(&micros, 0.999).unwrap_or(f64::NAN),
        samples: micros.len(),
    })
}

/// The per-request durations (µs) of an h2load `--log-file` (start, status, duration).
pub fn parse_latency_log(text: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|line| line.split('\t').nth(2)?.trim().parse().ok())
        .collect()
}

/// Connects to `port`, asks the TCP source (through whatever is listening) for `bytes` bytes
/// and reads them to EOF.
pub fn tcp_bulk(port: u16, bytes: u64) -> Result<Throughput, String> {
    let start = Instant::now();
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    stream
        .write_all(&bytes.to_be_bytes())
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let errors = u64::from(got != bytes);
    Ok(Throughput {
        count: got,
        seconds: start.elapsed().as_secs_f64(),
        errors,
    })
}

/// How long one TLS exchange (connect, handshake, request, response) may take before it
/// counts as an error.
const TLS_EXCHANGE_LIMIT: Duration = Duration::from_secs(10);

/// A `GET` of `path` for the bench's TLS client; `close` asks the server to close the
/// connection after answering.
fn tls_request(path: &str, close: bool) -> String {
    let connection = if close { "connection: close\r\n" } else { "" };
    format!(
        "GET {path} HTTP/1.1\r\nhost: {}\r\n{connection}\r\n",
        crate::tls::PROXY_NAME
    )
}

/// The status code of an HTTP/1.1 response's first line.
fn status_of(response: &[u8]) -> Option<u16> {
    let line = response.strip_prefix(b"HTTP/1.1 ")?;
    std::str::from_utf8(line.get(..3)?).ok()?.parse().ok()
}

/// How many bytes of `buf` one whole response takes (head and `content-length` body), once
/// they are all there.
fn response_len(buf: &[u8]) -> Option<usize> {
    let head = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&buf[..head]).ok()?;
    let body = text
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    (buf.len() >= head + body).then_some(head + body)
}

/// What a run of new TLS connections achieved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsRun {
    /// Connections whose request was answered with a 2xx (each one full handshake, one
    /// request); errors: failed connections, handshakes or requests, and other answers.
    pub throughput: Throughput,
    /// Handshakes that resumed a session (the client offers none, so a non-zero count means
    /// the measurement is wrong).
    pub resumed: u64,
    /// The cipher suite and key exchange group the server chose (of the last handshake).
    pub negotiated: Option<String>,
}

/// One connection: TLS handshake, `request`, the whole answer, close; its status code,
/// whether the handshake was a full one, and what was negotiated.
async fn tls_exchange(
    connector: &TlsConnector,
    client: &TlsClient,
    port: u16,
    request: &[u8],
) -> io::Result<(Option<u16>, bool, String)> {
    let tcp = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    tcp.set_nodelay(true)?;
    let mut tls = connector.connect(client.name.clone(), tcp).await?;
    let (full, negotiated) = {
        let conn = tls.get_ref().1;
        let suite = conn.negotiated_cipher_suite().map(|s| s.suite());
        let group = conn.negotiated_key_exchange_group().map(|g| g.name());
        let negotiated = match suite.zip(group) {
            Some((suite, group)) => format!("{suite:?}, {group:?}"),
            None => "?".to_string(),
        };
        (
            conn.handshake_kind() == Some(HandshakeKind::Full),
            negotiated,
        )
    };
    tls.write_all(request).await?;
    // Read the whole answer, then close (close_notify and FIN) as wrk and browsers do: a server
    // may wait for the client to close first (Envoy's `delayed_close_timeout`).
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    while response_len(&response).is_none() {
        match tls.read(&mut chunk).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => response.extend_from_slice(&chunk[..n]),
        }
    }
    let _ = tls.shutdown().await;
    Ok((status_of(&response), full, negotiated))
}

/// Closed loop for `seconds`: `connections` concurrent loops, each making a new TLS
/// connection per request (`GET path` with `connection: close`; closed once answered), on one
/// client thread. Every handshake is a full one: the client has session
/// resumption disabled, and counts any handshake that resumed anyway.
pub fn tls_new_connections(
    port: u16,
    client: &TlsClient,
    path: &str,
    connections: u32,
    seconds: u32,
) -> Result<TlsRun, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let request: Arc<[u8]> = tls_request(path, true).into_bytes().into();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds.into());
    let runs = runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let (client, request) = (client.clone(), request.clone());
            tasks.push(tokio::spawn(async move {
                let connector = TlsConnector::from(client.config.clone());
                let mut run = TlsRun::default();
                while Instant::now() < deadline {
                    let exchange = tokio::time::timeout(
                        TLS_EXCHANGE_LIMIT,
                        tls_exchange(&connector, &client, port, &request),
                    )
                    .await;
                    match exchange {
                        Ok(Ok((status, full, negotiated))) => {
                            if status.is_some_and(|s| (200..300).contains(&s)) {
                                run.throughput.count += 1;
                            } else {
                                run.throughput.errors += 1;
                            }
                            run.resumed += u64::from(!full);
                            run.negotiated = Some(negotiated);
                        }
                        Ok(Err(_)) | Err(_) => run.throughput.errors += 1,
                    }
                }
                run
            }));
        }
        let mut runs = Vec::new();
        for task in tasks {
            runs.push(task.await.map_err(|e| e.to_string())?);
        }
        Ok::<_, String>(runs)
    })?;
    let mut total = TlsRun {
        throughput: Throughput {
            seconds: start.elapsed().as_secs_f64(),
            ..Throughput::default()
        },
        ..TlsRun::default()
    };
    for run in runs {
        total.throughput.count += run.throughput.count;
        total.throughput.errors += run.throughput.errors;
        total.resumed += run.resumed;
        total.negotiated = total.negotiated.or(run.negotiated);
    }
    Ok(total)
}

/// An open TLS connection of the bench's client (blocking).
pub type TlsConnection = StreamOwned<ClientConnection, TcpStream>;

/// Opens a TLS connection to `port`, sends `GET path` (keep-alive, or `connection: close`
/// when `close`) and reads the whole answer; the connection and the answer's status code.
pub fn tls_get(
    port: u16,
    client: &TlsClient,
    path: &str,
    close: bool,
) -> Result<(TlsConnection, u16), String> {
    let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(TLS_EXCHANGE_LIMIT))
        .map_err(|e| e.to_string())?;
    let conn = ClientConnection::new(client.config.clone(), client.name.clone())
        .map_err(|e| e.to_string())?;
    let mut tls = StreamOwned::new(conn, tcp);
    tls.write_all(tls_request(path, close).as_bytes())
        .map_err(|e| format!("TLS request: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while response_len(&buf).is_none() {
        match tls.read(&mut chunk) {
            Ok(0) => return Err("TLS connection closed before a whole answer".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("TLS answer: {e}")),
        }
    }
    let status = status_of(&buf).ok_or_else(|| {
        format!(
            "not an HTTP/1.1 answer: {:?}",
            String::from_utf8_lossy(&buf[..buf.len().min(40)])
        )
    })?;
    Ok((tls, status))
}

/// `n` TLS connections to `port`, each left open and idle after one keep-alive `GET path`
/// answered (one connection at a time); also how many answers were not a 200 (their
/// connections are kept as well).
pub fn tls_idle_connections(
    port: u16,
    client: &TlsClient,
    path: &str,
    n: usize,
) -> Result<(Vec<TlsConnection>, u64), String> {
    let mut conns = Vec::with_capacity(n);
    let mut not_ok = 0;
    for _ in 0..n {
        let (conn, status) =
            tls_get(port, client, path, false).map_err(|e| format!("idle TLS connection: {e}"))?;
        not_ok += u64::from(status != 200);
        conns.push(conn);
    }
    Ok((conns, not_ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_summary() {
        let text = "Running 3s test @ http://127.0.0.1:1/\n  1 threads and 32 connections\n  \
            120000 requests in 3.00s, 10.00MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\n  \
            Non-2xx or 3xx responses: 4\nRequests/sec:  40000.00\n";
        let t = parse_wrk(text).unwrap();
        assert_eq!(t.count, 120000);
        assert_eq!(t.seconds, 3.0);
        assert_eq!(t.errors, 7);
        assert_eq!(t.rate(), 40000.0);
        assert!(parse_wrk("garbage").is_err());
    }

    #[test]
    fn h2load_summary() {
        let text = "finished in 2.00s, 5000.50 req/s, 1.00MB/s\n\
            requests: 10003 total, 10003 started, 10003 done, 10001 succeeded, 2 failed, 2 errored, 0 timeout\n\
            status codes: 10000 2xx, 0 3xx, 0 4xx, 1 5xx\n";
        let t = parse_h2load(text).unwrap();
        assert_eq!(t.count, 10000);
        assert_eq!(t.errors, 3);
        assert!((t.seconds - 10000.0 / 5000.5).abs() < 1e-9);
    }

    #[test]
    fn http1_answers_are_framed_by_content_length() {
        let head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 5\r\n\r\n";
        assert_eq!(status_of(head), Some(503));
        assert_eq!(response_len(head), None);
        let whole = [&head[..], b"hello"].concat();
        assert_eq!(response_len(&whole), Some(whole.len()));
        assert_eq!(response_len(b"HTTP/1.1 200 OK\r\n\r\n"), Some(19));
        assert_eq!(status_of(b"garbage"), None);
    }

    #[test]
    fn latency_log_columns() {
        assert_eq!(
            parse_latency_log("1700000000000000\t200\t123\n1700000000000001\t200\t456\nbad\n"),
            vec![123.0, 456.0]
        );
    }
}
