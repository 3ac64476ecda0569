//! The stream handle a Lua script gets (Envoy's `StreamHandleWrapper`) and the objects it
//! hands out: headers and trailers, the buffered body, stream info, the connection, route
//! metadata. Each is a Lua userdata sharing the stream's [`Flow`], which the filter takes
//! back when the script ends.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use mlua::{Lua, MetaMethod, Table, UserData, UserDataMethods, Value, Variadic};

use super::{BodyState, ReadError};
use crate::body::Body;
use crate::config::http_filter::lua::FilterContext;
use crate::http::filters::FilterRequest;
use crate::http::local_reply::local_reply;
use crate::route::metadata::DynamicMetadata;
use crate::shared::Shared;

/// What a script works on: one direction of a stream.
pub(super) struct Flow {
    /// The headers (without pseudo-headers).
    pub(super) headers: HeaderMap,
    /// The request's pseudo-headers (`None` on the response).
    pub(super) request_line: Option<RequestLine>,
    /// The response's status (on the request: unused).
    pub(super) status: StatusCode,
    /// The body.
    pub(super) body: BodyState,
    /// The local reply `respond()` asked for.
    pub(super) reply: Option<Response<Body>>,
    /// Whether the script changed the headers.
    pub(super) headers_changed: bool,
    /// Whether the script called `clearRouteCache()`.
    pub(super) clear_route: bool,
    /// The request's dynamic metadata, moved in while the script runs.
    pub(super) metadata: DynamicMetadata,
    /// How many times the script waited (`body()`, `bodyChunks()`, `httpCall()`,
    /// `trailers()`): header objects got before a wait are dead after it, as in Envoy.
    waits: u32,
    /// Whether `bodyChunks()` let the headers go on: they can no longer change.
    headers_continued: bool,
}

/// A request's pseudo-headers, in Envoy's order.
pub(super) struct RequestLine {
    authority: String,
    /// The path with query, as the script left it.
    pub(super) path: String,
    /// Whether the script replaced `:path`.
    pub(super) path_changed: bool,
    method: String,
    scheme: &'static str,
}

impl Flow {
    /// The request side of `req`, its headers, body and dynamic metadata moved in.
    pub(super) fn request(req: &mut FilterRequest<'_>) -> Flow {
        Flow {
            headers: std::mem::take(req.headers),
            request_line: Some(RequestLine {
                authority: req.authority.to_owned(),
                path: req.path.to_owned(),
                path_changed: false,
                method: req.method.as_str().to_owned(),
                scheme: if req.conn.down.tls.is_some() {
                    "https"
                } else {
                    "http"
                },
            }),
            status: StatusCode::OK,
            body: BodyState::Unread(std::mem::replace(req.body, crate::body::empty())),
            reply: None,
            headers_changed: false,
            clear_route: false,
            metadata: std::mem::take(req.metadata),
            waits: 0,
            headers_continued: false,
        }
    }

    /// The response side of `resp`, its headers, body and the request's dynamic `metadata`
    /// moved in.
    pub(super) fn response(resp: &mut Response<Body>, metadata: &mut DynamicMetadata) -> Flow {
        Flow {
            headers: std::mem::take(resp.headers_mut()),
            request_line: None,
            status: resp.status(),
            body: BodyState::Unread(std::mem::replace(resp.body_mut(), crate::body::empty())),
            reply: None,
            headers_changed: false,
            clear_route: false,
            metadata: std::mem::take(metadata),
            waits: 0,
            headers_continued: false,
        }
    }

    /// Moves what the script left out of the shared flow (the script's objects may outlive it).
    pub(super) fn take(&mut self) -> Flow {
        Flow {
            headers: std::mem::take(&mut self.headers),
            request_line: self.request_line.take(),
            status: self.status,
            body: std::mem::replace(&mut self.body, BodyState::Unread(crate::body::empty())),
            reply: self.reply.take(),
            headers_changed: self.headers_changed,
            clear_route: self.clear_route,
            metadata: std::mem::take(&mut self.metadata),
            waits: self.waits,
            headers_continued: self.headers_continued,
        }
    }
}

