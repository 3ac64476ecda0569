//! Access-log formats: Envoy's command operators (`%RESPONSE_CODE%`, `%REQ(X?Y):Z%`...) in a
//! text line or a JSON object, rendered against a [`Record`] as Envoy renders them (`-` for a
//! missing value in text, `null` in JSON; numbers kept as numbers in JSON).

use std::fmt::Write;
use std::net::SocketAddr;
use std::time::Duration;

use super::record::{Record, WireBytes};
use crate::route::format::scan::{Compiled, scan};
use crate::route::format::{Machine, clock};

/// Envoy's format when a logger names none.
pub const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

/// A compiled access-log format.
#[derive(Debug, Clone, PartialEq)]
pub enum LogFormat {
    /// A text line (its own newline included, as written).
    Text {
        /// The template.
        template: Template,
        /// `omit_empty_values`: a missing value renders empty instead of `-`.
        omit_empty: bool,
    },
    /// One JSON object per line.
    Json {
        /// The object's members, sorted by key (as Envoy writes them).
        members: Vec<(String, JsonValue)>,
        /// `omit_empty_values`: members whose value is missing or empty are left out.
        omit_empty: bool,
    },
}

/// A value of a JSON format.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonValue {
    /// A template: one operator alone keeps its type, anything else renders a string.
    Template(Template),
    /// A constant (a number or bool from the configuration), already in JSON.
    Constant(String),
    /// A nested object, sorted by key.
    Object(Vec<(String, JsonValue)>),
}

/// Literal text and operators, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(Vec<Piece>);

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Op(Op, Option<usize>),
}

/// The formatter extensions a format's `formatters` enable.
#[derive(Debug, Clone, Copy, Default)]
pub struct Formatters {
    /// `envoy.formatter.req_without_query`: `%REQ_WITHOUT_QUERY(X?Y):Z%`.
    pub req_without_query: bool,
    /// `envoy.formatter.metadata`: `%METADATA(TYPE:NAMESPACE:KEY...):Z%`.
    pub metadata: bool,
    /// `%FILTER_STATE()%`: the format is rendered with the connection's filter state (access
    /// logs and local replies; a network rate limit's descriptors are rendered before it is
    /// set).
    pub filter_state: bool,
}

/// A command operator.
#[derive(Debug, Clone, PartialEq)]
enum Op {
    StartTime(String),
    Req(Lookup),
    /// A request header's value without its query string.
    ReqWithoutQuery(Lookup),
    /// `%FILTER_STATE(KEY[:PLAIN|:TYPED])%` of a key revoy sets; `plain`: as a bare string,
    /// else as JSON (a quoted string in text).
    FilterState {
        key: &'static str,
        plain: bool,
    },
    Resp(Lookup),
    Trailer(Lookup),
    Protocol,
    ResponseCode,
    ResponseCodeDetails,
    ResponseFlags,
    ResponseFlagsLong,
    BytesReceived,
    BytesSent,
    DownstreamWireReceived,
    DownstreamWireSent,
    DownstreamHeaderReceived,
    DownstreamHeaderSent,
    UpstreamWireSent,
    UpstreamWireReceived,
    UpstreamHeaderSent,
    UpstreamHeaderReceived,
    Duration,
    RequestDuration,
    ResponseDuration,
    ResponseTxDuration,
    UpstreamHost,
    UpstreamCluster,
    UpstreamLocal(Part),
    UpstreamRemote(Part),
    UpstreamTransportFailureReason,
    DownstreamRemote(Part),
    DownstreamDirectRemote(Part),
    DownstreamLocal(Part),
    RequestedServerName,
    RouteName,
    ConnectionTerminationDetails,
    AttemptCount,
    LocalReplyBody,
    /// `%DYNAMIC_METADATA(NS:KEY:...)%`: the namespace and the path of keys into it.
    DynamicMetadata(String, Vec<String>),
    Constant(String),
}

/// Which part of an address an operator renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Full,
    Ip,
    Port,
}

/// The header a `REQ`/`RESP`/`TRAILER` operator reads, and its alternative.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lookup {
    name: String,
    fallback: Option<String>,
}

