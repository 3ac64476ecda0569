//! Listener-filter inspection of a connection's first bytes, without consuming them:
//! the TLS inspector (ClientHello: SNI, ALPN) and the HTTP inspector (`http_inspect.rs`).

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::http_inspect::{HttpVerdict, http_verdict};
use crate::stats::{Counter, Histogram, Store};

/// What peeking at the first bytes revealed.
#[derive(Debug, Default, Clone)]
pub struct Inspected {
    /// `tls` or `raw_buffer`.
    pub transport_protocol: &'static str,
    /// SNI from the ClientHello.
    pub server_name: Option<String>,
    /// ALPN from the ClientHello, or `h2c`/`http/1.1` from the HTTP inspector.
    pub application_protocols: Vec<String>,
}

/// Why an inspection ended before the inspectors could decide; Envoy closes the connection
/// in each case (a timeout may instead continue, by `continue_on_listener_filters_timeout`:
/// then the stream must be registered anew, since the wait left its readiness cleared with
/// bytes pending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinished {
    /// The client closed (or reset) its side first (`downstream_listener_filter_remote_close`).
    Closed,
    /// `listener_filters_timeout` passed (`downstream_pre_cx_timeout`).
    TimedOut,
    /// An inspector's limit was reached undecided: the TLS inspector's with the ClientHello
    /// incomplete (`tls_inspector.client_hello_too_large`), the HTTP inspector's with the
    /// request line unfinished (`http_inspector.read_error`).
    TooLarge,
}

/// Envoy's default (and largest) `max_client_hello_size`: what the TLS inspector peeks at most.
const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// What Envoy's HTTP inspector reads at most while a request line is unfinished.
const MAX_REQUEST_LINE: usize = 64 * 1024;

/// The `tls_inspector.*` and `http_inspector.*` stats Envoy keeps (one set for the whole
/// server, shared by every listener with the inspector).
pub struct InspectorStats {
    tls: Option<TlsStats>,
    http: Option<HttpStats>,
}

struct TlsStats {
    tls_found: Counter,
    tls_not_found: Counter,
    alpn_found: Counter,
    alpn_not_found: Counter,
    sni_found: Counter,
    sni_not_found: Counter,
    client_hello_too_large: Counter,
    bytes_processed: Histogram,
}

struct HttpStats {
    http10_found: Counter,
    http11_found: Counter,
    http2_found: Counter,
    http_not_found: Counter,
    read_error: Counter,
}

impl InspectorStats {
    /// The stats of the inspectors a listener runs (`tls`, `http`).
    pub fn new(store: &Store, tls: bool, http: bool) -> InspectorStats {
        let tls = tls.then(|| {
            let c = |name: &str| store.counter(&format!("tls_inspector.{name}"));
            TlsStats {
                tls_found: c("tls_found"),
                tls_not_found: c("tls_not_found"),
                alpn_found: c("alpn_found"),
                alpn_not_found: c("alpn_not_found"),
                sni_found: c("sni_found"),
                sni_not_found: c("sni_not_found"),
                client_hello_too_large: c("client_hello_too_large"),
                bytes_processed: store.histogram("tls_inspector.bytes_processed"),
            }
        });
        let http = http.then(|| {
            let c = |name: &str| store.counter(&format!("http_inspector.{name}"));
            HttpStats {
                http10_found: c("http10_found"),
                http11_found: c("http11_found"),
                http2_found: c("http2_found"),
                http_not_found: c("http_not_found"),
                read_error: c("read_error"),
            }
        });
        InspectorStats { tls, http }
    }

    /// Runs the inspectors on the connection's first bytes (`(tls, http)`: which of them run
    /// on this connection, as their `filter_disabled` says), waiting at most `timeout`
    /// (`None`: no limit), and classifies the stream.
    pub async fn inspect(
        &self,
        stream: &TcpStream,
        (tls, http): (bool, bool),
        timeout: Option<Duration>,
    ) -> Result<Inspected, Unfinished> {
        let tls = self.tls.as_ref().filter(|_| tls);
        let http = self.http.as_ref().filter(|_| http);
        let mut buf = vec![0u8; MAX_CLIENT_HELLO];
        let peeked = peek_until_decided(stream, &mut buf, |d| needs_more(tls, http, d));
        let n = match timeout {
            Some(limit) => tokio::time::timeout(limit, peeked)
                .await
                .map_err(|_| Unfinished::TimedOut)?,
            None => peeked.await,
        }
        .unwrap_or(0);
        let data = &buf[..n];
        if data.is_empty() {
            return Err(Unfinished::Closed);
        }
        let mut out = Inspected {
            transport_protocol: "raw_buffer",
            ..Default::default()
        };
        if let Some(stats) = tls {
            match tls_verdict(data, MAX_CLIENT_HELLO) {
                TlsVerdict::TooLarge => {
                    stats.client_hello_too_large.inc();
                    stats.bytes_processed.record(n as u64);
                    return Err(Unfinished::TooLarge);
                }
                TlsVerdict::Tls => {
                    stats.tls_found.inc();
                    out.transport_protocol = "tls";
                    if let Some((sni, alpn)) = parse_client_hello(data) {
                        out.server_name = sni;
                        out.application_protocols = alpn;
                    }
                    let found = |yes: bool, found: &Counter, not: &Counter| {
                        if yes { found.inc() } else { not.inc() }
                    };
                    found(
                        out.server_name.is_some(),
                        &stats.sni_found,
                        &stats.sni_not_found,
                    );
                    found(
                        !out.application_protocols.is_empty(),
                        &stats.alpn_found,
                        &stats.alpn_not_found,
                    );
                    stats.bytes_processed.record(tls_bytes_read(data) as u64);
                    return Ok(out);
                }
                TlsVerdict::NeedMore | TlsVerdict::NotTls => {
                    stats.tls_not_found.inc();
                    stats.bytes_processed.record(tls_bytes_read(data) as u64);
                }
            }
        }
        if let Some(stats) = http {
            match http_verdict(data) {
                HttpVerdict::Found(protocol) => {
                    match protocol {
                        "h2c" => &stats.http2_found,
                        "http/1.1" => &stats.http11_found,
                        _ => &stats.http10_found,
                    }
                    .inc();
                    out.application_protocols.push(protocol.into());
                }
                HttpVerdict::NotHttp => stats.http_not_found.inc(),
                HttpVerdict::NeedMore => {
                    stats.read_error.inc();
                    return Err(Unfinished::TooLarge);
                }
            }
        }
        Ok(out)
    }
}