/// What the handle reports about the stream, fixed when it starts.
pub(super) struct StreamCtx {
    protocol: &'static str,
    local: std::net::SocketAddr,
    peer: std::net::SocketAddr,
    server_name: Option<String>,
    tls: Option<bool>,
    /// The route's metadata under the filter's name.
    metadata: Option<Arc<FilterContext>>,
    /// The filter context (`filterContext()`).
    context: Option<Arc<FilterContext>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StreamCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCtx")
            .field("protocol", &self.protocol)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl StreamCtx {
    /// The facts of `req` for the filter named `name`, with its filter `context`.
    pub(super) fn new(
        name: &str,
        context: Option<Arc<FilterContext>>,
        req: &FilterRequest<'_>,
    ) -> StreamCtx {
        let tls = req.conn.down.tls.as_deref();
        StreamCtx {
            protocol: match req.version {
                http::Version::HTTP_10 => "HTTP/1.0",
                http::Version::HTTP_2 => "HTTP/2",
                http::Version::HTTP_3 => "HTTP/3",
                _ => "HTTP/1.1",
            },
            local: req.conn.local,
            peer: req.conn.down.peer,
            server_name: tls.and_then(|t| t.server_name()).map(|s| s.to_string()),
            tls: tls.map(|t| t.presented()),
            metadata: req
                .route
                .and_then(|r| r.route.metadata.as_deref())
                .and_then(|m| m.get(name))
                .and_then(|v| v.as_object())
                .map(|m| Arc::new(m.clone())),
            context,
            shared: req.conn.shared.clone(),
        }
    }
}

/// A Lua error saying what revoy does not do.
fn unsupported(what: &str) -> mlua::Error {
    mlua::Error::runtime(format!("{what} is not supported by revoy"))
}

/// Locks the flow (a script's panic never leaves it half-changed in a way that matters).
fn lock(flow: &Mutex<Flow>) -> MutexGuard<'_, Flow> {
    flow.lock().unwrap_or_else(|p| p.into_inner())
}

/// The handle passed to `envoy_on_request` / `envoy_on_response`.
pub(super) struct Handle {
    flow: Arc<Mutex<Flow>>,
    ctx: Arc<StreamCtx>,
}

impl Handle {
    /// A handle on `flow`.
    pub(super) fn new(flow: Arc<Mutex<Flow>>, ctx: Arc<StreamCtx>) -> Handle {
        Handle { flow, ctx }
    }

