//! Path rewrites and redirect locations.

use super::action::{PathRewrite, Redirect, RedirectPath, TemplateRewrite};
use super::matcher::{PathMatch, strip_query};
use super::{Route, RouteRequest};

/// The length of `path`'s part that the route's path condition consumed, for
/// `prefix_rewrite`: the prefix for prefix matches, the whole path (without query) otherwise.
fn matched_len(route: &Route, match_path: &str) -> usize {
    match &route.matcher.path {
        PathMatch::Prefix(p) | PathMatch::SeparatedPrefix(p) => p.len().min(match_path.len()),
        _ => strip_query(match_path).len(),
    }
}

/// Applies a path rewrite to `path` (as received; `match_path` is the path used for matching).
/// `None` when a template rewrite does not apply (Envoy then forwards the path unchanged).
pub(super) fn path(
    route: &Route,
    rewrite: &PathRewrite,
    match_path: &str,
    path: &str,
) -> Option<String> {
    match rewrite {
        PathRewrite::Prefix(prefix) => Some(prefix_rewrite(route, prefix, match_path, path)),
        PathRewrite::Regex(re, sub) => Some(regex_rewrite(re, sub, path)),
        PathRewrite::Template(t) => template_rewrite(route, t, path),
    }
}

/// Envoy's `uri_template_rewriter`: matches the path (query excluded) against the route's
/// match template again and substitutes its variables; the query is kept.
fn template_rewrite(route: &Route, rewrite: &TemplateRewrite, path: &str) -> Option<String> {
    let PathMatch::Template(t) = &route.matcher.path else {
        return None;
    };
    let p = strip_query(path);
    let mut out = rewrite.substitute(&t.regex.captures(p)?);
    out.push_str(&path[p.len()..]);
    Some(out)
}

fn prefix_rewrite(route: &Route, prefix: &str, match_path: &str, path: &str) -> String {
    let n = matched_len(route, match_path).min(path.len());
    let mut out = String::with_capacity(prefix.len() + path.len() - n);
    out.push_str(prefix);
    out.push_str(&path[n..]);
    out
}

fn regex_rewrite(re: &regex::Regex, sub: &str, path: &str) -> String {
    let p = strip_query(path);
    let mut out = re.replace_all(p, sub).into_owned();
    out.push_str(&path[p.len()..]);
    out
}

/// Envoy's `processRequestHost`: drops the request's port when the redirect sets one, or when
/// the scheme changes away from the port's default scheme.
fn redirect_host<'r>(req: &RouteRequest<'r>, new_scheme: &str, new_port: bool) -> &'r str {
    let host = req.authority;
    if host.is_empty() {
        return host;
    }
    let host_end = if host.starts_with('[') {
        host.rfind("]:").map(|i| i + 1)
    } else {
        host.rfind(':')
    };
    if let Some(end) = host_end {
        let port = &host[end..];
        let proto = req.scheme();
        let mut remove = new_port;
        if new_scheme != proto {
            remove |= proto == "https" && port == ":443";
            remove |= proto == "http" && port == ":80";
        }
        if remove {
            return &host[..end];
        }
    }
    host
}

/// The `Location` of a redirect route for `req`.
pub(super) fn redirect_location(route: &Route, r: &Redirect, req: &RouteRequest<'_>) -> String {
    let scheme = r.scheme.as_deref().unwrap_or(req.scheme());
    let port = r.port.map(|p| format!(":{p}")).unwrap_or_default();
    let host = match &r.host {
        Some(h) => h.as_str(),
        None => redirect_host(req, scheme, r.port.is_some()),
    };
    let mut path_has_query = false;
    let mut final_path = match &r.path {
        RedirectPath::Keep => req.path.to_owned(),
        RedirectPath::Path(p, has_query) => {
            path_has_query = *has_query;
            match req.path.find('?') {
                Some(i) if !has_query => format!("{p}{}", &req.path[i..]),
                _ => p.clone(),
            }
        }
        RedirectPath::Prefix(prefix) => prefix_rewrite(route, prefix, req.path, req.path),
        RedirectPath::Regex(re, sub) => regex_rewrite(re, sub, req.path),
    };
    if !final_path.starts_with('/') {
        final_path.insert(0, '/');
    }
    if r.strip_query
        && !path_has_query
        && let Some(i) = final_path.find('?')
    {
        final_path.truncate(i);
    }
    format!("{scheme}://{host}{port}{final_path}")
}
