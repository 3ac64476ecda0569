//! Request path normalisation of the connection manager, in Envoy's order: escaped slashes
//! (`path_with_escaped_slashes_action`), then `normalize_path` (RFC 3986 dot segments,
//! unreserved percent-decoding, backslashes), then `merge_slashes`. The query is untouched.

use crate::config::hcm::{EscapedSlashes, HcmConfig};

/// What to do with the request after normalisation.
#[derive(Debug, PartialEq, Eq)]
pub enum PathVerdict {
    /// Route it with this path (and query).
    Continue(Option<String>),
    /// Answer 400.
    Reject,
    /// Answer a redirect to this path (and query).
    Redirect(String),
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// Replaces `%2F`/`%5C` (any case) with `/`/`\`; `None` when there are none.
fn unescape_slashes(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut found = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            match (b[i + 1], b[i + 2].to_ascii_uppercase()) {
                (b'2', b'F') => {
                    out.push(b'/');
                    found = true;
                    i += 3;
                    continue;
                }
                (b'5', b'C') => {
                    out.push(b'\\');
                    found = true;
                    i += 3;
                    continue;
                }
                _ => {}
            }
        }
        out.push(b[i]);
        i += 1;
    }
    found.then(|| String::from_utf8_lossy(&out).into_owned())
}

/// Decodes escaped unreserved characters, upper-cases other escapes, turns `\` into `/`, and
/// removes dot segments. `None` when the path is not valid (a `%` not followed by two hex digits).
fn canonical(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let mut decoded = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let (h, l) = (hex(*b.get(i + 1)?)?, hex(*b.get(i + 2)?)?);
                let c = h << 4 | l;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    decoded.push(c as char);
                } else {
                    decoded.push_str(&format!("%{c:02X}"));
                }
                i += 3;
            }
            b'\\' => {
                decoded.push('/');
                i += 1;
            }
            _ => {
                let ch = path[i..].chars().next()?;
                decoded.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    Some(remove_dot_segments(&decoded))
}

/// RFC 3986 §5.2.4 on an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

fn merge_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// Whether no rule can change `path` (nothing escaped, no backslash, no dot segment, no
/// double slash), as most paths are: they are routed as they came, without a copy.
fn untouched(path: &str) -> bool {
    !path.bytes().any(|b| b == b'%' || b == b'\\')
        && !path.contains("//")
        && !path.split('/').any(|s| s == "." || s == "..")
}

/// Applies the connection manager's path rules to `path_and_query`.
pub fn normalize(cfg: &HcmConfig, path_and_query: &str) -> PathVerdict {
    if !cfg.normalize_path && !cfg.merge_slashes && cfg.escaped_slashes == EscapedSlashes::Keep {
        return PathVerdict::Continue(None);
    }
    let (path, query) = match path_and_query.find('?') {
        Some(i) => path_and_query.split_at(i),
        None => (path_and_query, ""),
    };
    if !path.starts_with('/') || untouched(path) {
        return PathVerdict::Continue(None);
    }
    let mut current = path.to_owned();
    let mut redirect = false;
    if cfg.escaped_slashes != EscapedSlashes::Keep
        && let Some(unescaped) = unescape_slashes(&current)
    {
        match cfg.escaped_slashes {
            EscapedSlashes::Reject => return PathVerdict::Reject,
            EscapedSlashes::UnescapeAndRedirect => redirect = true,
            _ => {}
        }
        current = unescaped;
    }
    if cfg.normalize_path {
        match canonical(&current) {
            Some(c) => current = c,
            None => return PathVerdict::Reject,
        }
    }
    if cfg.merge_slashes {
        current = merge_slashes(&current);
    }
    let full = format!("{current}{query}");
    if redirect {
        PathVerdict::Redirect(full)
    } else if full == path_and_query {
        PathVerdict::Continue(None)
    } else {
        PathVerdict::Continue(Some(full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_no_rule_changes_are_untouched() {
        for path in ["/", "/a/b.c/d", "/a/.hidden/..x", "/a/b/"] {
            assert!(untouched(path), "{path}");
        }
        for path in ["/a/./b", "/a/..", "/.", "/a//b", "/a%41", "/a\\b"] {
            assert!(!untouched(path), "{path}");
        }
    }

    #[test]
    fn dot_segments_per_rfc3986() {
        assert_eq!(remove_dot_segments("/a/b/c/./../../g"), "/a/g");
        assert_eq!(remove_dot_segments("/a/../exact"), "/exact");
        assert_eq!(remove_dot_segments("/../x"), "/x");
        assert_eq!(remove_dot_segments("/a/b/.."), "/a/");
        assert_eq!(remove_dot_segments("/a/./"), "/a/");
    }

    #[test]
    fn canonical_decodes_unreserved_only() {
        assert_eq!(canonical("/%65xact").as_deref(), Some("/exact"));
        assert_eq!(canonical("/a%2fb").as_deref(), Some("/a%2Fb"));
        assert_eq!(canonical("/a\\b").as_deref(), Some("/a/b"));
        assert_eq!(canonical("/a%zz"), None);
    }

    #[test]
    fn escaped_slashes_then_merge() {
        assert_eq!(
            unescape_slashes("/x%2F..%2fexact").as_deref(),
            Some("/x/../exact")
        );
        assert_eq!(unescape_slashes("/plain"), None);
        assert_eq!(merge_slashes("//a///b/"), "/a/b/");
    }
}
