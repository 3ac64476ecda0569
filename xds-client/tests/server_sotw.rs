//! The snapshot server's state-of-the-world streams, driven by a raw generated client.

mod common;

use common::*;
use xds_client::server::{Protocol, Snapshot};
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict};

fn v1() -> Snapshot {
    Snapshot::new("v1")
        .with_message("l1", &listener("l1", "a"))
        .with_message("l2", &listener("l2", "a"))
        .with_message("c1", &cluster("c1", "a"))
        .with_message("c2", &cluster("c2", "a"))
        .with_message("r1", &route("r1", "a"))
        .with_message("r2", &route("r2", "a"))
        .with_message("c1", &endpoints("c1", 0))
        .with_message("c2", &endpoints("c2", 0))
}

#[tokio::test]
async fn wildcard_lds_and_cds_get_the_full_state() {
    let (_server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    c.request(LISTENER_TYPE_URL, &[], "", "", None).await;
    let lds = c.recv().await;
    assert_eq!(lds.type_url, LISTENER_TYPE_URL);
    assert_eq!(lds.version_info, "v1");
    assert_eq!(names(&lds), ["l1", "l2"]);
    c.request(CLUSTER_TYPE_URL, &["*"], "", "", None).await;
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE_URL);
    assert_eq!(names(&cds), ["c1", "c2"]);
    assert_ne!(lds.nonce, cds.nonce);
}

#[tokio::test]
async fn named_rds_and_eds_get_only_the_names_asked_that_exist() {
    let (_server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    c.request(ROUTE_TYPE_URL, &["r2", "missing"], "", "", None)
        .await;
    let rds = c.recv().await;
    assert_eq!(names(&rds), ["r2"]);
    c.request(ENDPOINT_TYPE_URL, &["c1"], "", "", None).await;
    assert_eq!(names(&c.recv().await), ["c1"]);
    // A new name gets its resource; the client keeps the one it has (RDS is not full-state).
    c.request(ROUTE_TYPE_URL, &["r1", "r2"], "v1", &rds.nonce, None)
        .await;
    let rds = c.recv().await;
    assert_eq!(names(&rds), ["r1"]);
    // Dropping a name needs no response; subscribing to it again resends it, unchanged.
    c.request(ROUTE_TYPE_URL, &["r1"], "v1", &rds.nonce, None)
        .await;
    c.nothing().await;
    c.request(ROUTE_TYPE_URL, &["r1", "r2"], "v1", &rds.nonce, None)
        .await;
    assert_eq!(names(&c.recv().await), ["r2"]);
    // Names that exist nowhere are not answered until they do.
    c.request(
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        &["s"],
        "",
        "",
        None,
    )
    .await;
    c.nothing().await;
}

#[tokio::test]
async fn an_update_pushes_only_the_changed_types_in_cds_eds_lds_rds_order() {
    let (server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    for (t, n) in [
        (LISTENER_TYPE_URL, &[][..]),
        (CLUSTER_TYPE_URL, &[][..]),
        (ROUTE_TYPE_URL, &["r1"][..]),
        (ENDPOINT_TYPE_URL, &["c1"][..]),
    ] {
        c.request(t, n, "", "", None).await;
        let r = c.recv().await;
        c.ack(&r, n).await;
    }
    // v2 changes a cluster and a route nobody asked for: only CDS is pushed.
    let mut v2 = v1()
        .with_message("c2", &cluster("c2", "b"))
        .with_message("r2", &route("r2", "b"));
    v2.set_version("v2");
    server.set(v2);
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE_URL);
    assert_eq!(cds.version_info, "v2");
    assert_eq!(names(&cds), ["c1", "c2"]);
    c.ack(&cds, &[]).await;
    c.nothing().await;
    // v3 changes every type: pushed clusters first, routes last.
    server.set(
        Snapshot::new("v3")
            .with_message("l1", &listener("l1", "c"))
            .with_message("c1", &cluster("c1", "c"))
            .with_message("r1", &route("r1", "c"))
            .with_message("c1", &endpoints("c1", 1)),
    );
    let mut got = Vec::new();
    for _ in 0..4 {
        let r = c.recv().await;
        assert_eq!(r.version_info, "v3");
        got.push(r.type_url);
    }
    assert_eq!(
        got,
        [
            CLUSTER_TYPE_URL,
            ENDPOINT_TYPE_URL,
            LISTENER_TYPE_URL,
            ROUTE_TYPE_URL
        ]
    );
}

#[tokio::test]
async fn acks_and_nacks_are_recorded_with_the_reason() {
    let (server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "proxy-7").await;
    c.request(LISTENER_TYPE_URL, &[], "", "", None).await;
    let r1 = c.recv().await;
    c.ack(&r1, &[]).await;
    let verdict = server.acked("proxy-7", LISTENER_TYPE_URL, "v1", WAIT).await;
    assert_eq!(verdict, Some(Verdict::Ack));

    server.set(Snapshot::new("v2").with_message("l9", &listener("l9", "x")));
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["l9"]);
    c.request(
        LISTENER_TYPE_URL,
        &[],
        "v1",
        &r2.nonce,
        Some("l9: missing address"),
    )
    .await;
    let verdict = server.acked("proxy-7", LISTENER_TYPE_URL, "v2", WAIT).await;
    assert_eq!(verdict, Some(Verdict::Nack("l9: missing address".into())));
    // The NACKed content is not sent again.
    c.nothing().await;

    // A stale nonce is neither an ACK nor a NACK; the stream handles requests in order, so
    // once the next real ACK is in, the stale one was seen and dropped.
    c.request(LISTENER_TYPE_URL, &[], "v1", &r1.nonce, Some("stale"))
        .await;
    c.request(CLUSTER_TYPE_URL, &[], "", "", None).await;
    let cds = c.recv().await;
    c.ack(&cds, &[]).await;
    assert!(
        server
            .acked("proxy-7", CLUSTER_TYPE_URL, "v2", WAIT)
            .await
            .is_some()
    );
    let events = server.events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events.iter().all(|e| e.protocol == Protocol::Sotw));
    assert!(
        !events
            .iter()
            .any(|e| e.verdict == Verdict::Nack("stale".into()))
    );
    assert_eq!(events[1].nonce, r2.nonce);
}

