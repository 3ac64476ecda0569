//! Envoy's substitution formatters (`%COMMAND(PARAM):LENGTH%`) in header values: parsing
//! with Envoy's validation messages, and rendering against the facts of one stream.

pub(crate) mod clock;
pub(crate) mod scan;

use std::net::SocketAddr;
use std::time::SystemTime;

use http::HeaderMap;

/// What a template takes from the machine it is compiled for: `%ENVIRONMENT(NAME)%` and
/// `%HOSTNAME%` are resolved once, when the template is parsed, as in Envoy.
pub trait Machine {
    /// The value of environment variable `name`, when it is set.
    fn env(&self, name: &str) -> Option<String>;
    /// This machine's host name.
    fn hostname(&self) -> String;
}

/// A compiled header value template: literal text and formatters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Piece>);

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text (including values fixed at configuration time: `ENVIRONMENT`).
    Text(String),
    /// A stream fact that takes no parameter.
    Fact(Fact),
    /// `%HOSTNAME%`: this machine's host name, read when the configuration was compiled.
    Hostname(String),
    /// `%REQ(h?alt):n%`: a request header.
    RequestHeader(HeaderLookup),
    /// `%RESP(h?alt):n%`: a response header.
    ResponseHeader(HeaderLookup),
    /// `%START_TIME(format)%`, with the format (default Envoy's ISO 8601 with milliseconds).
    StartTime(String),
    /// `%DOWNSTREAM_PEER_CERT_V_START(format)%`.
    PeerCertStart(String),
    /// `%DOWNSTREAM_PEER_CERT_V_END(format)%`.
    PeerCertEnd(String),
    /// `%REQUESTED_SERVER_NAME(mode)%`.
    RequestedServerName(SniMode),
    /// `%DYNAMIC_METADATA(NS:KEY...):n%`: the request's metadata (a string as is, anything
    /// else as JSON; the whole namespace without keys), empty when missing.
    DynamicMetadata {
        /// The namespace.
        namespace: String,
        /// The keys into it.
        path: Vec<String>,
        /// Truncate the value to this many bytes.
        max_length: Option<usize>,
    },
    /// A formatter Envoy accepts whose value revoy never has (`UPSTREAM_METADATA`): renders
    /// empty, like Envoy without that metadata.
    Empty,
}

/// Where `%REQUESTED_SERVER_NAME%` takes its value from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SniMode {
    /// `SNI_ONLY` (default): the TLS SNI.
    SniOnly,
    /// `SNI_FIRST`: the SNI, else the request's host.
    SniFirst,
    /// `HOST_FIRST`: the request's host, else the SNI.
    HostFirst,
}

/// The header (and fallback) a `REQ`/`RESP` formatter reads, and its maximum length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderLookup {
    /// Main header, lower-cased (`:path` and other pseudo-headers included).
    pub name: String,
    /// Alternative used when the main header is absent.
    pub fallback: Option<String>,
    /// Truncate the value to this many bytes.
    pub max_length: Option<usize>,
}

