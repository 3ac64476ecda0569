//! `envoy.filters.http.jwt_authn`: the request's requirement (a route's `requirement_name`,
//! else the first matching rule's) is checked against the tokens the providers find in it;
//! a request that fails gets 401 (403 for audiences) with the failure as body and a
//! `www-authenticate: Bearer` challenge. Verified tokens' payloads and claims are forwarded
//! as headers, and the tokens themselves removed unless `forward`. A provider's
//! `payload_in_metadata`, `header_in_metadata` and `failed_status_in_metadata` are written to
//! the request's dynamic metadata under `envoy.filters.http.jwt_authn`, where an RBAC filter
//! after this one reads the claims.
//!
//! Requirements are checked in order, one token at a time, as Envoy's verifiers complete
//! with local keys: `requires_any` ends at the first success (else reports its last failure
//! but a missing token), `requires_all` at the first failure. A provider's tokens are all
//! checked, last found first, and every one must pass. Remote JWKS are fetched through the
//! provider's cluster when a token first needs them and kept for `cache_duration`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use super::FilterRequest;
use crate::body::Body;
use crate::config::http_filter::jwt_authn::{
    JwksSource, JwtAuthnConfig, JwtAuthnPerRoute, Provider, RemoteJwks, Requirement,
};
use crate::http::local_reply::local_reply;
use crate::jwt::jwks::Jwks;
use crate::jwt::token::Jwt;
use crate::jwt::{Audiences, Status};
use crate::route::metadata::json::{from_json, struct_from_json};
use crate::stats::{Counter, Store};
use crate::upstream::{ClusterManager, LbContext};

/// The dynamic metadata namespace the filter writes.
const NAMESPACE: &str = "envoy.filters.http.jwt_authn";

/// The jwt_authn filter of one connection manager.
#[derive(Debug)]
pub(super) struct JwtAuthn {
    config: Arc<JwtAuthnConfig>,
    stats: Stats,
    /// Each provider's fetched remote JWKS.
    remote: Box<[Mutex<Option<Fetched>>]>,
}

/// A fetched remote JWKS and when it expires.
type Fetched = (Arc<Jwks>, Instant);

/// `http.<prefix>.jwt_authn.[<stat_prefix>.]*`.
#[derive(Debug)]
struct Stats {
    allowed: Counter,
    denied: Counter,
    cors_preflight_bypassed: Counter,
    jwks_fetch_success: Counter,
    jwks_fetch_failed: Counter,
    jwt_cache_miss: Counter,
    /// Registered as Envoy does; revoy keeps no token cache.
    _jwt_cache_hit: Counter,
}

/// A token found in the request, with the issuers its location accepts.
struct Found<'c> {
    token: String,
    /// The issuers of the providers that look there; `None`: any (a provider without one).
    issuers: Option<Vec<&'c str>>,
    /// Where it was, to remove it unless forwarded.
    place: Place<'c>,
}