    /// Reads the body whole if nobody has yet; whether there is one (a stream that ended
    /// with its headers has none).
    async fn read_body(flow: &Mutex<Flow>) -> mlua::Result<bool> {
        let body = {
            let mut f = lock(flow);
            match &mut f.body {
                BodyState::Unread(b) if http_body::Body::is_end_stream(b) => return Ok(false),
                BodyState::Unread(b) => (Vec::new(), std::mem::replace(b, crate::body::empty())),
                BodyState::Streamed(chunks, rest) => (
                    std::mem::take(chunks),
                    std::mem::replace(rest, crate::body::empty()),
                ),
                _ => return Ok(true),
            }
        };
        let (chunks, body) = body;
        let read = BodyState::read(crate::body::prefixed(chunks.concat().into(), body)).await;
        let mut f = lock(flow);
        f.waits += 1;
        match read {
            Ok((bytes, trailers)) => {
                f.body = BodyState::Read(bytes, trailers);
                Ok(true)
            }
            Err(ReadError::TooLarge) => {
                // Ends the script with Envoy's answer, not logged as a script error.
                f.reply = Some(if f.request_line.is_some() {
                    local_reply(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large")
                } else {
                    local_reply(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
                });
                Err(mlua::Error::runtime(
                    "the body is larger than the buffer limit",
                ))
            }
            Err(ReadError::Failed) => {
                Err(mlua::Error::runtime("the body failed while it was read"))
            }
        }
    }
}

impl UserData for Handle {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("headers", |_, this, ()| {
            Ok(Headers {
                flow: this.flow.clone(),
                trailers: false,
                made_after: lock(&this.flow).waits,
            })
        });
        methods.add_async_method("body", |_, this, ()| {
            let flow = this.flow.clone();
            async move {
                Ok(Handle::read_body(&flow)
                    .await?
                    .then_some(BodyBuffer { flow }))
            }
        });
        methods.add_method("bodyChunks", |lua, this, ()| {
            let flow = this.flow.clone();
            lua.create_async_function(move |_, _: Variadic<Value>| {
                let flow = flow.clone();
                async move { next_chunk(&flow).await }
            })
        });
        methods.add_method("base64Escape", |_, _, input: mlua::LuaString| {
            Ok(base64::engine::general_purpose::STANDARD.encode(input.as_bytes()))
        });
        methods.add_method("timestamp", |_, _, resolution: Option<i64>| {
            if resolution.is_some_and(|r| r != MILLISECOND) {
                return Err(mlua::Error::runtime(
                    "timestamp format must be MILLISECOND.",
                ));
            }
            Ok(since_epoch().as_millis() as f64)
        });
        methods.add_method("timestampString", |_, _, resolution: Option<i64>| {
            let now = since_epoch();
            match resolution.unwrap_or(MILLISECOND) {
                MILLISECOND => Ok(now.as_millis().to_string()),
                MICROSECOND => Ok(now.as_micros().to_string()),
                _ => Err(mlua::Error::runtime(
                    "timestamp format must be MILLISECOND or MICROSECOND.",
                )),
            }
        });
        for name in [
            "connectionStreamInfo",
            "importPublicKey",
            "verifySignature",
            "setUpstreamOverrideHost",
            "virtualHost",
            "route",
        ] {
            methods.add_method(name, move |_, _, _: Variadic<Value>| -> mlua::Result<()> {
                Err(unsupported(&format!("{name}()")))
            });
        }
        methods.add_async_method("trailers", |_, this, ()| {
            let flow = this.flow.clone();
            async move {
                Handle::read_body(&flow).await?;
                let has = matches!(
                    &lock(&flow).body,
                    BodyState::Read(_, Some(_)) | BodyState::Replaced(_, Some(_))
                );
                let made_after = lock(&flow).waits;
                Ok(has.then_some(Headers {
                    flow,
                    trailers: true,
                    made_after,
                }))
            }
        });
        methods.add_method(
            "respond",
            |_, this, (headers, body): (Table, Option<mlua::LuaString>)| {
                respond(this, &headers, body)
            },
        );
        methods.add_async_method(
            "httpCall",
            |lua, this, (cluster, headers, body, options, asynchronous): HttpCallArgs| {
                let call =
                    HttpCall::new(&this.ctx, &cluster, &headers, body, options, asynchronous);
                let flow = this.flow.clone();
                async move {
                    let call = call?;
                    let waits = !call.asynchronous;
                    let answer = call.run(&lua).await;
                    if waits {
                        lock(&flow).waits += 1;
                    }
                    answer
                }
            },
        );
        for (name, level) in [
            ("logTrace", tracing::Level::TRACE),
            ("logDebug", tracing::Level::DEBUG),
            ("logInfo", tracing::Level::INFO),
            ("logWarn", tracing::Level::WARN),
            ("logErr", tracing::Level::ERROR),
            ("logCritical", tracing::Level::ERROR),
        ] {
            methods.add_method(name, move |_, _, message: mlua::LuaString| {
                let message = message.to_string_lossy();
                match level {
                    tracing::Level::TRACE => tracing::trace!("script log: {message}"),
                    tracing::Level::DEBUG => tracing::debug!("script log: {message}"),
                    tracing::Level::INFO => tracing::info!("script log: {message}"),
                    tracing::Level::WARN => tracing::warn!("script log: {message}"),
                    _ => tracing::error!("script log: {message}"),
                }
                Ok(())
            });
        }
        methods.add_method("clearRouteCache", |_, this, ()| {
            lock(&this.flow).clear_route = true;
            Ok(())
        });
        methods.add_method("streamInfo", |_, this, ()| {
            Ok(Info(this.ctx.clone(), this.flow.clone()))
        });
        methods.add_method("connection", |_, this, ()| {
            Ok(Info(this.ctx.clone(), this.flow.clone()))
        });
        methods.add_method("metadata", |_, this, ()| {
            Ok(Metadata(this.ctx.metadata.clone()))
        });
        methods.add_method("filterContext", |_, this, ()| {
            Ok(Metadata(this.ctx.context.clone()))
        });
    }
}

/// `respond(headers, body)`: the local reply that ends the request; the script stops here.
fn respond(handle: &Handle, headers: &Table, body: Option<mlua::LuaString>) -> mlua::Result<()> {
    let mut f = lock(&handle.flow);
    if f.request_line.is_none() {
        return Err(mlua::Error::runtime(
            "respond() is only available in envoy_on_request",
        ));
    }
    let status: String = headers
        .get::<Option<String>>(":status")?
        .ok_or_else(|| mlua::Error::runtime(":status must be set in respond() headers"))?;
    let status = status
        .parse::<u16>()
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| mlua::Error::runtime(format!("invalid :status '{status}'")))?;
    let text = body.map(|b| b.to_string_lossy()).unwrap_or_default();
    let mut reply = local_reply(status, &text);
    for (name, value) in header_entries(headers)? {
        if name.starts_with(':') {
            continue;
        }
        reply.headers_mut().append(header_name(&name)?, value);
    }
    f.reply = Some(reply);
    // Ends the coroutine; the filter sees the reply and does not log this as an error.
    Err(mlua::Error::runtime("respond() ended the script"))
}

/// A header table's entries (a value may be a string or an array of strings).
fn header_entries(table: &Table) -> mlua::Result<Vec<(String, HeaderValue)>> {
    let mut out = Vec::new();
    for pair in table.pairs::<String, Value>() {
        let (name, value) = pair?;
        let values: Vec<mlua::LuaString> = match value {
            Value::Table(t) => t.sequence_values().collect::<mlua::Result<_>>()?,
            Value::String(s) => vec![s],
            other => {
                return Err(mlua::Error::runtime(format!(
                    "header values must be strings, not {}",
                    other.type_name()
                )));
            }
        };
        for v in values {
            let v = HeaderValue::from_bytes(&v.as_bytes())
                .map_err(|_| mlua::Error::runtime(format!("invalid header value for: {name}")))?;
            out.push((name.to_ascii_lowercase(), v));
        }
    }
    Ok(out)
}