/// Stream facts substituted by parameterless formatters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// `DOWNSTREAM_REMOTE_ADDRESS`.
    DownstreamRemoteAddress,
    /// `DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT`.
    DownstreamRemoteAddressWithoutPort,
    /// `DOWNSTREAM_REMOTE_PORT`.
    DownstreamRemotePort,
    /// `DOWNSTREAM_DIRECT_REMOTE_ADDRESS`.
    DownstreamDirectRemoteAddress,
    /// `DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT`.
    DownstreamDirectRemoteAddressWithoutPort,
    /// `DOWNSTREAM_DIRECT_REMOTE_PORT`.
    DownstreamDirectRemotePort,
    /// `DOWNSTREAM_LOCAL_ADDRESS`.
    DownstreamLocalAddress,
    /// `DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT`.
    DownstreamLocalAddressWithoutPort,
    /// `DOWNSTREAM_LOCAL_PORT`.
    DownstreamLocalPort,
    /// `UPSTREAM_HOST`.
    UpstreamHost,
    /// `UPSTREAM_REMOTE_ADDRESS`.
    UpstreamRemoteAddress,
    /// `UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT`.
    UpstreamRemoteAddressWithoutPort,
    /// `UPSTREAM_REMOTE_PORT`.
    UpstreamRemotePort,
    /// `UPSTREAM_LOCAL_ADDRESS`.
    UpstreamLocalAddress,
    /// `UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT`.
    UpstreamLocalAddressWithoutPort,
    /// `UPSTREAM_LOCAL_PORT`.
    UpstreamLocalPort,
    /// `UPSTREAM_CLUSTER`.
    UpstreamCluster,
    /// `UPSTREAM_TRANSPORT_FAILURE_REASON`.
    UpstreamTransportFailureReason,
    /// `PROTOCOL`.
    Protocol,
    /// `RESPONSE_CODE` (`0` before a response code is known).
    ResponseCode,
    /// `RESPONSE_FLAGS` (`-` when none).
    ResponseFlags,
    /// A downstream TLS fact (`DOWNSTREAM_PEER_*`, `DOWNSTREAM_LOCAL_*` SANs/subject,
    /// `DOWNSTREAM_TLS_*`).
    Tls(TlsField),
}

/// Downstream TLS facts a formatter can read from [`TlsFacts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsField {
    /// `DOWNSTREAM_TLS_VERSION`.
    Version,
    /// `DOWNSTREAM_TLS_CIPHER`.
    Cipher,
    /// `DOWNSTREAM_TLS_SESSION_ID`.
    SessionId,
    /// `DOWNSTREAM_PEER_URI_SAN`.
    PeerUriSan,
    /// `DOWNSTREAM_PEER_DNS_SAN`.
    PeerDnsSan,
    /// `DOWNSTREAM_PEER_IP_SAN`.
    PeerIpSan,
    /// `DOWNSTREAM_PEER_EMAIL_SAN`.
    PeerEmailSan,
    /// `DOWNSTREAM_PEER_OTHERNAME_SAN`.
    PeerOthernameSan,
    /// `DOWNSTREAM_PEER_SUBJECT`.
    PeerSubject,
    /// `DOWNSTREAM_PEER_ISSUER`.
    PeerIssuer,
    /// `DOWNSTREAM_PEER_SERIAL`.
    PeerSerial,
    /// `DOWNSTREAM_PEER_FINGERPRINT_256`.
    PeerFingerprint256,
    /// `DOWNSTREAM_PEER_FINGERPRINT_1`.
    PeerFingerprint1,
    /// `DOWNSTREAM_PEER_CERT` (URL-encoded PEM).
    PeerCert,
    /// `DOWNSTREAM_PEER_CHAIN_FINGERPRINTS_256`.
    PeerChainFingerprints256,
    /// `DOWNSTREAM_PEER_CHAIN_FINGERPRINTS_1`.
    PeerChainFingerprints1,
    /// `DOWNSTREAM_PEER_CHAIN_SERIALS`.
    PeerChainSerials,
    /// `DOWNSTREAM_LOCAL_URI_SAN`.
    LocalUriSan,
    /// `DOWNSTREAM_LOCAL_DNS_SAN`.
    LocalDnsSan,
    /// `DOWNSTREAM_LOCAL_IP_SAN`.
    LocalIpSan,
    /// `DOWNSTREAM_LOCAL_EMAIL_SAN`.
    LocalEmailSan,
    /// `DOWNSTREAM_LOCAL_OTHERNAME_SAN`.
    LocalOthernameSan,
    /// `DOWNSTREAM_LOCAL_SUBJECT`.
    LocalSubject,
}

