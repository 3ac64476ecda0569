//! revoy driven over xDS: an in-process ADS server (`xds_client::server`, SotW and Delta) feeds
//! a revoy child process, and every test asserts what revoy does through HTTP requests to its
//! listeners, its admin endpoints and the ACKs and NACKs the server received. Start-up order,
//! per-type ACKs, per-resource NACKs, live updates (routes, endpoints, clusters, listeners),
//! warming, a control-plane restart, and `path_config_source` files.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_client::server::Snapshot;
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict};

#[path = "support/child.rs"]
mod child;
#[path = "support/h2_frames.rs"]
mod h2_frames;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/ports.rs"]
mod ports;
#[path = "../../xds-client/tests/support/relay.rs"]
mod relay;
#[path = "support/xds.rs"]
mod xds;

use child::Proxy;
use ports::free_port;
use xds::*;

const TYPES: [&str; 4] = [
    CLUSTER_TYPE_URL,
    ENDPOINT_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_TYPE_URL,
];

/// A control plane with no snapshot yet and a revoy subscribed to it; answers the admin port.
fn start(delta: bool) -> (Plane, Proxy, u16) {
    let (admin, xds) = (free_port(), free_port());
    let plane = Plane::start(xds);
    let revoy = start_revoy(&ads_bootstrap(admin, xds, delta), admin);
    (plane, revoy, admin)
}

/// [`start`] over SotW with `--drain-strategy immediate`: the connections of a changed or
/// removed filter chain are told at their next response (under the default gradual strategy
/// not in the drain's first second, as in Envoy).
fn start_draining_at_once() -> (Plane, Proxy, u16) {
    let (admin, xds) = (free_port(), free_port());
    let plane = Plane::start(xds);
    let args = ["--drain-strategy", "immediate"];
    let revoy = start_revoy_with(&ads_bootstrap(admin, xds, false), admin, &args);
    (plane, revoy, admin)
}

/// Waits until `/ready` says LIVE.
fn wait_live(admin: u16) {
    eventually("LIVE", || {
        (ready(admin) == (200, "LIVE".to_owned())).then_some(())
    });
}

/// The dynamic listener `name` of `/config_dump` (panics if absent).
fn dumped_listener(admin: u16, name: &str) -> serde_json::Value {
    dynamic_listeners(admin)
        .into_iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("listener {name} not in /config_dump"))
}

/// Runs GETs on new connections to `port` on a thread until the returned flag is set; the
/// thread answers (successes, failures with their errors).
fn load(
    port: u16,
) -> (
    Arc<AtomicBool>,
    std::thread::JoinHandle<(usize, Vec<String>)>,
) {
    load_on(move || match get(port, "/") {
        Ok(r) if r.status == 200 => Ok(()),
        Ok(r) => Err(format!("{} {}", r.status, r.body)),
        Err(e) => Err(e),
    })
}

/// [`load`] on [::1]:`port`.
fn load_v6(
    port: u16,
) -> (
    Arc<AtomicBool>,
    std::thread::JoinHandle<(usize, Vec<String>)>,
) {
    load_on(
        move || match http1::get(None, (std::net::Ipv6Addr::LOCALHOST, port).into(), "/") {
            Ok((200, _)) => Ok(()),
            Ok((status, body)) => Err(format!("{status} {body}")),
            Err(e) => Err(e),
        },
    )
}

/// Runs `request` on a thread until the returned flag is set; the thread answers
/// (successes, failures with their errors).
fn load_on(
    request: impl Fn() -> Result<(), String> + Send + 'static,
) -> (
    Arc<AtomicBool>,
    std::thread::JoinHandle<(usize, Vec<String>)>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, Vec::new());
        while !flag.load(Ordering::Relaxed) {
            match request() {
                Ok(()) => ok += 1,
                Err(e) => failed.push(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        (ok, failed)
    });
    (stop, thread)
}

/// Ends a [`load`] and asserts no request failed and some succeeded.
fn no_failures(
    load: (
        Arc<AtomicBool>,
        std::thread::JoinHandle<(usize, Vec<String>)>,
    ),
) {
    load.0.store(true, Ordering::Relaxed);
    let (ok, failed) = load.1.join().expect("load thread");
    assert!(
        failed.is_empty(),
        "{} requests failed: {failed:?}",
        failed.len()
    );
    assert!(ok > 0, "no request ran");
}

fn init_order(delta: bool) {
    let up = upstream("upstream-a");
    let port = free_port();
    let (plane, _revoy, admin) = start(delta);
    assert_eq!(ready(admin), (503, "PRE_INITIALIZING".to_owned()));

    // Clusters first: an EDS cluster warms until its endpoints arrive.
    plane.set(Snapshot::new("1").with_message("svc", &eds_cluster("svc")));
    plane.ack(CLUSTER_TYPE_URL, "1");
    assert_eq!(ready(admin).0, 503);
    let (_, init) = admin_get(admin, "/init_dump");
    assert!(init.contains("EDS svc"), "{init}");

    // Endpoints, then listeners: the listener warms until its route configuration arrives.
    plane.set(
        Snapshot::new("2")
            .with_message("svc", &eds_cluster("svc"))
            .with_message("svc", &assignment("svc", up))
            .with_message("main", &rds_listener("main", port, "main", "routes")),
    );
    plane.ack(ENDPOINT_TYPE_URL, "2");
    plane.ack(LISTENER_TYPE_URL, "2");
    assert_eq!(ready(admin), (503, "INITIALIZING".to_owned()));
    let main = dumped_listener(admin, "main");
    assert!(main["warming_state"].is_object(), "{main}");
    assert!(main["active_state"].is_null(), "{main}");
    assert!(refused(port), "a warming listener accepts");
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_warming"),
        Some(1)
    );

    plane.set(
        Snapshot::new("3")
            .with_message("svc", &eds_cluster("svc"))
            .with_message("svc", &assignment("svc", up))
            .with_message("main", &rds_listener("main", port, "main", "routes"))
            .with_message("routes", &route_config("routes", &to_cluster("svc"))),
    );
    plane.ack(ROUTE_TYPE_URL, "3");
    wait_live(admin);
    let r = get(port, "/").expect("first request");
    assert_eq!((r.status, r.body.as_str()), (200, "upstream-a"));
    assert!(dumped_listener(admin, "main")["active_state"].is_object());
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_warming"),
        Some(0)
    );
}

/// `/ready` is 503 PRE_INITIALIZING until CDS and EDS arrived, INITIALIZING until LDS and RDS
/// did (Envoy's cluster manager, then its init manager), then LIVE; the first
/// request routes to the EDS cluster's endpoint.
#[test]
fn init_waits_for_every_type_then_serves_sotw() {
    init_order(false);
}

/// [`init_waits_for_every_type_then_serves_sotw`] over Delta.
#[test]
fn init_waits_for_every_type_then_serves_delta() {
    init_order(true);
}

/// The snapshot of a listener `main` on `port` using RDS `routes` to the EDS cluster `svc`.
fn serving(version: &str, port: u16, up: u16, route_to: &str) -> Snapshot {
    Snapshot::new(version)
        .with_message("svc", &eds_cluster("svc"))
        .with_message("svc", &assignment("svc", up))
        .with_message("main", &rds_listener("main", port, "main", "routes"))
        .with_message("routes", &route_config("routes", &to_cluster(route_to)))
}

fn acks(delta: bool) {
    let up = upstream("upstream-a");
    let port = free_port();
    let (plane, _revoy, admin) = start(delta);
    plane.set(serving("v1", port, up, "svc"));
    for t in TYPES {
        plane.ack(t, "v1");
    }
    wait_live(admin);
    let events = plane.server.events();
    let status = xds_status(admin);
    for t in TYPES {
        let e = events
            .iter()
            .find(|e| e.type_url == t && e.version == "v1")
            .expect("an event");
        assert_eq!(e.verdict, Verdict::Ack);
        assert!(!e.nonce.is_empty(), "{t}: ACK without nonce");
        let sub = status["subscriptions"]
            .as_array()
            .expect("subscriptions")
            .iter()
            .find(|s| s["type_url"] == t)
            .unwrap_or_else(|| panic!("{t} not in /xds: {status}"));
        assert_eq!(sub["acked_version"], "v1", "{sub}");
        assert_eq!(sub["nonce"], e.nonce.as_str(), "{sub}");
    }
    // A change of one type is answered with that type's new version and a new nonce.
    plane.set(serving("v2", port, up, "svc").with_message(
        "routes",
        &route_config(
            "routes",
            "[{match: {prefix: \"/x\"}, route: {cluster: svc}}, {match: {prefix: \"/\"}, direct_response: {status: 204}}]",
        ),
    ));
    plane.ack(ROUTE_TYPE_URL, "v2");
    let events = plane.server.events();
    let nonces: Vec<&str> = events
        .iter()
        .filter(|e| e.type_url == ROUTE_TYPE_URL)
        .map(|e| e.nonce.as_str())
        .collect();
    assert!(nonces.len() >= 2 && nonces[nonces.len() - 1] != nonces[nonces.len() - 2]);
    assert_eq!(get(port, "/").expect("GET").status, 204);
    assert!(
        events.iter().all(|e| e.verdict == Verdict::Ack),
        "{events:#?}"
    );
}

