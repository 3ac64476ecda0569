//! Listener-filter inspection of a connection's first bytes, without consuming them:
//! TLS ClientHello (SNI, ALPN) and HTTP/2 prior-knowledge preface.

use std::time::Duration;

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

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Peeks at up to 16 KiB (waiting at most `timeout` for data) and classifies the stream.
pub async fn inspect(stream: &TcpStream, tls: bool, http: bool, timeout: Duration) -> Inspected {
    let mut buf = vec![0u8; 16 * 1024];
    let n = tokio::time::timeout(timeout, stream.peek(&mut buf))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    let data = &buf[..n];
    let mut out = Inspected {
        transport_protocol: "raw_buffer",
        ..Default::default()
    };
    if tls && data.first() == Some(&0x16) {
        out.transport_protocol = "tls";
        if let Some((sni, alpn)) = parse_client_hello(data) {
            out.server_name = sni;
            out.application_protocols = alpn;
        }
    } else if http && !data.is_empty() {
        if data.starts_with(&H2_PREFACE[..data.len().min(H2_PREFACE.len())]) {
            out.application_protocols.push("h2c".into());
        } else if data.windows(7).any(|w| w == b"HTTP/1.") {
            out.application_protocols.push("http/1.1".into());
        }
    }
    out
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
}