/// One rendered value.
enum Value {
    Missing,
    Str(String),
    Num(u64),
    /// A value already in JSON (metadata that is not a string): written as is in both.
    Json(String),
}

impl Template {
    /// Parses `format` with Envoy's grammar; errors name the operator at fault.
    pub fn parse(format: &str, machine: &dyn Machine) -> Result<Template, String> {
        Template::parse_with(format, machine, Formatters::default())
    }

    /// [`Template::parse`] with the operators of `formatters` too.
    pub fn parse_with(
        format: &str,
        machine: &dyn Machine,
        formatters: Formatters,
    ) -> Result<Template, String> {
        let pieces = scan(format, Piece::Text, |c| {
            let op = compile(c.name, c.param, c.length, machine, formatters)?;
            Ok(Compiled::Piece(Piece::Op(op, c.length)))
        })?;
        Ok(Template(pieces))
    }

    /// Whether an operator reads filter state.
    fn reads_filter_state(&self) -> bool {
        self.0
            .iter()
            .any(|p| matches!(p, Piece::Op(Op::FilterState { .. }, _)))
    }

    /// Renders as text: a missing value is `-` (empty when `omit_empty`).
    pub fn render_text(&self, rec: &Record, omit_empty: bool, out: &mut String) {
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Op(op, max) => match op.value(rec) {
                    Value::Missing if omit_empty => {}
                    Value::Missing => out.push('-'),
                    Value::Str(s) | Value::Json(s) => push_truncated(out, &s, *max),
                    Value::Num(n) => push_truncated(out, &n.to_string(), *max),
                },
            }
        }
    }

    /// Renders as a JSON value: one operator alone keeps its type (`null` when missing),
    /// anything else is a string. `None` when `omit_empty` and the value is missing or empty.
    fn render_json(&self, rec: &Record, omit_empty: bool, out: &mut String) -> bool {
        if let [Piece::Op(op, max)] = self.0.as_slice() {
            match op.value(rec) {
                Value::Missing if omit_empty => return false,
                Value::Missing => out.push_str("null"),
                Value::Num(n) if max.is_none() => {
                    let _ = write!(out, "{n}");
                }
                Value::Num(n) => push_json_str(out, truncated(&n.to_string(), *max)),
                Value::Str(s) if omit_empty && s.is_empty() => return false,
                Value::Str(s) => push_json_str(out, truncated(&s, *max)),
                Value::Json(j) if max.is_none() => out.push_str(&j),
                Value::Json(j) => push_json_str(out, truncated(&j, *max)),
            }
            return true;
        }
        let mut s = String::new();
        self.render_text(rec, false, &mut s);
        if omit_empty && s.is_empty() {
            return false;
        }
        push_json_str(out, &s);
        true
    }
}

impl JsonValue {
    fn reads_filter_state(&self) -> bool {
        match self {
            JsonValue::Template(t) => t.reads_filter_state(),
            JsonValue::Constant(_) => false,
            JsonValue::Object(members) => members.iter().any(|(_, v)| v.reads_filter_state()),
        }
    }
}

impl LogFormat {
    /// Whether the format reads filter state (`%FILTER_STATE()%`).
    pub fn reads_filter_state(&self) -> bool {
        match self {
            LogFormat::Text { template, .. } => template.reads_filter_state(),
            LogFormat::Json { members, .. } => members.iter().any(|(_, v)| v.reads_filter_state()),
        }
    }

    /// Envoy's default text format.
    pub fn default_text(machine: &dyn Machine) -> LogFormat {
        LogFormat::Text {
            template: Template::parse(DEFAULT_FORMAT, machine)
                .expect("Envoy's default access log format parses"),
            omit_empty: false,
        }
    }

    /// Renders one log line (JSON gets its newline).
    pub fn render(&self, rec: &Record) -> String {
        let mut out = String::with_capacity(256);
        match self {
            LogFormat::Text {
                template,
                omit_empty,
            } => template.render_text(rec, *omit_empty, &mut out),
            LogFormat::Json {
                members,
                omit_empty,
            } => {
                render_object(members, rec, *omit_empty, &mut out);
                out.push('\n');
            }
        }
        out
    }
}

