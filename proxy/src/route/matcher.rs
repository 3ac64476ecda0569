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
    /// `safe_regex`: the regex matches the whole path without query.
    Regex(Regex),
    /// `path_separated_prefix`: the path without query equals it or continues with `/`.
    SeparatedPrefix(String),
    /// `path_match_policy` URI template (`/foo/{bar}/**`), compiled to a regex.
    Template(String, Regex),
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
            PathMatch::Regex(re) | PathMatch::Template(_, re) => re.is_match(no_query),
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
            PathMatch::Template(t, _) => format!("path template {t:?}"),
            PathMatch::Connect => "connect_matcher".to_owned(),
        }
    }
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

/// Compiles a URI template (`/foo/{name}/*/**`) into an anchored regex, per Envoy's
/// `uri_template` extension: `*` and `{x}` match one segment, `**` and `{x=**}` any rest.
pub fn template_regex(template: &str) -> Result<Regex, String> {
    if !template.starts_with('/') {
        return Err(format!("path template {template:?} must start with '/'"));
    }
    let mut re = String::from("^");
    for seg in template[1..].split('/') {
        re.push('/');
        let var = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}'));
        let pattern = match var {
            Some(v) => v.split_once('=').map(|(_, p)| p).unwrap_or("*"),
            None => seg,
        };
        match pattern {
            "**" => re.push_str(".*"),
            "*" => re.push_str("[^/]+"),
            lit if lit.contains(['{', '}', '*']) => {
                return Err(format!("invalid path template {template:?}"));
            }
            lit => re.push_str(&regex::escape(lit)),
        }
    }
    re.push('$');
    Regex::new(&re).map_err(|e| e.to_string())
}
