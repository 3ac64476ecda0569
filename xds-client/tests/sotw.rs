//! The SotW protocol against a scripted ADS server.

mod support;

use prost::Message;
use proto::pb::envoy::service::discovery::v3::Resource as WrappedResource;
use proto::pb::google::protobuf::Any;
use support::{
    Server, cluster, config, endpoints, listener, names, node, response, route, serve_and_start,
    start, strings,
};
use xds_client::client::Mode;
use xds_client::{
    CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Event, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict,
};

#[tokio::test]
async fn ack_carries_version_and_nonce() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    let first = stream.recv().await;
    assert_eq!(first.type_url, LISTENER_TYPE_URL);
    assert!(first.resource_names.is_empty(), "wildcard: empty names");
    assert_eq!(first.version_info, "");
    assert_eq!(first.response_nonce, "");
    assert_eq!(first.node, Some(node()));
    assert_eq!(probe.event().await, Event::Connected);

    stream.send(response(
        LISTENER_TYPE_URL,
        "v1",
        "n1",
        vec![listener("a"), listener("b")],
    ));
    let update = probe.update().await;
    assert_eq!(update.type_url, LISTENER_TYPE_URL);
    assert_eq!(update.version_info, "v1");
    assert_eq!(names(&update), ["a", "b"]);
    assert_eq!(update.resources[0].version, "v1");
    assert!(update.removed.is_empty());

    let ack = stream.recv().await;
    assert_eq!(ack.version_info, "v1");
    assert_eq!(ack.response_nonce, "n1");
    assert_eq!(ack.error_detail, None);
    assert!(ack.resource_names.is_empty());
    assert_eq!(ack.node, Some(node()), "node on every request by default");

    let status = client.status();
    assert!(status.connected);
    assert!(!status.types[0].pending, "an ACK expects no response");
    assert_eq!(status.streams, 1);
    assert_eq!(status.types.len(), 1);
    assert!(status.types[0].wildcard);
    assert_eq!(status.types[0].acked_version, "v1");
    assert_eq!(status.types[0].nonce, "n1");
    assert_eq!(status.pushes.len(), 1);
    assert_eq!(status.pushes[0].verdict, Verdict::Ack);
    assert_eq!(status.pushes[0].resources.first, ["a", "b"]);
    client.stop();
}

#[tokio::test]
async fn partial_rejection_nacks_with_last_good_version() {
    let (mut server, client, recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    stream.send(response(CLUSTER_TYPE_URL, "v1", "n1", vec![cluster("a")]));
    probe.update().await;
    assert_eq!(stream.recv().await.version_info, "v1");

    recorder.reject("b", "Cluster.connect_timeout: must be positive");
    stream.send(response(
        CLUSTER_TYPE_URL,
        "v2",
        "n2",
        vec![cluster("a"), cluster("b"), cluster("c")],
    ));
    let update = probe.update().await;
    assert_eq!(
        names(&update),
        ["a", "b", "c"],
        "the handler sees all three"
    );
    let nack = stream.recv().await;
    assert_eq!(
        nack.version_info, "v1",
        "NACK carries the last good version"
    );
    assert_eq!(nack.response_nonce, "n2");
    let detail = nack.error_detail.expect("error_detail");
    assert_eq!(detail.code, 3);
    assert_eq!(
        detail.message,
        "b: Cluster.connect_timeout: must be positive"
    );

    let status = client.status();
    assert_eq!(status.types[0].acked_version, "v1");
    assert_eq!(
        status.pushes[0].verdict,
        Verdict::Nack("b: Cluster.connect_timeout: must be positive".into())
    );
    assert_eq!(status.pushes[1].verdict, Verdict::Ack);
    client.stop();
}

#[tokio::test]
async fn duplicate_names_nack_the_whole_response() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    stream.send(response(
        LISTENER_TYPE_URL,
        "v1",
        "n1",
        vec![listener("a"), listener("b"), listener("a")],
    ));
    let nack = stream.recv().await;
    assert_eq!(nack.version_info, "");
    assert_eq!(nack.response_nonce, "n1");
    assert!(
        nack.error_detail
            .unwrap()
            .message
            .contains("duplicate resource name: a")
    );
    probe.expect_no_update().await;
    client.stop();
}

#[tokio::test]
async fn foreign_type_is_rejected_by_name_and_the_rest_delivered() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    stream.send(response(
        LISTENER_TYPE_URL,
        "v1",
        "n1",
        vec![listener("a"), cluster("c1")],
    ));
    let update = probe.update().await;
    assert_eq!(names(&update), ["a"]);
    let nack = stream.recv().await;
    let message = nack.error_detail.unwrap().message;
    assert!(message.starts_with("c1: type URL "), "{message}");
    assert_eq!(nack.version_info, "");
    client.stop();
}

