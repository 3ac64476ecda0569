//! Compiled request matchers: strings, headers, query parameters, paths and the runtime
//! fraction. All regexes are compiled once, at config time.

use std::borrow::Cow;

use regex::Regex;

use super::RouteRequest;

/// A compiled `envoy.type.matcher.v3.StringMatcher`.
#[derive(Debug, Clone)]
pub enum StringMatcher {
    /// Whole value equals the string.
    Exact(String, bool),
    /// Value starts with the string.
    Prefix(String, bool),
    /// Value ends with the string.
    Suffix(String, bool),
    /// Value contains the string.
    Contains(String, bool),
    /// The regex matches the whole value (RE2 `FullMatch`).
    Regex(Regex),
}

impl StringMatcher {
    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatcher::Exact(s, false) => value == s,
            StringMatcher::Exact(s, true) => value.eq_ignore_ascii_case(s),
            StringMatcher::Prefix(s, false) => value.starts_with(s.as_str()),
            StringMatcher::Prefix(s, true) => starts_with_ignore_case(value, s),
            StringMatcher::Suffix(s, false) => value.ends_with(s.as_str()),
            StringMatcher::Suffix(s, true) => {
                value.len() >= s.len()
                    && value.is_char_boundary(value.len() - s.len())
                    && value[value.len() - s.len()..].eq_ignore_ascii_case(s)
            }
            StringMatcher::Contains(s, false) => value.contains(s.as_str()),
            StringMatcher::Contains(s, true) => value
                .to_ascii_lowercase()
                .contains(s.to_ascii_lowercase().as_str()),
            StringMatcher::Regex(re) => re.is_match(value),
        }
    }

    /// A short human description (`exact "x"`), for explanations.
    pub fn describe(&self) -> String {
        match self {
            StringMatcher::Exact(s, _) => format!("exact {s:?}"),
            StringMatcher::Prefix(s, _) => format!("prefix {s:?}"),
            StringMatcher::Suffix(s, _) => format!("suffix {s:?}"),
            StringMatcher::Contains(s, _) => format!("contains {s:?}"),
            StringMatcher::Regex(re) => format!("regex {:?}", re.as_str()),
        }
    }
}

/// Whether `value` starts with `prefix`, ASCII case-insensitively.
pub fn starts_with_ignore_case(value: &str, prefix: &str) -> bool {
    value.len() >= prefix.len()
        && value.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// What a header matcher checks about the header's value.
#[derive(Debug, Clone)]
pub enum HeaderValueMatch {
    /// The header is present (`true`) or absent (`false`).
    Present(bool),
    /// The value matches a string matcher.
    String(StringMatcher),
    /// The value parses as an integer in `[start, end)`.
    Range(i64, i64),
}

/// A compiled `envoy.config.route.v3.HeaderMatcher`.
#[derive(Debug, Clone)]
pub struct HeaderMatcher {
    /// Lower-case header name; pseudo-headers (`:path`, `:authority`, `:method`, `:scheme`) too.
    pub name: String,
    /// The value test.
    pub value: HeaderValueMatch,
    /// `invert_match`.
    pub invert: bool,
    /// `treat_missing_header_as_empty`.
    pub missing_as_empty: bool,
}

impl HeaderMatcher {
    /// Whether the request's headers satisfy this matcher (Envoy's HeaderUtility semantics:
    /// a header with several values is matched against the values joined by `,`).
    pub fn matches(&self, req: &RouteRequest<'_>) -> bool {
        self.matches_value(header_value(req, &self.name).as_deref())
    }

    /// Whether a header value (`None` = absent) satisfies this matcher.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        let value = match value {
            Some(v) => v,
            None if self.missing_as_empty => "",
            None => {
                return matches!(self.value, HeaderValueMatch::Present(p) if p == self.invert);
            }
        };
        let result = match &self.value {
            HeaderValueMatch::Present(p) => *p,
            HeaderValueMatch::String(m) => m.matches(value),
            HeaderValueMatch::Range(start, end) => {
                value.parse::<i64>().is_ok_and(|v| *start <= v && v < *end)
            }
        };
        result != self.invert
    }

    /// A short human description, for explanations.
    pub fn describe(&self) -> String {
        let test = match &self.value {
            HeaderValueMatch::Present(true) => "present".to_owned(),
            HeaderValueMatch::Present(false) => "absent".to_owned(),
            HeaderValueMatch::String(m) => m.describe(),
            HeaderValueMatch::Range(s, e) => format!("in range [{s}, {e})"),
        };
        let not = if self.invert { "not " } else { "" };
        format!("header {} {not}{test}", self.name)
    }
}