/// One certificate's facts, as Envoy renders them (lists are joined with `,`).
#[derive(Debug, Clone, Default)]
pub struct CertFacts {
    /// URI SANs.
    pub uri_san: Vec<String>,
    /// DNS SANs.
    pub dns_san: Vec<String>,
    /// IP SANs.
    pub ip_san: Vec<String>,
    /// Email SANs.
    pub email_san: Vec<String>,
    /// OtherName SANs.
    pub othername_san: Vec<String>,
    /// Subject in RFC 2253 form.
    pub subject: String,
    /// Issuer in RFC 2253 form (peer only).
    pub issuer: String,
    /// Serial number, lower-case hex (peer only).
    pub serial: String,
    /// SHA-256 fingerprint, lower-case hex (peer only).
    pub fingerprint_256: String,
    /// SHA-1 fingerprint, lower-case hex (peer only).
    pub fingerprint_1: String,
    /// The certificate as URL-encoded PEM (peer only).
    pub pem_url_encoded: String,
    /// `notBefore` (peer only).
    pub not_before: Option<SystemTime>,
    /// `notAfter` (peer only).
    pub not_after: Option<SystemTime>,
    /// SHA-256 fingerprints of the whole presented chain (peer only).
    pub chain_fingerprints_256: Vec<String>,
    /// SHA-1 fingerprints of the whole presented chain (peer only).
    pub chain_fingerprints_1: Vec<String>,
    /// Serial numbers of the whole presented chain (peer only).
    pub chain_serials: Vec<String>,
}

/// The downstream TLS connection's facts; built once per connection by the listener.
#[derive(Debug, Clone, Default)]
pub struct TlsFacts {
    /// `TLSv1.2`, `TLSv1.3`.
    pub version: String,
    /// IANA cipher suite name (`TLS_AES_128_GCM_SHA256`).
    pub cipher: String,
    /// Session id, lower-case hex (empty when none).
    pub session_id: String,
    /// The client certificate (all empty when none was presented).
    pub peer: CertFacts,
    /// This listener's own certificate.
    pub local: CertFacts,
}

/// Connection and stream facts that formatters substitute. A fact left `None` renders as
/// Envoy renders a missing value (empty; `0` for `RESPONSE_CODE`, `-` for `RESPONSE_FLAGS`).
#[derive(Debug, Clone, Default)]
pub struct FormatContext<'a> {
    /// `DOWNSTREAM_REMOTE_ADDRESS*`: the downstream client address (the trusted
    /// `x-forwarded-for` address when the connection manager uses it, else the peer).
    pub downstream_remote: Option<SocketAddr>,
    /// `DOWNSTREAM_LOCAL_ADDRESS*`, `DOWNSTREAM_LOCAL_PORT`: the local address the downstream
    /// connection arrived on (the original destination for redirected connections).
    pub downstream_local: Option<SocketAddr>,
    /// `REQ(...)` while formatting response headers: the downstream request's headers. Not
    /// used for request headers, where `REQ` reads the headers being mutated.
    pub request_headers: Option<&'a HeaderMap>,
    /// `PROTOCOL`: the downstream protocol, `HTTP/1.0`, `HTTP/1.1`, `HTTP/2`, `HTTP/3`.
    pub protocol: Option<&'a str>,
    /// `HOSTNAME` override; `None` uses this machine's host name (what Envoy reports).
    pub hostname: Option<&'a str>,
    /// `UPSTREAM_CLUSTER`: the chosen upstream cluster's name.
    pub upstream_cluster: Option<&'a str>,
    /// `UPSTREAM_HOST`: the upstream host the request went to (the last attempt's), named by
    /// its endpoint's `address`.
    pub upstream_host: Option<SocketAddr>,
    /// `UPSTREAM_REMOTE_ADDRESS*`: the address the last attempt's connection reached (the
    /// host's own, or another of its addresses).
    pub upstream_remote: Option<SocketAddr>,
    /// `DOWNSTREAM_DIRECT_REMOTE_ADDRESS*`: the TCP peer of the downstream connection,
    /// regardless of `x-forwarded-for`. `None` falls back to `downstream_remote`.
    pub downstream_direct_remote: Option<SocketAddr>,
    /// `REQ(:method)`: the request method.
    pub request_method: Option<&'a str>,
    /// `REQ(:scheme)`: the request scheme (`http`, `https`).
    pub request_scheme: Option<&'a str>,
    /// `REQ(:authority)` / `REQ(host)`: the request's host as received (before rewrites).
    pub request_authority: Option<&'a str>,
    /// `REQ(:path)`: the request's path and query as received (before rewrites).
    pub request_path: Option<&'a str>,
    /// `RESPONSE_CODE`: the stream's response code once known. Envoy sets it when the
    /// upstream response headers arrive (and for local replies other than
    /// `direct_response`, whose header mutations still see 0).
    pub response_code: Option<u16>,
    /// `RESP(:status)` while formatting response headers: the status of the response being
    /// mutated (set for direct responses too).
    pub response_status: Option<u16>,
    /// `RESPONSE_FLAGS`: Envoy's short flags (`UF,URX`); `None` or empty renders `-`.
    pub response_flags: Option<&'a str>,
    /// `START_TIME`: when the downstream request started.
    pub start_time: Option<SystemTime>,
    /// `REQUESTED_SERVER_NAME`: the downstream TLS SNI.
    pub requested_server_name: Option<&'a str>,
    /// `UPSTREAM_LOCAL_ADDRESS*`, `UPSTREAM_LOCAL_PORT`: the local address of the upstream
    /// connection.
    pub upstream_local: Option<SocketAddr>,
    /// `UPSTREAM_TRANSPORT_FAILURE_REASON`: why the upstream connection failed (TLS errors).
    pub upstream_transport_failure_reason: Option<&'a str>,
    /// `DOWNSTREAM_PEER_*`, `DOWNSTREAM_LOCAL_*_SAN`, `DOWNSTREAM_LOCAL_SUBJECT`,
    /// `DOWNSTREAM_TLS_*`: the downstream TLS facts; `None` on plaintext connections.
    pub downstream_tls: Option<&'a TlsFacts>,
    /// `DYNAMIC_METADATA`: the request's dynamic metadata, once its filters ran.
    pub dynamic_metadata: Option<&'a crate::route::metadata::DynamicMetadata>,
}

