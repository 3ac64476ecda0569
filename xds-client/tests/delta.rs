//! The Delta protocol against a scripted ADS server.

mod support;

use std::collections::HashMap;

use proto::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource, ResourceName};
use proto::pb::google::protobuf::Any;
use support::{cluster, endpoints, names, node, serve_and_start, strings};
use xds_client::client::Mode;
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Event, Verdict};

fn resource(any: Any, name: &str, version: &str) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(any),
        ..Default::default()
    }
}

fn delta(
    type_url: &str,
    system_version: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: system_version.into(),
        resources,
        type_url: type_url.into(),
        removed_resources: strings(removed),
        nonce: nonce.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn subscribe_and_unsubscribe_are_differences() {
    let (mut server, client, _recorder, _probe) = serve_and_start(Mode::Delta).await;
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    client.subscribe(ENDPOINT_TYPE_URL, strings(&["a", "b"]));
    client.subscribe("type.googleapis.com/unused", vec![]);
    let mut stream = server.delta_stream().await;
    let cds = stream.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE_URL);
    assert_eq!(cds.resource_names_subscribe, ["*"], "explicit wildcard");
    assert_eq!(cds.node, Some(node()));
    let eds = stream.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(eds.resource_names_subscribe, ["a", "b"]);
    assert!(eds.resource_names_unsubscribe.is_empty());
    stream.expect_none().await;

    client.subscribe(ENDPOINT_TYPE_URL, strings(&["b", "c"]));
    let change = stream.recv().await;
    assert_eq!(change.resource_names_subscribe, ["c"]);
    assert_eq!(change.resource_names_unsubscribe, ["a"]);
    client.subscribe(ENDPOINT_TYPE_URL, strings(&["c", "b"]));
    stream.expect_none().await;
    client.subscribe(ENDPOINT_TYPE_URL, vec![]);
    let change = stream.recv().await;
    assert!(
        change.resource_names_subscribe.is_empty(),
        "never a wildcard"
    );
    assert_eq!(change.resource_names_unsubscribe, ["b", "c"]);
    client.stop();
}

#[tokio::test]
async fn responses_deliver_versions_and_removals_and_are_acked_by_nonce() {
    let (mut server, client, recorder, mut probe) = serve_and_start(Mode::Delta).await;
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    let mut stream = server.delta_stream().await;
    stream.recv().await;
    stream.send(delta(
        CLUSTER_TYPE_URL,
        "s1",
        "n1",
        vec![
            resource(cluster("a"), "a", "1"),
            resource(cluster("b"), "b", "4"),
        ],
        &[],
    ));
    let update = probe.update().await;
    assert_eq!(update.version_info, "s1");
    assert_eq!(names(&update), ["a", "b"]);
    assert_eq!(update.resources[1].version, "4");
    let ack = stream.recv().await;
    assert_eq!(ack.response_nonce, "n1");
    assert_eq!(ack.error_detail, None);
    assert!(ack.resource_names_subscribe.is_empty());

    let mut response = delta(CLUSTER_TYPE_URL, "s2", "n2", vec![], &["a"]);
    response.removed_resource_names = vec![ResourceName {
        name: "b".into(),
        ..Default::default()
    }];
    stream.send(response);
    let update = probe.update().await;
    assert!(update.resources.is_empty());
    assert_eq!(update.removed, ["a", "b"]);
    stream.recv().await;

    recorder.reject("d", "Cluster.type: unsupported");
    stream.send(delta(
        CLUSTER_TYPE_URL,
        "s3",
        "n3",
        vec![
            resource(cluster("c"), "c", "1"),
            resource(cluster("d"), "d", "1"),
        ],
        &[],
    ));
    probe.update().await;
    let nack = stream.recv().await;
    assert_eq!(nack.response_nonce, "n3");
    let detail = nack.error_detail.unwrap();
    assert_eq!(detail.code, 3);
    assert_eq!(detail.message, "d: Cluster.type: unsupported");
    let status = client.status();
    assert_eq!(status.types[0].acked_version, "s2");
    assert_eq!(
        status.pushes[0].verdict,
        Verdict::Nack("d: Cluster.type: unsupported".into())
    );
    assert_eq!(status.pushes[1].removed.first, ["a", "b"]);
    client.stop();
}

#[tokio::test]
async fn duplicate_and_foreign_resources() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Delta).await;
    client.subscribe(ENDPOINT_TYPE_URL, strings(&["a", "b"]));
    let mut stream = server.delta_stream().await;
    stream.recv().await;
    stream.send(delta(
        ENDPOINT_TYPE_URL,
        "s1",
        "n1",
        vec![
            resource(endpoints("a"), "a", "1"),
            resource(endpoints("a"), "a", "2"),
        ],
        &[],
    ));
    let nack = stream.recv().await;
    assert!(
        nack.error_detail
            .unwrap()
            .message
            .contains("duplicate resource name: a")
    );
    probe.expect_no_update().await;

    stream.send(delta(
        ENDPOINT_TYPE_URL,
        "s2",
        "n2",
        vec![
            resource(endpoints("a"), "a", "1"),
            resource(cluster("b"), "b", "1"),
        ],
        &[],
    ));
    assert_eq!(names(&probe.update().await), ["a"]);
    let nack = stream.recv().await;
    assert_eq!(nack.response_nonce, "n2");
    assert!(
        nack.error_detail
            .unwrap()
            .message
            .starts_with("b: type URL ")
    );
    client.stop();
}

#[tokio::test]
async fn reconnect_sends_initial_resource_versions_of_applied_resources() {
    let (mut server, client, recorder, mut probe) = serve_and_start(Mode::Delta).await;
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    client.subscribe(ENDPOINT_TYPE_URL, strings(&["e1", "e2"]));
    let mut stream = server.delta_stream().await;
    stream.recv().await;
    stream.recv().await;
    recorder.reject("bad", "Cluster.name: reserved");
    stream.send(delta(
        CLUSTER_TYPE_URL,
        "s1",
        "n1",
        vec![
            resource(cluster("a"), "a", "3"),
            resource(cluster("b"), "b", "5"),
            resource(cluster("bad"), "bad", "1"),
        ],
        &[],
    ));
    probe.update().await;
    stream.recv().await;
    stream.send(delta(CLUSTER_TYPE_URL, "s2", "n2", vec![], &["b"]));
    probe.update().await;
    stream.recv().await;
    stream.send(delta(
        ENDPOINT_TYPE_URL,
        "s3",
        "n3",
        vec![resource(endpoints("e1"), "e1", "7")],
        &[],
    ));
    probe.update().await;
    stream.recv().await;
    // Unsubscribed names are forgotten.
    client.subscribe(ENDPOINT_TYPE_URL, strings(&["e2"]));
    stream.recv().await;

    stream.close();
    assert_eq!(probe.event().await, Event::Connected);
    assert_eq!(probe.event().await, Event::Disconnected);
    let mut stream = server.delta_stream().await;
    let cds = stream.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE_URL);
    assert_eq!(cds.resource_names_subscribe, ["*"]);
    assert_eq!(
        cds.initial_resource_versions,
        HashMap::from([("a".to_string(), "3".to_string())])
    );
    assert_eq!(cds.node, Some(node()));
    let eds = stream.recv().await;
    assert_eq!(eds.resource_names_subscribe, ["e2"]);
    assert!(eds.initial_resource_versions.is_empty());
    probe.expect_no_update().await;
    client.stop();
}