/// Where a token was found.
enum Place<'c> {
    Header(&'c HeaderName),
    Param(&'c str),
    /// A cookie: left in place, as Envoy does.
    Cookie,
}

/// How an authenticator treats its tokens' failures.
#[derive(Clone, Copy)]
enum Mode<'c> {
    /// A provider's requirement: its tokens must all verify.
    Provider(usize, Option<&'c Audiences>),
    /// `allow_missing` (`failed: false`) or `allow_missing_or_failed`.
    Allow { failed: bool },
}

impl JwtAuthn {
    /// The filter with `config`, its stats under `http.<stat_prefix>.jwt_authn.` (and the
    /// filter's own `stat_prefix`).
    pub(super) fn new(config: &Arc<JwtAuthnConfig>, store: &Store, stat_prefix: &str) -> Self {
        let own = match config.stat_prefix.as_str() {
            "" => String::new(),
            p => format!("{p}."),
        };
        let counter = |n: &str| store.counter(&format!("http.{stat_prefix}.jwt_authn.{own}{n}"));
        JwtAuthn {
            config: config.clone(),
            stats: Stats {
                allowed: counter("allowed"),
                denied: counter("denied"),
                cors_preflight_bypassed: counter("cors_preflight_bypassed"),
                jwks_fetch_success: counter("jwks_fetch_success"),
                jwks_fetch_failed: counter("jwks_fetch_failed"),
                jwt_cache_miss: counter("jwt_cache_miss"),
                _jwt_cache_hit: counter("jwt_cache_hit"),
            },
            remote: config.providers.iter().map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Lets `req` go on when it meets its requirement; answers 401/403 otherwise.
    pub(super) async fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        per_route: Option<&JwtAuthnPerRoute>,
    ) -> Option<Response<Body>> {
        let c = &*self.config;
        if c.bypass_cors_preflight && is_cors_preflight(req) {
            self.stats.cors_preflight_bypassed.inc();
            self.stats.allowed.inc();
            return None;
        }
        let requirement = match per_route {
            Some(JwtAuthnPerRoute::Disabled) => None,
            Some(JwtAuthnPerRoute::RequirementName(name)) => match c.requirement_map.get(name) {
                Some(r) => Some(r.clone()),
                None => {
                    let why = format!(
                        "Wrong requirement_name: {name}. It should be one of [{}]",
                        c.requirement_names
                    );
                    self.stats.denied.inc();
                    req.note_details(&details(&why));
                    let body = if c.strip_failure_response {
                        String::new()
                    } else {
                        format!("Failed JWT authentication: {why}")
                    };
                    return Some(local_reply(StatusCode::FORBIDDEN, &body));
                }
            },
            None => {
                let route_req = req.route_request();
                c.rules
                    .iter()
                    .find(|(m, _)| m.matches(&route_req, req.path))
                    .and_then(|(_, r)| r.clone())
            }
        };
        let status = match requirement {
            Some(r) => self.verify(&r, req).await,
            None => Status::Ok,
        };
        if status == Status::Ok {
            self.stats.allowed.inc();
            return None;
        }
        self.stats.denied.inc();
        req.note_details(&details(status.message()));
        let code = if status == Status::JwtAudienceNotAllowed {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::UNAUTHORIZED
        };
        if c.strip_failure_response {
            return Some(local_reply(code, ""));
        }
        let mut challenge = format!("Bearer realm=\"{}\"", req.original_uri());
        if status != Status::JwtMissed {
            challenge.push_str(", error=\"invalid_token\"");
        }
        let mut resp = local_reply(code, status.message());
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            resp.headers_mut().insert(http::header::WWW_AUTHENTICATE, v);
        }
        Some(resp)
    }

    /// Checks requirement `r`.
    fn verify<'s>(
        &'s self,
        r: &'s Requirement,
        req: &'s mut FilterRequest<'_>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Status> + Send + 's>> {
        Box::pin(async move {
            match r {
                Requirement::AllowAll => Status::Ok,
                Requirement::Provider(i, audiences) => {
                    self.authenticate(req, &[*i], Mode::Provider(*i, audiences.as_ref()))
                        .await
                }
                Requirement::Allow { providers, failed } => {
                    self.authenticate(req, providers, Mode::Allow { failed: *failed })
                        .await
                }
                Requirement::Any(list) => {
                    // Failing, it reports its last failure other than a missing token, else
                    // "missing".
                    let mut worst = Status::JwtMissed;
                    for r in list {
                        match self.verify(r, req).await {
                            Status::Ok => return Status::Ok,
                            Status::JwtMissed => {}
                            s => worst = s,
                        }
                    }
                    worst
                }
                Requirement::All(list) => {
                    for r in list {
                        let s = self.verify(r, req).await;
                        if s != Status::Ok {
                            return s;
                        }
                    }
                    Status::Ok
                }
            }
        })
    }

    /// Verifies the tokens the `providers` find in the request, as Envoy's authenticator:
    /// the last found first; a provider's requirement stops at the first failure, the
    /// `allow_missing*` ones go through all and report the last.
    async fn authenticate(
        &self,
        req: &mut FilterRequest<'_>,
        providers: &[usize],
        mode: Mode<'_>,
    ) -> Status {
        let providers: Vec<&Provider> = providers
            .iter()
            .map(|i| &self.config.providers[*i])
            .collect();
        for p in &providers {
            if let Some(h) = &p.forward_payload_header {
                req.headers.remove(h);
            }
            for (h, _) in &p.claim_to_headers {
                req.headers.remove(h);
            }
        }
        let mut tokens = extract(req, &providers);
        let (allow_missing, allow_failed) = match mode {
            Mode::Provider(..) => (false, false),
            Mode::Allow { failed } => (true, failed),
        };
        let mut status = Status::JwtMissed;
        while let Some(found) = tokens.pop() {
            status = self.check(req, &found, mode).await;
            if status != Status::Ok && !allow_missing && !allow_failed {
                break;
            }
        }
        if allow_failed || (allow_missing && status == Status::JwtMissed) {
            Status::Ok
        } else {
            status
        }
    }

    /// Verifies one token as [`JwtAuthn::verify_token`] does and, when a provider's token
    /// fails, writes the failure where its `failed_status_in_metadata` says.
    async fn check(
        &self,
        req: &mut FilterRequest<'_>,
        found: &Found<'_>,
        mode: Mode<'_>,
    ) -> Status {
        let status = self.verify_token(req, found, mode).await;
        if let (Mode::Provider(i, _), false) = (mode, status == Status::Ok) {
            let key = &self.config.providers[i].failed_status_in_metadata;
            if !key.is_empty() {
                let failure =
                    serde_json::json!({"code": status.code(), "message": status.message()});
                req.metadata.insert(NAMESPACE, key, from_json(&failure));
            }
        }
        status
    }

    /// Verifies one token and, when it is good, forwards what its provider asks.
    async fn verify_token(
        &self,
        req: &mut FilterRequest<'_>,
        found: &Found<'_>,
        mode: Mode<'_>,
    ) -> Status {
        if matches!(mode, Mode::Provider(..)) {
            self.stats.jwt_cache_miss.inc();
        }
        let jwt = match Jwt::parse(&found.token) {
            Ok(jwt) => jwt,
            Err(status) => return status,
        };
        if found
            .issuers
            .as_ref()
            .is_some_and(|list| !list.contains(&jwt.iss.as_str()))
        {
            return Status::JwtUnknownIssuer;
        }
        let index = match mode {
            Mode::Provider(i, _) => Some(i),
            Mode::Allow { .. } => self.by_issuer(&jwt.iss),
        };
        let Some(index) = index else {
            return Status::JwtUnknownIssuer;
        };
        let p = &self.config.providers[index];
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let time = jwt.check_time(now.as_secs(), p.clock_skew);
        if time != Status::Ok {
            return time;
        }
        if let Some(max) = p.max_lifetime {
            let remaining =
                (jwt.exp != 0).then(|| std::time::Duration::from_secs(jwt.exp).saturating_sub(now));
            if remaining.is_none_or(|r| r >= max) {
                return Status::JwtVerificationFail;
            }
        }
        if p.subjects.as_ref().is_some_and(|m| !m.matches(&jwt.sub)) {
            return Status::JwtVerificationFail;
        }
        let audiences = match mode {
            Mode::Provider(_, Some(a)) => a,
            _ => &p.audiences,
        };
        if !audiences.allows(&jwt.audiences) {
            return Status::JwtAudienceNotAllowed;
        }
        let jwks = match &p.jwks {
            JwksSource::Local(jwks) => jwks.clone(),
            JwksSource::Remote(remote) => {
                let conn = req.conn;
                match self.remote_jwks(index, remote, &conn.shared.clusters).await {
                    Ok(jwks) => jwks,
                    Err(status) => return status,
                }
            }
        };
        let verified = jwks.verify(&jwt);
        if verified != Status::Ok {
            return verified;
        }
        forward(req, p, &jwt);
        write_metadata(req, p, &jwt);
        req.clear_route_cache |= p.clear_route_cache;
        if !p.forward {
            match found.place {
                Place::Header(h) => {
                    req.headers.remove(h);
                }
                Place::Param(name) => {
                    let path = without_param(req.new_path.as_deref().unwrap_or(req.path), name);
                    req.new_path = Some(path);
                }
                Place::Cookie => {}
            }
        }
        Status::Ok
    }

    /// The provider for a token of issuer `iss` under `allow_missing*`: the first with that
    /// issuer, else the first without one.
    fn by_issuer(&self, iss: &str) -> Option<usize> {
        let providers = &self.config.providers;
        providers
            .iter()
            .position(|p| p.issuer == iss)
            .or_else(|| providers.iter().position(|p| p.issuer.is_empty()))
    }

    /// Provider `index`'s remote JWKS: the cached set while fresh, else fetched anew.
    async fn remote_jwks(
        &self,
        index: usize,
        remote: &RemoteJwks,
        clusters: &ClusterManager,
    ) -> Result<Arc<Jwks>, Status> {
        let cached = self.remote[index]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((jwks, expires)) = cached
            && Instant::now() < expires
        {
            return Ok(jwks);
        }
        let Some(jwks) = fetch(clusters, remote).await else {
            self.stats.jwks_fetch_failed.inc();
            return Err(Status::JwksFetchFail);
        };
        self.stats.jwks_fetch_success.inc();
        let jwks = Arc::new(jwks);
        *self.remote[index].lock().unwrap_or_else(|e| e.into_inner()) =
            Some((jwks.clone(), Instant::now() + remote.cache_duration));
        Ok(jwks)
    }
}

