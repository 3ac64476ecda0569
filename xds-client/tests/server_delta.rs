//! The snapshot server's Delta streams, driven by a raw generated client.

mod common;

use common::*;
use xds_client::server::{Protocol, Snapshot, SnapshotResource};
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, Verdict};

#[tokio::test]
async fn wildcard_gets_added_then_changed_and_removed() {
    let (server, addr) = start(Some(
        Snapshot::new("v1")
            .with_message("l1", &listener("l1", "a"))
            .with_message("l2", &listener("l2", "a")),
    ))
    .await;
    let mut c = Delta::connect(addr, "d1").await;
    // The legacy form: an empty first request is a wildcard subscription for LDS.
    c.request(DeltaReq {
        type_url: LISTENER_TYPE_URL,
        ..Default::default()
    })
    .await;
    let r1 = c.recv().await;
    assert_eq!(r1.system_version_info, "v1");
    assert_eq!(delta_names(&r1), ["l1", "l2"]);
    assert!(r1.removed_resources.is_empty());
    let l1_v1 = r1.resources.iter().find(|r| r.name == "l1").unwrap();
    assert_eq!(
        l1_v1.version,
        SnapshotResource::new(proto::pack(&listener("l1", "a"))).version
    );
    assert_eq!(l1_v1.resource.as_ref().unwrap().type_url, LISTENER_TYPE_URL);
    c.ack(&r1).await;
    assert_eq!(
        server.acked("d1", LISTENER_TYPE_URL, "v1", WAIT).await,
        Some(Verdict::Ack)
    );

    server.set(
        Snapshot::new("v2")
            .with_message("l1", &listener("l1", "b"))
            .with_message("l3", &listener("l3", "a")),
    );
    let r2 = c.recv().await;
    assert_eq!(r2.system_version_info, "v2");
    assert_eq!(delta_names(&r2), ["l1", "l3"]);
    assert_eq!(r2.removed_resources, ["l2"]);
    assert_ne!(r2.resources[0].version, l1_v1.version);
    c.request(DeltaReq {
        type_url: LISTENER_TYPE_URL,
        nonce: &r2.nonce,
        nack: Some("l3: no filter chains"),
        ..Default::default()
    })
    .await;
    assert_eq!(
        server.acked("d1", LISTENER_TYPE_URL, "v2", WAIT).await,
        Some(Verdict::Nack("l3: no filter chains".into()))
    );
    let events = server.events();
    assert!(events.iter().all(|e| e.protocol == Protocol::Delta));

    // Same content under a new version: nothing to send.
    server.set(
        Snapshot::new("v3")
            .with_message("l1", &listener("l1", "b"))
            .with_message("l3", &listener("l3", "a")),
    );
    c.nothing().await;
}

#[tokio::test]
async fn initial_resource_versions_get_only_what_is_newer_and_what_is_gone() {
    let c1 = cluster("c1", "a");
    let (_server, addr) = start(Some(
        Snapshot::new("v1")
            .with_message("c1", &c1)
            .with_message("c2", &cluster("c2", "a")),
    ))
    .await;
    let c1_version = SnapshotResource::new(proto::pack(&c1)).version;
    let mut c = Delta::connect(addr, "d2").await;
    c.request(DeltaReq {
        type_url: CLUSTER_TYPE_URL,
        subscribe: &["*"],
        initial: &[("c1", &c1_version), ("c2", "old"), ("gone", "x")],
        ..Default::default()
    })
    .await;
    let r = c.recv().await;
    assert_eq!(delta_names(&r), ["c2"]);
    assert_eq!(r.removed_resources, ["gone"]);
}

#[tokio::test]
async fn named_subscriptions_follow_subscribe_and_unsubscribe() {
    let (server, addr) = start(Some(
        Snapshot::new("v1")
            .with_message("c1", &endpoints("c1", 0))
            .with_message("c2", &endpoints("c2", 0))
            .with_message("c3", &endpoints("c3", 0)),
    ))
    .await;
    let mut c = Delta::connect(addr, "d3").await;
    c.request(DeltaReq {
        type_url: ENDPOINT_TYPE_URL,
        subscribe: &["c1", "nope"],
        ..Default::default()
    })
    .await;
    let r1 = c.recv().await;
    assert_eq!(delta_names(&r1), ["c1"]);
    c.request(DeltaReq {
        type_url: ENDPOINT_TYPE_URL,
        subscribe: &["c2"],
        unsubscribe: &["c1"],
        nonce: &r1.nonce,
        ..Default::default()
    })
    .await;
    let r2 = c.recv().await;
    assert_eq!(delta_names(&r2), ["c2"]);
    assert!(r2.removed_resources.is_empty());
    c.ack(&r2).await;
    // c1 (unsubscribed) and c3 (never asked) change: nothing for this client.
    server.set(
        Snapshot::new("v2")
            .with_message("c1", &endpoints("c1", 1))
            .with_message("c2", &endpoints("c2", 0))
            .with_message("c3", &endpoints("c3", 1)),
    );
    c.nothing().await;
    // c2 goes away: removed.
    server.set(Snapshot::new("v3").with_message("c1", &endpoints("c1", 1)));
    let r3 = c.recv().await;
    assert!(r3.resources.is_empty());
    assert_eq!(r3.removed_resources, ["c2"]);
    // Re-subscribing to c1 sends it again.
    c.request(DeltaReq {
        type_url: ENDPOINT_TYPE_URL,
        subscribe: &["c1"],
        nonce: &r3.nonce,
        ..Default::default()
    })
    .await;
    assert_eq!(delta_names(&c.recv().await), ["c1"]);
}

#[tokio::test]
async fn an_empty_wildcard_is_still_answered_once() {
    let (_server, addr) = start(Some(Snapshot::new("v1"))).await;
    let mut c = Delta::connect(addr, "d4").await;
    c.request(DeltaReq {
        type_url: CLUSTER_TYPE_URL,
        ..Default::default()
    })
    .await;
    let r = c.recv().await;
    assert_eq!(r.system_version_info, "v1");
    assert!(r.resources.is_empty() && r.removed_resources.is_empty());
    c.ack(&r).await;
    c.nothing().await;
}

#[tokio::test]
async fn a_changed_cluster_is_followed_by_its_endpoints_even_if_unchanged() {
    let snapshot = |tag: &str| {
        Snapshot::new(tag)
            .with_message("c1", &cluster("c1", tag))
            .with_message("c2", &cluster("c2", "a"))
            .with_message("c1", &endpoints("c1", 0))
            .with_message("c2", &endpoints("c2", 0))
    };
    let (server, addr) = start(Some(snapshot("v1"))).await;
    let mut c = Delta::connect(addr, "d5").await;
    c.request(DeltaReq {
        type_url: CLUSTER_TYPE_URL,
        ..Default::default()
    })
    .await;
    let cds = c.recv().await;
    c.ack(&cds).await;
    c.request(DeltaReq {
        type_url: ENDPOINT_TYPE_URL,
        subscribe: &["c1", "c2"],
        ..Default::default()
    })
    .await;
    let eds = c.recv().await;
    c.ack(&eds).await;
    server.set(snapshot("v2"));
    let cds = c.recv().await;
    assert_eq!(delta_names(&cds), ["c1"]);
    let eds = c.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(delta_names(&eds), ["c1"]);
    c.ack(&cds).await;
    c.ack(&eds).await;
    c.nothing().await;
}
