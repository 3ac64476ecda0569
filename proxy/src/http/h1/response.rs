//! Writing a response on the HTTP/1.1 fast path, with the framing and connection rules hyper's
//! server applies on the other path (so a connection answers alike on both).

use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body::Body as _;
use tokio::io::AsyncWriteExt;

use super::date;
use crate::body::{Body, BoxError};
use crate::http::reason::envoy_phrase;
use crate::http::wire_meter::ConnWire;
use crate::wire::{ends_in_chunked, put_chunk_start, put_chunked_end, put_field};

/// How the body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Exactly this many bytes (`content-length`, or none at all).
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// A response head ready to write, and how its body follows.
struct Encoded {
    head: Vec<u8>,
    framing: Framing,
    /// The connection closes after this response.
    last: bool,
}

/// What the body says of its length before it is read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Len {
    /// Already at its end.
    Ended,
    /// Exactly this many bytes.
    Known(u64),
    /// Unknown until it ends.
    Unknown,
}

/// Encodes the head of `resp` to a `method` request (`close` when the connection closes after
/// it; `notice` when it says `connection: close` and the connection stays open).
fn encode(resp: &mut Response<Body>, method: &Method, close: bool, notice: bool) -> Encoded {
    let status = resp.status();
    if close {
        // The client's close is echoed, as hyper's server does.
        match resp.headers_mut().entry(header::CONNECTION) {
            header::Entry::Occupied(mut e) => {
                if !e.iter().any(|v| super::has_token(v.as_bytes(), b"close")) {
                    e.append(HeaderValue::from_static("close"));
                }
            }
            header::Entry::Vacant(e) => {
                e.insert(HeaderValue::from_static("close"));
            }
        }
    }
    let body = resp.body();
    let len = match body.size_hint().exact() {
        _ if body.is_end_stream() => Len::Ended,
        Some(n) => Len::Known(n),
        None => Len::Unknown,
    };
    let head_request = *method == Method::HEAD;
    let may_have_length = !status.is_informational()
        && !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let may_have_body = may_have_length && !head_request;
    let mut out = Vec::with_capacity(64 + resp.headers().len() * 32);
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        // An interim head (a `101` hyper writes for an upgrade) keeps hyper's phrase.
        let phrase = match status.canonical_reason() {
            Some(phrase) if status.is_informational() => phrase,
            _ => envoy_phrase(status.as_u16()),
        };
        out.extend_from_slice(phrase.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let mut framing = None;
    let mut last = close;
    let mut wrote_date = false;
    let mut noticed = !notice;
    let headers = resp.headers();
    // Values of one name are adjacent in the iteration; `first` marks the first of them.
    let mut previous: Option<&HeaderName> = None;
    for (name, value) in headers {
        let first = previous != Some(name);
        previous = Some(name);
        match *name {
            header::CONTENT_LENGTH => match len {
                // Only the first value is written; the body's own length rules.
                Len::Known(n) if first => {
                    framing = Some(Framing::Length(n));
                    put_field(&mut out, name.as_str(), value.as_bytes());
                }
                Len::Unknown if first => {
                    let Some(n) = std::str::from_utf8(value.as_bytes())
                        .ok()
                        .and_then(|v| v.parse().ok())
                    else {
                        continue;
                    };
                    framing = Some(Framing::Length(n));
                    put_field(&mut out, name.as_str(), value.as_bytes());
                }
                // A finished body keeps its length header only in answer to a HEAD, or on a
                // 304 (the length of what the client has cached), as Envoy forwards it.
                Len::Ended if head_request || status == StatusCode::NOT_MODIFIED => {
                    framing = Some(Framing::Length(0));
                    put_field(&mut out, name.as_str(), value.as_bytes());
                }
                _ => {}
            },
            // The headers hyper's server writes on one line, values joined.
            header::TRANSFER_ENCODING if may_have_body && first => {
                framing = Some(Framing::Chunked);
                let mut joined = join(headers.get_all(name));
                if !ends_in_chunked(&joined) {
                    joined.extend_from_slice(b", chunked");
                }
                put_field(&mut out, name.as_str(), &joined);
            }
            header::CONNECTION if first => {
                let mut joined = join(headers.get_all(name));
                last |= super::has_token(&joined, b"close");
                if !noticed && !super::has_token(&joined, b"close") {
                    joined.extend_from_slice(b", close");
                }
                noticed = true;
                put_field(&mut out, name.as_str(), &joined);
            }
            header::TRAILER if may_have_body && first => {
                put_field(&mut out, name.as_str(), &join(headers.get_all(name)));
            }
            header::TRANSFER_ENCODING | header::CONNECTION | header::TRAILER => {}
            _ => {
                wrote_date |= *name == header::DATE;
                put_field(&mut out, name.as_str(), value.as_bytes());
            }
        }
    }
    let framing = match (framing, len) {
        (Some(f), _) => f,
        // Envoy's codec tells a HEAD without a length that the body would come chunked
        // (an informational header: no body follows).
        (None, _) if head_request && may_have_length => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Length(0)
        }
        (None, Len::Unknown) if may_have_body => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
        (None, Len::Unknown) => Framing::Length(0),
        (None, Len::Ended | Len::Known(0)) => {
            if may_have_body {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
            Framing::Length(0)
        }
        (None, Len::Known(n)) => {
            if may_have_length {
                // Writing into a Vec cannot fail.
                let _ = write!(out, "content-length: {n}\r\n");
            }
            Framing::Length(n)
        }
    };
    if !wrote_date {
        out.extend_from_slice(b"date: ");
        date::extend(&mut out);
        out.extend_from_slice(b"\r\n");
    }
    if !noticed {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Encoded {
        head: out,
        framing: if may_have_body {
            framing
        } else {
            Framing::Length(0)
        },
        last,
    }
}

/// Notes in `meter` the head hyper's HTTP/1 server is about to write for `resp` (a response
/// to a HEAD request when `head`): the same head this path writes, by the same rules.
pub(in crate::http) fn note_head(resp: &mut Response<Body>, head: bool, meter: &ConnWire) {
    let method = if head { Method::HEAD } else { Method::GET };
    let encoded = encode(resp, &method, false, false);
    meter.wrote_head(&encoded.head, encoded.framing == Framing::Chunked);
}

/// The values of one header joined by `, ` on one line, as hyper writes them.
fn join<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> Vec<u8> {
    let mut joined = Vec::new();
    for v in values {
        if !joined.is_empty() {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    joined
}

/// A body frame polled once without waiting (`None` when it is not ready yet).
fn ready_frame(body: &mut Body) -> Option<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
    match Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(frame) => Some(frame),
        Poll::Pending => None,
    }
}

/// Writes `$out` to `$stream` and, on a stream that holds writes (TLS), flushes it; whether
/// that succeeded. A macro, not an async fn, so the plaintext path keeps one future.
macro_rules! send {
    ($stream:expr, $out:expr) => {
        $stream.write_all($out).await.is_ok() && (!S::HOLDS_WRITES || $stream.flush().await.is_ok())
    };
}

/// The response's last bytes: as [`send!`], except that on a connection closing after it
/// (`$last`) they are only handed to the stream as far as it holds them: the caller's
/// shutdown then writes them with TLS's `close_notify` (one write, not two).
macro_rules! send_last {
    ($stream:expr, $out:expr, $last:expr) => {
        if $last {
            let held = $stream.hold($out);
            $stream.write_all(&$out[held..]).await.is_ok()
        } else {
            send!($stream, $out)
        }
    };
}

/// Writes `resp` to the request `asked` describes, with its trailers when `trailers` (the
/// connection manager's `enable_trailers`) and the body is chunked; returns whether the
/// connection may carry another request (it must close after a failed body, a short one, a
/// `close` either side asked, or a client that went away while the body streamed). While
/// waiting for body data the connection is read like while waiting for the response head (see
/// [`super::client_gone`]).
pub(super) async fn write<S: super::Downstream>(
    stream: &mut S,
    reading: &mut super::Reading,
    mut resp: Response<Body>,
    asked: &super::Asked,
    (trailers, meter): (bool, Option<&ConnWire>),
) -> bool {
    // Envoy answers a request whose body is still arriving and closes the connection after
    // the response (`connection: close`); its router then has no upstream service time to
    // report either.
    let unfinished = reading.body.incomplete();
    if unfinished {
        resp.headers_mut()
            .remove(&crate::http::router::UPSTREAM_SERVICE_TIME);
    }
    let encoded = encode(
        &mut resp,
        &asked.method,
        asked.close || unfinished,
        asked.notice,
    );
    if let Some(m) = meter {
        m.wrote_head(&encoded.head, encoded.framing == Framing::Chunked);
    }
    let mut body = resp.into_body();
    let mut out = encoded.head;
    let mut remaining = match encoded.framing {
        Framing::Length(0) => {
            return send_last!(stream, &out, encoded.last) && !encoded.last;
        }
        Framing::Length(n) => Some(n),
        Framing::Chunked => None,
    };
    // A body already complete (a small upstream response) goes out with the head in one write.
    let mut ready = ready_frame(&mut body);
    let mut trailer_fields = None;
    while remaining != Some(0) {
        let frame = match ready.take() {
            Some(frame) => frame,
            None => {
                if !send!(stream, &out) {
                    return false;
                }
                out.clear();
                tokio::select! {
                    biased;
                    frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)) => frame,
                    () = super::client_gone(stream, reading) => return false,
                }
            }
        };
        match frame {
            None => break,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "response body failed; closing the downstream connection");
                let _ = send_last!(stream, &out, true);
                return false;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if !put_data(stream, &mut out, data, &mut remaining).await {
                        return false;
                    }
                }
                // Trailers end the body; Envoy's HTTP/1 codec writes them only with
                // `enable_trailers`.
                Err(frame) if frame.is_trailers() => {
                    trailer_fields = frame.into_trailers().ok().filter(|_| trailers);
                    break;
                }
                Err(_) => {}
            },
        }
        if !out.is_empty() && remaining != Some(0) {
            ready = ready_frame(&mut body);
        }
    }
    match remaining {
        Some(0) => send_last!(stream, &out, encoded.last) && !encoded.last,
        Some(_) => {
            let _ = send_last!(stream, &out, true);
            false
        }
        None => {
            put_chunked_end(&mut out, trailer_fields.as_ref());
            send_last!(stream, &out, encoded.last) && !encoded.last
        }
    }
}