/// Which header map a template is rendered into; decides what `REQ` and `RESP` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Request headers: `REQ` reads the headers being mutated, `RESP` is empty.
    Request,
    /// Response headers: `RESP` reads the headers being mutated, `REQ` the context's.
    Response,
}

impl Template {
    /// Parses a header value with Envoy's grammar: `%%` is a literal `%`; a command is
    /// `%NAME%`, `%NAME(param)%` or `%NAME(param):length%`. Errors carry Envoy's message.
    /// `machine` answers `%ENVIRONMENT(..)%` and `%HOSTNAME%`.
    pub fn parse(value: &str, machine: &dyn Machine) -> Result<Template, String> {
        let mut pieces = scan::scan(value, Piece::Text, |command| {
            Ok(match command.compile(machine)? {
                Piece::Text(t) => scan::Compiled::Text(t),
                piece => scan::Compiled::Piece(piece),
            })
        })?;
        if pieces.is_empty() {
            pieces.push(Piece::Text(String::new()));
        }
        Ok(Template(pieces))
    }

    /// The pieces in order.
    pub fn pieces(&self) -> &[Piece] {
        &self.0
    }

    /// The value when the template has no formatter.
    pub fn literal(&self) -> Option<&str> {
        match self.0.as_slice() {
            [Piece::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// Renders the template; `own` is the header map being mutated (see [`Direction`]).
    pub fn render(&self, own: &HeaderMap, ctx: &FormatContext<'_>, dir: Direction) -> String {
        if let Some(t) = self.literal() {
            return t.to_owned();
        }
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Fact(f) => render_fact(&mut out, *f, ctx),
                Piece::Hostname(h) => out.push_str(ctx.hostname.unwrap_or(h)),
                Piece::RequestHeader(l) => {
                    let headers = match dir {
                        Direction::Request => Some(own),
                        Direction::Response => ctx.request_headers,
                    };
                    let value = l.find(|name| request_header(name, headers, ctx));
                    push_truncated(&mut out, value, l.max_length);
                }
                Piece::ResponseHeader(l) => {
                    if dir == Direction::Response {
                        let status = ctx.response_status.map(|c| c.to_string());
                        let value = l.find(|name| match name {
                            ":status" => status.as_deref(),
                            _ => own.get(name)?.to_str().ok(),
                        });
                        push_truncated(&mut out, value, l.max_length);
                    }
                }
                Piece::StartTime(f) => {
                    if let Some(t) = ctx.start_time {
                        out.push_str(&clock::format(t, f));
                    }
                }
                Piece::PeerCertStart(f) => {
                    if let Some(t) = ctx.downstream_tls.and_then(|t| t.peer.not_before) {
                        out.push_str(&clock::format(t, f));
                    }
                }
                Piece::PeerCertEnd(f) => {
                    if let Some(t) = ctx.downstream_tls.and_then(|t| t.peer.not_after) {
                        out.push_str(&clock::format(t, f));
                    }
                }
                Piece::RequestedServerName(mode) => {
                    let sni = ctx.requested_server_name.filter(|s| !s.is_empty());
                    let host = ctx.request_authority.filter(|s| !s.is_empty());
                    let value = match mode {
                        SniMode::SniOnly => sni,
                        SniMode::SniFirst => sni.or(host),
                        SniMode::HostFirst => host.or(sni),
                    };
                    out.push_str(value.unwrap_or(""));
                }
                Piece::DynamicMetadata {
                    namespace,
                    path,
                    max_length,
                } => {
                    let value = ctx.dynamic_metadata.and_then(|m| {
                        if path.is_empty() {
                            m.namespace(namespace)
                                .map(crate::route::metadata::json::struct_json)
                        } else {
                            m.value(namespace, path)
                                .map(crate::route::metadata::json::text)
                        }
                    });
                    push_truncated(&mut out, value.as_deref(), *max_length);
                }
                Piece::Empty => {}
            }
        }
        out
    }
}

impl HeaderLookup {
    fn find<'h>(&self, get: impl Fn(&str) -> Option<&'h str>) -> Option<&'h str> {
        get(&self.name).or_else(|| self.fallback.as_deref().and_then(&get))
    }
}

