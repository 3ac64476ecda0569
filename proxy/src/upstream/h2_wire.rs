//! Envoy's bytes meter of a request on an HTTP/2 upstream connection
//! (`%UPSTREAM_WIRE_BYTES_*%`, `%UPSTREAM_HEADER_BYTES_*%`). h2 keeps its frames to itself, so
//! a stream counts what Envoy's codec counts from its frames: 9 bytes of frame header per
//! frame, each HEADERS frame (head and trailers, both as header bytes too) with its block as
//! an HPACK encoder writes it ([`hpack`], each side's dynamic table followed per connection),
//! and each DATA frame. Request DATA frames are counted as Envoy's codec sends them: the body
//! in frames of at most 16 KiB per part the client sent, and a body an HTTP/1 client sent ends
//! in an empty DATA frame of its own. Response DATA frames are counted as they arrive, the last
//! taken to carry the stream's end.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body::{Frame, SizeHint};

use super::AttemptTarget;
use crate::body::{Body, BoxError};
use crate::wire::hpack::{self, FRAME_HEADER, Table, data_frames_len};

/// The two HPACK dynamic tables of one upstream HTTP/2 connection.
#[derive(Debug, Default)]
pub(super) struct H2Tables(Mutex<[Table; 2]>);

/// Which encoder writes a header block.
#[derive(Clone, Copy)]
enum Side {
    /// This proxy's (requests).
    Proxy = 0,
    /// The upstream's (responses).
    Upstream = 1,
}

impl H2Tables {
    /// A HEADERS frame `side` sends: `pseudo` then `headers`.
    fn frame(&self, side: Side, pseudo: &[(&str, &[u8])], headers: &HeaderMap) -> u64 {
        let mut tables = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        FRAME_HEADER + hpack::block_len(&mut tables[side as usize], pseudo, headers)
    }

    /// A request's HEADERS frame, its fields in the order the client sent them: taking
    /// `Host` out (at `host_at` among the names) moved the last name into its place, which
    /// is put back at the end here (the order fills the dynamic table, so it decides which
    /// later fields take a one-byte index).
    fn request_frame(
        &self,
        pseudo: &[(&str, &[u8])],
        headers: &HeaderMap,
        host_at: Option<usize>,
    ) -> u64 {
        let mut names: Vec<&http::HeaderName> = headers.keys().collect();
        if let Some(at) = host_at.filter(|at| *at < names.len()) {
            let moved = names.remove(at);
            names.push(moved);
        }
        let fields = names.into_iter().flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .map(move |v| (name.as_str(), v.as_bytes()))
        });
        let mut tables = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        FRAME_HEADER + hpack::fields_len(&mut tables[Side::Proxy as usize], pseudo, fields)
    }
}

/// A request's meter on an HTTP/2 upstream connection.
#[derive(Clone)]
pub(super) struct H2Meter {
    target: Arc<AttemptTarget>,
    tables: Arc<H2Tables>,
}

impl H2Meter {
    /// Counts into `target` on the connection whose tables are `tables`.
    pub(super) fn new(target: Arc<AttemptTarget>, tables: Arc<H2Tables>) -> H2Meter {
        H2Meter { target, tables }
    }

    /// Counts `req`'s HEADERS frame (it is about to be sent) and has its body count its
    /// frames; `end_apart`: an HTTP/1 client sent the body, so it ends in a frame of its own.
    /// `host_at`: where among the request's header names its `Host` was before it became
    /// `:authority` (see [`H2Tables::request_frame`]).
    pub(super) fn send(
        &self,
        req: Request<Body>,
        end_apart: bool,
        host_at: Option<usize>,
    ) -> Request<Body> {
        let uri = req.uri();
        let authority = uri.authority().map_or("", |a| a.as_str());
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        // In the order Envoy's codec writes them (its dynamic table fills in that order).
        let pseudo: [(&str, &[u8]); 4] = [
            (":authority", authority.as_bytes()),
            (":path", path.as_bytes()),
            (":method", req.method().as_str().as_bytes()),
            (":scheme", uri.scheme_str().unwrap_or("http").as_bytes()),
        ];
        let head = self.tables.request_frame(&pseudo, req.headers(), host_at);
        self.target.wire().wrote_head(head as usize, head as usize);
        if http_body::Body::is_end_stream(req.body()) {
            return req;
        }
        let meter = self.clone();
        req.map(|inner| {
            crate::body::boxed(MeteredRequestBody {
                inner,
                meter,
                end_apart,
                data: false,
            })
        })
    }