/// What the inspectors make of a connection's first bytes `d` (never empty), as
/// [`InspectorStats::inspect`] decides (for the fuzz targets): the TLS inspector's verdict,
/// the ClientHello's SNI and ALPN when it found one, the bytes it read, and the HTTP
/// inspector's verdict.
#[cfg(fuzzing)]
pub(crate) fn inspect_for_fuzzing(d: &[u8]) -> String {
    let tls = tls_verdict(d, MAX_CLIENT_HELLO);
    let hello = (tls == TlsVerdict::Tls).then(|| parse_client_hello(d));
    format!(
        "{tls:?} {hello:?} {} {:?}",
        tls_bytes_read(d),
        http_verdict(d)
    )
}

/// Whether a running inspector (`tls`, `http`) needs more than `d` to decide (and has room
/// to read it).
fn needs_more(tls: Option<&TlsStats>, http: Option<&HttpStats>, d: &[u8]) -> bool {
    match tls.map(|_| tls_verdict(d, MAX_CLIENT_HELLO)) {
        Some(TlsVerdict::NeedMore) => true,
        Some(TlsVerdict::Tls | TlsVerdict::TooLarge) => false,
        Some(TlsVerdict::NotTls) | None => {
            http.is_some() && d.len() < MAX_REQUEST_LINE && http_verdict(d) == HttpVerdict::NeedMore
        }
    }
}

/// Peeks into `buf` until the inspectors have what they need (`needs_more` says no) or the
/// client closed (0, also when it closed its side before sending enough), growing `buf` to
/// [`MAX_REQUEST_LINE`] when it fills up undecided. Waits for more bytes between peeks: a
/// peek that finds too few clears the socket's readiness, so the next wait ends only when
/// more data (or the client's close) arrives.
async fn peek_until_decided(
    stream: &TcpStream,
    buf: &mut Vec<u8>,
    needs_more: impl Fn(&[u8]) -> bool,
) -> io::Result<usize> {
    loop {
        let ready = stream.ready(Interest::READABLE).await?;
        let peeked = stream.try_io(Interest::READABLE, || {
            let n = peek(stream, buf)?;
            if n > 0 && n < buf.len() && needs_more(&buf[..n]) {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(n)
            }
        });
        match peeked {
            // Full and undecided: the bytes are there, peek again with room for more.
            Ok(n) if n == buf.len() && n < MAX_REQUEST_LINE && needs_more(&buf[..n]) => {
                buf.resize(MAX_REQUEST_LINE, 0);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && ready.is_read_closed() => {
                return Ok(0);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(0),
            other => return other,
        }
    }
}

/// One non-blocking `recv(MSG_PEEK)`: the bytes waiting, left in the socket.
fn peek(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the descriptor is open while `stream` is borrowed, and `buf` is a valid,
    // writable buffer of `buf.len()` bytes.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// What the TLS inspector makes of the bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsVerdict {
    /// Too few bytes to decide: a record header, or the rest of a TLS first record.
    NeedMore,
    /// A TLS record holding a ClientHello.
    Tls,
    /// Not TLS: a record header with another major version, or a first record that is not a
    /// handshake record starting a ClientHello (or too long for any record).
    NotTls,
    /// A TLS first record longer than the inspector reads (`limit` bytes).
    TooLarge,
}

/// TLS plaintext records are at most 2^14 bytes; BoringSSL refuses a record header announcing
/// more than that plus the largest encryption overhead.
const MAX_RECORD: usize = 16 * 1024 + 2048;

/// Envoy's rule, as BoringSSL reads the first record: five bytes for the header; a major
/// version other than 3 is not TLS at once; otherwise the whole record is awaited (up to
/// `limit` bytes), then its type and first handshake message decide.
fn tls_verdict(d: &[u8], limit: usize) -> TlsVerdict {
    let Some(header) = d.get(..5) else {
        return TlsVerdict::NeedMore;
    };
    let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if header[1] != 3 || length > MAX_RECORD {
        return TlsVerdict::NotTls;
    }
    if d.len() < 5 + length {
        return if d.len() >= limit {
            TlsVerdict::TooLarge
        } else {
            TlsVerdict::NeedMore
        };
    }
    if header[0] == 0x16 && d.get(5) == Some(&1) {
        TlsVerdict::Tls
    } else {
        TlsVerdict::NotTls
    }
}

/// What BoringSSL reads of `d` before the TLS inspector's verdict: the record header, and
/// the record when the header announces a TLS one.
fn tls_bytes_read(d: &[u8]) -> usize {
    let whole = match d.get(..5) {
        Some(h) if h[1] == 3 => 5 + usize::from(u16::from_be_bytes([h[3], h[4]])),
        _ => 5,
    };
    whole.min(d.len())
}

fn be16(d: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes([
        *d.get(at)?,
        *d.get(at + 1)?,
    ])))
}