/// Writes a verified token's payload and header where its provider's `*_in_metadata` say,
/// the `space_delimited_claims` of the payload split into lists of words.
fn write_metadata(req: &mut FilterRequest<'_>, p: &Provider, jwt: &Jwt) {
    if !p.payload_in_metadata.is_empty() {
        let mut payload = struct_from_json(&jwt.payload);
        for claim in &p.space_delimited_claims {
            if let Some(Value::String(words)) = jwt.payload.get(claim) {
                let words = words
                    .split(' ')
                    .filter(|w| !w.is_empty())
                    .map(|w| Value::String(w.to_owned()))
                    .collect();
                payload
                    .fields
                    .insert(claim.clone(), from_json(&Value::Array(words)));
            }
        }
        let payload = proto::pb::google::protobuf::Value {
            kind: Some(proto::pb::google::protobuf::value::Kind::StructValue(
                payload,
            )),
        };
        req.metadata
            .insert(NAMESPACE, &p.payload_in_metadata, payload);
    }
    if !p.header_in_metadata.is_empty() {
        let header = from_json(&Value::Object(jwt.header.clone()));
        req.metadata
            .insert(NAMESPACE, &p.header_in_metadata, header);
    }
}

/// Fetches a remote JWKS through its cluster: `None` when the fetch fails, the answer is
/// not a 200, or the set has no usable key.
async fn fetch(clusters: &ClusterManager, remote: &RemoteJwks) -> Option<Jwks> {
    let cluster = clusters.get(&remote.cluster)?;
    let path = remote
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let host = remote.uri.authority()?.as_str().to_owned();
    let req = http::Request::get(path)
        .header(http::header::HOST, host)
        .header("x-envoy-internal", "true")
        .body(crate::body::empty())
        .ok()?;
    let lb = LbContext {
        internal: true,
        ..LbContext::default()
    };
    let exchange = async {
        let resp = cluster.request(req, &lb).await.ok()?;
        if resp.status() != StatusCode::OK {
            return None;
        }
        Some(resp.into_body().collect().await.ok()?.to_bytes())
    };
    let body = tokio::time::timeout(remote.timeout, exchange)
        .await
        .ok()
        .flatten()?;
    Jwks::parse(&body).ok()
}

