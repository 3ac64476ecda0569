//! Filter chain selection with Envoy's order of criteria: destination port, destination IP,
//! server name, transport protocol, application protocols, direct source IP, source type,
//! source IP, source port. At each step the most specific matching value wins; chains that
//! leave the criterion empty are the fallback; if neither exists, nothing matches.

use std::net::{IpAddr, SocketAddr};

use proto::pb::envoy::config::core::v3::CidrRange;
use proto::pb::envoy::config::listener::v3::FilterChainMatch;

use super::ConfigError;

/// A CIDR block (`10.0.0.0/8`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// Compiles a `CidrRange`; `path` names it in errors.
    pub fn compile(r: &CidrRange, path: &str) -> Result<Cidr, ConfigError> {
        let addr: IpAddr = r.address_prefix.parse().map_err(|_| {
            ConfigError::new(
                format!("{path}.address_prefix"),
                format!("malformed IP address: {}", r.address_prefix),
            )
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = r.prefix_len.map_or(max, |v| v.value.min(max));
        Ok(Cidr {
            addr,
            len: len as u8,
        })
    }

    /// Whether `ip` is inside the block (IPv4-mapped IPv6 addresses match IPv4 blocks).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.len)
                };
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.len)
                };
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }

    /// Prefix length, the specificity of a match.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }
}

/// `source_type` of a filter chain match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceType {
    /// Any source.
    Any,
    /// The source IP equals the destination IP, or is loopback.
    SameIpOrLoopback,
    /// Anything else.
    External,
}

/// One chain's compiled `filter_chain_match`.
#[derive(Debug, Clone)]
pub struct ChainMatch {
    destination_port: Option<u16>,
    prefix_ranges: Vec<Cidr>,
    server_names: Vec<String>,
    transport_protocol: String,
    application_protocols: Vec<String>,
    direct_source_prefix_ranges: Vec<Cidr>,
    source_type: SourceType,
    source_prefix_ranges: Vec<Cidr>,
    source_ports: Vec<u16>,
}

/// What is known about a connection when its filter chain is chosen.
#[derive(Debug, Clone, Default)]
pub struct ConnectionFacts<'a> {
    /// Local (or original destination) address.
    pub destination: Option<SocketAddr>,
    /// Peer address.
    pub source: Option<SocketAddr>,
    /// SNI, if a TLS ClientHello was inspected.
    pub server_name: Option<&'a str>,
    /// `tls` or `raw_buffer` (Envoy's default when no listener filter sets it).
    pub transport_protocol: &'a str,
    /// ALPN or detected protocols (`h2`, `http/1.1`, `h2c`).
    pub application_protocols: &'a [String],
}

