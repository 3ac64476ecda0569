//! The HTTP connection manager's own header rules (Envoy's `mutateRequestHeaders` and
//! response counterpart): hop-by-hop removal, `x-forwarded-for`/`-proto`, `x-request-id`,
//! `x-envoy-internal`, `add_user_agent`'s headers, and the `server` header.

use bytes::Bytes;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};

use crate::config::hcm::{HcmConfig, ServerHeader, Underscores};
use crate::tls::PeerTls;
use crate::trace::LocalInfo;
use crate::wire::{has_token, strip_hop_by_hop};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `x-forwarded-proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static X_ENVOY_INTERNAL: HeaderName = HeaderName::from_static("x-envoy-internal");
static X_ENVOY_EXTERNAL_ADDRESS: HeaderName = HeaderName::from_static("x-envoy-external-address");
static X_ENVOY_DOWNSTREAM_SERVICE_CLUSTER: HeaderName =
    HeaderName::from_static("x-envoy-downstream-service-cluster");
static X_ENVOY_DOWNSTREAM_SERVICE_NODE: HeaderName =
    HeaderName::from_static("x-envoy-downstream-service-node");

/// `x-envoy-*` request headers Envoy removes from external (edge) requests.
const INTERNAL_ONLY: [&str; 19] = [
    "x-envoy-decorator-operation",
    "x-envoy-downstream-service-cluster",
    "x-envoy-downstream-service-node",
    "x-envoy-expected-rq-timeout-ms",
    "x-envoy-external-address",
    "x-envoy-force-trace",
    "x-envoy-hedge-on-per-try-timeout",
    "x-envoy-internal",
    "x-envoy-ip-tags",
    "x-envoy-max-retries",
    "x-envoy-retriable-header-names",
    "x-envoy-retriable-status-codes",
    "x-envoy-retry-grpc-on",
    "x-envoy-retry-on",
    "x-envoy-upstream-alt-stat-name",
    "x-envoy-upstream-rq-per-try-timeout-ms",
    "x-envoy-upstream-rq-timeout-alt-response",
    "x-envoy-upstream-rq-timeout-ms",
    "x-envoy-upstream-stream-duration-ms",
];

/// Of [`INTERNAL_ONLY`], those a request that is neither internal nor from the edge keeps
/// (checked against Envoy 1.40 without `use_remote_address`).
const KEPT_OFF_EDGE: [&str; 4] = [
    "x-envoy-decorator-operation",
    "x-envoy-downstream-service-cluster",
    "x-envoy-downstream-service-node",
    "x-envoy-external-address",
];

/// Facts about the downstream connection the header rules depend on.
#[derive(Debug, Clone)]
pub struct Downstream {
    /// The peer's address.
    pub peer: SocketAddr,
    /// The connection's certificates when it is TLS (`None`: plaintext).
    pub tls: Option<Arc<PeerTls>>,
}

/// What the request rules decided, for routing and logging.
#[derive(Debug, Clone)]
pub struct RequestFacts {
    /// The address Envoy considers the client's (peer or from `x-forwarded-for`).
    pub client: Option<IpAddr>,
    /// Whether the request counts as internal (per `internal_address_config`).
    pub internal: bool,
    /// The requested upgrade (`Upgrade` header with `Connection: upgrade`), allowed or not.
    pub upgrade: Option<HeaderValue>,
}

/// The machine's first non-loopback address of the peer's family, which Envoy appends to
/// `x-forwarded-for` instead of `127.0.0.1` / `::1` (Envoy's `getLocalAddress`).
fn local_machine_address(v4: bool) -> Option<IpAddr> {
    static CACHE: std::sync::OnceLock<(Option<IpAddr>, Option<IpAddr>)> =
        std::sync::OnceLock::new();
    let (a4, a6) = CACHE.get_or_init(|| {
        let (mut v4, mut v6) = (None, None);
        // SAFETY: getifaddrs allocates a list we walk read-only and free with freeifaddrs.
        unsafe {
            let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
            if libc::getifaddrs(&mut list) == 0 {
                let mut cur = list;
                while !cur.is_null() {
                    let addr = (*cur).ifa_addr;
                    if !addr.is_null() {
                        match i32::from((*addr).sa_family) {
                            libc::AF_INET if v4.is_none() => {
                                let sin = &*addr.cast::<libc::sockaddr_in>();
                                let ip =
                                    std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                                if !ip.is_loopback() {
                                    v4 = Some(IpAddr::V4(ip));
                                }
                            }
                            libc::AF_INET6 if v6.is_none() => {
                                let sin6 = &*addr.cast::<libc::sockaddr_in6>();
                                let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                                if !ip.is_loopback() && (ip.segments()[0] & 0xffc0) != 0xfe80 {
                                    v6 = Some(IpAddr::V6(ip));
                                }
                            }
                            _ => {}
                        }
                    }
                    cur = (*cur).ifa_next;
                }
                libc::freeifaddrs(list);
            }
        }
        (v4, v6)
    });
    if v4 { *a4 } else { *a6 }
}

/// The machine's address (`--local-address-ip-version` picks the family), as Envoy's local
/// info reports it.
pub fn machine_address() -> Option<IpAddr> {
    local_machine_address(!LOCAL_ADDRESS_V6.load(std::sync::atomic::Ordering::Relaxed))
}

/// `--local-address-ip-version v6`: the local address appended for loopback peers is IPv6.
pub static LOCAL_ADDRESS_V6: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Envoy's `isLoopbackAddress`: exactly `127.0.0.1` or `::1`.
fn is_exact_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == std::net::Ipv6Addr::LOCALHOST,
    }
}

/// Removes a response's connection-scoped headers. Envoy forwards the headers a response's
/// `connection` header names (only the header itself goes), so they stay.
fn strip_response_hop_by_hop(headers: &mut HeaderMap) {
    crate::wire::strip_connection_scoped(headers, false);
}

/// Whether any header name starts with `x-envoy-` (so the cleaning passes have work to do).
fn has_envoy_headers(headers: &HeaderMap) -> bool {
    headers.keys().any(|n| n.as_str().starts_with("x-envoy-"))
}

/// The n-th address from the right of `x-forwarded-for` (0 = rightmost).
fn xff_from_right(headers: &HeaderMap, n: usize) -> Option<IpAddr> {
    headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .rev()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.rsplit(','))
        .map(str::trim)
        .nth(n)
        .and_then(|a| a.parse().ok())
}

/// A fresh UUID v4 for `x-request-id`. It is marked sensitive, which HTTP/2 sends as an HPACK
/// literal that is never indexed: a value that never repeats gains nothing from the dynamic
/// table, and inserting one per request evicted the entries that do repeat (HTTP/2 80.1k ->
/// 76.9k instructions per request under callgrind). HTTP/1 ignores the flag.
fn new_request_id() -> HeaderValue {
    /// Where each byte's two hex digits go in `8-4-4-4-12`.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = rand::random::<u128>().to_le_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut out = *b"00000000-0000-0000-0000-000000000000";
    for (byte, at) in b.into_iter().zip(AT) {
        out[at] = HEX[usize::from(byte >> 4)];
        out[at + 1] = HEX[usize::from(byte & 0x0f)];
    }
    // SAFETY: not a memory-safety contract: `HeaderValue` requires visible ASCII, and the value
    // is hex digits and dashes.
    let mut id = unsafe { HeaderValue::from_maybe_shared_unchecked(Bytes::copy_from_slice(&out)) };
    id.set_sensitive(true);
    id
}

/// Applies the connection manager's request rules to `headers` (`local`: the proxy's node,
/// for `add_user_agent`).
pub fn mutate_request(
    cfg: &HcmConfig,
    down: &Downstream,
    local: &LocalInfo,
    headers: &mut HeaderMap,
) -> RequestFacts {
    let upgrade = upgrade_requested(headers);
    strip_hop_by_hop(headers);
    append_via(cfg, headers);
    super::xfcc::mutate(cfg.forward_client_cert, down.tls.as_deref(), headers);
    if cfg.underscores == Underscores::Drop {
        let named: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().contains('_'))
            .cloned()
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    if headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
    {
        // The connection manager answers `100 Continue` itself (hyper does, when the body is read).
        headers.remove(header::EXPECT);
    }
    let scheme = if down.tls.is_some() { "https" } else { "http" };
    let peer = down.peer.ip();
    let (client, internal) = if cfg.use_remote_address {
        let hops = cfg.xff_num_trusted_hops as usize;
        let remote = if hops > 0 {
            xff_from_right(headers, hops - 1).unwrap_or(peer)
        } else {
            peer
        };
        if !cfg.skip_xff_append {
            let appended = if is_exact_loopback(peer) {
                local_machine_address(!LOCAL_ADDRESS_V6.load(std::sync::atomic::Ordering::Relaxed))
                    .unwrap_or(peer)
            } else {
                peer
            };
            append_xff(headers, appended);
        }
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
        let internal = cfg.internal_ranges.iter().any(|c| c.contains(remote));
        if internal {
            headers.insert(&X_ENVOY_INTERNAL, HeaderValue::from_static("true"));
        } else {
            if has_envoy_headers(headers) {
                for h in INTERNAL_ONLY {
                    headers.remove(h);
                }
            }
            if let Ok(v) = HeaderValue::from_str(&remote.to_string()) {
                headers.insert(&X_ENVOY_EXTERNAL_ADDRESS, v);
            }
        }
        (Some(remote), internal)
    } else {
        headers
            .entry(&X_FORWARDED_PROTO)
            .or_insert(HeaderValue::from_static(scheme));
        let client = xff_from_right(headers, cfg.xff_num_trusted_hops as usize);
        // Without the remote address, only an address taken from x-forwarded-for can make a
        // request internal (Envoy 1.40 trusts no peer address here).
        let internal = client.is_some_and(|c| cfg.internal_ranges.iter().any(|r| r.contains(c)));
        if internal {
            headers.insert(&X_ENVOY_INTERNAL, HeaderValue::from_static("true"));
        } else {
            if has_envoy_headers(headers) {
                for h in INTERNAL_ONLY.iter().filter(|h| !KEPT_OFF_EDGE.contains(h)) {
                    headers.remove(*h);
                }
            }
        }
        (client, internal)
    };
    if cfg.add_user_agent {
        add_user_agent(local, headers);
    }
    let edge_external = cfg.use_remote_address && !internal;
    if cfg.generate_request_id {
        match headers.entry(&X_REQUEST_ID) {
            Entry::Vacant(e) => {
                e.insert(new_request_id());
            }
            Entry::Occupied(mut e) if edge_external && !cfg.preserve_external_request_id => {
                e.insert(new_request_id());
            }
            Entry::Occupied(_) => {}
        }
    }
    RequestFacts {
        client,
        internal,
        upgrade,
    }
}

/// `add_user_agent`, after the internal headers are cleaned as in Envoy: the proxy's cluster
/// (empty when unset, as Envoy sends it) replaces `x-envoy-downstream-service-cluster` and
/// becomes the `user-agent` of a request with none or an empty one; its node id, when set,
/// replaces `x-envoy-downstream-service-node`.
fn add_user_agent(local: &LocalInfo, headers: &mut HeaderMap) {
    let Some(cluster) = &local.cluster_header else {
        return;
    };
    if headers
        .get(header::USER_AGENT)
        .is_none_or(HeaderValue::is_empty)
    {
        headers.insert(header::USER_AGENT, cluster.clone());
    }
    headers.insert(&X_ENVOY_DOWNSTREAM_SERVICE_CLUSTER, cluster.clone());
    if let Some(node) = &local.node_header {
        headers.insert(&X_ENVOY_DOWNSTREAM_SERVICE_NODE, node.clone());
    }
}

/// Restores the upgrade headers on a request the route allows to upgrade.
pub fn set_upgrade(headers: &mut HeaderMap, upgrade: &HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, upgrade.clone());
}

fn append_xff(headers: &mut HeaderMap, ip: IpAddr) {
    let value = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(existing) if !existing.is_empty() => format!("{existing},{ip}"),
        _ => ip.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(&X_FORWARDED_FOR, v);
    }
}

/// The upgrade a request asks for. `h2c` is not one: like Envoy, such a request is served as
/// plain HTTP/1.1, and its `http2-settings` header is dropped with the upgrade headers.
fn upgrade_requested(headers: &mut HeaderMap) -> Option<HeaderValue> {
    let conn_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v.as_bytes(), b"upgrade"));
    let upgrade = conn_upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten()?;
    if upgrade.as_bytes().eq_ignore_ascii_case(b"h2c") {
        headers.remove(HTTP2_SETTINGS);
        return None;
    }
    Some(upgrade)
}

/// The settings of an `Upgrade: h2c` request (RFC 7540 section 3.2.1).
const HTTP2_SETTINGS: &str = "http2-settings";

/// Removes a response's hop-by-hop headers (keeping `upgrade` on a `101` when asked). The
/// `server` header is the connection manager's last step ([`set_server`]), after route rules.
pub fn mutate_response(headers: &mut HeaderMap, keep_upgrade: bool) {
    let upgrade = keep_upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten();
    strip_response_hop_by_hop(headers);
    if let Some(u) = upgrade {
        set_upgrade(headers, &u);
    }
}

/// Appends the connection manager's `via` value to the `via` header, as Envoy does:
/// `<existing>, <via>`.
fn append_via(cfg: &HcmConfig, headers: &mut HeaderMap) {
    let Some(via) = &cfg.via else { return };
    let value = match headers.get(header::VIA).filter(|v| !v.is_empty()) {
        Some(existing) => {
            let mut joined = existing.as_bytes().to_vec();
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(via.as_bytes());
            HeaderValue::from_bytes(&joined).unwrap_or_else(|_| via.clone())
        }
        None => via.clone(),
    };
    headers.insert(header::VIA, value);
}

/// The connection manager's last response rules: `server` per `server_header_transformation`,
/// then its `via` appended.
pub fn set_server(cfg: &HcmConfig, headers: &mut HeaderMap) {
    append_via(cfg, headers);
    let value = || cfg.server_name.clone();
    match cfg.server_header {
        ServerHeader::Overwrite => {
            headers.insert(header::SERVER, value());
        }
        ServerHeader::AppendIfAbsent => {
            if !headers.contains_key(header::SERVER) {
                headers.insert(header::SERVER, value());
            }
        }
        ServerHeader::PassThrough => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xff_picks_trusted_hop_from_the_right() {
        let mut h = HeaderMap::new();
        h.insert(
            &X_FORWARDED_FOR,
            HeaderValue::from_static("1.1.1.1, 2.2.2.2,3.3.3.3"),
        );
        assert_eq!(xff_from_right(&h, 0), Some("3.3.3.3".parse().unwrap()));
        assert_eq!(xff_from_right(&h, 2), Some("1.1.1.1".parse().unwrap()));
        assert_eq!(xff_from_right(&h, 3), None);
        h.append(&X_FORWARDED_FOR, HeaderValue::from_static("4.4.4.4"));
        assert_eq!(xff_from_right(&h, 0), Some("4.4.4.4".parse().unwrap()));
        assert_eq!(xff_from_right(&h, 1), Some("3.3.3.3".parse().unwrap()));
        assert_eq!(xff_from_right(&h, 3), Some("1.1.1.1".parse().unwrap()));
    }

    #[test]
    fn hop_by_hop_goes_te_trailers_stays() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-foo"),
        );
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert("x-bar", HeaderValue::from_static("2"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert_eq!(h[header::TE], "trailers");
        assert_eq!(h["x-bar"], "2");
    }

    #[test]
    fn te_keeps_only_trailers_whatever_its_shape() {
        let strip = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::TE, HeaderValue::from_static(v));
            }
            h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
            strip_hop_by_hop(&mut h);
            assert!(h.get(header::UPGRADE).is_none());
            h.get_all(header::TE).iter().cloned().collect::<Vec<_>>()
        };
        assert_eq!(strip(&["trailers"]), ["trailers"]);
        assert_eq!(strip(&["trailers", "gzip"]), ["trailers"]);
        assert_eq!(strip(&["gzip", "Trailers"]), ["trailers"]);
        assert!(strip(&["gzip"]).is_empty());
    }

    #[test]
    fn request_ids_are_uuid_v4() {
        let id = new_request_id();
        let s = id.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "4");
        assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(new_request_id(), id);
        assert!(id.is_sensitive(), "kept out of the HPACK dynamic table");
        let ids: Vec<Vec<u8>> = (0..64)
            .map(|_| new_request_id().as_bytes().to_vec())
            .collect();
        for (i, _) in s.char_indices() {
            let seen: std::collections::HashSet<u8> = ids.iter().map(|id| id[i]).collect();
            match i {
                8 | 13 | 18 | 23 => assert_eq!(seen, [b'-'].into(), "dash at {i}"),
                14 => assert_eq!(seen, [b'4'].into(), "version nibble"),
                _ => {
                    assert!(
                        seen.iter()
                            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                    );
                    assert!(seen.len() > 1, "position {i} is random");
                }
            }
        }
    }
}