/// The tokens `providers` find in the request, in Envoy's order: headers (by name and
/// prefix), then query parameters, then cookies (each by name).
fn extract<'c>(req: &FilterRequest<'_>, providers: &[&'c Provider]) -> Vec<Found<'c>> {
    type Issuers<'c> = Option<Vec<&'c str>>;
    let add = |issuers: &mut Issuers<'c>, p: &'c Provider| {
        if p.issuer.is_empty() {
            *issuers = None;
        } else if let Some(list) = issuers {
            list.push(&p.issuer);
        }
    };
    let mut headers: BTreeMap<String, (&HeaderName, &str, Issuers<'c>)> = BTreeMap::new();
    let mut params: BTreeMap<&str, Issuers<'c>> = BTreeMap::new();
    let mut cookies: BTreeMap<&str, Issuers<'c>> = BTreeMap::new();
    for p in providers {
        for (name, prefix) in &p.locations.headers {
            let entry = headers
                .entry(format!("{}{prefix}", name.as_str()))
                .or_insert((name, prefix, Some(Vec::new())));
            add(&mut entry.2, p);
        }
        for name in &p.locations.params {
            add(params.entry(name).or_insert(Some(Vec::new())), p);
        }
        for name in &p.locations.cookies {
            add(cookies.entry(name).or_insert(Some(Vec::new())), p);
        }
    }
    let mut found = Vec::new();
    for (name, prefix, issuers) in headers.into_values() {
        for value in req.headers.get_all(name) {
            let value = String::from_utf8_lossy(value.as_bytes());
            let token = if prefix.is_empty() {
                &*value
            } else {
                let Some(at) = value.find(prefix) else {
                    continue;
                };
                token_after(&value, at + prefix.len())
            };
            found.push(Found {
                token: token.to_owned(),
                issuers: issuers.clone(),
                place: Place::Header(name),
            });
        }
    }
    if !params.is_empty() {
        let query = query_params(req.new_path.as_deref().unwrap_or(req.path));
        for (name, issuers) in params {
            if let Some(token) = query.get(name).and_then(|values| values.first()) {
                found.push(Found {
                    token: token.clone(),
                    issuers,
                    place: Place::Param(name),
                });
            }
        }
    }
    if !cookies.is_empty() {
        let route_req = req.route_request();
        for (name, issuers) in cookies {
            if let Some(token) = crate::route::policy::cookie(&route_req, name) {
                found.push(Found {
                    token: token.to_owned(),
                    issuers,
                    place: Place::Cookie,
                });
            }
        }
    }
    found
}

/// The query parameters of `path`, decoded, by name (Envoy's `QueryParamsMulti`).
fn query_params(path: &str) -> BTreeMap<String, Vec<String>> {
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let query = crate::route::matcher::query_of(path);
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let decode = |s| crate::route::matcher::percent_decode(s).into_owned();
        params.entry(decode(k)).or_default().push(decode(v));
    }
    params
}

/// `path` without query parameter `name`, its query rewritten as Envoy's
/// `replaceQueryString` writes it (decoded parameters, sorted by name).
fn without_param(path: &str, name: &str) -> String {
    let mut params = query_params(path);
    params.remove(name);
    let mut out = crate::route::matcher::strip_query(path).to_owned();
    let mut delim = '?';
    for (k, values) in &params {
        for v in values {
            out.push(delim);
            out.push_str(k);
            out.push('=');
            out.push_str(v);
            delim = '&';
        }
    }
    out
}

/// The token in a header value after its prefix: from the first base64url (or `.`)
/// character at or after `after`; the whole value when there is none.
fn token_after(value: &str, after: usize) -> &str {
    let is_token_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    match value[after..].find(is_token_char) {
        Some(i) => &value[after + i..],
        None => value,
    }
}

/// Adds the verified token's payload and claims as its provider asks.
fn forward(req: &mut FilterRequest<'_>, p: &Provider, jwt: &Jwt) {
    if let Some(h) = &p.forward_payload_header {
        let mut payload = jwt.payload_base64url.clone();
        if p.pad_forward_payload_header {
            while !payload.len().is_multiple_of(4) {
                payload.push('=');
            }
        }
        if let Ok(v) = HeaderValue::from_str(&payload) {
            req.headers.append(h, v);
        }
    }
    for (h, path) in &p.claim_to_headers {
        let mut value = None;
        let mut map = Some(&jwt.payload);
        for (i, key) in path.iter().enumerate() {
            let Some(v) = map.and_then(|m| m.get(key)) else {
                break;
            };
            if i + 1 == path.len() {
                value = Some(v);
            }
            map = v.as_object();
        }
        let text = match value {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => claim_number(n.as_f64().unwrap_or_default()),
            Some(Value::Bool(b)) => b.to_string(),
            _ => continue,
        };
        if !text.is_empty()
            && let Ok(v) = HeaderValue::from_str(&text)
        {
            req.headers.append(h, v);
        }
    }
}

/// A numeric claim as Envoy writes it: an integer when it is one, else `%f`.
fn claim_number(v: f64) -> String {
    if v >= 0.0 && v < u64::MAX as f64 && v.fract() == 0.0 {
        (v as u64).to_string()
    } else {
        format!("{v:.6}")
    }
}

/// Whether the request is a CORS preflight (`OPTIONS` with `origin` and
/// `access-control-request-method`).
fn is_cors_preflight(req: &FilterRequest<'_>) -> bool {
    let present = |n: &str| req.headers.get(n).is_some_and(|v| !v.is_empty());
    req.method == http::Method::OPTIONS
        && present("origin")
        && present("access-control-request-method")
}

/// The response code details of a denial: `jwt_authn_access_denied{<why, spaces as _>}`.
fn details(why: &str) -> String {
    format!("jwt_authn_access_denied{{{}}}", why.replace(' ', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_start_at_the_first_token_character_after_the_prefix() {
        assert_eq!(token_after("Bearer  abc.def.ghi", 7), "abc.def.ghi");
        assert_eq!(token_after("x Bearer !!", 9), "x Bearer !!");
    }

    #[test]
    fn a_removed_parameter_leaves_the_others_sorted() {
        assert_eq!(
            without_param("/p?z=1&access_token=t&a=%41", "access_token"),
            "/p?a=A&z=1"
        );
        assert_eq!(without_param("/p?access_token=t", "access_token"), "/p");
    }

    #[test]
    fn numeric_claims_as_envoy_writes_them() {
        assert_eq!(claim_number(42.0), "42");
        assert_eq!(claim_number(1.5), "1.500000");
        assert_eq!(claim_number(-3.0), "-3.000000");
    }
}
