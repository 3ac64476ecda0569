//! CLI-level tests of the `revoy` binary: `--mode validate` over Istio's bootstrap goldens
//! (`tests/data/istio-bootstrap`, see `tests/data/PROVENANCE.md`), bad input compared with
//! Envoy, Envoy's flags (pilot-agent's argv, old and new), `--version`, and `--config-yaml`
//! merged over `-c`. Without Envoy the tests still check revoy, and their Envoy half is reported
//! as skipped (`support/skip.rs`), or fails under `CI=true`.

#[path = "differential/oracle.rs"]
mod oracle;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use ports::free_port;

fn revoy() -> Command {
    Command::new(env!("CARGO_BIN_EXE_revoy"))
}

/// Runs `command` to completion, killing it (by PID) after 30 s.
fn run(mut command: Command) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = child.unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{command:?} did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn scratch(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("revoy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write scratch file");
    path
}

fn valid_yaml() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/valid.yaml");
    std::fs::read_to_string(path).expect("tests/cli/valid.yaml")
}

fn validate(program: Command, config: &Path, extra: &[&str]) -> Output {
    let mut command = program;
    command
        .args(["--mode", "validate", "-c"])
        .arg(config)
        .args(extra);
    run(command)
}

fn envoy_command(envoy: &Path) -> Command {
    let mut command = Command::new(envoy);
    command.args(["--base-id", &std::process::id().to_string()]);
    command
}

/// The goldens in `tests/data/istio-bootstrap`: one per case of Istio's bootstrap test.
const ISTIO_GOLDENS: usize = 30;

/// Envoy itself rejects these two goldens (an Istio-only extension and a tracer removed from
/// Envoy); revoy must still accept them, since istio-proxy builds carry those extensions.
const ENVOY_REJECTS: [&str; 2] = ["ambient_golden.json", "tracing_lightstep_golden.json"];

#[test]
fn validate_accepts_every_istio_bootstrap_golden() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/istio-bootstrap");
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("Istio goldens missing at {}: {e}", dir.display()));
    let mut goldens: Vec<PathBuf> = entries
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.to_string_lossy().ends_with("_golden.json"))
        .collect();
    goldens.sort();
    assert_eq!(
        goldens.len(),
        ISTIO_GOLDENS,
        "Istio goldens in {}",
        dir.display()
    );
    let envoy = oracle::envoy_or_skip(
        "the Envoy half of cli::validate_accepts_every_istio_bootstrap_golden",
    );
    let mut failures = Vec::new();
    let mut with_tls = 0;
    for golden in &goldens {
        let name = golden
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        if let Some(envoy) = &envoy {
            let envoy_ok = validate(envoy_command(envoy), golden, &[]).status.success();
            assert_eq!(
                envoy_ok,
                !ENVOY_REJECTS.contains(&name.as_str()),
                "Envoy's verdict on {name} changed"
            );
        }
        // Every golden compiles and validates, those with TLS contexts (upstream TLS for a
        // metrics or tracing service, a listener whose certificates come from SDS) included:
        // none fails closed.
        let output = validate(revoy(), golden, &[]);
        let out = text(&output);
        if out.contains("error initializing configuration")
            || !output.status.success()
            || out.contains("not implemented (fails closed)")
        {
            failures.push(format!("{name}: exit {:?}\n{out}", output.status.code()));
        }
        if std::fs::read_to_string(golden)
            .expect("golden readable")
            .contains("TlsContext")
        {
            with_tls += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "revoy --mode validate rejected:\n{}",
        failures.join("\n")
    );
    assert!(with_tls > 0, "no golden uses TLS any more");
}

/// Every bootstrap in `examples/` is one that revoy serves with nothing skipped and that
/// Envoy 1.40 accepts, as their comments say.
#[test]
fn the_examples_validate_in_revoy_and_envoy() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut examples: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 2, "examples: {examples:?}");
    let envoy =
        oracle::envoy_or_skip("the Envoy half of cli::the_examples_validate_in_revoy_and_envoy");
    for example in &examples {
        let output = validate(revoy(), example, &[]);
        let out = text(&output);
        assert!(
            output.status.success() && !out.contains("not implemented"),
            "revoy --mode validate {}: {out}",
            example.display()
        );
        if let Some(envoy) = &envoy {
            let output = validate(envoy_command(envoy), example, &[]);
            assert!(
                output.status.success(),
                "envoy --mode validate {}: {}",
                example.display(),
                text(&output)
            );
        }
    }
}