/// Each type's ACK carries the response's version and nonce (SotW); `/xds` agrees.
#[test]
fn each_type_is_acked_with_version_and_nonce_sotw() {
    acks(false);
}

/// [`each_type_is_acked_with_version_and_nonce_sotw`] over Delta.
#[test]
fn each_type_is_acked_with_version_and_nonce_delta() {
    acks(true);
}

/// One listener of three with an invalid regex: the NACK names it with the field path, the
/// other two serve, `/config_dump` shows its error_state and `update_rejected` counts it. An
/// invalid route configuration update keeps the previous table serving.
#[test]
fn bad_resources_are_nacked_one_by_one() {
    let up = upstream("upstream-a");
    let (p1, p2, p3, p4) = (free_port(), free_port(), free_port(), free_port());
    let (plane, _revoy, admin) = start(false);
    let bad_routes = "[{match: {safe_regex: {regex: \"((\"}}, route: {cluster: svc}}]";
    let snapshot = |version: &str, routes: &str| {
        Snapshot::new(version)
            .with_message("svc", &static_cluster("svc", up))
            .with_message("good-1", &inline_listener("good-1", p1, &to_cluster("svc")))
            .with_message("bad", &inline_listener("bad", p2, bad_routes))
            .with_message("good-2", &inline_listener("good-2", p3, &to_cluster("svc")))
            .with_message("rds", &rds_listener("rds", p4, "rds", "routes"))
            .with_message("routes", &route_config("routes", routes))
    };
    plane.set(snapshot("1", &to_cluster("svc")));
    let Verdict::Nack(reason) = plane.verdict(LISTENER_TYPE_URL, "1") else {
        panic!("the listeners were ACKed");
    };
    assert!(reason.contains("'bad'"), "{reason}");
    assert!(reason.contains("safe_regex"), "no field path: {reason}");
    assert!(!reason.contains("good-"), "{reason}");
    plane.ack(ROUTE_TYPE_URL, "1");
    wait_live(admin);
    assert_eq!(body_of(p1).as_deref(), Some("upstream-a"));
    assert_eq!(body_of(p3).as_deref(), Some("upstream-a"));
    assert_eq!(body_of(p4).as_deref(), Some("upstream-a"));
    assert!(refused(p2), "the rejected listener accepts");
    let bad = dumped_listener(admin, "bad");
    let details = bad["error_state"]["details"].as_str().unwrap_or_default();
    assert!(details.contains("safe_regex"), "{bad}");
    assert!(bad["active_state"].is_null(), "{bad}");
    assert!(dumped_listener(admin, "good-1")["error_state"].is_null());
    assert_eq!(stat(admin, "listener_manager.lds.update_rejected"), Some(1));

    plane.set(snapshot("2", bad_routes));
    let Verdict::Nack(reason) = plane.verdict(ROUTE_TYPE_URL, "2") else {
        panic!("the invalid route configuration was ACKed");
    };
    assert!(reason.contains("'routes'"), "{reason}");
    assert!(reason.contains("safe_regex"), "{reason}");
    assert_eq!(body_of(p4).as_deref(), Some("upstream-a"));
    let status = xds_status(admin);
    let rds = status["subscriptions"]
        .as_array()
        .expect("subscriptions")
        .iter()
        .find(|s| s["type_url"] == ROUTE_TYPE_URL)
        .cloned()
        .expect("RDS in /xds");
    assert_eq!(rds["acked_version"], "1", "{rds}");
}

/// A listener whose access-log file cannot be opened is NACKed with the field and Envoy's
/// reason (`unable to open file ...`), as Envoy's config load refuses it; the others serve.
#[test]
fn a_listener_whose_access_log_cannot_be_opened_is_nacked() {
    let up = upstream("upstream-a");
    let (p1, p2) = (free_port(), free_port());
    let (plane, _revoy, admin) = start(true);
    let dir = std::env::temp_dir().join(format!("revoy-xds-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_log = |name: &str, port: u16, path: &std::path::Path| {
        listener_with(
            name,
            port,
            &format!(
                "stat_prefix: {name}\naccess_log: [{{name: l, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {}}}}}]\nroute_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: {}}}]}}",
                path.display(),
                to_cluster("svc")
            ),
        )
    };
    let logged = dir.join("good.log");
    plane.set(
        Snapshot::new("1")
            .with_message("svc", &static_cluster("svc", up))
            .with_message("good", &with_log("good", p1, &logged))
            .with_message("bad", &with_log("bad", p2, &dir.join("missing/bad.log"))),
    );
    let Verdict::Nack(reason) = plane.verdict(LISTENER_TYPE_URL, "1") else {
        panic!("the listeners were ACKed");
    };
    assert!(reason.contains("'bad'"), "{reason}");
    assert!(
        reason.contains("access_log[0].typed_config.path"),
        "no field path: {reason}"
    );
    assert!(
        reason.contains(&format!(
            "unable to open file '{}': No such file or directory",
            dir.join("missing/bad.log").display()
        )),
        "{reason}"
    );
    assert!(!reason.contains("'good'"), "{reason}");
    wait_live(admin);
    assert!(
        logged.exists(),
        "the good listener's log was not opened at load"
    );
    assert_eq!(body_of(p1).as_deref(), Some("upstream-a"));
    assert!(refused(p2), "the rejected listener accepts");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Route, endpoint and cluster changes apply to the next request, on an open keep-alive
/// connection too.
#[test]
fn route_endpoint_and_cluster_changes_apply_live() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let port = free_port();
    let (plane, _revoy, admin) = start(false);
    let snapshot = |version: &str, route_to: &str, b_at: u16, with_b: bool| {
        let s = Snapshot::new(version)
            .with_message("a", &eds_cluster("a"))
            .with_message("a", &assignment("a", a))
            .with_message("main", &rds_listener("main", port, "main", "routes"))
            .with_message("routes", &route_config("routes", &to_cluster(route_to)));
        if with_b {
            s.with_message("b", &eds_cluster("b"))
                .with_message("b", &assignment("b", b_at))
        } else {
            s
        }
    };
    plane.set(snapshot("1", "a", b, true));
    wait_live(admin);
    let mut conn = Conn::open(port).expect("connect");
    assert_eq!(conn.get("/").expect("GET").body, "upstream-a");

    // RDS: the open connection's next request takes the new table.
    plane.set(snapshot("2", "b", b, true));
    plane.ack(ROUTE_TYPE_URL, "2");
    let r = conn.get("/").expect("GET after RDS");
    assert_eq!(r.body, "upstream-b");
    assert!(!r.closes(), "a route change closed the connection");

    // EDS: cluster b's endpoint moves to upstream a.
    plane.set(snapshot("3", "b", a, true));
    plane.ack(ENDPOINT_TYPE_URL, "3");
    assert_eq!(conn.get("/").expect("GET after EDS").body, "upstream-a");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));

    // CDS: cluster b removed; its route answers 503.
    plane.set(snapshot("4", "b", a, false));
    plane.ack(CLUSTER_TYPE_URL, "4");
    let r = conn.get("/").expect("GET after CDS");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(stat(admin, "cluster_manager.cluster_removed"), Some(1));
}