    /// Counts a response's HEADERS frame.
    pub(super) fn received_head(&self, status: http::StatusCode, headers: &HeaderMap) {
        let pseudo: [(&str, &[u8]); 1] = [(":status", status.as_str().as_bytes())];
        let n = self.tables.frame(Side::Upstream, &pseudo, headers);
        let wire = self.target.wire();
        wire.read(n as usize);
        wire.read_head(n as usize);
    }

    /// Counts a response body's frame as it arrives.
    pub(super) fn received(&self, frame: &Frame<Bytes>) {
        let wire = self.target.wire();
        if let Some(data) = frame.data_ref() {
            if !data.is_empty() {
                wire.read(data.len() + FRAME_HEADER as usize);
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            let n = self.tables.frame(Side::Upstream, &[], trailers) as usize;
            wire.read(n);
            wire.read_head(n);
        }
    }
}

/// A request body counting the frames Envoy's codec would send for it.
struct MeteredRequestBody {
    inner: Body,
    meter: H2Meter,
    end_apart: bool,
    /// A DATA frame went out.
    data: bool,
}

impl http_body::Body for MeteredRequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let me = &mut *self;
        let wire = me.meter.target.wire();
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) {
                    wire.wrote(data_frames_len(data.len() as u64) as usize);
                    me.data = true;
                } else if let Some(trailers) = frame.trailers_ref() {
                    let n = me.meter.tables.frame(Side::Proxy, &[], trailers) as usize;
                    wire.wrote_head(n, n);
                    // The trailers end the stream: no empty DATA frame.
                    me.end_apart = false;
                }
            }
            None if me.end_apart && me.data => {
                wire.wrote(FRAME_HEADER as usize);
                me.end_apart = false;
            }
            _ => {}
        }
        // A body known to have ended is not polled again: its end frame is counted now.
        if me.end_apart && me.data && me.inner.is_end_stream() {
            wire.wrote(FRAME_HEADER as usize);
            me.end_apart = false;
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn meter() -> (Arc<AttemptTarget>, H2Meter) {
        let target = Arc::new(AttemptTarget::default());
        (target.clone(), H2Meter::new(target, Arc::default()))
    }

    fn post(body: &'static [u8]) -> Request<Body> {
        Request::post("http://up.test/post")
            .body(crate::body::full(body))
            .unwrap()
    }

    #[tokio::test]
    async fn an_http1_clients_body_ends_in_an_empty_data_frame_of_its_own() {
        let (target, meter) = meter();
        let req = meter.send(post(b"hello body"), true, None);
        let head = target.wire().bytes().sent;
        req.into_body().collect().await.unwrap();
        let wire = target.wire().bytes();
        assert_eq!(wire.sent - head, 9 + 10 + 9);
        assert_eq!(wire.header_sent, head);
    }

    #[tokio::test]
    async fn an_http2_clients_body_ends_with_its_last_frame_and_long_parts_take_several() {
        let (target, meter) = meter();
        let long: &'static [u8] = Box::leak(vec![b'x'; 40_000].into_boxed_slice());
        let req = meter.send(post(long), false, None);
        let head = target.wire().bytes().sent;
        req.into_body().collect().await.unwrap();
        assert_eq!(target.wire().bytes().sent - head, 40_000 + 3 * 9);
    }

    #[test]
    fn a_second_head_on_the_connection_is_smaller_as_the_table_fills() {
        let (target, meter) = meter();
        let get = || {
            Request::get("http://up.test/ok")
                .body(crate::body::empty())
                .unwrap()
        };
        let _ = meter.send(get(), true, None);
        let first = target.wire().bytes().sent;
        let _ = meter.send(get(), true, None);
        let second = target.wire().bytes().sent - first;
        assert!(second < first, "{second} >= {first}");
    }
}