fn request_header<'h>(
    name: &str,
    headers: Option<&'h HeaderMap>,
    ctx: &FormatContext<'h>,
) -> Option<&'h str> {
    match name {
        ":method" => ctx.request_method,
        ":scheme" => ctx.request_scheme,
        ":path" => ctx.request_path,
        ":authority" | "host" => ctx
            .request_authority
            .or_else(|| headers?.get(http::header::HOST)?.to_str().ok()),
        _ => headers?.get(name)?.to_str().ok(),
    }
}

fn push_truncated(out: &mut String, value: Option<&str>, max: Option<usize>) {
    let Some(mut v) = value else { return };
    if let Some(max) = max
        && v.len() > max
    {
        let mut end = max;
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        v = &v[..end];
    }
    out.push_str(v);
}

fn push_addr(out: &mut String, addr: Option<SocketAddr>, part: AddrPart) {
    use std::fmt::Write;
    let Some(a) = addr else { return };
    let _ = match part {
        AddrPart::Full => write!(out, "{a}"),
        AddrPart::Ip => write!(out, "{}", a.ip()),
        AddrPart::Port => write!(out, "{}", a.port()),
    };
}

#[derive(Clone, Copy)]
enum AddrPart {
    Full,
    Ip,
    Port,
}

fn render_fact(out: &mut String, fact: Fact, ctx: &FormatContext<'_>) {
    use AddrPart::{Full, Ip, Port};
    let direct = ctx.downstream_direct_remote.or(ctx.downstream_remote);
    match fact {
        Fact::DownstreamRemoteAddress => push_addr(out, ctx.downstream_remote, Full),
        Fact::DownstreamRemoteAddressWithoutPort => push_addr(out, ctx.downstream_remote, Ip),
        Fact::DownstreamRemotePort => push_addr(out, ctx.downstream_remote, Port),
        Fact::DownstreamDirectRemoteAddress => push_addr(out, direct, Full),
        Fact::DownstreamDirectRemoteAddressWithoutPort => push_addr(out, direct, Ip),
        Fact::DownstreamDirectRemotePort => push_addr(out, direct, Port),
        Fact::DownstreamLocalAddress => push_addr(out, ctx.downstream_local, Full),
        Fact::DownstreamLocalAddressWithoutPort => push_addr(out, ctx.downstream_local, Ip),
        Fact::DownstreamLocalPort => push_addr(out, ctx.downstream_local, Port),
        Fact::UpstreamHost => push_addr(out, ctx.upstream_host, Full),
        Fact::UpstreamRemoteAddress => push_addr(out, ctx.upstream_remote, Full),
        Fact::UpstreamRemoteAddressWithoutPort => push_addr(out, ctx.upstream_remote, Ip),
        Fact::UpstreamRemotePort => push_addr(out, ctx.upstream_remote, Port),
        Fact::UpstreamLocalAddress => push_addr(out, ctx.upstream_local, Full),
        Fact::UpstreamLocalAddressWithoutPort => push_addr(out, ctx.upstream_local, Ip),
        Fact::UpstreamLocalPort => push_addr(out, ctx.upstream_local, Port),
        Fact::UpstreamCluster => out.push_str(ctx.upstream_cluster.unwrap_or("")),
        Fact::UpstreamTransportFailureReason => {
            out.push_str(ctx.upstream_transport_failure_reason.unwrap_or(""))
        }
        Fact::Protocol => out.push_str(ctx.protocol.unwrap_or("")),
        Fact::ResponseCode => {
            use std::fmt::Write;
            let _ = write!(out, "{}", ctx.response_code.unwrap_or(0));
        }
        Fact::ResponseFlags => {
            out.push_str(ctx.response_flags.filter(|f| !f.is_empty()).unwrap_or("-"))
        }
        Fact::Tls(field) => {
            if let Some(tls) = ctx.downstream_tls {
                render_tls(out, field, tls);
            }
        }
    }
}

