//! `envoy.filters.http.rbac` against Envoy 1.40: requests by method, path (query stripped,
//! case-sensitive), header, `remote_ip` from `x-forwarded-for`, source address and the mTLS
//! peer's SPIFFE ID, through ALLOW, DENY and LOG rules with shadow rules and stat prefixes,
//! per-route `RBACPerRoute` overrides (one without `rbac`, which turns the filter off there),
//! a route that disables the filter and one that turns on a filter disabled in the chain, and istiod's own filter for a DENY policy. Each
//! request's status and body, its access log's response details (the denying policy, its
//! whitespace made `_`), whether the upstream saw it, and every `rbac.` counter must be
//! Envoy's; Envoy's statuses must be what each case expects, and each 403 Envoy's RBAC's.

use std::io::{Read, Write};

use rustls::ClientConnection;
use rustls::pki_types::ServerName;

use super::{Client, Kit, Proxy, compare_stats, connect, free_port, rbac_stats, tls_client};

const HTTP_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";

/// One connection manager: its name, whether it takes mutual TLS, its RBAC filter(s) (YAML
/// list items) and its routes (a flow-style list; each forwards to the upstream).
struct Hcm {
    name: &'static str,
    mtls: bool,
    filters: fn() -> Vec<String>,
    routes: &'static str,
}

const EVERYTHING: &str = "[{match: {prefix: /}, route: {cluster: upstream}}]";

fn http_rbac(body: &str) -> String {
    format!("{{name: envoy.filters.http.rbac, typed_config: {{\"@type\": {HTTP_RBAC}, {body}}}}}")
}

const HCMS: &[Hcm] = &[
    Hcm {
        name: "allow",
        mtls: false,
        filters: || {
            vec![http_rbac(
                "rules_stat_prefix: r_, shadow_rules_stat_prefix: dry_, \
                 rules: {policies: {\
                   get-info: {permissions: [{and_rules: {rules: [{header: {name: ':method', string_match: {exact: GET}}}, \
                     {url_path: {path: {prefix: /info}}}]}}], principals: [{any: true}]}, \
                   post-data: {permissions: [{and_rules: {rules: [{header: {name: ':method', string_match: {exact: POST}}}, \
                     {url_path: {path: {exact: /data}}}]}}], principals: [{direct_remote_ip: {address_prefix: 127.0.0.1, prefix_len: 32}}]}}}, \
                 shadow_rules: {action: DENY, policies: {dry: {permissions: [{header: {name: x-dry, present_match: true}}], principals: [{any: true}]}}}",
            )]
        },
        routes: EVERYTHING,
    },
    Hcm {
        name: "deny",
        mtls: false,
        filters: || {
            vec![http_rbac(
                "rules: {action: DENY, policies: {\
                   block user: {permissions: [{any: true}], principals: [{header: {name: x-user, string_match: {exact: evil}}}]}, \
                   block-path: {permissions: [{not_rule: {url_path: {path: {safe_regex: {regex: '/[a-z/]*'}}}}}], principals: [{any: true}]}}}",
            )]
        },
        routes: EVERYTHING,
    },
    Hcm {
        name: "log",
        mtls: false,
        filters: || {
            vec![http_rbac(
                "rules: {action: LOG, policies: {p: {permissions: [{url_path: {path: {prefix: /logged}}}], principals: [{any: true}]}}}",
            )]
        },
        routes: EVERYTHING,
    },
    Hcm {
        name: "routes",
        mtls: false,
        filters: || vec![http_rbac("rules: {}")],
        routes: "[\
          {match: {prefix: /open}, route: {cluster: upstream}, \
           typed_per_filter_config: {envoy.filters.http.rbac: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute}}}, \
          {match: {prefix: /override}, route: {cluster: upstream}, \
           typed_per_filter_config: {envoy.filters.http.rbac: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute, \
             rbac: {rules: {policies: {get: {permissions: [{header: {name: ':method', string_match: {exact: GET}}}], principals: [{any: true}]}}}}}}}, \
          {match: {prefix: /disabled}, route: {cluster: upstream}, \
           typed_per_filter_config: {envoy.filters.http.rbac: {\"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}}}, \
          {match: {prefix: /}, route: {cluster: upstream}}]",
    },
    Hcm {
        name: "optin",
        mtls: false,
        filters: || {
            vec![
                "{name: envoy.filters.http.rbac, disabled: true, typed_config: {\"@type\": \
                 type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, rules: {}}}"
                    .to_owned(),
            ]
        },
        routes: "[\
          {match: {prefix: /on}, route: {cluster: upstream}, \
           typed_per_filter_config: {envoy.filters.http.rbac: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute, \
             rbac: {rules: {action: DENY, policies: {p: {permissions: [{url_path: {path: {exact: /on/x}}}], principals: [{any: true}]}}}}}}}, \
          {match: {prefix: /}, route: {cluster: upstream}}]",
    },
    Hcm {
        name: "xff",
        mtls: false,
        filters: || {
            vec![http_rbac(
                "rules: {policies: {p: {permissions: [{any: true}], principals: [{remote_ip: {address_prefix: 10.1.0.0, prefix_len: 16}}]}}}",
            )]
        },
        routes: EVERYTHING,
    },
    Hcm {
        name: "mtls",
        mtls: true,
        filters: || {
            vec![http_rbac(&format!(
                "rules: {{policies: {{p: {{permissions: [{{header: {{name: ':scheme', string_match: {{exact: https}}}}}}], \
                 principals: [{{authenticated: {{principal_name: {{exact: \"{}\"}}}}}}]}}}}}}",
                super::SLEEP
            ))]
        },
        routes: EVERYTHING,
    },
    Hcm {
        name: "istio",
        mtls: true,
        filters: || vec![super::istio_filter("http/deny-and-allow-out1.yaml")],
        routes: EVERYTHING,
    },
];