/// A listener's changed filter chain: the open connection is told to close at its next
/// response (`--drain-strategy immediate`), new connections get the new configuration, none is refused meanwhile; an
/// unchanged listener's connections are left alone; a removed listener stops accepting.
#[test]
fn listener_changes_apply_live() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let (port, other) = (free_port(), free_port());
    let (plane, _revoy, admin) = start_draining_at_once();
    let snapshot = |version: &str, route_to: &str, with_other: bool| {
        let s = Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message("b", &static_cluster("b", b))
            .with_message(
                "main",
                &inline_listener("main", port, &to_cluster(route_to)),
            );
        if with_other {
            s.with_message("other", &inline_listener("other", other, &to_cluster("a")))
        } else {
            s
        }
    };
    plane.set(snapshot("1", "a", true));
    wait_live(admin);
    let mut conn = Conn::open(port).expect("connect");
    assert_eq!(conn.get("/").expect("GET").body, "upstream-a");
    let mut untouched = Conn::open(other).expect("connect");
    assert_eq!(untouched.get("/").expect("GET").body, "upstream-a");

    let running = load(port);
    plane.set(snapshot("2", "b", true));
    plane.ack(LISTENER_TYPE_URL, "2");
    let r = conn.get("/").expect("GET after LDS");
    assert!(
        r.closes(),
        "no connection: close after the chain changed: {r:?}"
    );
    assert_eq!(body_of(port).as_deref(), Some("upstream-b"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    no_failures(running);
    let r = untouched.get("/").expect("GET on the unchanged listener");
    assert!(!r.closes(), "an unchanged listener's connection was closed");
    assert_eq!(
        stat(admin, "listener_manager.listener_in_place_updated"),
        Some(1)
    );

    plane.set(snapshot("3", "b", false));
    plane.ack(LISTENER_TYPE_URL, "3");
    // Worker accept loops stop asynchronously (as Envoy's workers do after its ACK).
    eventually("the removed listener refuses", || {
        refused(other).then_some(())
    });
    let r = untouched
        .get("/")
        .expect("GET on the removed listener's connection");
    assert!(r.closes(), "{r:?}");
    assert_eq!(stat(admin, "listener_manager.listener_removed"), Some(1));
    assert_eq!(body_of(port).as_deref(), Some("upstream-b"));
}

/// A listener added after start-up whose route configuration has not arrived is not active
/// until it does; `/config_dump` shows it warming.
#[test]
fn a_new_listener_warms_until_its_routes_arrive() {
    let a = upstream("upstream-a");
    let (port, late) = (free_port(), free_port());
    let (plane, _revoy, admin) = start(true);
    let base = |version: &str| {
        Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &inline_listener("main", port, &to_cluster("a")))
            .with_message("late", &rds_listener("late", late, "late", "late-routes"))
    };
    plane.set(
        Snapshot::new("1")
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &inline_listener("main", port, &to_cluster("a"))),
    );
    wait_live(admin);
    plane.set(base("2"));
    plane.ack(LISTENER_TYPE_URL, "2");
    let l = dumped_listener(admin, "late");
    assert!(l["warming_state"].is_object(), "{l}");
    assert!(l["active_state"].is_null(), "{l}");
    assert!(refused(late), "a warming listener accepts");
    let (_, listeners) = admin_get(admin, "/listeners");
    assert!(!listeners.contains("late::"), "{listeners}");
    assert_eq!(
        ready(admin).0,
        200,
        "a listener warming after start-up is not start-up"
    );
    // A rejected update meanwhile: the first version still warms, and nothing is active.
    plane.set(base("2b").with_message(
        "late",
        &inline_listener(
            "late",
            late,
            "[{match: {safe_regex: {regex: \"[\"}}, route: {cluster: a}}]",
        ),
    ));
    assert!(matches!(
        plane.verdict(LISTENER_TYPE_URL, "2b"),
        Verdict::Nack(_)
    ));
    let l = dumped_listener(admin, "late");
    assert!(l["warming_state"].is_object(), "{l}");
    assert!(l["active_state"].is_null(), "{l}");

    plane.set(base("3").with_message(
        "late-routes",
        &route_config("late-routes", &to_cluster("a")),
    ));
    plane.ack(ROUTE_TYPE_URL, "3");
    assert_eq!(body_of(late).as_deref(), Some("upstream-a"));
    assert!(dumped_listener(admin, "late")["active_state"].is_object());
    let (_, listeners) = admin_get(admin, "/listeners");
    assert!(listeners.contains("late::"), "{listeners}");
}

/// revoy binds a listener when it comes (one whose address is taken is NACKed, as Envoy's:
/// `tests/xds_differential.rs`) but listens once it has warmed. When another process takes
/// the address meanwhile, the warmed listener cannot be applied: `/config_dump` shows the
/// rejection and no active version, and once the address is free the same listener sent again
/// is taken (Envoy holds its socket from the start, so there it serves).
#[test]
fn a_listener_whose_address_is_taken_while_it_warms_is_taken_when_sent_again() {
    let a = upstream("upstream-a");
    let (port, late, other) = (free_port(), free_port(), free_port());
    let (plane, _revoy, admin) = start(false);
    let base = |version: &str| {
        Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &inline_listener("main", port, &to_cluster("a")))
            .with_message("late", &rds_listener("late", late, "late", "late-routes"))
    };
    let routes = route_config("late-routes", &to_cluster("a"));
    plane.set(base("1"));
    plane.ack(LISTENER_TYPE_URL, "1");
    let holder = std::net::TcpListener::bind(("127.0.0.1", late)).expect("take the address");
    plane.set(base("2").with_message("late-routes", &routes));
    plane.ack(ROUTE_TYPE_URL, "2");
    let l = eventually_dumped(admin, "late", |l| l["error_state"].is_object());
    let details = l["error_state"]["details"].as_str().unwrap_or_default();
    assert!(details.contains("cannot bind listener 'late'"), "{l}");
    assert!(l["active_state"].is_null(), "{l}");
    assert!(l["warming_state"].is_null(), "{l}");
    drop(holder);
    plane.set(
        base("3")
            .with_message("late-routes", &routes)
            .with_message("other", &inline_listener("other", other, &to_cluster("a"))),
    );
    plane.ack(LISTENER_TYPE_URL, "3");
    assert_eq!(body_of(late).as_deref(), Some("upstream-a"));
    assert!(dumped_listener(admin, "late")["active_state"].is_object());
}

/// The dynamic listener `name` of `/config_dump` once `done` holds for it.
fn eventually_dumped(
    admin: u16,
    name: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually(&format!("listener {name} in /config_dump"), || {
        dynamic_listeners(admin)
            .into_iter()
            .find(|l| l["name"] == name && done(l))
    })
}

fn restart(delta: bool) {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let port = free_port();
    let (mut plane, _revoy, admin) = start(delta);
    plane.set(serving("1", port, a, "svc"));
    wait_live(admin);
    assert_eq!(stat(admin, "control_plane.connected_state"), Some(1));
    let counters = [
        "cluster_manager.cluster_added",
        "cluster_manager.cluster_modified",
        "cluster_manager.cluster_removed",
        "listener_manager.listener_added",
        "listener_manager.listener_modified",
        "listener_manager.listener_removed",
    ];
    let before: Vec<_> = counters.iter().map(|c| stat(admin, c)).collect();
    let mut conn = Conn::open(port).expect("connect");
    assert_eq!(conn.get("/").expect("GET").body, "upstream-a");

    let running = load(port);
    let pushed_before = pushes_of(admin, "1");
    assert!(!pushed_before.is_empty());
    plane.kill();
    eventually("connected_state 0", || {
        (stat(admin, "control_plane.connected_state") == Some(0)).then_some(())
    });
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    plane.restart();
    eventually("connected_state 1", || {
        (stat(admin, "control_plane.connected_state") == Some(1)).then_some(())
    });
    if delta {
        // Delta: revoy resubscribes with the versions it holds, so nothing is sent again
        // (checked once the update below has been answered).
    } else {
        // SotW: the restarted server sends every type again; revoy ACKs them unchanged.
        assert!(plane.wait_events(|events| {
            events
                .iter()
                .filter(|e| e.type_url == LISTENER_TYPE_URL && e.version == "1")
                .count()
                >= 2
        }));
    }
    no_failures(running);
    let r = conn
        .get("/")
        .expect("GET on the connection opened before the restart");
    assert_eq!(r.body, "upstream-a");
    assert!(!r.closes(), "a reconnect closed connections: {r:?}");
    let after: Vec<_> = counters.iter().map(|c| stat(admin, c)).collect();
    assert_eq!(before, after, "{counters:?} changed across the reconnect");

    // The new stream carries the subscriptions: an update applies.
    let mut next = serving("2", port, a, "b");
    next = next
        .with_message("b", &eds_cluster("b"))
        .with_message("b", &assignment("b", b));
    plane.set(next);
    plane.ack(ROUTE_TYPE_URL, "2");
    // The route may be acknowledged before `b`'s endpoints arrive (it answers 503 while `b`
    // warms), so its answer is waited for, on the same connection.
    eventually("upstream-b on the held connection", || {
        (conn.get("/").expect("GET").body == "upstream-b").then_some(())
    });
    let events = plane.server.events();
    assert!(
        events.iter().all(|e| e.verdict == Verdict::Ack),
        "{events:#?}"
    );
    if delta {
        assert_eq!(
            pushes_of(admin, "1"),
            pushed_before,
            "resources of version 1 were sent again after the restart"
        );
    }
}

/// The resources revoy received in responses of `version`, per response (`/xds`'s push log).
fn pushes_of(admin: u16, version: &str) -> Vec<serde_json::Value> {
    let status = xds_status(admin);
    status["pushes"]
        .as_array()
        .expect("pushes")
        .iter()
        .filter(|p| p["version"] == version && !p["resources"].as_array().is_none_or(Vec::is_empty))
        .map(|p| p["resources"].clone())
        .collect()
}

/// The control plane dies and comes back on the same port while requests run (SotW): none
/// fails, revoy reconnects and the configuration stays.
#[test]
fn control_plane_restart_sotw() {
    restart(false);
}

/// [`control_plane_restart_sotw`] over Delta (revoy resubscribes with the versions it holds).
#[test]
fn control_plane_restart_delta() {
    restart(true);
}

/// LDS and CDS from `path_config_source` files: written in place, renamed over, and swapped
/// through a `..data` symlink as Kubernetes mounts do; each new version applies.
#[test]
fn path_config_source_files_are_watched() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let (admin, port) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("revoy-xds-files-{}-{admin}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let lds = dir.join("lds.yaml");
    let cds = dir.join("cds.yaml");
    let cluster = |name: &str, port: u16| {
        format!(
            r#"
  - "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
    name: {name}
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}"#
        )
    };
    std::fs::write(
        &cds,
        format!(
            "version_info: c1\nresources:{}{}\n",
            cluster("a", a),
            cluster("b", b)
        ),
    )
    .expect("write cds");
    let listeners = |version: &str, to: &str| {
        format!(
            "version_info: {version}\nresources:{}\n",
            inline_listener_yaml("main", port, &to_cluster(to))
        )
    };
    std::fs::write(&lds, listeners("l1", "a")).expect("write lds");
    let yaml = format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
