//! The admin API (Envoy's endpoints plus `/routes`), served on its own thread and runtime so a
//! slow scrape never takes a data-path worker.

mod certs;
mod config_dump;
mod help;
mod request;
mod routes;
mod secrets;
mod stats;
mod unsupported;
mod xds;

pub use request::AdminRequest;

use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use self::stats::{AdminConnection, AdminStats, AdminStream};
use crate::lifecycle::ServerState;
use crate::process::Process;
use crate::xds::Xds;

/// An admin response: status, content type, body.
pub struct AdminResponse {
    /// HTTP status code.
    pub status: u16,
    /// `content-type`.
    pub content_type: &'static str,
    /// Body.
    pub body: String,
}

const TEXT: &str = "text/plain; charset=UTF-8";
const JSON: &str = "application/json";

fn text(status: u16, body: impl Into<String>) -> AdminResponse {
    AdminResponse {
        status,
        content_type: TEXT,
        body: body.into(),
    }
}

/// A JSON answer indented as Envoy prints its protobuf-backed admin answers (`/config_dump`,
/// `/clusters`, `/server_info`, ...): one space per level.
/// `/runtime_modify?key=value...` (or form values): Envoy's usage without any, its refusal
/// without an admin layer, else the admin layer's overrides set or removed.
fn runtime_modify(req: &AdminRequest, process: &Process) -> AdminResponse {
    if req.params.is_empty() {
        return text(
            400,
            "usage: /runtime_modify?key1=value1&key2=value2&keyN=valueN\n       \
             or send the parameters as form values\n\
             use an empty value to remove a previously added override",
        );
    }
    match process.shared.runtime.modify(&req.params) {
        Ok(()) => text(200, "OK\n"),
        Err(e) => text(503, e.to_string()),
    }
}

fn json(value: &serde_json::Value) -> AdminResponse {
    let mut body = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut body, formatter);
    serde::Serialize::serialize(value, &mut ser).expect("a JSON value serializes");
    body.push(b'\n');
    AdminResponse {
        status: 200,
        content_type: JSON,
        body: String::from_utf8(body).expect("serde_json writes UTF-8"),
    }
}

/// A JSON answer on one line, as Envoy prints `/stats?format=json`.
fn compact_json(value: &serde_json::Value) -> AdminResponse {
    AdminResponse {
        status: 200,
        content_type: JSON,
        body: value.to_string(),
    }
}

/// What the admin server asks of the process besides answering.
pub enum Effect {
    /// Nothing.
    None,
    /// Exit with this code once the response is written.
    Quit(i32),
}

/// Starts the admin server on its own thread; `xds` holds xDS's state once xDS has started.
pub fn spawn(listener: std::net::TcpListener, process: Arc<Process>, xds: Arc<OnceLock<Xds>>) {
    std::thread::Builder::new()
        .name("revoy-admin".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("admin runtime");
            rt.block_on(async move {
                listener
                    .set_nonblocking(true)
                    .expect("nonblocking admin socket");
                let listener = tokio::net::TcpListener::from_std(listener).expect("admin listener");
                let stats = Arc::new(AdminStats::new(&process.shared.stats));
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (process, xds, stats) = (process.clone(), xds.clone(), stats.clone());
                    tokio::spawn(async move {
                        let mut connection = stats.connection();
                        serve(stream, process, xds, &mut connection).await;
                    });
                }
            });
        })
        .expect("spawn admin thread");
}