fn render_object(
    members: &[(String, JsonValue)],
    rec: &Record,
    omit_empty: bool,
    out: &mut String,
) {
    out.push('{');
    let mut first = true;
    for (key, value) in members {
        let mark = out.len();
        if !first {
            out.push(',');
        }
        push_json_str(out, key);
        out.push(':');
        let kept = match value {
            JsonValue::Constant(c) => {
                out.push_str(c);
                true
            }
            JsonValue::Object(inner) => {
                render_object(inner, rec, omit_empty, out);
                true
            }
            JsonValue::Template(t) => t.render_json(rec, omit_empty, out),
        };
        if kept {
            first = false;
        } else {
            out.truncate(mark);
        }
    }
    out.push('}');
}

/// Writes `s` as a JSON string.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn truncated(s: &str, max: Option<usize>) -> &str {
    match max {
        Some(max) if s.len() > max => {
            let mut end = max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            &s[..end]
        }
        _ => s,
    }
}

fn push_truncated(out: &mut String, s: &str, max: Option<usize>) {
    out.push_str(truncated(s, max));
}

/// One of the request's upstream wire byte counts; `-` when nothing counted them.
fn upstream_wire(rec: &Record, count: fn(&WireBytes) -> u64) -> Value {
    rec.upstream_wire
        .as_ref()
        .map_or(Value::Missing, |w| Value::Num(count(w)))
}

fn millis(d: Option<Duration>) -> Value {
    d.map_or(Value::Missing, |d| Value::Num(d.as_millis() as u64))
}

fn addr(a: Option<SocketAddr>, part: Part) -> Value {
    match (a, part) {
        (None, _) => Value::Missing,
        (Some(a), Part::Full) => Value::Str(a.to_string()),
        (Some(a), Part::Ip) => Value::Str(a.ip().to_string()),
        (Some(a), Part::Port) => Value::Num(u64::from(a.port())),
    }
}

fn text(s: Option<&str>) -> Value {
    match s {
        Some(s) if !s.is_empty() => Value::Str(s.to_owned()),
        _ => Value::Missing,
    }
}

impl Lookup {
    fn find<'h>(&self, get: impl Fn(&str) -> Option<&'h str>) -> Value {
        text(get(&self.name).or_else(|| self.fallback.as_deref().and_then(&get)))
    }
}