#[tokio::test]
async fn full_state_types_remove_absent_names_named_types_do_not() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    client.subscribe(ENDPOINT_TYPE_URL, strings(&["x", "y"]));
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.type_url, CLUSTER_TYPE_URL);
    let eds = stream.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(eds.resource_names, ["x", "y"]);

    stream.send(response(
        CLUSTER_TYPE_URL,
        "1",
        "c1",
        vec![cluster("a"), cluster("b"), cluster("c")],
    ));
    assert!(probe.update().await.removed.is_empty());
    stream.recv().await;
    stream.send(response(
        CLUSTER_TYPE_URL,
        "2",
        "c2",
        vec![cluster("a"), cluster("c")],
    ));
    let update = probe.update().await;
    assert_eq!(names(&update), ["a", "c"]);
    assert_eq!(update.removed, ["b"]);
    stream.recv().await;
    stream.send(response(CLUSTER_TYPE_URL, "3", "c3", vec![]));
    let update = probe.update().await;
    assert!(update.resources.is_empty());
    assert_eq!(update.removed, ["a", "c"]);
    stream.recv().await;

    stream.send(response(
        ENDPOINT_TYPE_URL,
        "1",
        "e1",
        vec![endpoints("x"), endpoints("y")],
    ));
    probe.update().await;
    stream.recv().await;
    stream.send(response(ENDPOINT_TYPE_URL, "2", "e2", vec![endpoints("x")]));
    let update = probe.update().await;
    assert_eq!(names(&update), ["x"]);
    assert!(
        update.removed.is_empty(),
        "absence of a named resource is not removal"
    );
    client.stop();
}

#[tokio::test]
async fn wildcard_rules() {
    let (mut server, client, _recorder, _probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    // An empty set for a type never asked for sends nothing (empty would mean wildcard).
    client.subscribe(ROUTE_TYPE_URL, vec![]);
    let mut stream = server.sotw_stream().await;
    assert!(stream.recv().await.resource_names.is_empty());
    stream.expect_none().await;

    // Wildcard plus names: the explicit "*".
    client.subscribe(LISTENER_TYPE_URL, strings(&["extra"]));
    let request = stream.recv().await;
    assert_eq!(request.resource_names, ["*", "extra"]);
    // Names dropped: still wildcard, and now it must say so.
    client.subscribe(LISTENER_TYPE_URL, vec![]);
    assert_eq!(stream.recv().await.resource_names, ["*"]);

    // A named type: names, then the empty set unsubscribes (not a wildcard).
    client.subscribe(ROUTE_TYPE_URL, strings(&["r1"]));
    let request = stream.recv().await;
    assert_eq!(request.type_url, ROUTE_TYPE_URL);
    assert_eq!(request.resource_names, ["r1"]);
    client.subscribe(ROUTE_TYPE_URL, vec![]);
    let request = stream.recv().await;
    assert_eq!(request.type_url, ROUTE_TYPE_URL);
    assert!(request.resource_names.is_empty());
    client.stop();
}

#[tokio::test]
async fn names_are_sent_only_when_the_set_changes() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe(ROUTE_TYPE_URL, strings(&["b", "a"]));
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.resource_names, ["a", "b"]);
    stream.send(response(
        ROUTE_TYPE_URL,
        "v1",
        "n1",
        vec![route("a"), route("b")],
    ));
    probe.update().await;
    stream.recv().await;

    client.subscribe(ROUTE_TYPE_URL, strings(&["a", "b"]));
    stream.expect_none().await;
    client.subscribe(ROUTE_TYPE_URL, strings(&["a", "c"]));
    let request = stream.recv().await;
    assert_eq!(request.resource_names, ["a", "c"]);
    assert_eq!(request.version_info, "v1");
    assert_eq!(request.response_nonce, "n1");
    let status = client.status();
    assert_eq!(status.types[0].names, ["a", "c"]);
    assert!(status.types[0].pending);
    client.stop();
}

#[tokio::test]
async fn node_only_on_the_first_message_when_asked() {
    let mut server = Server::tcp().await;
    let mut config = config(server.transport.clone(), Mode::Sotw);
    config.set_node_on_first_message_only = true;
    let (client, _recorder, mut probe) = start(config);
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.node, Some(node()));
    assert_eq!(stream.recv().await.node, None);
    stream.send(response(LISTENER_TYPE_URL, "v1", "n1", vec![listener("a")]));
    probe.update().await;
    assert_eq!(stream.recv().await.node, None);
    // A new stream sends it again.
    stream.close();
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.node, Some(node()));
    assert_eq!(stream.recv().await.node, None);
    client.stop();
}

