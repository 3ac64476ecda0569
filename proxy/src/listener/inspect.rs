//! Listener-filter inspection of a connection's first bytes, without consuming them:
//! TLS ClientHello (SNI, ALPN) and HTTP/2 prior-knowledge preface.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

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
    /// The TLS inspector's limit was reached with the ClientHello still incomplete.
    TooLarge,
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Envoy's default (and largest) `max_client_hello_size`: what the TLS inspector peeks at most.
const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Peeks at the connection's first bytes until the inspectors can decide (the TLS inspector
/// needs a whole record header, and a whole first record when it is a TLS one, as Envoy's
/// BoringSSL-based inspector does) or the client closes, waiting at most `timeout` (`None`: no
/// limit), and classifies the stream.
pub async fn inspect(
    stream: &TcpStream,
    tls: bool,
    http: bool,
    timeout: Option<Duration>,
) -> Result<Inspected, Unfinished> {
    let mut buf = vec![0u8; MAX_CLIENT_HELLO];
    let peeked = peek_until_decided(stream, &mut buf, tls);
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
    match tls.then(|| tls_verdict(data, buf.len())) {
        Some(TlsVerdict::TooLarge) => return Err(Unfinished::TooLarge),
        Some(TlsVerdict::Tls) => {
            out.transport_protocol = "tls";
            if let Some((sni, alpn)) = parse_client_hello(data) {
                out.server_name = sni;
                out.application_protocols = alpn;
            }
            return Ok(out);
        }
        Some(TlsVerdict::NeedMore | TlsVerdict::NotTls) | None => {}
    }
    if http {
        if data.starts_with(&H2_PREFACE[..data.len().min(H2_PREFACE.len())]) {
            out.application_protocols.push("h2c".into());
        } else if data.windows(7).any(|w| w == b"HTTP/1.") {
            out.application_protocols.push("http/1.1".into());
        }
    }
    Ok(out)
}

/// Peeks into `buf` until the TLS inspector (when `tls`) has what it needs, the buffer is
/// full, or the client closed (0, also when it closed its side before sending enough). Waits
/// for more bytes between peeks: a peek that finds too few clears the socket's readiness, so
/// the next wait ends only when more data (or the client's close) arrives.
async fn peek_until_decided(stream: &TcpStream, buf: &mut [u8], tls: bool) -> io::Result<usize> {
    loop {
        let ready = stream.ready(Interest::READABLE).await?;
        let peeked = stream.try_io(Interest::READABLE, || {
            let n = peek(stream, buf)?;
            let more = n > 0 && tls && tls_verdict(&buf[..n], buf.len()) == TlsVerdict::NeedMore;
            if more {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(n)
            }
        });
        match peeked {
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