impl Op {
    fn value(&self, rec: &Record) -> Value {
        match self {
            Op::StartTime(f) => Value::Str(clock::format(rec.start_time, f)),
            Op::Req(l) => request_header(rec, l),
            Op::FilterState { key, plain } => {
                let tls = rec.downstream.filter_state.as_deref();
                match tls.and_then(|t| t.filter_state(key)) {
                    None => Value::Missing,
                    Some(v) if *plain => Value::Str(v.to_owned()),
                    Some(v) => Value::Json(serde_json::Value::from(v).to_string()),
                }
            }
            Op::ReqWithoutQuery(l) => match request_header(rec, l) {
                Value::Str(v) => match v.split_once('?') {
                    Some((without, _)) => Value::Str(without.to_owned()),
                    None => Value::Str(v),
                },
                other => other,
            },
            Op::Resp(l) => {
                let status = rec.response_code.map(|c| c.to_string());
                l.find(|name| match name {
                    ":status" => status.as_deref(),
                    _ => rec.response_headers.as_ref()?.get(name)?.to_str().ok(),
                })
            }
            Op::Trailer(l) => {
                l.find(|name| rec.response_trailers.as_ref()?.get(name)?.to_str().ok())
            }
            Op::Protocol => text(rec.protocol),
            Op::ResponseCode => Value::Num(u64::from(rec.response_code.unwrap_or(0))),
            Op::ResponseCodeDetails => text(rec.details.as_deref()),
            Op::LocalReplyBody => Value::Str(rec.local_reply_body.clone().unwrap_or_default()),
            Op::ResponseFlags => Value::Str(rec.flags.render(false)),
            Op::ResponseFlagsLong => Value::Str(rec.flags.render(true)),
            Op::BytesReceived => Value::Num(rec.bytes_received),
            Op::BytesSent => Value::Num(rec.bytes_sent),
            Op::DownstreamWireReceived => Value::Num(rec.downstream_wire.received),
            Op::DownstreamWireSent => Value::Num(rec.downstream_wire.sent),
            Op::DownstreamHeaderReceived => Value::Num(rec.downstream_wire.header_received),
            Op::DownstreamHeaderSent => Value::Num(rec.downstream_wire.header_sent),
            Op::UpstreamWireSent => upstream_wire(rec, |w| w.sent),
            Op::UpstreamWireReceived => upstream_wire(rec, |w| w.received),
            Op::UpstreamHeaderSent => upstream_wire(rec, |w| w.header_sent),
            Op::UpstreamHeaderReceived => upstream_wire(rec, |w| w.header_received),
            Op::Duration => millis(rec.duration()),
            Op::RequestDuration => millis(rec.request_duration()),
            Op::ResponseDuration => millis(rec.response_duration()),
            Op::ResponseTxDuration => millis(rec.response_tx_duration()),
            Op::UpstreamHost => addr(rec.upstream_host, Part::Full),
            Op::UpstreamCluster => text(rec.upstream_cluster.as_deref()),
            Op::UpstreamLocal(p) => addr(rec.upstream_local, *p),
            Op::UpstreamRemote(p) => addr(rec.upstream_remote.or(rec.upstream_host), *p),
            Op::UpstreamTransportFailureReason => text(
                rec.upstream_transport_failure
                    .as_deref()
                    .map(|r| r.replace(' ', "_"))
                    .as_deref(),
            ),
            Op::DownstreamRemote(p) => addr(rec.downstream.remote, *p),
            Op::DownstreamDirectRemote(p) => {
                addr(rec.downstream.direct_remote.or(rec.downstream.remote), *p)
            }
            Op::DownstreamLocal(p) => addr(rec.downstream.local, *p),
            Op::RequestedServerName => text(rec.downstream.server_name.as_deref()),
            Op::RouteName => text(rec.route_name.as_deref()),
            Op::ConnectionTerminationDetails => text(rec.termination_details.as_deref()),
            Op::AttemptCount => Value::Num(u64::from(rec.attempts)),
            Op::DynamicMetadata(namespace, path) => metadata(rec, namespace, path),
            Op::Constant(s) => Value::Str(s.clone()),
        }
    }
}

/// The request header (or pseudo-header) `l` looks up.
fn request_header(rec: &Record, l: &Lookup) -> Value {
    match &rec.request {
        None => Value::Missing,
        Some(req) => l.find(|name| match name {
            ":method" => Some(req.method.as_str()),
            ":path" => Some(req.path.as_str()),
            ":authority" | "host" => Some(req.authority.as_str()),
            ":scheme" => Some(req.scheme),
            _ => req.headers.get(name)?.to_str().ok(),
        }),
    }
}

/// The request's metadata in `namespace` at `path` (the whole namespace when `path` is
/// empty): a string as text, anything else as JSON.
fn metadata(rec: &Record, namespace: &str, path: &[String]) -> Value {
    use crate::route::metadata::json;
    if path.is_empty() {
        return rec
            .metadata
            .namespace(namespace)
            .map_or(Value::Missing, |s| Value::Json(json::struct_json(s)));
    }
    match rec.metadata.value(namespace, path) {
        None => Value::Missing,
        Some(v) => match &v.kind {
            Some(proto::pb::google::protobuf::value::Kind::StringValue(s)) => Value::Str(s.clone()),
            _ => Value::Json(json::text(v)),
        },
    }
}

/// `%FILTER_STATE(KEY[:PLAIN|:TYPED])%`: revoy's only filter state is what `istio_authn`
/// sets; any other key, and a field of an object, are configuration errors.
fn filter_state(param: Option<&str>) -> Result<Op, String> {
    let keys = crate::filter_state::KEYS;
    let param = param
        .filter(|p| !p.is_empty())
        .ok_or("FILTER_STATE requires parameters")?;
    let mut parts = param.split(':');
    let name = parts.next().unwrap_or_default();
    let plain = match (parts.next(), parts.next()) {
        (None | Some("TYPED"), None) => false,
        (Some("PLAIN"), None) => true,
        _ => {
            return Err(format!(
                "%FILTER_STATE({param})%: revoy renders filter state whole, as JSON or PLAIN"
            ));
        }
    };
    let key = keys.into_iter().find(|k| *k == name).ok_or_else(|| {
        format!(
            "%FILTER_STATE({name})% is not supported by revoy: its only filter state is istio_authn's {}",
            keys.join(" and ")
        )
    })?;
    Ok(Op::FilterState { key, plain })
}

