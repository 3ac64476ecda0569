//! The few OTLP trace messages revoy sends (`opentelemetry.proto.collector.trace.v1` and
//! `opentelemetry.proto.trace.v1`), defined by hand with the OTLP spec's field numbers;
//! envoy-types carries only `opentelemetry.proto.common.v1`, reused here.

pub use proto::pb::opentelemetry::proto::common::v1::{
    AnyValue, InstrumentationScope, KeyValue, any_value,
};

/// The gRPC method a collector serves.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// `ExportTraceServiceRequest`: one export call.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceRequest {
    /// The spans, grouped by the resource that produced them.
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ExportTraceServiceResponse`: a collector's answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceResponse {
    /// Set when the collector rejected some spans.
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

/// `ExportTracePartialSuccess`: how many spans a collector rejected, and why.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTracePartialSuccess {
    /// Spans rejected.
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    /// Why.
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `ResourceSpans`: the spans of one resource (the proxy).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceSpans {
    /// The proxy (its `service.name` and SDK attributes).
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// The spans, by instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
    /// The resource's schema.
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `opentelemetry.proto.resource.v1.Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    /// The resource's attributes.
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    /// Attributes left out.
    #[prost(uint32, tag = "2")]
    pub dropped_attributes_count: u32,
}

/// `ScopeSpans`: the spans of one instrumentation scope.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeSpans {
    /// The scope.
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// Its spans.
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
    /// The scope's schema.
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Span {
    /// 16 bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    /// 8 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    /// W3C `tracestate`.
    #[prost(string, tag = "3")]
    pub trace_state: String,
    /// 8 bytes, empty for a root span.
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    /// The operation name.
    #[prost(string, tag = "5")]
    pub name: String,
    /// [`SpanKind`].
    #[prost(enumeration = "SpanKind", tag = "6")]
    pub kind: i32,
    /// Start, ns since the Unix epoch.
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    /// End, ns since the Unix epoch.
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    /// Tags.
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    /// Tags left out.
    #[prost(uint32, tag = "10")]
    pub dropped_attributes_count: u32,
    /// Timed events (verbose logs).
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
    /// Events left out.
    #[prost(uint32, tag = "12")]
    pub dropped_events_count: u32,
    /// The span's status.
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    /// W3C trace flags.
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

/// `Span.Event`: a timed annotation.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// When, ns since the Unix epoch.
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    /// What happened.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Its attributes.
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<KeyValue>,
}

/// `Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// A description.
    #[prost(string, tag = "2")]
    pub message: String,
    /// [`StatusCode`].
    #[prost(enumeration = "StatusCode", tag = "3")]
    pub code: i32,
}

/// `Span.SpanKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum SpanKind {
    /// Not said.
    Unspecified = 0,
    /// Inside the process.
    Internal = 1,
    /// Serving a request (ingress).
    Server = 2,
    /// Making a request (egress, the upstream span).
    Client = 3,
    /// Sending a message.
    Producer = 4,
    /// Receiving a message.
    Consumer = 5,
}

/// `Status.StatusCode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StatusCode {
    /// Not set.
    Unset = 0,
    /// Ok.
    Ok = 1,
    /// Failed.
    Error = 2,
}

/// A string attribute.
pub fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}