/// `name` as a header name, or a Lua error.
fn header_name(name: &str) -> mlua::Result<HeaderName> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| mlua::Error::runtime(format!("invalid header name: {name}")))
}

/// `headers()` / `trailers()`.
struct Headers {
    flow: Arc<Mutex<Flow>>,
    trailers: bool,
    /// The flow's `waits` when the object was made.
    made_after: u32,
}

impl Headers {
    /// Runs `f` on the map (the trailers: an empty map when there are none); an object made
    /// before the script last waited is dead.
    fn with<R>(
        &self,
        f: impl FnOnce(&mut HeaderMap, &mut Flow) -> mlua::Result<R>,
    ) -> mlua::Result<R> {
        let mut flow = lock(&self.flow);
        let flow = &mut *flow;
        if flow.waits != self.made_after {
            return Err(mlua::Error::runtime("object used outside of proper scope"));
        }
        if self.trailers {
            let mut none = HeaderMap::new();
            let map = match &mut flow.body {
                BodyState::Read(_, Some(t)) | BodyState::Replaced(_, Some(t)) => t,
                _ => &mut none,
            };
            let mut map = std::mem::take(map);
            let r = f(&mut map, &mut Flow::placeholder());
            match &mut flow.body {
                BodyState::Read(_, Some(t)) | BodyState::Replaced(_, Some(t)) => *t = map,
                _ => {}
            }
            r
        } else {
            let mut map = std::mem::take(&mut flow.headers);
            let r = f(&mut map, flow);
            flow.headers = map;
            r
        }
    }

    /// The values of `name`, pseudo-headers included.
    fn values(&self, lua: &Lua, name: &str) -> mlua::Result<Vec<mlua::LuaString>> {
        self.with(|map, flow| {
            if let Some(p) = name.strip_prefix(':') {
                let value = pseudo(flow, p).filter(|_| !self.trailers);
                return value.map(|v| lua.create_string(v)).into_iter().collect();
            }
            if flow.request_line.is_some() && name == "host" {
                // Envoy's `:authority`.
                return Ok(Vec::new());
            }
            map.get_all(name)
                .iter()
                .map(|v| lua.create_string(v.as_bytes()))
                .collect()
        })
    }

    /// Changes the headers (`change` gets the map and the parsed name and value).
    fn change(
        &self,
        name: &str,
        value: Option<&[u8]>,
        change: impl FnOnce(&mut HeaderMap, HeaderName, Option<HeaderValue>),
    ) -> mlua::Result<()> {
        let value = value
            .map(|v| {
                HeaderValue::from_bytes(v)
                    .map_err(|_| mlua::Error::runtime(format!("invalid header value for: {name}")))
            })
            .transpose()?;
        let trailers = self.trailers;
        self.with(|map, flow| {
            if flow.headers_continued && !trailers {
                return Err(mlua::Error::runtime("header map can no longer be modified"));
            }
            if name.starts_with(':') {
                return set_pseudo(flow, name, value, trailers);
            }
            let header = header_name(name)?;
            change(map, header, value);
            flow.headers_changed = true;
            Ok(())
        })
    }
}

impl Flow {
    /// A flow standing in where there is none (the trailers' pseudo-headers).
    fn placeholder() -> Flow {
        Flow {
            headers: HeaderMap::new(),
            request_line: None,
            status: StatusCode::OK,
            body: BodyState::Unread(crate::body::empty()),
            reply: None,
            headers_changed: false,
            clear_route: false,
            metadata: DynamicMetadata::default(),
            waits: 0,
            headers_continued: false,
        }
    }
}

/// The pseudo-header `name` (without its `:`) of `flow`.
fn pseudo(flow: &Flow, name: &str) -> Option<String> {
    match (&flow.request_line, name) {
        (Some(l), "authority") => Some(l.authority.clone()),
        (Some(l), "path") => Some(l.path.clone()),
        (Some(l), "method") => Some(l.method.clone()),
        (Some(l), "scheme") => Some(l.scheme.to_owned()),
        (None, "status") => Some(flow.status.as_str().to_owned()),
        _ => None,
    }
}