node: {{id: {NODE}, cluster: xds-test}}
dynamic_resources:
  lds_config: {{path_config_source: {{path: {}}}, initial_fetch_timeout: 0s}}
  cds_config: {{path_config_source: {{path: {}}}, initial_fetch_timeout: 0s}}
"#,
        lds.display(),
        cds.display()
    );
    let _revoy = start_revoy(&yaml, admin);
    wait_live(admin);
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let serves = |body: &str| {
        eventually(&format!("{body} served"), || {
            (body_of(port).as_deref() == Some(body)).then_some(())
        })
    };

    // Written in place.
    std::fs::write(&lds, listeners("l2", "b")).expect("write lds");
    serves("upstream-b");

    // Renamed over.
    let tmp = dir.join("lds.yaml.tmp");
    std::fs::write(&tmp, listeners("l3", "a")).expect("write tmp");
    std::fs::rename(&tmp, &lds).expect("rename");
    serves("upstream-a");

    // Kubernetes: lds.yaml -> ..data/lds.yaml, ..data -> ..v4, then ..data swapped to ..v5.
    use std::os::unix::fs::symlink;
    for (v, to) in [("..v4", "b"), ("..v5", "a")] {
        std::fs::create_dir(dir.join(v)).expect("mkdir");
        std::fs::write(dir.join(v).join("lds.yaml"), listeners(v, to)).expect("write");
    }
    symlink("..v4", dir.join("..data")).expect("symlink");
    symlink("..data/lds.yaml", &tmp).expect("symlink");
    std::fs::rename(&tmp, &lds).expect("rename the link over");
    serves("upstream-b");
    symlink("..v5", dir.join("..data_tmp")).expect("symlink");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    serves("upstream-a");
    assert_eq!(stat(admin, "listener_manager.lds.update_rejected"), Some(0));
    assert_eq!(stat(admin, "listener_manager.lds.update_success"), Some(5));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over Delta, a listener and a cluster removed by `removed_resources` go away; a listener
/// moved to another port is rebound (the old port refuses); an invalid update of an active
/// listener keeps its previous version serving; a listener on a taken address is refused.
#[test]
fn delta_removals_rebinds_and_rejected_updates() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let (plane, _revoy, admin) = start(true);
    let base = Snapshot::new("1")
        .with_message("a", &static_cluster("a", a))
        .with_message("b", &static_cluster("b", b))
        .with_message("one", &inline_listener("one", p1, &to_cluster("a")))
        .with_message("two", &inline_listener("two", p2, &to_cluster("b")));
    plane.set(base.clone());
    wait_live(admin);
    assert_eq!(body_of(p2).as_deref(), Some("upstream-b"));

    // Removed: listener two and cluster b.
    plane.set(
        Snapshot::new("2")
            .with_message("a", &static_cluster("a", a))
            .with_message("one", &inline_listener("one", p1, &to_cluster("a"))),
    );
    plane.ack(LISTENER_TYPE_URL, "2");
    plane.ack(CLUSTER_TYPE_URL, "2");
    // Worker accept loops stop asynchronously (as Envoy's workers do after its ACK).
    eventually("the removed listener refuses", || refused(p2).then_some(()));
    assert_eq!(stat(admin, "cluster_manager.cluster_removed"), Some(1));
    // It drains (for the default 600 s drain time): its old version alone is dumped.
    let two = dumped_listener(admin, "two");
    assert!(two.get("active_state").is_none(), "{two}");
    assert_eq!(two["draining_state"]["listener"]["name"], "two", "{two}");

    // Rebound: listener one moves to p3.
    plane.set(
        Snapshot::new("3")
            .with_message("a", &static_cluster("a", a))
            .with_message("one", &inline_listener("one", p3, &to_cluster("a"))),
    );
    plane.ack(LISTENER_TYPE_URL, "3");
    assert_eq!(body_of(p3).as_deref(), Some("upstream-a"));
    eventually("the old port refuses", || refused(p1).then_some(()));

    // An invalid update of listener one: version 3 keeps serving.
    plane.set(
        Snapshot::new("4")
            .with_message("a", &static_cluster("a", a))
            .with_message(
                "one",
                &inline_listener(
                    "one",
                    p3,
                    "[{match: {safe_regex: {regex: \"[\"}}, route: {cluster: a}}]",
                ),
            ),
    );
    assert!(matches!(
        plane.verdict(LISTENER_TYPE_URL, "4"),
        Verdict::Nack(_)
    ));
    assert_eq!(body_of(p3).as_deref(), Some("upstream-a"));
    let one = dumped_listener(admin, "one");
    assert!(one["active_state"].is_object(), "{one}");
    assert!(one["error_state"].is_object(), "{one}");

    // A second listener on listener one's address is refused by name.
    plane.set(
        Snapshot::new("5")
            .with_message("a", &static_cluster("a", a))
            .with_message("one", &inline_listener("one", p3, &to_cluster("a")))
            .with_message("twin", &inline_listener("twin", p3, &to_cluster("a"))),
    );
    let Verdict::Nack(reason) = plane.verdict(LISTENER_TYPE_URL, "5") else {
        panic!("two listeners on one address were ACKed");
    };
    assert!(reason.contains("'twin'"), "{reason}");
    assert_eq!(body_of(p3).as_deref(), Some("upstream-a"));
}

/// An active listener updated to use a route configuration that has not arrived keeps
/// serving its previous version until the new one warms (Envoy's listener warming), a
/// rejected update meanwhile included.
#[test]
fn an_updated_listener_serves_its_old_version_while_the_new_one_warms() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let port = free_port();
    let (plane, _revoy, admin) = start(false);
    let snapshot = |version: &str, route: &str| {
        Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message("b", &static_cluster("b", b))
            .with_message("main", &rds_listener("main", port, "main", route))
            .with_message("routes", &route_config("routes", &to_cluster("a")))
    };
    plane.set(snapshot("1", "routes"));
    wait_live(admin);
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    plane.set(snapshot("2", "routes-2"));
    plane.ack(LISTENER_TYPE_URL, "2");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let main = dumped_listener(admin, "main");
    assert!(main["warming_state"].is_object(), "{main}");
    assert!(
        main["active_state"].is_object(),
        "the serving version is not shown: {main}"
    );
    // A rejected update meanwhile changes neither what serves nor what the dump says serves.
    plane.set(snapshot("2b", "routes-2").with_message(
        "main",
        &inline_listener(
            "main",
            port,
            "[{match: {safe_regex: {regex: \"[\"}}, route: {cluster: a}}]",
        ),
    ));
    assert!(matches!(
        plane.verdict(LISTENER_TYPE_URL, "2b"),
        Verdict::Nack(_)
    ));
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let main = dumped_listener(admin, "main");
    assert_eq!(main["active_state"]["version_info"], "1", "{main}");
    assert_eq!(main["warming_state"]["version_info"], "2", "{main}");
    assert!(main["error_state"].is_object(), "{main}");
    plane.set(
        snapshot("3", "routes-2")
            .with_message("routes-2", &route_config("routes-2", &to_cluster("b"))),
    );
    plane.ack(ROUTE_TYPE_URL, "3");
    assert_eq!(body_of(port).as_deref(), Some("upstream-b"));
    let main = dumped_listener(admin, "main");
    assert!(main["warming_state"].is_null(), "{main}");
}

/// Routes find clusters by name at request time: a route to a cluster that arrives later
/// starts working, a cluster changed by CDS sends traffic to its new endpoint, and two
/// listeners sharing one route configuration both follow its updates.
#[test]
fn routes_follow_cluster_and_shared_route_changes() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let (p1, p2) = (free_port(), free_port());
    let (plane, _revoy, admin) = start(false);
    let snapshot = |version: &str, clusters: &[(&str, u16)], route_to: &str| {
        let mut s = Snapshot::new(version)
            .with_message("one", &rds_listener("one", p1, "one", "shared"))
            .with_message("two", &rds_listener("two", p2, "two", "shared"))
            .with_message("shared", &route_config("shared", &to_cluster(route_to)));
        for (name, port) in clusters {
            s = s.with_message(*name, &static_cluster(name, *port));
        }
        s
    };
    plane.set(snapshot("1", &[("a", a)], "late"));
    wait_live(admin);
    assert_eq!(get(p1, "/").expect("GET").status, 503);

    plane.set(snapshot("2", &[("a", a), ("late", b)], "late"));
    plane.ack(CLUSTER_TYPE_URL, "2");
    assert_eq!(body_of(p1).as_deref(), Some("upstream-b"));
    assert_eq!(body_of(p2).as_deref(), Some("upstream-b"));

    plane.set(snapshot("3", &[("a", a), ("late", a)], "late"));
    plane.ack(CLUSTER_TYPE_URL, "3");
    assert_eq!(body_of(p1).as_deref(), Some("upstream-a"));
    assert_eq!(stat(admin, "cluster_manager.cluster_modified"), Some(1));

    plane.set(snapshot("4", &[("a", a), ("late", a), ("b", b)], "b"));
    plane.ack(ROUTE_TYPE_URL, "4");
    assert_eq!(body_of(p1).as_deref(), Some("upstream-b"));
    assert_eq!(body_of(p2).as_deref(), Some("upstream-b"));
}