/// The value of a request header by lower-case name, pseudo-headers included; several
/// values are joined with `,`. Borrows when the header has a single value.
pub fn header_value<'r>(req: &RouteRequest<'r>, name: &str) -> Option<Cow<'r, str>> {
    if let Some(pseudo) = name.strip_prefix(':') {
        return match pseudo {
            "path" => Some(Cow::Borrowed(req.path)),
            "authority" | "host" => Some(Cow::Borrowed(req.authority)),
            "method" => Some(Cow::Borrowed(req.method.as_str())),
            "scheme" => Some(Cow::Borrowed(if req.https { "https" } else { "http" })),
            _ => None,
        };
    }
    if name == "host" {
        return Some(Cow::Borrowed(req.authority));
    }
    let headers = req.headers;
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let first = first.to_str().unwrap_or("");
    match values.next() {
        None => Some(Cow::Borrowed(first)),
        Some(second) => {
            let mut joined = String::from(first);
            joined.push(',');
            joined.push_str(second.to_str().unwrap_or(""));
            for v in values {
                joined.push(',');
                joined.push_str(v.to_str().unwrap_or(""));
            }
            Some(Cow::Owned(joined))
        }
    }
}

/// A compiled `QueryParameterMatcher`.
#[derive(Debug, Clone)]
pub struct QueryParameterMatcher {
    /// Parameter name.
    pub name: String,
    /// `None`: the parameter must be present; otherwise its value must match.
    pub value: Option<StringMatcher>,
}

impl QueryParameterMatcher {
    /// Whether the query string (text after `?`, may be empty) satisfies this matcher.
    pub fn matches(&self, query: &str) -> bool {
        let Some(value) = query_param(query, &self.name) else {
            return false;
        };
        match &self.value {
            None => true,
            Some(m) => m.matches(&value),
        }
    }
}

/// The first value of query parameter `name` (percent-decoded), if present.
pub fn query_param<'q>(query: &'q str, name: &str) -> Option<Cow<'q, str>> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

/// Decodes `%XX` escapes; borrows when there are none.
pub fn percent_decode(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// How the route matches the path.
#[derive(Debug, Clone)]
pub enum PathMatch {
    /// `prefix`: the whole `:path` (query included) starts with it.
    Prefix(String),
    /// `path`: the path without query equals it.
    Exact(String),
    /// `safe_regex`: the regex matches the whole path without query (boxed, like the
    /// template: a route table holds a `PathMatch` per route, most of them a plain string).
    Regex(Box<Regex>),
    /// `path_separated_prefix`: the path without query equals it or continues with `/`.
    SeparatedPrefix(String),
    /// `path_match_policy` URI template (`/foo/{bar}/**`), compiled to a regex.
    Template(Box<UriTemplate>),
    /// `connect_matcher`: matches CONNECT requests only.
    Connect,
}

impl PathMatch {
    /// Whether `path` (the full `:path`, with query) matches. `case_sensitive` does not apply
    /// to regexes, like Envoy.
    pub fn matches(&self, path: &str, method: &http::Method, case_sensitive: bool) -> bool {
        let no_query = strip_query(path);
        match self {
            PathMatch::Prefix(p) if case_sensitive => path.starts_with(p.as_str()),
            PathMatch::Prefix(p) => starts_with_ignore_case(path, p),
            PathMatch::Exact(p) if case_sensitive => no_query == p,
            PathMatch::Exact(p) => no_query.eq_ignore_ascii_case(p),
            PathMatch::Regex(re) => re.is_match(no_query),
            PathMatch::Template(t) => t.regex.is_match(no_query),
            PathMatch::SeparatedPrefix(p) => {
                let starts = if case_sensitive {
                    no_query.starts_with(p.as_str())
                } else {
                    starts_with_ignore_case(no_query, p)
                };
                starts && (no_query.len() == p.len() || no_query.as_bytes()[p.len()] == b'/')
            }
            PathMatch::Connect => method == http::Method::CONNECT,
        }
    }

    /// A short human description, for explanations.
    pub fn describe(&self) -> String {
        match self {
            PathMatch::Prefix(p) => format!("prefix {p:?}"),
            PathMatch::Exact(p) => format!("path {p:?}"),
            PathMatch::Regex(re) => format!("safe_regex {:?}", re.as_str()),
            PathMatch::SeparatedPrefix(p) => format!("path_separated_prefix {p:?}"),
            PathMatch::Template(t) => format!("path template {:?}", t.template),
            PathMatch::Connect => "connect_matcher".to_owned(),
        }
    }
}

/// A `path_match_policy` URI template and the regex it compiles to.
#[derive(Debug, Clone)]
pub struct UriTemplate {
    /// The template as configured.
    pub template: String,
    /// The whole-path regex whose named groups are the template's variables.
    pub regex: Regex,
}

/// The path without its query string and fragment.
pub fn strip_query(path: &str) -> &str {
    match path.find(['?', '#']) {
        Some(i) => &path[..i],
        None => path,
    }
}

/// The query string (after `?`, before `#`), empty when there is none.
pub fn query_of(path: &str) -> &str {
    match path.find('?') {
        Some(i) => {
            let q = &path[i + 1..];
            q.split('#').next().unwrap_or("")
        }
        None => "",
    }
}

/// `FractionalPercent`: `numerator` out of `denominator` (100, 10,000 or 1,000,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FractionalPercent {
    /// Numerator.
    pub numerator: u32,
    /// Denominator value (not the enum).
    pub denominator: u32,
}