/// Sets or removes a pseudo-header: only the request's `:path` and the response's `:status`
/// can change.
fn set_pseudo(
    flow: &mut Flow,
    name: &str,
    value: Option<HeaderValue>,
    trailers: bool,
) -> mlua::Result<()> {
    if let (Some(line), ":path", false) = (&mut flow.request_line, name, trailers) {
        let path = value
            .and_then(|v| v.to_str().ok().map(str::to_owned))
            .filter(|p| http::uri::PathAndQuery::try_from(p.as_str()).is_ok())
            .ok_or_else(|| mlua::Error::runtime("invalid :path"))?;
        line.path = path;
        line.path_changed = true;
        flow.headers_changed = true;
        return Ok(());
    }
    if trailers || flow.request_line.is_some() || name != ":status" {
        return Err(unsupported(&format!("changing {name}")));
    }
    let status = value
        .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| mlua::Error::runtime("invalid :status"))?;
    flow.status = status;
    Ok(())
}

impl UserData for Headers {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        // An absent header is no value at all (not `nil`), as in Envoy.
        methods.add_method("get", |lua, this, name: String| {
            let values = this.values(lua, &name.to_ascii_lowercase())?;
            if values.len() < 2 {
                return Ok(Variadic::from_iter(values));
            }
            let joined: Vec<Vec<u8>> = values.iter().map(|v| v.as_bytes().to_vec()).collect();
            Ok(Variadic::from_iter([
                lua.create_string(joined.join(&b","[..]))?
            ]))
        });
        methods.add_method("getAtIndex", |lua, this, (name, i): (String, i64)| {
            let values = this.values(lua, &name.to_ascii_lowercase())?;
            let value = usize::try_from(i)
                .ok()
                .and_then(|i| values.into_iter().nth(i));
            Ok(Variadic::from_iter(value))
        });
        methods.add_method("getNumValues", |lua, this, name: String| {
            Ok(this.values(lua, &name.to_ascii_lowercase())?.len())
        });
        methods.add_method(
            "add",
            |_, this, (name, value): (String, mlua::LuaString)| {
                this.change(&name, Some(&value.as_bytes()), |map, n, v| {
                    map.append(n, v.expect("a value"));
                })
            },
        );
        methods.add_method(
            "replace",
            |_, this, (name, value): (String, mlua::LuaString)| {
                this.change(&name, Some(&value.as_bytes()), |map, n, v| {
                    map.insert(n, v.expect("a value"));
                })
            },
        );
        methods.add_method("remove", |_, this, name: String| {
            if name.starts_with(':') {
                return Err(unsupported(&format!("removing {name}")));
            }
            this.change(&name, None, |map, n, _| {
                map.remove(n);
            })
        });
        methods.add_method(
            "setHttp1ReasonPhrase",
            |_, _, _: Variadic<Value>| -> mlua::Result<()> {
                Err(unsupported("setHttp1ReasonPhrase()"))
            },
        );
        methods.add_meta_method(MetaMethod::Pairs, |lua, this, ()| {
            let entries: Vec<(String, Vec<u8>)> = this.with(|map, flow| {
                let pseudo: Vec<(String, Vec<u8>)> =
                    ["authority", "path", "method", "scheme", "status"]
                        .iter()
                        .filter(|_| !this.trailers)
                        .filter_map(|p| pseudo(flow, p).map(|v| (format!(":{p}"), v.into_bytes())))
                        .collect();
                Ok(pseudo
                    .into_iter()
                    .chain(
                        map.iter()
                            .filter(|(n, _)| {
                                flow.request_line.is_none() || *n != http::header::HOST
                            })
                            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())),
                    )
                    .collect())
            })?;
            iterate(lua, entries)
        });
    }
}

/// A `pairs` iterator over `entries`.
fn iterate(
    lua: &Lua,
    entries: Vec<(String, Vec<u8>)>,
) -> mlua::Result<(mlua::Function, Value, Value)> {
    let mut entries = entries.into_iter();
    let next = lua.create_function_mut(move |lua, _: Variadic<Value>| {
        Ok(match entries.next() {
            Some((n, v)) => (
                Value::String(lua.create_string(n)?),
                Value::String(lua.create_string(v)?),
            ),
            None => (Value::Nil, Value::Nil),
        })
    })?;
    Ok((next, Value::Nil, Value::Nil))
}

/// `body()`: the whole body, buffered.
struct BodyBuffer {
    flow: Arc<Mutex<Flow>>,
}

impl BodyBuffer {
    /// The body's bytes.
    fn bytes(&self) -> Bytes {
        match &lock(&self.flow).body {
            BodyState::Read(b, _) | BodyState::Replaced(b, _) => b.clone(),
            BodyState::Unread(_) | BodyState::Streamed(..) => Bytes::new(),
        }
    }
}