fn render_tls(out: &mut String, field: TlsField, tls: &TlsFacts) {
    let (peer, local) = (&tls.peer, &tls.local);
    let list: &[String] = match field {
        TlsField::Version => return out.push_str(&tls.version),
        TlsField::Cipher => return out.push_str(&tls.cipher),
        TlsField::SessionId => return out.push_str(&tls.session_id),
        TlsField::PeerSubject => return out.push_str(&peer.subject),
        TlsField::PeerIssuer => return out.push_str(&peer.issuer),
        TlsField::PeerSerial => return out.push_str(&peer.serial),
        TlsField::PeerFingerprint256 => return out.push_str(&peer.fingerprint_256),
        TlsField::PeerFingerprint1 => return out.push_str(&peer.fingerprint_1),
        TlsField::PeerCert => return out.push_str(&peer.pem_url_encoded),
        TlsField::LocalSubject => return out.push_str(&local.subject),
        TlsField::PeerUriSan => &peer.uri_san,
        TlsField::PeerDnsSan => &peer.dns_san,
        TlsField::PeerIpSan => &peer.ip_san,
        TlsField::PeerEmailSan => &peer.email_san,
        TlsField::PeerOthernameSan => &peer.othername_san,
        TlsField::PeerChainFingerprints256 => &peer.chain_fingerprints_256,
        TlsField::PeerChainFingerprints1 => &peer.chain_fingerprints_1,
        TlsField::PeerChainSerials => &peer.chain_serials,
        TlsField::LocalUriSan => &local.uri_san,
        TlsField::LocalDnsSan => &local.dns_san,
        TlsField::LocalIpSan => &local.ip_san,
        TlsField::LocalEmailSan => &local.email_san,
        TlsField::LocalOthernameSan => &local.othername_san,
    };
    for (i, v) in list.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(v);
    }
}