impl FractionalPercent {
    /// Envoy's `evaluateFractionalPercent`: `random_value % denominator < numerator`.
    pub fn enabled(&self, random_value: u64) -> bool {
        random_value % u64::from(self.denominator.max(1)) < u64::from(self.numerator)
    }
}

/// A runtime snapshot, as far as routing needs one. Without one, defaults apply.
pub trait Runtime: Sync {
    /// Envoy's `featureEnabled(key, default, random_value)`.
    fn feature_enabled(&self, key: &str, default: FractionalPercent, random_value: u64) -> bool;
}

/// A compiled `runtime_fraction`.
#[derive(Debug, Clone)]
pub struct RuntimeFraction {
    /// Runtime key (may be empty).
    pub key: String,
    /// Default fraction.
    pub default: FractionalPercent,
}

impl RuntimeFraction {
    /// Whether the fraction admits this request.
    pub fn enabled(&self, req: &RouteRequest<'_>) -> bool {
        match req.runtime {
            Some(rt) => rt.feature_enabled(&self.key, self.default, req.random_value),
            None => self.default.enabled(req.random_value),
        }
    }
}

/// The characters a URI template literal (and a `*` glob) may hold: RFC 3986 `pchar`.
const TEMPLATE_CHARS: &str = r"a-zA-Z0-9\-._~%!$&'()+,;:@=*";

/// Whether `s` is a non-empty run of [`TEMPLATE_CHARS`] (plus `/` when `slash`).
pub(super) fn is_template_literal(s: &str, slash: bool) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric() || b"-._~%!$&'()+,;:@=*".contains(&b) || (slash && b == b'/')
        })
}

