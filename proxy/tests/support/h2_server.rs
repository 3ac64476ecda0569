//! A loopback HTTP/2 (prior knowledge) server for tests: each request stream goes to a handler
//! on its own task, on a runtime of the server's own thread.

use std::future::Future;

/// A request stream as the handler gets it.
pub type Request = http::Request<h2::RecvStream>;
/// Where the handler sends its response.
pub type Respond = h2::server::SendResponse<bytes::Bytes>;

/// Starts the server on a free loopback port and returns the port.
pub fn serve<H, F>(handler: H) -> u16
where
    H: Fn(Request, Respond) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("the h2 server binds");
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let handler = std::sync::Arc::new(handler);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((socket, _)) = listener.accept().await {
                let handler = handler.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        tokio::spawn(handler(request, respond));
                    }
                });
            }
        });
    });
    port
}
