//! The HTTP inspector's decision on a connection's first bytes, as Envoy's
//! `envoy.filters.listener.http_inspector` makes it: the HTTP/2 connection preface means
//! `h2c`; otherwise the whole request line is awaited and judged as Envoy's HTTP/1 parser
//! judges it (method, target, version), `HTTP/1.1` meaning `http/1.1` and any other valid
//! version (or none, HTTP/0.9) `http/1.0`.

/// The HTTP/2 client connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the HTTP inspector makes of the bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HttpVerdict {
    /// A prefix of the preface, or a request line not yet ended.
    NeedMore,
    /// The application protocol found: `h2c`, `http/1.1` or `http/1.0`.
    Found(&'static str),
    /// Not HTTP: an empty or malformed request line.
    NotHttp,
}

/// Envoy's rule for the bytes `d` (never empty).
pub(super) fn http_verdict(d: &[u8]) -> HttpVerdict {
    let n = d.len().min(H2_PREFACE.len());
    if d[..n] == H2_PREFACE[..n] {
        return if n < H2_PREFACE.len() {
            HttpVerdict::NeedMore
        } else {
            HttpVerdict::Found("h2c")
        };
    }
    if matches!(d.first(), Some(b'\r' | b'\n')) {
        return HttpVerdict::NotHttp;
    }
    let Some(end) = d.iter().position(|&b| b == b'\n') else {
        return HttpVerdict::NeedMore;
    };
    let line = d[..end].strip_suffix(b"\r").unwrap_or(&d[..end]);
    let mut parts = line
        .split(|b| *b == b' ' || *b == b'\t')
        .filter(|p| !p.is_empty());
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let valid = method.is_some_and(is_token)
        && target.is_some_and(|t| target_is_valid(t, method == Some(b"CONNECT")))
        && version.is_none_or(version_is_valid)
        && parts.next().is_none();
    match (valid, version) {
        (false, _) => HttpVerdict::NotHttp,
        (true, Some(b"HTTP/1.1")) => HttpVerdict::Found("http/1.1"),
        (true, _) => HttpVerdict::Found("http/1.0"),
    }
}

/// A method: RFC 9110 token characters only.
fn is_token(s: &[u8]) -> bool {
    s.iter()
        .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(c))
}

/// A request target as Envoy's parser accepts it: a path (or `*`), an absolute URI with a
/// scheme, or (for CONNECT) an authority.
fn target_is_valid(t: &[u8], connect: bool) -> bool {
    let path_char = |c: &u8| *c == 9 || *c == 12 || (b'!'..=126).contains(c);
    if let Some(rest) = t.strip_prefix(b"/").or_else(|| t.strip_prefix(b"*")) {
        return rest.iter().all(path_char);
    }
    let mut rest = t;
    if !connect {
        if !rest.first().is_some_and(u8::is_ascii_alphabetic) {
            return false;
        }
        let scheme = rest
            .iter()
            .position(|c| !(c.is_ascii_alphanumeric() || b"+-.".contains(c)))
            .unwrap_or(rest.len());
        let Some(after) = rest[scheme..].strip_prefix(b"://") else {
            return false;
        };
        rest = after;
    }
    let split = rest
        .iter()
        .position(|c| *c == b'/' || *c == b'?')
        .unwrap_or(rest.len());
    let (host, path) = rest.split_at(split);
    host.iter()
        .all(|c| c.is_ascii_alphanumeric() || b"!$%&'()*+,-.:;=@[]_~".contains(c))
        && !host.windows(2).any(|w| w == b"@@")
        && path.iter().all(path_char)
}

/// `HTTP/<digit>.<digit>`.
fn version_is_valid(v: &[u8]) -> bool {
    matches!(v, [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
        if major.is_ascii_digit() && minor.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::HttpVerdict::{Found, NeedMore, NotHttp};
    use super::*;

    #[test]
    fn waits_for_the_whole_request_line_or_preface() {
        assert_eq!(http_verdict(b"GET / HT"), NeedMore);
        assert_eq!(http_verdict(b"PRI * HTTP/2.0\r\n"), NeedMore);
        assert_eq!(http_verdict(H2_PREFACE), Found("h2c"));
        assert_eq!(http_verdict(b"GET / HTTP/1.1\r\n"), Found("http/1.1"));
        assert_eq!(http_verdict(b"GET / HTTP/1.1\n"), Found("http/1.1"));
    }

    #[test]
    fn names_http_1_0_for_every_other_valid_version() {
        assert_eq!(http_verdict(b"GET / HTTP/1.0\r\n"), Found("http/1.0"));
        assert_eq!(http_verdict(b"GET / HTTP/2.0\r\n"), Found("http/1.0"));
        assert_eq!(http_verdict(b"GET /\r\n"), Found("http/1.0"));
        assert_eq!(
            http_verdict(b"GET  http://a.example/x  HTTP/1.1 \r\n"),
            Found("http/1.1")
        );
        assert_eq!(
            http_verdict(b"CONNECT a.example:443 HTTP/1.1\r\n"),
            Found("http/1.1")
        );
    }

    #[test]
    fn refuses_what_envoys_parser_refuses() {
        assert_eq!(http_verdict(b"\r\nGET / HTTP/1.1\r\n"), NotHttp);
        assert_eq!(http_verdict(b"HELLO WORLD\r\n"), NotHttp);
        assert_eq!(http_verdict(b"GET\r\n"), NotHttp);
        assert_eq!(http_verdict(b"G(T / HTTP/1.1\r\n"), NotHttp);
        assert_eq!(http_verdict(b"GET / HTTP/1.10\r\n"), NotHttp);
        assert_eq!(http_verdict(b"GET a.example:443 HTTP/1.1\r\n"), NotHttp);
        assert_eq!(http_verdict(b"GET http://a@@b/ HTTP/1.1\r\n"), NotHttp);
    }
}