impl UserData for BodyBuffer {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("length", |_, this, ()| Ok(this.bytes().len()));
        methods.add_method("getBytes", |lua, this, (index, length): (i64, i64)| {
            lua.create_string(byte_range(&this.bytes(), index, length)?)
        });
        methods.add_method("setBytes", |_, this, data: mlua::LuaString| {
            let mut f = lock(&this.flow);
            let trailers =
                match std::mem::replace(&mut f.body, BodyState::Unread(crate::body::empty())) {
                    BodyState::Read(_, t) | BodyState::Replaced(_, t) => t,
                    BodyState::Unread(_) | BodyState::Streamed(..) => None,
                };
            f.body = BodyState::Replaced(Bytes::copy_from_slice(&data.as_bytes()), trailers);
            Ok(())
        });
    }
}

/// `EnvoyTimestampResolution.MILLISECOND`.
const MILLISECOND: i64 = 0;
/// `EnvoyTimestampResolution.MICROSECOND`.
const MICROSECOND: i64 = 1;

/// The globals Envoy defines in every script's state: `EnvoyTimestampResolution`.
pub(super) fn define_globals(lua: &Lua) -> mlua::Result<()> {
    let resolution = lua.create_table()?;
    resolution.set("MILLISECOND", MILLISECOND)?;
    resolution.set("MICROSECOND", MICROSECOND)?;
    lua.globals().set("EnvoyTimestampResolution", resolution)
}

/// The time since the Unix epoch (zero for a clock set before it).
fn since_epoch() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// The next step of a `bodyChunks()` iteration: the next chunk of the body as it arrives,
/// or nothing once it ended (at once, without waiting, for a stream without a body). The
/// headers go on before the first chunk is waited for, so they can no longer change; a chunk
/// lives until the script waits again. What the script does not read streams on after it.
async fn next_chunk(flow: &Arc<Mutex<Flow>>) -> mlua::Result<Option<Chunk>> {
    let (chunks, mut rest) = {
        let mut f = lock(flow);
        match std::mem::replace(&mut f.body, BodyState::Unread(crate::body::empty())) {
            BodyState::Unread(rest) if http_body::Body::is_end_stream(&rest) => {
                f.body = BodyState::Unread(rest);
                return Ok(None);
            }
            BodyState::Unread(rest) => {
                f.headers_continued = true;
                (Vec::new(), rest)
            }
            BodyState::Streamed(chunks, rest) => (chunks, rest),
            done => {
                f.body = done;
                return Ok(None);
            }
        }
    };
    let frame = rest.frame().await;
    let mut f = lock(flow);
    f.waits += 1;
    let data = match frame {
        Some(Ok(frame)) => match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                f.body = BodyState::Read(chunks.concat().into(), frame.into_trailers().ok());
                return Ok(None);
            }
        },
        None => {
            f.body = BodyState::Read(chunks.concat().into(), None);
            return Ok(None);
        }
        Some(Err(_)) => {
            f.body = BodyState::Streamed(chunks, rest);
            return Err(mlua::Error::runtime("the body failed while it was read"));
        }
    };
    let mut chunks = chunks;
    chunks.push(data);
    f.body = BodyState::Streamed(chunks, rest);
    Ok(Some(Chunk {
        flow: flow.clone(),
        made_after: f.waits,
    }))
}

/// A chunk `bodyChunks()` yields: a buffer over the chunk last read.
struct Chunk {
    flow: Arc<Mutex<Flow>>,
    /// The flow's `waits` when the chunk was read.
    made_after: u32,
}

impl Chunk {
    /// Runs `f` on the chunk; a chunk read before the script last waited is dead.
    fn with<R>(&self, f: impl FnOnce(&mut Bytes) -> mlua::Result<R>) -> mlua::Result<R> {
        let mut flow = lock(&self.flow);
        let live = flow.waits == self.made_after;
        match &mut flow.body {
            BodyState::Streamed(chunks, _) if live => f(chunks.last_mut().expect("a chunk")),
            _ => Err(mlua::Error::runtime("object used outside of proper scope")),
        }
    }
}

impl UserData for Chunk {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("length", |_, this, ()| this.with(|b| Ok(b.len())));
        methods.add_method("getBytes", |lua, this, (index, length): (i64, i64)| {
            this.with(|bytes| lua.create_string(byte_range(bytes, index, length)?))
        });
        methods.add_method("setBytes", |_, this, data: mlua::LuaString| {
            this.with(|b| {
                *b = Bytes::copy_from_slice(&data.as_bytes());
                Ok(())
            })
        });
    }
}

/// `getBytes(index, length)`'s bytes of `bytes`, or Envoy's error.
fn byte_range(bytes: &[u8], index: i64, length: i64) -> mlua::Result<&[u8]> {
    usize::try_from(index)
        .ok()
        .zip(usize::try_from(length).ok())
        .filter(|(i, l)| i.checked_add(*l).is_some_and(|end| end <= bytes.len()))
        .map(|(i, l)| &bytes[i..i + l])
        .ok_or_else(|| {
            mlua::Error::runtime(
                "index/length must be >= 0 and (index + length) must be <= buffer size",
            )
        })
}

