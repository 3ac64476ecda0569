//! Header mutations (`request_headers_to_add/remove`, `response_headers_to_add/remove`) with
//! Envoy's `append_action`, `keep_empty_value` and a subset of its substitution formatters.

use std::net::SocketAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

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

/// One piece of a header value template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text.
    Text(String),
    /// `%DOWNSTREAM_REMOTE_ADDRESS%`.
    DownstreamRemoteAddress,
    /// `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`.
    DownstreamRemoteAddressWithoutPort,
    /// `%DOWNSTREAM_LOCAL_ADDRESS%`.
    DownstreamLocalAddress,
    /// `%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%`.
    DownstreamLocalAddressWithoutPort,
    /// `%DOWNSTREAM_LOCAL_PORT%`.
    DownstreamLocalPort,
    /// `%DOWNSTREAM_REMOTE_PORT%`.
    DownstreamRemotePort,
    /// `%REQ(name)%`: a request header's value.
    RequestHeader(HeaderName),
    /// `%HOSTNAME%`.
    Hostname,
    /// `%PROTOCOL%`: `HTTP/1.1`, `HTTP/2`.
    Protocol,
    /// `%UPSTREAM_CLUSTER%`.
    UpstreamCluster,
    /// `%UPSTREAM_REMOTE_ADDRESS%`.
    UpstreamRemoteAddress,
}

/// The formatters supported in header values; anything else is a configuration error.
pub const SUPPORTED_FORMATTERS: &[&str] = &[
    "DOWNSTREAM_REMOTE_ADDRESS",
    "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT",
    "DOWNSTREAM_LOCAL_ADDRESS",
    "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT",
    "DOWNSTREAM_LOCAL_PORT",
    "DOWNSTREAM_REMOTE_PORT",
    "REQ(name)",
    "HOSTNAME",
    "PROTOCOL",
    "UPSTREAM_CLUSTER",
    "UPSTREAM_REMOTE_ADDRESS",
];

/// Parses a header value template. `%%` is a literal `%`.
pub fn parse_template(value: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('%') {
        text.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        if let Some(r) = rest.strip_prefix('%') {
            text.push('%');
            rest = r;
            continue;
        }
        let end = rest.find('%').ok_or_else(|| {
            format!("Invalid header configuration. Un-terminated variable expression '{value}'")
        })?;
        let command = &rest[..end];
        rest = &rest[end + 1..];
        let piece = parse_command(command).ok_or_else(|| {
            format!("Invalid header configuration. Not supported field in StreamInfo: {command}")
        })?;
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(piece);
    }
    text.push_str(rest);
    if !text.is_empty() || pieces.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

fn parse_command(command: &str) -> Option<Piece> {
    Some(match command {
        "DOWNSTREAM_REMOTE_ADDRESS" => Piece::DownstreamRemoteAddress,
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Piece::DownstreamRemoteAddressWithoutPort,
        "DOWNSTREAM_LOCAL_ADDRESS" => Piece::DownstreamLocalAddress,
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Piece::DownstreamLocalAddressWithoutPort,
        "DOWNSTREAM_LOCAL_PORT" => Piece::DownstreamLocalPort,
        "DOWNSTREAM_REMOTE_PORT" => Piece::DownstreamRemotePort,
        "HOSTNAME" => Piece::Hostname,
        "PROTOCOL" => Piece::Protocol,
        "UPSTREAM_CLUSTER" => Piece::UpstreamCluster,
        "UPSTREAM_REMOTE_ADDRESS" => Piece::UpstreamRemoteAddress,
        other => {
            let name = other.strip_prefix("REQ(")?.strip_suffix(')')?;
            let name = name.split(')').next()?;
            let name = name.split('?').next()?;
            Piece::RequestHeader(HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).ok()?)
        }
    })
}

/// Connection and stream facts that formatters may substitute. Unknown facts render empty.
#[derive(Debug, Clone, Default)]
pub struct FormatContext<'a> {
    /// Downstream peer address.
    pub downstream_remote: Option<SocketAddr>,
    /// Local address the downstream connection arrived on.
    pub downstream_local: Option<SocketAddr>,
    /// Request headers (for `%REQ()%`); when formatting request headers, the headers being
    /// mutated are used instead.
    pub request_headers: Option<&'a HeaderMap>,
    /// `HTTP/1.1`, `HTTP/2`...
    pub protocol: Option<&'a str>,
    /// Host name of this machine.
    pub hostname: Option<&'a str>,
    /// The chosen upstream cluster.
    pub upstream_cluster: Option<&'a str>,
    /// The upstream host's address.
    pub upstream_remote: Option<SocketAddr>,
}