/// An updated EDS cluster warms until the control plane sends its assignment again, as in
/// Envoy, while its previous version serves: the new version's settings (here TLS to a
/// plaintext upstream) never meet the endpoints held for the old one. An assignment sent
/// again unchanged ends the warming.
#[test]
fn an_updated_eds_cluster_serves_its_old_version_until_its_endpoints_come_again() {
    let a = upstream("upstream-a");
    let port = free_port();
    let (plane, _revoy, admin) = start(false);
    let tls: proto::pb::envoy::config::cluster::v3::Cluster = decode(
        "{name: svc, type: EDS, connect_timeout: 1s, eds_cluster_config: {service_name: svc, \
         eds_config: {ads: {}, resource_api_version: V3}}, transport_socket: {name: tls, \
         typed_config: {\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext}}}",
    );
    let base = |version: &str, svc: &proto::pb::envoy::config::cluster::v3::Cluster| {
        Snapshot::new(version)
            .with_message("svc", svc)
            .with_message("main", &rds_listener("main", port, "main", "routes"))
            .with_message("routes", &route_config("routes", &to_cluster("svc")))
    };
    plane.set(base("1", &eds_cluster("svc")).with_message("svc", &assignment("svc", a)));
    wait_live(admin);
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));

    // The cluster changes; its assignment is not sent again (yet).
    plane.set(base("2", &tls));
    plane.ack(CLUSTER_TYPE_URL, "2");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let dump = admin_get(admin, "/config_dump").1;
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("config_dump JSON");
    let clusters = dump["configs"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["dynamic_warming_clusters"].is_array()))
        .unwrap_or_else(|| panic!("no warming clusters in /config_dump: {dump}"));
    assert_eq!(
        clusters["dynamic_warming_clusters"][0]["version_info"], "2",
        "{clusters}"
    );

    // The same assignment again: the TLS version takes over (and fails against plaintext).
    plane.set(base("3", &tls).with_message("svc", &assignment("svc", a)));
    plane.ack(ENDPOINT_TYPE_URL, "3");
    assert_eq!(get(port, "/").expect("GET").status, 503);
}

/// A new EDS cluster and a new listener that wait for their first assignment and route
/// configuration without a timeout (`initial_fetch_timeout: 0s`, as istiod sends them) do not
/// wait for ever when those are rejected: as Envoy's EDS and RDS let start-up go on after a
/// rejected update (`onConfigUpdateFailed`), revoy goes LIVE with the cluster (no hosts: 503)
/// and the listener (no routes: 404), and serves once good versions come.
#[test]
fn rejected_first_assignment_and_routes_do_not_block_start_up() {
    let a = upstream("upstream-a");
    let port = free_port();
    let (plane, _revoy, admin) = start(false);
    let cluster: proto::pb::envoy::config::cluster::v3::Cluster = decode(
        "{name: svc, type: EDS, connect_timeout: 1s, eds_cluster_config: {service_name: svc, \
         eds_config: {ads: {}, resource_api_version: V3, initial_fetch_timeout: 0s}}}",
    );
    let listener = listener_with(
        "main",
        port,
        "stat_prefix: main\nrds: {route_config_name: routes, config_source: {ads: {}, \
         resource_api_version: V3, initial_fetch_timeout: 0s}}",
    );
    let bad_assignment: ClusterLoadAssignment = decode(
        "{cluster_name: svc, endpoints: [{lb_endpoints: [{endpoint: {address: \
         {socket_address: {address: not-an-ip, port_value: 1}}}}]}]}",
    );
    let snapshot = |version: &str, assignment: &ClusterLoadAssignment, routes: &str| {
        Snapshot::new(version)
            .with_message("svc", &cluster)
            .with_message("svc", assignment)
            .with_message("main", &listener)
            .with_message("routes", &route_config("routes", routes))
    };
    plane.set(snapshot(
        "1",
        &bad_assignment,
        "[{match: {safe_regex: {regex: \"[\"}}, route: {cluster: svc}}]",
    ));
    wait_live(admin);
    assert!(matches!(
        plane.verdict(ENDPOINT_TYPE_URL, "1"),
        Verdict::Nack(_)
    ));
    assert!(matches!(
        plane.verdict(ROUTE_TYPE_URL, "1"),
        Verdict::Nack(_)
    ));
    assert_eq!(get(port, "/").expect("GET").status, 404);
    plane.set(snapshot("2", &bad_assignment, &to_cluster("svc")));
    plane.ack(ROUTE_TYPE_URL, "2");
    assert_eq!(get(port, "/").expect("GET").status, 503);
    plane.set(snapshot("3", &assignment("svc", a), &to_cluster("svc")));
    plane.ack(ENDPOINT_TYPE_URL, "3");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
}

/// Over Delta, an EDS cluster's endpoints follow their assignment; an assignment removed is
/// taken as Envoy's EDS takes it, an update without it (`update_empty`): the cluster keeps
/// its hosts (compared with Envoy in `tests/xds_differential.rs`) until another comes.
#[test]
fn delta_endpoint_updates_and_removal() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let port = free_port();
    let (plane, _revoy, admin) = start(true);
    let base = |version: &str| {
        Snapshot::new(version)
            .with_message("svc", &eds_cluster("svc"))
            .with_message("main", &rds_listener("main", port, "main", "routes"))
            .with_message("routes", &route_config("routes", &to_cluster("svc")))
    };
    plane.set(base("1").with_message("svc", &assignment("svc", a)));
    wait_live(admin);
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    plane.set(base("2").with_message("svc", &assignment("svc", b)));
    plane.ack(ENDPOINT_TYPE_URL, "2");
    assert_eq!(body_of(port).as_deref(), Some("upstream-b"));
    plane.set(base("3"));
    plane.ack(ENDPOINT_TYPE_URL, "3");
    assert_eq!(body_of(port).as_deref(), Some("upstream-b"));
    assert_eq!(stat(admin, "cluster.svc.update_empty"), Some(1));
    plane.set(base("4").with_message("svc", &assignment("svc", a)));
    plane.ack(ENDPOINT_TYPE_URL, "4");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
}

/// With a non-zero `initial_fetch_timeout` and no control plane, start-up goes on (LIVE) once
/// the timeouts pass; when the control plane appears, its configuration applies.
#[test]
fn initial_fetch_timeout_goes_live_without_a_control_plane() {
    let a = upstream("upstream-a");
    let (admin, xds, port) = (free_port(), free_port(), free_port());
    let yaml = ads_bootstrap(admin, xds, false)
        .replace("initial_fetch_timeout: 0s", "initial_fetch_timeout: 0.2s");
    let _revoy = start_revoy(&yaml, admin);
    wait_live(admin);
    assert_eq!(stat(admin, "control_plane.connected_state"), Some(0));
    let plane = Plane::start(xds);
    plane.set(
        Snapshot::new("1")
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &inline_listener("main", port, &to_cluster("a"))),
    );
    plane.ack(LISTENER_TYPE_URL, "1");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
}

/// The stats of a removed cluster (serving, or still warming) are dropped once nothing holds
/// them, a removed listener's once its drain time (`--drain-time-s 1`) has ended (no
/// unbounded growth as resources come and go); those of the ones left stay.
#[test]
fn removed_resources_free_their_stats() {
    let (a, b) = (upstream("upstream-a"), upstream("upstream-b"));
    let (port, extra) = (free_port(), free_port());
    let (admin, xds) = (free_port(), free_port());
    let plane = Plane::start(xds);
    let args = ["--drain-time-s", "1"];
    let _revoy = start_revoy_with(&ads_bootstrap(admin, xds, false), admin, &args);
    let snapshot = |version: &str, with_extra: bool| {
        let s = Snapshot::new(version)
            .with_message("a", &eds_cluster("a"))
            .with_message("a", &assignment("a", a))
            .with_message("main", &rds_listener("main", port, "main", "routes"))
            .with_message("routes", &route_config("routes", &to_cluster("a")));
        if with_extra {
            s.with_message("gone", &eds_cluster("gone"))
                .with_message("gone", &assignment("gone", b))
                .with_message(
                    "extra",
                    &inline_listener("extra", extra, &to_cluster("gone")),
                )
        } else {
            s
        }
    };
    plane.set(snapshot("1", true));
    wait_live(admin);
    assert_eq!(body_of(extra).as_deref(), Some("upstream-b"));
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let listener_stat = format!("listener.127.0.0.1_{extra}.downstream_cx_total");
    assert_eq!(stat(admin, "cluster.gone.upstream_rq_total"), Some(1));
    assert_eq!(stat(admin, &listener_stat), Some(1));
    // A cluster that never gets its endpoints, removed while it warms.
    plane.set(snapshot("1b", true).with_message("never", &eds_cluster("never")));
    plane.ack(CLUSTER_TYPE_URL, "1b");
    assert_eq!(stat(admin, "cluster.never.update_attempt"), Some(1));

    plane.set(snapshot("2", false));
    plane.ack(CLUSTER_TYPE_URL, "2");
    plane.ack(LISTENER_TYPE_URL, "2");
    eventually("the removed clusters' and listener's stats dropped", || {
        (stat(admin, "cluster.gone.upstream_rq_total").is_none()
            && stat(admin, "cluster.never.update_attempt").is_none()
            && stat(admin, &listener_stat).is_none())
        .then_some(())
    });
    assert_eq!(stat(admin, "cluster.a.upstream_rq_total"), Some(1));
}