/// `streamInfo()` and `connection()`.
struct Info(Arc<StreamCtx>, Arc<Mutex<Flow>>);

impl UserData for Info {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("protocol", |_, this, ()| Ok(this.0.protocol));
        methods.add_method("downstreamLocalAddress", |_, this, ()| {
            Ok(this.0.local.to_string())
        });
        methods.add_method("downstreamDirectRemoteAddress", |_, this, ()| {
            Ok(this.0.peer.to_string())
        });
        methods.add_method("downstreamDirectLocalAddress", |_, this, ()| {
            Ok(this.0.local.to_string())
        });
        for name in [
            "routeName",
            "virtualClusterName",
            "downstreamRemoteAddress",
            "dynamicTypedMetadata",
            "filterState",
            "drainConnectionUponCompletion",
        ] {
            methods.add_method(name, move |_, _, _: Variadic<Value>| -> mlua::Result<()> {
                Err(unsupported(&format!("{name}()")))
            });
        }
        methods.add_method("requestedServerName", |_, this, ()| {
            Ok(this.0.server_name.clone().unwrap_or_default())
        });
        methods.add_method("dynamicMetadata", |_, this, ()| {
            Ok(super::dynamic_metadata::DynamicMetadataMap(this.1.clone()))
        });
        methods.add_method("ssl", |_, this, ()| Ok(this.0.tls.map(Ssl)));
        methods.add_method("downstreamSslConnection", |_, this, ()| {
            Ok(this.0.tls.map(Ssl))
        });
    }
}

/// `connection():ssl()` on a TLS connection: whether the client presented a certificate.
struct Ssl(bool);

impl UserData for Ssl {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("peerCertificatePresented", |_, this, ()| Ok(this.0));
    }
}

/// `metadata()` (the route's metadata under the filter's name) and `filterContext()`: a
/// struct read by key or iterated.
struct Metadata(Option<Arc<FilterContext>>);

impl UserData for Metadata {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("get", |lua, this, key: String| {
            // An absent key is no value at all, as in Envoy.
            match this.0.as_ref().and_then(|m| m.get(&key)) {
                Some(v) => Ok(Variadic::from_iter([json_to_lua(lua, v)?])),
                None => Ok(Variadic::new()),
            }
        });
        methods.add_meta_method(MetaMethod::Pairs, |lua, this, ()| {
            let map = this.0.as_deref().cloned().unwrap_or_default();
            let mut entries = map.into_iter();
            let next = lua.create_function_mut(move |lua, _: Variadic<Value>| {
                Ok(match entries.next() {
                    Some((k, v)) => (Value::String(lua.create_string(k)?), json_to_lua(lua, &v)?),
                    None => (Value::Nil, Value::Nil),
                })
            })?;
            Ok((next, Value::Nil, Value::Nil))
        });
    }
}

