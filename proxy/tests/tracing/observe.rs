//! What a run observed, as text lines that compare across proxies: spans with their ids
//! replaced by labels in order of appearance (ids the test sent itself kept verbatim), times
//! dropped, and `x-request-id`s reduced to their trace nibble.

use std::collections::HashMap;

use revoy::trace::otlp::{ExportTraceServiceRequest, KeyValue, any_value};

/// The custom tags the tests configure.
const CUSTOM_TAGS: [&str; 2] = ["hdr", "lit"];

/// Gives ids stable names: the n-th distinct id seen is `<prefix><n>`.
#[derive(Default)]
pub struct Labels {
    seen: HashMap<String, String>,
    /// Ids that stay as they are (sent by the test).
    pub keep: Vec<String>,
}

impl Labels {
    /// The label of `id` (hex), `-` for none.
    pub fn of(&mut self, prefix: &str, id: &str) -> String {
        if id.is_empty() || id.chars().all(|c| c == '0') {
            return "-".into();
        }
        if self.keep.iter().any(|k| k == id) {
            return id.to_owned();
        }
        let n = self.seen.len();
        self.seen
            .entry(id.to_owned())
            .or_insert_with(|| format!("{prefix}{n}"))
            .clone()
    }
}

/// Hex of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// An `x-request-id` reduced to what is not random: a UUID's trace nibble, else the value.
pub fn request_id(v: &str) -> String {
    if v.len() == 36 && v.as_bytes()[8] == b'-' {
        format!("uuid[{}]", &v[14..15])
    } else {
        v.to_owned()
    }
}

fn value(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => format!("int:{i}"),
        other => format!("{other:?}"),
    }
}

fn attribute(kv: &KeyValue) -> String {
    let v = value(kv);
    let v = match kv.key.as_str() {
        "guid:x-request-id" => request_id(&v),
        "upstream_address" | "peer.address" => v.split(':').next().unwrap_or("").to_owned(),
        _ => v,
    };
    format!("{}={v}", kv.key)
}

/// One line per span (resource and scope first, once per export), in the order exported.
pub fn otel_lines(exports: &[ExportTraceServiceRequest], labels: &mut Labels) -> Vec<String> {
    let mut out = Vec::new();
    for e in exports {
        for rs in &e.resource_spans {
            // Envoy lists these in hash order; the SDK version names the build.
            let mut resource: Vec<String> = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .map(|kv| match kv.key.as_str() {
                    "telemetry.sdk.version" => "telemetry.sdk.version=<build>".to_owned(),
                    _ => attribute(kv),
                })
                .collect();
            resource.sort();
            out.push(format!(
                "resource {} schema={:?}",
                resource.join(" "),
                rs.schema_url
            ));
            for ss in &rs.scope_spans {
                if let Some(s) = &ss.scope {
                    out.push(format!(
                        "scope {:?} version={}",
                        s.name,
                        !s.version.is_empty()
                    ));
                }
                for s in &ss.spans {
                    let trace = labels.of("T", &hex(&s.trace_id));
                    let id = labels.of("S", &hex(&s.span_id));
                    let parent = labels.of("S", &hex(&s.parent_span_id));
                    // Envoy keeps custom tags in a hash map: their order varies by process.
                    let (custom, mut attrs): (Vec<&KeyValue>, Vec<&KeyValue>) = s
                        .attributes
                        .iter()
                        .partition(|kv| CUSTOM_TAGS.contains(&kv.key.as_str()));
                    let mut custom: Vec<&KeyValue> = custom;
                    custom.sort_by(|a, b| a.key.cmp(&b.key));
                    attrs.extend(custom);
                    let attrs: Vec<String> = attrs.into_iter().map(attribute).collect();
                    let status = s.status.as_ref().map(|s| (s.code, s.message.clone()));
                    out.push(format!(
                        "span {:?} kind={} trace={trace} id={id} parent={parent} state={:?} flags={:#x} status={status:?} events={} attrs: {}",
                        s.name,
                        s.kind,
                        s.trace_state,
                        s.flags,
                        s.events.len(),
                        attrs.join(" ")
                    ));
                }
            }
        }
    }
    out
}

/// A `traceparent`'s ids as labels.
pub fn traceparent(v: &str, labels: &mut Labels) -> String {
    let parts: Vec<&str> = v.split('-').collect();
    if parts.len() != 4 {
        return format!("malformed {v}");
    }
    format!(
        "{}-{}-{}-{}",
        parts[0],
        labels.of("T", parts[1]),
        labels.of("S", parts[2]),
        parts[3]
    )
}