/// One bad bootstrap: a one-line edit of `valid.yaml`, words revoy's error must contain (the
/// field path among them), and whether Envoy 1.40 rejects it too (where it does not, revoy's
/// stricter verdict is listed in the README's differences).
struct BadInput {
    name: &'static str,
    from: &'static str,
    to: &'static str,
    words: &'static [&'static str],
    envoy_rejects: bool,
}

const BAD_INPUTS: [BadInput; 32] = [
    BadInput {
        name: "typo field",
        from: "    type: STATIC",
        to: "    typo_field: STATIC",
        words: &["typo_field", "static_resources.clusters[0]"],
        envoy_rejects: true,
    },
    BadInput {
        name: "wrong type",
        from: "port_value: 10001",
        to: "port_value: \"not-a-number\"",
        words: &[
            "static_resources.clusters[0].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "unknown cluster in a route",
        from: "route: {cluster: a}",
        to: "route: {cluster: missing_cluster}",
        words: &[
            "missing_cluster",
            "unknown",
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].route",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "invalid regex",
        from: "match: {prefix: \"/\"}",
        to: "match: {safe_regex: {regex: \"(unclosed\"}}",
        words: &[
            "(unclosed",
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].match.safe_regex",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "duplicate listener address",
        from: "  clusters:",
        to: "  - name: l2\n    address: {socket_address: {address: 127.0.0.1, port_value: 10000}}\n    filter_chains:\n    - filters:\n      - name: envoy.filters.network.tcp_proxy\n        typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: a}\n  clusters:",
        words: &[
            "duplicate",
            "127.0.0.1:10000",
            "static_resources.listeners[1]",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "duplicate cluster",
        from: "  - name: a\n    type: STATIC",
        to: "  - name: a\n    type: STATIC\n    load_assignment: {cluster_name: a}\n  - name: a\n    type: STATIC",
        words: &["static_resources.clusters[1]", "duplicate cluster 'a'"],
        envoy_rejects: true,
    },
    BadInput {
        name: "empty cluster name",
        from: "  - name: a\n    type: STATIC",
        to: "  - name: \"\"\n    type: STATIC",
        words: &["static_resources.clusters[0].name", "at least 1 characters"],
        envoy_rejects: true,
    },
    BadInput {
        name: "zero weight",
        from: "{lb_endpoints: [{endpoint:",
        to: "{lb_endpoints: [{load_balancing_weight: 0, endpoint:",
        words: &[
            "static_resources.clusters[0].load_assignment.endpoints[0].lb_endpoints[0].load_balancing_weight",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "negative connect_timeout",
        from: "    type: STATIC",
        to: "    type: STATIC\n    connect_timeout: -1s",
        words: &["static_resources.clusters[0].connect_timeout"],
        envoy_rejects: true,
    },
    BadInput {
        name: "original dst with endpoints",
        from: "    type: STATIC",
        to: "    type: ORIGINAL_DST\n    lb_policy: CLUSTER_PROVIDED",
        words: &[
            "static_resources.clusters[0].load_assignment",
            "ORIGINAL_DST",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "original dst round robin",
        from: "    type: STATIC\n    load_assignment:\n      cluster_name: a\n      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 10001}}}}]}]",
        to: "    type: ORIGINAL_DST",
        words: &["static_resources.clusters[0].lb_policy", "ROUND_ROBIN"],
        envoy_rejects: true,
    },
    BadInput {
        name: "malformed listener ip",
        from: "address: 127.0.0.1, port_value: 10000",
        to: "address: 127.0.0.300, port_value: 10000",
        words: &[
            "static_resources.listeners[0].address.socket_address.address",
            "127.0.0.300",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "port out of range",
        from: "port_value: 10000",
        to: "port_value: 70000",
        words: &[
            "static_resources.listeners[0].address.socket_address.port_value",
            "70000",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "hcm without routes",
        from: "          route_config:\n            virtual_hosts:\n            - name: all\n              domains: [\"*\"]\n              routes: [{match: {prefix: \"/\"}, route: {cluster: a}}]",
        to: "",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_specifier",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "no filter chains",
        from: "    filter_chains:\n    - filters:\n      - name: envoy.filters.network.http_connection_manager",
        to: "    filter_chains: []\n    xx_filters:\n      - name: envoy.filters.network.http_connection_manager",
        words: &["static_resources.listeners[0]", "xx_filters"],
        envoy_rejects: true,
    },
    BadInput {
        name: "duplicate domain",
        from: "              domains: [\"*\"]",
        to: "              domains: [\"a.example\", \"a.example\"]",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].domains[1]",
            "a.example",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "two catch-all vhosts",
        from: "              domains: [\"*\"]\n              routes: [{match: {prefix: \"/\"}, route: {cluster: a}}]",
        to: "              domains: [\"*\"]\n              routes: [{match: {prefix: \"/\"}, route: {cluster: a}}]\n            - name: all2\n              domains: [\"*\"]",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[1].domains[0]",
            "single wildcard",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "dns refresh too small",
        from: "    type: STATIC",
        to: "    type: STRICT_DNS\n    dns_refresh_rate: 0.0001s",
        words: &["static_resources.clusters[0].dns_refresh_rate", "1ms"],
        envoy_rejects: true,
    },
    BadInput {
        name: "direct response status 99",
        from: "route: {cluster: a}",
        to: "direct_response: {status: 99}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].direct_response.status",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "prefix and regex rewrite",
        from: "route: {cluster: a}",
        to: "route: {cluster: a, prefix_rewrite: /x, regex_rewrite: {pattern: {regex: a}, substitution: b}}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].route",
            "prefix_rewrite",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "weighted clusters unknown",
        from: "route: {cluster: a}",
        to: "route: {weighted_clusters: {clusters: [{name: a, weight: 1}, {name: nope, weight: 1}]}}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].route.weighted_clusters.clusters[1]",
            "'nope'",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "missing hcm stat_prefix",
        from: "          stat_prefix: l\n",
        to: "",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.stat_prefix",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "tcp proxy no cluster",
        from: "  clusters:",
        to: "  - name: l3\n    address: {socket_address: {address: 127.0.0.1, port_value: 10003}}\n    filter_chains:\n    - filters:\n      - name: envoy.filters.network.tcp_proxy\n        typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t}\n  clusters:",
        words: &[
            "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.cluster_specifier",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "unknown lb policy",
        from: "    type: STATIC",
        to: "    type: STATIC\n    lb_policy: NOPE_POLICY",
        words: &["static_resources.clusters[0].lb_policy", "NOPE_POLICY"],
        envoy_rejects: true,
    },
    BadInput {
        name: "route timeout wrong",
        from: "route: {cluster: a}",
        to: "route: {cluster: a, timeout: soon}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].route.timeout",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "bad cidr",
        from: "    filter_chains:\n    - filters:",
        to: "    filter_chains:\n    - filter_chain_match: {prefix_ranges: [{address_prefix: 127.0.0.300, prefix_len: 8}]}\n      filters:",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filter_chain_match.prefix_ranges[0].address_prefix",
            "127.0.0.300",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "redirect and route",
        from: "route: {cluster: a}",
        to: "route: {cluster: a}, redirect: {host_redirect: x}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0]",
            "oneof",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "missing route action",
        from: "{match: {prefix: \"/\"}, route: {cluster: a}}",
        to: "{match: {prefix: \"/\"}}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].action",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "missing match",
        from: "{match: {prefix: \"/\"}, route: {cluster: a}}",
        to: "{route: {cluster: a}}",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].match",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "duplicate listener name",
        from: "  clusters:",
        to: "  - name: l\n    address: {socket_address: {address: 127.0.0.1, port_value: 10002}}\n    filter_chains:\n    - filters:\n      - name: envoy.filters.network.tcp_proxy\n        typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: a}\n  clusters:",
        words: &["static_resources.listeners[1]", "duplicate listener name"],
        envoy_rejects: false,
    },
    BadInput {
        name: "bootstrap bind config of one IP version twice",
        from: "static_resources:",
        to: "cluster_manager: {upstream_bind_config: {source_address: {address: 127.0.0.3, port_value: 0}, extra_source_addresses: [{address: {address: 127.0.0.4, port_value: 0}}]}}\nstatic_resources:",
        words: &[
            "cluster_manager.upstream_bind_config.extra_source_addresses[0].address",
            "Bootstrap's upstream binding config has two same IP version source addresses",
        ],
        envoy_rejects: true,
    },
    BadInput {
        name: "invalid header name",
        from: "              domains: [\"*\"]",
        to: "              domains: [\"*\"]\n              request_headers_to_add: [{header: {key: \"bad header\", value: v}}]",
        words: &[
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].request_headers_to_add",
            "bad header",
        ],
        envoy_rejects: false,
    },
];

#[test]
fn bad_input_fails_like_envoy() {
    let valid = valid_yaml();
    let envoy = oracle::envoy_or_skip("the Envoy half of cli::bad_input_fails_like_envoy");
    if let Some(envoy) = &envoy {
        let ok = validate(envoy_command(envoy), &scratch("valid.yaml", &valid), &[]);
        assert!(
            ok.status.success(),
            "Envoy rejects the valid base:\n{}",
            text(&ok)
        );
    }
    let mut failures = Vec::new();
    for bad in &BAD_INPUTS {
        assert!(
            valid.contains(bad.from),
            "{}: valid.yaml lacks {:?}",
            bad.name,
            bad.from
        );
        let config = scratch(
            &format!("{}.yaml", bad.name.replace(' ', "_")),
            &valid.replacen(bad.from, bad.to, 1),
        );
        if let Some(envoy) = &envoy {
            let output = validate(envoy_command(envoy), &config, &[]);
            assert_eq!(
                output.status.code(),
                Some(if bad.envoy_rejects { 1 } else { 0 }),
                "{}: Envoy's verdict changed:\n{}",
                bad.name,
                text(&output)
            );
        }
        let mut modes: Vec<(&str, Output)> =
            vec![("--mode validate", validate(revoy(), &config, &[]))];
        let mut serve = revoy();
        serve.arg("-c").arg(&config).args(["--concurrency", "1"]);
        modes.push(("serve", run(serve)));
        for (mode, output) in modes {
            let message = text(&output);
            let missing: Vec<_> = bad
                .words
                .iter()
                .filter(|w| !message.contains(**w))
                .collect();
            if output.status.code() != Some(1) || !missing.is_empty() {
                failures.push(format!(
                    "{} ({mode}): exit {:?}, missing words {missing:?} in:\n{message}",
                    bad.name,
                    output.status.code()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// pilot-agent's current argv (istio-contract.md §1.2), every optional flag included.
const PILOT_AGENT_FLAGS: &[&str] = &[
    "--drain-time-s",
    "45",
    "--drain-strategy",
    "immediate",
    "--local-address-ip-version",
    "v4",
    "--file-flush-interval-msec",
    "1000",
    "--disable-hot-restart",
    "--allow-unknown-static-fields",
    "--file-flush-min-size-kb",
    "64",
    "-l",
    "warning",
    "--component-log-level",
    "misc:error",
    "--skip-deprecated-logs",
    "--enable-core-dump",
    "--concurrency",
    "2",
    "--log-format",
    "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t",
];

/// Flags of the Istio 1.0 to 1.10 era (istio-contract.md §1.3 and the flag history table).
const OLD_ISTIO_FLAGS: &[&str] = &[
    "--restart-epoch",
    "0",
    "--parent-shutdown-time-s",
    "60",
    "--service-cluster",
    "istio-proxy",
    "--service-node",
    "sidecar~10.1.2.3~pod.ns~ns.svc.cluster.local",
    "--max-obj-name-len",
    "189",
    "--allow-unknown-fields",
    "--service-zone",
    "az-1",
    "--v2-config-only",
    "--bootstrap-version",
    "3",
    "--reject-unknown-dynamic-fields",
    "--log-path",
    "/dev/null",
];

#[test]
fn accepts_pilot_agent_flags() {
    let config = scratch("flags.yaml", &valid_yaml());
    let output = validate(revoy(), &config, PILOT_AGENT_FLAGS);
    assert!(
        output.status.success(),
        "pilot-agent's argv rejected:\n{}",
        text(&output)
    );
    if let Some(envoy) = oracle::envoy_or_skip("the Envoy half of cli::accepts_pilot_agent_flags") {
        let output = validate(envoy_command(&envoy), &config, PILOT_AGENT_FLAGS);
        assert!(
            output.status.success(),
            "Envoy rejects pilot-agent's argv:\n{}",
            text(&output)
        );
    }
}

#[test]
fn accepts_old_istio_flags() {
    let config = scratch("old_flags.yaml", &valid_yaml());
    let output = validate(revoy(), &config, OLD_ISTIO_FLAGS);
    assert!(
        output.status.success(),
        "old Istio flags rejected:\n{}",
        text(&output)
    );
}

#[test]
fn version_names_the_version() {
    let mut command = revoy();
    command.arg("--version");
    let output = run(command);
    let message = text(&output);
    assert!(output.status.success(), "--version failed:\n{message}");
    assert!(
        message.contains("version:"),
        "--version output lacks `version:` (Envoy's shape):\n{message}"
    );
}

#[test]
fn config_yaml_is_merged_over_the_file() {
    let broken = scratch(
        "needs_cluster.yaml",
        &valid_yaml().replacen("route: {cluster: a}", "route: {cluster: extra}", 1),
    );
    let adds_cluster = "{static_resources: {clusters: [{name: extra, type: STATIC, load_assignment: {cluster_name: extra}}]}}";
    let duplicates_cluster = "{static_resources: {clusters: [{name: a, type: STATIC}]}}";
    let valid = scratch("merge_base.yaml", &valid_yaml());
    let cases: [(&str, &Path, &[&str], bool); 3] = [
        (
            "the file alone routes to a missing cluster",
            &broken,
            &[],
            false,
        ),
        (
            "--config-yaml appends the missing cluster",
            &broken,
            &["--config-yaml", adds_cluster],
            true,
        ),
        (
            "repeated fields append, so a second `a` is a duplicate",
            &valid,
            &["--config-yaml", duplicates_cluster],
            false,
        ),
    ];
    let envoy = oracle::envoy_or_skip("the Envoy half of cli::config_yaml_is_merged_over_the_file");
    for (name, config, extra, accepted) in cases {
        if let Some(envoy) = &envoy {
            let output = validate(envoy_command(envoy), config, extra);
            assert_eq!(
                output.status.success(),
                accepted,
                "Envoy, {name}:\n{}",
                text(&output)
            );
        }
        let output = validate(revoy(), config, extra);
        assert_eq!(
            output.status.success(),
            accepted,
            "revoy, {name}:\n{}",
            text(&output)
        );
        if !accepted {
            assert_eq!(output.status.code(), Some(1), "revoy, {name}: exit code");
        }
    }
}

/// Starts `command`, waits up to 15 s for `port` to accept, checks that `unbound` does not,
/// and kills the child (by its PID).
fn serves_on(mut command: Command, port: u16, unbound: u16) -> Result<(), String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let result = loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            if std::net::TcpStream::connect(("127.0.0.1", unbound)).is_ok() {
                break Err(format!("port {unbound} is bound too"));
            }
            break Ok(());
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Err(format!("exited early with {status}"));
        }
        if Instant::now() > deadline {
            break Err(format!("nothing listens on {port} after 15 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    result.map_err(|e| format!("{e}; stderr:\n{}", String::from_utf8_lossy(&output.stderr)))
}

#[test]
fn config_yaml_overrides_a_scalar_of_the_file() {
    let (file_admin, yaml_admin, listener) = (free_port(), free_port(), free_port());
    let base = valid_yaml().replacen("port_value: 10000", &format!("port_value: {listener}"), 1);
    let base = format!(
        "admin:\n  address: {{socket_address: {{address: 127.0.0.1, port_value: {file_admin}}}}}\n{base}"
    );
    let config = scratch("scalar_override.yaml", &base);
    let overlay =
        format!("{{admin: {{address: {{socket_address: {{port_value: {yaml_admin}}}}}}}}}");
    let mut programs = vec![("revoy", revoy())];
    if let Some(envoy) =
        oracle::envoy_or_skip("the Envoy half of cli::config_yaml_overrides_a_scalar_of_the_file")
    {
        let mut command = Command::new(envoy);
        command.args([
            "--base-id",
            &yaml_admin.to_string(),
            "--disable-hot-restart",
        ]);
        programs.insert(0, ("envoy", command));
    }
    for (name, mut command) in programs {
        command.arg("-c").arg(&config).args([
            "--config-yaml",
            &overlay,
            "--concurrency",
            "1",
            "-l",
            "warning",
        ]);
        let served = serves_on(command, yaml_admin, file_admin);
        assert!(
            served.is_ok(),
            "{name}: admin should move to the --config-yaml port: {served:?}"
        );
    }
}

/// Forms Envoy's config parser accepts beyond proto3 JSON, and near misses it refuses, each a
/// one-line edit of `valid.yaml`: `(name, from, to, Envoy accepts)`. revoy's verdict must be
/// Envoy's.
const LAX_INPUTS: [(&str, &str, &str, bool); 17] = [
    (
        "lower-case enums",
        "    type: STATIC",
        "    type: static\n    lb_policy: round_robin",
        true,
    ),
    (
        "mixed-case enum",
        "    type: STATIC",
        "    type: Strict_Dns",
        true,
    ),
    (
        "enum number in a string",
        "    type: STATIC",
        "    type: \"0\"",
        true,
    ),
    (
        "enum in camel case",
        "    type: STATIC",
        "    type: STATIC\n    lb_policy: roundRobin",
        false,
    ),
    (
        "lower-case enum inside a typed_config",
        "stat_prefix: l\n",
        "stat_prefix: l\n          codec_type: http1\n",
        true,
    ),
    (
        "a string for a list of strings",
        "domains: [\"*\"]",
        "domains: \"*\"",
        true,
    ),
    (
        "lists nested in a list",
        "domains: [\"*\"]",
        "domains: [[\"*\"], [a.test]]",
        true,
    ),
    (
        "a number for a list of strings",
        "domains: [\"*\"]",
        "domains: 5",
        false,
    ),
    (
        "an object for a list of network filters",
        "      - name: envoy.filters.network.http_connection_manager",
        "        name: envoy.filters.network.http_connection_manager",
        true,
    ),
    (
        "an object for a list of routes",
        "routes: [{match: {prefix: \"/\"}, route: {cluster: a}}]",
        "routes: {match: {prefix: \"/\"}, route: {cluster: a}}",
        true,
    ),
    (
        "bools in strings",
        "stat_prefix: l\n",
        "stat_prefix: l\n          use_remote_address: \"yes\"\n          skip_xff_append: \"false\"\n",
        true,
    ),
    (
        "a number for a bool",
        "stat_prefix: l\n",
        "stat_prefix: l\n          use_remote_address: 1\n",
        false,
    ),
    // yaml-cpp reads the plain YAML 1.1 words (`y`, `yes`, `on`, `n`, `no`, `off`, ...; lower
    // case, upper case or capitalised) as booleans, which a string field refuses.
    (
        "a plain n for a string",
        "stat_prefix: l\n",
        "stat_prefix: n\n",
        false,
    ),
    (
        "a plain Off for a string",
        "stat_prefix: l\n",
        "stat_prefix: Off\n",
        false,
    ),
    (
        "a quoted n for a string",
        "stat_prefix: l\n",
        "stat_prefix: 'n'\n",
        true,
    ),
    (
        "a plain oN for a string",
        "stat_prefix: l\n",
        "stat_prefix: oN\n",
        true,
    ),
    (
        "plain YAML 1.1 words for bools",
        "stat_prefix: l\n",
        "stat_prefix: l\n          use_remote_address: Yes\n          skip_xff_append: OFF\n",
        true,
    ),
];

#[test]
fn lax_forms_get_envoys_verdict() {
    let valid = valid_yaml();
    let envoy = oracle::envoy_or_skip("cli::lax_forms_get_envoys_verdict");
    let mut failures = Vec::new();
    for (name, from, to, envoy_accepts) in LAX_INPUTS {
        assert!(valid.contains(from), "{name}: valid.yaml lacks {from:?}");
        let config = scratch(
            &format!("lax_{}.yaml", name.replace(' ', "_")),
            &valid.replacen(from, to, 1),
        );
        if let Some(envoy) = &envoy {
            let output = validate(envoy_command(envoy), &config, &[]);
            assert_eq!(
                output.status.success(),
                envoy_accepts,
                "{name}: Envoy's verdict changed:\n{}",
                text(&output)
            );
        }
        let output = validate(revoy(), &config, &[]);
        if output.status.success() != envoy_accepts {
            failures.push(format!(
                "{name}: Envoy {}, revoy exit {:?}:\n{}",
                if envoy_accepts { "accepts" } else { "refuses" },
                output.status.code(),
                text(&output)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Runtime layers at validation: a disk layer whose `symlink_root` sits in a directory that
/// does not exist is refused by both (Envoy cannot watch it), with Envoy's message; an RTDS
/// layer over ADS without `dynamic_resources.ads_config`, which Envoy's validation accepts
/// but its start-up refuses with this message, is refused by revoy already at validation.
#[test]
fn runtime_layers_get_envoys_verdict_or_are_refused_by_name() {
    let missing = std::env::temp_dir().join("revoy-cli-no-such-dir/current");
    let with_layer = |layer: &str| {
        valid_yaml().replacen(
            "static_resources:",
            &format!("node: {{id: v1, cluster: c}}\nlayered_runtime: {{layers: [{layer}]}}\nstatic_resources:"),
            1,
        )
    };
    let cases = [
        (
            "runtime_disk_no_parent.yaml",
            with_layer(&format!(
                "{{name: d, disk_layer: {{symlink_root: {}, subdirectory: envoy}}}}",
                missing.display()
            )),
            false,
            "layered_runtime.layers[0].disk_layer.symlink_root: unable to add filesystem watch for file",
        ),
        (
            "runtime_rtds.yaml",
            with_layer("{name: r, rtds_layer: {name: r, rtds_config: {ads: {}}}}"),
            true,
            "layered_runtime: ADS must be configured to support an ADS config source",
        ),
    ];
    let envoy =
        oracle::envoy_or_skip("cli::runtime_layers_get_envoys_verdict_or_are_refused_by_name");
    for (name, yaml, envoy_accepts, revoy_says) in cases {
        let config = scratch(name, &yaml);
        if let Some(envoy) = &envoy {
            let output = validate(envoy_command(envoy), &config, &[]);
            assert_eq!(
                output.status.success(),
                envoy_accepts,
                "{name}: Envoy's verdict changed:\n{}",
                text(&output)
            );
        }
        let output = validate(revoy(), &config, &[]);
        let message = text(&output);
        assert_eq!(output.status.code(), Some(1), "{name}: {message}");
        assert!(
            message.contains(revoy_says),
            "{name}: missing {revoy_says:?} in:\n{message}"
        );
    }
}

/// A UDP listener (udp_proxy): Envoy serves it; revoy, which has no UDP, refuses the config
/// naming the field and the reason (a known difference in the README).
#[test]
fn udp_listener_is_refused_by_name() {
    let udp = "  - name: udp\n    address: {socket_address: {protocol: UDP, address: 127.0.0.1, port_value: 10002}}\n    listener_filters:\n    - name: envoy.filters.udp_listener.udp_proxy\n      typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.filters.udp.udp_proxy.v3.UdpProxyConfig\n        stat_prefix: udp\n        matcher: {on_no_match: {action: {name: route, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.udp.udp_proxy.v3.Route, cluster: a}}}}\n  clusters:";
    let config = scratch(
        "udp_listener.yaml",
        &valid_yaml().replacen("  clusters:", udp, 1),
    );
    if let Some(envoy) = oracle::envoy_or_skip("cli::udp_listener_is_refused_by_name") {
        let output = validate(envoy_command(&envoy), &config, &[]);
        assert!(
            output.status.success(),
            "Envoy's verdict changed:\n{}",
            text(&output)
        );
    }
    let output = validate(revoy(), &config, &[]);
    let message = text(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    for words in [
        "static_resources.listeners[1].address.socket_address.protocol",
        "UDP listeners",
        "not supported",
    ] {
        assert!(message.contains(words), "missing {words:?} in:\n{message}");
    }
}

/// TLS settings revoy cannot honour are configuration errors naming the field (the README's
/// clear refusals): `ocsp_staple_policy` other than `LENIENT_STAPLING` on a listener's
/// `DownstreamTlsContext`, and `allow_renegotiation: true` on a cluster's
/// `UpstreamTlsContext`. Envoy 1.40 accepts each but `MUST_STAPLE` without an OCSP response
/// ("Required OCSP response is missing from TLS context").
#[test]
fn tls_settings_revoy_cannot_honour_are_refused_by_name() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls-downstream");
    let downstream = |fields: &str| {
        format!(
            "    - transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": \
             type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, {fields}\
             common_tls_context: {{tls_certificates: [{{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}]}}}}}}\n      filters:",
            data.join("server.pem").display(),
            data.join("server.key").display(),
        )
    };
    let upstream = |fields: &str| {
        format!(
            "  - name: a\n    transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": \
             type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, {fields}}}}}"
        )
    };
    let cases = [
        (
            "ocsp_strict.yaml",
            valid_yaml().replacen(
                "    - filters:",
                &downstream("ocsp_staple_policy: STRICT_STAPLING, "),
                1,
            ),
            "static_resources.listeners[0].filter_chains[0].transport_socket.typed_config.ocsp_staple_policy",
            true,
        ),
        (
            "ocsp_must.yaml",
            valid_yaml().replacen(
                "    - filters:",
                &downstream("ocsp_staple_policy: MUST_STAPLE, "),
                1,
            ),
            "static_resources.listeners[0].filter_chains[0].transport_socket.typed_config.ocsp_staple_policy",
            false,
        ),
        (
            "renegotiation.yaml",
            valid_yaml().replacen(
                "  - name: a\n    type: STATIC",
                &format!(
                    "{}\n    type: STATIC",
                    upstream("allow_renegotiation: true")
                ),
                1,
            ),
            "static_resources.clusters[0].transport_socket.typed_config.allow_renegotiation",
            true,
        ),
    ];
    let envoy = oracle::envoy_or_skip("cli::tls_settings_revoy_cannot_honour_are_refused_by_name");
    for (file, yaml, field, envoy_accepts) in cases {
        let config = scratch(file, &yaml);
        if let Some(envoy) = &envoy {
            let output = validate(envoy_command(envoy), &config, &[]);
            assert_eq!(
                output.status.success(),
                envoy_accepts,
                "{file}: Envoy's verdict changed:\n{}",
                text(&output)
            );
        }
        let output = validate(revoy(), &config, &[]);
        let message = text(&output);
        assert_eq!(output.status.code(), Some(1), "{file}: {message}");
        assert!(
            message.contains(field),
            "{file}: missing {field:?} in:\n{message}"
        );
    }
    let lenient = scratch(
        "ocsp_lenient.yaml",
        &valid_yaml().replacen(
            "    - filters:",
            &downstream("ocsp_staple_policy: LENIENT_STAPLING, "),
            1,
        ),
    );
    let output = validate(revoy(), &lenient, &[]);
    assert!(
        output.status.success(),
        "LENIENT_STAPLING: {}",
        text(&output)
    );
}
