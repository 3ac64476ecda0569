//! A minimal HTTP/1.1 request reader for the admin port. pilot-agent sends stats filters
//! unescaped (`^ \ | ( ) $` in the request target), which strict parsers reject; this one
//! takes the target verbatim.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpStream;

/// One admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query parameters in order; a flag without `=` has an empty value.
    pub params: Vec<(String, String)>,
    /// Whether the client asked to keep the connection open.
    pub keep_alive: bool,
    /// Whether the request line said `HTTP/1.0` (or named no version).
    pub http10: bool,
}

impl AdminRequest {
    /// Parses a request line's target into path and parameters.
    pub fn from_target(method: &str, target: &str) -> Self {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        AdminRequest {
            method: method.to_owned(),
            path: percent_decode(path),
            params: parameters(query),
            keep_alive: true,
            http10: false,
        }
    }

    /// The value of a parameter, if present.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether a parameter is present (with or without a value).
    pub fn has(&self, name: &str) -> bool {
        self.params.iter().any(|(k, _)| k == name)
    }
}

/// `k=v&k2=v2` (a query, or a form body) as decoded pairs.
fn parameters(encoded: &str) -> Vec<(String, String)> {
    encoded
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Decodes `%XX` escapes (and nothing else: `+` stays `+`, as regexes need it).
pub fn percent_decode(s: &str) -> String {
    crate::route::matcher::percent_decode(s).into_owned()
}

/// Reads one request (line, headers, and any body: a form's values join the parameters, as
/// Envoy's admin takes them; another body is discarded).
pub async fn read(reader: &mut BufReader<TcpStream>) -> Option<AdminRequest> {
    let mut line = String::new();
    if reader.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, target, version) = (
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or("HTTP/1.0"),
    );
    let mut req = AdminRequest::from_target(method, target);
    req.keep_alive = version == "HTTP/1.1";
    req.http10 = version == "HTTP/1.0";
    let mut content_length = 0usize;
    let mut form = false;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).await.ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("content-type") {
                form = value
                    .to_ascii_lowercase()
                    .starts_with("application/x-www-form-urlencoded");
            } else if name.eq_ignore_ascii_case("connection") {
                req.keep_alive = !value.eq_ignore_ascii_case("close");
            }
        }
    }
    if content_length > 0 {
        let mut body = vec![0u8; content_length.min(1 << 20)];
        reader.read_exact(&mut body).await.ok()?;
        if form {
            req.params
                .extend(parameters(String::from_utf8_lossy(&body).trim_end()));
        }
    }
    Some(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_regex_targets_and_flags() {
        let r = AdminRequest::from_target(
            "GET",
            "/stats?usedonly&filter=^(cluster_manager\\.cds|listener_manager\\.lds)\\.(update_success|update_rejected)$",
        );
        assert_eq!(r.path, "/stats");
        assert!(r.has("usedonly"));
        assert_eq!(r.param("usedonly"), Some(""));
        assert_eq!(
            r.param("filter"),
            Some(
                "^(cluster_manager\\.cds|listener_manager\\.lds)\\.(update_success|update_rejected)$"
            )
        );
        let r = AdminRequest::from_target("GET", "/stats?filter=%5Eserver%5C.state");
        assert_eq!(r.param("filter"), Some("^server\\.state"));
    }
}