impl scan::Command<'_> {
    fn compile(&self, machine: &dyn Machine) -> Result<Piece, String> {
        let name = self.name;
        let no_length = || match self.length {
            Some(_) => Err(format!("{name} does not allow length to be specified.")),
            None => Ok(()),
        };
        let required = || match self.param {
            Some(p) if !p.is_empty() => Ok(p),
            _ => Err(format!("{name} requires parameters")),
        };
        let time_format = || {
            self.param
                .filter(|p| !p.is_empty())
                .unwrap_or(clock::DEFAULT_FORMAT)
        };
        Ok(match name {
            "REQ" | "RESP" => {
                let param = required()?;
                let mut alternatives = param.split('?');
                let main = alternatives.next().unwrap_or_default();
                let fallback = alternatives.next();
                if alternatives.next().is_some() {
                    return Err(format!(
                        "More than 1 alternative header specified in token: {param}"
                    ));
                }
                let lookup = HeaderLookup {
                    name: main.to_ascii_lowercase(),
                    fallback: fallback.map(str::to_ascii_lowercase),
                    max_length: self.length,
                };
                if name == "REQ" {
                    Piece::RequestHeader(lookup)
                } else {
                    Piece::ResponseHeader(lookup)
                }
            }
            "ENVIRONMENT" => {
                let key = required()?;
                let value = machine.env(key).unwrap_or_else(|| "-".to_owned());
                let mut out = String::new();
                push_truncated(&mut out, Some(&value), self.length);
                Piece::Text(out)
            }
            "START_TIME" => {
                no_length()?;
                Piece::StartTime(time_format().to_owned())
            }
            "DOWNSTREAM_PEER_CERT_V_START" | "DOWNSTREAM_PEER_CERT_V_END" => {
                no_length()?;
                let f = time_format().to_owned();
                if name.ends_with("START") {
                    Piece::PeerCertStart(f)
                } else {
                    Piece::PeerCertEnd(f)
                }
            }
            "REQUESTED_SERVER_NAME" => {
                no_length()?;
                Piece::RequestedServerName(match self.param.unwrap_or("") {
                    "" | "SNI_ONLY" => SniMode::SniOnly,
                    "SNI_FIRST" => SniMode::SniFirst,
                    "HOST_FIRST" => SniMode::HostFirst,
                    other => {
                        return Err(format!(
                            "Invalid REQUESTED_SERVER_NAME option: '{other}', only 'SNI_ONLY'/'SNI_FIRST'/'HOST_FIRST' are allowed"
                        ));
                    }
                })
            }
            "UPSTREAM_METADATA" => {
                required()?;
                no_length()?;
                Piece::Empty
            }
            "DYNAMIC_METADATA" => {
                let mut parts = required()?.split(':').map(str::to_owned);
                Piece::DynamicMetadata {
                    namespace: parts.next().unwrap_or_default(),
                    path: parts.collect(),
                    max_length: self.length,
                }
            }
            _ => {
                let piece = match name {
                    "HOSTNAME" => Piece::Hostname(machine.hostname()),
                    other => Piece::Fact(
                        fact(other)
                            .ok_or_else(|| format!("Not supported field in StreamInfo: {other}"))?,
                    ),
                };
                if self.param.is_some() || self.length.is_some() {
                    return Err(format!("{name} does not take any parameters or length"));
                }
                piece
            }
        })
    }
}

