//! One HTTPS GET for tests: a rustls client handshake to a loopback port, `GET <path>` with
//! `connection: close`, read to the end; the status, the body and the server's end-entity
//! certificate, or where it failed (connect, handshake or exchange).
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

/// What an HTTPS GET got.
#[derive(Debug)]
pub struct Answer {
    /// The response status.
    pub status: u16,
    /// The response body (as text).
    pub body: String,
    /// The end-entity certificate the server presented (DER).
    pub certificate: Vec<u8>,
    /// Whether the handshake resumed a session.
    pub resumed: bool,
}

/// A TLS connection to 127.0.0.1:`port` with `config`, sending the server name `sni`, its
/// handshake complete (reads time out after 10 s).
pub fn connect(
    port: u16,
    config: &Arc<ClientConfig>,
    sni: &str,
) -> Result<StreamOwned<ClientConnection, TcpStream>, String> {
    let name = ServerName::try_from(sni.to_owned()).map_err(|e| e.to_string())?;
    let mut conn = ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// GETs `path` from 127.0.0.1:`port` over TLS with `config`, sending the server name `sni`.
pub fn get(port: u16, config: &Arc<ClientConfig>, sni: &str, path: &str) -> Result<Answer, String> {
    let mut stream = connect(port, config, sni)?;
    let conn = &stream.conn;
    let certificate = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let resumed = matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    let request = format!("GET {path} HTTP/1.1\r\nhost: {sni}\r\nconnection: close\r\n\r\n");
    let written = stream.write_all(request.as_bytes());
    let mut raw = Vec::new();
    // A server that refused the handshake may have sent its alert and closed before the
    // request went out: the alert is read even then.
    match (stream.read_to_end(&mut raw), written) {
        (Ok(_), Ok(())) => {}
        (Err(e), Ok(())) if e.kind() == ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        (Err(e), _) if e.to_string().contains("alert") => return Err(format!("read: {e}")),
        (Err(e), Ok(())) => return Err(format!("read: {e}")),
        (_, Err(e)) => return Err(format!("write: {e}")),
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no response head: {text}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    Ok(Answer {
        status,
        body: body.to_owned(),
        certificate,
        resumed,
    })
}
