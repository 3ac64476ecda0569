//! ADS client for xDS v3. Holds only the type URLs so far; the streaming client arrives with
//! the xDS issue.

/// Type URL of `envoy.config.listener.v3.Listener` resources (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of `envoy.config.cluster.v3.Cluster` resources (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of `envoy.config.route.v3.RouteConfiguration` resources (RDS).
pub const ROUTE_TYPE_URL: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// Type URL of `envoy.config.endpoint.v3.ClusterLoadAssignment` resources (EDS).
pub const ENDPOINT_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
