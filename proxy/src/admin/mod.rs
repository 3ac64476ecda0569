//! The admin API (Envoy's endpoints plus `/routes`), served on its own thread and runtime so a
//! slow scrape never takes a data-path worker.

mod config_dump;
mod help;
mod request;
mod routes;

pub use request::AdminRequest;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::server::{ServerState, Shared};

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

fn json(value: &serde_json::Value) -> AdminResponse {
    AdminResponse {
        status: 200,
        content_type: JSON,
        body: serde_json::to_string_pretty(value).unwrap_or_default() + "\n",
    }
}

/// What the admin server asks of the process besides answering.
pub enum Effect {
    /// Nothing.
    None,
    /// Exit with this code once the response is written.
    Quit(i32),
}

/// Starts the admin server on its own thread. `quit` receives the exit code on `/quitquitquit`.
pub fn spawn(listener: std::net::TcpListener, shared: Arc<Shared>, quit: Sender<i32>) {
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
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (shared, quit) = (shared.clone(), quit.clone());
                    tokio::spawn(async move { serve(stream, shared, quit).await });
                }
            });
        })
        .expect("spawn admin thread");
}

async fn serve(stream: TcpStream, shared: Arc<Shared>, quit: Sender<i32>) {
    let mut reader = BufReader::new(stream);
    while let Some(req) = request::read(&mut reader).await {
        let (resp, effect) = handle(&req, &shared);
        let head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncache-control: no-cache, max-age=0\r\nx-content-type-options: nosniff\r\ndate: {}\r\nserver: envoy\r\ncontent-length: {}\r\n{}\r\n",
            resp.status,
            reason(resp.status),
            resp.content_type,
            httpdate::fmt_http_date(std::time::SystemTime::now()),
            resp.body.len(),
            if req.keep_alive {
                ""
            } else {
                "connection: close\r\n"
            }
        );
        let out = reader.get_mut();
        if out.write_all(head.as_bytes()).await.is_err()
            || out.write_all(resp.body.as_bytes()).await.is_err()
        {
            return;
        }
        let _ = out.flush().await;
        if let Effect::Quit(code) = effect {
            let _ = quit.send(code);
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
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Answers one admin request.
pub fn handle(req: &AdminRequest, shared: &Arc<Shared>) -> (AdminResponse, Effect) {
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
        "/ready" => ready(shared),
        "/server_info" => pooled_json(server_info(shared)),
        "/config_dump" => pooled_json(config_dump::render(shared, req)),
        "/clusters" => match req.param("format") {
            Some("json") => json(&shared.clusters.render_json()),
            _ => text(200, shared.clusters.render_text()),
        },
        "/listeners" => listeners(shared, req.param("format") == Some("json")),
        "/routes" => routes::render(shared, req),
        "/stats" => stats(shared, req, false),
        "/stats/prometheus" => stats(shared, req, true),
        "/hot_restart_version" => text(200, "disabled"),
        "/quitquitquit" => return (text(200, "OK\n"), Effect::Quit(0)),
        "/healthcheck/fail" => {
            shared.health_failed.store(true, Ordering::Relaxed);
            text(200, "OK\n")
        }
        "/healthcheck/ok" => {
            shared.health_failed.store(false, Ordering::Relaxed);
            text(200, "OK\n")
        }
        "/reset_counters" => {
            shared.stats.reset_counters();
            text(200, "OK\n")
        }
        "/drain_listeners" => {
            drain_listeners(shared, req);
            text(200, "OK\n")
        }
        "/logging" => logging(req),
        _ => text(404, "invalid path"),
    };
    (resp, Effect::None)
}

/// `/drain_listeners[?inboundonly][&graceful][&skip_exit]`: enter DRAINING; unless `skip_exit`,
/// stop the (inbound) listeners, at once or after `--drain-time-s` when `graceful`.
fn drain_listeners(shared: &Arc<Shared>, req: &AdminRequest) {
    shared.set_state(ServerState::Draining);
    if req.has("skip_exit") {
        return;
    }
    let inbound_only = req.has("inboundonly");
    if req.has("graceful") {
        let shared = shared.clone();
        let delay = std::time::Duration::from_secs(shared.options.drain_time_s);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            shared.stop_listeners(inbound_only);
        });
    } else {
        shared.stop_listeners(inbound_only);
    }
}