/// `%DYNAMIC_METADATA(NS:KEY...)%` of `param` (`NS:KEY...`).
fn dynamic_metadata(param: &str) -> Op {
    let mut parts = param.split(':').map(str::to_owned);
    let namespace = parts.next().unwrap_or_default();
    Op::DynamicMetadata(namespace, parts.collect())
}

/// `%METADATA(TYPE:NS:KEY...)%`: the request's dynamic metadata (`DYNAMIC`); revoy keeps no
/// other kind for access logs.
fn typed_metadata(param: Option<&str>) -> Result<Op, String> {
    let param = param.unwrap_or_default();
    match param.split_once(':') {
        Some(("DYNAMIC", rest)) if !rest.is_empty() => Ok(dynamic_metadata(rest)),
        Some((kind @ ("CLUSTER" | "ROUTE" | "UPSTREAM_HOST" | "LISTENER" | "VIRTUAL_HOST"), _)) => {
            Err(format!(
                "%METADATA({kind}:...)% is not supported by revoy: it keeps no {kind} metadata for access logs"
            ))
        }
        _ => Err(format!("Invalid METADATA parameters: '{param}'")),
    }
}

fn lookup(name: &str, param: Option<&str>) -> Result<Lookup, String> {
    let param = param
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("{name} requires parameters"))?;
    let mut alternatives = param.split('?');
    let main = alternatives.next().unwrap_or_default();
    let fallback = alternatives.next();
    if alternatives.next().is_some() {
        return Err(format!(
            "More than 1 alternative header specified in token: {param}"
        ));
    }
    Ok(Lookup {
        name: main.to_ascii_lowercase(),
        fallback: fallback.map(str::to_ascii_lowercase),
    })
}

