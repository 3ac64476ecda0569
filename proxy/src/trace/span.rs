//! A span as revoy records it before a tracer encodes it: ids, name, kind, times and Envoy's
//! tags, in the order they were set (a tag set twice keeps its first place, as in Envoy).

use std::time::SystemTime;

/// Whether the span serves a request or makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An ingress request's span.
    Server,
    /// An egress request's span, or the upstream request's child span.
    Client,
}

/// One finished or running span.
#[derive(Debug, Clone)]
pub struct Span {
    /// The trace: 128 bits (`high` is 0 for a 64-bit Zipkin trace).
    pub trace_id: u128,
    /// Whether the trace id is 128 bits wide (Zipkin writes 16 or 32 hex digits).
    pub trace_id_128: bool,
    /// This span.
    pub span_id: u64,
    /// Its parent, if any.
    pub parent_id: Option<u64>,
    /// Whether the parent came from another process (OpenTelemetry's flags).
    pub parent_remote: bool,
    /// The operation name.
    pub name: String,
    /// Server or client.
    pub kind: Kind,
    /// Started.
    pub start: SystemTime,
    /// Finished (the start until then).
    pub end: SystemTime,
    /// Tags in the order first set.
    pub tags: Vec<(String, String)>,
    /// Whether the span is reported.
    pub sampled: bool,
    /// W3C `tracestate` carried along.
    pub tracestate: String,
    /// Zipkin: the span id is shared with the client's span (`shared_span_context`).
    pub shared: bool,
}

impl Span {
    /// A span starting now.
    pub fn new(name: String, kind: Kind, trace_id: u128, span_id: u64) -> Span {
        let now = SystemTime::now();
        Span {
            trace_id,
            trace_id_128: true,
            span_id,
            parent_id: None,
            parent_remote: false,
            name,
            kind,
            start: now,
            end: now,
            tags: Vec::new(),
            sampled: true,
            tracestate: String::new(),
            shared: false,
        }
    }

    /// Sets `key` to `value`, in place when it is set already.
    pub fn set_tag(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.tags.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.tags.push((key.to_owned(), value)),
        }
    }

    /// The value of tag `key`.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A child of this span: same trace and sampling, a fresh id, this span as parent.
    pub fn child(&self, name: String, kind: Kind) -> Span {
        let mut c = Span::new(name, kind, self.trace_id, new_id());
        c.trace_id_128 = self.trace_id_128;
        c.parent_id = Some(self.span_id);
        c.sampled = self.sampled;
        c.tracestate = self.tracestate.clone();
        c
    }
}

/// A fresh, non-zero 64-bit id.
pub fn new_id() -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_set_twice_keeps_its_place() {
        let mut s = Span::new("x".into(), Kind::Server, 1, 2);
        s.set_tag("a", "1");
        s.set_tag("b", "2");
        s.set_tag("a", "3");
        assert_eq!(s.tags, [("a".into(), "3".into()), ("b".into(), "2".into())]);
        let c = s.child("y".into(), Kind::Client);
        assert_eq!((c.trace_id, c.parent_id), (1, Some(2)));
        assert_ne!(c.span_id, 2);
    }
}
