//! The HTTP/1.1 fast path for plaintext connections: revoy's own reading of request heads and
//! writing of responses for the common request (HTTP/1.1, no body, no upgrade), where hyper's
//! server spent about a quarter of a request's instructions. The first request it does not take
//! (see [`request::parse`]) hands the connection, with the bytes read so far, to hyper's server
//! for the rest of its life, so every unusual case keeps hyper's handling and Envoy's replies.

mod date;
mod prefixed;
mod request;
mod response;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ConnContext;
use super::header_tokens::has_token;
use crate::config::hcm::Codec;
use request::Head;

/// The read buffer's first size, and the room kept free before each read.
const READ_BUFFER: usize = 8 * 1024;

/// Serves `stream` until it closes, handing it to hyper's server at the first request the fast
/// path does not take (or at once for what may be an HTTP/2 preface under `Codec::Auto`).
pub(super) async fn serve(mut stream: TcpStream, ctx: Arc<ConnContext>, codec: Codec) {
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    let limit = ctx.hcm.config.max_request_headers_kb as usize * 1024;
    loop {
        let (request, close) = loop {
            if !buf.is_empty() {
                if codec == Codec::Auto && may_be_h2_preface(&buf) {
                    return hand_off(stream, buf, ctx, codec).await;
                }
                match request::parse(&mut buf, &ctx.hcm.config) {
                    Head::Partial => {}
                    Head::Served { request, close } => break (request, close),
                    Head::HandOff => return hand_off(stream, buf, ctx, codec).await,
                }
            }
            if !matches!(stream.read_buf(reserve(&mut buf)).await, Ok(n) if n > 0) {
                return;
            }
        };
        let method = request.method().clone();
        let handled = super::router::handle(request, &ctx);
        tokio::pin!(handled);
        // While the response is prepared, the connection is read too: a client that closes
        // cancels its request (as in Envoy), and pipelined requests wait in the buffer.
        let response = loop {
            tokio::select! {
                biased;
                response = &mut handled => break Some(response),
                read = stream.read_buf(reserve(&mut buf)), if buf.len() < limit => {
                    if !matches!(read, Ok(n) if n > 0) {
                        break None;
                    }
                }
            }
        };
        let Some(response) = response else { return };
        if !response::write(&mut stream, response, &method, close).await {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// `buf` with room for at least one more read.
fn reserve(buf: &mut BytesMut) -> &mut BytesMut {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(READ_BUFFER);
    }
    buf
}

/// Whether the bytes read so far are (the start of) the HTTP/2 connection preface.
fn may_be_h2_preface(buf: &[u8]) -> bool {
    let preface = super::H2_PREFACE;
    buf[..buf.len().min(preface.len())] == preface[..buf.len().min(preface.len())]
}

/// Serves the rest of the connection with hyper, starting with the bytes in `buf`.
async fn hand_off(stream: TcpStream, buf: BytesMut, ctx: Arc<ConnContext>, codec: Codec) {
    let io = super::envoy_errors::EnvoyErrors::new(prefixed::Prefixed::new(buf, stream));
    super::serve_io(io, ctx, codec).await;
}