/// One `HeaderValueOption`, compiled.
#[derive(Debug, Clone)]
pub struct HeaderAdd {
    /// Header name.
    pub name: HeaderName,
    /// Value template.
    pub value: Vec<Piece>,
    /// Behaviour when the header exists.
    pub action: AppendAction,
    /// Whether an empty result is still added.
    pub keep_empty_value: bool,
}

impl HeaderAdd {
    fn render(&self, own: &HeaderMap, ctx: &FormatContext<'_>) -> String {
        let mut out = String::new();
        for piece in &self.value {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::DownstreamRemoteAddress => push_addr(&mut out, ctx.downstream_remote, true),
                Piece::DownstreamRemoteAddressWithoutPort => {
                    push_addr(&mut out, ctx.downstream_remote, false)
                }
                Piece::DownstreamLocalAddress => push_addr(&mut out, ctx.downstream_local, true),
                Piece::DownstreamLocalAddressWithoutPort => {
                    push_addr(&mut out, ctx.downstream_local, false)
                }
                Piece::DownstreamLocalPort => {
                    if let Some(a) = ctx.downstream_local {
                        out.push_str(&a.port().to_string());
                    }
                }
                Piece::DownstreamRemotePort => {
                    if let Some(a) = ctx.downstream_remote {
                        out.push_str(&a.port().to_string());
                    }
                }
                Piece::RequestHeader(name) => {
                    let headers = ctx.request_headers.unwrap_or(own);
                    if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                        out.push_str(v);
                    }
                }
                Piece::Hostname => out.push_str(ctx.hostname.unwrap_or("")),
                Piece::Protocol => out.push_str(ctx.protocol.unwrap_or("")),
                Piece::UpstreamCluster => out.push_str(ctx.upstream_cluster.unwrap_or("")),
                Piece::UpstreamRemoteAddress => push_addr(&mut out, ctx.upstream_remote, true),
            }
        }
        out
    }

    /// The literal value when the template has no formatter.
    pub fn literal(&self) -> Option<&str> {
        match self.value.as_slice() {
            [Piece::Text(t)] => Some(t),
            _ => None,
        }
    }
}

fn push_addr(out: &mut String, addr: Option<SocketAddr>, with_port: bool) {
    if let Some(a) = addr {
        if with_port {
            out.push_str(&a.to_string());
        } else {
            out.push_str(&a.ip().to_string());
        }
    }
}

/// The header mutations of one level (route config, virtual host, route or weighted cluster),
/// for one direction.
#[derive(Debug, Clone, Default)]
pub struct HeaderMutations {
    /// Headers removed first.
    pub remove: Vec<HeaderName>,
    /// Headers added afterwards, in order.
    pub add: Vec<HeaderAdd>,
}

impl HeaderMutations {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.add.is_empty()
    }

    /// Applies removals, then additions, to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap, ctx: &FormatContext<'_>) {
        for name in &self.remove {
            headers.remove(name);
        }
        for add in &self.add {
            let value = add.render(headers, ctx);
            if value.is_empty() && !add.keep_empty_value {
                continue;
            }
            let Ok(value) = HeaderValue::from_str(&value) else {
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

    fn add(name: &str, value: &str, action: AppendAction, keep: bool) -> HeaderAdd {
        HeaderAdd {
            name: HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value: parse_template(value).unwrap(),
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
            remove: vec![],
            add: vec![
                add("a", "2", AppendAction::AppendIfExistsOrAdd, false),
                add("b", "2", AppendAction::AddIfAbsent, false),
                add("c", "3", AppendAction::AddIfAbsent, false),
                add("b", "4", AppendAction::OverwriteIfExistsOrAdd, false),
                add("d", "4", AppendAction::OverwriteIfExists, false),
                add("e", "", AppendAction::AppendIfExistsOrAdd, false),
                add("f", "", AppendAction::AppendIfExistsOrAdd, true),
            ],
        };
        m.apply(&mut h, &FormatContext::default());
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
    fn formatters() {
        let mut h = HeaderMap::new();
        h.insert("x-id", HeaderValue::from_static("abc"));
        let m = HeaderMutations {
            remove: vec![],
            add: vec![add(
                "x-v",
                "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% %REQ(X-ID)% 100%%",
                AppendAction::OverwriteIfExistsOrAdd,
                false,
            )],
        };
        let ctx = FormatContext {
            downstream_remote: Some("10.0.0.1:5555".parse().unwrap()),
            ..Default::default()
        };
        m.apply(&mut h, &ctx);
        assert_eq!(h["x-v"], "10.0.0.1 abc 100%");
        assert!(parse_template("%NOPE%").unwrap_err().contains("NOPE"));
        assert!(parse_template("%DOWNSTREAM").is_err());
    }
}
