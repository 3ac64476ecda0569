//! A pod's termination, in the pods, with traffic running: what Kubernetes, istiod and
//! pilot-agent do when pod c goes away while it serves svc-b beside b, and what its sidecar's
//! clients see. pilot-agent's part is read from its source (istio/istio `pkg/envoy/agent.go`,
//! `Agent.terminate`; `pkg/envoy/admin.go`, `DrainListeners`; `pkg/envoy/proxy.go`,
//! `cmd.Process.Kill()`): `POST /drain_listeners?inboundonly&graceful` on the proxy's admin,
//! then `terminationDrainDuration` (5 s by default) of sleep, then SIGKILL — never SIGTERM. The
//! proxy's `--drain-time-s` is pilot-agent's default 45 s, so the kill comes first and the
//! drained inbound listener never stops listening on its own (`pilot_agent.rs` checks that
//! stop on loopback with a shorter drain time). istiod meanwhile removes the terminating
//! pod's endpoint.
//!
//! What every run must see is the same list, whatever sidecars the pods run (Envoy's in
//! `envoy_in_every_pod` is the reference): an in-flight request to c completes (one from
//! outside the mesh, one from a through its sidecar over mTLS), so do a's new requests to
//! svc-c (c alone) while c drains, keep-alive
//! HTTP/1.1 clients get `connection: close` and HTTP/2 clients a GOAWAY with NO_ERROR, new
//! connections to c's draining inbound listener are still served but closed, c's own outbound
//! calls keep working, and after the kill new connections are refused; a's HTTP/1.1, gRPC and
//! TCP load to svc-b (a's sidecar retrying as istiod's retry policy says) sees no failure.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::app::{self, Proto, field};
use super::config::{self, Outbound};
use super::mesh::Cluster;
use crate::h2_frames;
use crate::xds::Conn;

/// pilot-agent's default `terminationDrainDuration`.
const TERMINATION_DRAIN: Duration = Duration::from_secs(5);

/// What the run must see, in order (see the module's description).
pub const EXPECTED: &[&str] = &[
    "keep-alive HTTP/1.1 before the drain: 200 from c",
    "keep-alive HTTP/2 before the drain: 200 from c, GOAWAY None",
    "drain: 200",
    "in-flight request: 200 from c, connection: close",
    "a's in-flight request to svc-c: 200 from c",
    "keep-alive HTTP/1.1 after the drain: 200 from c, connection: close",
    "keep-alive HTTP/2 after the drain: 200 from c, GOAWAY Some(0)",
    "new connection while draining: 200 from c, connection: close",
    "a's new request to svc-c while draining: 200 from c",
    "c's outbound call while draining: 200 from a",
    "new connection after the kill: refused",
];

/// A connection from the host outside the mesh to `to` (plaintext: c is PERMISSIVE).
fn connect(cluster: &Cluster, to: SocketAddr) -> Result<TcpStream, std::io::Error> {
    cluster
        .ns("outside")
        .enter(move || TcpStream::connect_timeout(&to, Duration::from_secs(5)))
}

/// A keep-alive HTTP/1.1 client of `to` from outside the mesh.
fn keep_alive(cluster: &Cluster, to: SocketAddr) -> Conn {
    connect(cluster, to)
        .and_then(Conn::over)
        .unwrap_or_else(|e| panic!("connect {to} from outside: {e}"))
}

/// An HTTP/1.1 answer as `<status> from <pod>[, connection: close]`.
fn seen(r: Result<crate::xds::Response, String>) -> String {
    match r {
        Ok(r) => {
            let pod = field(&r.body, "Hostname").unwrap_or("?");
            let close = if r.closes() {
                ", connection: close"
            } else {
                ""
            };
            format!("{} from {pod}{close}", r.status)
        }
        Err(e) => format!("error: {e}"),
    }
}

/// A GET of `path` on stream `id` of the HTTP/2 connection `conn`, read until the stream
/// ends (and, when `goaway`, until a GOAWAY came too): `200 from <pod>, GOAWAY <code>`.
fn h2_get(conn: &mut TcpStream, id: u32, path: &str, goaway: bool) -> String {
    let mut reader = h2_frames::Reader::new(conn);
    let seen = reader
        .write(&h2_frames::get(id, "c", path))
        .and_then(|()| reader.until(id, |s, g| s.ended && (!goaway || g.is_some())));
    match seen {
        Ok(s) => {
            let body = String::from_utf8_lossy(&s.body).into_owned();
            let status = if s.ok == Some(true) { "200" } else { "not 200" };
            let pod = field(&body, "Hostname").unwrap_or("?");
            format!("{status} from {pod}, GOAWAY {:?}", reader.goaway)
        }
        Err(e) => format!("error: {e}"),
    }
}