impl ChainMatch {
    /// Compiles a `FilterChainMatch` (absent = match everything).
    pub fn compile(m: Option<&FilterChainMatch>, path: &str) -> Result<ChainMatch, ConfigError> {
        let default = FilterChainMatch::default();
        let m = m.unwrap_or(&default);
        let cidrs = |v: &[CidrRange], field: &str| {
            v.iter()
                .enumerate()
                .map(|(i, r)| Cidr::compile(r, &format!("{path}.{field}[{i}]")))
                .collect::<Result<Vec<_>, _>>()
        };
        let port = |p: u32, field: &str| {
            u16::try_from(p).map_err(|_| {
                ConfigError::new(format!("{path}.{field}"), format!("invalid port {p}"))
            })
        };
        Ok(ChainMatch {
            destination_port: m
                .destination_port
                .map(|p| port(p.value, "destination_port"))
                .transpose()?,
            prefix_ranges: cidrs(&m.prefix_ranges, "prefix_ranges")?,
            server_names: m
                .server_names
                .iter()
                .map(|s| s.to_ascii_lowercase())
                .collect(),
            transport_protocol: m.transport_protocol.clone(),
            application_protocols: m.application_protocols.clone(),
            direct_source_prefix_ranges: cidrs(
                &m.direct_source_prefix_ranges,
                "direct_source_prefix_ranges",
            )?,
            source_type: match m.source_type {
                1 => SourceType::SameIpOrLoopback,
                2 => SourceType::External,
                _ => SourceType::Any,
            },
            source_prefix_ranges: cidrs(&m.source_prefix_ranges, "source_prefix_ranges")?,
            source_ports: m
                .source_ports
                .iter()
                .map(|p| port(*p, "source_ports"))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether a chain needs the SNI or transport protocol (so a TLS inspector is useful).
    pub fn needs_tls_facts(&self) -> bool {
        !self.server_names.is_empty() || self.transport_protocol == "tls"
    }

    /// A key identifying the match, for duplicate detection.
    pub fn signature(&self) -> String {
        format!("{self:?}")
    }
}

/// Specificity of a criterion for one chain: `None` = the chain does not match, `Some(0)` =
/// the chain leaves the criterion empty, higher = more specific.
type Score = Option<u32>;

fn score_cidrs(ranges: &[Cidr], ip: Option<IpAddr>) -> Score {
    if ranges.is_empty() {
        return Some(0);
    }
    let ip = ip?;
    ranges
        .iter()
        .filter(|c| c.contains(ip))
        .map(|c| 1 + u32::from(c.prefix_len()))
        .max()
}

fn score_server_name(names: &[String], sni: Option<&str>) -> Score {
    if names.is_empty() {
        return Some(0);
    }
    let sni = sni?.to_ascii_lowercase();
    names
        .iter()
        .filter_map(|n| {
            if *n == sni {
                Some(u32::MAX)
            } else if let Some(suffix) = n.strip_prefix('*') {
                (sni.ends_with(suffix) && sni.len() > suffix.len()).then(|| suffix.len() as u32 + 1)
            } else {
                None
            }
        })
        .max()
}

fn is_loopback_or_same(facts: &ConnectionFacts<'_>) -> bool {
    match (facts.source, facts.destination) {
        (Some(s), d) => s.ip().is_loopback() || d.is_some_and(|d| d.ip() == s.ip()),
        _ => false,
    }
}

/// The criteria in Envoy's order; each returns the chain's score for the connection.
fn criteria(m: &ChainMatch, f: &ConnectionFacts<'_>) -> [Score; 9] {
    let src_ip = f.source.map(|s| s.ip());
    [
        match m.destination_port {
            None => Some(0),
            Some(p) => (f.destination.map(|d| d.port()) == Some(p)).then_some(1),
        },
        score_cidrs(&m.prefix_ranges, f.destination.map(|d| d.ip())),
        score_server_name(&m.server_names, f.server_name),
        if m.transport_protocol.is_empty() {
            Some(0)
        } else {
            (m.transport_protocol == f.transport_protocol).then_some(1)
        },
        if m.application_protocols.is_empty() {
            Some(0)
        } else {
            m.application_protocols
                .iter()
                .any(|p| f.application_protocols.contains(p))
                .then_some(1)
        },
        score_cidrs(&m.direct_source_prefix_ranges, src_ip),
        match m.source_type {
            SourceType::Any => Some(0),
            SourceType::SameIpOrLoopback => is_loopback_or_same(f).then_some(1),
            SourceType::External => (!is_loopback_or_same(f)).then_some(1),
        },
        score_cidrs(&m.source_prefix_ranges, src_ip),
        if m.source_ports.is_empty() {
            Some(0)
        } else {
            f.source
                .is_some_and(|s| m.source_ports.contains(&s.port()))
                .then_some(1)
        },
    ]
}

/// Index of the chain Envoy would pick for the connection, or `None` (then the
/// `default_filter_chain`, if any, applies).
pub fn select(chains: &[&ChainMatch], facts: &ConnectionFacts<'_>) -> Option<usize> {
    let scores: Vec<[Score; 9]> = chains.iter().map(|m| criteria(m, facts)).collect();
    let alive = (0..9).try_fold(
        (0..chains.len()).collect::<Vec<usize>>(),
        |mut alive, step| {
            let best = alive.iter().filter_map(|&i| scores[i][step]).max()?;
            alive.retain(|&i| scores[i][step] == Some(best));
            Some(alive)
        },
    )?;
    alive.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::google::protobuf::UInt32Value;

    fn chain(f: impl FnOnce(&mut FilterChainMatch)) -> ChainMatch {
        let mut m = FilterChainMatch::default();
        f(&mut m);
        ChainMatch::compile(Some(&m), "m").unwrap()
    }

    fn cidr(p: &str, len: u32) -> CidrRange {
        CidrRange {
            address_prefix: p.into(),
            prefix_len: Some(UInt32Value { value: len }),
        }
    }

    fn facts(dst: &str, src: &str) -> ConnectionFacts<'static> {
        ConnectionFacts {
            destination: Some(dst.parse().unwrap()),
            source: Some(src.parse().unwrap()),
            transport_protocol: "raw_buffer",
            ..Default::default()
        }
    }

    #[test]
    fn port_beats_catch_all_and_falls_back() {
        let any = chain(|_| {});
        let p80 = chain(|m| m.destination_port = Some(UInt32Value { value: 80 }));
        let chains = [&any, &p80];
        assert_eq!(
            select(&chains, &facts("10.0.0.1:80", "203.0.113.4:5")),
            Some(1)
        );
        assert_eq!(
            select(&chains, &facts("10.0.0.1:81", "203.0.113.4:5")),
            Some(0)
        );
        assert_eq!(
            select(&[&p80], &facts("10.0.0.1:81", "203.0.113.4:5")),
            None
        );
    }

    #[test]
    fn longest_prefix_wins_and_later_criteria_do_not_rescue() {
        let wide = chain(|m| m.prefix_ranges = vec![cidr("10.0.0.0", 8)]);
        let narrow = chain(|m| {
            m.prefix_ranges = vec![cidr("10.1.0.0", 16)];
            m.source_ports = vec![9];
        });
        let chains = [&wide, &narrow];
        // The /16 chain wins the destination-IP step, then fails on source port: no match,
        // exactly like Envoy (no backtracking to the /8 chain).
        assert_eq!(
            select(&chains, &facts("10.1.2.3:80", "203.0.113.4:5")),
            None
        );
        assert_eq!(
            select(&chains, &facts("10.1.2.3:80", "203.0.113.4:9")),
            Some(1)
        );
        assert_eq!(
            select(&chains, &facts("10.2.2.3:80", "203.0.113.4:9")),
            Some(0)
        );
    }

    #[test]
    fn server_names_exact_before_wildcard() {
        let wild = chain(|m| m.server_names = vec!["*.example.com".into()]);
        let exact = chain(|m| m.server_names = vec!["api.example.com".into()]);
        let chains = [&wild, &exact];
        let mut f = facts("10.0.0.1:443", "203.0.113.4:5");
        f.server_name = Some("api.example.com");
        assert_eq!(select(&chains, &f), Some(1));
        f.server_name = Some("www.example.com");
        assert_eq!(select(&chains, &f), Some(0));
        f.server_name = None;
        assert_eq!(select(&chains, &f), None);
    }

    #[test]
    fn transport_and_source_type() {
        let tls = chain(|m| m.transport_protocol = "tls".into());
        let raw = chain(|m| m.transport_protocol = "raw_buffer".into());
        assert_eq!(
            select(&[&tls, &raw], &facts("10.0.0.1:1", "203.0.113.4:5")),
            Some(1)
        );
        let local = chain(|m| m.source_type = 1);
        let ext = chain(|m| m.source_type = 2);
        assert_eq!(
            select(&[&local, &ext], &facts("10.0.0.1:1", "127.0.0.1:5")),
            Some(0)
        );
        assert_eq!(
            select(&[&local, &ext], &facts("10.0.0.1:1", "203.0.113.8:5")),
            Some(1)
        );
    }

    #[test]
    fn bad_cidr_names_its_field() {
        let m = FilterChainMatch {
            source_prefix_ranges: vec![cidr("10.0.0.x", 8)],
            ..Default::default()
        };
        let e = ChainMatch::compile(Some(&m), "filter_chains[2].filter_chain_match").unwrap_err();
        assert_eq!(
            e.path,
            "filter_chains[2].filter_chain_match.source_prefix_ranges[0].address_prefix"
        );
    }
}