/// The route configurations `/config_dump` lists.
fn dumped_route_names(admin: u16) -> Vec<String> {
    let (status, body) = admin_get(admin, "/config_dump?resource=dynamic_route_configs");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("config_dump is JSON");
    let mut names: Vec<String> = v["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["route_config"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// A route configuration no listener uses leaves a drain time (`--drain-time-s 4`) after the
/// last listener using it went: one used again meanwhile and then left again stays a whole
/// drain time from then (the first drop, now stale, does not take it).
#[test]
fn a_route_configuration_used_again_waits_a_whole_drain_time() {
    let (main, other) = (free_port(), free_port());
    let (admin, xds) = (free_port(), free_port());
    let plane = Plane::start(xds);
    let _revoy = start_revoy_with(
        &ads_bootstrap(admin, xds, false),
        admin,
        &["--drain-time-s", "4"],
    );
    let direct = "[{match: {prefix: /}, direct_response: {status: 200}}]";
    let snapshot = |version: &str, with_other: bool| {
        let s = Snapshot::new(version)
            .with_message("main", &rds_listener("main", main, "main", "r-main"))
            .with_message("r-main", &route_config("r-main", direct))
            .with_message("r-other", &route_config("r-other", direct));
        if with_other {
            s.with_message("other", &rds_listener("other", other, "other", "r-other"))
        } else {
            s
        }
    };
    plane.set(snapshot("1", true));
    wait_live(admin);
    assert_eq!(dumped_route_names(admin), ["r-main", "r-other"]);
    let first_left = std::time::Instant::now();
    plane.set(snapshot("2", false));
    plane.ack(LISTENER_TYPE_URL, "2");
    plane.set(snapshot("3", true));
    plane.ack(LISTENER_TYPE_URL, "3");
    std::thread::sleep(std::time::Duration::from_millis(1500).saturating_sub(first_left.elapsed()));
    plane.set(snapshot("4", false));
    plane.ack(LISTENER_TYPE_URL, "4");
    // Past the first drop's time (4 s after version 2), before the second's (4 s after 4).
    std::thread::sleep(std::time::Duration::from_millis(4750).saturating_sub(first_left.elapsed()));
    assert_eq!(dumped_route_names(admin), ["r-main", "r-other"]);
    eventually("r-other dropped", || {
        (dumped_route_names(admin) == ["r-main"]).then_some(())
    });
}

/// The per-subscription stats Envoy keeps besides CDS and LDS: each route configuration's
/// under its connection manager (`http.<stat_prefix>.rds.<name>.*`), each EDS cluster's
/// (`cluster.<name>.update_*`), and the dumps' `version_info` of the last LDS and CDS applied.
#[test]
fn rds_and_eds_subscriptions_have_envoys_stats() {
    let up = upstream("upstream-a");
    let port = free_port();
    let (plane, _revoy, admin) = start(false);
    plane.set(serving("1", port, up, "svc"));
    wait_live(admin);
    plane.set(serving("2", port, up, "svc").with_message(
        "routes",
        &route_config(
            "routes",
            "[{match: {safe_regex: {regex: \"(\"}}, route: {cluster: svc}}]",
        ),
    ));
    assert!(matches!(
        plane.verdict(ROUTE_TYPE_URL, "2"),
        Verdict::Nack(_)
    ));
    // Envoy counts the subscription's start as an attempt, then one per response.
    assert_eq!(stat(admin, "http.main.rds.routes.update_attempt"), Some(3));
    assert_eq!(stat(admin, "http.main.rds.routes.update_success"), Some(1));
    assert_eq!(stat(admin, "http.main.rds.routes.update_rejected"), Some(1));
    assert_eq!(stat(admin, "cluster.svc.update_success"), Some(1));
    let (_, dump) = admin_get(admin, "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("JSON");
    let version_of = |suffix: &str| {
        dump["configs"]
            .as_array()
            .expect("configs")
            .iter()
            .find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(suffix)))
            .map(|c| c["version_info"].clone())
    };
    // Version 2 changed only the route configuration: LDS and CDS were last pushed at 1.
    assert_eq!(version_of("ListenersConfigDump"), Some("1".into()));
    assert_eq!(version_of("ClustersConfigDump"), Some("1".into()));
}

/// Under `rate_limit_settings` the requests the bucket holds back wait in a queue, which
/// `control_plane.pending_requests` counts (Envoy's gauge); it is 0 again once they are sent.
#[test]
fn rate_limited_requests_are_pending_until_sent() {
    let up = upstream("upstream-a");
    let (admin, xds, port) = (free_port(), free_port(), free_port());
    let plane = Plane::start(xds);
    // One token, then one every half second: each response's ACK and the subscription it
    // leads to queue behind each other through start-up.
    let yaml = ads_bootstrap(admin, xds, false).replace(
        "    transport_api_version: V3\n    grpc_services",
        "    transport_api_version: V3\n    rate_limit_settings: {max_tokens: 1, fill_rate: 2}\n    grpc_services",
    );
    let _revoy = start_revoy(&yaml, admin);
    plane.set(serving("1", port, up, "svc"));
    eventually("a request pending", || {
        stat(admin, "control_plane.pending_requests").filter(|pending| *pending > 0)
    });
    wait_live(admin);
    for type_url in TYPES {
        plane.ack(type_url, "1");
    }
    eventually("no request pending", || {
        (stat(admin, "control_plane.pending_requests") == Some(0)).then_some(())
    });
    assert!(stat(admin, "control_plane.rate_limit_enforced") > Some(0));
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
}

/// Listener `name` of [`inline_listener`] with `additional` (IPv6 loopback ports) as its
/// additional addresses.
fn dual_listener(
    name: &str,
    port: u16,
    additional: &[u16],
    routes: &str,
) -> proto::pb::envoy::config::listener::v3::Listener {
    let mut l = inline_listener(name, port, routes);
    l.additional_addresses = additional
        .iter()
        .map(|p| {
            decode(&format!(
                "{{address: {{socket_address: {{address: '::1', port_value: {p}}}}}}}"
            ))
        })
        .collect();
    l
}

/// What a GET of `/` on [::1]:`port` answers: its body, or the error.
fn body_of_v6(port: u16) -> Result<String, String> {
    http1::get(None, (std::net::Ipv6Addr::LOCALHOST, port).into(), "/").map(|(_, body)| body)
}

/// An LDS update that adds an additional address binds that address alone, and one that
/// removes it closes that address alone: the listener's `address` and its other additional
/// address keep accepting throughout (no connection refused), as `/listeners` follows. When
/// the `address` itself moves, the additional address's sockets stay and count under the
/// listener's new stats name.
#[test]
fn additional_addresses_are_bound_and_closed_one_by_one() {
    let a = upstream("upstream-a");
    let (p, kept, added) = (free_port(), free_port(), free_port());
    let (plane, _revoy, admin) = start(false);
    let snapshot = |version: &str, additional: &[u16]| {
        Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message(
                "dual",
                &dual_listener("dual", p, additional, &to_cluster("a")),
            )
    };
    let listeners = || admin_get(admin, "/listeners").1;
    plane.set(snapshot("1", &[kept]));
    wait_live(admin);
    assert_eq!(body_of_v6(kept).as_deref(), Ok("upstream-a"));
    assert!(body_of_v6(added).is_err());

    let running = load(p);
    plane.set(snapshot("2", &[kept, added]));
    plane.ack(LISTENER_TYPE_URL, "2");
    assert_eq!(body_of_v6(added).as_deref(), Ok("upstream-a"));
    assert_eq!(body_of_v6(kept).as_deref(), Ok("upstream-a"));
    assert_eq!(
        listeners(),
        format!("dual::127.0.0.1:{p}\ndual::[::1]:{kept}\ndual::[::1]:{added}\n")
    );

    plane.set(snapshot("3", &[kept]));
    plane.ack(LISTENER_TYPE_URL, "3");
    eventually("the removed address refuses", || {
        body_of_v6(added)
            .err()
            .filter(|e| e.contains("Connection refused"))
    });
    assert_eq!(body_of_v6(kept).as_deref(), Ok("upstream-a"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    no_failures(running);
    assert_eq!(
        listeners(),
        format!("dual::127.0.0.1:{p}\ndual::[::1]:{kept}\n")
    );
    // Envoy counts an address change as a modification, not an in-place update.
    assert_eq!(stat(admin, "listener_manager.listener_modified"), Some(2));
    assert_eq!(
        stat(admin, "listener_manager.listener_in_place_updated"),
        Some(0)
    );

    // The listener's `address` moves, its additional address stays: that address's sockets
    // are kept and count under the listener's new name.
    let moved = free_port();
    plane.set(
        Snapshot::new("4")
            .with_message("a", &static_cluster("a", a))
            .with_message(
                "dual",
                &dual_listener("dual", moved, &[kept], &to_cluster("a")),
            ),
    );
    plane.ack(LISTENER_TYPE_URL, "4");
    eventually("the old address refuses", || refused(p).then_some(()));
    assert_eq!(body_of_v6(kept).as_deref(), Ok("upstream-a"));
    let worker = |port: u16| format!("listener.127.0.0.1_{port}.worker_0.downstream_cx_total");
    assert_eq!(stat(admin, &worker(moved)), Some(1));
    assert_eq!(body_of(moved).as_deref(), Some("upstream-a"));
}

/// An LDS update that changes only `ipv4_compat` of a listener's `[::]:P` is accepted and keeps
/// the socket as it was bound, as Envoy 1.40 does (probed with it: `listener_modified` counts
/// the update, and `[::]:P` keeps taking IPv6 only after `ipv4_compat: true` comes, and the
/// reverse). revoy used to bind a second socket for the changed address while the first was
/// open, and NACKed with "address in use".
#[test]
fn an_ipv4_compat_change_alone_keeps_the_socket() {
    let a = upstream("upstream-a");
    let p = free_port();
    let (plane, _revoy, admin) = start(false);
    let snapshot = |version: &str, compat: bool| {
        let mut l = inline_listener("compat", p, &to_cluster("a"));
        l.address = Some(decode(&format!(
            "{{socket_address: {{address: '::', port_value: {p}, ipv4_compat: {compat}}}}}"
        )));
        Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message("compat", &l)
    };
    plane.set(snapshot("1", false));
    wait_live(admin);
    assert_eq!(body_of_v6(p).as_deref(), Ok("upstream-a"));
    assert!(refused(p), "[::]:{p} without ipv4_compat takes IPv4");

    let running = load_v6(p);
    plane.set(snapshot("2", true));
    plane.ack(LISTENER_TYPE_URL, "2");
    assert_eq!(stat(admin, "listener_manager.lds.update_rejected"), Some(0));
    assert_eq!(stat(admin, "listener_manager.listener_modified"), Some(1));
    assert_eq!(
        dumped_listener(admin, "compat")["active_state"]["listener"]["address"]["socket_address"]["ipv4_compat"],
        true
    );
    assert_eq!(body_of_v6(p).as_deref(), Ok("upstream-a"));
    assert!(refused(p), "the socket kept as bound takes IPv6 only");

    plane.set(snapshot("3", false));
    plane.ack(LISTENER_TYPE_URL, "3");
    assert_eq!(stat(admin, "listener_manager.listener_modified"), Some(2));
    assert_eq!(body_of_v6(p).as_deref(), Ok("upstream-a"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    no_failures(running);
}

/// Envoy's draining listeners: a removed listener, and a listener replaced whole (a
/// listener-level field changed), show their old version in `/config_dump`'s
/// `draining_state` and count in `listener_manager.total_listeners_draining` until the drain
/// time (`--drain-time-s`) has passed, then go, as in Envoy 1.40 (probed with it: same
/// entries, the gauge back to 0 after the drain time; `tests/xds_differential.rs` compares
/// the entries and the gauge step by step). A connection held on the removed listener is
/// told to close at its next response (`--drain-strategy immediate`).
#[test]
fn removed_and_replaced_listeners_drain_for_the_drain_time() {
    let a = upstream("upstream-a");
    let (port, gone) = (free_port(), free_port());
    let (admin, xds) = (free_port(), free_port());
    let plane = Plane::start(xds);
    let _revoy = start_revoy_with(
        &ads_bootstrap(admin, xds, false),
        admin,
        &["--drain-time-s", "2", "--drain-strategy", "immediate"],
    );
    let main = |limit: Option<u32>| {
        let mut l = inline_listener("main", port, &to_cluster("a"));
        l.per_connection_buffer_limit_bytes =
            limit.map(|value| proto::pb::google::protobuf::UInt32Value { value });
        l
    };
    plane.set(
        Snapshot::new("1")
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &main(None))
            .with_message("gone", &inline_listener("gone", gone, &to_cluster("a"))),
    );
    wait_live(admin);
    let mut held = Conn::open(gone).expect("connect");
    assert_eq!(held.get("/").expect("GET").body, "upstream-a");
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_draining"),
        Some(0)
    );

    plane.set(
        Snapshot::new("2")
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &main(Some(65536))),
    );
    plane.ack(LISTENER_TYPE_URL, "2");
    let removed = dumped_listener(admin, "gone");
    assert_eq!(removed["draining_state"]["version_info"], "1", "{removed}");
    assert!(removed.get("active_state").is_none(), "{removed}");
    assert!(removed.get("client_status").is_none(), "{removed}");
    let replaced = dumped_listener(admin, "main");
    assert_eq!(replaced["active_state"]["version_info"], "2", "{replaced}");
    assert_eq!(
        replaced["draining_state"]["version_info"], "1",
        "{replaced}"
    );
    assert_eq!(
        replaced["draining_state"]["listener"]["name"], "main",
        "{replaced}"
    );
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_draining"),
        Some(2)
    );
    // Envoy updates in place only when the filter chains alone changed.
    assert_eq!(stat(admin, "listener_manager.listener_modified"), Some(1));
    assert_eq!(
        stat(admin, "listener_manager.listener_in_place_updated"),
        Some(0)
    );
    let r = held
        .get("/")
        .expect("GET on the removed listener's connection");
    assert!(r.closes(), "{r:?}");

    eventually("the drains to end", || {
        (stat(admin, "listener_manager.total_listeners_draining") == Some(0)).then_some(())
    });
    assert!(
        dynamic_listeners(admin).iter().all(|l| l["name"] != "gone"),
        "the removed listener is still dumped after its drain"
    );
    let main = dumped_listener(admin, "main");
    assert!(main.get("draining_state").is_none(), "{main}");
    assert_eq!(main["active_state"]["version_info"], "2", "{main}");
}

/// Over Delta, the server's removal of a route configuration a listener still uses is
/// ignored, as Envoy's RDS does (Envoy 1.40 compared in `tests/xds_differential.rs`): the
/// table keeps serving and stays in `/routes`; `/config_dump` shows it with `client_status`
/// `DOES_NOT_EXIST` (revoy's own: Envoy fills no client status).
#[test]
fn a_route_configuration_removed_over_delta_keeps_serving() {
    let a = upstream("upstream-a");
    let port = free_port();
    let (plane, _revoy, admin) = start(true);
    let with_routes = |version: &str, routes: bool| {
        let s = Snapshot::new(version)
            .with_message("a", &static_cluster("a", a))
            .with_message("main", &rds_listener("main", port, "main", "r"));
        if routes {
            s.with_message("r", &route_config("r", &to_cluster("a")))
        } else {
            s
        }
    };
    plane.set(with_routes("1", true));
    wait_live(admin);
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let (_, tables) = admin_get(admin, "/routes");
    assert!(
        tables.contains("\"r\""),
        "the RDS table is not in /routes: {tables}"
    );
    let dumped = |admin: u16| {
        let (_, dump) = admin_get(admin, "/config_dump?resource=dynamic_route_configs");
        let dump: serde_json::Value = serde_json::from_str(&dump).expect("config_dump json");
        dump["configs"][0].clone()
    };
    assert_eq!(dumped(admin)["client_status"], "ACKED");

    plane.set(with_routes("2", false));
    plane.ack(ROUTE_TYPE_URL, "2");
    let entry = dumped(admin);
    assert_eq!(entry["client_status"], "DOES_NOT_EXIST", "{entry}");
    assert_eq!(entry["route_config"]["name"], "r", "{entry}");
    assert_eq!(body_of(port).as_deref(), Some("upstream-a"));
    let (_, tables) = admin_get(admin, "/routes");
    assert!(
        tables.contains("\"r\""),
        "the removed table left /routes: {tables}"
    );

    // Sent again, it is ACKED again.
    plane.set(with_routes("3", true));
    plane.ack(ROUTE_TYPE_URL, "3");
    assert_eq!(dumped(admin)["client_status"], "ACKED");
}

/// An upstream on 127.0.0.1 answering one request: it says when the request has arrived
/// (the first receiver), and answers 200 `slow` once the sender is used (or dropped).
fn held_upstream() -> (
    u16,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    use std::io::{BufRead, Write};
    let port = free_port();
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind upstream");
    let (arrived_tx, arrived) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let Ok((conn, _)) = listener.accept() else {
            return;
        };
        let mut reader = std::io::BufReader::new(conn.try_clone().expect("clone"));
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
            line.clear();
        }
        let _ = arrived_tx.send(());
        let _ = release_rx.recv();
        let mut conn = conn;
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nslow");
    });
    (port, arrived, release)
}

