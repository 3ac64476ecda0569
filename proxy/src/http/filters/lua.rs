//! `envoy.filters.http.lua` (configuration in `config::http_filter::lua`): a script's
//! `envoy_on_request(handle)` runs on each request, `envoy_on_response(handle)` on its
//! response, each as a coroutine that yields while the handle waits (the whole body, an HTTP
//! call). A runtime error is logged (`script log: ...`) and the stream goes on with what the
//! script changed before it, as in Envoy; `respond()` answers locally and ends the script, as
//! does a body too large to buffer (a request gets 413, a response is replaced by a 500).
//!
//! Lua states: Envoy keeps one per worker thread, globals shared by that worker's requests.
//! revoy's requests move between threads while they wait, so each script has a small pool of
//! states instead: a request borrows one for a coroutine and gives it back, so globals are
//! shared by the requests that happen to reuse a state. A request the filter has no entry
//! point for borrows nothing. The gauge `lua.lua_vm_count` counts the states alive (Envoy's
//! counts its one per script per thread, the main thread's included).
//!
//! The handle API is in [`handle`], `streamInfo():dynamicMetadata()` in
//! [`dynamic_metadata`]. Not supported (a Lua error saying so, never silently ignored):
//! changing the request pseudo-headers but `:path` (`:method`, `:authority`, `:scheme`), and
//! the methods revoy does not have.

mod dynamic_metadata;
mod handle;

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, header};
use http_body_util::BodyExt;

use super::{Encoder, Encoders, FilterRequest};
use crate::body::Body;
use crate::config::http_filter::lua::{
    self as config, FilterContext, LuaConfig, LuaPerRouteConfig, LuaScript, ON_REQUEST,
    ON_RESPONSE, PerRouteScript,
};
use crate::route::metadata::DynamicMetadata;
use crate::stats::{Counter, Gauge, Store};
use handle::{Flow, Handle, StreamCtx};

/// Idle states kept per script.
const IDLE_STATES: usize = 16;

/// The filter's runtime: its configuration and each script's idle states.
#[derive(Debug)]
pub(super) struct Lua {
    /// The filter's name: route metadata is read under it.
    name: Arc<str>,
    config: Arc<LuaConfig>,
    states: States,
    /// `lua.executions`: entry points run.
    executions: Counter,
    /// `lua.errors`: entry points that failed.
    errors: Counter,
}

/// The gauge of the Lua states alive, process-wide (Envoy's name).
const VM_COUNT: &str = "lua.lua_vm_count";

/// A Lua state, counted in [`VM_COUNT`] while it lives.
struct Vm {
    lua: mlua::Lua,
    count: Gauge,
}

impl Vm {
    fn new(count: &Gauge) -> Vm {
        count.inc();
        Vm {
            lua: mlua::Lua::new(),
            count: count.clone(),
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.count.dec();
    }
}

impl std::ops::Deref for Vm {
    type Target = mlua::Lua;

    fn deref(&self) -> &mlua::Lua {
        &self.lua
    }
}

/// Idle Lua states, by script (a per-route script's entry goes when its route does).
struct States {
    idle: Mutex<Vec<(Weak<LuaScript>, Vec<Vm>)>>,
    /// [`VM_COUNT`].
    count: Gauge,
}

impl std::fmt::Debug for States {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("States")
    }
}

impl States {
    fn new(store: &Store) -> States {
        States {
            idle: Mutex::default(),
            count: store.gauge(VM_COUNT),
        }
    }

    /// An idle state of `script`, or a new one with its top level run.
    fn take(&self, script: &Arc<LuaScript>) -> Option<Vm> {
        {
            let mut all = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|(s, _)| s.strong_count() > 0);
            if let Some((_, idle)) = all
                .iter_mut()
                .find(|(s, _)| std::ptr::eq(s.as_ptr(), Arc::as_ptr(script)))
                && let Some(lua) = idle.pop()
            {
                return Some(lua);
            }
        }
        let lua = Vm::new(&self.count);
        if let Err(e) = handle::define_globals(&lua) {
            tracing::error!("script load error: {}", config::message(&e));
            return None;
        }
        match LuaScript::run_top_level(&lua, &script.source) {
            Ok(()) => Some(lua),
            Err(e) => {
                tracing::error!("script load error: {}", config::message(&e));
                None
            }
        }
    }

    /// Gives `lua` back to `script`'s idle states.
    fn give_back(&self, script: &Arc<LuaScript>, lua: Vm) {
        let mut all = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        match all
            .iter_mut()
            .find(|(s, _)| std::ptr::eq(s.as_ptr(), Arc::as_ptr(script)))
        {
            Some((_, idle)) if idle.len() < IDLE_STATES => idle.push(lua),
            Some(_) => {}
            None => all.push((Arc::downgrade(script), vec![lua])),
        }
    }
}