fn fact(name: &str) -> Option<Fact> {
    use TlsField as T;
    Some(match name {
        "DOWNSTREAM_REMOTE_ADDRESS" => Fact::DownstreamRemoteAddress,
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Fact::DownstreamRemoteAddressWithoutPort,
        "DOWNSTREAM_REMOTE_PORT" => Fact::DownstreamRemotePort,
        "DOWNSTREAM_DIRECT_REMOTE_ADDRESS" => Fact::DownstreamDirectRemoteAddress,
        "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT" => {
            Fact::DownstreamDirectRemoteAddressWithoutPort
        }
        "DOWNSTREAM_DIRECT_REMOTE_PORT" => Fact::DownstreamDirectRemotePort,
        "DOWNSTREAM_LOCAL_ADDRESS" => Fact::DownstreamLocalAddress,
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Fact::DownstreamLocalAddressWithoutPort,
        "DOWNSTREAM_LOCAL_PORT" => Fact::DownstreamLocalPort,
        "UPSTREAM_HOST" => Fact::UpstreamHost,
        "UPSTREAM_REMOTE_ADDRESS" => Fact::UpstreamRemoteAddress,
        "UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Fact::UpstreamRemoteAddressWithoutPort,
        "UPSTREAM_REMOTE_PORT" => Fact::UpstreamRemotePort,
        "UPSTREAM_LOCAL_ADDRESS" => Fact::UpstreamLocalAddress,
        "UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Fact::UpstreamLocalAddressWithoutPort,
        "UPSTREAM_LOCAL_PORT" => Fact::UpstreamLocalPort,
        "UPSTREAM_CLUSTER" => Fact::UpstreamCluster,
        "UPSTREAM_TRANSPORT_FAILURE_REASON" => Fact::UpstreamTransportFailureReason,
        "PROTOCOL" => Fact::Protocol,
        "RESPONSE_CODE" => Fact::ResponseCode,
        "RESPONSE_FLAGS" => Fact::ResponseFlags,
        "DOWNSTREAM_TLS_VERSION" => Fact::Tls(T::Version),
        "DOWNSTREAM_TLS_CIPHER" => Fact::Tls(T::Cipher),
        "DOWNSTREAM_TLS_SESSION_ID" => Fact::Tls(T::SessionId),
        "DOWNSTREAM_PEER_URI_SAN" => Fact::Tls(T::PeerUriSan),
        "DOWNSTREAM_PEER_DNS_SAN" => Fact::Tls(T::PeerDnsSan),
        "DOWNSTREAM_PEER_IP_SAN" => Fact::Tls(T::PeerIpSan),
        "DOWNSTREAM_PEER_EMAIL_SAN" => Fact::Tls(T::PeerEmailSan),
        "DOWNSTREAM_PEER_OTHERNAME_SAN" => Fact::Tls(T::PeerOthernameSan),
        "DOWNSTREAM_PEER_SUBJECT" => Fact::Tls(T::PeerSubject),
        "DOWNSTREAM_PEER_ISSUER" => Fact::Tls(T::PeerIssuer),
        "DOWNSTREAM_PEER_SERIAL" => Fact::Tls(T::PeerSerial),
        "DOWNSTREAM_PEER_FINGERPRINT_256" => Fact::Tls(T::PeerFingerprint256),
        "DOWNSTREAM_PEER_FINGERPRINT_1" => Fact::Tls(T::PeerFingerprint1),
        "DOWNSTREAM_PEER_CERT" => Fact::Tls(T::PeerCert),
        "DOWNSTREAM_PEER_CHAIN_FINGERPRINTS_256" => Fact::Tls(T::PeerChainFingerprints256),
        "DOWNSTREAM_PEER_CHAIN_FINGERPRINTS_1" => Fact::Tls(T::PeerChainFingerprints1),
        "DOWNSTREAM_PEER_CHAIN_SERIALS" => Fact::Tls(T::PeerChainSerials),
        "DOWNSTREAM_LOCAL_URI_SAN" => Fact::Tls(T::LocalUriSan),
        "DOWNSTREAM_LOCAL_DNS_SAN" => Fact::Tls(T::LocalDnsSan),
        "DOWNSTREAM_LOCAL_IP_SAN" => Fact::Tls(T::LocalIpSan),
        "DOWNSTREAM_LOCAL_EMAIL_SAN" => Fact::Tls(T::LocalEmailSan),
        "DOWNSTREAM_LOCAL_OTHERNAME_SAN" => Fact::Tls(T::LocalOthernameSan),
        "DOWNSTREAM_LOCAL_SUBJECT" => Fact::Tls(T::LocalSubject),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