/// A request: connection manager, client, method, path, extra header lines, expected status.
type Case = (
    &'static str,
    Client,
    &'static str,
    &'static str,
    &'static str,
    u16,
);

fn cases() -> Vec<Case> {
    use Client::*;
    vec![
        ("allow", Local, "GET", "/info/1?q=2", "", 200),
        ("allow", Local, "GET", "/INFO", "", 403),
        ("allow", Local, "GET", "/other", "x-dry: 1\r\n", 403),
        ("allow", Local, "POST", "/data", "x-dry: 1\r\n", 200),
        ("allow", Other, "POST", "/data", "", 403),
        ("allow", Local, "POST", "/data?x", "", 200),
        ("deny", Local, "GET", "/fine", "x-user: good\r\n", 200),
        ("deny", Local, "GET", "/fine", "x-user: evil\r\n", 403),
        ("deny", Local, "GET", "/Upper", "", 403),
        ("log", Local, "GET", "/logged", "", 200),
        ("log", Local, "GET", "/other", "", 200),
        ("routes", Local, "GET", "/open", "", 200),
        ("routes", Local, "GET", "/override", "", 200),
        ("routes", Local, "POST", "/override", "", 403),
        ("routes", Local, "GET", "/disabled", "", 200),
        ("routes", Local, "GET", "/other", "", 403),
        (
            "xff",
            Local,
            "GET",
            "/",
            "x-forwarded-for: 10.1.2.3\r\n",
            200,
        ),
        (
            "xff",
            Local,
            "GET",
            "/",
            "x-forwarded-for: 10.2.2.3\r\n",
            403,
        ),
        ("xff", Local, "GET", "/", "", 403),
        ("mtls", Workload, "GET", "/", "", 200),
        ("mtls", Stranger, "GET", "/", "", 403),
        ("mtls", Anonymous, "GET", "/", "", 403),
        ("istio", Workload, "GET", "/", "", 200),
        ("istio", Anonymous, "GET", "/", "", 200),
    ]
}

/// Each connection manager's access log line: the path (which carries the case's token), the
/// status and the response details.
const LOG_FORMAT: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS%\\n";

/// Where the run whose admin listens on `admin` writes its access log.
fn log_path(kit: &Kit, admin: u16) -> String {
    kit.path(&format!("access-{admin}.log"))
}

fn bootstrap(kit: &Kit, admin: u16, ports: &[u16], upstream: u16) -> String {
    let mut yaml = super::bootstrap_head(admin);
    for (h, port) in HCMS.iter().zip(ports) {
        let mut filters = String::new();
        for f in (h.filters)() {
            let f: String = f.lines().map(|l| format!("            {l}\n")).collect();
            filters.push_str(&format!("          - {}", f.trim_start()));
        }
        yaml.push_str(&format!(
            "  - name: {name}\n    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}\n    \
             filter_chains:\n    - filters:\n      - name: hcm\n        typed_config:\n          \
             \"@type\": {hcm}\n          stat_prefix: {name}\n          http_filters:\n{filters}          \
             - {{name: r, typed_config: {{\"@type\": {router}}}}}\n          \
             route_config: {{virtual_hosts: [{{name: a, domains: [\"*\"], routes: {routes}}}]}}\n          \
             access_log: [{{name: envoy.access_loggers.file, typed_config: {{\"@type\": \
             type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {log}, \
             log_format: {{text_format_source: {{inline_string: \"{LOG_FORMAT}\"}}}}}}}}]\n",
            name = h.name,
            log = log_path(kit, admin),
            hcm = super::HCM,
            router = super::ROUTER,
            routes = h.routes,
        ));
        if h.mtls {
            yaml.push_str(&super::tls_socket(kit, true));
        }
    }
    yaml.push_str(&super::upstream_cluster(upstream));
    yaml
}

