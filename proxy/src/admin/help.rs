//! The admin endpoint table: paths, methods, help text and parameters, in Envoy's words.

/// One admin endpoint.
pub struct Endpoint {
    /// Path, e.g. `/stats`.
    pub path: &'static str,
    /// Whether only POST is allowed.
    pub post_only: bool,
    /// One-line description.
    pub help: &'static str,
    /// `(name, description)` of each query parameter.
    pub params: &'static [(&'static str, &'static str)],
}

const fn ep(
    path: &'static str,
    post_only: bool,
    help: &'static str,
    params: &'static [(&'static str, &'static str)],
) -> Endpoint {
    Endpoint {
        path,
        post_only,
        help,
        params,
    }
}

/// Every endpoint revoy serves, sorted by path as Envoy lists them, each with the parameters
/// revoy honours, in Envoy's words (`/routes` and `/xds` are revoy's own).
pub const ENDPOINTS: &[Endpoint] = &[
    ep("/", false, "Admin home page", &[]),
    ep(
        "/allocprofiler",
        true,
        "enable/disable the allocation profiler (if supported)",
        &[(
            "enable",
            "enable/disable the allocation profiler; One of (y, n)",
        )],
    ),
    ep("/certs", false, "print certs on machine", &[]),
    ep(
        "/clusters",
        false,
        "upstream cluster status",
        &[(
            "filter",
            "Regular expression (Google re2) for filtering clusters by name",
        )],
    ),
    ep(
        "/config_dump",
        false,
        "dump current Envoy configs",
        &[
            ("resource", "The resource to dump"),
            (
                "mask",
                "The mask to apply. When both resource and mask are specified, the mask is applied to every element in the desired repeated field so that only a subset of fields are returned. The mask is parsed as a Protobuf::FieldMask",
            ),
            (
                "name_regex",
                "Dump only the currently loaded configurations whose names match the specified regex. Can be used with both resource and mask query parameters.",
            ),
            (
                "include_eds",
                "Dump currently loaded configuration including EDS. See the response definition for more information",
            ),
        ],
    ),
    ep(
        "/cpuprofiler",
        true,
        "enable/disable the CPU profiler",
        &[("enable", "enables the CPU profiler; One of (y, n)")],
    ),
    ep(
        "/drain_listeners",
        true,
        "drain listeners",
        &[
            (
                "graceful",
                "When draining listeners, enter a graceful drain period prior to closing listeners. This behaviour and duration is configurable via server options or CLI",
            ),
            (
                "skip_exit",
                "When draining listeners, drain the connections but never stop the listeners. The graceful parameter has no effect when this is set, since the drain period only delays stopping the listeners",
            ),
            (
                "inboundonly",
                "Drains all inbound listeners. traffic_direction field in envoy_v3_api_msg_config.listener.v3.Listener is used to determine whether a listener is inbound or outbound.",
            ),
        ],
    ),
    ep(
        "/healthcheck/fail",
        true,
        "cause the server to fail health checks",
        &[],
    ),
    ep(
        "/healthcheck/ok",
        true,
        "cause the server to pass health checks",
        &[],
    ),
    ep(
        "/heapprofiler",
        true,
        "enable/disable the heap profiler",
        &[("enable", "enable/disable the heap profiler; One of (y, n)")],
    ),
    ep("/help", false, "print out list of admin commands", &[]),
    ep(
        "/hot_restart_version",
        false,
        "print the hot restart compatibility version",
        &[],
    ),
    ep(
        "/init_dump",
        false,
        "dump current Envoy init manager information (experimental)",
        &[],
    ),
    ep(
        "/listeners",
        false,
        "print listener info",
        &[("format", "File format to use; One of (text, json)")],
    ),
    ep(
        "/logging",
        true,
        "query/change logging levels",
        &[
            (
                "paths",
                "Change multiple logging levels by setting to <logger_name1>:<desired_level1>,<logger_name2>:<desired_level2>. If fine grain logging is enabled, use __FILE__ or a glob experision as the logger name. For example, source/common*:warning",
            ),
            (
                "level",
                "desired logging level, this will change all loggers's level; One of (, trace, debug, info, warning, error, critical, off)",
            ),
        ],
    ),
    ep("/memory", false, "print current allocation/heap usage", &[]),
    ep("/quitquitquit", true, "exit the server", &[]),
    ep(
        "/ready",
        false,
        "print server state, return 200 if LIVE, otherwise return 503",
        &[],
    ),
    ep("/reopen_logs", true, "reopen access logs", &[]),
    ep("/reset_counters", true, "reset all counters to zero", &[]),
    ep(
        "/routes",
        false,
        "print the compiled route tables; with host and path, explain the route decision for one request",
        &[
            ("host", "Authority of the request to explain"),
            ("path", "Path (and query) of the request to explain"),
            ("method", "Method of the request to explain (default GET)"),
            ("header", "A request header as name:value; repeatable"),
            (
                "route_config",
                "Explain against this route configuration only",
            ),
            ("format", "Format to use; One of (json, text)"),
        ],
    ),
    ep("/runtime", false, "print runtime values", &[]),
    ep(
        "/runtime_modify",
        true,
        "Adds or modifies runtime values as passed in query parameters. To delete a previously added key, use an empty string as the value. Note that deletion only applies to overrides added via this endpoint; values loaded from disk can be modified via override but not deleted. E.g. ?key1=value1&key2=value2...",
        &[],
    ),
    ep(
        "/server_info",
        false,
        "print server version/status information",
        &[],
    ),
    ep(
        "/stats",
        false,
        "print server stats",
        &[
            (
                "usedonly",
                "Only include stats that have been written by system since restart",
            ),
            (
                "filter",
                "Regular expression (Google re2) for filtering stats",
            ),
            ("format", "Format to use; One of (text, json)"),
            (
                "type",
                "Stat types to include.; One of (All, Counters, Histograms, Gauges, TextReadouts)",
            ),
            (
                "histogram_buckets",
                "Histogram bucket display mode; One of (cumulative, disjoint, detailed, summary)",
            ),
        ],
    ),
    ep(
        "/stats/prometheus",
        false,
        "print server stats in prometheus format",
        &[
            (
                "usedonly",
                "Only include stats that have been written by system since restart",
            ),
            (
                "text_readouts",
                "Render text_readouts as new gaugues with value 0 (increases Prometheus data size)",
            ),
            (
                "filter",
                "Regular expression (Google re2) for filtering stats",
            ),
        ],
    ),
    ep(
        "/stats/recentlookups/clear",
        true,
        "clear list of stat-name lookups and counter",
        &[],
    ),
    ep(
        "/stats/recentlookups/disable",
        true,
        "disable recording of reset stat-name lookup names",
        &[],
    ),
    ep(
        "/stats/recentlookups/enable",
        true,
        "enable recording of reset stat-name lookup names",
        &[],
    ),
    ep(
        "/xds",
        false,
        "the xDS stream: each subscription's version and nonce, and the last pushes with their ACK or NACK and reason, newest first",
        &[],
    ),
];

/// The `/help` text in Envoy's layout.
pub fn render() -> String {
    let mut out = String::from("admin commands are:\n");
    for e in ENDPOINTS {
        let post = if e.post_only { " (POST)" } else { "" };
        out.push_str(&format!("  {}{post}: {}\n", e.path, e.help));
        for (name, help) in e.params {
            out.push_str(&format!("      {name}: {help}\n"));
        }
    }
    out
}
