//! The gRPC channel to the control plane: HTTP/2 over TCP (plaintext or TLS) or a unix
//! socket, with HTTP/2 keep-alive ([`KeepAlive`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Error, Uri};

/// HTTP/2 keep-alive on the channel: a PING every `interval` (the stream idle or not), and
/// the connection dropped (the stream then re-established) when one goes unanswered for
/// `timeout` — the xDS cluster's `http2_protocol_options.connection_keepalive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// How often a PING is sent.
    pub interval: Duration,
    /// How long a PING may go unanswered.
    pub timeout: Duration,
}

impl Default for KeepAlive {
    /// revoy's own when the bootstrap sets none (Envoy then sends no PINGs): every 30 s, 10 s
    /// to answer, so a control plane that vanished without a FIN is noticed.
    fn default() -> Self {
        KeepAlive {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        }
    }
}
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The HTTP/2 receive windows (stream and connection) offered to the control plane: Envoy's
/// defaults for its gRPC clients (`initial_stream_window_size` and
/// `initial_connection_window_size`, 256 MiB), so a large push is never held back waiting for
/// window updates.
const RECEIVE_WINDOW: u32 = 256 * 1024 * 1024;

/// Where the control plane listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Plaintext HTTP/2 to an address.
    Tcp(std::net::SocketAddr),
    /// Plaintext HTTP/2 over a unix socket (Istio's pilot-agent proxies istiod at
    /// `./etc/istio/proxy/XDS`).
    Unix(PathBuf),
    /// HTTP/2 over TLS to an address (a control plane such as istiod's 15012, reached
    /// directly through an xDS cluster with a TLS transport socket).
    Tls(std::net::SocketAddr, TlsConnect),
}

/// Asked before each TLS handshake with the control plane and told how it went (the proxy
/// counts its `ssl.*` stats, and refuses while its TLS context lacks an SDS secret).
pub trait HandshakeObserver: Send + Sync + std::fmt::Debug {
    /// Whether a handshake may start; when not, the TCP connection is closed before a byte
    /// is sent and the connect fails (to be tried again with back-off).
    fn may_handshake(&self) -> bool;
    /// A handshake completed.
    fn completed(&self, connection: &tokio_rustls::rustls::CommonState);
    /// A handshake failed.
    fn failed(&self, error: &std::io::Error);
}

/// How the TLS connection to the control plane is made.
#[derive(Debug, Clone)]
pub struct TlsConnect {
    /// The rustls client configuration (its ALPN should offer `h2`).
    pub config: Arc<tokio_rustls::rustls::ClientConfig>,
    /// The server name sent and checked.
    pub server_name: tokio_rustls::rustls::pki_types::ServerName<'static>,
    /// Asked before and told after each handshake.
    pub observer: Option<Arc<dyn HandshakeObserver>>,
}

impl PartialEq for TlsConnect {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.server_name == other.server_name
    }
}

impl Eq for TlsConnect {}

fn endpoint(uri: String, keep_alive: Option<KeepAlive>) -> Result<Endpoint, Error> {
    let mut endpoint = Endpoint::from_shared(uri)?;
    if let Some(k) = keep_alive {
        endpoint = endpoint
            .http2_keep_alive_interval(k.interval)
            .keep_alive_timeout(k.timeout)
            .keep_alive_while_idle(true);
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .initial_stream_window_size(RECEIVE_WINDOW)
        .initial_connection_window_size(RECEIVE_WINDOW)
        .tcp_nodelay(true))
}

/// Connects a channel.
pub(super) async fn connect(
    transport: &Transport,
    keep_alive: Option<KeepAlive>,
) -> Result<Channel, Error> {
    match transport {
        Transport::Tcp(address) => {
            endpoint(format!("http://{address}"), keep_alive)?
                .connect()
                .await
        }
        Transport::Unix(path) => {
            let path = path.clone();
            let connector = tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            });
            endpoint("http://localhost".to_string(), keep_alive)?
                .connect_with_connector(connector)
                .await
        }
        Transport::Tls(address, tls) => {
            let (address, tls) = (*address, tls.clone());
            let connector = tower::service_fn(move |_: Uri| {
                let tls = tls.clone();
                async move {
                    let tcp = tokio::net::TcpStream::connect(address).await?;
                    tcp.set_nodelay(true)?;
                    if tls.observer.as_ref().is_some_and(|o| !o.may_handshake()) {
                        return Err(std::io::Error::other(
                            "the TLS context is not ready: its SDS secrets have not arrived",
                        ));
                    }
                    let stream = tokio_rustls::TlsConnector::from(tls.config)
                        .connect(tls.server_name, tcp)
                        .await;
                    if let Some(observer) = &tls.observer {
                        match &stream {
                            Ok(s) => observer.completed(s.get_ref().1),
                            Err(e) => observer.failed(e),
                        }
                    }
                    Ok::<_, std::io::Error>(TokioIo::new(stream?))
                }
            });
            endpoint(format!("http://{address}"), keep_alive)?
                .connect_with_connector(connector)
                .await
        }
    }
}