/// Sends one request (its path tagged with `token`) and returns the status and body (status
/// 0: no response).
fn request(kit: &Kit, port: u16, mtls: bool, case: &Case, token: &str) -> (u16, String) {
    let (_, client, method, path, headers, _) = *case;
    let sep = if path.contains('?') { '&' } else { '?' };
    let head = format!(
        "{method} {path}{sep}{token} HTTP/1.1\r\nhost: x\r\n{headers}content-length: 0\r\nconnection: close\r\n\r\n"
    );
    let Ok(mut tcp) = connect(client, port) else {
        return (0, String::new());
    };
    let mut raw = Vec::new();
    if mtls {
        let name = ServerName::try_from("server.test").expect("server name");
        let mut tls = ClientConnection::new(tls_client(kit, client), name).expect("client");
        let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
        if stream.write_all(head.as_bytes()).is_err() {
            return (0, String::new());
        }
        // Envoy closes without close_notify; what arrived before counts.
        let _ = stream.read_to_end(&mut raw);
    } else {
        if tcp.write_all(head.as_bytes()).is_err() {
            return (0, String::new());
        }
        let _ = tcp.read_to_end(&mut raw);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

/// What one proxy did: each request's status and body, whether the upstream saw it, its
/// access log line (status and response details), and the `rbac.` counters.
struct Run {
    replies: Vec<(u16, String)>,
    reached: Vec<bool>,
    logged: Vec<Option<String>>,
    stats: std::collections::BTreeMap<String, u64>,
}

fn run_all(kit: &Kit, start: &dyn Fn(&str, u16, u16) -> Proxy) -> Run {
    let (upstream, seen) = super::upstream();
    let ports: Vec<u16> = HCMS.iter().map(|_| free_port()).collect();
    let admin = free_port();
    let yaml = bootstrap(kit, admin, &ports, upstream);
    let _proxy = start(&yaml, admin, *ports.last().expect("listeners"));
    let tokens: Vec<String> = (0..cases().len()).map(|i| format!("case-{i}-")).collect();
    let replies = cases()
        .iter()
        .zip(&tokens)
        .map(|(case, token)| {
            let i = HCMS
                .iter()
                .position(|h| h.name == case.0)
                .expect("a connection manager of that name");
            request(kit, ports[i], HCMS[i].mtls, case, token)
        })
        .collect();
    let seen = seen.lock().unwrap().clone();
    // The logs are flushed every 50 ms.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = std::fs::read_to_string(log_path(kit, admin)).unwrap_or_default();
    let logged = tokens
        .iter()
        .map(|t| {
            log.lines().find_map(|l| {
                l.split_once(t.as_str())
                    .map(|(_, rest)| rest.trim().to_owned())
            })
        })
        .collect();
    Run {
        replies,
        reached: tokens.iter().map(|t| seen.contains(t.as_str())).collect(),
        logged,
        stats: rbac_stats(admin),
    }
}

#[test]
fn http_rbac_as_envoy() {
    let Some((from_envoy, from_revoy)) = super::on_both("http_rbac_as_envoy", run_all) else {
        return;
    };
    let mut wrong = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        let (name, client, method, path, headers, expect) = case;
        let what = format!("{name} / {client:?} {method} {path} {headers:?}");
        let (envoy, revoy) = (&from_envoy.replies[i], &from_revoy.replies[i]);
        if envoy.0 != *expect {
            wrong.push(format!("{what}: Envoy {envoy:?}, expected status {expect}"));
        }
        if revoy != envoy {
            wrong.push(format!("{what}: revoy {revoy:?}, Envoy {envoy:?}"));
        }
        let details = &from_envoy.logged[i];
        let rbac_denied = details
            .as_deref()
            .is_some_and(|d| d.contains("rbac_access_denied_matched_policy["));
        if rbac_denied != (*expect == 403) {
            wrong.push(format!("{what}: Envoy logged {details:?}"));
        }
        if from_revoy.logged[i] != *details {
            wrong.push(format!(
                "{what}: revoy logged {:?}, Envoy {details:?}",
                from_revoy.logged[i]
            ));
        }
        let passed = *expect == 200;
        if from_envoy.reached[i] != passed || from_revoy.reached[i] != passed {
            wrong.push(format!(
                "{what}: reached the upstream through Envoy {}, revoy {}",
                from_envoy.reached[i], from_revoy.reached[i]
            ));
        }
    }
    compare_stats(&from_envoy.stats, &from_revoy.stats, &mut wrong);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
