//! A TCP relay between an ADS client and its server that counts the HTTP/2 PINGs the client
//! sends and can fall silent: a control plane gone without closing its connections. Used by
//! `xds-client`'s transport tests and, through a `#[path]` include, by the proxy's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP relay between a client and a server that counts the HTTP/2 PINGs the client sends
/// and can fall silent on the connections it holds (a control plane gone without closing
/// them: no FIN, no answers); connections made afterwards are relayed again.
pub struct Relay {
    /// Where it listens.
    pub address: SocketAddr,
    pings: Arc<AtomicUsize>,
    /// Connections numbered below this are silent.
    silent_below: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
}

impl Relay {
    /// Relays connections made to it to `to`.
    pub async fn start(to: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            address: listener.local_addr().unwrap(),
            pings: Arc::new(AtomicUsize::new(0)),
            silent_below: Arc::new(AtomicUsize::new(0)),
            accepted: Arc::new(AtomicUsize::new(0)),
        };
        let (pings, silent_below, accepted) = (
            relay.pings.clone(),
            relay.silent_below.clone(),
            relay.accepted.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let n = accepted.fetch_add(1, Ordering::SeqCst);
                let server = tokio::net::TcpStream::connect(to).await.unwrap();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let silent = {
                    let s = silent_below.clone();
                    move || s.load(Ordering::SeqCst) > n
                };
                tokio::spawn(pass(cr, sw, silent.clone(), Some(pings.clone())));
                tokio::spawn(pass(sr, cw, silent, None));
            }
        });
        relay
    }

    /// The connections relayed so far fall silent.
    pub fn silence(&self) {
        let accepted = self.accepted.load(Ordering::SeqCst);
        self.silent_below.store(accepted, Ordering::SeqCst);
    }

    /// How many PINGs clients sent.
    pub fn pings(&self) -> usize {
        self.pings.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either ends, dropping what arrives while `silent()`; with
/// `pings`, counts the HTTP/2 PING frames (not ACKs) in the client's bytes.
async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: impl Fn() -> bool,
    pings: Option<Arc<AtomicUsize>>,
) {
    const PREFACE: usize = 24;
    let (mut seen, mut past_preface) = (Vec::new(), false);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(pings) = &pings {
            // Frames: a 9-byte header (length, type, flags, stream), then the payload.
            seen.extend_from_slice(&buf[..n]);
            if !past_preface && seen.len() >= PREFACE {
                seen.drain(..PREFACE);
                past_preface = true;
            }
            while past_preface && seen.len() >= 9 {
                let length = u32::from_be_bytes([0, seen[0], seen[1], seen[2]]) as usize;
                if seen.len() < 9 + length {
                    break;
                }
                if seen[3] == 6 && seen[4] & 1 == 0 {
                    pings.fetch_add(1, Ordering::SeqCst);
                }
                seen.drain(..9 + length);
            }
        }
        if !silent() && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
