//! An HTTP/1.1 upstream that fails on purpose and remembers every request it saw.
//!
//! Each request carries `x-test-key`; requests are recorded under that key (shadow requests,
//! whose Host ends in `-shadow`, separately). The last path segment picks the behaviour:
//! `ok`, `503`, `500`, `409`, `418` (that status), `slow` (answer after 600 ms), `reset` (close
//! without answering), and `flaky`, `slowfirst`, `resetfirst`, `teapotfirst`, `pushback` (misbehave
//! on the key's first request only: 503 / 600 ms / reset / 418 / 200 with `x-retry-me`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `x-envoy-attempt-count`.
    pub attempt_count: Option<String>,
    /// `x-envoy-expected-rq-timeout-ms`.
    pub expected_timeout: Option<String>,
    /// `grpc-timeout`.
    pub grpc_timeout: Option<String>,
    /// Names of the `x-envoy-*` headers, sorted.
    pub envoy_headers: Vec<String>,
    /// The Host header.
    pub host: String,
    /// Request body length.
    pub body_len: usize,
}

#[derive(Default)]
struct Records {
    main: HashMap<String, Vec<Seen>>,
    shadow: HashMap<String, Vec<Seen>>,
}

/// The running upstream; stops when dropped.
pub struct Upstream {
    /// Its port.
    pub port: u16,
    records: Arc<Mutex<Records>>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// Starts the upstream on a loopback port.
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let port = listener.local_addr().expect("local addr").port();
        let records: Arc<Mutex<Records>> = Arc::default();
        let shared = records.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Upstream {
            port,
            records,
            task,
        }
    }

    /// The requests seen under `key` (not shadows).
    pub fn seen(&self, key: &str) -> Vec<Seen> {
        let r = self.records.lock().expect("records lock");
        r.main.get(key).cloned().unwrap_or_default()
    }

    /// The shadow requests seen under `key`.
    pub fn shadows(&self, key: &str) -> Vec<Seen> {
        let r = self.records.lock().expect("records lock");
        r.shadow.get(key).cloned().unwrap_or_default()
    }
}

async fn serve(mut stream: TcpStream, records: Arc<Mutex<Records>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("/")
        .to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let body_len: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + body_len {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let mut envoy_headers: Vec<String> = headers
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| n.starts_with("x-envoy-"))
        .collect();
    envoy_headers.sort();
    let host = header("host").unwrap_or_default();
    let seen = Seen {
        attempt_count: header("x-envoy-attempt-count"),
        expected_timeout: header("x-envoy-expected-rq-timeout-ms"),
        grpc_timeout: header("grpc-timeout"),
        envoy_headers,
        body_len: buf.len() - head_end,
        host: host.clone(),
    };
    let key = header("x-test-key").unwrap_or_default();
    let first = {
        let mut r = records.lock().expect("records lock");
        let list = if host.ends_with("-shadow") {
            r.shadow.entry(key).or_default()
        } else {
            r.main.entry(key).or_default()
        };
        list.push(seen);
        list.len() == 1
    };
    let behaviour = path
        .split('?')
        .next()
        .unwrap_or("")
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_owned();
    let (status, body, extra) = match (behaviour.as_str(), first) {
        ("503", _) | ("flaky", true) => (503, "unavailable", ""),
        ("500", _) => (500, "internal", ""),
        ("409", _) => (409, "conflict", ""),
        ("418", _) | ("teapotfirst", true) => (418, "teapot", ""),
        ("reset", _) | ("resetfirst", true) => return,
        ("slow", _) | ("slowfirst", true) => {
            tokio::time::sleep(Duration::from_millis(600)).await;
            (200, "slow", "")
        }
        ("pushback", true) => (200, "pushback", "x-retry-me: 1\r\n"),
        _ => (200, "ok", ""),
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