#[tokio::test]
async fn reconnect_resends_versions_and_names_without_touching_the_handler() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    client.subscribe(ROUTE_TYPE_URL, strings(&["r1", "r2"]));
    let mut stream = server.sotw_stream().await;
    assert_eq!(probe.event().await, Event::Connected);
    stream.recv().await;
    stream.recv().await;
    stream.send(response(LISTENER_TYPE_URL, "l7", "n1", vec![listener("a")]));
    probe.update().await;
    stream.recv().await;
    stream.send(response(
        ROUTE_TYPE_URL,
        "r3",
        "n2",
        vec![route("r1"), route("r2")],
    ));
    probe.update().await;
    stream.recv().await;

    stream.close();
    assert_eq!(probe.event().await, Event::Disconnected);
    let mut stream = server.sotw_stream().await;
    assert_eq!(probe.event().await, Event::Connected);
    let lds = stream.recv().await;
    assert_eq!(lds.type_url, LISTENER_TYPE_URL);
    assert_eq!(lds.version_info, "l7");
    assert_eq!(lds.response_nonce, "", "nonces belong to the old stream");
    assert!(lds.resource_names.is_empty());
    let rds = stream.recv().await;
    assert_eq!(rds.type_url, ROUTE_TYPE_URL);
    assert_eq!(rds.version_info, "r3");
    assert_eq!(rds.resource_names, ["r1", "r2"]);
    probe.expect_no_update().await;

    // The full-state memory survived the reconnect: an empty listener set removes "a".
    stream.send(response(LISTENER_TYPE_URL, "l8", "n3", vec![]));
    assert_eq!(probe.update().await.removed, ["a"]);
    assert_eq!(client.status().streams, 2);
    client.stop();
}

#[tokio::test]
async fn the_handler_may_subscribe_from_inside_apply() {
    let (mut server, client, recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    let inner = client.clone();
    recorder.react(Box::new(move |update| {
        if update.type_url == LISTENER_TYPE_URL {
            let routes = update
                .resources
                .iter()
                .map(|r| format!("{}-routes", r.name))
                .collect();
            inner.subscribe(ROUTE_TYPE_URL, routes);
        }
    }));
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    stream.send(response(LISTENER_TYPE_URL, "v1", "n1", vec![listener("a")]));
    probe.update().await;
    let ack = stream.recv().await;
    assert_eq!(ack.type_url, LISTENER_TYPE_URL);
    let rds = stream.recv().await;
    assert_eq!(rds.type_url, ROUTE_TYPE_URL);
    assert_eq!(rds.resource_names, ["a-routes"]);
    client.stop();
}

#[tokio::test]
async fn wrapped_resources_are_unwrapped() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe(ROUTE_TYPE_URL, strings(&["r1", "r2"]));
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    let wrapped = WrappedResource {
        name: "r1".into(),
        version: "7".into(),
        resource: Some(route("r1")),
        ..Default::default()
    };
    let any = Any {
        type_url: "type.googleapis.com/envoy.service.discovery.v3.Resource".into(),
        value: wrapped.encode_to_vec(),
    };
    stream.send(response(ROUTE_TYPE_URL, "v1", "n1", vec![any, route("r2")]));
    let update = probe.update().await;
    assert_eq!(names(&update), ["r1", "r2"]);
    assert_eq!(update.resources[0].version, "7");
    assert_eq!(update.resources[1].version, "v1");
    assert_eq!(update.resources[0].value, route("r1").value);
    assert_eq!(stream.recv().await.error_detail, None);
    client.stop();
}

#[tokio::test]
async fn responses_for_types_not_subscribed_are_ignored() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    stream.send(response(CLUSTER_TYPE_URL, "v1", "n1", vec![cluster("a")]));
    probe.expect_no_update().await;
    stream.expect_none().await;
    client.stop();
}

#[tokio::test]
async fn subscriptions_made_after_start_open_the_stream() {
    let (mut server, client, _recorder, mut probe) = serve_and_start(Mode::Sotw).await;
    // The engine connects and opens the call with nothing to send yet; the server answers
    // the call only after a first request (as grpc-go does).
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    client.subscribe_wildcard(CLUSTER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.type_url, CLUSTER_TYPE_URL);
    assert_eq!(probe.event().await, Event::Connected);
    client.stop();
}
