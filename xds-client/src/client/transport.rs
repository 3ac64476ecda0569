//! The gRPC channel to the control plane: plaintext HTTP/2 over TCP or a unix socket, with
//! HTTP/2 keep-alive.

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Error, Uri};

/// How often an HTTP/2 PING checks an idle connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before the connection is dropped.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the control plane listens.
///
/// Both variants are plaintext. TLS to the control plane (istiod's 15012) is a later
/// addition: a `Tls` variant carrying a rustls client config, whose connector would wrap the
/// TCP stream before handing it to [`Endpoint::connect_with_connector`] as the unix one does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Plaintext HTTP/2 to an address.
    Tcp(std::net::SocketAddr),
    /// Plaintext HTTP/2 over a unix socket (Istio's pilot-agent proxies istiod at
    /// `./etc/istio/proxy/XDS`).
    Unix(PathBuf),
}

fn endpoint(uri: String) -> Result<Endpoint, Error> {
    Ok(Endpoint::from_shared(uri)?
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true))
}

/// Connects a channel.
pub(super) async fn connect(transport: &Transport) -> Result<Channel, Error> {
    match transport {
        Transport::Tcp(address) => endpoint(format!("http://{address}"))?.connect().await,
        Transport::Unix(path) => {
            let path = path.clone();
            let connector = tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            });
            endpoint("http://localhost".to_string())?
                .connect_with_connector(connector)
                .await
        }
    }
}