/// Answers the requests of one connection, counted in `connection`.
async fn serve(
    stream: TcpStream,
    process: Arc<Process>,
    xds: Arc<OnceLock<Xds>>,
    connection: &mut AdminConnection<'_>,
) {
    let mut reader = BufReader::new(stream);
    while let Some(req) = request::read(&mut reader).await {
        let counted = connection.request();
        if req.http10 {
            counted.refused(426);
            // Envoy's admin refuses HTTP/1.0, as its connection manager does by default.
            let answer = format!(
                "HTTP/1.1 426 Upgrade Required\r\ncontent-length: 16\r\ncontent-type: text/plain\r\ndate: {}\r\nserver: envoy\r\nconnection: close\r\n\r\nUpgrade Required",
                httpdate::fmt_http_date(std::time::SystemTime::now()),
            );
            let _ = reader.get_mut().write_all(answer.as_bytes()).await;
            return;
        }
        let (resp, effect) = handle(&req, &process, xds.get(), &counted);
        counted.head(resp.status);
        // Envoy's admin streams every answer, so its bodies go out chunked.
        let head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncache-control: no-cache, max-age=0\r\nx-content-type-options: nosniff\r\ndate: {}\r\nserver: envoy\r\ntransfer-encoding: chunked\r\n{}\r\n",
            resp.status,
            reason(resp.status),
            resp.content_type,
            httpdate::fmt_http_date(std::time::SystemTime::now()),
            if req.keep_alive {
                ""
            } else {
                "connection: close\r\n"
            }
        );
        // A HEAD is answered with the head alone, as Envoy's connection manager answers it.
        let head_only = req.method == "HEAD";
        let chunk = if resp.body.is_empty() || head_only {
            String::new()
        } else {
            format!("{:x}\r\n", resp.body.len())
        };
        let end: &[u8] = if head_only {
            b""
        } else if resp.body.is_empty() {
            b"0\r\n\r\n"
        } else {
            b"\r\n0\r\n\r\n"
        };
        let body: &[u8] = if head_only { b"" } else { resp.body.as_bytes() };
        let out = reader.get_mut();
        if out.write_all(head.as_bytes()).await.is_err()
            || out.write_all(chunk.as_bytes()).await.is_err()
            || out.write_all(body).await.is_err()
            || out.write_all(end).await.is_err()
        {
            return;
        }
        let _ = out.flush().await;
        if let Effect::Quit(code) = effect {
            process.lifecycle.quit(code);
            return;
        }
        if !req.keep_alive {
            return;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Answers one admin request (`xds`: xDS's state, once started), counted in `counted`.
fn handle(
    req: &AdminRequest,
    process: &Arc<Process>,
    xds: Option<&Xds>,
    counted: &AdminStream<'_>,
) -> (AdminResponse, Effect) {
    let Some(ep) = help::ENDPOINTS.iter().find(|e| e.path == req.path) else {
        return (
            text(404, format!("invalid path. {}", help::render())),
            Effect::None,
        );
    };
    if ep.post_only && req.method != "POST" {
        return (
            text(
                405,
                format!("Method {} not allowed, POST required.", req.method),
            ),
            Effect::None,
        );
    }
    let resp = match req.path.as_str() {
        "/" | "/help" => text(200, help::render()),
        "/ready" => ready(process),
        "/server_info" => pooled_json(server_info(process)),
        "/config_dump" => pooled_json(config_dump::render(process, xds, req)),
        "/certs" => json(&certs::render(process, std::time::SystemTime::now())),
        "/clusters" => clusters(process, req),
        "/listeners" => listeners(process, req.param("format") == Some("json")),
        "/routes" => routes::render(process, req),
        "/xds" => json(&xds::render(xds)),
        "/init_dump" => json(&xds::init_dump(xds)),
        "/stats" => stats(process, req, Some(counted)),
        "/stats/prometheus" => stats(process, req, None),
        "/hot_restart_version" => text(200, "disabled"),
        "/memory" => json(&crate::memory::admin_json()),
        "/quitquitquit" => return (text(200, "OK\n"), Effect::Quit(0)),
        "/healthcheck/fail" => {
            process.lifecycle.set_health_failed(true);
            text(200, "OK\n")
        }
        "/healthcheck/ok" => {
            process.lifecycle.set_health_failed(false);
            text(200, "OK\n")
        }
        "/reset_counters" => {
            process.shared.stats.reset_counters();
            text(200, "OK\n")
        }
        "/drain_listeners" => {
            process.drain_listeners(
                req.has("inboundonly"),
                req.has("graceful"),
                req.has("skip_exit"),
            );
            text(200, "OK\n")
        }
        "/logging" => logging(req),
        "/cpuprofiler" => unsupported::cpu_profiler(req),
        "/heapprofiler" => unsupported::heap_profiler(),
        "/allocprofiler" => unsupported::alloc_profiler(req),
        "/runtime" => json(&process.shared.runtime.listing()),
        "/runtime_modify" => runtime_modify(req, process),
        "/stats/recentlookups/clear"
        | "/stats/recentlookups/disable"
        | "/stats/recentlookups/enable" => unsupported::recent_lookups(&req.path),
        // Access log files reopen; revoy's own log stays where it was opened.
        "/reopen_logs" => {
            crate::access_log::file::reopen_all();
            text(200, "OK\n")
        }
        _ => text(404, "invalid path"),
    };
    (resp, Effect::None)
}

/// A JSON answer rendered with a descriptor pool (megabytes, dropped by now): the freed
/// memory goes back to the OS.
fn pooled_json(value: serde_json::Value) -> AdminResponse {
    crate::memory::release_idle_pages();
    json(&value)
}

/// `/ready`: 200 and `LIVE` when live, else 503 and the state's name.
fn ready(process: &Process) -> AdminResponse {
    let state = process.lifecycle.state();
    let status = if state == ServerState::Live { 200 } else { 503 };
    text(status, format!("{}\n", state_name(state)))
}

fn state_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Live => "LIVE",
        ServerState::Draining => "DRAINING",
        ServerState::PreInitializing => "PRE_INITIALIZING",
        ServerState::Initializing => "INITIALIZING",
    }
}

fn server_info(process: &Process) -> serde_json::Value {
    let o = &process.options;
    let up = format!("{}s", process.started.elapsed().as_secs());
    let node = crate::load::effective_node(process.bootstrap.proto.decode().node.as_ref(), o);
    let node = proto::Codec::for_document("envoy.config.core.v3.Node", &serde_json::Value::Null)
        .to_json(&node);
    serde_json::json!({
        "version": crate::cli::version_line().split("version: ").nth(1).unwrap_or_default(),
        "state": state_name(process.lifecycle.state()),
        "uptime_current_epoch": up,
        "uptime_all_epochs": up,
        "hot_restart_version": "disabled",
        "command_line_options": {
            "base_id": o.base_id.unwrap_or(0).to_string(),
            "concurrency": o.concurrency.unwrap_or(0),
            "config_path": o.config_path,
            "config_yaml": o.config_yaml,
            "allow_unknown_static_fields": o.allow_unknown_static(),
            "local_address_ip_version": o.local_address_ip_version,
            "log_level": o.log_level,
            "component_log_level": o.component_log_level,
            "log_path": o.log_path.clone().unwrap_or_default(),
            "service_cluster": o.service_cluster.clone().unwrap_or_default(),
            "service_node": o.service_node.clone().unwrap_or_default(),
            "service_zone": o.service_zone.clone().unwrap_or_default(),
            "drain_time": format!("{}s", o.drain_time_s),
            "mode": format!("{:?}", o.mode),
            "disable_hot_restart": o.disable_hot_restart,
            "restart_epoch": o.restart_epoch,
            "drain_strategy": match o.drain_strategy {
                crate::drain::Strategy::Immediate => "Immediate",
                crate::drain::Strategy::Gradual => "Gradual",
            },
        },
        "node": node,
    })
}

fn listeners(process: &Process, as_json: bool) -> AdminResponse {
    let ls = process.applier.listeners();
    // Each address as Envoy shows it: where its socket is bound (a configured port 0 becomes
    // the kernel's port), as configured when not bound (`bind_to_port: false`).
    let addresses =
        |l: &crate::listener::Listener| process.applier.local_addresses(&l.config().name);
    if as_json {
        let socket_address = |a: &std::net::SocketAddr| serde_json::json!({"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}});
        let statuses: Vec<_> = ls
            .iter()
            .map(|l| {
                let addresses = addresses(l);
                let main = addresses.first().copied().unwrap_or(l.config().address);
                let mut status = serde_json::json!({
                    "name": l.config().name,
                    "local_address": socket_address(&main),
                });
                if addresses.len() > 1 {
                    status["additional_local_addresses"] =
                        addresses[1..].iter().map(socket_address).collect();
                }
                status
            })
            .collect();
        json(&serde_json::json!({ "listener_statuses": statuses }))
    } else {
        // One line per address, as Envoy writes them.
        let body: String = ls
            .iter()
            .flat_map(|l| {
                let name = &l.config().name;
                addresses(l)
                    .into_iter()
                    .map(move |a| format!("{name}::{a}\n"))
            })
            .collect();
        text(200, body)
    }
}

/// `/clusters` (text or `format=json`), of the clusters whose name matches `filter`.
fn clusters(process: &Process, req: &AdminRequest) -> AdminResponse {
    let filter = match name_filter(req) {
        Ok(filter) => filter,
        Err(resp) => return resp,
    };
    match req.param("format") {
        Some("json") => json(
            &process
                .shared
                .clusters
                .render_json_matching(filter.as_ref()),
        ),
        _ => text(
            200,
            process
                .shared
                .clusters
                .render_text_matching(filter.as_ref()),
        ),
    }
}

/// A gauge at `value` made for one rendering of the stats (its value is known only then).
fn detached_gauge(value: u64) -> crate::stats::Metric {
    let g = crate::stats::Gauge::default();
    g.set(value);
    crate::stats::Metric::Gauge(g)
}

/// The `filter` parameter as a regex (`None` when absent or empty), or Envoy's 400 answer.
fn name_filter(req: &AdminRequest) -> Result<Option<regex::Regex>, AdminResponse> {
    match req.param("filter").filter(|f| !f.is_empty()) {
        Some(f) => regex::Regex::new(f)
            .map(Some)
            .map_err(|e| text(400, format!("Invalid re2 regex: {e}"))),
        None => Ok(None),
    }
}

/// `/stats` (text or `format=json`) and `/stats/prometheus`, with Envoy's `filter`,
/// `usedonly`, `type` (`Counters`, `Gauges`, `TextReadouts`, `Histograms`; anything else:
/// all), `histogram_buckets`, and for Prometheus `text_readouts` (present: shown, whatever
/// its value, as in Envoy). `/stats` is given its own stream (`streamed`): Envoy sends its
/// head before rendering, so its 200 counts in the stats it shows; Prometheus's answer is
/// rendered first and does not.
fn stats(
    process: &Process,
    req: &AdminRequest,
    streamed: Option<&AdminStream<'_>>,
) -> AdminResponse {
    let prometheus = streamed.is_none();
    use crate::stats::{BucketsMode, Metric, Selection};
    let filter = match name_filter(req) {
        Ok(filter) => filter,
        Err(resp) => return resp,
    };
    let mode = if prometheus {
        BucketsMode::Summary
    } else {
        match BucketsMode::parse(req.param("histogram_buckets")) {
            Ok(mode) => mode,
            Err(usage) => return text(400, usage),
        }
    };
    if let Some(stream) = streamed {
        stream.head(200);
    }
    if process.bootstrap.stats_flush == crate::config::stats_flush::StatsFlush::OnAdmin {
        process.shared.stats.flush_histograms();
    }
    let used_only = req.has("usedonly");
    let mut metrics = process.shared.stats.snapshot_with(!used_only);
    metrics.push((
        "server.uptime".into(),
        detached_gauge(process.started.elapsed().as_secs()),
    ));
    for cluster in process.shared.clusters.clusters() {
        metrics.extend(
            cluster
                .circuit_breaker_gauges()
                .into_iter()
                // A gauge at 0 was never written (Envoy's `usedonly` leaves it out).
                .filter(|(_, value)| !used_only || *value != 0)
                .map(|(name, value)| {
                    let metric = if value == 0 {
                        crate::stats::Metric::Gauge(crate::stats::Gauge::default())
                    } else {
                        detached_gauge(value)
                    };
                    (name, metric)
                }),
        );
    }
    metrics.sort_by(|a, b| a.0.cmp(&b.0));
    let mut histograms = process.shared.stats.histogram_views();
    let mut texts = if prometheus && !req.has("text_readouts") {
        Vec::new()
    } else {
        process.shared.stats.text_readouts()
    };
    match req.param("type") {
        Some("Counters") => {
            metrics.retain(|(_, m)| matches!(m, Metric::Counter(_)));
            texts.clear();
            histograms.clear();
        }
        Some("Gauges") => {
            metrics.retain(|(_, m)| matches!(m, Metric::Gauge(_)));
            texts.clear();
            histograms.clear();
        }
        Some("TextReadouts") => {
            metrics.clear();
            histograms.clear();
        }
        Some("Histograms") => {
            metrics.clear();
            texts.clear();
        }
        _ => {}
    }
    let sel = Selection {
        used_only,
        filter: filter.as_ref(),
        matcher: process.bootstrap.stats_matcher.as_ref(),
    };
    if prometheus {
        return text(
            200,
            crate::stats::render_prometheus(
                &metrics,
                &texts,
                &histograms,
                sel,
                process.bootstrap.stats_tags.producer(),
                &process.shared.stats.tagged(),
            ),
        );
    }
    match req.param("format") {
        Some("json") => compact_json(&crate::stats::render_json(
            &metrics,
            &texts,
            &histograms,
            sel,
            mode,
        )),
        _ => text(
            200,
            crate::stats::render_text(&metrics, &texts, &histograms, sel, mode),
        ),
    }
}

fn logging(req: &AdminRequest) -> AdminResponse {
    match crate::logging::change(&req.params) {
        Ok(()) => text(200, crate::logging::listing()),
        Err(e) => text(
            400,
            format!(
                "error: {e}\n\n\
                 usage: /logging?<name>=<level> (change single level)\n\
                 usage: /logging?paths=name1:level1,name2:level2,... (change multiple levels)\n\
                 usage: /logging?level=<level> (change all levels)\n\
                 levels: trace debug info warning error critical off \n{}",
                crate::logging::listing()
            ),
        ),
    }
}
