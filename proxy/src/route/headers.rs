//! Header mutations (`request_headers_to_add/remove`, `response_headers_to_add/remove`) with
//! Envoy's `append_action`, `keep_empty_value` and substitution formatters.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::format::{Direction, FormatContext, Template};

/// What to do when the header already exists (`HeaderValueOption.append_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum AppendAction {
    /// Add another value, or add the header.
    AppendIfExistsOrAdd,
    /// Add only when absent.
    AddIfAbsent,
    /// Replace all values, or add the header.
    OverwriteIfExistsOrAdd,
    /// Replace all values only when present.
    OverwriteIfExists,
}

/// One `HeaderValueOption`, compiled.
#[derive(Debug, Clone)]
pub struct HeaderAdd {
    /// Header name.
    pub name: HeaderName,
    /// Value template.
    pub value: Template,
    /// Behaviour when the header exists.
    pub action: AppendAction,
    /// Whether an empty result is still added.
    pub keep_empty_value: bool,
}

impl HeaderAdd {
    /// The literal value when the template has no formatter.
    pub fn literal(&self) -> Option<&str> {
        self.value.literal()
    }
}

/// The header mutations of one level (route config, virtual host, route or weighted cluster),
/// for one direction.
#[derive(Debug, Clone, Default)]
pub struct HeaderMutations {
    /// Headers removed first.
    pub remove: Box<[HeaderName]>,
    /// Headers added afterwards, in order.
    pub add: Box<[HeaderAdd]>,
}

impl HeaderMutations {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.add.is_empty()
    }

    /// Applies removals, then additions, to request headers (`REQ` reads `headers`).
    pub fn apply_request(&self, headers: &mut HeaderMap, ctx: &FormatContext<'_>) {
        self.apply(headers, ctx, Direction::Request);
    }

    /// Applies removals, then additions, to response headers (`RESP` reads `headers`, `REQ`
    /// the context's request headers).
    pub fn apply_response(&self, headers: &mut HeaderMap, ctx: &FormatContext<'_>) {
        self.apply(headers, ctx, Direction::Response);
    }

    /// Like Envoy, every value is rendered against the headers as they are after the
    /// removals and before any addition of this level.
    fn apply(&self, headers: &mut HeaderMap, ctx: &FormatContext<'_>, dir: Direction) {
        if self.is_empty() {
            return;
        }
        for name in &self.remove {
            headers.remove(name);
        }
        let values: Vec<String> = self
            .add
            .iter()
            .map(|add| add.value.render(headers, ctx, dir))
            .collect();
        for (add, value) in self.add.iter().zip(values) {
            if value.is_empty() && !add.keep_empty_value {
                continue;
            }
            let Ok(value) = HeaderValue::try_from(value) else {
                continue;
            };
            let exists = headers.contains_key(&add.name);
            match add.action {
                AppendAction::AppendIfExistsOrAdd => {
                    headers.append(add.name.clone(), value);
                }
                AppendAction::AddIfAbsent if !exists => {
                    headers.insert(add.name.clone(), value);
                }
                AppendAction::OverwriteIfExistsOrAdd => {
                    headers.insert(add.name.clone(), value);
                }
                AppendAction::OverwriteIfExists if exists => {
                    headers.insert(add.name.clone(), value);
                }
                AppendAction::AddIfAbsent | AppendAction::OverwriteIfExists => {}
            }
        }
    }
}

/// Request and response mutations of one level.
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    /// Applied to the request sent upstream.
    pub request: HeaderMutations,
    /// Applied to the response sent downstream.
    pub response: HeaderMutations,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Context, FakeIo};

    fn add(name: &str, value: &str, action: AppendAction, keep: bool) -> HeaderAdd {
        HeaderAdd {
            name: HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value: Template::parse(value, &Context::new(&FakeIo::new())).unwrap(),
            action,
            keep_empty_value: keep,
        }
    }

    #[test]
    fn append_actions() {
        let mut h = HeaderMap::new();
        h.insert("a", HeaderValue::from_static("1"));
        h.insert("b", HeaderValue::from_static("1"));
        let m = HeaderMutations {
            remove: Box::new([]),
            add: Box::new([
                add("a", "2", AppendAction::AppendIfExistsOrAdd, false),
                add("b", "2", AppendAction::AddIfAbsent, false),
                add("c", "3", AppendAction::AddIfAbsent, false),
                add("b", "4", AppendAction::OverwriteIfExistsOrAdd, false),
                add("d", "4", AppendAction::OverwriteIfExists, false),
                add("e", "", AppendAction::AppendIfExistsOrAdd, false),
                add("f", "", AppendAction::AppendIfExistsOrAdd, true),
            ]),
        };
        m.apply_request(&mut h, &FormatContext::default());
        let all = |n: &str| {
            h.get_all(n)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(all("a"), ["1", "2"]);
        assert_eq!(all("b"), ["4"]);
        assert_eq!(all("c"), ["3"]);
        assert!(all("d").is_empty());
        assert!(all("e").is_empty());
        assert_eq!(all("f"), [""]);
    }

    #[test]
    fn values_see_the_headers_before_this_levels_additions() {
        let mut h = HeaderMap::new();
        h.insert("x-id", HeaderValue::from_static("abc"));
        h.insert("x-gone", HeaderValue::from_static("old"));
        let m = HeaderMutations {
            remove: Box::new([HeaderName::from_static("x-gone")]),
            add: Box::new([
                add("x-id", "new", AppendAction::OverwriteIfExistsOrAdd, false),
                add(
                    "x-copy",
                    "%REQ(x-id)%",
                    AppendAction::AppendIfExistsOrAdd,
                    false,
                ),
                add(
                    "x-gone-copy",
                    "%REQ(x-gone)%",
                    AppendAction::AppendIfExistsOrAdd,
                    true,
                ),
            ]),
        };
        m.apply_request(&mut h, &FormatContext::default());
        assert_eq!(h["x-id"], "new");
        assert_eq!(h["x-copy"], "abc");
        assert_eq!(h["x-gone-copy"], "");
    }

    #[test]
    fn response_side_reads_resp_from_the_response_and_req_from_the_context() {
        let mut req = HeaderMap::new();
        req.insert("x-id", HeaderValue::from_static("abc"));
        let mut resp = HeaderMap::new();
        resp.insert("content-type", HeaderValue::from_static("text/plain"));
        let m = HeaderMutations {
            remove: Box::new([]),
            add: Box::new([add(
                "x-v",
                "%REQ(x-id)% %RESP(content-type)% %RESPONSE_CODE%",
                AppendAction::OverwriteIfExistsOrAdd,
                false,
            )]),
        };
        let ctx = FormatContext {
            request_headers: Some(&req),
            response_code: Some(503),
            ..Default::default()
        };
        m.apply_response(&mut resp, &ctx);
        assert_eq!(resp["x-v"], "abc text/plain 503");
        let mut upstream = req.clone();
        m.apply_request(&mut upstream, &FormatContext::default());
        assert_eq!(upstream["x-v"], "abc  0");
    }
}