/// Queues (small) or writes (large) one data frame after what `out` holds.
async fn put_data<S: super::Downstream>(
    stream: &mut S,
    out: &mut Vec<u8>,
    mut data: Bytes,
    remaining: &mut Option<u64>,
) -> bool {
    if data.is_empty() {
        return true;
    }
    match remaining {
        Some(left) => {
            let take = (data.len() as u64).min(*left) as usize;
            data.truncate(take);
            *left -= take as u64;
        }
        None => put_chunk_start(out, data.len()),
    }
    if data.len() <= COPY_LIMIT {
        out.extend_from_slice(&data);
    } else {
        if stream.write_all(out).await.is_err() {
            return false;
        }
        out.clear();
        while data.has_remaining() {
            if stream.write_buf(&mut data).await.is_err() {
                return false;
            }
        }
    }
    if remaining.is_none() {
        out.extend_from_slice(b"\r\n");
    }
    true
}

/// Data up to this size is copied behind the head (one write); larger frames are written as
/// they are.
const COPY_LIMIT: usize = 16 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body;

    fn head_of(resp: Response<Body>, method: Method, close: bool) -> (String, Encoded) {
        let mut resp = resp;
        let encoded = encode(&mut resp, &method, close, false);
        let text = String::from_utf8(encoded.head.clone()).unwrap();
        let without_date = text
            .lines()
            .filter(|l| !l.starts_with("date: "))
            .collect::<Vec<_>>()
            .join("\n");
        (without_date, encoded)
    }

    fn response(
        status: u16,
        body: Body,
        headers: &[(&'static str, &'static str)],
    ) -> Response<Body> {
        let mut resp = Response::new(body);
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        for (n, v) in headers {
            resp.headers_mut().append(*n, HeaderValue::from_static(v));
        }
        resp
    }

    #[test]
    fn a_known_body_gets_its_length_and_envoys_reason_phrase() {
        let (head, enc) = head_of(response(418, body::full("hi"), &[]), Method::GET, false);
        assert_eq!(head, "HTTP/1.1 418 Unknown\ncontent-length: 2\n");
        assert_eq!(enc.framing, Framing::Length(2));
        assert!(!enc.last);
    }

    #[test]
    fn a_body_of_unknown_length_goes_chunked() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(1);
        drop(tx);
        let streamed = body::boxed(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let (head, enc) = head_of(response(200, streamed, &[]), Method::GET, false);
        assert_eq!(head, "HTTP/1.1 200 OK\ntransfer-encoding: chunked\n");
        assert_eq!(enc.framing, Framing::Chunked);
    }

    #[test]
    fn head_keeps_the_declared_length_and_sends_no_body() {
        let (head, enc) = head_of(
            response(200, body::empty(), &[("content-length", "42")]),
            Method::HEAD,
            false,
        );
        assert_eq!(head, "HTTP/1.1 200 OK\ncontent-length: 42\n");
        assert_eq!(enc.framing, Framing::Length(0));
    }

    #[test]
    fn head_without_a_length_says_chunked_and_sends_no_body() {
        let (head, enc) = head_of(response(404, body::empty(), &[]), Method::HEAD, false);
        assert_eq!(head, "HTTP/1.1 404 Not Found\ntransfer-encoding: chunked\n");
        assert_eq!(enc.framing, Framing::Length(0));
    }

    #[test]
    fn no_content_carries_no_length() {
        let (head, enc) = head_of(
            response(204, body::empty(), &[("content-length", "0")]),
            Method::GET,
            false,
        );
        assert!(!head.contains("content-length"), "{head}");
        assert_eq!(enc.framing, Framing::Length(0));
    }

    #[test]
    fn not_modified_keeps_the_upstream_length_and_sends_no_body() {
        let (head, enc) = head_of(
            response(304, body::empty(), &[("content-length", "42")]),
            Method::GET,
            false,
        );
        assert!(head.contains("content-length: 42\n"), "{head}");
        assert_eq!(enc.framing, Framing::Length(0));
    }

    #[test]
    fn an_empty_body_says_length_zero() {
        let (head, _) = head_of(response(503, body::empty(), &[]), Method::GET, false);
        assert_eq!(
            head,
            "HTTP/1.1 503 Service Unavailable\ncontent-length: 0\n"
        );
    }

    #[test]
    fn connection_values_share_one_line_and_close_is_echoed() {
        let resp = response(
            200,
            body::empty(),
            &[("connection", "x-a"), ("x-a", "1"), ("connection", "x-b")],
        );
        let (head, enc) = head_of(resp, Method::GET, true);
        assert!(head.contains("\nconnection: x-a, x-b, close\n"), "{head}");
        assert!(enc.last);
        let (_, enc) = head_of(
            response(200, body::empty(), &[("connection", "close")]),
            Method::GET,
            false,
        );
        assert!(enc.last, "an upstream close ends the connection too");
    }

    #[test]
    fn a_drain_notice_says_close_and_keeps_the_connection() {
        let mut resp = response(200, body::empty(), &[]);
        let enc = encode(&mut resp, &Method::GET, false, true);
        let head = String::from_utf8(enc.head).unwrap();
        assert!(head.ends_with("\r\nconnection: close\r\n\r\n"), "{head}");
        assert!(!enc.last);
        let mut resp = response(200, body::empty(), &[("connection", "x-a")]);
        let enc = encode(&mut resp, &Method::GET, false, true);
        let head = String::from_utf8(enc.head).unwrap();
        assert!(head.contains("\r\nconnection: x-a, close\r\n"), "{head}");
        assert!(!enc.last);
    }

    /// What the client reads of a chunked `ok` body ending in an `x-sum: 42` trailer.
    async fn written_with_trailers(enable_trailers: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("42"));
        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"ok"))),
            Ok(http_body::Frame::trailers(trailers)),
        ];
        let streamed = body::boxed(http_body_util::StreamBody::new(tokio_stream::iter(frames)));
        let resp = response(200, streamed, &[("trailer", "x-sum")]);
        let asked = super::super::Asked {
            method: Method::GET,
            close: true,
            notice: false,
        };
        let mut reading = super::super::Reading {
            buf: bytes::BytesMut::new(),
            limit: 1024,
            scan: Default::default(),
            body: Default::default(),
            meter: None,
        };
        assert!(
            !write(
                &mut server,
                &mut reading,
                resp,
                &asked,
                (enable_trailers, None)
            )
            .await
        );
        drop(server);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client, &mut out)
            .await
            .unwrap();
        assert!(out.contains("\r\ntrailer: x-sum\r\n"), "{out}");
        out
    }

    #[tokio::test]
    async fn trailers_end_a_chunked_body_written_only_when_enabled() {
        let out = written_with_trailers(false).await;
        assert!(out.ends_with("\r\n\r\n2\r\nok\r\n0\r\n\r\n"), "{out}");
        let out = written_with_trailers(true).await;
        assert!(
            out.ends_with("\r\n\r\n2\r\nok\r\n0\r\nx-sum: 42\r\n\r\n"),
            "{out}"
        );
    }

    #[test]
    fn a_date_is_added_unless_present() {
        let mut resp = response(200, body::empty(), &[]);
        let enc = encode(&mut resp, &Method::GET, false, false);
        assert!(String::from_utf8_lossy(&enc.head).contains("\r\ndate: "));
        let mut resp = response(
            200,
            body::empty(),
            &[("date", "Sun, 06 Nov 1994 08:49:37 GMT")],
        );
        let enc = encode(&mut resp, &Method::GET, false, false);
        let text = String::from_utf8_lossy(&enc.head).into_owned();
        assert_eq!(text.matches("date: ").count(), 1, "{text}");
    }
}