/// Extracts SNI and ALPN from a TLS record holding a ClientHello.
pub fn parse_client_hello(d: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    if d.len() < 9 || d[0] != 0x16 || d[5] != 0x01 {
        return None;
    }
    let mut p = 9 + 2 + 32;
    p += 1 + usize::from(*d.get(p)?);
    p += 2 + be16(d, p)?;
    p += 1 + usize::from(*d.get(p)?);
    let ext_end = (p + 2 + be16(d, p)?).min(d.len());
    p += 2;
    let (mut sni, mut alpn) = (None, Vec::new());
    while p + 4 <= ext_end {
        let (kind, len) = (be16(d, p)?, be16(d, p + 2)?);
        let body = d.get(p + 4..p + 4 + len)?;
        match kind {
            0 if body.len() >= 5 => {
                let n = be16(body, 3)?;
                sni = body
                    .get(5..5 + n)
                    .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
            }
            16 if body.len() >= 2 => {
                let mut q = 2;
                while q < body.len() {
                    let n = usize::from(body[q]);
                    if let Some(proto) = body.get(q + 1..q + 1 + n) {
                        alpn.push(String::from_utf8_lossy(proto).into_owned());
                    }
                    q += 1 + n;
                }
            }
            _ => {}
        }
        p += 4 + len;
    }
    Some((sni, alpn))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a minimal ClientHello record with the given extensions.
    fn hello(exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut ext = Vec::new();
        for (k, body) in exts {
            ext.extend_from_slice(&k.to_be_bytes());
            ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
            ext.extend_from_slice(body);
        }
        let mut hs = vec![3, 3];
        hs.extend_from_slice(&[0; 32]);
        hs.push(0);
        hs.extend_from_slice(&[0, 2, 0x13, 0x01]);
        hs.extend_from_slice(&[1, 0]);
        hs.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        hs.extend_from_slice(&ext);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&((hs.len() + 4) as u16).to_be_bytes());
        rec.push(1);
        rec.extend_from_slice(&(hs.len() as u32).to_be_bytes()[1..]);
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn reads_sni_and_alpn() {
        let name = b"Api.Example.com";
        let mut sni = (name.len() as u16 + 3).to_be_bytes().to_vec();
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name);
        let alpn = vec![
            0, 12, 2, b'h', b'2', 8, b'h', b't', b't', b'p', b'/', b'1', b'.', b'1',
        ];
        let rec = hello(&[(0, sni), (16, alpn)]);
        let (sni, alpn) = parse_client_hello(&rec).unwrap();
        assert_eq!(sni.as_deref(), Some("api.example.com"));
        assert_eq!(alpn, vec!["h2", "http/1.1"]);
        assert!(parse_client_hello(b"GET / HTTP/1.1\r\n").is_none());
    }

    #[test]
    fn tls_verdict_waits_for_a_record_header_then_a_tls_record() {
        let limit = MAX_CLIENT_HELLO;
        assert_eq!(tls_verdict(b"GET ", limit), TlsVerdict::NeedMore);
        assert_eq!(tls_verdict(b"GET /", limit), TlsVerdict::NotTls);
        assert_eq!(
            tls_verdict(b"\x16\x03\x01\x00\x10abc", limit),
            TlsVerdict::NeedMore
        );
        assert_eq!(
            tls_verdict(b"\x16\x04\x01\x00\x10abc", limit),
            TlsVerdict::NotTls
        );
        assert_eq!(
            tls_verdict(b"\x17\x03\x03\x00\x01x", limit),
            TlsVerdict::NotTls
        );
        assert_eq!(
            tls_verdict(b"\x16\x03\x01\x00\x09", 5),
            TlsVerdict::TooLarge
        );
        assert_eq!(tls_verdict(&hello(&[]), limit), TlsVerdict::Tls);
    }
}
