//! Distributed tracing as Envoy does it: the sampling decision (carried in `x-request-id`),
//! spans with Envoy's names and tags, trace context propagation (W3C for OpenTelemetry, B3
//! for Zipkin), and exporters that batch spans off the request path.

pub mod otlp;