/// A request's response, to run `envoy_on_response` on.
#[derive(Debug)]
pub(super) struct Pending {
    filter: Arc<Lua>,
    script: Arc<LuaScript>,
    ctx: Arc<StreamCtx>,
}

impl Lua {
    /// The runtime of `config` for the filter named `name`, its stats under
    /// `http.<stat_prefix>.lua.`.
    pub(super) fn new(
        name: Arc<str>,
        config: &Arc<LuaConfig>,
        store: &Store,
        stat_prefix: &str,
    ) -> Lua {
        let own = match config.stat_prefix.as_str() {
            "" => String::new(),
            p => format!("{p}."),
        };
        let counter = |n: &str| store.counter(&format!("http.{stat_prefix}.lua.{own}{n}"));
        Lua {
            name,
            config: config.clone(),
            states: States::new(store),
            executions: counter("executions"),
            errors: counter("errors"),
        }
    }

    /// The script that runs for this request (the route's, else the filter's default) and
    /// its filter context.
    fn script(
        &self,
        route: Option<&LuaPerRouteConfig>,
    ) -> Option<(Arc<LuaScript>, Option<Arc<FilterContext>>)> {
        let own = || self.config.filter_context.clone();
        let Some(route) = route else {
            return Some((self.config.default.clone()?, own()));
        };
        let script = match &route.script {
            PerRouteScript::Disabled => return None,
            PerRouteScript::Named(name) => self.config.named.get(name).cloned()?,
            PerRouteScript::Source(s) => s.clone(),
        };
        Some((script, route.filter_context.clone().or_else(own)))
    }

    /// Runs `envoy_on_request` on `req`; `Some` is the script's local reply.
    pub(super) async fn decode(
        self: &Arc<Self>,
        req: &mut FilterRequest<'_>,
        route: Option<&LuaPerRouteConfig>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let (script, context) = self.script(route)?;
        if !script.on_request && !script.on_response {
            return None;
        }
        let ctx = Arc::new(StreamCtx::new(&self.name, context, req));
        if script.on_response {
            // Pushed first: a local reply of the script passes through it, as in Envoy.
            encoders.0.push(Encoder::Lua(Pending {
                filter: self.clone(),
                script: script.clone(),
                ctx: ctx.clone(),
            }));
        }
        if !script.on_request {
            return None;
        }
        let flow = Flow::request(req);
        let flow = self.run(&script, ON_REQUEST, flow, &ctx).await;
        let flow = flow.lock().unwrap_or_else(|p| p.into_inner()).take();
        *req.metadata = flow.metadata;
        *req.headers = flow.headers;
        *req.body = flow.body.into_body(req.headers);
        if flow.reply.is_some() {
            return flow.reply;
        }
        if let Some(line) = flow.request_line.filter(|l| l.path_changed) {
            req.new_path = Some(line.path);
        }
        if flow.clear_route || (flow.headers_changed && self.config.clear_route_cache) {
            req.clear_route_cache = true;
        }
        None
    }

    /// Runs the script's `entry` with a handle on `flow`, logging a runtime error as Envoy
    /// does; returns the flow as the script left it.
    async fn run(
        &self,
        script: &Arc<LuaScript>,
        entry: &str,
        flow: Flow,
        ctx: &Arc<StreamCtx>,
    ) -> Arc<Mutex<Flow>> {
        let flow = Arc::new(Mutex::new(flow));
        self.executions.inc();
        let Some(lua) = self.states.take(script) else {
            self.errors.inc();
            return flow;
        };
        let result = async {
            let f: mlua::Function = lua.globals().get(entry)?;
            f.call_async::<()>(Handle::new(flow.clone(), ctx.clone()))
                .await
        }
        .await;
        if let Err(e) = result {
            let responded = flow
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .reply
                .is_some();
            if !responded {
                self.errors.inc();
                tracing::error!("script log: {}", config::message(&e));
            }
        }
        self.states.give_back(script, lua);
        flow
    }
}

impl Pending {
    /// Runs `envoy_on_response` on `resp` (and the request's dynamic `metadata`).
    pub(super) async fn encode(&self, resp: &mut Response<Body>, metadata: &mut DynamicMetadata) {
        let flow = Flow::response(resp, metadata);
        let flow = self
            .filter
            .run(&self.script, ON_RESPONSE, flow, &self.ctx)
            .await;
        let flow = flow.lock().unwrap_or_else(|p| p.into_inner()).take();
        *metadata = flow.metadata;
        if let Some(reply) = flow.reply {
            *resp = reply;
            return;
        }
        *resp.status_mut() = flow.status;
        *resp.headers_mut() = flow.headers;
        *resp.body_mut() = flow.body.into_body(resp.headers_mut());
    }
}

