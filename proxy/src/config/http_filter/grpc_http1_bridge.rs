//! `envoy.filters.http.grpc_http1_bridge` (`Config`): checked, nothing to keep.

use proto::pb::envoy::extensions::filters::http::grpc_http1_bridge::v3::Config;

use crate::config::ConfigError;

/// Checks a `Config`: revoy bridges HTTP/1.1 gRPC requests as they are, and refuses the options
/// that change the request (the protobuf upgrade, the path without its query).
pub fn compile(c: &Config) -> Result<(), ConfigError> {
    if c.upgrade_protobuf_to_grpc {
        return Err(ConfigError::new(
            "upgrade_protobuf_to_grpc",
            "not supported by revoy (requests are bridged as they come, not upgraded)",
        ));
    }
    if c.ignore_query_parameters {
        return Err(ConfigError::new(
            "ignore_query_parameters",
            "not supported by revoy (its filters cannot rewrite the path)",
        ));
    }
    Ok(())
}