#[tokio::test]
async fn a_client_that_connects_before_the_first_snapshot_is_answered_when_it_comes() {
    let (server, addr) = start(None).await;
    let mut c = Sotw::connect(addr, "early").await;
    c.request(CLUSTER_TYPE_URL, &[], "", "", None).await;
    c.nothing().await;
    server.set(v1());
    let cds = c.recv().await;
    assert_eq!(cds.version_info, "v1");
    assert_eq!(names(&cds), ["c1", "c2"]);
}

#[tokio::test]
async fn a_removed_listener_leaves_the_full_state_and_an_emptied_type_is_still_sent() {
    let (server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    c.request(LISTENER_TYPE_URL, &[], "", "", None).await;
    let r = c.recv().await;
    c.ack(&r, &[]).await;
    server.set(Snapshot::new("v2").with_message("c1", &cluster("c1", "a")));
    let lds = c.recv().await;
    assert_eq!(lds.version_info, "v2");
    assert!(lds.resources.is_empty());
}

#[tokio::test]
async fn a_changed_cluster_is_followed_by_its_endpoints_even_if_unchanged() {
    let (server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    for (t, n) in [
        (CLUSTER_TYPE_URL, &[][..]),
        (ENDPOINT_TYPE_URL, &["c1"][..]),
    ] {
        c.request(t, n, "", "", None).await;
        let r = c.recv().await;
        c.ack(&r, n).await;
    }
    let mut v2 = v1().with_message("c1", &cluster("c1", "b"));
    v2.set_version("v2");
    server.set(v2);
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE_URL);
    let eds = c.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(eds.version_info, "v2");
    assert_eq!(names(&eds), ["c1"]);
    c.ack(&cds, &[]).await;
    c.ack(&eds, &["c1"]).await;
    // Envoy's re-request with the same nonce is not a second ACK.
    c.ack(&eds, &["c1"]).await;
    c.nothing().await;
    let acks = server
        .events()
        .iter()
        .filter(|e| e.nonce == eds.nonce)
        .count();
    assert_eq!(acks, 1);
}

#[tokio::test]
async fn a_nonce_from_an_earlier_stream_does_not_block_the_first_response() {
    let (_server, addr) = start(Some(v1())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    c.request(CLUSTER_TYPE_URL, &[], "v0", "41", None).await;
    let cds = c.recv().await;
    assert_eq!(names(&cds), ["c1", "c2"]);
}

/// v1 plus clusters c3 and c4 with their endpoints.
fn four_clusters() -> Snapshot {
    v1().with_message("c3", &cluster("c3", "a"))
        .with_message("c4", &cluster("c4", "a"))
        .with_message("c3", &endpoints("c3", 0))
        .with_message("c4", &endpoints("c4", 0))
}

#[tokio::test]
async fn a_change_to_one_of_several_assignments_sends_only_that_one_and_cds_stays_full() {
    let (server, addr) = start(Some(four_clusters())).await;
    let mut c = Sotw::connect(addr, "n1").await;
    let eds_names = ["c1", "c2", "c3", "c4"];
    for (t, n) in [
        (CLUSTER_TYPE_URL, &[][..]),
        (ENDPOINT_TYPE_URL, &eds_names[..]),
    ] {
        c.request(t, n, "", "", None).await;
        let r = c.recv().await;
        assert_eq!(names(&r), eds_names);
        c.ack(&r, n).await;
    }
    // v2 moves c3's endpoints only.
    let mut v2 = four_clusters().with_message("c3", &endpoints("c3", 1));
    v2.set_version("v2");
    server.set(v2);
    let eds = c.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(eds.version_info, "v2");
    assert_eq!(names(&eds), ["c3"]);
    c.ack(&eds, &eds_names).await;
    assert_eq!(
        server.acked("n1", ENDPOINT_TYPE_URL, "v2", WAIT).await,
        Some(Verdict::Ack)
    );
    c.nothing().await;
    // v3 changes cluster c2 (its endpoints unchanged) and c4's endpoints: CDS is the full
    // state, then EDS carries c4 and c2 (the updated cluster warms until it gets its own).
    let mut v3 = four_clusters()
        .with_message("c3", &endpoints("c3", 1))
        .with_message("c2", &cluster("c2", "b"))
        .with_message("c4", &endpoints("c4", 1));
    v3.set_version("v3");
    server.set(v3);
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE_URL);
    assert_eq!(names(&cds), eds_names);
    let eds = c.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(names(&eds), ["c2", "c4"]);
    c.nothing().await;
}

#[tokio::test]
async fn a_reconnected_client_gets_every_assignment_it_asks_for() {
    let (server, addr) = start(Some(four_clusters())).await;
    let eds_names = ["c1", "c2", "c3", "c4"];
    let mut c = Sotw::connect(addr, "n1").await;
    c.request(ENDPOINT_TYPE_URL, &eds_names, "", "", None).await;
    let eds = c.recv().await;
    assert_eq!(names(&eds), eds_names);
    c.ack(&eds, &eds_names).await;
    let mut v2 = four_clusters().with_message("c1", &endpoints("c1", 1));
    v2.set_version("v2");
    server.set(v2);
    let eds = c.recv().await;
    assert_eq!(names(&eds), ["c1"]);
    drop(c);
    // A new stream holds nothing: what the client had on the old one is sent again, at the
    // version it says it has.
    let mut c = Sotw::connect(addr, "n1").await;
    c.request(ENDPOINT_TYPE_URL, &eds_names, "v2", "", None)
        .await;
    let eds = c.recv().await;
    assert_eq!(eds.version_info, "v2");
    assert_eq!(names(&eds), eds_names);
}