fn compile(
    name: &str,
    param: Option<&str>,
    length: Option<usize>,
    machine: &dyn Machine,
    formatters: Formatters,
) -> Result<Op, String> {
    match name {
        "REQ" => return lookup(name, param).map(Op::Req),
        "REQ_WITHOUT_QUERY" if formatters.req_without_query => {
            return lookup(name, param).map(Op::ReqWithoutQuery);
        }
        "METADATA" if formatters.metadata => return typed_metadata(param),
        "REQ_WITHOUT_QUERY" | "METADATA" => {
            return Err(format!(
                "Not supported field in StreamInfo: {name} (it needs its formatter extension in `formatters`)"
            ));
        }
        "RESP" => return lookup(name, param).map(Op::Resp),
        "TRAILER" => return lookup(name, param).map(Op::Trailer),
        "START_TIME" => {
            if length.is_some() {
                return Err(format!("{name} does not allow length to be specified."));
            }
            let f = param
                .filter(|p| !p.is_empty())
                .unwrap_or(clock::DEFAULT_FORMAT);
            return Ok(Op::StartTime(f.to_owned()));
        }
        "ENVIRONMENT" => {
            let key = param
                .filter(|p| !p.is_empty())
                .ok_or_else(|| format!("{name} requires parameters"))?;
            return Ok(match machine.env(key) {
                Some(v) => Op::Constant(v),
                None => Op::Constant("-".to_owned()),
            });
        }
        "DYNAMIC_METADATA" => {
            let param = param
                .filter(|p| !p.is_empty())
                .ok_or_else(|| format!("{name} requires parameters"))?;
            return Ok(dynamic_metadata(param));
        }
        "FILTER_STATE" if formatters.filter_state => return filter_state(param),
        "FILTER_STATE" => {
            return Err(format!(
                "%{name}% is not supported by revoy here: it has filter state only for access log and local reply formats"
            ));
        }
        "CLUSTER_METADATA" | "UPSTREAM_METADATA" | "ROUTE_METADATA" | "UPSTREAM_FILTER_STATE" => {
            return Err(format!(
                "%{name}% is not supported by revoy: it keeps no {} for access logs",
                if name.contains("FILTER_STATE") {
                    "filter state"
                } else {
                    "metadata"
                }
            ));
        }
        _ => {}
    }
    if param.is_some() {
        return Err(format!("{name} does not take any parameters or length"));
    }
    use Part::{Full, Ip, Port};
    Ok(match name {
        "PROTOCOL" => Op::Protocol,
        "RESPONSE_CODE" => Op::ResponseCode,
        "LOCAL_REPLY_BODY" => Op::LocalReplyBody,
        "RESPONSE_CODE_DETAILS" => Op::ResponseCodeDetails,
        "RESPONSE_FLAGS" => Op::ResponseFlags,
        "RESPONSE_FLAGS_LONG" => Op::ResponseFlagsLong,
        "BYTES_RECEIVED" => Op::BytesReceived,
        "BYTES_SENT" => Op::BytesSent,
        "DOWNSTREAM_WIRE_BYTES_RECEIVED" => Op::DownstreamWireReceived,
        "DOWNSTREAM_WIRE_BYTES_SENT" => Op::DownstreamWireSent,
        "DOWNSTREAM_HEADER_BYTES_RECEIVED" => Op::DownstreamHeaderReceived,
        "DOWNSTREAM_HEADER_BYTES_SENT" => Op::DownstreamHeaderSent,
        "UPSTREAM_WIRE_BYTES_SENT" => Op::UpstreamWireSent,
        "UPSTREAM_WIRE_BYTES_RECEIVED" => Op::UpstreamWireReceived,
        "UPSTREAM_HEADER_BYTES_SENT" => Op::UpstreamHeaderSent,
        "UPSTREAM_HEADER_BYTES_RECEIVED" => Op::UpstreamHeaderReceived,
        "DURATION" => Op::Duration,
        "REQUEST_DURATION" => Op::RequestDuration,
        "RESPONSE_DURATION" => Op::ResponseDuration,
        "RESPONSE_TX_DURATION" => Op::ResponseTxDuration,
        "UPSTREAM_HOST" => Op::UpstreamHost,
        // revoy has no `alt_stat_name`: both name the cluster.
        "UPSTREAM_CLUSTER" | "UPSTREAM_CLUSTER_RAW" => Op::UpstreamCluster,
        "UPSTREAM_LOCAL_ADDRESS" => Op::UpstreamLocal(Full),
        "UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Op::UpstreamLocal(Ip),
        "UPSTREAM_LOCAL_PORT" => Op::UpstreamLocal(Port),
        "UPSTREAM_REMOTE_ADDRESS" => Op::UpstreamRemote(Full),
        "UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Op::UpstreamRemote(Ip),
        "UPSTREAM_REMOTE_PORT" => Op::UpstreamRemote(Port),
        "UPSTREAM_TRANSPORT_FAILURE_REASON" => Op::UpstreamTransportFailureReason,
        "DOWNSTREAM_REMOTE_ADDRESS" => Op::DownstreamRemote(Full),
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Op::DownstreamRemote(Ip),
        "DOWNSTREAM_REMOTE_PORT" => Op::DownstreamRemote(Port),
        "DOWNSTREAM_DIRECT_REMOTE_ADDRESS" => Op::DownstreamDirectRemote(Full),
        "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT" => Op::DownstreamDirectRemote(Ip),
        "DOWNSTREAM_DIRECT_REMOTE_PORT" => Op::DownstreamDirectRemote(Port),
        "DOWNSTREAM_LOCAL_ADDRESS" => Op::DownstreamLocal(Full),
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Op::DownstreamLocal(Ip),
        "DOWNSTREAM_LOCAL_PORT" => Op::DownstreamLocal(Port),
        "REQUESTED_SERVER_NAME" => Op::RequestedServerName,
        "ROUTE_NAME" => Op::RouteName,
        "CONNECTION_TERMINATION_DETAILS" => Op::ConnectionTerminationDetails,
        "UPSTREAM_REQUEST_ATTEMPT_COUNT" => Op::AttemptCount,
        "HOSTNAME" => Op::Constant(machine.hostname()),
        other => {
            return Err(format!(
                "Not supported field in StreamInfo: {other} (revoy does not implement the %{other}% access log operator)"
            ));
        }
    })
}

#[cfg(test)]
mod tests;