/// How much of a body `body()` buffers: Envoy's default `per_connection_buffer_limit_bytes`
/// (revoy has no buffer limit setting). Beyond it Envoy answers a request 413 and replaces a
/// response with a 500.
const BODY_LIMIT: usize = 1 << 20;

/// Why a body could not be read whole.
enum ReadError {
    /// It is larger than [`BODY_LIMIT`].
    TooLarge,
    /// It failed (the peer reset, ...).
    Failed,
}

/// A stream's body as the script left it.
enum BodyState {
    /// Not read: it streams on.
    Unread(Body),
    /// Read whole (the script waited for it), with its trailers.
    Read(Bytes, Option<HeaderMap>),
    /// Replaced by the script (`setBytes`).
    Replaced(Bytes, Option<HeaderMap>),
    /// Being iterated by `bodyChunks()`: the chunks read so far (as the script left them),
    /// then the rest still to come.
    Streamed(Vec<Bytes>, Body),
}

impl BodyState {
    /// Reads the body whole (once); `None` when it failed.
    /// Reads the body whole, up to [`BODY_LIMIT`].
    async fn read(mut body: Body) -> Result<(Bytes, Option<HeaderMap>), ReadError> {
        let mut data = bytes::BytesMut::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            match frame.map_err(|_| ReadError::Failed)?.into_data() {
                Ok(chunk) if data.len() + chunk.len() > BODY_LIMIT => {
                    return Err(ReadError::TooLarge);
                }
                Ok(chunk) => data.extend_from_slice(&chunk),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        Ok((data.freeze(), trailers))
    }

    /// The body to send on (`headers` get the `content-length` of a replaced body, which is
    /// no longer chunked).
    fn into_body(self, headers: &mut HeaderMap) -> Body {
        match self {
            BodyState::Unread(body) => body,
            // Unchanged, it goes on as it came: without a length when it had none.
            BodyState::Read(bytes, trailers) if !headers.contains_key(header::CONTENT_LENGTH) => {
                crate::body::without_length(with_trailers(bytes, trailers))
            }
            BodyState::Read(bytes, trailers) => with_trailers(bytes, trailers),
            // Passed on as it came, the chunks as the script left them.
            BodyState::Streamed(chunks, rest) => {
                let body = crate::body::prefixed(chunks.concat().into(), rest);
                if headers.contains_key(header::CONTENT_LENGTH) {
                    body
                } else {
                    crate::body::without_length(body)
                }
            }
            BodyState::Replaced(bytes, trailers) => {
                headers.remove(header::TRANSFER_ENCODING);
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                with_trailers(bytes, trailers)
            }
        }
    }
}

/// A whole body, then its trailers if it had some.
fn with_trailers(bytes: Bytes, trailers: Option<HeaderMap>) -> Body {
    let Some(trailers) = trailers else {
        return crate::body::full(bytes);
    };
    crate::body::boxed(
        http_body_util::Full::new(bytes).with_trailers(std::future::ready(Some(Ok::<
            _,
            std::convert::Infallible,
        >(
            trailers
        )))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_gauge_counts_the_states_alive_in_and_out_of_the_pool() {
        let store = Store::new();
        let states = States::new(&store);
        let gauge = store.gauge(VM_COUNT);
        let script = Arc::new(LuaScript::load("x = 1").expect("a script"));
        assert_eq!(gauge.value(), 0, "no state before a request needs one");
        let a = states.take(&script).expect("a state");
        let b = states.take(&script).expect("a second state");
        assert_eq!(gauge.value(), 2);
        states.give_back(&script, a);
        states.give_back(&script, b);
        assert_eq!(gauge.value(), 2, "idle states are kept");
        let reused = states.take(&script).expect("an idle state");
        assert_eq!(gauge.value(), 2, "taken from the pool, not made");
        drop(reused);
        assert_eq!(gauge.value(), 1, "a state dropped mid-request is gone");
        let many: Vec<Vm> = (0..IDLE_STATES + 3)
            .map(|_| states.take(&script).expect("a state"))
            .collect();
        assert_eq!(gauge.value(), (IDLE_STATES + 3) as u64);
        for vm in many {
            states.give_back(&script, vm);
        }
        assert_eq!(
            gauge.value(),
            IDLE_STATES as u64,
            "the pool keeps at most its idle limit"
        );
        drop(states);
        assert_eq!(gauge.value(), 0);
    }
}