/// A JSON answer rendered with a descriptor pool (megabytes, dropped by now): the freed
/// memory goes back to the OS.
fn pooled_json(value: serde_json::Value) -> AdminResponse {
    crate::memory::release_idle_pages();
    json(&value)
}

fn ready(shared: &Shared) -> AdminResponse {
    match shared.state.value() {
        0 => text(200, "LIVE\n"),
        1 => text(503, "DRAINING\n"),
        2 => text(503, "PRE_INITIALIZING\n"),
        _ => text(503, "INITIALIZING\n"),
    }
}

fn state_name(v: u64) -> &'static str {
    match v {
        0 => "LIVE",
        1 => "DRAINING",
        2 => "PRE_INITIALIZING",
        _ => "INITIALIZING",
    }
}

fn server_info(shared: &Shared) -> serde_json::Value {
    let o = &shared.options;
    let up = format!("{}s", shared.started.elapsed().as_secs());
    let node = crate::load::effective_node(shared.bootstrap.proto.decode().node.as_ref(), o);
    let node = proto::Codec::for_document("envoy.config.core.v3.Node", &serde_json::Value::Null)
        .to_json(&node);
    serde_json::json!({
        "version": crate::cli::version_line().split("version: ").nth(1).unwrap_or_default(),
        "state": state_name(shared.state.value()),
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
            "drain_strategy": if o.drain_strategy == "immediate" { "Immediate" } else { "Gradual" },
        },
        "node": node,
    })
}

fn listeners(shared: &Shared, as_json: bool) -> AdminResponse {
    let ls = shared.listeners.load();
    if as_json {
        let statuses: Vec<_> = ls
            .iter()
            .map(|l| {
                let a = l.config().address;
                serde_json::json!({
                    "name": l.config().name,
                    "local_address": {"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}},
                })
            })
            .collect();
        json(&serde_json::json!({ "listener_statuses": statuses }))
    } else {
        let body: String = ls
            .iter()
            .map(|l| format!("{}::{}\n", l.config().name, l.config().address))
            .collect();
        text(200, body)
    }
}

/// `/stats` (text or `format=json`) and `/stats/prometheus`, with Envoy's `filter`,
/// `usedonly` and `type` (`Counters`, `Gauges`, `Histograms`; anything else: all).
fn stats(shared: &Shared, req: &AdminRequest, prometheus: bool) -> AdminResponse {
    let filter = match req.param("filter").filter(|f| !f.is_empty()) {
        Some(f) => match regex::Regex::new(f) {
            Ok(r) => Some(r),
            Err(e) => return text(400, format!("Invalid re2 regex: {e}")),
        },
        None => None,
    };
    let snapshot = shared.stats.snapshot();
    let mut metrics = snapshot;
    metrics.push((
        "server.uptime".into(),
        crate::stats::Metric::Gauge({
            let g = crate::stats::Gauge::default();
            g.set(shared.started.elapsed().as_secs());
            g
        }),
    ));
    metrics.sort_by(|a, b| a.0.cmp(&b.0));
    match req.param("type") {
        Some("Counters") => metrics.retain(|(_, m)| matches!(m, crate::stats::Metric::Counter(_))),
        Some("Gauges") => metrics.retain(|(_, m)| matches!(m, crate::stats::Metric::Gauge(_))),
        Some("Histograms") => metrics.clear(),
        _ => {}
    }
    let used = req.has("usedonly");
    if prometheus {
        return text(
            200,
            crate::stats::render_prometheus(
                &metrics,
                used,
                filter.as_ref(),
                shared.bootstrap.stats_tags.producer(),
            ),
        );
    }
    match req.param("format") {
        Some("json") => json(&crate::stats::render_json(&metrics, used, filter.as_ref())),
        _ => text(
            200,
            crate::stats::render_text(&metrics, used, filter.as_ref()),
        ),
    }
}

fn logging(req: &AdminRequest) -> AdminResponse {
    let level = req.param("level").unwrap_or("");
    let paths = req.param("paths").unwrap_or("");
    if !level.is_empty() || !paths.is_empty() {
        let base = if level.is_empty() { "info" } else { level };
        if let Err(e) = crate::logging::set(base, paths) {
            return text(400, format!("error: {e}\n"));
        }
    }
    text(
        200,
        format!("active loggers:\n  {}\n", crate::logging::current()),
    )
}