/// A request in flight to a cluster that CDS removes completes with the upstream's answer
/// (Envoy keeps a removed cluster's connections until their requests end); the next request
/// gets 503 (no cluster).
#[test]
fn a_request_in_flight_to_a_removed_cluster_completes() {
    let (slow, arrived, release) = held_upstream();
    let port = free_port();
    let (plane, _revoy, admin) = start(false);
    let listener = inline_listener("main", port, &to_cluster("slow"));
    plane.set(
        Snapshot::new("1")
            .with_message("slow", &static_cluster("slow", slow))
            .with_message("main", &listener),
    );
    wait_live(admin);
    let request = std::thread::spawn(move || {
        let mut conn = Conn::open(port).expect("connect");
        conn.get("/").expect("the in-flight request")
    });
    arrived
        .recv_timeout(WAIT)
        .expect("the request reached the upstream");
    plane.set(Snapshot::new("2").with_message("main", &listener));
    plane.ack(CLUSTER_TYPE_URL, "2");
    assert_eq!(stat(admin, "cluster_manager.cluster_removed"), Some(1));
    release.send(()).expect("release the upstream");
    let r = request.join().expect("request thread");
    assert_eq!((r.status, r.body.as_str()), (200, "slow"), "{r:?}");
    let after = get(port, "/").expect("GET after the removal");
    assert_eq!(after.status, 503, "{after:?}");
}