/// A JSON value (from a `Struct`) as Lua sees it.
fn json_to_lua(lua: &Lua, v: &serde_json::Value) -> mlua::Result<Value> {
    Ok(match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Boolean(*b),
        serde_json::Value::Number(n) => Value::Number(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Value::String(lua.create_string(s)?),
        serde_json::Value::Array(a) => {
            let t = lua.create_table()?;
            for (i, v) in a.iter().enumerate() {
                t.raw_set(i + 1, json_to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
        serde_json::Value::Object(o) => {
            let t = lua.create_table()?;
            for (k, v) in o {
                t.raw_set(k.as_str(), json_to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
    })
}

/// `httpCall`'s arguments: cluster, headers, body, timeout in ms or an options table, and
/// `asynchronous`.
type HttpCallArgs = (
    String,
    Table,
    Option<mlua::LuaString>,
    Option<Value>,
    Option<bool>,
);

/// An HTTP call to a cluster, ready to send.
struct HttpCall {
    shared: Arc<Shared>,
    cluster: String,
    request: Request<Body>,
    timeout: Option<Duration>,
    asynchronous: bool,
}

impl HttpCall {
    /// The call the script asked for.
    fn new(
        ctx: &StreamCtx,
        cluster: &str,
        headers: &Table,
        body: Option<mlua::LuaString>,
        options: Option<Value>,
        asynchronous: Option<bool>,
    ) -> mlua::Result<HttpCall> {
        if ctx.shared.clusters.get(cluster).is_none() {
            return Err(mlua::Error::runtime(
                "http call cluster invalid. Must be configured",
            ));
        }
        let (timeout_ms, asynchronous) = match options {
            Some(Value::Table(t)) => (
                t.get::<Option<u64>>("timeout_ms")?.unwrap_or(0),
                t.get::<Option<bool>>("asynchronous")?.unwrap_or(false),
            ),
            Some(Value::Integer(ms)) => (
                u64::try_from(ms).unwrap_or(0),
                asynchronous.unwrap_or(false),
            ),
            Some(Value::Number(ms)) => (ms.max(0.0) as u64, asynchronous.unwrap_or(false)),
            _ => (0, asynchronous.unwrap_or(false)),
        };
        let entries = header_entries(headers)?;
        let find = |p: &str| {
            entries
                .iter()
                .find(|(n, _)| n == p)
                .and_then(|(_, v)| v.to_str().ok())
                .map(str::to_owned)
        };
        let (Some(method), Some(path), Some(authority)) =
            (find(":method"), find(":path"), find(":authority"))
        else {
            return Err(mlua::Error::runtime(
                "http call headers must include ':path', ':method', and ':authority'",
            ));
        };
        let body = body
            .map(|b| Bytes::copy_from_slice(&b.as_bytes()))
            .unwrap_or_default();
        let mut builder = Request::builder()
            .method(
                Method::from_bytes(method.as_bytes())
                    .map_err(|_| mlua::Error::runtime(format!("invalid :method {method}")))?,
            )
            .uri(path.as_str())
            .header(http::header::HOST, authority.as_str());
        if !body.is_empty() {
            builder = builder.header(http::header::CONTENT_LENGTH, body.len());
        }
        for (name, value) in entries.into_iter().filter(|(n, _)| !n.starts_with(':')) {
            builder = builder.header(header_name(&name)?, value);
        }
        // Envoy's HTTP client marks its own requests internal, from this machine.
        builder = builder.header("x-envoy-internal", "true");
        if let Some(ip) = crate::http::forwarding::machine_address() {
            builder = builder.header("x-forwarded-for", ip.to_string());
        }
        let request = builder
            .body(crate::body::full(body))
            .map_err(|e| mlua::Error::runtime(format!("invalid http call: {e}")))?;
        Ok(HttpCall {
            shared: ctx.shared.clone(),
            cluster: cluster.to_owned(),
            request,
            timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
            asynchronous,
        })
    }

    /// Sends the call; the response's headers (`:status` among them) and body (a failure's
    /// as Envoy's router answers it), or nothing for an asynchronous call.
    async fn run(self, lua: &Lua) -> mlua::Result<(Option<HttpResponse>, Option<mlua::LuaString>)> {
        let asynchronous = self.asynchronous;
        let exchange = self.exchange();
        if asynchronous {
            tokio::spawn(exchange);
            return Ok((None, None));
        }
        let (status, headers, body) = exchange.await;
        let body = (!body.is_empty())
            .then(|| lua.create_string(&body))
            .transpose()?;
        Ok((Some(HttpResponse(status, headers)), body))
    }

    /// The exchange with the cluster: the response, or the local reply for a failure or a
    /// timeout.
    async fn exchange(self) -> (StatusCode, HeaderMap, Bytes) {
        let Some(cluster) = self.shared.clusters.get(&self.cluster) else {
            return failure(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream");
        };
        let lb = crate::upstream::LbContext {
            internal: true,
            ..Default::default()
        };
        let exchange = async {
            let resp = match cluster.request(self.request, &lb).await {
                Ok(resp) => resp,
                Err(e) => return failure(e.local_reply_status(), &e.local_reply_body()),
            };
            let (head, body) = resp.into_parts();
            match body.collect().await {
                Ok(body) => (head.status, head.headers, body.to_bytes()),
                Err(_) => failure(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream connect error or disconnect/reset before headers. reset reason: remote reset",
                ),
            }
        };
        match self.timeout {
            Some(t) => tokio::time::timeout(t, exchange).await.unwrap_or_else(|_| {
                failure(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout")
            }),
            None => exchange.await,
        }
    }
}

/// The answer to a call that failed: the local reply Envoy's HTTP client gets from its
/// router.
fn failure(status: StatusCode, text: &str) -> (StatusCode, HeaderMap, Bytes) {
    let reply = local_reply(status, text);
    (
        status,
        reply.headers().clone(),
        Bytes::copy_from_slice(text.as_bytes()),
    )
}

/// An HTTP call's response headers, as the table the script gets.
struct HttpResponse(StatusCode, HeaderMap);

impl mlua::IntoLua for HttpResponse {
    fn into_lua(self, lua: &Lua) -> mlua::Result<Value> {
        let t = lua.create_table()?;
        t.raw_set(":status", self.0.as_str())?;
        for (name, value) in &self.1 {
            if t.raw_get::<Value>(name.as_str())?.is_nil() {
                t.raw_set(name.as_str(), lua.create_string(value.as_bytes())?)?;
            }
        }
        Ok(Value::Table(t))
    }
}
