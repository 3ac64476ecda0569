//! `envoy.filters.http.buffer` (`Buffer`, route-level `BufferPerRoute`) -> [`BufferConfig`].

use proto::pb::envoy::extensions::filters::http::buffer::v3::{
    Buffer, BufferPerRoute, buffer_per_route::Override,
};

use crate::config::ConfigError;

/// How much of a request body the filter holds before the request goes on.
#[derive(Debug, Clone, Copy)]
pub struct BufferConfig {
    /// `max_request_bytes`: a larger body is refused (413).
    pub max_request_bytes: u32,
}

/// What a route says about the buffer filter.
#[derive(Debug, Clone, Copy)]
pub enum BufferPerRouteConfig {
    /// `disabled: true`: requests on the route are not buffered.
    Disabled,
    /// `buffer`: replaces the filter's limit on the route.
    Buffer(BufferConfig),
}

/// Compiles a `Buffer`.
pub fn compile(b: &Buffer) -> Result<BufferConfig, ConfigError> {
    match b.max_request_bytes {
        Some(v) if v.value > 0 => Ok(BufferConfig {
            max_request_bytes: v.value,
        }),
        Some(_) => Err(ConfigError::new(
            "max_request_bytes",
            "value must be greater than 0",
        )),
        None => Err(ConfigError::new("max_request_bytes", "value is required")),
    }
}

/// Compiles a `BufferPerRoute`.
pub fn compile_per_route(b: &BufferPerRoute) -> Result<BufferPerRouteConfig, ConfigError> {
    match &b.r#override {
        Some(Override::Disabled(true)) => Ok(BufferPerRouteConfig::Disabled),
        Some(Override::Disabled(false)) => {
            Err(ConfigError::new("disabled", "value must equal true"))
        }
        Some(Override::Buffer(b)) => compile(b)
            .map(BufferPerRouteConfig::Buffer)
            .map_err(|e| e.within("buffer")),
        None => Err(ConfigError::new(
            "override",
            "one of disabled, buffer is required",
        )),
    }
}