/// pilot-agent's POST on pod `pod`'s proxy admin: the status code.
fn admin_post(cluster: &Cluster, pod: &str, path: &str) -> String {
    let path = path.to_owned();
    let answer = cluster.pod(pod).ns.enter(move || {
        let mut conn = TcpStream::connect(crate::netns::ADMIN).map_err(|e| e.to_string())?;
        write!(
            conn,
            "POST {path} HTTP/1.1\r\nhost: localhost:15000\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        Ok::<_, String>(crate::xds::read_to_end(conn))
    });
    match answer {
        Ok(raw) => String::from_utf8_lossy(&raw)
            .split(' ')
            .nth(1)
            .unwrap_or("?")
            .to_owned(),
        Err(e) => format!("error: {e}"),
    }
}

/// A's HTTP/1.1 request for `path` to svc-c (served by c alone), through its sidecar over
/// mTLS: `<status> from <pod>`.
fn from_a_to_svc_c(cluster: &Cluster, path: &str) -> String {
    let to = crate::addr(crate::SVC_C_VIP, 80);
    match app::request(cluster.ns("a"), Proto::H1, to, "svc-c", path) {
        Ok((status, body)) => format!("{status} from {}", field(&body, "Hostname").unwrap_or("?")),
        Err(e) => format!("error: {e}"),
    }
}

/// Waits (up to 20 s) until the echo holds the request for `/held/<key>`.
fn wait_held(key: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !app::arrived(key) {
        assert!(Instant::now() < deadline, "the held request never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pod c's termination with a's load to svc-b (served by b and c) running: what c's clients
/// saw (to compare with [`EXPECTED`]) and how many HTTP/1.1, gRPC and TCP requests the load
/// made (each one succeeded).
pub fn terminate_c(cluster: &Cluster, key: &str) -> (Vec<String>, [u32; 3]) {
    let mut mesh = crate::mesh_of(cluster, Outbound::AllowAny);
    let to_c = crate::addr(crate::POD_C, config::HTTP_PORT);
    let mut out = Vec::new();
    let counts = crate::under_load(cluster, crate::SVC_B_VIP, |phase| {
        let c = mesh.services[2].endpoints[0].clone();
        crate::endpoint_added(cluster, &mut mesh, crate::SVC_B_VIP, c, phase);

        let mut h1 = keep_alive(cluster, to_c);
        out.push(format!(
            "keep-alive HTTP/1.1 before the drain: {}",
            seen(h1.get("/keep"))
        ));
        let mut h2 = connect(cluster, to_c).expect("an HTTP/2 connection to c");
        h2.set_read_timeout(Some(crate::xds::WAIT))
            .expect("a read timeout");
        h2.write_all(&h2_frames::preface()).expect("the preface");
        out.push(format!(
            "keep-alive HTTP/2 before the drain: {}",
            h2_get(&mut h2, 1, "/keep", false)
        ));

        std::thread::scope(|s| {
            let path = format!("{}{key}", app::HELD);
            let mut held = keep_alive(cluster, to_c);
            let in_flight = s.spawn(move || seen(held.get(&path)));
            let mesh_key = format!("{key}-mesh");
            let mesh_path = format!("{}{mesh_key}", app::HELD);
            let mesh_in_flight = s.spawn(move || from_a_to_svc_c(cluster, &mesh_path));
            wait_held(key);
            wait_held(&mesh_key);
            phase.set("c drains (pilot-agent)");
            let drained = Instant::now();
            out.push(format!(
                "drain: {}",
                admin_post(cluster, "c", "/drain_listeners?inboundonly&graceful")
            ));
            app::release(key);
            app::release(&mesh_key);
            out.push(format!(
                "in-flight request: {}",
                in_flight.join().expect("the in-flight request")
            ));
            out.push(format!(
                "a's in-flight request to svc-c: {}",
                mesh_in_flight.join().expect("a's in-flight request")
            ));
            out.push(format!(
                "keep-alive HTTP/1.1 after the drain: {}",
                seen(h1.get("/keep"))
            ));
            out.push(format!(
                "keep-alive HTTP/2 after the drain: {}",
                h2_get(&mut h2, 3, "/keep", true)
            ));
            out.push(format!(
                "new connection while draining: {}",
                seen(keep_alive(cluster, to_c).get("/new"))
            ));
            out.push(format!(
                "a's new request to svc-c while draining: {}",
                from_a_to_svc_c(cluster, "/new")
            ));
            let outbound = app::request(
                cluster.ns("c"),
                Proto::H1,
                crate::addr(crate::SVC_A_VIP, 80),
                "svc-a",
                "/out",
            );
            out.push(format!(
                "c's outbound call while draining: {}",
                match outbound {
                    Ok((status, body)) =>
                        format!("{status} from {}", field(&body, "Hostname").unwrap_or("?")),
                    Err(e) => format!("error: {e}"),
                }
            ));

            // istiod takes the terminating pod's endpoint out of svc-b.
            crate::endpoint_removed(cluster, &mut mesh, crate::SVC_B_VIP, phase);
            std::thread::sleep(TERMINATION_DRAIN.saturating_sub(drained.elapsed()));
            phase.set("c's proxy killed (pilot-agent)");
            cluster.pod("c").proxy.as_ref().expect("c's sidecar").kill();
        });
        // The kill takes a moment to close the proxy's sockets.
        let refused = crate::eventually(|| match connect(cluster, to_c) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok("refused".into()),
            other => Err(format!("{other:?}")),
        });
        out.push(format!(
            "new connection after the kill: {}",
            refused.unwrap_or_else(|e| e)
        ));
        // The load goes on a moment with c gone.
        std::thread::sleep(Duration::from_secs(1));
    });
    (out, counts)
}