/// An HTTP/2 client whose connection's filter chain changes over LDS while a stream is in
/// flight: the stream completes (200 and its body), and the connection gets a GOAWAY with no
/// error (HTTP/1.1 gets `connection: close`; Envoy drains such a connection the same way),
/// under `--drain-strategy immediate`.
#[test]
fn an_h2_connection_of_a_changed_chain_gets_a_goaway_and_its_stream_completes() {
    use std::io::Write;
    let (slow, arrived, release) = held_upstream();
    let port = free_port();
    let (plane, _revoy, admin) = start_draining_at_once();
    let listener = |prefix: &str| {
        listener_with(
            "main",
            port,
            &format!(
                "stat_prefix: {prefix}\nroute_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: {}}}]}}",
                to_cluster("slow")
            ),
        )
    };
    let snapshot = |version: &str, prefix: &str| {
        Snapshot::new(version)
            .with_message("slow", &static_cluster("slow", slow))
            .with_message("main", &listener(prefix))
    };
    plane.set(snapshot("1", "before"));
    wait_live(admin);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut out = h2_frames::preface();
    out.extend(h2_frames::get(1, "xds", "/"));
    conn.write_all(&out).expect("write the request");
    arrived
        .recv_timeout(WAIT)
        .expect("the stream reached the upstream");

    plane.set(snapshot("2", "after"));
    plane.ack(LISTENER_TYPE_URL, "2");
    assert_eq!(
        stat(admin, "listener_manager.listener_in_place_updated"),
        Some(1)
    );
    release.send(()).expect("release the upstream");
    let mut reader = h2_frames::Reader::new(&mut conn);
    let seen = reader
        .until(1, |s, goaway| s.ended && goaway.is_some())
        .expect("the stream's frames and a GOAWAY");
    assert_eq!(
        seen.ok,
        Some(true),
        "the in-flight stream's status is not 200"
    );
    assert_eq!(seen.body, b"slow");
    assert_eq!(reader.goaway, Some(0), "a GOAWAY with NO_ERROR");
}

/// `/xds`'s push entry of `type_url` at `version`, once it is logged.
fn push_entry(admin: u16, type_url: &str, version: &str) -> serde_json::Value {
    eventually("the push in /xds", || {
        xds_status(admin)["pushes"]
            .as_array()?
            .iter()
            .find(|p| p["type_url"] == type_url && p["version"] == version)
            .cloned()
    })
}

/// The names of a push entry's list `field`, sorted.
fn listed(push: &serde_json::Value, field: &str) -> Vec<String> {
    let mut names: Vec<String> = push[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} in {push}"))
        .iter()
        .map(|n| n.as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

/// Each push in `/xds` tells which resources it added, changed (a new version of a name
/// revoy held), left unchanged, removed and rejected (with the reason).
fn push_log(delta: bool) {
    let up = upstream("upstream-a");
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let (plane, _revoy, admin) = start(delta);
    let body = |b: &str| {
        format!(
            "[{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: {b}}}}}}}]"
        )
    };
    let bad_routes = "[{match: {safe_regex: {regex: \"((\"}}, route: {cluster: svc}}]".to_owned();
    // Cluster `svc` and `listeners` (name, port, routes).
    let snapshot = |version: &str, listeners: &[(&str, u16, String)]| {
        let mut snap = Snapshot::new(version).with_message("svc", &static_cluster("svc", up));
        for (name, port, routes) in listeners {
            snap = snap.with_message(*name, &inline_listener(name, *port, routes));
        }
        snap
    };
    plane.set(snapshot(
        "1",
        &[
            ("same", ports[0], body("same")),
            ("edited", ports[1], body("v1")),
        ],
    ));
    plane.ack(LISTENER_TYPE_URL, "1");
    let first = push_entry(admin, LISTENER_TYPE_URL, "1");
    assert_eq!(listed(&first, "added"), ["edited", "same"], "{first}");
    assert_eq!(first["changed_count"], 0, "{first}");

    plane.set(snapshot(
        "2",
        &[
            ("same", ports[0], body("same")),
            ("edited", ports[1], body("v2")),
            ("new", ports[2], body("new")),
            ("bad", ports[3], bad_routes),
        ],
    ));
    assert!(matches!(
        plane.verdict(LISTENER_TYPE_URL, "2"),
        Verdict::Nack(_)
    ));
    let second = push_entry(admin, LISTENER_TYPE_URL, "2");
    assert_eq!(listed(&second, "added"), ["new"], "{second}");
    assert_eq!(listed(&second, "changed"), ["edited"], "{second}");
    // SotW repeats every listener; the Delta server sends only those that changed.
    let unchanged = if delta { 0 } else { 1 };
    assert_eq!(second["unchanged_count"], unchanged, "{second}");
    let rejected = second["rejected"].as_array().expect("rejected");
    assert_eq!(rejected.len(), 1, "{second}");
    assert_eq!(rejected[0]["name"], "bad");
    let reason = rejected[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("safe_regex"), "no field path: {reason}");
    assert_eq!(second["verdict"], "NACK");
    assert_eq!(body_of(ports[1]).as_deref(), Some("v2"));

    plane.set(snapshot(
        "3",
        &[
            ("same", ports[0], body("same")),
            ("new", ports[2], body("new")),
        ],
    ));
    plane.ack(LISTENER_TYPE_URL, "3");
    let third = push_entry(admin, LISTENER_TYPE_URL, "3");
    // `bad` too over SotW (absent now); the Delta server removes what it had sent.
    let removed = listed(&third, "removed");
    assert!(removed.contains(&"edited".to_owned()), "{third}");
    assert_eq!(
        (
            third["added_count"].as_u64(),
            third["changed_count"].as_u64()
        ),
        (Some(0), Some(0)),
        "{third}"
    );
    assert_eq!(third["rejected_count"], 0, "{third}");
}

/// [`push_log`] over SotW.
#[test]
fn the_push_log_tells_added_changed_removed_and_rejected_sotw() {
    push_log(false);
}

/// [`push_log`] over Delta.
#[test]
fn the_push_log_tells_added_changed_removed_and_rejected_delta() {
    push_log(true);
}

/// `ads_config` over `google_grpc` (which Envoy accepts too): revoy reaches the control
/// plane at its `target_uri` as over `envoy_grpc`, and serves what it pushes.
#[test]
fn google_grpc_reaches_the_control_plane() {
    let (admin, xds, port) = (free_port(), free_port(), free_port());
    let plane = Plane::start(xds);
    let yaml = ads_bootstrap(admin, xds, false).replace(
        "{envoy_grpc: {cluster_name: xds-grpc}}",
        &format!("{{google_grpc: {{target_uri: \"127.0.0.1:{xds}\", stat_prefix: ads}}}}"),
    );
    assert!(yaml.contains("google_grpc"));
    let _revoy = start_revoy(&yaml, admin);
    let routes =
        "[{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: google}}}]";
    plane.set(Snapshot::new("1").with_message("l", &inline_listener("l", port, routes)));
    plane.ack(LISTENER_TYPE_URL, "1");
    wait_live(admin);
    assert_eq!(body_of(port).as_deref(), Some("google"));
}

/// The xDS cluster's `connection_keepalive` (as a pilot-agent bootstrap may set it on
/// `xds-grpc`) is the ADS channel's: PINGs at its interval; a control plane that falls silent
/// without closing is dropped after its timeout, a new stream opens, and a later push applies.
#[test]
fn the_xds_clusters_keep_alive_finds_a_silent_control_plane() {
    let (admin, xds, port) = (free_port(), free_port(), free_port());
    let plane = Plane::start(xds);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let relay = runtime.block_on(relay::Relay::start(([127, 0, 0, 1], xds).into()));
    let keep_alive = "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: {http2_protocol_options: {connection_keepalive: {interval: 0.1s, timeout: 0.3s}}}\n";
    let yaml = ads_bootstrap(admin, relay.address.port(), false).replace(
        "    connect_timeout: 1s\n",
        &format!("    connect_timeout: 1s\n{keep_alive}"),
    );
    assert!(yaml.contains("connection_keepalive"));
    let _revoy = start_revoy(&yaml, admin);
    let answering = |body: &str| {
        format!(
            "[{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: {body}}}}}}}]"
        )
    };
    plane.set(Snapshot::new("1").with_message("l", &inline_listener("l", port, &answering("one"))));
    plane.ack(LISTENER_TYPE_URL, "1");
    eventually("keep-alive PINGs", || (relay.pings() >= 2).then_some(()));
    let streams = || xds_status(admin)["stream"]["streams"].as_u64();
    assert_eq!(streams(), Some(1));
    relay.silence();
    eventually("a new stream", || (streams() >= Some(2)).then_some(()));
    plane.set(Snapshot::new("2").with_message("l", &inline_listener("l", port, &answering("two"))));
    plane.ack(LISTENER_TYPE_URL, "2");
    assert_eq!(body_of(port).as_deref(), Some("two"));
}