/// Whether `s` is a template variable name: a letter, then letters, digits or `_`.
pub(super) fn is_template_variable_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Envoy's literal-to-regex step: escapes `$ ( ) + .` only, so a `*` in a literal stays a
/// regex repetition, as in Envoy.
fn literal_regex(out: &mut String, lit: &str) {
    for c in lit.chars() {
        if matches!(c, '$' | '(' | ')' | '+' | '.') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Appends the regex of a glob: `*` one non-empty segment, `**` any text including `/`.
/// Returns whether it was the text glob `**`.
fn glob_regex(out: &mut String, glob: &str) -> bool {
    let text = glob == "**";
    out.push('[');
    out.push_str(TEMPLATE_CHARS);
    out.push_str(if text { "/]*" } else { "]+" });
    text
}

/// Splits a leading `**` or `*` off `s`.
fn split_glob(s: &str) -> (&str, &str) {
    let n = if s.starts_with("**") { 2 } else { 1 };
    s.split_at(n)
}

/// What [`template_regex`] tracks while compiling: variable names and glob order.
#[derive(Default)]
struct TemplateState {
    names: Vec<String>,
    name_error: Option<String>,
    seen_text_glob: bool,
    glob_after_text_glob: Option<&'static str>,
}

impl TemplateState {
    fn glob(&mut self, out: &mut String, glob: &str) {
        if self.seen_text_glob {
            self.glob_after_text_glob
                .get_or_insert("Glob after text glob.");
        }
        self.seen_text_glob = glob_regex(out, glob);
    }

    /// Compiles `{name}` / `{name=match}` (`body` is between the braces) to a named group.
    fn variable(&mut self, out: &mut String, body: &str) -> Result<(), String> {
        let (name, pattern) = match body.split_once('=') {
            Some((n, p)) => (n, Some(p)),
            None => (body, None),
        };
        if !is_template_variable_name(name) {
            return Err(format!("Invalid variable name: {name:?}"));
        }
        out.push_str("(?P<");
        out.push_str(name);
        out.push('>');
        match pattern {
            None => {
                if self.seen_text_glob {
                    self.glob_after_text_glob
                        .get_or_insert("Implicit variable path glob after text glob.");
                }
                glob_regex(out, "*");
            }
            Some("") => return Err("Empty variable match".to_owned()),
            Some(mut rest) => {
                let mut first = true;
                while !rest.is_empty() {
                    if !first {
                        out.push('/');
                    }
                    first = false;
                    if rest.starts_with('*') {
                        let (glob, tail) = split_glob(rest);
                        self.glob(out, glob);
                        rest = tail;
                    } else {
                        let end = rest.find('/').unwrap_or(rest.len());
                        let lit = &rest[..end];
                        if !is_template_literal(lit, false) {
                            return Err(format!("Invalid literal: {lit:?}"));
                        }
                        literal_regex(out, lit);
                        rest = &rest[end..];
                    }
                    if !rest.is_empty() {
                        match rest.strip_prefix('/') {
                            Some(tail) if !tail.is_empty() => rest = tail,
                            _ => return Err(format!("Invalid variable match: {rest:?}")),
                        }
                    }
                }
            }
        }
        out.push(')');
        let error = if self.names.len() >= 5 {
            Some("Exceeded variable count limit (5)".to_owned())
        } else if name.len() > 16 {
            Some(format!(
                "Invalid variable name length (length of {name:?} should be at least 1 and no more than 16)"
            ))
        } else if self.names.iter().any(|n| n == name) {
            Some(format!("Repeated variable name: {name:?}"))
        } else {
            None
        };
        if self.name_error.is_none() {
            self.name_error = error;
        }
        self.names.push(name.to_owned());
        Ok(())
    }
}

/// Compiles a URI template (`/foo/{name}/*/**`, `/v/{id=*}.m3u8`, `/{rest=videos/**}`) into
/// an anchored regex with one named group per variable, per Envoy's `uri_template` matcher:
/// `*` and `{x}` match one segment, `**` any rest; a segment may put a literal prefix and
/// suffix around a variable or glob. Errors carry Envoy's detail text.
pub fn template_regex(template: &str) -> Result<Regex, String> {
    let rest = template
        .strip_prefix('/')
        .filter(|r| r.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| format!("Invalid pattern: {template:?}"))?;
    let mut state = TemplateState::default();
    let mut re = String::from("^/");
    let mut rest = rest;
    while !rest.is_empty() {
        let seg_end = rest.find('/').unwrap_or(rest.len());
        let brace = rest[..seg_end].find('{');
        let (suffix_from, invalid_suffix) = if rest.starts_with('*') {
            let (glob, tail) = split_glob(rest);
            state.glob(&mut re, glob);
            (tail, "Invalid literal")
        } else if let Some(b) = brace.filter(|&b| b == 0 || rest[b..].contains('}')) {
            let prefix = &rest[..b];
            if !prefix.is_empty() {
                if !is_template_literal(prefix, false) {
                    return Err(format!("Invalid prefix literal: {prefix:?}"));
                }
                literal_regex(&mut re, prefix);
            }
            let (body, tail) = rest[b + 1..].split_once('}').ok_or_else(|| {
                format!(
                    "Unmatched variable bracket in mixed pattern: {:?}",
                    &rest[b..]
                )
            })?;
            state.variable(&mut re, body)?;
            (tail, "Invalid suffix literal")
        } else {
            let lit = &rest[..seg_end];
            if !is_template_literal(lit, false) {
                return Err(format!("Invalid literal: {lit:?}"));
            }
            literal_regex(&mut re, lit);
            (&rest[seg_end..], "Invalid literal")
        };
        let end = suffix_from.find('/').unwrap_or(suffix_from.len());
        let suffix = &suffix_from[..end];
        if !suffix.is_empty() {
            if !is_template_literal(suffix, false) {
                return Err(format!("{invalid_suffix}: {suffix:?}"));
            }
            literal_regex(&mut re, suffix);
        }
        rest = &suffix_from[end..];
        if let Some(tail) = rest.strip_prefix('/') {
            re.push('/');
            rest = tail;
            if rest.is_empty() {
                break;
            }
        }
    }
    if let Some(e) = state.name_error {
        return Err(e);
    }
    if let Some(e) = state.glob_after_text_glob {
        return Err(e.to_owned());
    }
    re.push('$');
    Regex::new(&re).map_err(|e| e.to_string())
}

#[cfg(test)]
mod template_tests {
    use super::template_regex;

    /// Whether `template` matches `path`, and what variable `var` captured.
    fn capture(template: &str, path: &str, var: &str) -> Option<String> {
        let re = template_regex(template).unwrap();
        let caps = re.captures(path)?;
        Some(caps.name(var).map_or("", |m| m.as_str()).to_owned())
    }

    #[test]
    fn globs_variables_and_mixed_segments_match_like_envoy() {
        assert_eq!(
            capture("/a/{x}/{y=**}", "/a/1/2/3", "y").as_deref(),
            Some("2/3")
        );
        assert_eq!(capture("/a/{x}/{y=**}", "/a/1/", "y").as_deref(), Some(""));
        assert_eq!(capture("/a/{x}/{y=**}", "/a/1", "x"), None);
        for ok in ["x=y", "x*y", "a:b@c", "x'y", "x%y", "x(y"] {
            assert!(
                capture("/a/{x}", &format!("/a/{ok}"), "x").is_some(),
                "{ok}"
            );
        }
        for bad in ["x\"y", "x[y", "x{y", "x|y", "x^y"] {
            assert_eq!(capture("/a/{x}", &format!("/a/{bad}"), "x"), None, "{bad}");
        }
        assert_eq!(
            capture("/b/pre{x}suf/c", "/b/prefoosuf/c", "x").as_deref(),
            Some("foo")
        );
        assert_eq!(capture("/b/pre{x}suf/c", "/b/presuf/c", "x"), None);
        assert_eq!(
            capture("/d/{x=**}.m3u8", "/d/x/y.m3u8", "x").as_deref(),
            Some("x/y")
        );
        assert_eq!(
            capture("/e/{x=v/*}/{y}", "/e/v/1/2", "x").as_deref(),
            Some("v/1")
        );
        assert_eq!(capture("/e/{x=v/*}/{y}", "/e/w/1/2", "x"), None);
        assert!(capture("/f/**/z", "/f/1/2/z", "").is_some());
        assert!(capture("/f/**/z", "/f/z", "").is_none());
        assert!(capture("/h/{x}/", "/h/1", "x").is_none());
        // Envoy leaves `*` inside a literal unescaped: `b*` is a regex repetition.
        for (path, hit) in [
            ("/c/b", true),
            ("/c/", true),
            ("/c/bb", true),
            ("/c/bcd", false),
        ] {
            assert_eq!(capture("/c/b*", path, "").is_some(), hit, "{path}");
        }
    }

    #[test]
    fn invalid_templates_give_envoys_reason() {
        for (template, reason) in [
            ("a", "Invalid pattern: \"a\""),
            ("/a/{x}.{y}", "Invalid suffix literal: \".{y}\""),
            ("/a//b", "Invalid literal: \"\""),
            ("/a/{x}{y}", "Invalid suffix literal: \"{y}\""),
            (
                "/{a}/{b}/{c}/{d}/{e}/{f}",
                "Exceeded variable count limit (5)",
            ),
            (
                "/{abcdefghijklmnopq}",
                "Invalid variable name length (length of \"abcdefghijklmnopq\" should be at least 1 and no more than 16)",
            ),
            ("/{a}/{a}", "Repeated variable name: \"a\""),
            ("/a/{x=}", "Empty variable match"),
            ("/a/{x=*/}", "Invalid variable match: \"/\""),
            ("/a/{x=*b}", "Invalid variable match: \"b\""),
            ("/a/{1x}", "Invalid variable name: \"1x\""),
            ("/a/b?c", "Invalid literal: \"b?c\""),
            (
                "/{x=**}/{y}",
                "Implicit variable path glob after text glob.",
            ),
            ("/a/**/*", "Glob after text glob."),
            (
                "/a/{x=**}/{y}.jpg",
                "Implicit variable path glob after text glob.",
            ),
            ("/a/*{x}", "Invalid literal: \"{x}\""),
            ("/a/pre{x", "Invalid literal: \"pre{x\""),
            (
                "/foo/{a",
                "Unmatched variable bracket in mixed pattern: \"{a\"",
            ),
            (
                "/api/MyFunction[{id}]",
                "Invalid prefix literal: \"MyFunction[\"",
            ),
            ("/a/{x=a/?}", "Invalid literal: \"?\""),
        ] {
            assert_eq!(template_regex(template).unwrap_err(), reason, "{template}");
        }
        for valid in [
            "/",
            "/a/",
            "/a/{x}/**",
            "/a/**/b",
            "/a{b}/c",
            "/a/{x=*}/{y=*}/{z=**}",
        ] {
            assert!(template_regex(valid).is_ok(), "{valid}");
        }
    }
}
